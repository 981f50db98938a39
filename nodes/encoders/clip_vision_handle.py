"""CLIP_VISION handles: where a vision tower's weights are (a clip_vision file, or the
``embedder.model.visual.`` part of an SD2.1 unCLIP checkpoint), its config from the header, and
``encode`` (ComfyUI's ``CLIPVisionEncode``) through the weight store and the precision policy.

Two towers share the socket, as in ComfyUI: CLIP ViTs (``encoders/clip_vision.py``) and SigLIP
(``encoders/siglip_vision.py``, Flux Redux's image encoder); the config's type picks the module
and the preprocessing's mean and std (``_TOWERS``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.encoders.clip_vision import (CLIP_MEAN, CLIP_STD, CLIPVisionConfig, CLIPVisionModel,
                                                 ClipVisionError, clip_preprocess, hf_vision_rename,
                                                 open_clip_vision_shapes)
from mixgraph.nodes.encoders.siglip_vision import (SIGLIP_MEAN, SIGLIP_STD, SiglipVisionConfig, SiglipVisionModel,
                                                   is_siglip_vision, siglip_vision_rename)
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.payloads.vision import ClipVisionOutput

__all__ = ["ClipVisionHandle", "clip_vision_handle", "load_clip_vision"]

# config type -> (module, image mean, image std)
_TOWERS = {
    CLIPVisionConfig: (CLIPVisionModel, CLIP_MEAN, CLIP_STD),
    SiglipVisionConfig: (SiglipVisionModel, SIGLIP_MEAN, SIGLIP_STD),
}

_OPEN_CLIP_TOP = ("class_embedding", "conv1.", "positional_embedding", "ln_pre.", "ln_post.", "proj",
                  "transformer.resblocks.")


@dataclass(frozen=True)
class ClipVisionHandle:
    """CLIP_VISION: a vision-tower recipe (weights are read on use, in the policy's dtype)."""

    source: WeightSource
    config: CLIPVisionConfig | SiglipVisionConfig
    precision: PolicyLike | None = None

    def module(self, policy: PolicyLike) -> CLIPVisionModel | SiglipVisionModel:
        build = _TOWERS[type(self.config)][0]
        m = store.materialize("clip_vision", self.source, self.config, policy.storage, (), build)
        return apply_precision(m, policy)

    def encode(self, image: Tensor, policy: PolicyLike, crop: bool = True) -> ClipVisionOutput:
        """IMAGE [B, H, W, C] in 0..1 -> ClipVisionOutput (float32, CPU); ``crop``: centre crop
        ("center") or stretch ("none") to the model's image size."""
        m = self.module(policy)
        _, mean, std = _TOWERS[type(self.config)]
        device = next(m.parameters()).device
        pixels = clip_preprocess(image, self.config.image_size, crop, mean, std).to(device)  # [B, 3, S, S]
        with torch.inference_mode():
            last, penultimate, embeds, *rest = m(pixels)  # SigLIP adds every layer's output
        every = rest[0].float().cpu() if rest else None
        return ClipVisionOutput(image_embeds=embeds.float().cpu(), last_hidden_state=last.float().cpu(),
                                penultimate_hidden_states=penultimate.float().cpu(), all_hidden_states=every)

    def with_precision(self, policy: PolicyLike | None) -> "ClipVisionHandle":
        return dataclasses.replace(self, precision=policy)


def clip_vision_handle(path: str | os.PathLike, info: Mapping, prefix: str = "") -> ClipVisionHandle | None:
    """The vision tower under ``prefix`` of the file whose header is ``info`` (HF CLIP or SigLIP
    layout, or OpenCLIP's), or None when there is none there."""
    shapes = {k[len(prefix):]: tuple(v.shape) for k, v in info.items() if k.startswith(prefix)}
    where = f"{os.path.basename(path)}{' under ' + prefix if prefix else ''}"
    if "transformer.resblocks.0.attn.in_proj_weight" in shapes and "conv1.weight" in shapes:
        source = WeightSource.from_file(path, prefix, "open_clip_vision")
        hf = open_clip_vision_shapes({k: s for k, s in shapes.items() if k.startswith(_OPEN_CLIP_TOP)})
    elif is_siglip_vision(shapes):
        source = WeightSource.from_file(path, prefix, "hf_siglip_vision")
        kept = {n: s for k, s in shapes.items() if (n := siglip_vision_rename(k)) is not None}
        return ClipVisionHandle(source, SiglipVisionConfig.from_shapes(kept, where))
    elif "vision_model.embeddings.patch_embedding.weight" in shapes:
        source = WeightSource.from_file(path, prefix, "hf_clip_vision")
        hf = {n: s for k, s in shapes.items() if (n := hf_vision_rename(k)) is not None}
    else:
        return None
    return ClipVisionHandle(source, CLIPVisionConfig.from_shapes(hf, where))


def load_clip_vision(path: str | os.PathLike) -> ClipVisionHandle:
    """CLIPVisionLoader: a clip_vision file in HF layout (``vision_model.*``, as ComfyUI's
    ViT-L / ViT-H / ViT-bigG and SigLIP files) or OpenCLIP layout (``visual.*``)."""
    info = inspect_file(path)
    name = os.path.basename(path)
    for prefix in ("", "visual."):
        handle = clip_vision_handle(path, info, prefix)
        if handle is not None:
            return handle
    if any(k.startswith("embeddings.patch_embeddings.") for k in info):
        raise NotImplementedError(f"{name}: DINOv2 image encoders: not supported yet (CLIP ViT-L, ViT-H, "
                                  f"ViT-bigG and SigLIP are)")
    raise ClipVisionError(f"{name}: not a CLIP vision model: no 'vision_model.embeddings.patch_embedding.weight' "
                          f"or 'visual.conv1.weight' ({len(info)} tensors, e.g. {sorted(info)[:4]})")
