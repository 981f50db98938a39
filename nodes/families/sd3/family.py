"""The SD3 / SD3.5 family (``base.Family``): Stable Diffusion 3 Medium, 3.5 Large / Large Turbo and
3.5 Medium, one MMDiT (``mmdit.py``) whose config the keys give.

Files: Stability's and ComfyUI's single files (the MMDiT under ``model.diffusion_model.``, beside
it in all-in-one checkpoints the text encoders under ``text_encoders.{clip_l,clip_g,t5xxl}.
transformer.`` and the 16-channel VAE under ``first_stage_model.``), bare MMDiT files, and
diffusers' ``SD3Transformer2DModel`` (``transformer/`` of a pipeline folder, or its file alone),
whose layout ``diffusers_keys.py`` converts (registered as a weight layout here). Sampling is
flow matching with shift 3 (ComfyUI's ``supported_models.SD3``), the latent SD3's 16-channel
format. Text: CLIP-L and CLIP-G (pooled outputs joined) and T5-XXL, each optional as in ComfyUI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.encoders.dit_joins import SD3_RULES
from mixgraph.nodes.families.base import CheckpointLayout, Detection, LoraTarget, Sampling, TextEncoderSlot
from mixgraph.nodes.families.sd3 import diffusers_keys
from mixgraph.nodes.families.sd3.mmdit import SIGNATURE, MMDiT, MMDiTConfig, config_from_shapes
from mixgraph.nodes.families.sd3.runner import SD3Runner
from mixgraph.nodes.vae.flow_latent_formats import SD3_LATENT, shifted_format
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout

__all__ = ["SD3", "SD3Family", "VARIANT", "TEXT_PREFIX", "TRACE_TOKENS", "MODEL_PREFIX", "VAE_PREFIX"]

VARIANT = "sd3"  # one variant: SD3 and SD3.5 differ by config only (ComfyUI's one SD3 model class)
TEXT_PREFIX = "text_encoders."  # ComfyUI's ``text_encoder_key_prefix`` of SD3 files
TRACE_TOKENS = 154  # 77 CLIP tokens + 77 T5 tokens: the memory estimate's context length
MODEL_PREFIX = "model.diffusion_model."  # Stability's single-file layout
VAE_PREFIX = "first_stage_model."
ARCHITECTURE = "stable-diffusion-v3-medium"  # ComfyUI's modelspec.architecture for every SD3 model

# ComfyUI's sd3_clip: clip_l is the penultimate layer without the final norm, its pooled output
# not projected; clip_g as in SDXL; T5-XXL's last layer. The set's join ("sd3") puts them together.
_ENCODERS = (
    TextEncoderSlot("clip_l", "clip", "text", prefix=TEXT_PREFIX + "clip_l.transformer.", layout="hf_clip",
                    folder="text_encoder", encoding="sd3", rule=SD3_RULES["clip_l"],
                    arch="clip", optional=True),
    TextEncoderSlot("clip_g", "clip", "text", prefix=TEXT_PREFIX + "clip_g.transformer.", layout="hf_clip",
                    folder="text_encoder_2", encoding="sd3", rule=SD3_RULES["clip_g"],
                    arch="clip", optional=True),
    TextEncoderSlot("t5xxl", "t5", "text_large", prefix=TEXT_PREFIX + "t5xxl.transformer.", layout="ldm",
                    folder="text_encoder_3", encoding="sd3", rule=SD3_RULES["t5xxl"],
                    arch="t5", optional=True),
)

DIFFUSERS_LAYOUT = register_layout(FamilyLayout(
    diffusers_keys.LAYOUT, diffusers_keys.is_diffusers_sd3, diffusers_keys.converted_shapes,
    diffusers_keys.diffusers_rename, diffusers_keys.fuse))


class SD3Family:
    """``base.Family`` for SD3 / SD3.5 (see the module docstring)."""

    name = "sd3"
    display = "SD3 / SD3.5"
    refusals = ("SD3 / SD3.5",)
    clip_types: Mapping[str, str] = {"sd3": VARIANT}
    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        if SIGNATURE not in info:
            return None
        cfg = config_from_shapes(info)
        if cfg is None:
            return None
        fields = {"prediction": self.sampling(VARIANT).prediction,
                  "latent_format": self.latent_format(VARIANT, cfg.out_channels)}
        return Detection(self.name, VARIANT, cfg, fields)

    def build(self, config: MMDiTConfig) -> MMDiT:
        return MMDiT(config)

    def runner(self, handle, module: nn.Module, policy) -> SD3Runner:
        return SD3Runner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        return Sampling(prediction="flow", shift=3.0, multiplier=1000.0)

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        if channels == SD3_LATENT.channels:
            return SD3_LATENT
        return shifted_format(SD3_LATENT.scale_factor, SD3_LATENT.mean[0], "sd3", channels=channels)

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        if variant != VARIANT:
            raise ValueError(f"SD3 variant {variant!r}: no text encoders known (variant: {VARIANT})")
        return _ENCODERS

    def lora_key_map(self, config: MMDiTConfig) -> dict[str, LoraTarget]:
        """``base.Family.lora_key_map``: diffusers SD3 LoRA names onto the MMDiT's weights
        (``diffusers_keys.lora_targets``)."""
        return diffusers_keys.lora_targets(config)

    def checkpoint_layout(self, variant: str) -> CheckpointLayout:
        """Stability's all-in-one layout (what ComfyUI's CheckpointSave writes for SD3): the MMDiT
        under ``model.diffusion_model.``, the VAE under ``first_stage_model.``, each text encoder
        under ``text_encoders.<name>.transformer.`` in its Hugging Face layout."""
        return CheckpointLayout(MODEL_PREFIX, VAE_PREFIX,
                                tuple((s.name, s.prefix, s.layout) for s in self.text_encoders(variant)),
                                ARCHITECTURE)

    def trace_inputs(self, config: MMDiTConfig, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        h, w = latent_shape[-2:]
        y = torch.empty(batch, config.adm_in_channels) if config.adm_in_channels is not None else None
        return (torch.empty(batch, config.in_channels, h, w), torch.empty(batch),
                torch.empty(batch, TRACE_TOKENS, config.context_in or config.hidden), y), {}


SD3 = SD3Family()
