"""ComfyUI's `comfy.cli_args` for custom node packs: `args` with ComfyUI's defaults (packs read
flags such as `args.disable_metadata` or `args.preview_method`)."""

from __future__ import annotations

import argparse
import enum


class LatentPreviewMethod(enum.Enum):
    NoPreviews = "none"
    Auto = "auto"
    Latent2RGB = "latent2rgb"
    TAESD = "taesd"


args = argparse.Namespace(
    listen="127.0.0.1", port=8188, base_directory=None, output_directory=None,
    input_directory=None, temp_directory=None, user_directory=None, cpu=False,
    disable_metadata=False, disable_all_custom_nodes=False, preview_method=LatentPreviewMethod.NoPreviews,
    preview_size=512, cache_lru=0, cache_none=False, cache_classic=False, highvram=False,
    lowvram=False, novram=False, gpu_only=False, force_fp32=False, force_fp16=False,
    fp16_vae=False, bf16_vae=False, fp32_vae=False, deterministic=False, dont_print_server=False,
    verbose="INFO", multi_user=False, enable_cors_header=None, disable_smart_memory=False,
    front_end_version="comfyanonymous/ComfyUI@latest", extra_model_paths_config=None,
)
