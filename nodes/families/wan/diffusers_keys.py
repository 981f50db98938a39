"""diffusers' key layout of the Wan DiT (``WanTransformer3DModel``, ``WanVACETransformer3DModel``:
``transformer/diffusion_pytorch_model.safetensors`` of a Wan diffusers pipeline) -> the released
files' / ComfyUI's, which ``model.WanModel``'s attribute names are.

A renaming only (no fused weights): the condition embedder's layers are the time / text / image
embeddings, ``attn1`` / ``attn2`` the self / cross attention (``to_q`` ... ``to_out.0`` = q ... o,
``add_k_proj`` / ``add_v_proj`` / ``norm_added_k`` the image keys / values / norm), diffusers'
``norm2`` Wan's cross-attention norm ``norm3``, ``scale_shift_table`` the modulation tables,
``proj_out`` the head (a VACE block's ``proj_in`` / ``proj_out``: ``before_proj`` / ``after_proj``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

__all__ = ["LAYOUT", "is_diffusers_wan", "wan_name", "diffusers_rename", "converted_shapes"]

LAYOUT = "diffusers_wan"
_MARKERS = ("condition_embedder.time_proj.weight", "scale_shift_table", "blocks.0.attn1.to_q.weight")

_TOP = {  # diffusers module -> Wan module
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "condition_embedder.image_embedder.norm2": "img_emb.proj.4",
    "proj_out": "head.head",
    "patch_embedding": "patch_embedding",
    "vace_patch_embedding": "vace_patch_embedding",
}
_TOP_PARAMS = {"scale_shift_table": "head.modulation",
               "condition_embedder.image_embedder.pos_embed": "img_emb.emb_pos"}
_BLOCK = {  # inside blocks.N / vace_blocks.N
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o", "attn1.norm_q": "self_attn.norm_q", "attn1.norm_k": "self_attn.norm_k",
    "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o", "attn2.norm_q": "cross_attn.norm_q", "attn2.norm_k": "cross_attn.norm_k",
    "attn2.add_k_proj": "cross_attn.k_img", "attn2.add_v_proj": "cross_attn.v_img",
    "attn2.norm_added_k": "cross_attn.norm_k_img",
    "norm2": "norm3", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
    "proj_in": "before_proj", "proj_out": "after_proj",
}
_BLOCK_KEY = re.compile(r"^((?:vace_)?blocks\.\d+)\.(.+)\.(weight|bias)$")


def is_diffusers_wan(keys: Collection[str]) -> bool:
    return all(k in keys for k in _MARKERS)


def wan_name(key: str) -> str | None:
    """One diffusers key in the Wan layout; None for a key the Wan model has no place for."""
    if key in _TOP_PARAMS:
        return _TOP_PARAMS[key]
    m = re.match(r"^((?:vace_)?blocks\.\d+)\.scale_shift_table$", key)
    if m:
        return f"{m.group(1)}.modulation"
    m = _BLOCK_KEY.match(key)
    if m:
        block, module, kind = m.groups()
        inner = _BLOCK.get(module)
        return None if inner is None else f"{block}.{inner}.{kind}"
    module, _, kind = key.rpartition(".")
    top = _TOP.get(module)
    return None if top is None else f"{top}.{kind}"


def diffusers_rename(keys: Iterable[str]) -> Callable[[str], str | None]:
    return wan_name


def converted_shapes(info: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers header (key -> TensorInfo / shape) in Wan names, for detection."""
    out = {}
    for k, v in info.items():
        name = wan_name(k)
        if name is not None:
            out[name] = v
    return out
