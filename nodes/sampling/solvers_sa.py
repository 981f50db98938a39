"""SA-Solver, the stochastic Adams predictor-corrector (Xue et al. 2023), in its PEC and PECE
modes, with its coefficient and tau-schedule helpers.

VE parameterisation and ComfyUI 0.3.64 defaults as stated in ``sampler_utils``; a flow-matching
model is refused (``refuse_flow``: its alpha = 1 - sigma branch is not written yet). Hand-written:
no library implements these solvers against a denoiser callable.
"""

from __future__ import annotations

import math

import torch

from .sampler_utils import half_log_snr, noise_or_default, refuse_flow, report_step
from .schedules import DiscreteSchedule

__all__ = [
    "sa_solver_b_coeffs",
    "sa_solver_tau_interval",
    "sa_solver_default_tau",
    "sample_sa_solver",
    "sample_sa_solver_pece",
]


# --- SA-Solver (Xue et al. 2023) -----------------------------------------------------------------
#
# Xue, Yi, Liu, et al. 2023, "SA-Solver: Stochastic Adams Solver for Fast Sampling of Diffusion
# Models" (NeurIPS 2023, arXiv:2309.05019), data prediction, constant tau on each step. In
# lambda = -log sigma:
#   x_t = (sigma_t/sigma_s) e^{-tau^2 h} x_s + sum_j b_j D_j + sigma_t sqrt(-expm1(-2 tau^2 h)) z,
#   b_j = alpha_t (1 + tau^2) int_{lambda_s}^{lambda_t} e^{(1+tau^2)(l - lambda_t)} L_j(l) dl
# (paper eqs. 15 and 18), L_j the Lagrange basis through the lambdas of the past evaluations used.
# The predictor extrapolates from the last ``predictor_order`` evaluations; the corrector re-does
# the previous step with the new evaluation included (``corrector_order`` points, same tau and
# noise).


def sa_solver_b_coeffs(nodes: torch.Tensor, lam_s: torch.Tensor, lam_t: torch.Tensor, tau: float,
                       sigma_t: torch.Tensor) -> torch.Tensor:
    """SA-Solver weights ``b_j`` for denoised outputs evaluated at half-log-SNRs ``nodes`` [K] for a
    step from ``lam_s`` to ``lam_t``. Computed in float64 with the variable shifted to
    ``u = l - lam_t`` (interval [-h, 0]); moments ``m_p = k int e^{k u} u^p du`` follow
    ``m_0 = -expm1(-k h)``, ``m_p = -e^{-k h} (-h)^p - (p/k) m_{p-1}`` (integration by parts),
    and ``V^T b = m`` (V the Vandermonde matrix of the nodes) turns moments into Lagrange weights.
    """
    k = 1.0 + tau**2
    h = float(lam_t - lam_s)
    u = (nodes.double() - float(lam_t)).cpu()
    n = u.shape[0]
    decay = math.exp(-k * h)
    moments = [-math.expm1(-k * h)]
    for p in range(1, n):
        moments.append(-decay * (-h) ** p - (p / k) * moments[-1])
    vander = torch.vander(u, n, increasing=True)  # [K, K]: vander[j, p] = u_j ** p
    weights = torch.linalg.solve(vander.T, torch.tensor(moments, dtype=torch.float64))
    alpha_t = float(sigma_t) * math.exp(float(lam_t))  # = 1 in the VE parameterisation
    return (alpha_t * weights).to(device=nodes.device, dtype=nodes.dtype)


def _sa_simple_order_2_coeffs(nodes, lam_s, lam_t, tau, sigma_t, corrector):
    """The simplified order-2 weights of SA-Solver's Appendix D (older evaluation first)."""
    k = 1.0 + tau**2
    h = lam_t - lam_s
    alpha_t = sigma_t * lam_t.exp()
    first_order = alpha_t * -torch.expm1(-k * h)
    if corrector:
        b_new = alpha_t * (0.5 * k * h)
        return torch.stack([first_order - b_new, b_new])
    b_old = alpha_t * (0.5 * k * h**2) / (nodes[-2] - lam_s)
    return torch.stack([b_old, first_order - b_old])


def sa_solver_tau_interval(start_sigma: float, end_sigma: float, eta: float = 1.0):
    """SA-Solver's stochasticity schedule: ``tau = eta`` while
    ``end_sigma <= sigma <= start_sigma``, 0 (pure ODE) elsewhere. The paper's README gives the
    interval in time; ComfyUI uses sigma."""

    def tau(sigma) -> float:
        if eta <= 0:
            return 0.0
        return eta if start_sigma >= float(sigma) >= end_sigma else 0.0

    return tau


def sa_solver_default_tau(schedule: DiscreteSchedule | None = None):
    """ComfyUI's default: tau = 1 between the sigmas at 20% and 80% of the model's discrete
    schedule (``percent_to_sigma``; about 5.09 and 0.571 for the standard SD1/SD2/SDXL schedule,
    used when ``schedule`` is None)."""
    schedule = DiscreteSchedule() if schedule is None else schedule
    return sa_solver_tau_interval(schedule.percent_to_sigma(0.2), schedule.percent_to_sigma(0.8),
                                  eta=1.0)


@torch.no_grad()
def sample_sa_solver(model, x, sigmas, extra_args=None, callback=None, disable=None,
                     noise_sampler=None, tau_func=None, s_noise=1.0, predictor_order=3,
                     corrector_order=4, use_pece=False, simple_order_2=False):
    """SA-Solver, stochastic Adams predictor-corrector (Xue et al. 2023, arXiv:2309.05019).

    ComfyUI defaults: predictor_order=3, corrector_order=4, s_noise=1, PEC mode (the corrected
    state is not re-evaluated), ``tau_func = sa_solver_default_tau(model's schedule)`` (tau = 1 for
    sigma in about [0.571, 5.09] on the SD schedule, else 0), no simplified order-2 weights.
    No corrector on the first step or on the step to sigma = 0 (PEC); when the schedule ends at 0
    the orders are lowered near the end (predictor <= steps left - 1, corrector <= steps left).
    The last step returns ``denoised``.
    """
    refuse_flow(model, "sa_solver_pece" if use_pece else "sa_solver")
    if len(sigmas) <= 1:
        return x
    extra_args = {} if extra_args is None else extra_args
    if s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    if tau_func is None:
        # The interval comes from the model's own schedule (zSNR shifts it), as in ComfyUI; a
        # CFGDenoiser carries it as ``ms.schedule``.
        tau_func = sa_solver_default_tau(getattr(getattr(model, "ms", None), "schedule", None))
    lambdas = half_log_snr(sigmas)
    s_in = x.new_ones([x.shape[0]])
    history_len = max(predictor_order, corrector_order)
    lower_to_end = float(sigmas[-1]) == 0.0
    n = len(sigmas) - 1

    def coeffs(nodes, lam_s, lam_t, tau, sigma_t, corrector):
        if simple_order_2 and nodes.shape[0] == 2:
            return _sa_simple_order_2_coeffs(nodes, lam_s, lam_t, tau, sigma_t, corrector)
        return sa_solver_b_coeffs(nodes, lam_s, lam_t, tau, sigma_t)

    def combine(history, b):
        out = torch.zeros_like(history[0])
        for d, w in zip(history, b):
            out = out + w * d
        return out

    x_pred = x
    tau = 0.0
    h = None
    step_noise = None
    history: list[torch.Tensor] = []
    for i in range(n):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x_pred, sigma * s_in, **extra_args)
        report_step(callback, i, x_pred, sigma, denoised)
        history = (history + [denoised])[-history_len:]

        p_order = min(predictor_order, len(history))
        if i == 0 or (sigma_next == 0 and not use_pece):
            c_order = 0
        else:
            c_order = min(corrector_order, len(history))
        if lower_to_end:
            p_order = min(p_order, n - 1 - i)
            c_order = min(c_order, n - i)

        # Corrector: redo the step sigma_{i-1} -> sigma_i with the new evaluation included.
        if c_order == 0:
            x = x_pred
        else:
            b = coeffs(lambdas[i - c_order + 1:i + 1], lambdas[i - 1], lambdas[i], tau, sigma, True)
            x = (sigma / sigmas[i - 1]) * torch.exp(-(tau**2) * h) * x
            x = x + combine(history[-c_order:], b)
            if step_noise is not None:
                x = x + step_noise
            if use_pece:
                denoised = model(x, sigma * s_in, **extra_args)
                history[-1] = denoised

        # Predictor: step sigma_i -> sigma_{i+1} from the last p_order evaluations.
        if sigma_next == 0:
            x_pred = denoised
            continue
        tau = tau_func(sigma_next)
        nodes = lambdas[i - p_order + 1:i + 1]
        b = coeffs(nodes, lambdas[i], lambdas[i + 1], tau, sigma_next, False)
        h = lambdas[i + 1] - lambdas[i]
        x_pred = (sigma_next / sigma) * torch.exp(-(tau**2) * h) * x
        x_pred = x_pred + combine(history[-p_order:], b)
        step_noise = None
        if tau > 0 and s_noise > 0:
            z = noise_sampler(sigma, sigma_next)
            step_noise = z * (sigma_next * (-torch.expm1(-2 * tau**2 * h)).sqrt() * s_noise)
            x_pred = x_pred + step_noise
    return x_pred


@torch.no_grad()
def sample_sa_solver_pece(model, x, sigmas, extra_args=None, callback=None, disable=None,
                          noise_sampler=None, tau_func=None, s_noise=1.0, predictor_order=3,
                          corrector_order=4, simple_order_2=False):
    """SA-Solver in PECE mode (Xue et al. 2023): as ``sample_sa_solver`` but every corrected state
    is evaluated again and that evaluation replaces the predicted one in the history (one extra
    model call per step)."""
    return sample_sa_solver(model, x, sigmas, extra_args, callback, disable, noise_sampler,
                            tau_func=tau_func, s_noise=s_noise, predictor_order=predictor_order,
                            corrector_order=corrector_order, use_pece=True,
                            simple_order_2=simple_order_2)
