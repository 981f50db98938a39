"""Euler-family and single-step samplers: Euler, DDIM, Euler ancestral, Heun, Heun++, DPM-2
(plain and ancestral), LMS (Karras et al. 2022, "Elucidating the Design Space of
Diffusion-Based Generative Models", via k-diffusion), plus the VP-step samplers DDPM (Ho et al.
2020) and LCM (Luo et al. 2023).

Contract, registry and shared helpers: ``samplers.py`` / ``sampler_utils.py``.
"""

from __future__ import annotations

import torch

from .sampler_utils import (
    ancestral_eval,
    flow_sampling,
    karras_churn,
    lazy_noise,
    noise_or_default,
    report_step,
    rf_ancestral_step,
    to_d,
)

__all__ = [
    "sample_euler",
    "sample_ddim",
    "sample_euler_ancestral",
    "sample_heun",
    "sample_heunpp2",
    "sample_dpm_2",
    "sample_dpm_2_ancestral",
    "sample_lms",
    "sample_ddpm",
    "sample_lcm",
]


# ---------------------------------------------------------------------- Karras-style ODE


def _churned_eval(model, x, sigmas, i, s_in, extra_args, callback, churn, noise):
    """The opening of a step of Karras et al. 2022 Algorithm 2 (lines 5-7): churn σ_i up to σ̂
    (``churn`` = (s_churn, s_tmin, s_tmax, s_noise)), evaluate D(x̂, σ̂) and the ODE derivative
    there, and report the step. Returns (x̂, σ̂, denoised, d)."""
    x, sigma_hat = karras_churn(x, sigmas, i, *churn, noise)
    denoised = model(x, sigma_hat * s_in, **extra_args)
    d = to_d(x, sigma_hat, denoised)
    report_step(callback, i, x, sigmas[i], denoised, sigma_hat)
    return x, sigma_hat, denoised, d


@torch.no_grad()
def sample_euler(model, x, sigmas, extra_args=None, callback=None, disable=None,
                 noise_sampler=None, s_churn=0.0, s_tmin=0.0, s_tmax=float("inf"), s_noise=1.0):
    """Euler steps on the probability-flow ODE (Karras et al. 2022, Algorithm 2 without the
    Heun correction)."""
    extra_args = {} if extra_args is None else extra_args
    noise = lazy_noise(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        x, sigma_hat, denoised, d = _churned_eval(model, x, sigmas, i, s_in, extra_args, callback,
                                                  (s_churn, s_tmin, s_tmax, s_noise), noise)
        x = x + d * (sigmas[i + 1] - sigma_hat)
    return x


@torch.no_grad()
def sample_ddim(model, x, sigmas, extra_args=None, callback=None, disable=None,
                noise_sampler=None, **opts):
    """DDIM (Song et al. 2021, "Denoising Diffusion Implicit Models") with η = 0 is the Euler
    method on the probability-flow ODE in σ (Karras et al. 2022, sec. 4); ComfyUI's "ddim" is
    exactly ``euler`` plus a separate inpaint noise (seed + 1), which the KSampler glue handles."""
    return sample_euler(model, x, sigmas, extra_args, callback, disable, noise_sampler, **opts)


@torch.no_grad()
def sample_euler_ancestral(model, x, sigmas, extra_args=None, callback=None, disable=None,
                           noise_sampler=None, eta=1.0, s_noise=1.0):
    """Euler step to σ_down, then fresh noise of std σ_up (ancestral sampling; Ho et al. 2020 in
    k-diffusion's VE form). On a flow model the rectified-flow form (``_euler_ancestral_rf``)."""
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    if flow_sampling(model) is not None:
        return _euler_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised, sigma_down, sigma_up = ancestral_eval(model, x, sigmas, i, s_in, extra_args,
                                                        callback, eta)
        if sigma_down == 0:
            x = denoised
        else:
            d = to_d(x, sigmas[i], denoised)
            x = x + d * (sigma_down - sigmas[i])
            x = x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


def _euler_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise):
    """Euler ancestral on a flow model (ComfyUI's ``sample_euler_ancestral_RF``): the Euler move
    to σ_down is the interpolation ``(σ_down/σ) x + (1 − σ_down/σ) D``, then x is rescaled by
    α_next/α_down and renoised (``rf_ancestral_step``); the step to σ = 0 returns D."""
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        sigma_down, alpha_ratio, renoise = rf_ancestral_step(sigmas[i], sigmas[i + 1], eta)
        ratio = sigma_down / sigmas[i]
        x = ratio * x + (1 - ratio) * denoised
        if eta > 0:
            x = alpha_ratio * x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * renoise
    return x


@torch.no_grad()
def sample_heun(model, x, sigmas, extra_args=None, callback=None, disable=None,
                noise_sampler=None, s_churn=0.0, s_tmin=0.0, s_tmax=float("inf"), s_noise=1.0):
    """Heun's second-order method (Karras et al. 2022, Algorithm 2); Euler on the last step."""
    extra_args = {} if extra_args is None else extra_args
    noise = lazy_noise(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        x, sigma_hat, denoised, d = _churned_eval(model, x, sigmas, i, s_in, extra_args, callback,
                                                  (s_churn, s_tmin, s_tmax, s_noise), noise)
        dt = sigmas[i + 1] - sigma_hat
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            denoised_2 = model(x_2, sigmas[i + 1] * s_in, **extra_args)
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            x = x + (d + d_2) / 2 * dt
    return x


@torch.no_grad()
def sample_heunpp2(model, x, sigmas, extra_args=None, callback=None, disable=None,
                   noise_sampler=None, s_churn=0.0, s_tmin=0.0, s_tmax=float("inf"), s_noise=1.0):
    """Heun++ (Carzit's sd-webui-samplers-scheduler, as in ComfyUI): a three-stage Heun whose
    derivative weights depend on σ/σ_0; Heun with σ-weights on the second-last step, Euler last."""
    extra_args = {} if extra_args is None else extra_args
    noise = lazy_noise(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    s_end = sigmas[-1]
    for i in range(len(sigmas) - 1):
        x, sigma_hat, denoised, d = _churned_eval(model, x, sigmas, i, s_in, extra_args, callback,
                                                  (s_churn, s_tmin, s_tmax, s_noise), noise)
        dt = sigmas[i + 1] - sigma_hat
        if sigmas[i + 1] == s_end:
            x = x + d * dt
        elif sigmas[i + 2] == s_end:
            x_2 = x + d * dt
            denoised_2 = model(x_2, sigmas[i + 1] * s_in, **extra_args)
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            w2 = sigmas[i + 1] / (2 * sigmas[0])
            x = x + (d * (1 - w2) + d_2 * w2) * dt
        else:
            x_2 = x + d * dt
            denoised_2 = model(x_2, sigmas[i + 1] * s_in, **extra_args)
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            x_3 = x_2 + d_2 * (sigmas[i + 2] - sigmas[i + 1])
            denoised_3 = model(x_3, sigmas[i + 2] * s_in, **extra_args)
            d_3 = to_d(x_3, sigmas[i + 2], denoised_3)
            w = 3 * sigmas[0]
            w2, w3 = sigmas[i + 1] / w, sigmas[i + 2] / w
            x = x + ((1 - w2 - w3) * d + w2 * d_2 + w3 * d_3) * dt
    return x


@torch.no_grad()
def sample_dpm_2(model, x, sigmas, extra_args=None, callback=None, disable=None,
                 noise_sampler=None, s_churn=0.0, s_tmin=0.0, s_tmax=float("inf"), s_noise=1.0):
    """DPM-Solver-2 style midpoint steps in log σ (Lu et al. 2022, "DPM-Solver"; Karras et al.
    2022 Algorithm 2 framing)."""
    extra_args = {} if extra_args is None else extra_args
    noise = lazy_noise(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        x, sigma_hat, denoised, d = _churned_eval(model, x, sigmas, i, s_in, extra_args, callback,
                                                  (s_churn, s_tmin, s_tmax, s_noise), noise)
        if sigmas[i + 1] == 0:
            x = x + d * (sigmas[i + 1] - sigma_hat)
        else:
            sigma_mid = sigma_hat.log().lerp(sigmas[i + 1].log(), 0.5).exp()
            x_2 = x + d * (sigma_mid - sigma_hat)
            denoised_2 = model(x_2, sigma_mid * s_in, **extra_args)
            d_2 = to_d(x_2, sigma_mid, denoised_2)
            x = x + d_2 * (sigmas[i + 1] - sigma_hat)
    return x


@torch.no_grad()
def sample_dpm_2_ancestral(model, x, sigmas, extra_args=None, callback=None, disable=None,
                           noise_sampler=None, eta=1.0, s_noise=1.0):
    """Ancestral sampling with DPM-Solver-2 steps to σ_down (Lu et al. 2022). On a flow model
    σ_down and the renoise come from ``rf_ancestral_step`` (ComfyUI's
    ``sample_dpm_2_ancestral_RF``)."""
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    if flow_sampling(model) is not None:
        return _dpm_2_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised, sigma_down, sigma_up = ancestral_eval(model, x, sigmas, i, s_in, extra_args,
                                                        callback, eta)
        x = _dpm_2_step(model, x, sigmas[i], sigma_down, denoised, s_in, extra_args)
        if sigma_down != 0:
            x = x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


def _dpm_2_step(model, x, sigma, sigma_down, denoised, s_in, extra_args):
    """One DPM-Solver-2 step from σ to σ_down (Lu et al. 2022, the midpoint in log σ), from
    D(x, σ) = ``denoised``; an Euler step when σ_down is 0."""
    d = to_d(x, sigma, denoised)
    if sigma_down == 0:
        return x + d * (sigma_down - sigma)
    sigma_mid = sigma.log().lerp(sigma_down.log(), 0.5).exp()
    x_2 = x + d * (sigma_mid - sigma)
    denoised_2 = model(x_2, sigma_mid * s_in, **extra_args)
    d_2 = to_d(x_2, sigma_mid, denoised_2)
    return x + d_2 * (sigma_down - sigma)


def _dpm_2_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise):
    """DPM-2 ancestral on a flow model: the DPM-Solver-2 midpoint step to the flow σ_down, then
    rescale by α_next/α_down and renoise (ComfyUI's ``sample_dpm_2_ancestral_RF``)."""
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        sigma_down, alpha_ratio, renoise = rf_ancestral_step(sigmas[i], sigmas[i + 1], eta)
        report_step(callback, i, x, sigmas[i], denoised)
        x = _dpm_2_step(model, x, sigmas[i], sigma_down, denoised, s_in, extra_args)
        if sigma_down != 0:
            x = alpha_ratio * x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * renoise
    return x


def _lms_coeff(order: int, t, i: int, j: int) -> float:
    """∫_{t_i}^{t_{i+1}} of the j-th Lagrange basis polynomial through t_i, t_{i-1}, ..."""
    from scipy import integrate

    def basis(tau):
        prod = 1.0
        for k in range(order):
            if j != k:
                prod *= (tau - t[i - k]) / (t[i - j] - t[i - k])
        return prod

    return integrate.quad(basis, t[i], t[i + 1], epsrel=1e-4)[0]


@torch.no_grad()
def sample_lms(model, x, sigmas, extra_args=None, callback=None, disable=None,
               noise_sampler=None, order=4):
    """Linear multistep (Adams–Bashforth in σ with exact Lagrange integrals; Karras et al. 2022
    via k-diffusion; cf. Liu et al. 2022, "Pseudo Numerical Methods for Diffusion Models")."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    sigmas_cpu = sigmas.detach().cpu().numpy()
    ds = []
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        ds.append(to_d(x, sigmas[i], denoised))
        if len(ds) > order:
            ds.pop(0)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            cur = min(i + 1, order)
            coeffs = [_lms_coeff(cur, sigmas_cpu, i, j) for j in range(cur)]
            x = x + sum(c * d for c, d in zip(coeffs, reversed(ds)))
    return x


# ------------------------------------------------------------------- DDPM / LCM (VP steps)


@torch.no_grad()
def sample_ddpm(model, x, sigmas, extra_args=None, callback=None, disable=None,
                noise_sampler=None):
    """DDPM ancestral steps (Ho et al. 2020, Algorithm 2) between arbitrary σs, in VP space
    (x_vp = x/sqrt(1 + σ²), ᾱ = 1/(1 + σ²)), converted back after each step."""
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_prev = sigmas[i], sigmas[i + 1]
        denoised = model(x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        eps = (x - denoised) / sigma
        x_vp = x / torch.sqrt(1.0 + sigma**2.0)
        ac = 1 / (sigma * sigma + 1)
        ac_prev = 1 / (sigma_prev * sigma_prev + 1)
        alpha = ac / ac_prev
        mu = (1.0 / alpha).sqrt() * (x_vp - (1 - alpha) * eps / (1 - ac).sqrt())
        if sigma_prev > 0:
            mu = mu + ((1 - alpha) * (1.0 - ac_prev) / (1.0 - ac)).sqrt() * noise_sampler(
                sigma, sigma_prev)
        x = mu
        if sigma_prev != 0:
            x = x * torch.sqrt(1.0 + sigma_prev**2.0)
    return x


@torch.no_grad()
def sample_lcm(model, x, sigmas, extra_args=None, callback=None, disable=None,
               noise_sampler=None, s_noise=1.0, s_noise_end=None, noise_clip_std=0.0):
    """Latent Consistency Model multistep sampling (Luo et al. 2023, Algorithm 1): jump to the
    x0 prediction, then re-noise to the next σ (x = x0 + σ·n, the discrete-model noise scaling).
    ``s_noise`` → ``s_noise_end`` interpolates the noise multiplier over the steps;
    ``noise_clip_std`` clamps the noise to ±k of its std (0 = off). On a flow model the re-noise
    is the model's noise scaling σ·n + (1 − σ)·x0 (ComfyUI's ``noise_scaling`` call)."""
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    flow = flow_sampling(model)
    s_in = x.new_ones([x.shape[0]])
    n_steps = max(1, len(sigmas) - 1)
    s_start = float(s_noise)
    s_end = s_start if s_noise_end is None else float(s_noise_end)
    for i in range(n_steps):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        x = denoised
        if sigmas[i + 1] > 0:
            noise = noise_sampler(sigmas[i], sigmas[i + 1])
            if noise_clip_std > 0:
                clip = noise_clip_std * noise.std()
                noise = noise.clamp(min=-clip, max=clip)
            frac = (i / (n_steps - 1)) if n_steps > 1 else 0.0
            s_i = s_start + (s_end - s_start) * frac
            if s_i != 1.0:
                noise = noise * s_i
            if flow is not None:
                x = flow.noise_scaling(sigmas[i + 1], noise, x)
            else:
                x = x + noise * sigmas[i + 1]
    return x
