"""Flow-matching (rectified flow) sigma schedules: ComfyUI's ``ModelSamplingDiscreteFlow`` (SD3,
AuraFlow, Z-Image, Qwen-Image, Lumina 2, Wan, ...) and ``ModelSamplingFlux`` (Flux.1).

A flow model's noisy sample is x_σ = (1 − σ)·x0 + σ·ε with σ in [0, 1] (Liu et al. 2023,
"Flow Straight and Fast"; Lipman et al. 2023, "Flow Matching for Generative Modeling"). The
training time t in (0, 1] is warped into σ by a shift that spends more steps at high noise for
large images (Esser et al. 2024, "Scaling Rectified Flow Transformers", sec. 5.3.2):

* kind "linear" (SD3's ``time_snr_shift``): σ(t) = shift·t / (1 + (shift − 1)·t); the model's
  timestep is σ·multiplier (SD3: shift 3, multiplier 1000; AuraFlow: multiplier 1). The table
  the table-based schedulers read holds σ(k/1000), k = 1..1000.
* kind "exponential" (Flux's ``time_shift`` with μ = shift): σ(t) = e^μ / (e^μ + (1/t − 1));
  the model's timestep is σ itself. The table holds σ(k/10000), k = 1..10000.

Both tables are built with ComfyUI's operation order (``arange(1, T + 1) / T`` in float32, then
the shift), so table-based schedulers (simple, beta, normal, sgm_uniform, ddim_uniform,
linear_quadratic) and σmin/σmax (karras, exponential, kl_optimal) give ComfyUI's sigmas.
``percent_to_sigma`` is σ(1 − percent), with 0 % → 1 and 100 % → 0 (ComfyUI's flow convention:
no sigma beyond 1).
"""

from __future__ import annotations

import math

import torch

from .schedules import SigmaTable

__all__ = ["FlowSchedule", "FLOW_SHIFT_KINDS", "time_snr_shift", "flux_time_shift", "flux_resolution_shift"]

FLOW_SHIFT_KINDS = ("linear", "exponential")


def time_snr_shift(shift: float, t):
    """σ(t) = shift·t / (1 + (shift − 1)·t) (t a float or a tensor; t itself for shift 1)."""
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


def flux_time_shift(mu: float, t):
    """σ(t) = e^μ / (e^μ + (1/t − 1)) (Flux's time shift with exponent 1)."""
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)


def flux_resolution_shift(width: int, height: int, max_shift: float = 1.15, base_shift: float = 0.5) -> float:
    """Flux's μ for an image size (ComfyUI's ModelSamplingFlux node, Flux.1's reference code):
    linear in the number of 2x2 latent patches, ``base_shift`` at 256 patches (256² px) and
    ``max_shift`` at 4096 (1024² px), extrapolated beyond."""
    x1, x2 = 256, 4096
    slope = (max_shift - base_shift) / (x2 - x1)
    intercept = base_shift - slope * x1
    return (width * height / (8 * 8 * 2 * 2)) * slope + intercept


class FlowSchedule(SigmaTable):
    """The σ schedule of a flow-matching model (see the module docstring)."""

    skip_steps = 1
    zsnr = False

    def __init__(self, shift: float = 1.0, multiplier: float = 1000.0, kind: str = "linear"):
        if kind not in FLOW_SHIFT_KINDS:
            raise ValueError(f"flow schedule shift kind {kind!r}: expected one of {FLOW_SHIFT_KINDS}")
        if not shift > 0:
            raise ValueError(f"flow schedule: shift must be > 0, got {shift}")
        self.kind = kind
        self.shift = float(shift)
        if kind == "linear":
            if not multiplier > 0:
                raise ValueError(f"flow schedule: multiplier must be > 0, got {multiplier}")
            self.multiplier = float(multiplier)
            timesteps = 1000
            self.sigmas = self.sigma((torch.arange(1, timesteps + 1, 1) / timesteps) * self.multiplier)
        else:
            self.multiplier = 1.0  # Flux's model sees σ itself
            timesteps = 10000
            self.sigmas = self.sigma(torch.arange(1, timesteps + 1, 1) / timesteps)
        # [T] float32, increasing, ending at 1
        self.log_sigmas = self.sigmas.log()
        self.num_timesteps = timesteps

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The model's time input: σ·multiplier ("linear"), σ ("exponential")."""
        sigma = torch.as_tensor(sigma)
        if self.kind == "linear":
            return sigma * self.multiplier
        return sigma

    def sigma(self, timestep):
        """σ at a model timestep (the inverse of ``timestep`` composed with the shift)."""
        if self.kind == "linear":
            return time_snr_shift(self.shift, torch.as_tensor(timestep) / self.multiplier)
        return flux_time_shift(self.shift, torch.as_tensor(timestep))

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        if self.kind == "linear":
            return float(time_snr_shift(self.shift, 1.0 - percent))
        return float(flux_time_shift(self.shift, 1.0 - percent))

    def sigma_to_percent(self, sigma: float) -> float:
        """Inverse of ``percent_to_sigma``: 1 − t(σ), t the unshifted time."""
        sigma = float(sigma)
        if sigma <= 0:
            return 1.0
        if sigma >= 1:
            return 0.0
        if self.kind == "linear":
            t = sigma / (self.shift - (self.shift - 1.0) * sigma)
        else:
            t = 1.0 / (1.0 + math.exp(self.shift) * (1.0 / sigma - 1.0))
        return min(max(1.0 - t, 0.0), 1.0)
