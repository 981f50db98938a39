"""Sigma schedules and sigma-list tools of ComfyUI's custom-sampling nodes.

Every function returns a 1-D float32 CPU tensor (SIGMAS). The formulas and the exact slicing
follow ComfyUI 0.3.64 (``comfy_extras/nodes_custom_sampler.py``, ``nodes_align_your_steps.py``,
``nodes_optimalsteps.py``), k-diffusion's ``get_sigmas_*`` for the continuous schedules.
The nine KSampler schedulers live in ``schedules.py``; this module reuses them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from .schedule_tables import AYS_NOISE_LEVELS, GITS_NOISE_LEVELS, OPTIMAL_STEPS_NOISE_LEVELS
from .schedules import DiscreteSchedule, calculate_sigmas, karras_scheduler

__all__ = [
    "basic_scheduler",
    "karras_sigmas",
    "exponential_sigmas",
    "polyexponential_sigmas",
    "laplace_sigmas",
    "vp_sigmas",
    "sd_turbo_sigmas",
    "ays_sigmas",
    "optimal_steps_sigmas",
    "gits_sigmas",
    "loglinear_interp",
    "split_sigmas",
    "split_sigmas_denoise",
    "flip_sigmas",
    "set_first_sigma",
    "extend_intermediate_sigmas",
    "EXTEND_SPACINGS",
    "percent_to_sigma",
    "manual_sigmas",
]


def _append_zero(s: torch.Tensor) -> torch.Tensor:
    return torch.cat([s, s.new_zeros([1])])


def basic_scheduler(schedule: DiscreteSchedule, scheduler: str, steps: int,
                    denoise: float = 1.0) -> torch.Tensor:
    """BasicScheduler: ``scheduler`` over ``int(steps/denoise)`` steps, keeping the last steps+1
    sigmas (empty for denoise ≤ 0). Unlike KSampler it knows no sampler, so dpm_2/uni_pc get no
    penultimate-sigma drop."""
    total = steps
    if denoise < 1.0:
        if denoise <= 0.0:
            return torch.FloatTensor([])
        total = int(steps / denoise)
    return calculate_sigmas(schedule, scheduler, total).cpu()[-(steps + 1):]


def karras_sigmas(steps: int, sigma_max: float, sigma_min: float, rho: float) -> torch.Tensor:
    """Karras et al. 2022 eq. 5 (the KSampler ``karras`` formula with free σ range and ρ)."""
    return karras_scheduler(steps, sigma_min, sigma_max, rho)


def exponential_sigmas(steps: int, sigma_max: float, sigma_min: float) -> torch.Tensor:
    """Uniform in log σ, then 0 (k-diffusion ``get_sigmas_exponential``)."""
    return _append_zero(torch.linspace(math.log(sigma_max), math.log(sigma_min), steps).exp())


def polyexponential_sigmas(steps: int, sigma_max: float, sigma_min: float,
                           rho: float) -> torch.Tensor:
    """Polynomial in log σ (k-diffusion ``get_sigmas_polyexponential``): log σ_i = log σmin +
    (1 − i/(n−1))^ρ (log σmax − log σmin), then 0; ρ = 1 is the exponential schedule."""
    ramp = torch.linspace(1, 0, steps) ** rho
    lo, hi = math.log(sigma_min), math.log(sigma_max)
    return _append_zero(torch.exp(ramp * (hi - lo) + lo))


def laplace_sigmas(steps: int, sigma_max: float, sigma_min: float, mu: float,
                   beta: float) -> torch.Tensor:
    """Laplace schedule (Hang et al. 2024, "Improved Noise Schedule for Diffusion Training"):
    log σ follows the Laplace quantile function mu − β·sign(0.5 − u)·log(1 − 2|0.5 − u| + 1e-5)
    at u = linspace(0, 1, n), clamped to [σmin, σmax]. As in ComfyUI no 0 is appended."""
    u = torch.linspace(0, 1, steps)
    lmb = mu - beta * torch.sign(0.5 - u) * torch.log(1 - 2 * torch.abs(0.5 - u) + 1e-5)
    return torch.clamp(torch.exp(lmb), min=sigma_min, max=sigma_max)


def vp_sigmas(steps: int, beta_d: float, beta_min: float, eps_s: float) -> torch.Tensor:
    """Continuous VP schedule (Song et al. 2021, "Score-Based Generative Modeling through
    SDEs"): σ(t) = sqrt(exp(β_d t²/2 + β_min t) − 1) at t = linspace(1, eps_s, n), then 0."""
    t = torch.linspace(1, eps_s, steps)
    return _append_zero(torch.sqrt(torch.special.expm1(beta_d * t**2 / 2 + beta_min * t)))


def sd_turbo_sigmas(schedule: DiscreteSchedule, steps: int, denoise: float) -> torch.Tensor:
    """SDTurboScheduler (Sauer et al. 2023, "Adversarial Diffusion Distillation"): timesteps
    999, 899, ..., 99; start at index 10 − int(10·denoise), take ``steps`` of them, map through
    the model's σ(t), then 0."""
    start = 10 - int(10 * denoise)
    timesteps = torch.flip(torch.arange(1, 11) * 100 - 1, (0,))[start:start + steps]
    return _append_zero(schedule.sigma(timesteps).float())


def loglinear_interp(t_steps, num_steps: int) -> np.ndarray:
    """Resample a decreasing list to ``num_steps`` points, linearly in log σ over an even grid
    (the AYS authors' interpolation, float64)."""
    xs = np.linspace(0, 1, len(t_steps))
    ys = np.log(np.asarray(t_steps, dtype=np.float64)[::-1])
    new_ys = np.interp(np.linspace(0, 1, num_steps), xs, ys)
    return np.exp(new_ys)[::-1].copy()


def _table_sigmas(levels, steps: int, denoise: float) -> torch.Tensor:
    """The tail of a table schedule: ``round(steps·denoise)`` steps, interpolated when the table
    has another length, last sigma set to 0 (AYS / OptimalSteps / GITS)."""
    total = steps
    if denoise < 1.0:
        if denoise <= 0.0:
            return torch.FloatTensor([])
        total = round(steps * denoise)
    sigmas = list(levels)
    if steps + 1 != len(sigmas):
        sigmas = list(loglinear_interp(sigmas, steps + 1))
    sigmas = sigmas[-(total + 1):]
    sigmas[-1] = 0
    return torch.FloatTensor([float(s) for s in sigmas])


def ays_sigmas(model_type: str, steps: int, denoise: float) -> torch.Tensor:
    """AlignYourStepsScheduler: the published 10-step schedule of ``model_type``, log-linearly
    resampled to ``steps`` (schedule_tables.AYS_NOISE_LEVELS)."""
    return _table_sigmas(AYS_NOISE_LEVELS[model_type], steps, denoise)


def optimal_steps_sigmas(model_type: str, steps: int, denoise: float) -> torch.Tensor:
    """OptimalStepsScheduler: the published table of ``model_type``, resampled like AYS."""
    return _table_sigmas(OPTIMAL_STEPS_NOISE_LEVELS[model_type], steps, denoise)


def gits_sigmas(coeff: float, steps: int, denoise: float) -> torch.Tensor:
    """GITSScheduler: the table row of ``coeff`` for ``steps`` ≤ 20, else its 20-step row
    log-linearly resampled to ``steps`` (schedule_tables.GITS_NOISE_LEVELS); tail and final 0
    as AYS. ``coeff`` must be one of the table's coefficients (0.80, 0.85, ... 1.50)."""
    key = round(float(coeff), 2)
    if key not in GITS_NOISE_LEVELS:
        raise ValueError(f"coeff {coeff}: GITS has tables for "
                         f"{', '.join(f'{c:.2f}' for c in GITS_NOISE_LEVELS)} only")
    rows = GITS_NOISE_LEVELS[key]
    if steps < 2:
        raise ValueError(f"steps {steps}: GITS needs at least 2 steps")
    levels = rows[steps - 2] if steps <= len(rows) + 1 else rows[-1]
    return _table_sigmas(levels, steps, denoise)


def split_sigmas(sigmas: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmas[:step+1], sigmas[step:]): the two halves share the sigma at ``step``."""
    return sigmas[:step + 1], sigmas[step:]


def split_sigmas_denoise(sigmas: torch.Tensor,
                         denoise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Split so the low half has round(steps·denoise) steps. As in ComfyUI, denoise that rounds
    to 0 steps gives an empty high half (``sigmas[:-0]``)."""
    steps = max(sigmas.shape[-1] - 1, 0)
    total = round(steps * denoise)
    return sigmas[:-total], sigmas[-(total + 1):]


def flip_sigmas(sigmas: torch.Tensor) -> torch.Tensor:
    """Reverse the schedule (for inversion); a leading 0 becomes 0.0001 so σ is never 0 where
    the sampler divides by it."""
    if len(sigmas) == 0:
        return sigmas
    out = sigmas.flip(0)
    if out[0] == 0:
        out[0] = 0.0001
    return out


_NUMBER = re.compile(r"[-+]?\d*\.*\d+")  # ComfyUI ManualSigmas' number pattern


def manual_sigmas(text: str) -> torch.Tensor:
    """The numbers in ``text``, in order, as SIGMAS (ComfyUI's ManualSigmas: every match of an
    optional sign, digits, dots, digits; anything else separates, so "1e-3" reads as 1, −3).
    A match that is not a number (such as "1..5") is an error naming it."""
    values = []
    for m in _NUMBER.findall(text):
        try:
            values.append(float(m))
        except ValueError:
            raise ValueError(f"input 'sigmas': {m!r} is not a number (write sigmas as "
                             f"comma-separated decimals, e.g. \"14.61, 7.0, 0\")") from None
    return torch.tensor(values, dtype=torch.float32)


def set_first_sigma(sigmas: torch.Tensor, sigma: float) -> torch.Tensor:
    out = sigmas.clone()
    out[0] = sigma
    return out


EXTEND_SPACINGS = ("linear", "cosine", "sine")


def extend_intermediate_sigmas(sigmas: torch.Tensor, steps: int, start_at_sigma: float,
                               end_at_sigma: float, spacing: str) -> torch.Tensor:
    """Insert ``steps − 1`` extra sigmas between each pair (σ_i, σ_{i+1}) whose σ_i lies in
    [end_at_sigma, start_at_sigma] (start < 0 means no upper bound), at fractions
    f(k/steps) of the gap: linear f(u) = u, cosine f(u) = sin(uπ/2), sine f(u) = 1 − cos(uπ/2)."""
    if start_at_sigma < 0:
        start_at_sigma = float("inf")
    shapes = {"linear": lambda u: u,
              "cosine": lambda u: torch.sin(u * math.pi / 2),
              "sine": lambda u: 1 - torch.cos(u * math.pi / 2)}
    if spacing not in shapes:
        raise ValueError(f"unknown spacing {spacing!r}; one of {', '.join(EXTEND_SPACINGS)}")
    fractions = shapes[spacing](torch.linspace(0, 1, steps + 1)[1:-1])
    out: list[float] = []
    for i in range(len(sigmas) - 1):
        cur, nxt = sigmas[i], sigmas[i + 1]
        out.append(float(cur))
        if end_at_sigma <= cur <= start_at_sigma:
            out.extend((fractions * (nxt - cur) + cur).tolist())
    if len(sigmas) > 0:
        out.append(float(sigmas[-1]))
    return torch.FloatTensor(out)


def percent_to_sigma(schedule: DiscreteSchedule, percent: float, actual: bool = False) -> float:
    """SamplingPercentToSigma: the schedule's σ at sampling progress ``percent``. ComfyUI's
    interval-check values at the ends (0 → 999999999.9, 1 → 0) unless ``actual``, which gives
    σmax and σmin there."""
    if actual and percent == 0.0:
        return float(schedule.sigma_max)
    if actual and percent == 1.0:
        return float(schedule.sigma_min)
    return schedule.percent_to_sigma(percent)
