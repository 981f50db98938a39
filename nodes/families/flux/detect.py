"""Which Flux.1 / Chroma model a state dict is, and its config, from key names and shapes only
(ComfyUI ``comfy/model_detection.py``'s Flux branch, with the widths read from shapes instead of
assumed).

Variants: "dev" (guidance-distilled: ``guidance_in`` present; also Kontext, which is dev weights
given reference latents, and Fill / Canny / Depth, told apart by their input width), "schnell"
(no ``guidance_in``), "chroma" (no ``guidance_in`` / ``vector_in`` / per-block modulation: an
approximator, ``distilled_guidance_layer``, computes every block's modulation). Input width:
16 latent channels; Fill 96 = 16 + 16 masked image + 64 (the 8 x 8-folded pixel mask);
Canny / Depth 32 = 16 + 16 control image latent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.model import PATCH, FluxConfig, default_axes_dim

__all__ = ["flux_config", "detect_keys", "SIGNATURE", "CHROMA_KEY", "DIFFUSERS_LAYOUT"]

SIGNATURE = ("double_blocks.0.img_attn.qkv.weight", "double_blocks.0.img_attn.norm.key_norm.scale", "img_in.weight")
CHROMA_KEY = "distilled_guidance_layer.in_proj.weight"
HUNYUAN_KEY = "txt_in.individual_token_refiner.blocks.0.norm1.weight"  # Hunyuan Video shares the layout
FLUX2_KEY = "double_stream_modulation_img.lin.weight"  # Flux.2: shared modulation, another model
RADIANCE_KEY = "nerf_blocks.0.norm.scale"  # Chroma Radiance: pixel space, not run yet
CONTROLNET_KEY = "controlnet_blocks.0.weight"  # a Flux ControlNet (XLabs: BFL-named blocks), not a model
#: the WeightSource layout of a diffusers-layout file (``weights/layouts.py`` registers it)
DIFFUSERS_LAYOUT = "diffusers_flux"


def _count(keys, prefix: str) -> int:
    return len({m.group(1) for k in keys if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))})


def detect_keys(info: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], str] | None:
    """(BFL key -> shape, stored layout "ldm" | ``DIFFUSERS_LAYOUT``) of a Flux / Chroma
    diffusion model, or None for other files."""
    if any(k in info for k in (HUNYUAN_KEY, FLUX2_KEY, RADIANCE_KEY, CONTROLNET_KEY)):
        return None
    if all(k in info for k in SIGNATURE):
        return {k: tuple(getattr(v, "shape", v)) for k, v in info.items()}, "ldm"
    if diffusers_keys.is_diffusers_flux(info):
        from_chroma = diffusers_keys.chroma_plan if diffusers_keys.is_diffusers_chroma(info) else None
        return diffusers_keys.shapes_to_bfl(info, from_chroma), DIFFUSERS_LAYOUT
    return None


def flux_config(shapes: Mapping[str, tuple[int, ...]]) -> FluxConfig:
    """The model config from BFL-layout shapes: hidden width from ``img_in``, the head width from
    the QK norm's scale, depths by counting blocks, the MLP ratio from the first MLP, text and
    pooled widths from their input layers, guidance from ``guidance_in``'s presence."""
    hidden, patch_in = shapes["img_in.weight"]
    head = shapes["double_blocks.0.img_attn.norm.key_norm.scale"][0]
    mlp = shapes["double_blocks.0.img_mlp.0.weight"][0]
    out_dim = shapes["final_layer.linear.weight"][0]
    vec = shapes.get("vector_in.in_layer.weight", (0, 768))[1]
    return FluxConfig(in_channels=patch_in // (PATCH * PATCH), out_channels=out_dim // (PATCH * PATCH),
                      vec_in_dim=vec, context_in_dim=shapes["txt_in.weight"][1], hidden_size=hidden,
                      mlp_ratio=mlp / hidden, num_heads=hidden // head, depth=_count(shapes, "double_blocks."),
                      depth_single_blocks=_count(shapes, "single_blocks."), axes_dim=default_axes_dim(head),
                      qkv_bias="double_blocks.0.img_attn.qkv.bias" in shapes,
                      guidance_embed="guidance_in.in_layer.weight" in shapes)
