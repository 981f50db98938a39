"""Importing this module registers the whole node library with graph.registry.REGISTRY.

Its socket types and precision roles come first (`nodes.socket_types`, which `nodes/__init__.py`
has imported already): the declarations below read them.
"""

from mixgraph.nodes import socket_types  # noqa: F401  (first: the declarations read it)
from mixgraph.nodes import (conditioning, conditioning_extra_nodes, custom_sampling_nodes,  # noqa: F401
                            extra_loader_nodes, image_extra_nodes, image_filter_nodes, image_nodes,
                            latent_extra_nodes, latent_io_nodes, latent_nodes, loading, mask_nodes,
                            merge_nodes, model_patch_nodes, precision_nodes, primitive_nodes,
                            sampling_nodes, save_nodes, upscale_nodes)
from mixgraph.nodes import deep_shrink_nodes, ip2p_nodes, preview_any_nodes, rebatch_nodes  # noqa: F401
from mixgraph.nodes import stable3d_nodes  # noqa: F401
from mixgraph.nodes import guidance_extra_nodes, tile_nodes  # noqa: F401
from mixgraph.nodes import upscale_diffusion_nodes  # noqa: F401
from mixgraph.nodes import persistable  # noqa: F401  (declares the payloads the output cache keeps)
from mixgraph.nodes import clip_vision_nodes, gligen_nodes, sampler_extra_nodes, token_patch_nodes  # noqa: F401
from mixgraph.nodes import batch_nodes, color_transfer_nodes, logic_nodes, resize_nodes  # noqa: F401
from mixgraph.nodes import hook_nodes  # noqa: F401
from mixgraph.nodes import crop_nodes, save_image_nodes  # noqa: F401
from mixgraph.nodes import webcam_nodes  # noqa: F401
from mixgraph.nodes import cond_nodes, seamless_tiling_nodes  # noqa: F401
from mixgraph.nodes import attention_backend_nodes, lotus_nodes  # noqa: F401
from mixgraph.nodes import controlnet_extra_nodes  # noqa: F401
from mixgraph.nodes import photomaker_nodes  # noqa: F401
from mixgraph.nodes import speed_patch_nodes  # noqa: F401
from mixgraph.nodes import loop_nodes  # noqa: F401
from mixgraph.nodes import context_window_nodes  # noqa: F401
from mixgraph.nodes import camera_angle_nodes, lora_bypass_nodes, multigpu_nodes  # noqa: F401
from mixgraph.nodes import lora_stack_nodes, sdpose_nodes, text_overlay_nodes  # noqa: F401
from mixgraph.nodes import bg_removal_nodes  # noqa: F401
from mixgraph.nodes import supir_nodes  # noqa: F401
