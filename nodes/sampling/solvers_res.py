"""RES multistep (Zhang, Song & Chen 2023) and gradient estimation (Permenter & Yuan 2024):
multistep samplers of ComfyUI's newer set that combine the current and the previous model
evaluation, each with its ancestral and/or CFG++ (Chung et al. 2024) forms.

VE parameterisation and ComfyUI 0.3.64 defaults as stated in ``sampler_utils``. Hand-written: no
library implements these solvers against a denoiser callable.
"""

from __future__ import annotations

import torch

from .sampler_utils import (
    add_ancestral_noise,
    denoise_with_uncond,
    get_ancestral_step,
    half_log_snr,
    noise_or_default,
    report_step,
)

__all__ = [
    "sample_res_multistep",
    "sample_res_multistep_cfg_pp",
    "sample_res_multistep_ancestral",
    "sample_res_multistep_ancestral_cfg_pp",
    "sample_gradient_estimation",
    "sample_gradient_estimation_cfg_pp",
]


def _evaluate(model, x, sigma, s_in, extra_args, cfg_pp):
    """(guided x0, the x0 the solver re-noises / extrapolates with: uncond for CFG++)."""
    if cfg_pp:
        return denoise_with_uncond(model, x, sigma * s_in, **extra_args)
    denoised = model(x, sigma * s_in, **extra_args)
    return denoised, denoised


# --- RES multistep (Zhang, Song & Chen 2023) -----------------------------------------------------


def _res_multistep(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise, cfg_pp):
    """Refined Exponential Solver, two-step multistep form: Zhang, Song & Chen 2023, "Improved order
    analysis and design of exponential integrator for diffusion models sampling" (arXiv:2308.02157).

    In t = -log sigma the probability-flow ODE is ``dx/dt = D - x``. Integrating exactly with D
    linear in t through the current and the previous evaluation gives
    ``x_next = exp(-h) x + h (b1 D_i + b2 D_{i-1})``, ``b2 = phi2(-h) / c``, ``b1 = phi1(-h) - b2``,
    ``phi1(z) = expm1(z) / z``, ``phi2(z) = (phi1(z) - 1) / z``,
    ``c = (t(sigma_{i-1}) - t(previous sigma_down)) / h`` (the previous step's span relative to
    this one; negative). The first step and a step landing on sigma_down = 0 are Euler. Ancestral
    variants step to ``sigma_down`` and add ``sigma_up`` noise (DDIM eta); CFG++ variants shift x
    by the guidance vector and extrapolate the uncond outputs.
    """
    extra_args = {} if extra_args is None else extra_args
    if eta > 0 and s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    old_base = None
    old_sigma_down = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, base = _evaluate(model, x, sigma, s_in, extra_args, cfg_pp)
        sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta)
        report_step(callback, i, x, sigma, denoised)
        if sigma_down == 0 or old_base is None:
            if cfg_pp:
                x = denoised + sigma_down * (x - base) / sigma
            else:
                x = x + (x - denoised) / sigma * (sigma_down - sigma)
        else:
            t, t_down = half_log_snr(sigma), half_log_snr(sigma_down)
            h = t_down - t
            c2 = (half_log_snr(sigmas[i - 1]) - half_log_snr(old_sigma_down)) / h
            phi1 = torch.expm1(-h) / -h
            phi2 = (phi1 - 1.0) / -h
            b1 = torch.nan_to_num(phi1 - phi2 / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2 / c2, nan=0.0)
            if cfg_pp:
                x = x + (denoised - base)
            x = torch.exp(-h) * x + h * (b1 * base + b2 * old_base)
        x = add_ancestral_noise(x, noise_sampler, sigma, sigma_next, sigma_up, eta, s_noise)
        old_base = base
        old_sigma_down = sigma_down
    return x


@torch.no_grad()
def sample_res_multistep(model, x, sigmas, extra_args=None, callback=None, disable=None,
                         noise_sampler=None, s_noise=1.0):
    """RES two-step multistep (Zhang, Song & Chen 2023, arXiv:2308.02157), deterministic (eta = 0).
    See ``_res_multistep``."""
    return _res_multistep(model, x, sigmas, extra_args, callback, noise_sampler, 0.0, s_noise,
                          cfg_pp=False)


@torch.no_grad()
def sample_res_multistep_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                                noise_sampler=None, s_noise=1.0):
    """RES multistep (Zhang, Song & Chen 2023) with CFG++ (Chung et al. 2024); deterministic."""
    return _res_multistep(model, x, sigmas, extra_args, callback, noise_sampler, 0.0, s_noise,
                          cfg_pp=True)


@torch.no_grad()
def sample_res_multistep_ancestral(model, x, sigmas, extra_args=None, callback=None, disable=None,
                                   noise_sampler=None, eta=1.0, s_noise=1.0):
    """RES multistep (Zhang, Song & Chen 2023) with ancestral noise; ComfyUI defaults eta=1,
    s_noise=1."""
    return _res_multistep(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise,
                          cfg_pp=False)


@torch.no_grad()
def sample_res_multistep_ancestral_cfg_pp(model, x, sigmas, extra_args=None, callback=None,
                                          disable=None, noise_sampler=None, eta=1.0, s_noise=1.0):
    """RES multistep ancestral (Zhang, Song & Chen 2023) with CFG++ (Chung et al. 2024); ComfyUI
    defaults eta=1, s_noise=1."""
    return _res_multistep(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise,
                          cfg_pp=True)


# --- gradient estimation (Permenter & Yuan 2024) -------------------------------------------------


@torch.no_grad()
def sample_gradient_estimation(model, x, sigmas, extra_args=None, callback=None, disable=None,
                               noise_sampler=None, ge_gamma=2.0, cfg_pp=False):
    """Gradient-estimation sampler: Permenter & Yuan 2024, "Interpreting and Improving Diffusion
    Models from an Optimization Perspective" (ICML 2024, arXiv:2306.04848), Algorithm 2.

    Euler steps whose direction is ``d_bar = gamma d_i + (1 - gamma) d_{i-1}`` from the second step
    on (``d = (x - denoised) / sigma``); ComfyUI default ``ge_gamma = 2.0``. The last step
    (sigma_next = 0) returns ``denoised``. ``cfg_pp=True`` takes ``d`` from the unconditional
    prediction and the Euler part as ``denoised + sigma_next * d`` (Chung et al. 2024).
    Deterministic.
    """
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    old_d = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, base = _evaluate(model, x, sigma, s_in, extra_args, cfg_pp)
        d = (x - base) / sigma
        report_step(callback, i, x, sigma, denoised)
        dt = sigma_next - sigma
        if sigma_next == 0:
            x = denoised
        else:
            x = denoised + d * sigma_next if cfg_pp else x + d * dt
            if old_d is not None:
                x = x + (ge_gamma - 1) * (d - old_d) * dt
        old_d = d
    return x


@torch.no_grad()
def sample_gradient_estimation_cfg_pp(model, x, sigmas, extra_args=None, callback=None,
                                      disable=None, noise_sampler=None, ge_gamma=2.0):
    """Gradient estimation (Permenter & Yuan 2024) with CFG++ (Chung et al. 2024); ge_gamma=2."""
    return sample_gradient_estimation(model, x, sigmas, extra_args, callback, disable,
                                      ge_gamma=ge_gamma, cfg_pp=True)
