"""CFG++ variants of Euler, Euler ancestral, DPM-Solver++(2S) ancestral and DPM-Solver++(2M).

Chung et al. 2024, "CFG++: Manifold-constrained Classifier Free Guidance for Diffusion Models"
(arXiv:2406.08070). CFG++ keeps the guided x0 (``denoised``; ComfyUI's cfg plays the paper's
lambda) but re-noises with the *unconditional* noise estimate ``eps_u = (x - uncond) / sigma``:
DDIM becomes ``x_next = denoised + sigma_next * eps_u`` (paper Algorithm 1). The unconditional x0
comes from ``sampler_utils.denoise_with_uncond``, which evaluates the negative even at cfg = 1
(ComfyUI's ``disable_cfg1_optimization``). With cfg = 1 (uncond == cond) every variant reduces to
its base sampler. The CFG++ forms of RES multistep and gradient estimation share their base
sampler's code in ``solvers_res.py``.

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
    "sample_euler_cfg_pp",
    "sample_euler_ancestral_cfg_pp",
    "sample_dpmpp_2s_ancestral_cfg_pp",
    "sample_dpmpp_2m_cfg_pp",
]


@torch.no_grad()
def sample_euler_ancestral_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                                  noise_sampler=None, eta=1.0, s_noise=1.0):
    """Euler ancestral with CFG++ (Chung et al. 2024, Algorithm 1 with DDIM's eta noise):
    ``x_next = denoised + sigma_down * eps_u + s_noise * sigma_up * z``.

    ComfyUI defaults eta=1, s_noise=1; the last step (sigma_next = 0) returns ``denoised``.
    """
    extra_args = {} if extra_args is None else extra_args
    if eta > 0 and s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, uncond = denoise_with_uncond(model, x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta)
        x = denoised + sigma_down * (x - uncond) / sigma
        x = add_ancestral_noise(x, noise_sampler, sigma, sigma_next, sigma_up, eta, s_noise)
    return x


@torch.no_grad()
def sample_euler_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                        noise_sampler=None):
    """Euler / DDIM with CFG++ (Chung et al. 2024, Algorithm 1):
    ``x_next = denoised + sigma_next * (x - uncond) / sigma``. Deterministic (eta = 0)."""
    return sample_euler_ancestral_cfg_pp(model, x, sigmas, extra_args, callback, disable,
                                         noise_sampler=None, eta=0.0, s_noise=0.0)


@torch.no_grad()
def sample_dpmpp_2s_ancestral_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                                     noise_sampler=None, eta=1.0, s_noise=1.0):
    """DPM-Solver++(2S) ancestral (Lu et al. 2022, "DPM-Solver++", arXiv:2211.01095: single-step
    2nd order in lambda = -log sigma, midpoint r = 1/2) with CFG++ (Chung et al. 2024).

    CFG++ enters by shifting the state by the guidance vector ``denoised - uncond`` before both
    exponential-integrator updates, so their first-order part re-noises with eps_u:
    ``x_mid = (sigma_mid/sigma)(x + g) - expm1(-h/2) D``,
    ``x_down = (sigma_down/sigma)(x + g) - expm1(-h) D(x_mid)``, then ``sigma_up`` noise.
    This is the formula of ComfyUI 0.3.64 (later upstream revisions changed it). Defaults: eta=1,
    s_noise=1. A step with sigma_down = 0 returns ``denoised``.
    """
    extra_args = {} if extra_args is None else extra_args
    if eta > 0 and s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, uncond = denoise_with_uncond(model, x, sigma * s_in, **extra_args)
        sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta)
        report_step(callback, i, x, sigma, denoised)
        if sigma_down == 0:
            x = denoised
        else:
            shifted = x + (denoised - uncond)
            t = half_log_snr(sigma)
            h = half_log_snr(sigma_down) - t
            sigma_mid = (-(t + 0.5 * h)).exp()
            x_mid = (sigma_mid / sigma) * shifted - torch.expm1(-0.5 * h) * denoised
            denoised_mid = model(x_mid, sigma_mid * s_in, **extra_args)
            x = (sigma_down / sigma) * shifted - torch.expm1(-h) * denoised_mid
        x = add_ancestral_noise(x, noise_sampler, sigma, sigma_next, sigma_up, eta, s_noise)
    return x


@torch.no_grad()
def sample_dpmpp_2m_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                           noise_sampler=None):
    """DPM-Solver++(2M) (Lu et al. 2022, arXiv:2211.01095, Algorithm 2) with CFG++ (Chung et al.
    2024): the ``exp(-h) x`` part re-noises with the unconditional prediction,
    ``x_next = denoised + exp(-h) (x - uncond) - expm1(-h) / (2 r) (denoised - old_uncond)``,
    ``r = h_last / h`` (ComfyUI's formula). The first step is first order; the last (sigma_next = 0)
    returns ``denoised``. Deterministic.
    """
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    old_uncond = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, uncond = denoise_with_uncond(model, x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        if sigma_next == 0:
            x = denoised
        else:
            h = half_log_snr(sigma_next) - half_log_snr(sigma)
            x_next = denoised + torch.exp(-h) * (x - uncond)
            if old_uncond is not None:
                r = (half_log_snr(sigma) - half_log_snr(sigmas[i - 1])) / h
                x_next = x_next - torch.expm1(-h) / (2 * r) * (denoised - old_uncond)
            x = x_next
        old_uncond = uncond
    return x
