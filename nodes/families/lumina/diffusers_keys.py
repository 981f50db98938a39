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

from mixgraph.nodes.families.base import LoraTarget

__all__ = ["LUMINA2_DIFFUSERS_KEY", "Z_IMAGE_DIFFUSERS_KEY", "diffusers_layout", "to_comfy", "to_comfy_shapes",
           "lora_targets"]

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


# the model's own Linear names, which diffusers' Z-Image layout shares (LoRAs name them bare or
# with ``transformer.``, which the model's own ``diffusion_model.`` naming does not cover)
_OWN_BLOCK = ("attention.out", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
              "adaLN_modulation.0", "adaLN_modulation.1")
_OWN_TOP = ("x_embedder", "t_embedder.mlp.0", "t_embedder.mlp.2", "cap_embedder.1", "final_layer.linear",
            "final_layer.adaLN_modulation.1")


def lora_targets(config) -> dict[str, LoraTarget]:
    """diffusers / PEFT / ai-toolkit LoRA module names of a Lumina 2 / Z-Image NextDiT of
    ``config`` (``nextdit.NextDiTConfig``) -> the weight each adapts (ComfyUI
    ``utils.z_image_to_diffusers`` + ``lora.model_lora_keys_unet``): ``attention.to_q`` /
    ``to_k`` / ``to_v`` (Lumina 2: ``attn.``) onto their rows of the fused ``attention.qkv``
    (the query heads, then the key heads, then the value heads: with fewer key / value heads, as
    Lumina 2 has, their slices are narrower; ComfyUI assumes three equal thirds), the renamed
    layers onto theirs, the shared names onto themselves. Names of layers a model lacks are left
    for the mapper to drop."""
    q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
    rows = ((0, q), (q, kv), (q + kv, kv))
    out: dict[str, LoraTarget] = {}
    for stem in _OWN_TOP:
        out[stem] = LoraTarget(f"{stem}.weight")
    for key, ours in _TOP_NAMES.items():
        if key.endswith(".weight"):
            out[key[: -len(".weight")]] = LoraTarget(ours)
    for stem in ("linear", "adaLN_modulation.1"):
        out[f"all_final_layer.2-1.{stem}"] = LoraTarget(f"final_layer.{stem}.weight")
    for block, n in (("layers", config.depth), ("noise_refiner", config.refiner_depth),
                     ("context_refiner", config.refiner_depth)):
        for i in range(n):
            p = f"{block}.{i}."
            for stem in _OWN_BLOCK:
                out[p + stem] = LoraTarget(f"{p}{stem}.weight")
            for name, ours in _BLOCK_NAMES.items():
                if name.endswith(".weight"):
                    out[p + name[: -len(".weight")]] = LoraTarget(p + ours)
            for att in ("attn", "attention"):
                for part, span in zip(_QKV, rows):
                    out[f"{p}{att}.{part}"] = LoraTarget(f"{p}attention.qkv.weight", span)
    return out
