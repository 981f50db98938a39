"""LATENT: the latent batch a sampler denoises and a VAE decodes.

Float32 on the CPU and immutable by convention: a consumer never modifies it in place; it derives
a new one with ``dataclasses.replace``. This is ComfyUI's untyped ``{"samples": ...}`` dict,
given named fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Latent"]


@dataclass(frozen=True)
class Latent:
    """LATENT socket.

    samples:     [B, C, H, W] float32, **unscaled** VAE latent (ComfyUI's process_in is applied by
                 the sampler, not stored here).
    noise_mask:  [B or 1, 1, H', W'] float32 in 0..1, or None. 1 = resample, 0 = keep the input
                 latent. Any spatial size; the sampler resizes it (bilinear) to [H, W].
    batch_index: which images of a bigger batch these are (ComfyUI's "batch_index"), so the
                 initial noise of image k equals slice k of the batched draw.
    """

    samples: torch.Tensor
    noise_mask: torch.Tensor | None = None
    batch_index: tuple[int, ...] | None = None
