"""Which NextDiT a diffusion model is, and its config, from tensor names and shapes only.

ComfyUI (``model_detection.py``) recognises the model by ``cap_embedder.1.weight`` and tells
Lumina 2 from Z-Image by its width (2304 / 3840), then fills in the rest from tables. Here every
size comes from a shape, so tiny models of either kind load too; Z-Image is told by its
modulation layout (``adaLN_modulation.0``: the timestep embedding enters without a SiLU) and
its learned pad tokens. What no shape shows is each kind's setting: the RoPE axes split the
head width as the released models do (Lumina 2: 32/32/32 of 96, a third each; Z-Image: 32/48/48
of 128, a quarter and three eighths), the RoPE base (10000 / 256) and the timestep scale (1 /
1000), as in ComfyUI's tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.families.lumina.nextdit import NextDiTConfig

__all__ = ["SIGNATURE", "is_nextdit", "is_z_image", "nextdit_config"]

SIGNATURE = ("cap_embedder.1.weight", "layers.0.attention.qkv.weight")
PAD_MULTIPLE = 32  # Z-Image's token padding (ComfyUI's pad_tokens_multiple)


def _shape(info: Mapping[str, Any], key: str) -> tuple[int, ...]:
    return tuple(getattr(info[key], "shape", info[key]))


def _count(info: Mapping[str, Any], prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in info if k.startswith(prefix)})


# NextDiT options neither family runs: Z-Image Omni's SigLIP image tokens, NewBie's pooled CLIP text
OTHER_VARIANTS = ("siglip_embedder.", "clip_text_pooled_proj.")


def is_nextdit(info: Mapping[str, Any]) -> bool:
    """A Lumina 2 / Z-Image diffusion model (not one of the ``OTHER_VARIANTS``, which
    ``refused.py`` names)."""
    return all(k in info for k in SIGNATURE) and not any(k.startswith(OTHER_VARIANTS) for k in info)


def is_z_image(info: Mapping[str, Any]) -> bool:
    return "layers.0.adaLN_modulation.0.weight" in info


def _axes(head_dim: int, z_image: bool) -> tuple[int, int, int]:
    if z_image:
        if head_dim % 8:
            raise ValueError(f"Z-Image: head width {head_dim} does not split into RoPE axes (a multiple of 8)")
        return head_dim // 4, head_dim * 3 // 8, head_dim * 3 // 8
    if head_dim % 6:
        raise ValueError(f"Lumina 2: head width {head_dim} does not split into three RoPE axes (a multiple of 6)")
    return (head_dim // 3,) * 3


def nextdit_config(info: Mapping[str, Any]) -> NextDiTConfig:
    """The config of a NextDiT state dict in ComfyUI's keys (``is_nextdit``)."""
    z_image = is_z_image(info)
    dim, cap_feat_dim = _shape(info, "cap_embedder.1.weight")
    head_dim = _shape(info, "layers.0.attention.q_norm.weight")[0]
    heads = dim // head_dim
    qkv_rows = _shape(info, "layers.0.attention.qkv.weight")[0]
    kv_heads = (qkv_rows // head_dim - heads) // 2
    t_hidden, freq_dim = _shape(info, "t_embedder.mlp.0.weight")
    patch_in = _shape(info, "x_embedder.weight")[1]
    channels = _shape(info, "final_layer.linear.weight")[0] // 4  # 2 x 2 patches
    if patch_in != channels * 4:
        raise ValueError(f"NextDiT: x_embedder takes {patch_in} features, not 2 x 2 patches of {channels} channels")
    return NextDiTConfig(
        in_channels=channels, patch=2, dim=dim, heads=heads, kv_heads=kv_heads,
        depth=_count(info, "layers."), refiner_depth=_count(info, "noise_refiner."),
        ffn_hidden=_shape(info, "layers.0.feed_forward.w1.weight")[0], cap_feat_dim=cap_feat_dim,
        t_hidden=t_hidden, t_width=_shape(info, "t_embedder.mlp.2.weight")[0], freq_dim=freq_dim,
        axes_dims=_axes(head_dim, z_image), rope_theta=256.0 if z_image else 10000.0,
        time_scale=1000.0 if z_image else 1.0, z_image_modulation=z_image,
        pad_tokens_multiple=PAD_MULTIPLE if "cap_pad_token" in info else None,
        has_norm_final="norm_final.weight" in info)
