"""Exponential-integrator SDE solvers: ER-SDE-Solver-3 (Cui et al. 2023), SEEDS-2/3 (Gonzalez et
al. 2023) and the exponential Heun samplers ComfyUI builds on SEEDS-2 (``exp_heun_2_x0``,
``exp_heun_2_x0_sde``). The DPM-Solver++ SDE samplers live in ``solvers_dpmpp.py``.

VE parameterisation and ComfyUI 0.3.64 defaults as stated in ``sampler_utils``. ComfyUI runs
these on flow-matching models with alpha = 1 - sigma; that branch is not written here yet, so
each refuses a flow model (``refuse_flow``) rather than run the VE formulas on it.
Hand-written: no library implements these solvers against a denoiser callable.
"""

from __future__ import annotations

import torch

from .sampler_utils import half_log_snr, noise_or_default, refuse_flow, report_step

__all__ = [
    "er_sde_default_noise_scaler",
    "sample_er_sde",
    "sample_exp_heun_2_x0",
    "sample_exp_heun_2_x0_sde",
    "sample_seeds_2",
    "sample_seeds_3",
]


# --- ER-SDE (Cui et al. 2023) --------------------------------------------------------------------


def er_sde_default_noise_scaler(lam: torch.Tensor) -> torch.Tensor:
    """ER-SDE's default noise-scale function ``phi(l) = l * (exp(l ** 0.3) + 10)`` (the paper's
    "ER SDE 5", ComfyUI's default)."""
    return lam * (torch.exp(lam**0.3) + 10.0)


@torch.no_grad()
def sample_er_sde(model, x, sigmas, extra_args=None, callback=None, disable=None,
                  noise_sampler=None, s_noise=1.0, noise_scaler=None, max_stage=3):
    """Extended reverse-time SDE solver, ER-SDE-Solver-3: Cui et al. 2023, "Elucidating the solution
    space of extended reverse-time SDE for diffusion models" (arXiv:2309.06169), data prediction.

    With lambda = sigma / alpha = sigma and noise-scale function ``phi`` (default
    ``er_sde_default_noise_scaler``), one step is
    ``x_t = r x_s + (1 - r) D + sum_k c_k D^(k) + sqrt(l_t^2 - l_s^2 r^2) z``,
    ``r = phi(l_t) / phi(l_s)``, with the 1st/2nd derivative terms (stages 2/3, from the
    second/third step on) using
    ``c_1 = (l_t - l_s) + phi(l_t) * int_{l_t}^{l_s} dl / phi(l)`` and
    ``c_2 = (l_t - l_s)^2 / 2 + phi(l_t) * int (l - l_s) / phi(l) dl``; the integrals are 200-point
    left Riemann sums from l_t, as in ComfyUI and the reference code. Derivatives are backward
    differences of past denoised outputs. ComfyUI defaults: s_noise=1, max_stage=3. The last step
    returns ``denoised``.
    """
    refuse_flow(model, "er_sde")
    extra_args = {} if extra_args is None else extra_args
    if s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    scaler = er_sde_default_noise_scaler if noise_scaler is None else noise_scaler
    n_points = 200
    point_index = torch.arange(n_points, dtype=sigmas.dtype, device=sigmas.device)
    s_in = x.new_ones([x.shape[0]])
    old_denoised = None
    old_denoised_d = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        stage = min(max_stage, i + 1)
        if sigma_next == 0:
            x = denoised
        else:
            lam_s, lam_t = sigma, sigma_next
            r = scaler(lam_t) / scaler(lam_s)
            x = r * x + (1 - r) * denoised
            if stage >= 2:
                dl = lam_t - lam_s
                step = -dl / n_points
                lam_pos = lam_t + point_index * step
                scaled = scaler(lam_pos)
                int_1 = torch.sum(1 / scaled) * step
                denoised_d = (denoised - old_denoised) / (lam_s - sigmas[i - 1])
                x = x + (dl + int_1 * scaler(lam_t)) * denoised_d
                if stage >= 3:
                    int_u = torch.sum((lam_pos - lam_s) / scaled) * step
                    denoised_u = (denoised_d - old_denoised_d) / ((lam_s - sigmas[i - 2]) / 2)
                    x = x + (dl**2 / 2 + int_u * scaler(lam_t)) * denoised_u
                old_denoised_d = denoised_d
            if s_noise > 0:
                noise_std = (lam_t**2 - lam_s**2 * r**2).sqrt().nan_to_num(nan=0.0)
                x = x + noise_sampler(sigma, sigma_next) * (s_noise * noise_std)
        old_denoised = denoised
    return x


# --- SEEDS (Gonzalez et al. 2023) ----------------------------------------------------------------
#
# Gonzalez, Perez, Ostermann, et al. 2023, "SEEDS: Exponential SDE Solvers for Fast High-Quality
# Sampling from Diffusion Models" (NeurIPS 2023, arXiv:2305.14267), data-prediction form. In
# lambda = -log sigma the SDE with strength eta has the exact linear part
# ``x_t = (sigma_t/sigma_s) e^{-eta h} x_s - expm1(-(1+eta) h) D
#        + sigma_t sqrt(-expm1(-2 eta h)) z``.
# Stages share one Brownian path: the noise of a later stage carries the earlier stage's noise
# (decayed by exp((r_a - r_b) eta h)) plus a fresh increment.


def _h_phi_1(z: torch.Tensor) -> torch.Tensor:
    return torch.expm1(z)


def _h_phi_2(z: torch.Tensor) -> torch.Tensor:
    return (torch.expm1(z) - z) / z


def _seeds_move(x, sigma_from, sigma_to, eta_span, weighted_d):
    """Deterministic part of a SEEDS stage: ``(sigma_to/sigma_from) e^{-eta_span} x - weighted_d``,
    where ``eta_span`` is eta times the stage's lambda span and ``weighted_d`` the (negative-signed)
    exponential-integrator combination of denoised outputs."""
    return (sigma_to / sigma_from) * torch.exp(-eta_span) * x - weighted_d


def _seeds_first_stage(x, denoised, sigma, sigma_1, r, h, h_eta, eta, s_noise, noise):
    """SEEDS stage 1, sigma -> sigma_1 at lambda_s + r h: the first-order exponential move plus
    the first increment ``w`` of the step's Brownian path (``noise`` None: no noise, ``w`` None).
    Returns (x_1, w)."""
    x_1 = _seeds_move(x, sigma, sigma_1, r * h * eta, _h_phi_1(-r * h_eta) * denoised)
    w = None
    if noise is not None:
        w = (-torch.expm1(-2 * r * h * eta)).sqrt() * noise(sigma, sigma_1)
        x_1 = x_1 + w * (sigma_1 * s_noise)
    return x_1, w


def _seeds_later_noise(x, w, seg, noise, sigma_from, sigma_to, s_noise):
    """A later SEEDS stage's noise on the same Brownian path: the earlier increment ``w`` decayed
    by ``exp(seg)`` (``seg`` = eta times the negative lambda span between the stages) plus a fresh
    increment. Returns (x, w); both unchanged when ``noise`` is None."""
    if noise is None:
        return x, w
    w = w * seg.exp() + (-torch.expm1(2 * seg)).sqrt() * noise(sigma_from, sigma_to)
    return x + w * (sigma_to * s_noise), w


@torch.no_grad()
def sample_seeds_2(model, x, sigmas, extra_args=None, callback=None, disable=None,
                   noise_sampler=None, eta=1.0, s_noise=1.0, r=0.5, solver_type="phi_1"):
    """SEEDS-2 (Gonzalez et al. 2023, arXiv:2305.14267), two stages per step, the intermediate one
    at ``lambda_s + r h``. ComfyUI defaults: eta=1, s_noise=1, r=0.5, solver_type="phi_1"
    (``phi_1``: final update with ``lerp(D_s, D_mid, 1/(2r))``; ``phi_2``: weights
    ``b2 = h*phi2(-(1+eta)h)/r``, ``b1 = h*phi1 - b2``). eta=0 gives a deterministic exponential
    2nd-order solver. The last step returns ``denoised``.
    """
    if solver_type not in ("phi_1", "phi_2"):
        raise ValueError(f"seeds_2: solver_type must be 'phi_1' or 'phi_2', got {solver_type!r}")
    refuse_flow(model, "seeds_2")
    extra_args = {} if extra_args is None else extra_args
    noise = noise_or_default(x, extra_args, noise_sampler) if eta > 0 and s_noise > 0 else None
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        lam_s, lam_t = half_log_snr(sigma), half_log_snr(sigma_next)
        h = lam_t - lam_s
        h_eta = h * (eta + 1)
        sigma_1 = (-torch.lerp(lam_s, lam_t, r)).exp()

        x_1, w = _seeds_first_stage(x, denoised, sigma, sigma_1, r, h, h_eta, eta, s_noise, noise)
        denoised_1 = model(x_1, sigma_1 * s_in, **extra_args)

        if solver_type == "phi_1":
            combo = _h_phi_1(-h_eta) * torch.lerp(denoised, denoised_1, 1 / (2 * r))
        else:
            b2 = _h_phi_2(-h_eta) / r
            b1 = _h_phi_1(-h_eta) - b2
            combo = b1 * denoised + b2 * denoised_1
        x = _seeds_move(x, sigma, sigma_next, h * eta, combo)
        x, w = _seeds_later_noise(x, w, (r - 1) * h * eta, noise, sigma_1, sigma_next, s_noise)
    return x


@torch.no_grad()
def sample_exp_heun_2_x0(model, x, sigmas, extra_args=None, callback=None, disable=None,
                         solver_type="phi_2"):
    """Deterministic exponential Heun, 2nd order, in data prediction and log-SNR time: ComfyUI's
    ``exp_heun_2_x0``, which is SEEDS-2 with its intermediate stage at the end of the step
    (r = 1) and no noise (eta = 0, s_noise = 0); ``solver_type`` "phi_2" by default: the
    two-stage exponential Runge-Kutta method with c2 = 1 (Gonzalez et al. 2023, arXiv:2305.14267,
    the deterministic limit of SEEDS-2), second order in the step."""
    refuse_flow(model, "exp_heun_2_x0")
    return sample_seeds_2(model, x, sigmas, extra_args=extra_args, callback=callback,
                          disable=disable, noise_sampler=None, eta=0.0, s_noise=0.0, r=1.0,
                          solver_type=solver_type)


@torch.no_grad()
def sample_exp_heun_2_x0_sde(model, x, sigmas, extra_args=None, callback=None, disable=None,
                             noise_sampler=None, eta=1.0, s_noise=1.0, solver_type="phi_2"):
    """Stochastic exponential Heun (ComfyUI's ``exp_heun_2_x0_sde``): SEEDS-2 with r = 1 and
    ``solver_type`` "phi_2" by default; ComfyUI defaults eta=1, s_noise=1. The step's Brownian
    increment is drawn at its first stage (sigma -> sigma_next); the second draw, over an empty
    span, is weighted 0 but still taken, as in ComfyUI, so the noise stream stays aligned."""
    refuse_flow(model, "exp_heun_2_x0_sde")
    return sample_seeds_2(model, x, sigmas, extra_args=extra_args, callback=callback,
                          disable=disable, noise_sampler=noise_sampler, eta=eta, s_noise=s_noise,
                          r=1.0, solver_type=solver_type)


@torch.no_grad()
def sample_seeds_3(model, x, sigmas, extra_args=None, callback=None, disable=None,
                   noise_sampler=None, eta=1.0, s_noise=1.0, r_1=1.0 / 3, r_2=2.0 / 3):
    """SEEDS-3 (Gonzalez et al. 2023, arXiv:2305.14267), three stages per step at
    ``lambda_s + r_1 h`` and ``lambda_s + r_2 h``. ComfyUI defaults: eta=1, s_noise=1, r_1=1/3,
    r_2=2/3. Stage 2 weights ``a2 = (r_2/r_1) h*phi2(-r_2 (1+eta) h)``, ``a1 = h*phi1 - a2``; final
    ``b3 = h*phi2(-(1+eta)h)/r_2``, ``b1 = h*phi1 - b3``. The last step returns ``denoised``.
    """
    refuse_flow(model, "seeds_3")
    extra_args = {} if extra_args is None else extra_args
    noise = noise_or_default(x, extra_args, noise_sampler) if eta > 0 and s_noise > 0 else None
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        lam_s, lam_t = half_log_snr(sigma), half_log_snr(sigma_next)
        h = lam_t - lam_s
        h_eta = h * (eta + 1)
        sigma_1 = (-torch.lerp(lam_s, lam_t, r_1)).exp()
        sigma_2 = (-torch.lerp(lam_s, lam_t, r_2)).exp()

        x_1, w = _seeds_first_stage(x, denoised, sigma, sigma_1, r_1, h, h_eta, eta, s_noise,
                                    noise)
        denoised_1 = model(x_1, sigma_1 * s_in, **extra_args)

        a2 = r_2 / r_1 * _h_phi_2(-r_2 * h_eta)
        a1 = _h_phi_1(-r_2 * h_eta) - a2
        x_2 = _seeds_move(x, sigma, sigma_2, r_2 * h * eta, a1 * denoised + a2 * denoised_1)
        x_2, w = _seeds_later_noise(x_2, w, (r_1 - r_2) * h * eta, noise, sigma_1, sigma_2,
                                    s_noise)
        denoised_2 = model(x_2, sigma_2 * s_in, **extra_args)

        b3 = _h_phi_2(-h_eta) / r_2
        b1 = _h_phi_1(-h_eta) - b3
        x = _seeds_move(x, sigma, sigma_next, h * eta, b1 * denoised + b3 * denoised_2)
        x, w = _seeds_later_noise(x, w, (r_2 - 1) * h * eta, noise, sigma_2, sigma_next, s_noise)
    return x
