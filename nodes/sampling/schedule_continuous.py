"""Continuous-time sigma schedules (ComfyUI's ``ModelSamplingContinuousEDM`` /
``ModelSamplingContinuousV``), the schedule a ``ModelSamplingContinuous*`` node gives a model.

Both keep 1000 sigmas log-spaced from σmin to σmax (what ``simple``, ``beta`` and the other
table-based schedulers index) and map σ to the UNet's timestep continuously:

* "edm" (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative
  Models", Table 1, c_noise): t = ¼·ln σ, σ = exp(4t);
* "v" (continuous-time v models, e.g. SD 2.x 768-v fine-tunes trained on the arctan schedule):
  t = (2/π)·atan σ, σ = tan(πt/2).

``percent_to_sigma`` interpolates log σ linearly between σmax (0 %) and σmin (100 %), with
ComfyUI's convention that 0 % is beyond any sigma and 100 % is 0, for both kinds.
"""

from __future__ import annotations

import math

import torch

from .schedules import SigmaTable

__all__ = ["ContinuousSchedule"]


class ContinuousSchedule(SigmaTable):
    skip_steps = 1

    def __init__(self, kind: str, sigma_min: float, sigma_max: float):
        if kind not in ("edm", "v"):
            raise ValueError(f"continuous schedule kind {kind!r}: expected 'edm' or 'v'")
        if not (0 < sigma_min < sigma_max):
            raise ValueError(f"continuous schedule: need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
        self.kind = kind
        self.zsnr = False
        sigmas = torch.linspace(math.log(sigma_min), math.log(sigma_max), 1000, dtype=torch.float32).exp()
        self.sigmas = sigmas  # [1000] float32, increasing
        self.log_sigmas = sigmas.log()
        self.num_timesteps = len(sigmas)

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.as_tensor(sigma, dtype=torch.float32)
        if self.kind == "edm":
            return 0.25 * sigma.log()
        return sigma.atan() / math.pi * 2

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        timestep = torch.as_tensor(timestep, dtype=torch.float32)
        if self.kind == "edm":
            return (timestep / 0.25).exp()
        return (timestep * math.pi / 2).tan()

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        lo, hi = math.log(float(self.sigma_min)), math.log(float(self.sigma_max))
        return math.exp((hi - lo) * (1.0 - percent) + lo)

    def sigma_to_percent(self, sigma: float) -> float:
        sigma = float(sigma)
        if sigma <= 0:
            return 1.0
        lo, hi = math.log(float(self.sigma_min)), math.log(float(self.sigma_max))
        return min(max(1.0 - (math.log(sigma) - lo) / (hi - lo), 0.0), 1.0)
