"""Linear multistep samplers with fixed-form coefficients: iPNDM / iPNDM-v and DEIS-tAB (Zhang &
Chen 2023, "Fast Sampling of Diffusion Models with Exponential Integrator"), and UniPC (Zhao et
al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast Sampling of Diffusion Models").

Contract, registry and shared helpers: ``samplers.py`` / ``sampler_utils.py``.
"""

from __future__ import annotations

import torch

from .sampler_utils import append_dims, report_step

__all__ = [
    "sample_ipndm",
    "sample_ipndm_v",
    "deis_coefficients",
    "sample_deis",
    "sample_uni_pc",
    "sample_uni_pc_bh2",
]


# ----------------------------------------------------------------- iPNDM / DEIS multistep


def _ipndm_loop(model, x, sigmas, extra_args, callback, max_order, combine):
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    buffer: list[torch.Tensor] = []
    for i in range(len(sigmas) - 1):
        t_cur, t_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, t_cur * s_in, **extra_args)
        report_step(callback, i, x, t_cur, denoised)
        d_cur = (x - denoised) / t_cur
        order = min(max_order, i + 1)
        x_next = combine(i, order, x, d_cur, buffer, denoised)
        buffer.append(d_cur)
        if len(buffer) > max_order - 1:
            buffer.pop(0)
        x = x_next
    return x


@torch.no_grad()
def sample_ipndm(model, x, sigmas, extra_args=None, callback=None, disable=None,
                 noise_sampler=None, max_order=4):
    """Improved PNDM (Zhang & Chen 2023, "Fast Sampling of Diffusion Models with Exponential
    Integrator", sec. on iPNDM): Adams–Bashforth with fixed-step coefficients, lower order
    warm-up, final step to the x0 prediction (zju-pi diff-solvers variant)."""

    def combine(i, order, x, d, buf, denoised):
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == 0:
            return denoised
        if order == 1:
            return x + dt * d
        if order == 2:
            return x + dt * (3 * d - buf[-1]) / 2
        if order == 3:
            return x + dt * (23 * d - 16 * buf[-1] + 5 * buf[-2]) / 12
        return x + dt * (55 * d - 59 * buf[-1] + 37 * buf[-2] - 9 * buf[-3]) / 24

    return _ipndm_loop(model, x, sigmas, extra_args, callback, max_order, combine)


@torch.no_grad()
def sample_ipndm_v(model, x, sigmas, extra_args=None, callback=None, disable=None,
                   noise_sampler=None, max_order=4):
    """iPNDM with variable-step Adams–Bashforth coefficients (Zhang & Chen 2023; zju-pi
    diff-solvers ``ipndm_v``)."""
    t = sigmas

    def combine(i, order, x, d, buf, denoised):
        if t[i + 1] == 0:
            return denoised
        h_n = t[i + 1] - t[i]
        if order == 1:
            return x + h_n * d
        h_n_1 = t[i] - t[i - 1]
        if order == 2:
            c1 = (2 + h_n / h_n_1) / 2
            c2 = -(h_n / h_n_1) / 2
            return x + h_n * (c1 * d + c2 * buf[-1])
        h_n_2 = t[i - 1] - t[i - 2]
        temp1 = (1 - h_n / (3 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1))
                 / (h_n_1 * (h_n_1 + h_n_2))) / 2
        if order == 3:
            c1 = (2 + h_n / h_n_1) / 2 + temp1
            c2 = -(h_n / h_n_1) / 2 - (1 + h_n_1 / h_n_2) * temp1
            c3 = temp1 * h_n_1 / h_n_2
            return x + h_n * (c1 * d + c2 * buf[-1] + c3 * buf[-2])
        h_n_3 = t[i - 2] - t[i - 3]
        temp2 = (((1 - h_n / (3 * (h_n + h_n_1))) / 2
                  + (1 - h_n / (2 * (h_n + h_n_1))) * h_n / (6 * (h_n + h_n_1 + h_n_2)))
                 * (h_n * (h_n + h_n_1) * (h_n + h_n_1 + h_n_2))
                 / (h_n_1 * (h_n_1 + h_n_2) * (h_n_1 + h_n_2 + h_n_3)))
        q = h_n_1 * (h_n_1 + h_n_2) / (h_n_2 * (h_n_2 + h_n_3))
        c1 = (2 + h_n / h_n_1) / 2 + temp1 + temp2
        c2 = -(h_n / h_n_1) / 2 - (1 + h_n_1 / h_n_2) * temp1 - (1 + h_n_1 / h_n_2 + q) * temp2
        c3 = temp1 * h_n_1 / h_n_2 + (h_n_1 / h_n_2 + q * (1 + h_n_2 / h_n_3)) * temp2
        c4 = -temp2 * q * h_n_1 / h_n_2
        return x + h_n * (c1 * d + c2 * buf[-1] + c3 * buf[-2] + c4 * buf[-3])

    return _ipndm_loop(model, x, sigmas, extra_args, callback, max_order, combine)


def deis_coefficients(sigmas: torch.Tensor, max_order: int, n: int = 10000):
    """DEIS "tAB" coefficients (Zhang & Chen 2023, "Fast Sampling of Diffusion Models with
    Exponential Integrator", eq. 14): integrate dσ/dτ times the Lagrange basis through the last
    ``order`` times, in the time τ of a VP-SDE fitted to EDM's σ range (0.002..80, ε_s = 1e-3),
    by a Riemann sum over ``n`` points (as the zju-pi/ComfyUI implementation)."""
    eps_s, s_min, s_max = 1e-3, torch.tensor(0.002), torch.tensor(80.0)
    beta_d = 2 * (torch.log(s_min**2 + 1) / eps_s - torch.log(s_max**2 + 1)) / (eps_s - 1)
    beta_min = torch.log(s_max**2 + 1) - 0.5 * beta_d
    sig = sigmas.detach().cpu()
    t_steps = ((beta_min**2 + 2 * beta_d * (sig**2 + 1).log()).sqrt() - beta_min) / beta_d
    beta_0, beta_1 = beta_min, beta_d + beta_min
    coeffs = []
    for i in range(len(t_steps) - 1):
        order = min(i + 1, max_order)
        if order == 1:
            coeffs.append([])
            continue
        t_cur, t_next = t_steps[i], t_steps[i + 1]
        taus = torch.linspace(float(t_cur), float(t_next), n)
        dtau = (t_next - t_cur) / n
        prev_t = t_steps[[i - k for k in range(order)]]
        alpha = torch.exp(-0.5 * taus**2 * (beta_1 - beta_0) - taus * beta_0)
        dlog_alpha = -taus * (beta_1 - beta_0) - beta_0  # d log ᾱ / dτ, analytic
        integrand = -0.5 * dlog_alpha / torch.sqrt(alpha * (1 - alpha))  # dσ/dτ
        row = []
        for j in range(order):
            poly = torch.ones_like(taus)
            for k in range(order):
                if k != j:
                    poly = poly * (taus - prev_t[k]) / (prev_t[j] - prev_t[k])
            row.append(torch.sum(integrand * poly) * dtau)
        coeffs.append(row)
    return coeffs


@torch.no_grad()
def sample_deis(model, x, sigmas, extra_args=None, callback=None, disable=None,
                noise_sampler=None, max_order=3, deis_mode="tab"):
    """DEIS-tAB multistep (Zhang & Chen 2023) with Euler warm-up and an Euler last step."""
    if deis_mode != "tab":
        raise NotImplementedError(f"deis_mode {deis_mode!r}: not supported yet (only 'tab')")
    coeffs = deis_coefficients(sigmas, max_order)

    def combine(i, order, x, d, buf, denoised):
        if sigmas[i + 1] <= 0 or order == 1:
            return x + (sigmas[i + 1] - sigmas[i]) * d
        c = [v.to(x.device, x.dtype) for v in coeffs[i]]
        out = x + c[0] * d
        for k in range(1, order):
            out = out + c[k] * buf[-k]
        return out

    return _ipndm_loop(model, x, sigmas, extra_args, callback, max_order, combine)


# ------------------------------------------------------------------------------------ UniPC


def _vp(sigma):
    """(log ᾱ^½, α, std, λ) of the VP process equivalent to VE noise level σ."""
    log_alpha = 0.5 * torch.log(1 / (sigma * sigma + 1))
    alpha = torch.exp(log_alpha)
    std = torch.sqrt(1.0 - torch.exp(2.0 * log_alpha))
    lam = log_alpha - 0.5 * torch.log(1.0 - torch.exp(2.0 * log_alpha))
    return alpha, std, lam


def _unipc_update(x, model_fn, x0_prev, t_prev, t, order, variant, use_corrector):
    """One UniPC step in VP space with data prediction: UniP predictor of ``order`` plus the UniC
    corrector (Zhao et al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast Sampling
    of Diffusion Models", Algorithms 2 and 3 with B(h) = h ("bh1") or e^h − 1 ("bh2"))."""
    nd = x.ndim
    _, std_prev, lam_prev = _vp(t_prev[-1])
    alpha_t, std_t, lam_t = _vp(t)
    m0 = x0_prev[-1]
    h = lam_t - lam_prev
    rks, d1s = [], []
    for i in range(1, order):
        _, _, lam_i = _vp(t_prev[-(i + 1)])
        rk = ((lam_i - lam_prev) / h)[0]
        rks.append(rk)
        d1s.append((x0_prev[-(i + 1)] - m0) / rk)
    rks.append(1.0)
    rks = torch.tensor(rks, device=x.device)

    hh = -h[0]
    h_phi_1 = torch.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1
    b_h = hh if variant == "bh1" else torch.expm1(hh)
    R, b = [], []
    factorial = 1
    for i in range(1, order + 1):
        R.append(torch.pow(rks, i - 1))
        b.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    R = torch.stack(R)
    b = torch.tensor(b, device=x.device)

    D1s = torch.stack(d1s, dim=1) if d1s else None  # [B, K-1, C, H, W]
    if D1s is not None:
        rhos_p = (torch.tensor([0.5], device=x.device) if order == 2
                  else torch.linalg.solve(R[:-1, :-1], b[:-1]))
    if use_corrector:
        rhos_c = torch.tensor([0.5], device=x.device) if order == 1 else torch.linalg.solve(R, b)

    x_t_ = append_dims(std_t / std_prev, nd) * x - append_dims(alpha_t * h_phi_1, nd) * m0
    pred_res = torch.einsum("k,bk...->b...", rhos_p, D1s) if D1s is not None else 0
    x_t = x_t_ - append_dims(alpha_t * b_h, nd) * pred_res
    model_t = None
    if use_corrector:
        model_t = model_fn(x_t, t)
        corr_res = torch.einsum("k,bk...->b...", rhos_c[:-1], D1s) if D1s is not None else 0
        x_t = x_t_ - append_dims(alpha_t * b_h, nd) * (corr_res + rhos_c[-1] * (model_t - m0))
    return x_t, model_t


@torch.no_grad()
def sample_uni_pc(model, x, sigmas, extra_args=None, callback=None, disable=None,
                  noise_sampler=None, variant="bh1"):
    """UniPC multistep, order min(3, steps − 1), lower order on the final steps, corrector on
    all but the last step (Zhao et al. 2023), run in VP space as ComfyUI's port does: a final
    sigma of 0 is replaced by 0.001 and the result is returned at that level."""
    if variant not in ("bh1", "bh2"):
        raise ValueError("variant must be 'bh1' or 'bh2'")
    extra_args = {} if extra_args is None else extra_args
    ts = sigmas.clone()
    if ts[-1] == 0:
        ts[-1] = 0.001
    steps = len(ts) - 1
    order = min(3, len(ts) - 2)

    def model_fn(x_vp, sigma):
        alpha, std, _ = _vp(sigma)
        s = append_dims(sigma, x_vp.ndim)
        x_ve = x_vp * ((s**2 + 1.0) ** 0.5)
        eps = (x_ve - model(x_ve, sigma, **extra_args)) / s
        return (x_vp - append_dims(std, x_vp.ndim) * eps) / append_dims(alpha, x_vp.ndim)

    x = x / torch.sqrt(1.0 + ts[0] ** 2.0)
    B = x.shape[0]
    x0_prev: list[torch.Tensor] = []
    t_prev: list[torch.Tensor] = []
    for step_index in range(steps):
        if step_index == 0:
            vec_t = ts[0].expand(B)
            x0_prev, t_prev = [model_fn(x, vec_t)], [vec_t]
        elif step_index < order:
            vec_t = ts[step_index].expand(B)
            x, model_x = _unipc_update(x, model_fn, x0_prev, t_prev, vec_t, step_index,
                                       variant, True)
            if model_x is None:
                model_x = model_fn(x, vec_t)
            x0_prev.append(model_x)
            t_prev.append(vec_t)
        else:
            last = step_index + (2 if step_index == steps - 1 else 1)
            for step in range(step_index, last):
                vec_t = ts[step].expand(B)
                step_order = min(order, steps + 1 - step)
                x, model_x = _unipc_update(x, model_fn, x0_prev, t_prev, vec_t, step_order,
                                           variant, step != steps)
                x0_prev = x0_prev[1:] + x0_prev[:1] if order > 1 else x0_prev
                t_prev = t_prev[1:] + t_prev[:1] if order > 1 else t_prev
                t_prev[-1] = vec_t
                if step < steps:
                    if model_x is None:
                        model_x = model_fn(x, vec_t)
                    x0_prev[-1] = model_x
        if callback is not None:
            callback({"x": x, "i": step_index, "sigma": ts[step_index],
                      "sigma_hat": ts[step_index], "denoised": x0_prev[-1]})
    alpha_end, _, _ = _vp(ts[-1])
    return x / alpha_end


@torch.no_grad()
def sample_uni_pc_bh2(model, x, sigmas, extra_args=None, callback=None, disable=None,
                      noise_sampler=None):
    """UniPC with B(h) = e^h − 1 (Zhao et al. 2023, "bh2")."""
    return sample_uni_pc(model, x, sigmas, extra_args, callback, disable, noise_sampler,
                         variant="bh2")
