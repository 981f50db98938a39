"""Latent formats (ComfyUI's ``comfy/latent_formats.py``): how a model's latent space relates to
the VAE's. A LATENT carries the VAE's raw latent; the sampler works on ``process_in(latent)`` and
returns ``process_out(x)``.

Two shapes of format:

* scalar (SD 1.x/2.x 0.18215, SDXL 0.13025, the x4 upscaler 0.08333): ``process_in(z) = z·s``,
  ``process_out(x) = x / s``;
* per-channel affine (Playground v2.5): with per-channel ``mean`` and ``std``,
  ``process_in(z) = (z − mean)·s / std``, ``process_out(x) = x·std / s + mean``.

``PLAYGROUND_V2_5`` is ComfyUI's ``SDXL_Playground_2_5`` (Comfy-Org/ComfyUI
``comfy/latent_formats.py`` at 75399d78ddcc01f46f9b94521b29f1fe8a90ed53): scale_factor 0.5,
latents_mean (−1.6574, 1.886, −1.383, 2.5155), latents_std (8.4927, 5.9022, 6.5498, 5.2299), the
formulas above, its preview factors (SDXL's earlier factors, no bias) and TAESD decoder
(taesdxl). ComfyUI's ``ModelSamplingContinuousEDM`` sets it with sampling "edm_playground_v2.5"
(``comfy_extras/nodes_model_advanced.py`` at 691e8278).

A format also says how the sampler previews its latents (``sampling/preview.py``), as ComfyUI's
latent formats do: ``latent_rgb_factors`` (rows: latent channels, columns: R, G, B),
``latent_rgb_factors_bias`` and ``taesd_decoder_name`` (the ``models/vae_approx`` file). A format
without factors gets no latent preview. Each family sets them on the formats it makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LatentFormat", "PLAYGROUND_V2_5", "format_of"]


@dataclass(frozen=True)
class LatentFormat:
    """A model's latent format (frozen, hashable, compared by value).

    scale_factor: ComfyUI's ``scale_factor``. channels: latent channels. downscale: image pixels
    per latent pixel along a side (the x4 upscaler's VAE: 4). mean / std: per-channel shift and
    spread of an affine format (both None for a scalar one). name: ComfyUI's class name for a
    format that is not its model kind's default (``"sdxl_playground_2_5"``), for messages. None for
    the kind's own format.
    latent_rgb_factors: [channels][3] linear map of a latent pixel to RGB in about [-1, 1]
    (ComfyUI's ``latent_rgb_factors``), None: no latent2rgb preview. latent_rgb_factors_bias:
    (r, g, b) added after it, None: none. taesd_decoder_name: the TAESD decoder that previews
    this latent space (``vae_approx/<name>.*``), None: none.
    """

    scale_factor: float = 0.18215
    channels: int = 4
    downscale: int = 8
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    name: str | None = None
    latent_rgb_factors: tuple[tuple[float, float, float], ...] | None = None
    latent_rgb_factors_bias: tuple[float, float, float] | None = None
    taesd_decoder_name: str | None = None

    def __post_init__(self):
        if (self.mean is None) != (self.std is None):
            raise ValueError("LatentFormat: mean and std go together")
        if self.mean is not None and not (len(self.mean) == len(self.std) == self.channels):
            raise ValueError(f"LatentFormat: {len(self.mean)} means and {len(self.std)} stds for "
                             f"{self.channels} channels")
        if self.latent_rgb_factors is not None and (
                len(self.latent_rgb_factors) != self.channels
                or any(len(row) != 3 for row in self.latent_rgb_factors)):
            raise ValueError(f"LatentFormat: latent_rgb_factors must be {self.channels} rows of 3 (R, G, B)")
        if self.latent_rgb_factors_bias is not None and len(self.latent_rgb_factors_bias) != 3:
            raise ValueError("LatentFormat: latent_rgb_factors_bias is (R, G, B)")

    @property
    def is_affine(self) -> bool:
        return self.mean is not None

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """mean and std as [1, C, 1, ...] in ``like``'s dtype and device (any latent rank ≥ 2)."""
        if like.ndim < 2 or like.shape[1] != self.channels:
            raise ValueError(f"a {tuple(like.shape)} latent for a {self.channels}-channel latent format "
                             f"({self.name or 'affine'})")
        view = (1, self.channels) + (1,) * (like.ndim - 2)
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device).view(view)
        std = torch.tensor(self.std, dtype=like.dtype, device=like.device).view(view)
        return mean, std

    def process_in(self, latent: Tensor) -> Tensor:
        """VAE latent → the model's (sampler's) latent space."""
        if self.mean is None:
            return latent * self.scale_factor
        mean, std = self._stats(latent)
        return (latent - mean) * self.scale_factor / std

    def process_out(self, latent: Tensor) -> Tensor:
        """The model's latent space → VAE latent (the inverse of ``process_in``)."""
        if self.mean is None:
            return latent / self.scale_factor
        mean, std = self._stats(latent)
        return latent * std / self.scale_factor + mean


PLAYGROUND_V2_5 = LatentFormat(
    scale_factor=0.5, channels=4, downscale=8,
    mean=(-1.6574, 1.886, -1.383, 2.5155),
    std=(8.4927, 5.9022, 6.5498, 5.2299),
    name="sdxl_playground_2_5",
    # ComfyUI latent_formats.SDXL_Playground_2_5 (Comfy-Org/ComfyUI 75399d78): SDXL's earlier
    # factors, no bias
    latent_rgb_factors=((0.3920, 0.4054, 0.4549),
                        (-0.2634, -0.0196, 0.0653),
                        (0.0568, 0.1687, -0.0755),
                        (-0.3112, -0.2359, -0.2076)),
    taesd_decoder_name="taesdxl_decoder",
)


def format_of(model) -> LatentFormat:
    """The latent format a sampler model or MODEL handle works in: its ``latent_format`` when it
    has one, else a scalar format from its ``latent_scale`` (a bare SamplerModel), else identity."""
    fmt = getattr(model, "latent_format", None)
    if fmt is not None and hasattr(fmt, "process_in") and hasattr(fmt, "process_out"):
        return fmt
    return LatentFormat(scale_factor=float(getattr(model, "latent_scale", 1.0)))
