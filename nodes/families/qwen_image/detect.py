"""Which diffusion models are Qwen-Image's, and their config, from tensor names and shapes only.

ComfyUI (``model_detection.py``) recognises the model by ``txt_norm.weight`` and reads only the
input width and the block count, taking the rest from its defaults (3072 wide, 24 heads of 128,
3584-wide text). Here every size comes from a shape, so tiny models load too: the width from
``img_in``, the head width from the per-head q norm, the text width from ``txt_in``, the MLP width
from ``img_mlp``. What no shape shows is the RoPE split of the head: the released model's
16 / 56 / 56 of 128 (an eighth for the frame axis, the rest halved), kept in proportion for other
head widths.

ComfyUI's files and diffusers' ``transformer/`` folders share these key names (bare, or under
ComfyUI's ``model.diffusion_model.``, which the loaders strip), so no key layout is registered.
Qwen-Image-Edit-2511 files repackaged by Comfy-Org carry an empty ``__index_timestep_zero__``
tensor: their reference latents default to the "index_timestep_zero" method (ComfyUI's
``default_ref_method``). Qwen-Image-Layered (diffusers' ``use_additional_t_cond`` /
``use_layer3d_rope``: an ``addition_t_embedding`` table) is another model, refused by name
(``refused.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.families.qwen_image.model import PATCH, QwenImageConfig

__all__ = ["SIGNATURE", "TIMESTEP_ZERO_MARKER", "LAYERED_KEY", "is_qwen_image", "qwen_image_config", "rope_axes"]

SIGNATURE = ("txt_norm.weight", "img_in.weight", "txt_in.weight", "transformer_blocks.0.attn.add_q_proj.weight",
             "transformer_blocks.0.img_mod.1.weight", "proj_out.weight")
TIMESTEP_ZERO_MARKER = "__index_timestep_zero__"
LAYERED_KEY = "time_text_embed.addition_t_embedding.weight"


def _shape(info: Mapping[str, Any], key: str) -> tuple[int, ...]:
    return tuple(getattr(info[key], "shape", info[key]))


def _count(info: Mapping[str, Any], prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in info if k.startswith(prefix)})


def is_qwen_image(info: Mapping[str, Any]) -> bool:
    """A Qwen-Image diffusion model (t2i or Edit; not Qwen-Image-Layered)."""
    return all(k in info for k in SIGNATURE) and LAYERED_KEY not in info


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    """The (frame, row, column) RoPE channels of a head: 16 / 56 / 56 of 128."""
    frame = head_dim // 8
    rest = head_dim - frame
    if frame % 2 or rest % 4:
        raise ValueError(f"Qwen-Image: head width {head_dim} does not split into RoPE axes as 16 / 56 / 56 of 128 do "
                         f"(a multiple of 16)")
    return frame, rest // 2, rest // 2


def qwen_image_config(info: Mapping[str, Any]) -> QwenImageConfig:
    """The config of a Qwen-Image state dict (``is_qwen_image``)."""
    dim, patch_in = _shape(info, "img_in.weight")
    head_dim = _shape(info, "transformer_blocks.0.attn.norm_q.weight")[0]
    out_rows = _shape(info, "proj_out.weight")[0]
    if patch_in % (PATCH * PATCH) or out_rows % (PATCH * PATCH):
        raise ValueError(f"Qwen-Image: img_in takes {patch_in} and proj_out gives {out_rows} features, "
                         f"not 2 x 2 patches of latent channels")
    if dim % head_dim:
        raise ValueError(f"Qwen-Image: width {dim} is not a whole number of {head_dim}-wide heads")
    return QwenImageConfig(
        in_channels=patch_in // (PATCH * PATCH), out_channels=out_rows // (PATCH * PATCH), dim=dim,
        heads=dim // head_dim, depth=_count(info, "transformer_blocks."),
        context_dim=_shape(info, "txt_in.weight")[1],
        mlp_hidden=_shape(info, "transformer_blocks.0.img_mlp.net.0.proj.weight")[0],
        axes_dims=rope_axes(head_dim),
        default_ref_method="index_timestep_zero" if TIMESTEP_ZERO_MARKER in info else "index")
