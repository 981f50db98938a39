"""Importing this module registers the whole node library with graph.registry.REGISTRY."""

from mixgraph.nodes import (conditioning, image_nodes, latent_nodes, loading,  # noqa: F401
                   precision_nodes, sampling_nodes)
