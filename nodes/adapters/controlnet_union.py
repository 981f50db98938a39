"""The union parts of a ControlNet++ "union" ControlNet (xinsir controlnet-union-sdxl-1.0 and its
ProMax version; Qi Xin et al., "ControlNet++: All-in-one ControlNet", github xinsir6/ControlNetPlus):
one SDXL ControlNet that takes a control *type* besides the hint image.

Facts from ComfyUI ``comfy/cldm/cldm.py`` (comfyanonymous/ComfyUI 7914c47: ``ControlNet`` with
``union_controlnet_num_control_type``, ``ResBlockUnionControlnet``, ``union_controlnet_merge``),
``comfy/controlnet.py`` (the diffusers branch of ``load_controlnet_state_dict``: a file with
``control_add_embedding.linear_1.bias`` is a union net with ``task_embedding.shape[0]`` types) and
``comfy/cldm/control_types.py`` (Comfy-Org/ComfyUI ee71d5c, the 8 type names and indices):

- ``task_embedding`` [N, W]: one learned vector per control type (W = 320 in SDXL, the width of the
  hint features, i.e. the UNet's model_channels).
- ``control_add_embedding`` (``linear_1`` [T, N·256], ``linear_2`` [T, T]): a one-hot of the
  chosen type over the N types, each of the N numbers sinusoid-embedded 256 wide (``[cos, sin]``,
  as the timestep embedding), flattened, then linear_1 → SiLU → linear_2; the result is added to
  the time embedding of every sample. "auto" (no type) is the all-zero vector, still embedded.
- ``transformer_layes.N`` (sic): CLIP-style residual attention blocks over the condition tokens
  (``attn.in_proj_weight`` [3W, W] with q, k, v stacked, ``attn.out_proj``, ``ln_1``,
  ``mlp.c_fc`` / QuickGELU / ``mlp.c_proj``, ``ln_2``); 8 heads (ComfyUI's fixed value).
- ``spatial_ch_projs`` [W, W]: a linear map of the transformed token to a per-channel offset.

With a type t set (SetUnionControlNetType), the hint features f = input_hint_block(hint) [B, W, h, w]
are pooled to one token m = mean_hw(f) + task_embedding[t], the token goes through the
transformer, and the hint added after the first input block is f + spatial_ch_projs(token)[..., None,
None]. With "auto" the hint is the plain f. ComfyUI takes one hint image per net (the first of its
list), so one type at a time.

The keys are stored as in the file (ComfyUI renames ``attn.in_proj_`` to ``attn.in_proj.``; here
the attention keeps ``nn.MultiheadAttention``'s parameter names, so the file's keys fit as is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import ResidualAttentionBlock
from mixgraph.nodes.families.sd.unet import timestep_embedding

__all__ = ["UNION_CONTROLNET_TYPES", "UNION_KEY_PREFIXES", "UnionConfig", "UnionBlock", "ControlAddEmbedding",
           "union_config_from_shapes", "is_union_state_dict", "check_control_type"]

#: ComfyUI ``UNION_CONTROLNET_TYPES``: name -> index into task_embedding (the node adds "auto": no type)
UNION_CONTROLNET_TYPES: dict[str, int] = {
    "openpose": 0,
    "depth": 1,
    "hed/pidi/scribble/ted": 2,
    "canny/lineart/anime_lineart/mlsd": 3,
    "normal": 4,
    "segment": 5,
    "tile": 6,
    "repaint": 7,
}

UNION_KEY_PREFIXES = ("task_embedding", "control_add_embedding.", "transformer_layes.", "spatial_ch_projs.")
HEADS = 8  # ComfyUI's num_trans_head (not stored in the file)


@dataclass(frozen=True)
class UnionConfig:
    """num_types: rows of task_embedding; width: its columns (= the hint features' channels);
    layers: transformer blocks; type_embed_dim: the per-type sinusoid width (256)."""

    num_types: int
    width: int
    layers: int = 1
    type_embed_dim: int = 256
    heads: int = HEADS


def is_union_state_dict(keys) -> bool:
    """ComfyUI's marker (``control_add_embedding.linear_1.bias``), or a task embedding."""
    return any(k == "task_embedding" or k.startswith("control_add_embedding.") for k in keys)


def union_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> UnionConfig | None:
    """The union part's sizes from (unprefixed) key shapes; None for a plain ControlNet."""
    if not is_union_state_dict(shapes):
        return None
    need = ("task_embedding", "control_add_embedding.linear_1.weight", "spatial_ch_projs.weight")
    missing = [k for k in need if k not in shapes]
    if missing:
        raise ValueError(f"union ControlNet: keys {missing} missing")
    num, width = shapes["task_embedding"]
    layers = 0
    while f"transformer_layes.{layers}.attn.in_proj_weight" in shapes:
        layers += 1
    in_features = shapes["control_add_embedding.linear_1.weight"][1]
    if in_features % num:
        raise ValueError(f"union ControlNet: control_add_embedding.linear_1 takes {in_features} inputs, "
                         f"not a multiple of the {num} control types")
    if tuple(shapes["spatial_ch_projs.weight"]) != (width, width):
        raise ValueError(f"union ControlNet: spatial_ch_projs is {shapes['spatial_ch_projs.weight']}, "
                         f"expected [{width}, {width}]")
    return UnionConfig(num_types=int(num), width=int(width), layers=layers, type_embed_dim=int(in_features // num),
                       heads=HEADS if width % HEADS == 0 else 1)


def check_control_type(control_type: Sequence[int], num_types: int) -> None:
    """A control-type list as SetUnionControlNetType sets it: empty ("auto") or one index < num_types."""
    if len(control_type) > 1:
        raise ValueError(f"union ControlNet: one control type at a time, got {list(control_type)}")
    for t in control_type:
        if not 0 <= t < num_types:
            names = {v: k for k, v in UNION_CONTROLNET_TYPES.items()}
            raise ValueError(f"union ControlNet: control type {names.get(t, t)!r} (index {t}) is not one "
                             f"of this net's {num_types} types (indices 0..{num_types - 1})")


#: Pre-norm residual block: x + attn(ln_1 x), then + mlp(ln_2 x) (c_fc 4W, QuickGELU, c_proj), with
#: the stacked in_proj attention: the style adapter's block layout, so the same module
UnionBlock = ResidualAttentionBlock


class ControlAddEmbedding(nn.Module):
    """The control type's addition to the time embedding: [1, time_embed_dim]."""

    def __init__(self, num_types: int, type_embed_dim: int, time_embed_dim: int):
        super().__init__()
        self.num_types, self.type_embed_dim = num_types, type_embed_dim
        self.linear_1 = nn.Linear(num_types * type_embed_dim, time_embed_dim)
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, control_type: Sequence[int], device: torch.device) -> Tensor:
        one_hot = torch.zeros(self.num_types, device=device)
        for t in control_type:
            one_hot[t] = 1.0
        e = timestep_embedding(one_hot, self.type_embed_dim).reshape(1, -1)  # [1, N·256]
        return self.linear_2(F.silu(self.linear_1(e)))
