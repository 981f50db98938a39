"""DPM-Solver (Lu et al. 2022, "DPM-Solver: A Fast ODE Solver for Diffusion Probabilistic Model
Sampling in Around 10 Steps"): the fixed-budget ``dpm_fast`` and the step-size-controlled
``dpm_adaptive``. DPM-Solver++ lives in ``solvers_dpmpp.py``.

Contract, registry and shared helpers: ``samplers.py`` / ``sampler_utils.py``.
"""

from __future__ import annotations

import math

import torch

from .sampler_utils import get_ancestral_step, noise_or_default, report_step

__all__ = ["sample_dpm_fast", "sample_dpm_adaptive"]


class _PIDStepSizeController:
    """PID step-size control for the adaptive solver (Söderlind 2003, "Digital Filters in
    Adaptive Time-Stepping")."""

    def __init__(self, h, pcoeff, icoeff, dcoeff, order=1, accept_safety=0.81, eps=1e-8):
        self.h = h
        self.b1 = (pcoeff + icoeff + dcoeff) / order
        self.b2 = -(pcoeff + 2 * dcoeff) / order
        self.b3 = dcoeff / order
        self.accept_safety = accept_safety
        self.eps = eps
        self.errs: list[float] = []

    def propose_step(self, error) -> bool:
        inv_error = 1 / (float(error) + self.eps)
        if not self.errs:
            self.errs = [inv_error, inv_error, inv_error]
        self.errs[0] = inv_error
        factor = self.errs[0] ** self.b1 * self.errs[1] ** self.b2 * self.errs[2] ** self.b3
        factor = 1 + math.atan(factor - 1)
        accept = factor >= self.accept_safety
        if accept:
            self.errs[2], self.errs[1] = self.errs[1], self.errs[0]
        self.h *= factor
        return accept


class _DPMSolver:
    """DPM-Solver-1/2/3 single steps in t = −log σ (Lu et al. 2022, "DPM-Solver: A Fast ODE
    Solver for Diffusion Probabilistic Model Sampling in Around 10 Steps", Algorithms 1–2)."""

    def __init__(self, model, extra_args, info_callback=None):
        self.model = model
        self.extra_args = extra_args
        self.info_callback = info_callback

    @staticmethod
    def t(sigma):
        return -sigma.log()

    @staticmethod
    def sigma(t):
        return t.neg().exp()

    def eps(self, cache, key, x, t):
        if key in cache:
            return cache[key], cache
        sigma = self.sigma(t) * x.new_ones([x.shape[0]])
        eps = (x - self.model(x, sigma, **self.extra_args)) / self.sigma(t)
        return eps, {key: eps, **cache}

    def step_1(self, x, t, t_next, cache):
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        return x - self.sigma(t_next) * h.expm1() * eps, cache

    def step_2(self, x, t, t_next, r1=1 / 2, cache=None):
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        s1 = t + r1 * h
        u1 = x - self.sigma(s1) * (r1 * h).expm1() * eps
        eps_r1, cache = self.eps(cache, "eps_r1", u1, s1)
        x_2 = (x - self.sigma(t_next) * h.expm1() * eps
               - self.sigma(t_next) / (2 * r1) * h.expm1() * (eps_r1 - eps))
        return x_2, cache

    def step_3(self, x, t, t_next, r1=1 / 3, r2=2 / 3, cache=None):
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        s1, s2 = t + r1 * h, t + r2 * h
        u1 = x - self.sigma(s1) * (r1 * h).expm1() * eps
        eps_r1, cache = self.eps(cache, "eps_r1", u1, s1)
        u2 = (x - self.sigma(s2) * (r2 * h).expm1() * eps
              - self.sigma(s2) * (r2 / r1) * ((r2 * h).expm1() / (r2 * h) - 1) * (eps_r1 - eps))
        eps_r2, cache = self.eps(cache, "eps_r2", u2, s2)
        x_3 = (x - self.sigma(t_next) * h.expm1() * eps
               - self.sigma(t_next) / r2 * (h.expm1() / h - 1) * (eps_r2 - eps))
        return x_3, cache

    def fast(self, x, t_start, t_end, nfe, eta, s_noise, noise_sampler):
        if not t_end > t_start and eta:
            raise ValueError("eta must be 0 for reverse sampling")
        m = math.floor(nfe / 3) + 1
        ts = torch.linspace(t_start, t_end, m + 1, device=x.device)
        if nfe % 3 == 0:
            orders = [3] * (m - 2) + [2, 1]
        else:
            orders = [3] * (m - 1) + [nfe % 3]
        for i, order in enumerate(orders):
            cache = {}
            t, t_next = ts[i], ts[i + 1]
            if eta:
                sd, su = get_ancestral_step(self.sigma(t), self.sigma(t_next), eta)
                t_next_ = torch.minimum(t_end, self.t(sd))
                su = (self.sigma(t_next) ** 2 - self.sigma(t_next_) ** 2) ** 0.5
            else:
                t_next_, su = t_next, 0.0
            eps, cache = self.eps(cache, "eps", x, t)
            if self.info_callback is not None:
                self.info_callback(i, x, self.sigma(t), x - self.sigma(t) * eps)
            if order == 1:
                x, cache = self.step_1(x, t, t_next_, cache)
            elif order == 2:
                x, cache = self.step_2(x, t, t_next_, cache=cache)
            else:
                x, cache = self.step_3(x, t, t_next_, cache=cache)
            x = x + su * s_noise * noise_sampler(self.sigma(t), self.sigma(t_next))
        return x

    def adaptive(self, x, t_start, t_end, order, rtol, atol, h_init, pcoeff, icoeff, dcoeff,
                 accept_safety, eta, s_noise, noise_sampler):
        if order not in {2, 3}:
            raise ValueError("order should be 2 or 3")
        forward = t_end > t_start
        if not forward and eta:
            raise ValueError("eta must be 0 for reverse sampling")
        h_init = abs(h_init) * (1 if forward else -1)
        atol, rtol = torch.tensor(atol), torch.tensor(rtol)
        s = t_start
        x_prev = x
        pid = _PIDStepSizeController(h_init, pcoeff, icoeff, dcoeff, 1.5 if eta else order,
                                     accept_safety)
        steps = 0
        while s < t_end - 1e-5 if forward else s > t_end + 1e-5:
            cache = {}
            t = torch.minimum(t_end, s + pid.h) if forward else torch.maximum(t_end, s + pid.h)
            if eta:
                sd, su = get_ancestral_step(self.sigma(s), self.sigma(t), eta)
                t_ = torch.minimum(t_end, self.t(sd))
                su = (self.sigma(t) ** 2 - self.sigma(t_) ** 2) ** 0.5
            else:
                t_, su = t, 0.0
            eps, cache = self.eps(cache, "eps", x, s)
            denoised = x - self.sigma(s) * eps
            if order == 2:
                x_low, cache = self.step_1(x, s, t_, cache)
                x_high, cache = self.step_2(x, s, t_, cache=cache)
            else:
                x_low, cache = self.step_2(x, s, t_, r1=1 / 3, cache=cache)
                x_high, cache = self.step_3(x, s, t_, cache=cache)
            delta = torch.maximum(atol, rtol * torch.maximum(x_low.abs(), x_prev.abs()))
            error = torch.linalg.norm((x_low - x_high) / delta) / x.numel() ** 0.5
            if pid.propose_step(error):
                x_prev = x_low
                x = x_high + su * s_noise * noise_sampler(self.sigma(s), self.sigma(t))
                s = t
            steps += 1
            if self.info_callback is not None:
                self.info_callback(steps - 1, x, self.sigma(s), denoised)
        return x


def _dpm_range(sigmas):
    """ComfyUI runs dpm_fast/dpm_adaptive from σ_0 down to the last *non-zero* sigma: the result
    keeps that much noise (σ_min ≈ 0.029 for SD)."""
    sigma_min = sigmas[-1]
    if sigma_min == 0:
        sigma_min = sigmas[-2]
    return sigma_min, sigmas[0]


def _dpm_info(callback):
    if callback is None:
        return None
    return lambda i, x, sigma, denoised: report_step(callback, i, x, sigma, denoised)


def _dpm_setup(model, x, sigmas, extra_args, callback, noise_sampler):
    """The solver, the span t = −log σ from σ_0 to the last non-zero sigma, and the noise
    sampler shared by ``dpm_fast`` and ``dpm_adaptive``."""
    extra_args = {} if extra_args is None else extra_args
    sigma_min, sigma_max = _dpm_range(sigmas)
    if sigma_min <= 0 or sigma_max <= 0:
        raise ValueError("sigma_min and sigma_max must not be 0")
    noise_sampler = noise_or_default(x, extra_args, noise_sampler)
    solver = _DPMSolver(model, extra_args, _dpm_info(callback))
    t_start, t_end = solver.t(torch.as_tensor(sigma_max)), solver.t(torch.as_tensor(sigma_min))
    return solver, t_start, t_end, noise_sampler


@torch.no_grad()
def sample_dpm_fast(model, x, sigmas, extra_args=None, callback=None, disable=None,
                    noise_sampler=None, eta=0.0, s_noise=1.0):
    """DPM-Solver-Fast (Lu et al. 2022, sec. 3.4): len(sigmas) − 1 model evaluations as
    third-order steps uniform in log σ between σ_0 and the last non-zero sigma."""
    if len(sigmas) <= 1:
        return x
    solver, t_start, t_end, noise_sampler = _dpm_setup(model, x, sigmas, extra_args, callback,
                                                       noise_sampler)
    return solver.fast(x, t_start, t_end, len(sigmas) - 1, eta, s_noise, noise_sampler)


@torch.no_grad()
def sample_dpm_adaptive(model, x, sigmas, extra_args=None, callback=None, disable=None,
                        noise_sampler=None, order=3, rtol=0.05, atol=0.0078, h_init=0.05,
                        pcoeff=0.0, icoeff=1.0, dcoeff=0.0, accept_safety=0.81, eta=0.0,
                        s_noise=1.0):
    """DPM-Solver-12/23 with adaptive step size (Lu et al. 2022, sec. 3.3 and Algorithm 4);
    only σ_0 and the last non-zero sigma of ``sigmas`` are used."""
    if len(sigmas) <= 1:
        return x
    solver, t_start, t_end, noise_sampler = _dpm_setup(model, x, sigmas, extra_args, callback,
                                                       noise_sampler)
    return solver.adaptive(x, t_start, t_end, order, rtol, atol, h_init, pcoeff, icoeff, dcoeff,
                           accept_safety, eta, s_noise, noise_sampler)
