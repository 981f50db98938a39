"""Lumina Image 2.0 and Z-Image behind the family seam (``base.Family``): one NextDiT model class
(``nextdit.py``, as ComfyUI's ``comfy/ldm/lumina/model.py``), two families that differ in
settings, as ComfyUI's ``supported_models.Lumina2`` / ``ZImage``:

=============  ======================  =================  ==========================================
family         sampling (flow)         text encoder       detection
=============  ======================  =================  ==========================================
``lumina2``    shift 6, multiplier 1   Gemma 2 2B         SiLU-fed modulation (``adaLN_modulation.1``)
``z_image``    shift 3, multiplier 1   Qwen3-4B           ``adaLN_modulation.0``, learned pad tokens
=============  ======================  =================  ==========================================

Both sample in the Flux autoencoder's 16-channel latent (``FLUX_LATENT``) and take over the
"Lumina 2" row of ``refused.py`` (Z-Image's files match its ``cap_embedder.1.weight`` too).
Z-Image's encoder reads the "z_image" tokenizer (the Qwen2.5 BPE in ComfyUI's ZImageTokenizer chat
template), Lumina 2's the Gemma SentencePiece model its file carries. ComfyUI's CLIPLoader type
"lumina2" loads either text encoder; both families declare it
(``clip_types``), each with its own variant, and the loader tells them apart by the encoder
architecture the file holds (``TextEncoderSlot.arch``: "gemma2" or "qwen3"). Both read their
diffusion model in ComfyUI's keys (bare, or under ``model.diffusion_model.``) or in diffusers'
(``diffusers_keys.py``, registered as the "diffusers_nextdit" key layout).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.encoders.encoder_set import OutputRule
from mixgraph.nodes.families.base import CheckpointLayout, Detection, LoraTarget, Sampling, TextEncoderSlot
from mixgraph.nodes.families.lumina import diffusers_keys
from mixgraph.nodes.families.lumina.detect import is_nextdit, is_z_image, nextdit_config
from mixgraph.nodes.families.lumina.nextdit import NextDiT, NextDiTConfig
from mixgraph.nodes.families.lumina.runner import NextDiTRunner
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT, shifted_format
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout

__all__ = ["NextDiTFamily", "LUMINA2", "Z_IMAGE", "TRACE_TOKENS"]

TRACE_TOKENS = 128  # caption tokens of the memory estimate's traced call (a system prompt + a prompt)
TEXT_PREFIX = "text_encoders."  # where ComfyUI's single-file checkpoints keep the text encoder
DIFFUSION_PREFIX = "model.diffusion_model."
VAE_PREFIX = "vae."  # ComfyUI's all-in-one Lumina 2 checkpoints (supported_models.Lumina2.vae_key_prefix)
# ComfyUI's Gemma2_2BModel / Qwen3_4BModel: the penultimate hidden state, no final norm, no pooled
GEMMA2_RULE = OutputRule(pad_token=0, default_layer=-2, norm_hidden=False, project_pooled=False)
QWEN3_RULE = OutputRule(pad_token=151643, default_layer=-2, norm_hidden=False, project_pooled=False)


class NextDiTFamily:
    """One NextDiT family: ``z_image`` says which kind of file ``detect`` takes."""

    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}
    refusals = ("Lumina 2",)

    def __init__(self, name: str, display: str, z_image: bool, shift: float, encoder: TextEncoderSlot):
        self.name, self.display, self.z_image = name, display, z_image
        self.shift = shift
        self.encoder = encoder
        self.clip_types = {"lumina2": name}  # ComfyUI's CLIPLoader type -> the variant it fills

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        if diffusers_keys.diffusers_layout(info):  # a diffusers file the loader has not converted (refused.py)
            info = diffusers_keys.to_comfy_shapes(info)
        if not is_nextdit(info) or is_z_image(info) != self.z_image:
            return None
        cfg = nextdit_config(info)
        fields = {"prediction": "flow", "latent_format": self.latent_format(self.name, cfg.in_channels)}
        return Detection(self.name, self.name, cfg, fields)

    def build(self, config: NextDiTConfig) -> NextDiT:
        return NextDiT(config)

    def runner(self, handle, module: nn.Module, policy) -> NextDiTRunner:
        return NextDiTRunner(handle, module, policy, self.display)

    def sampling(self, variant: str) -> Sampling:
        return Sampling(prediction="flow", shift=self.shift, multiplier=1.0)

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        if channels == FLUX_LATENT.channels:
            return FLUX_LATENT
        return shifted_format(FLUX_LATENT.scale_factor, FLUX_LATENT.mean[0], "flux", channels=channels)

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        return (self.encoder,)

    def lora_key_map(self, config: NextDiTConfig) -> dict[str, LoraTarget]:
        """``base.Family.lora_key_map``: diffusers / ai-toolkit LoRA names onto the NextDiT's
        weights, q / k / v onto their rows of ``attention.qkv`` (``diffusers_keys.lora_targets``)."""
        return diffusers_keys.lora_targets(config)

    def checkpoint_layout(self, variant: str) -> CheckpointLayout:
        """ComfyUI's all-in-one layout (``lumina_2.safetensors``, NetaYume Lumina): the model under
        ``model.diffusion_model.``, the VAE under ``vae.`` (where CheckpointLoaderSimple finds it),
        the text encoder under ``text_encoders.<name>.transformer.`` (``self.encoder.prefix``).
        Saving writes the model and the VAE; a text encoder is given no place (saving one is
        refused by name), as its tokenizer (Gemma's ``spiece_model`` tensor) is not written yet."""
        return CheckpointLayout(DIFFUSION_PREFIX, VAE_PREFIX, (), None)

    def trace_inputs(self, config: NextDiTConfig, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        h, w = latent_shape[-2:]
        return (torch.empty(batch, config.in_channels, h, w), torch.empty(batch),
                torch.empty(batch, TRACE_TOKENS, config.cap_feat_dim)), {}


# diffusers' transformer files of both (UNETLoader on transformer/diffusion_pytorch_model.safetensors)
# (fused q/k/v: every stored key is read under its own name, then converted as a whole)
DIFFUSERS_LAYOUT = register_layout(FamilyLayout("diffusers_nextdit", diffusers_keys.diffusers_layout,
                                                diffusers_keys.to_comfy_shapes, lambda keys: lambda k: k,
                                                diffusers_keys.to_comfy))

LUMINA2 = NextDiTFamily(
    "lumina2", "Lumina Image 2.0", z_image=False, shift=6.0,
    encoder=TextEncoderSlot("gemma2_2b", "gemma", "text_large", prefix=TEXT_PREFIX + "gemma2_2b.transformer.",
                            layout="ldm", folder="text_encoder", encoding="lumina2", rule=GEMMA2_RULE,
                            arch="gemma2"))
Z_IMAGE = NextDiTFamily(
    "z_image", "Z-Image", z_image=True, shift=3.0,
    encoder=TextEncoderSlot("qwen3_4b", "z_image", "text_large", prefix=TEXT_PREFIX + "qwen3_4b.transformer.",
                            layout="ldm", folder="text_encoder", encoding="z_image", rule=QWEN3_RULE,
                            arch="qwen3"))
