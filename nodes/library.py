"""Importing this module registers the whole node library with graph.registry.REGISTRY.

Its socket types and precision roles come first (`nodes.socket_types`, which `nodes/__init__.py`
has imported already): the declarations below read them.
"""

from mixgraph.nodes import socket_types  # noqa: F401  (first: the declarations read it)
from mixgraph.nodes.declare.conditioning import (camera_angle_nodes, clip_vision_nodes,  # noqa: F401
                                                 cond_nodes, conditioning, conditioning_extra_nodes,
                                                 controlnet_extra_nodes, dit_text_nodes, flux_nodes, gligen_nodes,
                                                 hook_nodes, ip2p_nodes, lotus_nodes, lumina2_nodes,
                                                 photomaker_nodes, qwen_image_nodes, stable3d_nodes,
                                                 upscale_diffusion_nodes, wan_nodes)
from mixgraph.nodes.declare.image import (batch_nodes, bg_removal_nodes, color_transfer_nodes,  # noqa: F401
                                          crop_nodes, curve_nodes, image_compare_nodes, image_extra_nodes,
                                          image_filter_nodes, image_nodes,
                                          mask_nodes, resize_nodes, save_image_nodes, sdpose_nodes,
                                          text_overlay_nodes, tile_nodes, upscale_nodes, video_nodes,
                                          webcam_nodes)
from mixgraph.nodes.declare.latent import (latent_extra_nodes, latent_io_nodes, latent_nodes,  # noqa: F401
                                           rebatch_nodes, video_latent_nodes)
from mixgraph.nodes.declare.loaders import (extra_loader_nodes, loading, lora_bypass_nodes,  # noqa: F401
                                            lora_stack_nodes, multigpu_nodes, save_nodes)
from mixgraph.nodes.declare.loaders import gguf_nodes  # noqa: F401  (ComfyUI-GGUF's loaders)
from mixgraph.nodes.declare.logic import (logic_nodes, loop_nodes, preview_any_nodes,  # noqa: F401
                                          primitive_nodes)
from mixgraph.nodes.declare.model_patches import (attention_backend_nodes, context_window_nodes,  # noqa: F401
                                                  deep_shrink_nodes, flow_sampling_nodes, guidance_extra_nodes,
                                                  merge_nodes, model_patch_nodes, precision_nodes,
                                                  seamless_tiling_nodes, skip_layer_nodes, speed_patch_nodes,
                                                  supir_nodes, token_patch_nodes)
from mixgraph.nodes.declare.sampling import (custom_sampling_nodes, sampler_extra_nodes,  # noqa: F401
                                             sampling_nodes)
from mixgraph.nodes.helpers import persistable  # noqa: F401  (declares the payloads the output cache keeps)
from mixgraph.nodes import refused_nodes  # noqa: F401  (ComfyUI nodes known by name, not run: why)
