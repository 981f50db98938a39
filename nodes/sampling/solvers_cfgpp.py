"""CFG++ variants of Euler, Euler ancestral, DPM-Solver++(2S) ancestral and DPM-Solver++(2M), and
ComfyUI's ``cfgpp_ud10_ab`` (CFG++ Euler with an AB2 history and a σ = 0 extrapolation).

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
    flow_sampling,
    get_ancestral_step,
    half_log_snr,
    noise_or_default,
    report_step,
    snr_fns,
    to_d,
)

__all__ = [
    "sample_euler_cfg_pp",
    "sample_euler_ancestral_cfg_pp",
    "sample_dpmpp_2s_ancestral_cfg_pp",
    "sample_dpmpp_2m_cfg_pp",
    "sample_cfgpp_history",
    "sample_cfgpp_ud10_ab",
]


@torch.no_grad()
def sample_euler_ancestral_cfg_pp(model, x, sigmas, extra_args=None, callback=None, disable=None,
                                  noise_sampler=None, eta=1.0, s_noise=1.0):
    """Euler ancestral with CFG++ (Chung et al. 2024, Algorithm 1 with DDIM's eta noise):
    ``x_next = denoised + sigma_down * eps_u + s_noise * sigma_up * z``.

    ComfyUI defaults eta=1, s_noise=1; the last step (sigma_next = 0) returns ``denoised``.
    On a flow model (alpha = 1 - sigma) the step is ComfyUI's general form: the ancestral split
    in sigma/alpha units, ``x_next = alpha_t denoised + alpha_t sigma_down d`` with
    ``d = (x - alpha_s uncond) / sigma`` and noise of std ``alpha_t s_noise sigma_up``.
    """
    extra_args = {} if extra_args is None else extra_args
    if eta > 0 and s_noise > 0:
        noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    flow = flow_sampling(model) is not None
    lambda_fn = snr_fns(True)[0]
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised, uncond = denoise_with_uncond(model, x, sigma * s_in, **extra_args)
        report_step(callback, i, x, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        if flow:
            alpha_s = sigma * lambda_fn(sigma).exp()
            alpha_t = sigma_next * lambda_fn(sigma_next).exp()
            d = to_d(x, sigma, alpha_s * uncond)
            sigma_down, sigma_up = get_ancestral_step(sigma / alpha_s, sigma_next / alpha_t, eta)
            x = alpha_t * denoised + (alpha_t * sigma_down) * d
            if eta > 0 and s_noise > 0:
                x = x + alpha_t * noise_sampler(sigma, sigma_next) * s_noise * sigma_up
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


# The three weights ComfyUI's ``sample_cfgpp_ud10_ab`` passes to its CFG++ history sampler
# (Comfy-Org/ComfyUI PR #15951, "Add cfgpp_ud10_ab sampler.").
UD10_HISTORY_WEIGHT = 0.25
UD10_ZERO_WEIGHT = 1.0
UD10_UNCOND_HISTORY_WEIGHT = 0.1


def _ab2_weights(sigmas: list[float], i: int) -> tuple[float, float]:
    """Second-order Adams–Bashforth weights in σ over [σ_i, σ_{i+1}] for the derivatives at σ_i and
    σ_{i-1}: the exact integrals of the two linear Lagrange basis polynomials (what k-diffusion's
    ``linear_multistep_coeff(2, …)`` computes by quadrature; a linear integrand makes it exact)."""
    s_prev, s, s_next = sigmas[i - 1], sigmas[i], sigmas[i + 1]
    w_cur = ((s_next - s_prev) ** 2 - (s - s_prev) ** 2) / (2.0 * (s - s_prev))
    w_prev = (s_next - s) ** 2 / (2.0 * (s_prev - s))
    return w_cur, w_prev


@torch.no_grad()
def sample_cfgpp_history(model, x, sigmas, extra_args=None, callback=None, disable=None,
                         noise_sampler=None, history_weight=0.5, zero_weight=None, zero_order=1,
                         uncond_history_weight=0.0):
    """CFG++ Euler with a variable-step AB2 history and an optional σ = 0 extrapolation (ComfyUI's
    ``_sample_cfgpp_history``, the engine of ``cfgpp_ud10_ab``). Each step:

    * ``u = (x − uncond) / σ_i`` (CFG++'s unconditional derivative); from the second step on it is
      extrapolated, ``u += uncond_history_weight · (dt_i / dt_{i−1}) · (u − u_prev)``;
    * ``e = denoised + σ_{i+1}·u − x`` (the CFG++ Euler increment), ``d = e / dt_i``;
    * from the second step on the increment is ``lerp(e, w0·d_i + w1·d_{i−1}, history_weight)``
      with the AB2 weights in σ (``_ab2_weights``);
    * on the step to σ = 0 (and not the first step), with ``zero_weight`` set, x is pulled towards
      the x0 history extrapolated to σ = 0: ``lerp(x, x0_pred, zero_weight)``, ``x0_pred`` the line
      through the last two ``denoised`` (``zero_order`` 2 and three of them: the parabola).

    ``uncond`` comes from ``denoise_with_uncond(..., cfg1_optimization=True)``: as in ComfyUI, whose
    hook keeps the cfg-1 optimisation, a step run at cfg ≈ 1 takes the conditional prediction.
    Deterministic; ``noise_sampler`` is accepted (the contract) and unused.
    """
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    sig = [float(s) for s in sigmas.detach().cpu().tolist()]
    derivatives: list[torch.Tensor] = []
    denoised_history: list[torch.Tensor] = []
    old_uncond_d = None
    for i in range(len(sig) - 1):
        denoised, uncond = denoise_with_uncond(model, x, sigmas[i] * s_in,
                                               cfg1_optimization=True, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        dt = sig[i + 1] - sig[i]
        current_uncond_d = (x - uncond) / sig[i]
        uncond_d = current_uncond_d
        if i > 0 and uncond_history_weight:
            ratio = dt / (sig[i] - sig[i - 1])
            uncond_d = uncond_d + (uncond_history_weight * ratio) * (current_uncond_d - old_uncond_d)
        euler_step = denoised + sig[i + 1] * uncond_d - x
        derivatives.append(euler_step / dt)
        del derivatives[:-2]
        if len(derivatives) == 1:
            step = euler_step
        else:
            w_cur, w_prev = _ab2_weights(sig, i)
            history_step = w_cur * derivatives[-1] + w_prev * derivatives[-2]
            step = torch.lerp(euler_step, history_step, history_weight)
        x = x + step
        if sig[i + 1] == 0 and zero_weight is not None and denoised_history:
            if zero_order == 2 and len(denoised_history) > 1:
                s0, s1, s2 = sig[i - 2], sig[i - 1], sig[i]
                # Lagrange weights of the parabola through (s0, s1, s2) evaluated at σ = 0
                w0 = s1 * s2 / ((s0 - s1) * (s0 - s2))
                w1 = s0 * s2 / ((s1 - s0) * (s1 - s2))
                w2 = s0 * s1 / ((s2 - s0) * (s2 - s1))
                x0_pred = w0 * denoised_history[-2] + w1 * denoised_history[-1] + w2 * denoised
            else:
                slope = (denoised - denoised_history[-1]) / (sig[i] - sig[i - 1])
                x0_pred = denoised - sig[i] * slope
            x = torch.lerp(x, x0_pred, zero_weight)
        denoised_history.append(denoised)
        del denoised_history[:-2]
        old_uncond_d = current_uncond_d
    return x


@torch.no_grad()
def sample_cfgpp_ud10_ab(model, x, sigmas, extra_args=None, callback=None, disable=None,
                         noise_sampler=None):
    """ComfyUI's ``cfgpp_ud10_ab`` (PR #15951; its author recommends cfg 2): ``sample_cfgpp_history``
    with history weight 0.25, unconditional-history weight 0.1 and a full (weight 1) first-order
    σ = 0 extrapolation on the last step."""
    return sample_cfgpp_history(model, x, sigmas, extra_args, callback, disable,
                                history_weight=UD10_HISTORY_WEIGHT, zero_weight=UD10_ZERO_WEIGHT,
                                uncond_history_weight=UD10_UNCOND_HISTORY_WEIGHT)
