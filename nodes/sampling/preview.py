"""Sampler step previews, as ComfyUI's ``latent_preview``: each step's x0 prediction (the
sampler's scaled latent) becomes a small RGB image the server sends as a binary frame.

Two previewers, both read from the model's latent format (``vae/latent_format.LatentFormat``, set
by its family, as ComfyUI keeps them on ``comfy/latent_formats.py``'s classes):

* **latent2rgb**: the format's linear map of the latent channels to RGB
  (``rgb = latent · latent_rgb_factors + latent_rgb_factors_bias``), then ``(rgb + 1) / 2``
  clamped to [0, 1]; the image has the latent's size (H/8 × W/8).
* **taesd**: the TAESD decoder (``vae/taesd.py``) named by the format's ``taesd_decoder_name``
  (``vae_approx/taesd_decoder`` for SD1/SD2, ``taesdxl_decoder`` for SDXL and Playground v2.5);
  full-size images, clamped to [0, 1].

A format without ``latent_rgb_factors`` gets no previews (as ComfyUI); one without a TAESD
decoder gets latent2rgb. Both previewers see the x0 in the sampler's latent space (after
``process_in``), as in ComfyUI.

Only the first image of a batch is previewed. ``method``: "none" (no previews, ComfyUI's
default), "auto" (taesd when the decoder file exists, else latent2rgb), "latent2rgb", "taesd"
(falls back to latent2rgb when the file is missing, as ComfyUI does).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Callable

import torch
from PIL import Image
from torch import Tensor

from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.vae.taesd import TAESDDecoder, load_taesd_decoder

__all__ = ["PREVIEW_METHODS", "preview_format", "latent_to_rgb", "Latent2RGBPreviewer", "TAESDPreviewer",
           "make_previewer"]

PREVIEW_METHODS = ("none", "auto", "latent2rgb", "taesd")


def preview_format(model) -> LatentFormat | None:
    """The latent format a sampler model or MODEL handle is previewed in: its ``latent_format``
    when that has preview factors, else None (no previews)."""
    fmt = getattr(model, "latent_format", None)
    return fmt if getattr(fmt, "latent_rgb_factors", None) is not None else None


def latent_to_rgb(x0: Tensor, fmt: LatentFormat) -> Tensor:
    """x0 [B, C, h, w] (scaled latent) → the first image's preview [h, w, 3] in [0, 1], by
    ``fmt``'s factors and bias; of a video latent [B, C, T, h, w], its first frame's (as ComfyUI)."""
    if fmt.latent_rgb_factors is None:
        raise ValueError(f"latent format {fmt.name or fmt} has no latent2rgb preview factors")
    factors = torch.tensor(fmt.latent_rgb_factors, dtype=torch.float32, device=x0.device)
    bias = torch.tensor(fmt.latent_rgb_factors_bias or (0.0, 0.0, 0.0), dtype=torch.float32,
                        device=x0.device)
    first = x0[0, :, 0] if x0.ndim == 5 else x0[0]     # a video latent [B, C, T, h, w]: its first frame
    latent = first.float().movedim(0, -1)              # [h, w, C]
    rgb = latent @ factors + bias                      # [h, w, 3] in about [-1, 1]
    return ((rgb + 1.0) / 2.0).clamp(0.0, 1.0)


def _to_image(rgb: Tensor, max_size: int) -> Image.Image:
    """[h, w, 3] in [0, 1] → an RGB PIL image no larger than max_size on its longest side."""
    arr = rgb.mul(255.0).round().to(torch.uint8).cpu().numpy()
    image = Image.fromarray(arr, "RGB")
    image.thumbnail((max_size, max_size))
    return image


class Latent2RGBPreviewer:
    def __init__(self, fmt: LatentFormat, max_size: int = 512):
        if fmt.latent_rgb_factors is None:
            raise ValueError(f"latent format {fmt.name or fmt} has no latent2rgb preview factors")
        self.format, self.max_size = fmt, max_size

    def __call__(self, x0: Tensor) -> Image.Image:
        return _to_image(latent_to_rgb(x0, self.format), self.max_size)


class TAESDPreviewer:
    def __init__(self, decoder: TAESDDecoder, max_size: int = 512):
        self.decoder, self.max_size = decoder, max_size

    @torch.no_grad()
    def __call__(self, x0: Tensor) -> Image.Image:
        decoder = self.decoder.to(x0.device)
        image = decoder(x0[:1].float())[0]             # [3, H, W] in about [0, 1]
        return _to_image(image.clamp(0.0, 1.0).movedim(0, -1), self.max_size)


@functools.lru_cache(maxsize=2)
def _cached_decoder(path: str, mtime_ns: int) -> TAESDDecoder:
    return load_taesd_decoder(path)


def make_previewer(method: str, fmt: LatentFormat | None, find_decoder: Callable[[str], Path | None],
                   max_size: int = 512) -> Callable[[Tensor], Image.Image] | None:
    """The previewer for ``method`` and the latent format ``fmt`` (``preview_format``), or None
    for no previews.

    ``find_decoder(name)`` gives the path of ``vae_approx/<name>.*`` or None. A format without
    factors (or None) gets no previews; one without a TAESD decoder (the x4 upscaler's) gets
    latent2rgb.
    """
    if method not in PREVIEW_METHODS:
        raise ValueError(f"unknown preview method {method!r}; one of {', '.join(PREVIEW_METHODS)}")
    if method == "none" or fmt is None or fmt.latent_rgb_factors is None:
        return None
    if method in ("auto", "taesd") and fmt.taesd_decoder_name is not None:
        path = find_decoder(fmt.taesd_decoder_name)
        if path is not None:
            decoder = _cached_decoder(os.fspath(path), os.stat(path).st_mtime_ns)
            return TAESDPreviewer(decoder, max_size)
    return Latent2RGBPreviewer(fmt, max_size)
