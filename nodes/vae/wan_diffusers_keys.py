"""Diffusers' layout of the Wan VAEs (``AutoencoderKLWan``, ``AutoencoderKLQwenImage``: a pipeline
folder's ``vae/diffusion_pytorch_model.safetensors``) -> the original Wan keys ``wan_vae.py`` uses,
registered as a key layout (``weights/layouts.FamilyLayout``) so the weight store reads such files.

Diffusers nests what the original keeps flat: Wan 2.1's decoder levels are
``decoder.up_blocks.<level>.resnets.<j>`` / ``.upsamplers.0`` where the original counts
``decoder.upsamples.<n>`` straight through (num_res_blocks + 1 resnets and an upsample a level);
resnet parts are named ``norm1`` / ``conv1`` / ``norm2`` / ``conv2`` / ``conv_shortcut`` where the
original has ``residual.0`` / ``.2`` / ``.3`` / ``.6`` and ``shortcut``; the mid block is
``mid_block.resnets.<i>`` / ``attentions.0`` for ``middle.0`` / ``.2`` / ``.1``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout

__all__ = ["LAYOUT", "is_diffusers_wan_vae", "diffusers_rename", "diffusers_header"]

LAYOUT = "diffusers_wan_vae"

_RESNET = {"norm1.gamma": "residual.0.gamma", "norm2.gamma": "residual.3.gamma"}
_RESNET_PREFIX = {"conv1.": "residual.2.", "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}
_TOP = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}


def is_diffusers_wan_vae(keys: Collection[str]) -> bool:
    return "decoder.mid_block.attentions.0.to_qkv.weight" in keys and "post_quant_conv.weight" in keys


def _resnet(tail: str) -> str:
    if tail in _RESNET:
        return _RESNET[tail]
    for old, new in _RESNET_PREFIX.items():
        if tail.startswith(old):
            return new + tail[len(old):]
    return tail


def diffusers_rename(keys: Iterable[str]) -> Callable[[str], str | None]:
    """The renaming of one file's keys (its level sizes come from the keys themselves)."""
    keys = list(keys)
    residual = any(k.startswith("encoder.down_blocks.0.resnets.") for k in keys)
    up0 = {m.group(1) for k in keys if (m := re.match(r"decoder\.up_blocks\.0\.resnets\.(\d+)\.", k))}
    per_level = len(up0)   # num_res_blocks + 1 decoder resnets a level

    def rename(key: str) -> str | None:
        for old, new in _TOP.items():
            if key.startswith(old):
                return new + key[len(old):]
        side, rest = key.split(".", 1)
        if rest.startswith("conv_in."):
            return f"{side}.conv1.{rest[8:]}"
        if rest.startswith("norm_out."):
            return f"{side}.head.0.{rest[9:]}"
        if rest.startswith("conv_out."):
            return f"{side}.head.2.{rest[9:]}"
        if m := re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.+)", rest):
            if m.group(1) == "attentions":
                return f"{side}.middle.1.{m.group(3)}"
            return f"{side}.middle.{2 * int(m.group(2))}.{_resnet(m.group(3))}"
        if m := re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
            return f"encoder.downsamples.{m.group(1)}.downsamples.{m.group(2)}.{_resnet(m.group(3))}"
        if m := re.match(r"down_blocks\.(\d+)\.downsampler\.(.+)", rest):
            return f"encoder.downsamples.{m.group(1)}.downsamples.{per_level - 1}.{m.group(2)}"
        if m := re.match(r"down_blocks\.(\d+)\.(.+)", rest):   # Wan 2.1: one flat list, as the original
            return f"encoder.downsamples.{m.group(1)}.{_resnet(m.group(2))}"
        if m := re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
            level, j, tail = int(m.group(1)), int(m.group(2)), _resnet(m.group(3))
            if residual:
                return f"decoder.upsamples.{level}.upsamples.{j}.{tail}"
            return f"decoder.upsamples.{level * (per_level + 1) + j}.{tail}"
        if m := re.match(r"up_blocks\.(\d+)\.(upsampler|upsamplers\.0)\.(.+)", rest):
            level = int(m.group(1))
            if residual:
                return f"decoder.upsamples.{level}.upsamples.{per_level}.{m.group(3)}"
            return f"decoder.upsamples.{level * (per_level + 1) + per_level}.{m.group(3)}"
        return key

    return rename


def diffusers_header(info: Mapping[str, Any]) -> dict:
    rename = diffusers_rename(info)
    return {rename(k): v for k, v in info.items()}


register_layout(FamilyLayout(LAYOUT, lambda keys: False, diffusers_header, diffusers_rename))
