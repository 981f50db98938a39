"""Attention masks of joint text + image DiTs (Flux, Chroma): ComfyUI's ``upscale_dit_mask``.

A cond's ``attention_mask`` (ComfyUI's key; ``StyleModelApply`` with "attn_bias" writes one,
``adapters/style_model.py: extend_attention_bias``) is an additive bias [B, T + h·w, T + h·w] over
the sequence the model attends over, text tokens first, then an h × w grid of image tokens, with
(h, w) = ``attention_mask_img_shape`` ((1, 1) for StyleModelApply: one stand-in image token). The
model's image grid is larger; each image axis of the mask is stretched bilinearly to it (ComfyUI
``comfy.utils.upscale_dit_mask``, called by ``model_base.Flux.extra_conds`` with the grid
(ceil(H / patch), ceil(W / patch)) of the latent), so every real image token gets the stand-in's
row and column.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["upscale_dit_mask"]


def upscale_dit_mask(mask: Tensor, size_in: tuple[int, int], size_out: tuple[int, int]) -> Tensor:
    """mask [B, T + hi·wi, T + hi·wi] (or without B) -> [B, T + ho·wo, T + ho·wo]: the image rows
    and columns resized bilinearly (align_corners False) from (hi, wi) to (ho, wo); the text block
    is kept. Unchanged when the sizes are equal."""
    (hi, wi), (ho, wo) = size_in, size_out
    if (hi, wi) == (ho, wo):
        return mask
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    if mask.ndim != 3 or mask.shape[1] != mask.shape[2] or mask.shape[1] < hi * wi:
        raise ValueError(f"attention mask {list(mask.shape)}: expected [B, T + {hi}*{wi}, T + {hi}*{wi}] "
                         f"(queries x keys, text first)")
    b, t = mask.shape[0], mask.shape[1] - hi * wi

    def grow(x: Tensor) -> Tensor:  # [B, C, hi*wi] -> [B, C, ho*wo]
        img = x.reshape(b, x.shape[1], hi, wi)  # [B, C, hi*wi] -> [B, C, hi, wi]
        return F.interpolate(img, size=(ho, wo), mode="bilinear").reshape(b, x.shape[1], ho * wo)

    txt_txt, txt_img = mask[:, :t, :t], mask[:, :t, t:]
    img_txt, img_img = mask[:, t:, :t], mask[:, t:, t:]
    txt_img = grow(txt_img)  # keys stretched: [B, T, ho*wo]
    img_txt = grow(img_txt.transpose(1, 2)).transpose(1, 2)  # queries stretched: [B, ho*wo, T]
    img_img = grow(img_img)  # keys: [B, hi*wi, ho*wo]
    img_img = grow(img_img.transpose(1, 2)).transpose(1, 2)  # then queries: [B, ho*wo, ho*wo]
    top = torch.cat([txt_txt, txt_img], dim=2)  # [B, T, T + ho*wo]
    bottom = torch.cat([img_txt, img_img], dim=2)  # [B, ho*wo, T + ho*wo]
    return torch.cat([top, bottom], dim=1)
