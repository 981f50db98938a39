"""Importing this module registers the whole node library with graph.registry.REGISTRY."""

from mixgraph.nodes import (conditioning, conditioning_extra_nodes, custom_sampling_nodes,  # noqa: F401
                            image_extra_nodes, image_nodes, latent_extra_nodes, latent_nodes, loading,
                            mask_nodes, model_patch_nodes, precision_nodes, primitive_nodes,
                            sampling_nodes, upscale_nodes)
