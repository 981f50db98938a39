"""diffusers' key layouts of Lumina 2 (``Lumina2Transformer2DModel``) and Z-Image
(``ZImageTransformer2DModel``) -> ComfyUI's, which ``nextdit.NextDiT``'s attribute names are.

Most keys are renamed; the attention's separate ``to_q`` / ``to_k`` / ``to_v`` weights become
one ``qkv`` weight (rows: the query heads, then the key heads, then the value heads), so the
conversion works on a whole state dict (``to_comfy``). ``to_comfy_shapes`` does the same to a
header (key -> shape), for detection before any tensor is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["LUMINA2_DIFFUSERS_KEY", "Z_IMAGE_DIFFUSERS_KEY", "diffusers_layout", "to_comfy", "to_comfy_shapes"]

LUMINA2_DIFFUSERS_KEY = "time_caption_embed.caption_embedder.1.weight"
Z_IMAGE_DIFFUSERS_KEY = "all_x_embedder.2-1.weight"

_BLOCK = re.compile(r"^(noise_refiner|context_refiner|layers)\.(\d+)\.(.+)$")
_QKV = ("to_q", "to_k", "to_v")

# per-block renames, diffusers -> ComfyUI (both models; Lumina 2's norm1 is an RMSNormZero)
_BLOCK_NAMES = {
    "attn.to_out.0.weight": "attention.out.weight",
    "attn.norm_q.weight": "attention.q_norm.weight",
    "attn.norm_k.weight": "attention.k_norm.weight",
    "attention.to_out.0.weight": "attention.out.weight",
    "attention.norm_q.weight": "attention.q_norm.weight",
    "attention.norm_k.weight": "attention.k_norm.weight",
    "feed_forward.linear_1.weight": "feed_forward.w1.weight",
    "feed_forward.linear_2.weight": "feed_forward.w2.weight",
    "feed_forward.linear_3.weight": "feed_forward.w3.weight",
    "norm1.linear.weight": "adaLN_modulation.1.weight",
    "norm1.linear.bias": "adaLN_modulation.1.bias",
    "norm1.norm.weight": "attention_norm1.weight",
    "norm1.weight": "attention_norm1.weight",
    "norm2.weight": "attention_norm2.weight",
}

_TOP_NAMES = {
    "time_caption_embed.timestep_embedder.linear_1.weight": "t_embedder.mlp.0.weight",
    "time_caption_embed.timestep_embedder.linear_1.bias": "t_embedder.mlp.0.bias",
    "time_caption_embed.timestep_embedder.linear_2.weight": "t_embedder.mlp.2.weight",
    "time_caption_embed.timestep_embedder.linear_2.bias": "t_embedder.mlp.2.bias",
    "time_caption_embed.caption_embedder.0.weight": "cap_embedder.0.weight",
    "time_caption_embed.caption_embedder.1.weight": "cap_embedder.1.weight",
    "time_caption_embed.caption_embedder.1.bias": "cap_embedder.1.bias",
    "norm_out.linear_1.weight": "final_layer.adaLN_modulation.1.weight",
    "norm_out.linear_1.bias": "final_layer.adaLN_modulation.1.bias",
    "norm_out.linear_2.weight": "final_layer.linear.weight",
    "norm_out.linear_2.bias": "final_layer.linear.bias",
    "all_x_embedder.2-1.weight": "x_embedder.weight",
    "all_x_embedder.2-1.bias": "x_embedder.bias",
}


def diffusers_layout(keys) -> bool:
    """Whether a bare diffusion-model file is in one of diffusers' NextDiT layouts."""
    keys = set(keys)
    return LUMINA2_DIFFUSERS_KEY in keys or Z_IMAGE_DIFFUSERS_KEY in keys


def _rename(key: str) -> str | tuple[str, int] | None:
    """ComfyUI's name of a diffusers key, or (qkv name, part) for a q/k/v weight."""
    if key in _TOP_NAMES:
        return _TOP_NAMES[key]
    if key.startswith("all_final_layer.2-1."):
        return "final_layer." + key[len("all_final_layer.2-1."):]
    m = _BLOCK.match(key)
    if m is None:
        return key  # t_embedder.*, cap_embedder.*, x_pad_token, cap_pad_token: the same
    block, index, rest = m.groups()
    for i, part in enumerate(_QKV):
        if rest in (f"attn.{part}.weight", f"attention.{part}.weight"):
            return f"{block}.{index}.attention.qkv.weight", i
    return f"{block}.{index}.{_BLOCK_NAMES.get(rest, rest)}"


def _convert(items: Mapping[str, Any], fuse: Callable[[list], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    parts: dict[str, list] = {}
    for key, value in items.items():
        new = _rename(key)
        if isinstance(new, tuple):
            parts.setdefault(new[0], [None] * 3)[new[1]] = value
        else:
            out[new] = value
    for key, (q, k, v) in parts.items():
        if q is None or k is None or v is None:
            raise ValueError(f"diffusers NextDiT weights: {key} lacks one of to_q / to_k / to_v")
        out[key] = fuse([q, k, v])
    return out


def to_comfy(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers Lumina 2 / Z-Image state dict in ComfyUI's keys (q, k, v fused)."""
    return _convert(sd, lambda qkv: torch.cat(qkv, dim=0))


def to_comfy_shapes(info: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The same conversion on a header: key -> shape (a fused qkv's rows add up)."""
    shapes = {k: tuple(getattr(v, "shape", v)) for k, v in info.items()}
    return _convert(shapes, lambda qkv: (sum(s[0] for s in qkv), *qkv[0][1:]))
