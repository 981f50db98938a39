"""2 x 2 latent patches as tokens, the way the MMDiT families (Flux.1, Chroma, Qwen-Image) cut a
latent: channel-major within a token, rows first; odd sizes padded circularly first (ComfyUI's
``pad_to_patch_size``) and cropped off again."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["PATCH", "token_grid", "patchify", "unpatchify"]

PATCH = 2


def token_grid(h: int, w: int) -> tuple[int, int]:
    """Token rows and columns of an h x w latent (odd sizes padded by one)."""
    return -(-h // PATCH), -(-w // PATCH)


def patchify(x: Tensor) -> Tensor:
    """[B, C, H, W] -> [B, (H/2)·(W/2), C·2·2]."""
    pad_h, pad_w = (-x.shape[-2]) % PATCH, (-x.shape[-1]) % PATCH
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h), mode="circular")
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)  # [B, C, h, p, w, p]
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpatchify(tokens: Tensor, h: int, w: int) -> Tensor:
    """[B, h_len·w_len, C·2·2] -> [B, C, h, w] (cropping any padding)."""
    h_len, w_len = token_grid(h, w)
    b, _, d = tokens.shape
    c = d // (PATCH * PATCH)
    x = tokens.reshape(b, h_len, w_len, c, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)  # [B, C, h, p, w, p]
    return x.reshape(b, c, h_len * PATCH, w_len * PATCH)[:, :, :h, :w]
