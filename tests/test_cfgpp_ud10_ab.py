"""ComfyUI's ``cfgpp_ud10_ab`` sampler (CFG++ Euler with an AB2 history and a σ = 0 extrapolation)."""

from __future__ import annotations

import torch

from mixgraph.nodes.sampling import samplers as S
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.nodes.sampling.schedules import karras_scheduler
from tests.test_custom_sampling import PromptModel, cond_value
from tests.test_samplers import ode_error, x_start, gaussian_denoiser, ode_endpoint


class ToyCFG:
    """A CFG model with closed-form conditional and unconditional x0 predictions."""

    def __init__(self, cfg: float):
        self.cfg = cfg
        self.skipped = []

    def _preds(self, x, sigma):
        s = sigma.reshape(-1, 1, 1, 1)
        cond = (0.25 * x + s * s * 0.4) / (0.25 + s * s)
        uncond = (0.36 * x - s * s * 0.2) / (0.36 + s * s)
        return cond, uncond

    def __call__(self, x, sigma, **_):
        cond, uncond = self._preds(x, sigma)
        return uncond + (cond - uncond) * self.cfg

    def with_uncond(self, x, sigma, skip_cfg1=False, **_):
        self.skipped.append(skip_cfg1)
        cond, uncond = self._preds(x, sigma)
        return uncond + (cond - uncond) * self.cfg, uncond


def _start(seed=0):
    return 6.0 * torch.randn((2, 4, 4, 4), generator=torch.Generator().manual_seed(seed),
                             dtype=torch.float64)


def test_cfgpp_ud10_ab_sits_after_deis_in_the_sampler_list():
    names = S.SAMPLER_NAMES
    assert names[names.index("deis") + 1] == "cfgpp_ud10_ab"
    assert names[names.index("cfgpp_ud10_ab") + 1] == "res_multistep"
    assert S.get_sampler("cfgpp_ud10_ab") is S.sample_cfgpp_ud10_ab


def test_cfgpp_ud10_ab_matches_hand_written_steps():
    """The ud10 update written out step by step for σ = 8, 3, 1, 0 (weights 0.25 / 0.1 / 1)."""
    model = ToyCFG(2.5)
    sig = [8.0, 3.0, 1.0, 0.0]
    x0 = _start()
    out = S.sample_cfgpp_ud10_ab(model, x0.clone(), torch.tensor(sig, dtype=torch.float64))
    assert model.skipped == [True] * 3  # asked for ComfyUI's cfg-1 optimisation at every step
    x, d_prev, u_prev, den_prev = x0.clone(), None, None, None
    for i in range(3):
        s, t = sig[i], sig[i + 1]
        den, unc = model.with_uncond(x, torch.tensor([s], dtype=torch.float64))
        u = (x - unc) / s
        u_used = u if i == 0 else u + 0.1 * (t - s) / (s - sig[i - 1]) * (u - u_prev)
        e = den + t * u_used - x
        d = e / (t - s)
        if i == 0:
            x = x + e
        else:
            # AB2 in σ: ∫_s^t of the line through (σ_{i-1}, d_prev) and (σ_i, d)
            p = sig[i - 1]
            ab2 = (t - s) * d + (t - s) ** 2 / 2 * (d - d_prev) / (s - p)
            x = x + 0.75 * e + 0.25 * ab2
        if t == 0:
            x = den - s * (den - den_prev) / (s - sig[i - 1])  # zero weight 1: x is the line's x0
        d_prev, u_prev, den_prev = d, u, den
    assert torch.allclose(out, x, rtol=0, atol=1e-10)


def test_cfgpp_history_without_history_is_euler_cfg_pp():
    model = ToyCFG(3.0)
    sigmas = karras_scheduler(8, 0.0292, 14.6146).double()
    x = _start(1)
    ref = S.sample_euler_cfg_pp(model, x.clone(), sigmas)
    out = S.sample_cfgpp_history(model, x.clone(), sigmas, history_weight=0.0,
                                 zero_weight=None, uncond_history_weight=0.0)
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)


def test_cfgpp_history_full_history_on_a_plain_denoiser_is_lms_order_2():
    sigmas = karras_scheduler(9, 0.05, 14.6146)[:-1].double()
    x = x_start(float(sigmas[0]))
    ref = S.sample_lms(gaussian_denoiser, x.clone(), sigmas, order=2)
    out = S.sample_cfgpp_history(gaussian_denoiser, x.clone(), sigmas, history_weight=1.0)
    assert torch.allclose(out, ref, rtol=0, atol=1e-6)  # lms integrates by quadrature (epsrel 1e-4)


def _history_run(steps, **opts):
    sigmas = karras_scheduler(steps, 0.05, 14.6146)[:-1].double()  # no final jump to 0
    x = x_start(float(sigmas[0]))
    out = S.sample_cfgpp_history(gaussian_denoiser, x, sigmas, **opts)
    return out, float((out - ode_endpoint(x, float(sigmas[0]), float(sigmas[-1]))).abs().max())


def test_cfgpp_history_blend_converges_to_the_ode_endpoint_at_first_order():
    """Without the unconditional history the blend of Euler and AB2 is a consistent solver whose
    Euler part makes it first order: ~4x less error for 4x the steps."""
    (_, e10), (_, e40) = _history_run(10, history_weight=0.25), _history_run(40, history_weight=0.25)
    assert e40 < 0.07
    assert e10 / e40 > 3.5


def test_cfgpp_ud10_ab_converges_to_its_own_limit_off_the_ode_endpoint():
    """The unconditional-history term ``0.1·(dt_i/dt_{i-1})·(u_i − u_{i-1})`` is O(dt) but enters
    the state multiplied by σ_{i+1}, not by dt, so it does not vanish with the step: ud10 converges
    (first order) to a trajectory about 0.09 off the probability-flow ODE on this data."""
    assert ode_error("cfgpp_ud10_ab", 40) > 0.08       # ComfyUI's weights: a fixed offset
    ud10 = dict(history_weight=0.25, uncond_history_weight=0.1)
    limit, e320 = _history_run(320, **ud10)
    d10 = float((_history_run(10, **ud10)[0] - limit).abs().max())
    d40 = float((_history_run(40, **ud10)[0] - limit).abs().max())
    assert d10 / d40 > 3.5                                # self-convergence, first order
    assert 0.08 < e320 < 0.1
    sigmas = karras_scheduler(20, 0.0292, 14.6146)        # the real run, ending in σ = 0
    x = x_start(float(sigmas[0]), dtype=torch.float32)
    out = S.sample_cfgpp_ud10_ab(gaussian_denoiser, x, sigmas)
    assert float((out - ode_endpoint(x, float(sigmas[0]), 0.0)).abs().max()) < 0.2


def _cfg_denoiser(model, cfg):
    x = torch.zeros(1, 4, 4, 4)
    return CFGDenoiser(model, cond_value(2.0), cond_value(-1.0), cfg, x, None, ModelSampling("x0"))


def test_cfgpp_ud10_ab_at_cfg_1_skips_the_negative_and_uses_the_conditional_prediction():
    """ComfyUI keeps the cfg-1 optimisation for this sampler: at cfg 1 the post-CFG hook sees no
    unconditional pass and takes the conditional x0, so the run equals one on the bare denoiser."""
    model = PromptModel()
    den = _cfg_denoiser(model, 1.0)
    sigmas = torch.tensor([4.0, 2.0, 1.0, 0.5, 0.0])
    x = torch.randn((1, 4, 4, 4), generator=torch.Generator().manual_seed(3))
    out = S.sample_cfgpp_ud10_ab(den, x.clone(), sigmas)
    assert model.calls and all(n == 1 for n in model.calls)  # never a batched negative
    ref = S.sample_cfgpp_ud10_ab(lambda x_, s, **_: den(x_, s), x.clone(), sigmas)
    assert torch.allclose(out, ref, atol=1e-6)
    # at cfg 2 the negative is evaluated and changes the result
    model2 = PromptModel()
    out2 = S.sample_cfgpp_ud10_ab(_cfg_denoiser(model2, 2.0), x.clone(), sigmas)
    assert any(n == 2 for n in model2.calls)
    assert not torch.allclose(out2, out, atol=1e-3)
    # euler_cfg_pp, by contrast, evaluates the negative even at cfg 1
    model3 = PromptModel()
    S.sample_euler_cfg_pp(_cfg_denoiser(model3, 1.0), x.clone(), sigmas)
    assert any(n == 2 for n in model3.calls)
