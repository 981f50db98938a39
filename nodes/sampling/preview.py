"""Sampler step previews, as ComfyUI's ``latent_preview``: each step's x0 prediction (the
sampler's scaled latent) becomes a small RGB image the server sends as a binary frame.

Two previewers:

* **latent2rgb**: a per-architecture linear map of the latent channels to RGB
  (ComfyUI ``latent_formats``: ``rgb = latent · latent_rgb_factors + latent_rgb_factors_bias``),
  then ``(rgb + 1) / 2`` clamped to [0, 1]; the image has the latent's size (H/8 × W/8).
* **taesd**: the TAESD decoder (``vae/taesd.py``) from ``vae_approx/taesd_decoder`` (SD1/SD2)
  or ``taesdxl_decoder`` (SDXL, Playground v2.5); full-size images, clamped to [0, 1].

The tables are keyed by model kind, and by latent format name for a format that replaces its
kind's own (``"sdxl_playground_2_5"``, ``vae/latent_format.py``; ``preview_key``). Both
previewers see the x0 in the sampler's latent space (after ``process_in``), as in ComfyUI.

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

from mixgraph.nodes.vae.taesd import TAESDDecoder, load_taesd_decoder

__all__ = ["PREVIEW_METHODS", "LATENT_RGB_FACTORS", "LATENT_RGB_BIAS", "TAESD_DECODER_NAMES",
           "preview_key", "latent_to_rgb", "Latent2RGBPreviewer", "TAESDPreviewer", "make_previewer"]

PREVIEW_METHODS = ("none", "auto", "latent2rgb", "taesd")

# Rows: latent channels; columns: R, G, B (ComfyUI comfy/latent_formats.py SD15, SDXL).
_SD1_FACTORS = ((0.3512, 0.2297, 0.3227),
                (0.3250, 0.4974, 0.2350),
                (-0.2829, 0.1762, 0.2721),
                (-0.2120, -0.2616, -0.7177))
_SDXL_FACTORS = ((0.3651, 0.4232, 0.4341),
                 (-0.2533, -0.0042, 0.1068),
                 (0.1076, 0.1111, -0.0362),
                 (-0.3165, -0.2492, -0.2188))
_SD_X4_FACTORS = ((-0.2340, -0.3863, -0.3257),  # ComfyUI latent_formats.SD_X4 (no bias, no TAESD)
                  (0.0994, 0.0885, -0.0908),
                  (-0.2833, -0.2349, -0.3741),
                  (0.2523, -0.0055, -0.1651))
# ComfyUI latent_formats.SDXL_Playground_2_5 (Comfy-Org/ComfyUI 75399d78): SDXL's earlier factors,
# no bias, taesdxl
_PLAYGROUND_FACTORS = ((0.3920, 0.4054, 0.4549),
                       (-0.2634, -0.0196, 0.0653),
                       (0.0568, 0.1687, -0.0755),
                       (-0.3112, -0.2359, -0.2076))
LATENT_RGB_FACTORS: dict[str, tuple[tuple[float, float, float], ...]] = {
    "sd1": _SD1_FACTORS, "sd2": _SD1_FACTORS, "sdxl": _SDXL_FACTORS, "sdxl_refiner": _SDXL_FACTORS,
    "sd2_x4": _SD_X4_FACTORS, "sdxl_playground_2_5": _PLAYGROUND_FACTORS,
}
LATENT_RGB_BIAS: dict[str, tuple[float, float, float]] = {
    "sdxl": (0.1084, -0.0175, -0.0011), "sdxl_refiner": (0.1084, -0.0175, -0.0011),
}
TAESD_DECODER_NAMES = {"sd1": "taesd_decoder", "sd2": "taesd_decoder",
                       "sdxl": "taesdxl_decoder", "sdxl_refiner": "taesdxl_decoder",
                       "sdxl_playground_2_5": "taesdxl_decoder"}


def preview_key(model) -> str | None:
    """The preview table key for a sampler model or MODEL handle: its latent format's ``name``
    when the tables know it, else its ``kind`` (None without one)."""
    name = getattr(getattr(model, "latent_format", None), "name", None)
    if name is not None and name in LATENT_RGB_FACTORS:
        return name
    return getattr(model, "kind", None)


def latent_to_rgb(x0: Tensor, kind: str) -> Tensor:
    """x0 [B, C, h, w] (scaled latent) → the first image's preview [h, w, 3] in [0, 1]."""
    factors = torch.tensor(LATENT_RGB_FACTORS[kind], dtype=torch.float32, device=x0.device)
    bias = torch.tensor(LATENT_RGB_BIAS.get(kind, (0.0, 0.0, 0.0)), dtype=torch.float32,
                        device=x0.device)
    latent = x0[0].float().movedim(0, -1)              # [h, w, C]
    rgb = latent @ factors + bias                      # [h, w, 3] in about [-1, 1]
    return ((rgb + 1.0) / 2.0).clamp(0.0, 1.0)


def _to_image(rgb: Tensor, max_size: int) -> Image.Image:
    """[h, w, 3] in [0, 1] → an RGB PIL image no larger than max_size on its longest side."""
    arr = rgb.mul(255.0).round().to(torch.uint8).cpu().numpy()
    image = Image.fromarray(arr, "RGB")
    image.thumbnail((max_size, max_size))
    return image


class Latent2RGBPreviewer:
    def __init__(self, kind: str, max_size: int = 512):
        if kind not in LATENT_RGB_FACTORS:
            raise ValueError(f"no latent2rgb preview factors for model kind {kind!r}")
        self.kind, self.max_size = kind, max_size

    def __call__(self, x0: Tensor) -> Image.Image:
        return _to_image(latent_to_rgb(x0, self.kind), self.max_size)


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


def make_previewer(method: str, kind: str, find_decoder: Callable[[str], Path | None],
                   max_size: int = 512) -> Callable[[Tensor], Image.Image] | None:
    """The previewer for ``method`` and ``kind`` (a model kind or latent format name,
    ``preview_key``), or None for no previews.

    ``find_decoder(name)`` gives the path of ``vae_approx/<name>.*`` or None. Model kinds without
    factors (none yet beyond SD1/SD2/SDXL/x4 upscaler) get no previews; kinds without a TAESD
    decoder (the x4 upscaler) get latent2rgb.
    """
    if method not in PREVIEW_METHODS:
        raise ValueError(f"unknown preview method {method!r}; one of {', '.join(PREVIEW_METHODS)}")
    if method == "none" or kind not in LATENT_RGB_FACTORS:
        return None
    if method in ("auto", "taesd") and kind in TAESD_DECODER_NAMES:
        path = find_decoder(TAESD_DECODER_NAMES[kind])
        if path is not None:
            decoder = _cached_decoder(os.fspath(path), os.stat(path).st_mtime_ns)
            return TAESDPreviewer(decoder, max_size)
    return Latent2RGBPreviewer(kind, max_size)
