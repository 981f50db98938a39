"""DPM-Solver++ (Lu et al. 2022b, "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion
Probabilistic Models"): 2S ancestral, the single-step SDE, 2M, and the 2M/3M SDE multistep
variants, with their ``*_gpu`` twins (Brownian tree on x's device).

On flow-matching models (ComfyUI's CONST) 2S ancestral takes its rectified-flow form and the
SDE samplers work in the flow half-log-SNR λ = log((1 − σ)/σ) with α = 1 − σ (``snr_fns``), the
first sigma moved off σ = 1 (``offset_first_sigma_for_snr``), as ComfyUI. 2M runs its VE form on
every model, as ComfyUI's.

Contract, registry and shared helpers: ``samplers.py`` / ``sampler_utils.py``.
"""

from __future__ import annotations

import torch

from .noise import brownian_noise_sampler
from .sampler_utils import (
    ancestral_eval,
    flow_sampling,
    get_ancestral_step,
    noise_or_default,
    offset_first_sigma_for_snr,
    report_step,
    rf_ancestral_step,
    seed_of,
    snr_fns,
    to_d,
)

__all__ = [
    "sample_dpmpp_2s_ancestral",
    "sample_dpmpp_sde",
    "sample_dpmpp_sde_gpu",
    "sample_dpmpp_2m",
    "sample_dpmpp_2m_sde",
    "sample_dpmpp_2m_sde_gpu",
    "sample_dpmpp_2m_sde_heun",
    "sample_dpmpp_2m_sde_heun_gpu",
    "sample_dpmpp_3m_sde",
    "sample_dpmpp_3m_sde_gpu",
]


@torch.no_grad()
def sample_dpmpp_2s_ancestral(model, x, sigmas, extra_args=None, callback=None, disable=None,
                              noise_sampler=None, eta=1.0, s_noise=1.0):
    """Ancestral DPM-Solver++(2S) (Lu et al. 2022b, "DPM-Solver++: Fast Solver for Guided
    Sampling of Diffusion Probabilistic Models", Algorithm 1) to σ_down, then σ_up noise. On a
    flow model the rectified-flow form (``_dpmpp_2s_ancestral_rf``)."""
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    if flow_sampling(model) is not None:
        return _dpmpp_2s_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta,
                                      s_noise)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised, sigma_down, sigma_up = ancestral_eval(model, x, sigmas, i, s_in, extra_args,
                                                        callback, eta)
        if sigma_down == 0:
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            t, t_next = -sigmas[i].log(), -sigma_down.log()
            h = t_next - t
            s = t + 0.5 * h
            x_2 = ((-s).exp() / (-t).exp()) * x - (-h * 0.5).expm1() * denoised
            denoised_2 = model(x_2, (-s).exp() * s_in, **extra_args)
            x = ((-t_next).exp() / (-t).exp()) * x - (-h).expm1() * denoised_2
        if sigmas[i + 1] > 0:
            x = x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


def _dpmpp_2s_ancestral_rf(model, x, sigmas, extra_args, callback, noise_sampler, eta, s_noise):
    """DPM-Solver++(2S) ancestral on a flow model (ComfyUI's ``sample_dpmpp_2s_ancestral_RF``):
    the midpoint σ_s is taken halfway in λ = log((1 − σ)/σ) between σ and the flow σ_down
    (0.9999 when σ = 1, where λ is infinite); both stages are flow interpolations
    ``(σ'/σ) x + (1 − σ'/σ) D``; then rescale by α_next/α_down and renoise
    (``rf_ancestral_step``)."""
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        sigma_down, alpha_ratio, renoise = rf_ancestral_step(sigmas[i], sigmas[i + 1], eta)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            if sigmas[i] == 1.0:
                sigma_s = 0.9999
            else:
                t_i, t_down = ((1 - sigmas[i]) / sigmas[i]).log(), ((1 - sigma_down) / sigma_down).log()
                sigma_s = ((t_i + 0.5 * (t_down - t_i)).exp() + 1) ** -1
            ratio_s = sigma_s / sigmas[i]
            u = ratio_s * x + (1 - ratio_s) * denoised
            denoised_2 = model(u, sigma_s * s_in, **extra_args)
            ratio_down = sigma_down / sigmas[i]
            x = ratio_down * x + (1 - ratio_down) * denoised_2
        if sigmas[i + 1] > 0 and eta > 0:
            x = alpha_ratio * x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * renoise
    return x


def _sde_noise(x, sigmas, extra_args, noise_sampler, cpu):
    if noise_sampler is not None:
        return noise_sampler
    return brownian_noise_sampler(x, sigmas, seed_of(extra_args), cpu=cpu)


@torch.no_grad()
def sample_dpmpp_sde(model, x, sigmas, extra_args=None, callback=None, disable=None,
                     noise_sampler=None, eta=1.0, s_noise=1.0, r=1 / 2, cpu=True):
    """DPM-Solver++ stochastic single-step, two stages at λ_s + r·h (Lu et al. 2022b;
    k-diffusion's SDE variant), Brownian-tree noise so results do not depend on step count."""
    if len(sigmas) <= 1:
        return x
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = _sde_noise(x, sigmas, extra_args, noise_sampler, cpu)
    flow = flow_sampling(model)
    lambda_fn, sigma_fn = snr_fns(flow is not None)
    sigmas = offset_first_sigma_for_snr(sigmas, flow)
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        lambda_s, lambda_t = lambda_fn(sigmas[i]), lambda_fn(sigmas[i + 1])
        h = lambda_t - lambda_s
        lambda_s_1 = lambda_s + r * h
        fac = 1 / (2 * r)
        sigma_s_1 = sigma_fn(lambda_s_1)
        alpha_s = sigmas[i] * lambda_s.exp()
        alpha_s_1 = sigma_s_1 * lambda_s_1.exp()
        alpha_t = sigmas[i + 1] * lambda_t.exp()
        # stage 1
        sd, su = get_ancestral_step((-lambda_s).exp(), (-lambda_s_1).exp(), eta)
        h_ = -sd.log() - lambda_s
        x_2 = (alpha_s_1 / alpha_s) * (-h_).exp() * x - alpha_s_1 * (-h_).expm1() * denoised
        if eta > 0 and s_noise > 0:
            x_2 = x_2 + alpha_s_1 * noise_sampler(sigmas[i], sigma_s_1) * s_noise * su
        denoised_2 = model(x_2, sigma_s_1 * s_in, **extra_args)
        # stage 2
        sd, su = get_ancestral_step((-lambda_s).exp(), (-lambda_t).exp(), eta)
        h_ = -sd.log() - lambda_s
        denoised_d = (1 - fac) * denoised + fac * denoised_2
        x = (alpha_t / alpha_s) * (-h_).exp() * x - alpha_t * (-h_).expm1() * denoised_d
        if eta > 0 and s_noise > 0:
            x = x + alpha_t * noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * su
    return x


@torch.no_grad()
def sample_dpmpp_2m(model, x, sigmas, extra_args=None, callback=None, disable=None,
                    noise_sampler=None):
    """DPM-Solver++(2M) (Lu et al. 2022b, Algorithm 2): second-order multistep in log σ."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        t, t_next = -sigmas[i].log(), -sigmas[i + 1].log()
        h = t_next - t
        ratio = (-t_next).exp() / (-t).exp()
        if old_denoised is None or sigmas[i + 1] == 0:
            x = ratio * x - (-h).expm1() * denoised
        else:
            r = (t - (-sigmas[i - 1].log())) / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = ratio * x - (-h).expm1() * denoised_d
        old_denoised = denoised
    return x


def _sde_first_order(x, denoised, sigma, sigma_next, eta, lambda_fn):
    """The first-order part of a DPM-Solver++ multistep SDE step σ → σ_next (data prediction,
    λ = ``lambda_fn(σ)``: −log σ, or log((1 − σ)/σ) on a flow model; h = λ_next − λ):
    ``x ← (σ_next/σ) e^{−ηh} x + α_t (1 − e^{−(1+η)h}) D`` with α_t = σ_next e^{λ_next}.
    Returns (x, h, (1+η)h, α_t) for the higher-order corrections."""
    lambda_s, lambda_t = lambda_fn(sigma), lambda_fn(sigma_next)
    h = lambda_t - lambda_s
    h_eta = h * (eta + 1)
    alpha_t = sigma_next * lambda_t.exp()
    x = (sigma_next / sigma * (-h * eta).exp() * x
         + alpha_t * (-h_eta).expm1().neg() * denoised)
    return x, h, h_eta, alpha_t


def _sde_add_noise(x, noise_sampler, sigma, sigma_next, h, eta, s_noise):
    """The multistep SDE step's noise, std ``σ_next sqrt(1 − e^{−2ηh}) s_noise`` (none when η or
    s_noise is 0)."""
    if eta > 0 and s_noise > 0:
        x = x + (noise_sampler(sigma, sigma_next) * sigma_next
                 * (-2 * h * eta).expm1().neg().sqrt() * s_noise)
    return x


@torch.no_grad()
def sample_dpmpp_2m_sde(model, x, sigmas, extra_args=None, callback=None, disable=None,
                        noise_sampler=None, eta=1.0, s_noise=1.0, solver_type="midpoint",
                        cpu=True):
    """DPM-Solver++(2M) SDE (Lu et al. 2022b, sec. 5 / appendix; k-diffusion), midpoint or heun
    second-order correction, Brownian-tree noise."""
    if len(sigmas) <= 1:
        return x
    if solver_type not in {"heun", "midpoint"}:
        raise ValueError("solver_type must be 'heun' or 'midpoint'")
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = _sde_noise(x, sigmas, extra_args, noise_sampler, cpu)
    flow = flow_sampling(model)
    lambda_fn = snr_fns(flow is not None)[0]
    sigmas = offset_first_sigma_for_snr(sigmas, flow)
    s_in = x.new_ones([x.shape[0]])
    old_denoised, h, h_last = None, None, None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            x, h, h_eta, alpha_t = _sde_first_order(x, denoised, sigmas[i], sigmas[i + 1], eta,
                                                      lambda_fn)
            if old_denoised is not None:
                r = h_last / h
                if solver_type == "heun":
                    x = x + alpha_t * ((-h_eta).expm1().neg() / (-h_eta) + 1) * (1 / r) * (
                        denoised - old_denoised)
                else:
                    x = x + 0.5 * alpha_t * (-h_eta).expm1().neg() * (1 / r) * (
                        denoised - old_denoised)
            x = _sde_add_noise(x, noise_sampler, sigmas[i], sigmas[i + 1], h, eta, s_noise)
        old_denoised = denoised
        h_last = h
    return x


@torch.no_grad()
def sample_dpmpp_3m_sde(model, x, sigmas, extra_args=None, callback=None, disable=None,
                        noise_sampler=None, eta=1.0, s_noise=1.0, cpu=True):
    """DPM-Solver++(3M) SDE (Lu et al. 2022b third-order multistep; k-diffusion)."""
    if len(sigmas) <= 1:
        return x
    extra_args = {} if extra_args is None else extra_args
    noise_sampler = _sde_noise(x, sigmas, extra_args, noise_sampler, cpu)
    flow = flow_sampling(model)
    lambda_fn = snr_fns(flow is not None)[0]
    sigmas = offset_first_sigma_for_snr(sigmas, flow)
    s_in = x.new_ones([x.shape[0]])
    denoised_1 = denoised_2 = None
    h = h_1 = h_2 = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            x, h, h_eta, alpha_t = _sde_first_order(x, denoised, sigmas[i], sigmas[i + 1], eta,
                                                      lambda_fn)
            if h_2 is not None:
                r0, r1 = h_1 / h, h_2 / h
                d1_0 = (denoised - denoised_1) / r0
                d1_1 = (denoised_1 - denoised_2) / r1
                d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
                d2 = (d1_0 - d1_1) / (r0 + r1)
                phi_2 = h_eta.neg().expm1() / h_eta + 1
                phi_3 = phi_2 / h_eta - 0.5
                x = x + (alpha_t * phi_2) * d1 - (alpha_t * phi_3) * d2
            elif h_1 is not None:
                d = (denoised - denoised_1) / (h_1 / h)
                phi_2 = h_eta.neg().expm1() / h_eta + 1
                x = x + (alpha_t * phi_2) * d
            x = _sde_add_noise(x, noise_sampler, sigmas[i], sigmas[i + 1], h, eta, s_noise)
        denoised_1, denoised_2 = denoised, denoised_1
        h_1, h_2 = h, h_1
    return x


def _gpu_variant(fn, doc_name):
    def sample(model, x, sigmas, extra_args=None, callback=None, disable=None,
               noise_sampler=None, **opts):
        opts["cpu"] = False
        return fn(model, x, sigmas, extra_args, callback, disable, noise_sampler, **opts)

    sample.__doc__ = (f"{doc_name} with its Brownian tree on x's device (cpu=False), as "
                      f"ComfyUI's *_gpu samplers; seeded results then depend on the device.")
    return sample


sample_dpmpp_sde_gpu = _gpu_variant(sample_dpmpp_sde, "dpmpp_sde")
sample_dpmpp_2m_sde_gpu = _gpu_variant(sample_dpmpp_2m_sde, "dpmpp_2m_sde")
sample_dpmpp_3m_sde_gpu = _gpu_variant(sample_dpmpp_3m_sde, "dpmpp_3m_sde")


@torch.no_grad()
def sample_dpmpp_2m_sde_heun(model, x, sigmas, extra_args=None, callback=None, disable=None,
                             noise_sampler=None, eta=1.0, s_noise=1.0, cpu=True):
    """DPM-Solver++(2M) SDE with the heun-type second-order term."""
    return sample_dpmpp_2m_sde(model, x, sigmas, extra_args, callback, disable, noise_sampler,
                               eta=eta, s_noise=s_noise, solver_type="heun", cpu=cpu)


sample_dpmpp_2m_sde_heun_gpu = _gpu_variant(sample_dpmpp_2m_sde_heun, "dpmpp_2m_sde_heun")
