"""Batching any number of IMAGEs, MASKs or LATENTs (ComfyUI 0.38.1 nodes_post_processing.py:
BatchImagesNode, BatchMasksNode, BatchLatentsNode).

Every entry is fitted to the first one: images get the widest channel count (a missing alpha
padded with 1) and the first image's size, masks and latents the first one's size, all by
bilinear resize with a centre crop (ComfyUI's common_upscale); then they are concatenated in order.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.nn.functional as F

from mixgraph.nodes.helpers.latent_ops import reshape_to
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.payloads.latent import Latent


def batch_images(images: Sequence[torch.Tensor]) -> torch.Tensor | None:
    if not images:
        return None
    channels = max(i.shape[-1] for i in images)
    # ComfyUI pads one channel (RGB -> RGBA); IMAGE has 3 or 4 channels, so one is all it takes
    padded = [F.pad(i, (0, 1), value=1.0) if i.shape[-1] < channels else i for i in images]
    first = padded[0].shape   # [B,H,W,C]
    fitted = [i if i.shape[1:] == first[1:] else
              upscale(i.movedim(-1, 1), first[2], first[1], "bilinear", "center").movedim(1, -1)
              for i in padded]
    return torch.cat(fitted, dim=0)


def batch_masks(masks: Sequence[torch.Tensor]) -> torch.Tensor | None:
    if not masks:
        return None
    first = masks[0].shape   # [B,H,W]
    fitted = [m if m.shape[1:] == first[1:] else
              upscale(m.unsqueeze(1), first[2], first[1], "bilinear", "center").squeeze(1)
              for m in masks]
    return torch.cat(fitted, dim=0)


def batch_latents(latents: Sequence[Latent]) -> Latent | None:
    """The first latent's fields (noise mask kept), samples concatenated; batch indices of each
    entry (its own 0..n-1 when it has none) concatenated."""
    if not latents:
        return None
    shape = latents[0].samples.shape
    samples = [reshape_to(shape, x.samples, repeat=False) for x in latents]
    index: list[int] = []
    for x in latents:
        index += x.batch_index if x.batch_index is not None else range(x.samples.shape[0])
    return dataclasses.replace(latents[0], samples=torch.cat(samples, dim=0),
                               batch_index=tuple(index))
