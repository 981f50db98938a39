"""diffusers' ``SD3Transformer2DModel`` layout -> the MMDiT layout (``mmdit.py``).

Not a plain renaming: diffusers keeps q, k and v as three Linears (``attn.to_q`` / ``add_q_proj``
/ ``attn2.to_q`` ...) where the MMDiT has one ``qkv``, and its ``AdaLayerNormContinuous`` layers
(``norm_out``, the last block's ``norm1_context``) emit (scale, shift) where the MMDiT's emit
(shift, scale). So ``rename`` maps each stored key to its MMDiT key with a part tag
(``...qkv.weight@q``, ``...@swap``) and ``fuse`` joins the tagged parts: q, k, v concatenated
along the output dim, swapped halves exchanged. The names follow ComfyUI's ``MMDIT_MAP_*``
tables (``comfy/utils.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from mixgraph.nodes.families.base import LoraTarget

__all__ = ["is_diffusers_sd3", "diffusers_rename", "fuse", "converted_shapes", "lora_targets", "LAYOUT"]

LAYOUT = "diffusers_sd3"  # the WeightSource layout name of these files
MARKER = "transformer_blocks.0.attn.add_q_proj.weight"

_BASIC = {
    "context_embedder": "context_embedder",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
    "pos_embed.proj": "x_embedder.proj",
    "proj_out": "final_layer.linear",
}
_BLOCK = {
    "norm1_context.linear": "context_block.adaLN_modulation.1",
    "attn.to_add_out": "context_block.attn.proj",
    "ff_context.net.0.proj": "context_block.mlp.fc1",
    "ff_context.net.2": "context_block.mlp.fc2",
    "attn.norm_added_q": "context_block.attn.ln_q",
    "attn.norm_added_k": "context_block.attn.ln_k",
    "norm1.linear": "x_block.adaLN_modulation.1",
    "attn.to_out.0": "x_block.attn.proj",
    "attn.norm_q": "x_block.attn.ln_q",
    "attn.norm_k": "x_block.attn.ln_k",
    "attn2.to_out.0": "x_block.attn2.proj",
    "attn2.norm_q": "x_block.attn2.ln_q",
    "attn2.norm_k": "x_block.attn2.ln_k",
    "ff.net.0.proj": "x_block.mlp.fc1",
    "ff.net.2": "x_block.mlp.fc2",
    # q / k / v parts of the fused projections
    "attn.to_q": "x_block.attn.qkv@q", "attn.to_k": "x_block.attn.qkv@k", "attn.to_v": "x_block.attn.qkv@v",
    "attn.add_q_proj": "context_block.attn.qkv@q", "attn.add_k_proj": "context_block.attn.qkv@k",
    "attn.add_v_proj": "context_block.attn.qkv@v",
    "attn2.to_q": "x_block.attn2.qkv@q", "attn2.to_k": "x_block.attn2.qkv@k", "attn2.to_v": "x_block.attn2.qkv@v",
}
_BLOCK_KEY = re.compile(r"transformer_blocks\.(\d+)\.(.+)\.(weight|bias)$")
_PARTS = ("q", "k", "v")


def is_diffusers_sd3(keys: Iterable[str]) -> bool:
    keys = set(keys)
    return MARKER in keys and "pos_embed.proj.weight" in keys


def diffusers_rename(keys: Iterable[str]) -> Callable[[str], str | None]:
    """stored key -> MMDiT key with an optional part tag (``@q`` / ``@k`` / ``@v`` / ``@swap``),
    None for a key the MMDiT has no place for. The last block (its ``norm1_context`` emits
    (scale, shift)) is read from ``keys``."""
    blocks = [int(m.group(1)) for k in keys if (m := _BLOCK_KEY.match(k))]
    last = max(blocks) if blocks else -1

    def rename(key: str) -> str | None:
        if key == "pos_embed.pos_embed":
            return "pos_embed"
        if key.startswith("norm_out.linear."):
            return "final_layer.adaLN_modulation.1." + key.rsplit(".", 1)[1] + "@swap"
        m = _BLOCK_KEY.match(key)
        if m is not None:
            index, name, end = int(m.group(1)), m.group(2), m.group(3)
            ours = _BLOCK.get(name)
            if ours is None:
                return None
            base, _, part = ours.partition("@")
            if name == "norm1_context.linear" and index == last:
                part = "swap"
            return f"joint_blocks.{index}.{base}.{end}" + (f"@{part}" if part else "")
        stem, _, end = key.rpartition(".")
        ours = _BASIC.get(stem)
        return None if ours is None else f"{ours}.{end}"

    return rename


def fuse(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Join the tagged parts of a renamed state dict: q, k, v -> qkv (concatenated along the
    output dim), ``@swap`` -> its two halves exchanged ((scale, shift) -> (shift, scale))."""
    out: dict[str, Tensor] = {}
    parts: dict[str, dict[str, Tensor]] = {}
    for key, t in sd.items():
        base, _, tag = key.partition("@")
        if not tag:
            out[key] = t
        elif tag == "swap":
            scale, shift = t.chunk(2, dim=0)
            out[base] = torch.cat([shift, scale], dim=0)
        else:
            parts.setdefault(base, {})[tag] = t
    for base, got in parts.items():
        missing = [p for p in _PARTS if p not in got]
        if missing:
            raise ValueError(f"diffusers SD3 weights: {base} lacks its {', '.join(missing)} projection")
        out[base] = torch.cat([got[p] for p in _PARTS], dim=0)
    return out


def converted_shapes(info: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The MMDiT keys and shapes of a diffusers-layout header (key -> TensorInfo or shape), for
    detection: fused q/k/v rows add up, swapped halves keep their shape; other keys (not the
    transformer's) stay as they are."""
    rename = diffusers_rename(info)
    out: dict[str, tuple[int, ...]] = {}
    for key, entry in info.items():
        shape = tuple(getattr(entry, "shape", entry))
        new = rename(key)
        if new is None:
            if not key.startswith(("transformer_blocks.", "pos_embed.", "time_text_embed.", "norm_out.",
                                   "proj_out.", "context_embedder.")):
                out[key] = shape
            continue
        base, _, tag = new.partition("@")
        if tag in _PARTS and base in out:
            out[base] = (out[base][0] + shape[0],) + shape[1:]
        else:
            out[base] = shape
    return out


def lora_targets(config) -> dict[str, LoraTarget]:
    """diffusers / PEFT LoRA module names of an MMDiT of ``config`` (``mmdit.MMDiTConfig``) ->
    the MMDiT weight each adapts (ComfyUI ``utils.mmdit_to_diffusers`` + ``lora.model_lora_keys_unet``):
    q, k, v onto their third of a fused ``qkv`` (the hidden width each), ``norm_out.linear`` and
    the last block's ``norm1_context.linear`` with their halves swapped. Names of layers a
    model lacks (the last block's context projections, SD3.5's ``attn2`` elsewhere) are left for
    the mapper to drop."""
    hidden, last = config.hidden, config.depth - 1
    out: dict[str, LoraTarget] = {}
    for stem, ours in _BASIC.items():
        out[stem] = LoraTarget(f"{ours}.weight")
    out["norm_out.linear"] = LoraTarget("final_layer.adaLN_modulation.1.weight", swap_halves=True)
    for i in range(config.depth):
        for name, ours in _BLOCK.items():
            if ".norm_" in name:  # RMS norm scales, no Linear
                continue
            base, _, part = ours.partition("@")
            key = f"joint_blocks.{i}.{base}.weight"
            if part in _PARTS:
                out[f"transformer_blocks.{i}.{name}"] = LoraTarget(key, (_PARTS.index(part) * hidden, hidden))
            else:
                swap = name == "norm1_context.linear" and i == last
                out[f"transformer_blocks.{i}.{name}"] = LoraTarget(key, swap_halves=swap)
    return out
