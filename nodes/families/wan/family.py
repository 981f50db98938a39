"""The Wan family (``base.Family``): Wan 2.1 text-to-video (1.3B / 14B), image-to-video,
first-last-frame and VACE models, Wan 2.2's A14B high-noise / low-noise experts (Wan 2.1 shapes;
a two-expert run is two KSamplerAdvanced on two UNETLoader models) and the Wan 2.2 TI2V 5B model,
one DiT (``model.py``) whose variant and config the keys give (``detect.py``).

Files: the released / ComfyUI-repackaged single files (the DiT bare or under
``model.diffusion_model.``) and diffusers' ``WanTransformer3DModel`` / ``WanVACETransformer3DModel``
files (``diffusers_keys.py``, registered as a weight layout here). Sampling is flow matching with
shift 8 and timestep σ·1000 (ComfyUI's ``supported_models.WAN21_T2V``, inherited by every Wan model
class there, Wan 2.2's included); the latent Wan 2.1's 16-channel format, or Wan 2.2's 48-channel
one for the 5B model. Text: umT5-XXL (slot "umt5xxl", architecture "umt5", set "wan"; CLIPLoader
type "wan"). Video latents are [B, C, T, H, W]; an image latent is sampled as one frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.encoders.umt5 import UMT5XXL, WAN_RULES
from mixgraph.nodes.families.base import Detection, LoraTarget, Sampling, TextEncoderSlot
from mixgraph.nodes.families.wan import diffusers_keys
from mixgraph.nodes.families.wan.detect import wan_config, variant_of
from mixgraph.nodes.families.wan.lora_keys import lora_targets
from mixgraph.nodes.families.wan.model import WanConfig, WanModel
from mixgraph.nodes.families.wan.runner import WanRunner
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT, WAN22_LATENT
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout

__all__ = ["WAN", "WanFamily", "TEXT_PREFIX", "TRACE_TOKENS", "SHIFT"]

TEXT_PREFIX = "text_encoders."  # ComfyUI's text_encoder_key_prefix of Wan files
TRACE_TOKENS = 512  # umT5 tokens of the memory estimate's traced call (ComfyUI pads Wan prompts to 512)
CLIP_TOKENS = 257  # ViT-H/14 at 224 px: the class token + 16 x 16 patches
SHIFT = 8.0  # ComfyUI's WAN21_T2V sampling_settings (every Wan model class)
_ENCODERS = (TextEncoderSlot("umt5xxl", "umt5", "text_large", prefix=TEXT_PREFIX + "umt5xxl.transformer.",
                             layout="ldm", folder="text_encoder", encoding="wan", rule=WAN_RULES[UMT5XXL], arch="umt5"),)


class WanFamily:
    """``base.Family`` for Wan (see the module docstring); variants: ``detect.VARIANTS``."""

    name = "wan"
    display = "Wan 2.1 / 2.2"
    refusals = ("Wan",)
    clip_types: Mapping[str, str] = {"wan": "t2v"}
    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        cfg = wan_config(info)
        if cfg is None:
            return None
        variant = variant_of(cfg)
        fields = {"prediction": "flow", "latent_format": self.latent_format(variant, cfg.out_dim)}
        return Detection(self.name, variant, cfg, fields)

    def build(self, config: WanConfig) -> WanModel:
        return WanModel(config)

    def runner(self, handle, module: nn.Module, policy) -> WanRunner:
        return WanRunner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        return Sampling(prediction="flow", shift=SHIFT, multiplier=1000.0)

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        if channels == WAN22_LATENT.channels:
            return WAN22_LATENT
        if channels == WAN21_LATENT.channels:
            return WAN21_LATENT
        raise ValueError(f"Wan model with {channels} latent channels: no latent format (Wan 2.1: 16, Wan 2.2 5B: 48)")

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        return _ENCODERS

    def lora_key_map(self, config: WanConfig) -> dict[str, LoraTarget]:
        """``base.Family.lora_key_map``: diffusers' Wan LoRA names onto the model's weights
        (``lora_keys.lora_targets``); ComfyUI's / kohya's own names need no map."""
        return lora_targets(config)

    def trace_inputs(self, config: WanConfig, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        h, w = latent_shape[-2:]
        t = latent_shape[-3] if len(latent_shape) >= 3 else 1
        clip = torch.empty(batch, CLIP_TOKENS * (2 if config.flf_tokens else 1), config.image_dim) \
            if config.image else None
        return (torch.empty(batch, config.in_dim, t, h, w), torch.empty(batch),
                torch.empty(batch, TRACE_TOKENS, config.text_dim), clip), {}


# diffusers' transformer files (UNETLoader on transformer/diffusion_pytorch_model.safetensors)
DIFFUSERS_LAYOUT = register_layout(FamilyLayout(diffusers_keys.LAYOUT, diffusers_keys.is_diffusers_wan,
                                                diffusers_keys.converted_shapes, diffusers_keys.diffusers_rename))

WAN = WanFamily()
