"""Modulated deformable convolution (DCNv2) in plain PyTorch: ``deform_conv2d`` with the
semantics of ``torchvision.ops.deform_conv2d`` / mmcv's modulated deform conv, for modules that
need it where torchvision's compiled operator is not available.

Layout, as torchvision: ``offset`` is [B, 2 * kh * kw, Ho, Wo] with, for kernel tap k (row-major,
k = i * kw + j), channel 2k the vertical shift dy and 2k + 1 the horizontal shift dx; ``mask``
(optional) is [B, kh * kw, Ho, Wo], one factor per tap. The tap (i, j) of output pixel (ho, wo)
samples the input at y = ho * sh - ph + i * dh + dy, x = wo * sw - pw + j * dw + dx, bilinearly;
corners outside the image count as zero (so a point at or beyond one pixel outside gives 0).

Sampling is ``F.grid_sample`` (bilinear, zero padding, align_corners=False with the pixel-centre
mapping (2x + 1) / W - 1, which reproduces pixel coordinates exactly); taps are accumulated one
at a time, so memory stays at one sampled copy of the input. Only one offset group and one
weight group are supported (what BiRefNet uses); others raise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def deform_conv2d(input: Tensor, offset: Tensor, weight: Tensor, bias: Tensor | None = None,
                  stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                  dilation: int | tuple[int, int] = 1, mask: Tensor | None = None) -> Tensor:
    """Deformable 2-D convolution; see the module docstring for the offset/mask layout."""
    b, cin, h, w = input.shape
    cout, wcin, kh, kw = weight.shape
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if wcin != cin:
        raise NotImplementedError(f"deform_conv2d: grouped weights ({cin} input channels, weight "
                                  f"for {wcin}): not supported yet")
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    taps = kh * kw
    if offset.shape != (b, 2 * taps, ho, wo):
        if offset.shape[1] != 2 * taps:
            raise NotImplementedError(f"deform_conv2d: offset with {offset.shape[1]} channels for a "
                                      f"{kh}x{kw} kernel (only one offset group, {2 * taps} channels, "
                                      f"is supported)")
        raise ValueError(f"deform_conv2d: offset shape {tuple(offset.shape)}, expected "
                         f"{(b, 2 * taps, ho, wo)}")
    if mask is not None and mask.shape != (b, taps, ho, wo):
        raise ValueError(f"deform_conv2d: mask shape {tuple(mask.shape)}, expected {(b, taps, ho, wo)}")

    dtype = input.dtype
    base_y = (torch.arange(ho, device=input.device, dtype=dtype) * sh - ph).view(1, ho, 1)
    base_x = (torch.arange(wo, device=input.device, dtype=dtype) * sw - pw).view(1, 1, wo)
    out = input.new_zeros(b, cout, ho * wo)
    offset = offset.to(dtype)
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            y = base_y + i * dh + offset[:, 2 * k]
            x = base_x + j * dw + offset[:, 2 * k + 1]
            grid = torch.stack(((2 * x + 1) / w - 1, (2 * y + 1) / h - 1), dim=-1)  # [B, Ho, Wo, 2]
            sampled = F.grid_sample(input, grid, mode="bilinear", padding_mode="zeros",
                                    align_corners=False)                         # [B, Cin, Ho, Wo]
            if mask is not None:
                sampled = sampled * mask[:, k:k + 1].to(dtype)
            out = out + torch.matmul(weight[:, :, i, j].to(dtype), sampled.reshape(b, cin, ho * wo))
    out = out.view(b, cout, ho, wo)
    if bias is not None:
        out = out + bias.to(dtype).view(1, cout, 1, 1)
    return out
