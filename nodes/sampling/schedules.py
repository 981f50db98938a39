"""The discrete SD noise schedule and the sigma schedulers (ComfyUI's ``SCHEDULER_NAMES``).

``DiscreteSchedule`` is DDPM's linear-in-sqrt beta schedule (Ho et al. 2020, "Denoising Diffusion
Probabilistic Models"; the "scaled linear" variant of Rombach et al. 2022, "High-Resolution Image
Synthesis with Latent Diffusion Models") seen as a VE process with σ = sqrt((1 − ᾱ)/ᾱ) (Karras et
al. 2022, "Elucidating the Design Space of Diffusion-Based Generative Models"). It matches
ComfyUI's ``ModelSamplingDiscrete``: betas in float64, sigmas and their logs stored as float32,
``timestep(σ)`` the nearest integer step in log σ and ``sigma(t)`` log-linear interpolation.

A scheduler returns a 1-D float32 CPU tensor of n+1 decreasing sigmas ending in 0 (``normal``
and ``ddim_uniform`` may instead end on a zero sigma of the schedule itself, e.g. with zSNR).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
import torch

__all__ = [
    "SigmaTable",
    "DiscreteSchedule",
    "SCHEDULER_NAMES",
    "calculate_sigmas",
    "simple_scheduler",
    "sgm_uniform_scheduler",
    "karras_scheduler",
    "exponential_scheduler",
    "ddim_uniform_scheduler",
    "beta_scheduler",
    "normal_scheduler",
    "linear_quadratic_scheduler",
    "kl_optimal_scheduler",
    "rescale_zero_terminal_snr_sigmas",
]


def rescale_zero_terminal_snr_sigmas(sigmas: torch.Tensor) -> torch.Tensor:
    """Rescale a schedule to zero terminal SNR (Lin et al. 2024, "Common Diffusion Noise Schedules
    and Sample Steps are Flawed", Algorithm 1), shifting and scaling sqrt(ᾱ) so the last step has
    ᾱ = 0. The last ᾱ is then set to 4.8973451890853435e-08 (ComfyUI's value) so σ stays finite."""
    alphas_cumprod = 1 / (sigmas * sigmas + 1)
    sqrt_ac = alphas_cumprod.sqrt()
    first, last = sqrt_ac[0].clone(), sqrt_ac[-1].clone()
    sqrt_ac = (sqrt_ac - last) * (first / (first - last))
    alphas_bar = sqrt_ac**2
    alphas_bar[-1] = 4.8973451890853435e-08
    return ((1 - alphas_bar) / alphas_bar) ** 0.5


class SigmaTable:
    """A schedule tabulated as increasing ``sigmas`` [T] (what every schedule of a model keeps, as
    ComfyUI's ``model_sampling.sigmas``): its ends are σ_min and σ_max."""

    sigmas: torch.Tensor

    @property
    def sigma_min(self) -> torch.Tensor:
        return self.sigmas[0]

    @property
    def sigma_max(self) -> torch.Tensor:
        return self.sigmas[-1]


class DiscreteSchedule(SigmaTable):
    """SD1/SD2/SDXL discrete-time sigmas (ComfyUI ``ModelSamplingDiscrete``).

    ``distilled=True`` gives ComfyUI's ``ModelSamplingDiscreteDistilled`` used for LCM
    (Luo et al. 2023, "Latent Consistency Models"): only every 20th of the 1000 steps is a valid
    sigma (50 "original" timesteps) and timesteps map to the last step of each 20-step block.
    """

    num_timesteps: int = 1000

    def __init__(
        self,
        linear_start: float = 0.00085,
        linear_end: float = 0.012,
        timesteps: int = 1000,
        zsnr: bool = False,
        distilled: bool = False,
        original_timesteps: int = 50,
    ):
        betas = (
            torch.linspace(linear_start**0.5, linear_end**0.5, timesteps, dtype=torch.float64) ** 2
        )
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5
        if zsnr:
            sigmas = rescale_zero_terminal_snr_sigmas(sigmas)
        self.num_timesteps = timesteps
        self.zsnr = zsnr
        self.skip_steps = 1
        if distilled:
            self.skip_steps = timesteps // original_timesteps
            full = sigmas.float()
            valid = torch.zeros(original_timesteps, dtype=torch.float32)
            for k in range(original_timesteps):
                valid[original_timesteps - 1 - k] = full[timesteps - 1 - k * self.skip_steps]
            sigmas = valid
        self.sigmas = sigmas.float()  # [N] float32, increasing
        self.log_sigmas = sigmas.log().float()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """Nearest integer timestep in log σ (what the UNet receives), same shape as sigma."""
        sigma = torch.as_tensor(sigma)
        dists = sigma.log().to(self.log_sigmas.device) - self.log_sigmas[:, None]
        t = dists.abs().argmin(dim=0).view(sigma.shape)
        if self.skip_steps > 1:
            t = t * self.skip_steps + (self.skip_steps - 1)
        return t.to(sigma.device)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        """σ at a (possibly fractional) timestep, by linear interpolation of log σ."""
        timestep = torch.as_tensor(timestep)
        t = timestep.float().to(self.log_sigmas.device)
        if self.skip_steps > 1:
            t = (t - (self.skip_steps - 1)) / self.skip_steps
        t = torch.clamp(t, min=0, max=len(self.sigmas) - 1)
        low, high, w = t.floor().long(), t.ceil().long(), t.frac()
        log_sigma = (1 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]
        return log_sigma.exp().to(timestep.device)

    def percent_to_sigma(self, percent: float) -> float:
        """σ at sampling progress ``percent`` (0 = start, 1 = end); ComfyUI's convention that 0
        is beyond any sigma and 1 is 0."""
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor((1.0 - percent) * 999.0)))

    def sigma_to_percent(self, sigma: float) -> float:
        """Inverse of ``percent_to_sigma`` (continuous timestep from log σ interpolation)."""
        sigma = float(sigma)
        if sigma <= 0:
            return 1.0
        log_s = math.log(sigma)
        logs = self.log_sigmas.double().numpy()
        idx = np.arange(len(logs), dtype=np.float64) * self.skip_steps + (self.skip_steps - 1)
        t = float(np.interp(log_s, logs, idx))  # log σ is increasing in t
        return min(max(1.0 - t / 999.0, 0.0), 1.0)


# ------------------------------------------------------------------------------- schedulers


def simple_scheduler(schedule: DiscreteSchedule, steps: int) -> torch.Tensor:
    """Evenly spaced training timesteps from the top (ComfyUI "simple")."""
    sigs = []
    stride = len(schedule.sigmas) / steps
    for i in range(steps):
        sigs.append(float(schedule.sigmas[-(1 + int(i * stride))]))
    sigs.append(0.0)
    return torch.FloatTensor(sigs)


def ddim_uniform_scheduler(schedule: DiscreteSchedule, steps: int) -> torch.Tensor:
    """DDIM's uniform timestep skipping (Song et al. 2021, "Denoising Diffusion Implicit Models"):
    every ``1000 // n``-th step from index 1, reversed, with 0 appended (or, when sigmas[1] is
    already ~0, one extra step instead of the 0)."""
    sigs: list[float] = []
    x = 1
    if math.isclose(float(schedule.sigmas[x]), 0, abs_tol=0.00001):
        steps += 1
    else:
        sigs = [0.0]
    stride = max(len(schedule.sigmas) // steps, 1)
    while x < len(schedule.sigmas):
        sigs.append(float(schedule.sigmas[x]))
        x += stride
    return torch.FloatTensor(sigs[::-1])


def normal_scheduler(schedule: DiscreteSchedule, steps: int, sgm: bool = False) -> torch.Tensor:
    """Timesteps linear from t(σmax) to t(σmin), mapped to σ (ComfyUI "normal"); with ``sgm``
    n+1 points with the last dropped (Stability's sgm "uniform" discretisation)."""
    start = schedule.timestep(schedule.sigma_max)
    end = schedule.timestep(schedule.sigma_min)
    append_zero = True
    if sgm:
        timesteps = torch.linspace(start, end, steps + 1)[:-1]
    else:
        if math.isclose(float(schedule.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append_zero = False
        timesteps = torch.linspace(start, end, steps)
    sigs = [float(schedule.sigma(ts)) for ts in timesteps]
    if append_zero:
        sigs.append(0.0)
    return torch.FloatTensor(sigs)


def sgm_uniform_scheduler(schedule: DiscreteSchedule, steps: int) -> torch.Tensor:
    return normal_scheduler(schedule, steps, sgm=True)


def karras_scheduler(
    n: int, sigma_min: float, sigma_max: float, rho: float = 7.0
) -> torch.Tensor:
    """Karras et al. 2022 (eq. 5): σ_i = (σmax^(1/ρ) + i/(n−1)(σmin^(1/ρ) − σmax^(1/ρ)))^ρ."""
    ramp = torch.linspace(0, 1, n)
    min_inv_rho = sigma_min ** (1 / rho)
    max_inv_rho = sigma_max ** (1 / rho)
    sigmas = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho
    return torch.cat([sigmas, sigmas.new_zeros([1])])


def exponential_scheduler(n: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    """Uniform steps in log σ (k-diffusion's ``get_sigmas_exponential``)."""
    sigmas = torch.linspace(math.log(sigma_max), math.log(sigma_min), n).exp()
    return torch.cat([sigmas, sigmas.new_zeros([1])])


def beta_scheduler(
    schedule: DiscreteSchedule, steps: int, alpha: float = 0.6, beta: float = 0.6
) -> torch.Tensor:
    """Timesteps at Beta(α, β) quantiles (Lee et al. 2024, "Beta Sampling is All You Need"),
    rounded to integers, consecutive duplicates removed."""
    total = len(schedule.sigmas) - 1
    ts = 1 - np.linspace(0, 1, steps, endpoint=False)
    # Beta(α, β).ppf(q) is the inverse regularised incomplete beta function; scipy.special's
    # gives the same bits as scipy.stats.beta.ppf (checked over α, β in 0.01..50 and 1..10000
    # steps) without scipy.stats' 0.3 s import, which `mixgraph serve` pays before it listens
    ts = np.rint(scipy.special.betaincinv(alpha, beta, ts) * total)
    sigs = []
    last_t = -1
    for t in ts:
        if t != last_t:
            sigs.append(float(schedule.sigmas[int(t)]))
        last_t = t
    sigs.append(0.0)
    return torch.FloatTensor(sigs)


def linear_quadratic_scheduler(
    schedule: DiscreteSchedule,
    steps: int,
    threshold_noise: float = 0.025,
    linear_steps: int | None = None,
) -> torch.Tensor:
    """Genmo's Mochi 1 schedule (linear up to ``threshold_noise`` for the first half of the steps,
    then quadratic to 1), as 1 − s, scaled by σmax."""
    if steps == 1:
        sigma_schedule = [1.0, 0.0]
    else:
        if linear_steps is None:
            linear_steps = steps // 2
        linear = [i * threshold_noise / linear_steps for i in range(linear_steps)]
        step_diff = linear_steps - threshold_noise * steps
        quadratic_steps = steps - linear_steps
        quadratic_coef = step_diff / (linear_steps * quadratic_steps**2)
        linear_coef = threshold_noise / linear_steps - 2 * step_diff / (quadratic_steps**2)
        const = quadratic_coef * (linear_steps**2)
        quadratic = [
            quadratic_coef * (i**2) + linear_coef * i + const for i in range(linear_steps, steps)
        ]
        sigma_schedule = [1.0 - s for s in linear + quadratic + [1.0]]
    return torch.FloatTensor(sigma_schedule) * schedule.sigma_max.cpu()


def kl_optimal_scheduler(n: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    """KL-optimal schedule (Sabour et al. 2024, "Align Your Steps", eq. for the KL-optimal
    discretisation): σ_i = tan(lerp(atan σmax, atan σmin, i/(n−1))), then 0."""
    # n == 1: ComfyUI divides 0 by 0 (a NaN sigma); we take the limit, the start point σmax.
    adj = torch.arange(n, dtype=torch.float).div_(max(n - 1, 1))
    sigmas = adj.new_zeros(n + 1)
    sigmas[:-1] = (adj * math.atan(sigma_min) + (1 - adj) * math.atan(sigma_max)).tan_()
    return sigmas


# name -> (function, takes the schedule (True) or (n, sigma_min, sigma_max) (False))
_SCHEDULERS = {
    "simple": (simple_scheduler, True),
    "sgm_uniform": (sgm_uniform_scheduler, True),
    "karras": (karras_scheduler, False),
    "exponential": (exponential_scheduler, False),
    "ddim_uniform": (ddim_uniform_scheduler, True),
    "beta": (beta_scheduler, True),
    "normal": (normal_scheduler, True),
    "linear_quadratic": (linear_quadratic_scheduler, True),
    "kl_optimal": (kl_optimal_scheduler, False),
}

SCHEDULER_NAMES: tuple[str, ...] = tuple(_SCHEDULERS)


def calculate_sigmas(schedule: DiscreteSchedule, scheduler: str, steps: int) -> torch.Tensor:
    """``steps`` sigmas of the named scheduler plus the final one (float32, CPU)."""
    try:
        fn, uses_schedule = _SCHEDULERS[scheduler]
    except KeyError:
        raise ValueError(
            f"unknown scheduler {scheduler!r}; choose one of {', '.join(SCHEDULER_NAMES)}"
        ) from None
    if uses_schedule:
        return fn(schedule, steps)
    return fn(n=steps, sigma_min=float(schedule.sigma_min), sigma_max=float(schedule.sigma_max))
