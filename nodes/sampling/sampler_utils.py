"""Helpers shared by the sampler families (``solvers_*.py``); the contract they serve is stated in
``samplers.py``, which re-exports the public four (``to_d``, ``get_ancestral_step``,
``append_dims``, ``denoise_with_uncond``).

They live apart from the registry so that the family modules import from here and the registry
imports the families: imports point one way, with no cycle.

The solvers work in the variance-exploding parameterisation ``x = x0 + sigma * eps`` of the
SD1/SD2/SDXL denoisers (eps and v-prediction alike): signal scale ``alpha = 1``, half-log-SNR
``lambda = -log(sigma)`` (``half_log_snr``). Flow-matching models (ComfyUI's CONST,
``ModelSampling.is_flow``) have ``x = (1 - sigma) x0 + sigma eps``: ``alpha = 1 - sigma``,
``lambda = log((1 - sigma) / sigma)``. The Karras ODE derivative ``(x - D) / sigma`` is the flow
velocity, so the ODE samplers in sigma run unchanged on them; the samplers ComfyUI branches for
CONST (euler_ancestral, dpm_2_ancestral, dpmpp_2s_ancestral, dpmpp_sde, dpmpp_2m_sde,
dpmpp_3m_sde, lcm, euler(_ancestral)_cfg_pp) take the flow branch when ``flow_sampling(model)``
finds a flow parameterisation, and those whose flow branch is not written yet refuse one with
``refuse_flow``. Samplers ComfyUI runs in the VE form on every model (dpmpp_2m, ddpm,
res_multistep, the other CFG++ forms, ...) do so here too. Defaults follow ComfyUI 0.3.64 and
are stated in each sampler's docstring.
"""

from __future__ import annotations

from typing import Callable

import torch

from .noise import NoiseSampler, default_noise_sampler

__all__ = [
    "append_dims",
    "to_d",
    "get_ancestral_step",
    "denoise_with_uncond",
    "half_log_snr",
    "seed_of",
    "noise_or_default",
    "lazy_noise",
    "karras_churn",
    "report_step",
    "ancestral_eval",
    "add_ancestral_noise",
    "model_sampling_of",
    "flow_sampling",
    "refuse_flow",
    "snr_fns",
    "offset_first_sigma_for_snr",
    "rf_ancestral_step",
]


def append_dims(v: torch.Tensor | float, ndim: int) -> torch.Tensor:
    """Reshape a scalar or [B] tensor to broadcast against an ``ndim``-d tensor."""
    v = torch.as_tensor(v)
    return v.reshape(v.shape + (1,) * (ndim - v.ndim))


def to_d(x: torch.Tensor, sigma, denoised: torch.Tensor) -> torch.Tensor:
    """Karras et al. 2022 probability-flow ODE derivative dx/dσ = (x − D(x, σ)) / σ."""
    return (x - denoised) / append_dims(sigma, x.ndim)


def get_ancestral_step(sigma_from, sigma_to, eta: float = 1.0):
    """Split an ancestral step σ_from → σ_to into a deterministic step to ``sigma_down`` plus
    fresh noise of std ``sigma_up`` (Song et al. 2021, "Score-Based Generative Modeling through
    SDEs"; k-diffusion's parameterisation), with σ_down² + σ_up² = σ_to²."""
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(
        sigma_to, eta * (sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5
    )
    sigma_down = (sigma_to**2 - sigma_up**2) ** 0.5
    return sigma_down, sigma_up


def denoise_with_uncond(model, x: torch.Tensor, sigma: torch.Tensor, cfg1_optimization: bool = False,
                        **extra_args):
    """(CFG-combined x0, unconditional x0) for CFG++ samplers; see the contract in
    ``samplers.py``. ``cfg1_optimization``: keep ComfyUI's cfg-1 optimisation, so a step at cfg ≈ 1
    skips the negative and reports the conditional x0 as the unconditional one (``cfgpp_ud10_ab``)."""
    with_uncond = getattr(model, "with_uncond", None)
    if with_uncond is not None:
        if cfg1_optimization:
            return with_uncond(x, sigma, skip_cfg1=True, **extra_args)
        return with_uncond(x, sigma, **extra_args)
    denoised = model(x, sigma, **extra_args)
    return denoised, denoised


def half_log_snr(sigma: torch.Tensor) -> torch.Tensor:
    """lambda = log(alpha / sigma) with alpha = 1 (the VE parameterisation)."""
    return sigma.log().neg()


def seed_of(extra_args: dict | None):
    """The node's seed carried in ``extra_args`` (None when absent)."""
    return None if extra_args is None else extra_args.get("seed")


def noise_or_default(x: torch.Tensor, extra_args: dict, noise_sampler: NoiseSampler | None):
    """The given noise sampler, else ComfyUI's default one seeded from ``extra_args["seed"]``."""
    if noise_sampler is not None:
        return noise_sampler
    return default_noise_sampler(x, extra_args.get("seed"))


def lazy_noise(x, extra_args, noise_sampler) -> Callable[[], NoiseSampler]:
    """A getter that builds the default noise sampler on first use only, so samplers whose noise
    is optional (churn) create no generator when they draw nothing."""
    box = [noise_sampler]

    def get():
        if box[0] is None:
            box[0] = default_noise_sampler(x, seed=seed_of(extra_args))
        return box[0]

    return get


def karras_churn(x, sigmas, i, s_churn, s_tmin, s_tmax, s_noise, noise):
    """Karras et al. 2022 Algorithm 2 "churn": raise σ_i to σ̂ = σ_i(1 + γ) by adding noise.
    ComfyUI draws this noise from the global RNG; we draw it from the seeded noise sampler."""
    gamma = 0.0
    if s_churn > 0 and s_tmin <= sigmas[i] <= s_tmax:
        gamma = min(s_churn / (len(sigmas) - 1), 2**0.5 - 1)
    sigma_hat = sigmas[i] * (gamma + 1)
    if gamma > 0:
        eps = noise()(sigmas[i], sigma_hat) * s_noise
        x = x + eps * (sigma_hat**2 - sigmas[i] ** 2) ** 0.5
    return x, sigma_hat


def report_step(callback, i, x, sigma, denoised, sigma_hat=None) -> None:
    """The contract's once-per-step callback; ``sigma_hat`` defaults to ``sigma`` (no churn)."""
    if callback is not None:
        callback({"x": x, "i": i, "sigma": sigma,
                  "sigma_hat": sigma if sigma_hat is None else sigma_hat, "denoised": denoised})


def ancestral_eval(model, x, sigmas, i, s_in, extra_args, callback, eta):
    """The opening of an ancestral step σ_i → σ_{i+1}: evaluate D(x, σ_i), split the step into
    (σ_down, σ_up) with ``get_ancestral_step`` and report it. Returns (denoised, σ_down, σ_up)."""
    denoised = model(x, sigmas[i] * s_in, **extra_args)
    sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
    report_step(callback, i, x, sigmas[i], denoised)
    return denoised, sigma_down, sigma_up


def add_ancestral_noise(x, noise_sampler, sigma, sigma_next, sigma_up, eta, s_noise):
    """Add the ancestral step's fresh noise of std ``s_noise * sigma_up`` (ComfyUI's newer-set
    form) unless ``sigma_next`` is 0 or ``eta`` or ``s_noise`` is 0."""
    if sigma_next > 0 and eta > 0 and s_noise > 0:
        x = x + noise_sampler(sigma, sigma_next) * (s_noise * sigma_up)
    return x


# ------------------------------------------------------------------ flow matching (CONST)


def model_sampling_of(model):
    """The ``ModelSampling`` behind the denoiser a sampler is given, or None (a bare callable):
    the denoiser's ``model_sampling`` or ``ms`` (``CondDenoiser``, ``InpaintDenoiser``), else
    that of the denoiser it wraps (``inner``), as ComfyUI's samplers reach
    ``model.inner_model.model_sampling``."""
    for _ in range(16):  # a wrapper chain is a few deep; never loop on a cycle
        if model is None:
            return None
        ms = getattr(model, "model_sampling", None)
        if ms is None:
            ms = getattr(model, "ms", None)
        if ms is not None:
            return ms
        model = getattr(model, "inner", None)
    return None


def flow_sampling(model):
    """The model's ``ModelSampling`` when it is flow matching (ComfyUI's CONST), else None."""
    ms = model_sampling_of(model)
    return ms if getattr(ms, "is_flow", False) else None


def refuse_flow(model, sampler: str) -> None:
    """Raise for a sampler whose flow-matching branch is not written yet, before any step."""
    if flow_sampling(model) is not None:
        raise NotImplementedError(
            f"sampler {sampler!r} is not supported yet on flow-matching models (its CONST branch "
            f"with alpha = 1 - sigma is not implemented); use euler, euler_ancestral, heun, "
            f"dpmpp_2m, dpmpp_2m_sde or another sampler that is")


def snr_fns(flow: bool):
    """(lambda_fn, sigma_fn): sigma -> half-log-SNR log(alpha/sigma) and back. VE: ``-log sigma``
    and ``exp(-lambda)``; flow: ``-logit(sigma)`` and ``sigmoid(-lambda)`` (ComfyUI's
    ``sigma_to_half_log_snr`` / ``half_log_snr_to_sigma``)."""
    if flow:
        return (lambda sigma: sigma.logit().neg()), (lambda lam: lam.neg().sigmoid())
    return (lambda sigma: sigma.log().neg()), (lambda lam: lam.neg().exp())


def offset_first_sigma_for_snr(sigmas: torch.Tensor, ms, percent_offset: float = 1e-4) -> torch.Tensor:
    """On a flow model a first sigma of 1 has an infinite half-log-SNR: move it to the sigma at
    ``percent_offset`` (ComfyUI's ``offset_first_sigma_for_snr``). Unchanged otherwise."""
    if len(sigmas) <= 1 or not getattr(ms, "is_flow", False):
        return sigmas
    if sigmas[0] >= 1:
        sigmas = sigmas.clone()
        sigmas[0] = ms.percent_to_sigma(percent_offset)
    return sigmas


def rf_ancestral_step(sigma, sigma_next, eta: float):
    """The ancestral split of a flow step sigma -> sigma_next (ComfyUI's ``*_RF`` samplers):
    deterministic to ``sigma_down = sigma_next (1 + (sigma_next/sigma - 1) eta)``, then scale by
    ``alpha_next / alpha_down`` and add noise of std ``renoise`` so the marginal at sigma_next is
    ``(1 - sigma_next) x0 + sigma_next eps``. Returns (sigma_down, alpha_ratio, renoise)."""
    sigma_down = sigma_next * (1 + (sigma_next / sigma - 1) * eta)
    alpha_next = 1 - sigma_next
    alpha_down = 1 - sigma_down
    renoise = (sigma_next**2 - sigma_down**2 * alpha_next**2 / alpha_down**2) ** 0.5
    return sigma_down, alpha_next / alpha_down, renoise
