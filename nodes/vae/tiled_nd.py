"""Tiling over any number of dimensions (time, height, width) for the video VAEs: ComfyUI's
``tiled_scale_multidim`` semantics, written for mixgraph.

Each dimension d has a tile size and an overlap (input units), ``size[d]`` (input length -> output
length) and ``pos[d]`` (input offset -> output offset): a video decoder maps ``t`` latent frames to
``4t - 3`` pixel frames placed at ``4·offset``. Tiles start every ``tile - overlap`` (the last one
clipped to the end); each output tile is weighted by a linear ramp ``(i+1)/feather`` over its
``feather = round(size(overlap))`` outermost entries on both sides of every dimension, and
overlapping outputs are averaged with those weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["tiled_nd"]


def tiled_nd(x: Tensor, fn: Callable[[Tensor], Tensor], tile: Sequence[int], overlap: Sequence[int],
             size: Sequence[Callable[[int], float]], pos: Sequence[Callable[[int], float]],
             out_channels: int) -> Tensor:
    """``fn`` over tiles of ``x`` [B, C, *dims] -> float32 [B, out_channels, *round(size(dims))]."""
    dims = x.shape[2:]
    n = len(dims)
    out_dims = [round(size[d](dims[d])) for d in range(n)]
    result = torch.empty([x.shape[0], out_channels, *out_dims], dtype=torch.float32)
    for b in range(x.shape[0]):
        xb = x[b:b + 1]
        if all(dims[d] <= tile[d] for d in range(n)):
            result[b:b + 1] = fn(xb).float().to(result.device)
            continue
        acc = torch.zeros([1, out_channels, *out_dims])
        weight = torch.zeros([1, 1, *out_dims])
        starts = [range(0, dims[d] - overlap[d], tile[d] - overlap[d]) if dims[d] > tile[d] else [0]
                  for d in range(n)]
        for corner in itertools.product(*starts):
            part, offsets = xb, []
            for d in range(n):
                p = max(0, min(dims[d] - overlap[d], corner[d]))
                part = part.narrow(d + 2, p, min(tile[d], dims[d] - p))
                offsets.append(round(pos[d](p)))
            out = fn(part).float().to(acc.device)
            mask = torch.ones([1, 1, *out.shape[2:]])
            for d in range(n):
                feather = round(size[d](overlap[d]))
                length = mask.shape[d + 2]
                if feather >= length:
                    continue
                for i in range(feather):
                    a = (i + 1) / feather
                    mask.narrow(d + 2, i, 1).mul_(a)
                    mask.narrow(d + 2, length - 1 - i, 1).mul_(a)
            a_view, w_view = acc, weight
            for d in range(n):
                a_view = a_view.narrow(d + 2, offsets[d], out.shape[d + 2])
                w_view = w_view.narrow(d + 2, offsets[d], out.shape[d + 2])
            a_view.add_(out * mask)
            w_view.add_(mask)
        result[b:b + 1] = acc / weight
    return result
