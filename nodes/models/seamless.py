"""Seamless tiling (ComfyUI's comfy_extras/nodes_seamless_tiling.py): images whose opposite edges
continue each other, so they tile.

ComfyUI does not pad the convolutions circularly; it works on whole model calls:

* the model patch (``SeamlessTiling``, a UNet call wrapper): the UNet is evaluated on the input
  as it is and cyclically shifted by half its size along each tiled axis (2 calls for one axis, 4
  for both), each output is shifted back, and the outputs are blended per pixel: near an edge
  (within ``context`` latent px) the shifted evaluations, which see the wrapped-around neighbours
  in their middle, take over. The blend weights sum to 1 at every pixel, so blending the UNet's
  raw outputs equals ComfyUI's blending of the denoised predictions (c_in / c_out are per pixel).
* the decode (``decode_periodic``): the latent is padded periodically by ``context`` latent px on
  each tiled side, decoded, and the image cropped back to the latent's own area.

"x", "y", "x and y" name the tiled axes (``TILING_MODES``); x is the width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TILING_MODES", "padding", "periodic_pad", "seam_blend", "SeamlessTiling", "decode_periodic",
           "unet_wrappers"]

TILING_MODES = ("x", "y", "x and y")


def padding(mode: str, context: int) -> tuple[int, int]:
    """(pad_y, pad_x) in latent px for a tiling mode: ``context`` on each tiled axis, else 0."""
    if mode not in TILING_MODES:
        raise ValueError(f"tiling {mode!r}: expected one of {', '.join(TILING_MODES)}")
    return (context if mode != "x" else 0, context if mode != "y" else 0)


def periodic_pad(x: Tensor, pad_y: int, pad_x: int) -> Tensor:
    """[..., H, W] -> [..., H + 2·pad_y, W + 2·pad_x], wrapping around (index i maps to i mod
    size, so a pad larger than the side repeats the image)."""
    if pad_y:
        rows = torch.arange(-pad_y, x.shape[-2] + pad_y, device=x.device) % x.shape[-2]
        x = x.index_select(-2, rows)
    if pad_x:
        cols = torch.arange(-pad_x, x.shape[-1] + pad_x, device=x.device) % x.shape[-1]
        x = x.index_select(-1, cols)
    return x


def seam_blend(length: int, width: int, like: Tensor) -> Tensor:
    """[length] weight of the half-shifted evaluation: 1 at both edges, falling linearly to 0 at
    ``width`` px from the nearer edge: 1 − min(min(i, length−1−i)/width, 1)."""
    i = torch.arange(length, device=like.device, dtype=like.dtype)
    return 1.0 - (torch.minimum(i, length - 1 - i) / width).clamp(max=1)


@dataclass(frozen=True)
class SeamlessTiling:
    """A UNet call wrapper (``wrap_unet``; ``UNetRunner.unet`` applies it around the whole call,
    other patches included). ``blend_y`` / ``blend_x``: the seam width in latent px on that axis,
    0 = not tiled."""

    blend_y: int
    blend_x: int

    def wrap_unet(self, call: Callable[[Tensor], Tensor], x: Tensor, control) -> Tensor:
        """``call(x') -> output`` runs the UNet on an input like ``x`` [B, C(+concat), H, W]; the
        inpaint / pix2pix concat channels are part of ``x`` and shift with it."""
        if control is not None:
            raise ValueError("Seamless Tiling cannot be used with ControlNet because its feature maps "
                             "cannot be shifted with the latent.")
        h, w = x.shape[-2:]
        shifts_y = (0, h // 2) if self.blend_y else (0,)
        shifts_x = (0, w // 2) if self.blend_x else (0,)
        by = seam_blend(h, self.blend_y, x) if self.blend_y else torch.zeros(h, dtype=x.dtype, device=x.device)
        bx = seam_blend(w, self.blend_x, x) if self.blend_x else torch.zeros(w, dtype=x.dtype, device=x.device)
        result = None
        for sy in shifts_y:
            wy = by if sy else 1.0 - by
            for sx in shifts_x:
                wx = bx if sx else 1.0 - bx
                out = call(torch.roll(x, (sy, sx), dims=(-2, -1)))
                out = torch.roll(out, (-sy, -sx), dims=(-2, -1))
                weight = (wy[:, None] * wx[None, :]).to(out.dtype)  # [H, W]
                result = out * weight if result is None else result + out * weight
        return result


def unet_wrappers(patches: tuple) -> tuple[tuple, tuple]:
    """(call wrappers, the other patches) of a UNet call's patches."""
    wraps = tuple(p for p in patches if hasattr(p, "wrap_unet"))
    return wraps, tuple(p for p in patches if not hasattr(p, "wrap_unet"))


def decode_periodic(decode: Callable[[Tensor], Tensor], latent: Tensor, mode: str, context: int) -> Tensor:
    """IMAGE [B, H·s, W·s, C] of ``latent`` [B, C, H, W] decoded with ``context`` latent px of
    periodic padding on each tiled side (``decode``: latent -> IMAGE), cropped back to the
    latent's area (offsets rounded from the measured scale, as ComfyUI)."""
    height, width = latent.shape[-2:]
    pad_y, pad_x = padding(mode, context)
    padded = periodic_pad(latent, pad_y, pad_x)
    images = decode(padded)  # [B, H', W', C]
    scale_y = images.shape[-3] / padded.shape[-2]
    scale_x = images.shape[-2] / padded.shape[-1]
    top, left = round(pad_y * scale_y), round(pad_x * scale_x)
    return images[..., top:top + round(height * scale_y), left:left + round(width * scale_x), :]
