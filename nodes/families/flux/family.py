"""The Flux.1 family (``base.Family``): Flux.1 dev / schnell / Kontext / Fill / Canny / Depth and
Chroma, in BFL's / ComfyUI's layout or diffusers' (converted on load).

Variants (``ModelHandle.kind``): "dev" (guidance-distilled; Kontext, Fill, Canny and Depth are dev
models, the latter two with a wider input, ``runner.concat``), "schnell", "chroma". Sampling is
ComfyUI's: dev and Chroma are ``ModelSamplingFlux`` (the exponential shift, μ = 1.15; the model
sees σ), schnell ``ModelSamplingDiscreteFlow`` with shift 1 and multiplier 1. The latent is the
Flux autoencoder's 16-channel format. Text: CLIP-L (pooled) + T5-XXL (tokens), set "flux";
Chroma T5-XXL alone, set "chroma".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.encoders.dit_joins import CHROMA_RULES, FLUX_RULES
from mixgraph.nodes.families.base import CheckpointLayout, Detection, LoraTarget, Sampling, TextEncoderSlot
from mixgraph.nodes.families.flux.chroma import Chroma, ChromaConfig, chroma_config
from mixgraph.nodes.families.flux.detect import CHROMA_KEY, DIFFUSERS_LAYOUT, detect_keys, flux_config
from mixgraph.nodes.families.flux.diffusers_keys import (chroma_plan, fuse, is_diffusers_chroma, is_diffusers_flux,
                                                     lora_targets, shapes_to_bfl, stored_rename)
from mixgraph.nodes.families.flux.model import Flux, FluxConfig
from mixgraph.nodes.families.flux.runner import FluxRunner
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT, shifted_format
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout

__all__ = ["FLUX", "FluxFamily", "VARIANTS", "DIFFUSION_PREFIX", "VAE_PREFIX", "TEXT_PREFIXES"]

VARIANTS = ("dev", "schnell", "chroma")
DIFFUSION_PREFIX = "model.diffusion_model."
VAE_PREFIX = "vae."  # ComfyUI's all-in-one Flux checkpoints (supported_models.Flux.vae_key_prefix)
#: where ComfyUI's all-in-one checkpoints keep each text encoder, and its key layout
TEXT_PREFIXES = {"clip_l": ("text_encoders.clip_l.transformer.", "hf_clip"),
                 "t5xxl": ("text_encoders.t5xxl.transformer.", "ldm")}
TRACE_TOKENS = 256  # the memory estimate's text length (ComfyUI's T5 minimum for Flux: 256)
# the encoders' output rules are ComfyUI's flux / pixart-T5 sets' (encoders/dit_joins.py): clip_l's
# normed last layer and unprojected pooled output, T5's last layer padded to 256 tokens (Chroma: 1)


class FluxFamily:
    """``base.Family`` for Flux.1 and Chroma (see the module docstring)."""

    name = "flux"
    display = "Flux.1 and Chroma"
    variants = VARIANTS
    refusals = ("Flux", "Chroma")  # the refusal-table rows it runs
    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}
    clip_types: Mapping[str, str] = {"flux": "dev", "chroma": "chroma"}

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        found = detect_keys(info)
        if found is None:
            return None
        shapes, layout = found
        if CHROMA_KEY in shapes:
            config, variant = chroma_config(shapes), "chroma"
        else:
            config = flux_config(shapes)
            variant = "dev" if config.guidance_embed else "schnell"
        fields: dict[str, Any] = {"latent_format": self.latent_format(variant, config.out_channels)}
        if layout != "ldm":
            fields["source_layout"] = layout  # the loader converts the stored keys on read
        return Detection(self.name, variant, config, fields)

    def build(self, config: FluxConfig | ChromaConfig) -> nn.Module:
        return Chroma(config) if isinstance(config, ChromaConfig) else Flux(config)

    def runner(self, handle, module: nn.Module, policy) -> FluxRunner:
        return FluxRunner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        if variant == "schnell":  # ComfyUI FluxSchnell: ModelType.FLOW, shift 1, multiplier 1
            return Sampling(prediction="flow", shift=1.0, multiplier=1.0, shift_kind="linear")
        return Sampling(prediction="flow", shift=1.15, multiplier=1.0, shift_kind="exponential")

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        if channels == FLUX_LATENT.channels:
            return FLUX_LATENT
        return shifted_format(FLUX_LATENT.scale_factor, FLUX_LATENT.mean[0], "flux", channels=channels)

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        if variant not in VARIANTS:
            raise ValueError(f"Flux variant {variant!r}: no text encoders known (variants: {', '.join(VARIANTS)})")
        t5_prefix, t5_layout = TEXT_PREFIXES["t5xxl"]
        if variant == "chroma":
            return (TextEncoderSlot("t5xxl", "t5", "text_large", prefix=t5_prefix, layout=t5_layout, folder="text_encoder",
                                    encoding="chroma", rule=CHROMA_RULES["t5xxl"], arch="t5"),)
        clip_prefix, clip_layout = TEXT_PREFIXES["clip_l"]
        return (TextEncoderSlot("clip_l", "clip", "text", prefix=clip_prefix, layout=clip_layout,
                                folder="text_encoder", encoding="flux", rule=FLUX_RULES["clip_l"], arch="clip"),
                TextEncoderSlot("t5xxl", "t5", "text_large", prefix=t5_prefix, layout=t5_layout, folder="text_encoder_2",
                                encoding="flux", rule=FLUX_RULES["t5xxl"], arch="t5"))

    def lora_key_map(self, config) -> dict[str, LoraTarget]:
        """``base.Family.lora_key_map``: diffusers / ai-toolkit Flux LoRA names onto BFL weights,
        q / k / v / MLP-in onto their rows of the fused ones (``diffusers_keys.lora_targets``)."""
        return lora_targets(config)

    def checkpoint_layout(self, variant: str) -> CheckpointLayout:
        """ComfyUI's all-in-one layout: the model under ``model.diffusion_model.``, the VAE under
        ``vae.``, the text encoders under ``text_encoders.<name>.transformer.``."""
        encoders = tuple((s.name, s.prefix, s.layout) for s in self.text_encoders(variant))
        return CheckpointLayout(DIFFUSION_PREFIX, VAE_PREFIX, encoders, None)

    def trace_inputs(self, config, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        h, w = latent_shape[-2:]
        x = torch.empty(batch, config.in_channels, h, w)
        context = torch.empty(batch, TRACE_TOKENS, config.context_in_dim)
        if isinstance(config, ChromaConfig):
            return (x, torch.empty(batch), context), {"guidance": torch.empty(batch)}
        return (x, torch.empty(batch), context), {"y": torch.empty(batch, config.vec_in_dim),
                                                  "guidance": torch.empty(batch)}


FLUX = FluxFamily()


def _diffusers_rename(stored_keys):
    """A diffusers-layout Flux / Chroma file's keys renamed to BFL's (the pieces of a fused q,
    k, v named as pieces, which ``fuse`` joins after reading)."""
    return stored_rename(stored_keys, chroma_plan if is_diffusers_chroma(stored_keys) else None)


def _diffusers_header(info):
    """The file's shapes under BFL's keys (what ``detect`` sees)."""
    return shapes_to_bfl(info, chroma_plan if is_diffusers_chroma(info) else None)


register_layout(FamilyLayout(DIFFUSERS_LAYOUT, is_diffusers_flux, _diffusers_header, _diffusers_rename, fuse))
