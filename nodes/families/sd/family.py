"""The SD 1.x / 2.x / SDXL family (``base.Family``): the LDM UNet and its variants.

Variants (``ModelHandle.kind``): "sd1", "sd2", "sdxl", "sdxl_refiner", "sd2_x4" (the SD 2.x x4
upscaler). Inpaint (9 channels), instruct-pix2pix (8), SD2.1 unCLIP, Lotus / SDPose, Stable
Zero123 and Playground v2.5 are these variants with extra handle fields (``detect.py``). Model
files live beside this one (``unet.py``, ``x4_upscaler.py``, ``lotus.py``, ``unclip.py``,
``zero123.py``, ``sdpose.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from mixgraph.nodes.families.base import CheckpointLayout, Detection, Sampling, TextEncoderSlot
from mixgraph.nodes.families.sd.detect import CHECKPOINT_ENCODERS, detect_sd
from mixgraph.nodes.families.sd.encoders import sd_rules
from mixgraph.nodes.families.sd.latent_formats import sd_latent_format
from mixgraph.nodes.families.sd.parts import parts_of
from mixgraph.nodes.families.sd.runner import UNetRunner
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.families.sd.unet import UNetConfig, UNetModel
from mixgraph.nodes.families.sd.zero123 import CameraProjection
from mixgraph.nodes.weights import store
from mixgraph.nodes.families.sd.x4_upscaler import BETA_RANGE as X4_BETA_RANGE

__all__ = ["SD", "SDFamily", "VARIANTS", "CLIP_PREFIXES", "UNET_PREFIX", "VAE_PREFIX"]

VARIANTS = ("sd1", "sd2", "sdxl", "sdxl_refiner", "sd2_x4")
# diffusers pipeline folder of each text encoder, per variant
_FOLDERS = {"sd1": {"clip_l": "text_encoder"}, "sd2": {"clip_h": "text_encoder"},
            "sdxl": {"clip_l": "text_encoder", "clip_g": "text_encoder_2"},
            "sdxl_refiner": {"clip_g": "text_encoder_2"}}
_ENCODING = {"sd2_x4": "sd2"}  # the x4 upscaler encodes its prompt as SD 2.x does
#: text-encoder kind ("sd1", ...) -> {encoder: (checkpoint prefix, layout)}, in the usual order
CLIP_PREFIXES = {k: CHECKPOINT_ENCODERS[k] for k in ("sd1", "sd2", "sdxl", "sdxl_refiner")}
TRACE_TOKENS = 77  # one CLIP chunk: the memory estimate's context length
UNET_PREFIX = "model.diffusion_model."  # the LDM/SGM single-file layout
VAE_PREFIX = "first_stage_model."
# ComfyUI's modelspec.architecture of the SDXL-family files (comfy/sd.py save_checkpoint)
_ARCHITECTURE = {"sdxl": "stable-diffusion-xl-v1-base", "sdxl_refiner": "stable-diffusion-xl-v1-refiner"}


class SDFamily:
    """``base.Family`` for SD 1.x / 2.x / SDXL (see the module docstring)."""

    name = "sd"
    display = "SD 1.x, SD 2.x and SDXL"
    variants = VARIANTS
    precision_roles: Mapping[str, str] = {"diffusion": "sd_unet", "text": "text", "vae": "vae"}

    def detect(self, info: Mapping[str, Any], read: Callable[[str], Tensor] | None = None,
               source: WeightSource | None = None) -> Detection | None:
        return detect_sd(info, read, source, self.latent_format)

    def build(self, config: UNetConfig) -> UNetModel:
        return UNetModel(config)

    def runner(self, handle, module: torch.nn.Module, policy) -> UNetRunner:
        return UNetRunner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        if variant == "sd2_x4":
            return Sampling(prediction="v_prediction", beta_range=X4_BETA_RANGE)
        return Sampling()

    def latent_format(self, variant: str, channels: int = 4) -> LatentFormat:
        """The variant's own (scalar) latent format, with its preview factors and TAESD decoder
        (``latent_formats.py``)."""
        return sd_latent_format(variant, channels)

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        """The CLIP encoders of ``variant``: where a checkpoint keeps each, in which layout, its
        diffusers folder, and their output rules (``encoders.SD_ENCODERS``), in set order."""
        encoding = _ENCODING.get(variant, variant)
        if encoding not in CLIP_PREFIXES:
            raise ValueError(f"SD variant {variant!r}: no text encoders known (variants: {', '.join(VARIANTS)})")
        prefixes = CLIP_PREFIXES[encoding]
        return tuple(TextEncoderSlot(name, "clip", "text", prefix=prefixes[name][0], layout=prefixes[name][1],
                                     folder=_FOLDERS[encoding][name], encoding=encoding, rule=rule)
                     for name, rule in sd_rules(encoding))

    def checkpoint_layout(self, variant: str) -> CheckpointLayout:
        """``base.CheckpointLayout`` of an SD ``variant``'s single-file checkpoint (LDM/SGM
        layout): the UNet under ``model.diffusion_model.``, the VAE under ``first_stage_model.``,
        the text encoders where its checkpoints keep them (``CLIP_PREFIXES``); the x4 upscaler
        is not saved yet."""
        if variant not in CLIP_PREFIXES:
            raise ValueError(f"saving a {variant!r} model is not supported yet")
        encoders = tuple((name, prefix, layout) for name, (prefix, layout) in CLIP_PREFIXES[variant].items())
        return CheckpointLayout(UNET_PREFIX, VAE_PREFIX, encoders, _ARCHITECTURE.get(variant))

    @torch.inference_mode()
    def checkpoint_extras(self, handle, dtype: torch.dtype) -> dict[str, Tensor]:
        """What a checkpoint keeps beside the UNet at its top level: Stable Zero123's camera
        projection ``cc_projection.*`` (where ComfyUI's ``Stable_Zero123`` model keeps it),
        materialized in ``dtype``; nothing for the other variants."""
        cc = parts_of(handle).cc_projection
        if cc is None:
            return {}
        m = store.materialize("cc_projection", cc.source, cc.config, dtype, (), CameraProjection)
        return dict(m.state_dict())

    def trace_inputs(self, config: UNetConfig, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        """``UNetModel.forward`` inputs on ``latent_shape`` (h, w) latent pixels: x, timesteps,
        one CLIP chunk of context, and the vector input (the x4 upscaler's noise label)."""
        h, w = latent_shape[-2:]
        y = torch.empty(batch, config.adm_in_channels) if config.adm_in_channels else None
        if getattr(config, "num_classes", None):  # the x4 upscaler's noise-level label
            y = torch.zeros(batch, 1)
        return (torch.empty(batch, config.in_channels, h, w), torch.empty(batch),
                torch.empty(batch, TRACE_TOKENS, config.context_dim or 768), y), {}


SD = SDFamily()
