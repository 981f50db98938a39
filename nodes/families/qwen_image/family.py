"""Qwen-Image behind the family seam (``base.Family``), as ComfyUI's ``supported_models.QwenImage``:

* one variant, "qwen_image": text-to-image and Edit (Edit 2509 / 2511 included) share the
  weights' layout; an Edit model differs only in what its conds carry (reference latents) and,
  for Edit-2511 files, the default reference method (``detect.py``);
* sampling: flow matching (CONST), ComfyUI's ``ModelSamplingDiscreteFlow`` with shift 1.15 and
  multiplier 1 (the templates' ModelSamplingAuraFlow sets its own shift on top);
* latent: the Wan 2.1 autoencoder's 16-channel format (``WAN21_LATENT``), sampled as an image;
* text: Qwen2.5-VL 7B (slot "qwen25_7b", architecture "qwen2_5_vl", set "qwen_image", CLIPLoader
  type "qwen_image"), where ComfyUI's all-in-one checkpoints keep it
  (``text_encoders.qwen25_7b.transformer.``); its output is the last hidden state after the final
  norm (ComfyUI's ``layer="last"``), the template tokens dropped by the set's join.

It takes over the "Qwen-Image" row of ``refused.py``; ComfyUI's files (bare or under
``model.diffusion_model.``) and diffusers' ``transformer/`` folders load alike, as they share key
names. LoRAs in ComfyUI's, diffusers' / PEFT, ai-toolkit, musubi / kohya, SimpleTuner and
lightx2v (Qwen-Image-Lightning) names reach the same weights (``lora_key_map``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.encoders.encoder_set import OutputRule
from mixgraph.nodes.families.base import Detection, LoraTarget, Sampling, TextEncoderSlot
from mixgraph.nodes.families.qwen_image.detect import is_qwen_image, qwen_image_config
from mixgraph.nodes.families.qwen_image.model import QwenImage, QwenImageConfig
from mixgraph.nodes.families.qwen_image.runner import QwenImageRunner
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT

__all__ = ["QwenImageFamily", "QWEN_IMAGE", "VARIANT", "TEXT_PREFIX", "QWEN25_RULE", "TRACE_TOKENS"]

VARIANT = "qwen_image"
TEXT_PREFIX = "text_encoders.qwen25_7b.transformer."  # ComfyUI's all-in-one checkpoints
TRACE_TOKENS = 64  # text tokens of the memory estimate's traced call (a prompt without its template)
QWEN_PAD = 151643  # Qwen2.5's <|endoftext|>
#: ComfyUI's Qwen25_7BVLI text model for Qwen-Image: the last layer after the final norm, no pooled output
QWEN25_RULE = OutputRule(pad_token=QWEN_PAD, default_layer=None, norm_hidden=False, project_pooled=False)


class QwenImageFamily:
    """``base.Family`` for Qwen-Image (see the module docstring)."""

    name = "qwen_image"
    display = "Qwen-Image"
    variants = (VARIANT,)
    refusals = ("Qwen-Image",)  # the refusal-table row it runs
    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}
    clip_types: Mapping[str, str] = {"qwen_image": VARIANT}

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        if not is_qwen_image(info):
            return None
        config = qwen_image_config(info)
        return Detection(self.name, VARIANT, config,
                         {"prediction": "flow", "latent_format": self.latent_format(VARIANT, config.in_channels)})

    def build(self, config: QwenImageConfig) -> QwenImage:
        return QwenImage(config)

    def runner(self, handle, module: nn.Module, policy) -> QwenImageRunner:
        return QwenImageRunner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        return Sampling(prediction="flow", shift=1.15, multiplier=1.0)

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        if channels != WAN21_LATENT.channels:
            raise ValueError(f"Qwen-Image: a {channels}-channel model; the family samples in the 16-channel "
                             f"Wan 2.1 latent")
        return WAN21_LATENT

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        if variant != VARIANT:
            raise ValueError(f"Qwen-Image variant {variant!r}: no text encoders known (variants: {VARIANT})")
        return (TextEncoderSlot("qwen25_7b", "qwen2.5", "text_large", prefix=TEXT_PREFIX, layout="ldm",
                                folder="text_encoder", encoding="qwen_image", rule=QWEN25_RULE, arch="qwen2_5_vl"),)

    def lora_key_map(self, config: QwenImageConfig) -> dict[str, LoraTarget]:
        """``base.Family.lora_key_map``: every weight under its own module name. The model's names
        are diffusers', so this map is the identity; the LoRA mapper then accepts them bare
        (lightx2v / Qwen-Image-Lightning, ComfyUI's ``model_lora_keys_unet`` for Qwen-Image) and
        with ``transformer.`` (diffusers / PEFT, ai-toolkit), ``diffusion_model.``,
        ``lycoris_`` (SimpleTuner) and ``lora_transformer_`` prefixes; kohya / musubi's
        ``lora_unet_<name with _>`` matches the model's own names already."""
        return {name[: -len(".weight")]: LoraTarget(name) for name in _weight_names(config)}

    def trace_inputs(self, config: QwenImageConfig, latent_shape: tuple[int, ...], batch: int,
                     refs: tuple[tuple[int, int], ...] = ()) -> tuple[tuple, dict]:
        """`refs`: the (h, w) latent sizes of the Edit model's reference latents, whose tokens
        join the image tokens in every block."""
        h, w = latent_shape[-2:]
        kwargs = {"ref_latents": [torch.empty(1, config.in_channels, rh, rw) for rh, rw in refs],
                  "ref_method": "index"} if refs else {}
        return (torch.empty(batch, config.in_channels, h, w), torch.empty(batch),
                torch.empty(batch, TRACE_TOKENS, config.context_dim)), kwargs


def _weight_names(config: QwenImageConfig) -> list[str]:
    """The ``.weight`` keys of every Linear of a model of ``config`` (from the module tree on the
    meta device: no memory)."""
    with torch.device("meta"):
        model = QwenImage(config)
    return [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)]


QWEN_IMAGE = QwenImageFamily()
