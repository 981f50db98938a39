"""SamplerSEEDS2 (and KSampler's exp_heun_2_x0 / exp_heun_2_x0_sde, the SEEDS-2 special cases
ComfyUI lists) and DualModelGuider: specs against ComfyUI 0.38.1's ``nodes_custom_sampler.py``
(hand-copied below), the limiting cases ComfyUI's math states, convergence order on the analytic
Gaussian denoiser, seed determinism, and the dual-model guidance rule on closed-form models."""

from __future__ import annotations

import math

import pytest
import torch

from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.sampling import custom_sampling_nodes as csn
from mixgraph.nodes.payloads.conditioning import TEXT_FREE, Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.sampling import Guidance, Guider, Sampler
from mixgraph.nodes.sampling import samplers as S
from mixgraph.nodes.sampling.guidance import build_denoiser
from mixgraph.nodes.sampling.ksampler import sample_custom
from mixgraph.nodes.sampling.noise import default_noise_sampler, initial_noise
from mixgraph.nodes.sampling.parameterization import ModelSampling
from tests.test_custom_sampling import PromptModel, cond_value

MU, S_DATA = 0.3, 0.5

# ------------------------------------------------------------------------------- specs

# (input, type, default, min, max, options, optional), outputs; from ComfyUI's define_schema.
SPECS = {
    "SamplerSEEDS2": ([("solver_type", "COMBO", "phi_1", None, None, ("phi_1", "phi_2"), False),
                       ("eta", "FLOAT", 1.0, 0.0, 100.0, None, False),
                       ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None, False),
                       ("r", "FLOAT", 0.5, 0.01, 1.0, None, False)], ["SAMPLER"]),
    "DualModelGuider": ([("model", "MODEL", None, None, None, None, False),
                         ("model_negative", "MODEL", None, None, None, None, True),
                         ("positive", "CONDITIONING", None, None, None, None, False),
                         ("cfg", "FLOAT", 4.0, 0.0, 100.0, None, False),
                         ("negative", "CONDITIONING", None, None, None, None, True)], ["GUIDER"]),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_seeds2_dual_model_node_spec_matches_comfyui(name):
    spec = REGISTRY.get(name)
    want_inputs, want_outputs = SPECS[name]
    got = [(n, i.type, i.default if i.has_default else None, i.min, i.max,
            tuple(i.option_list()) if i.type == "COMBO" else None, i.optional)
           for n, i in spec.inputs]
    assert got == want_inputs
    assert [o.type for o in spec.outputs] == want_outputs


def test_sampler_names_hold_exp_heun_after_heunpp2():
    names = S.SAMPLER_NAMES
    i = names.index("heunpp2")
    assert names[i + 1:i + 3] == ("exp_heun_2_x0", "exp_heun_2_x0_sde")
    assert names[i + 3] == "dpm_2"


# -------------------------------------------------------------------- SEEDS-2 samplers


def karras(n: int, sigma_min: float = 0.0292, sigma_max: float = 14.6146, rho: float = 7.0):
    ramp = torch.linspace(0, 1, n, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sig = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sig, sig.new_zeros(1)])


def gaussian(x, sigma, **_):
    """The optimal denoiser for data ~ N(MU, S_DATA²)."""
    sigma = sigma.reshape(-1, *([1] * (x.ndim - 1)))
    return (S_DATA**2 * x + sigma**2 * MU) / (S_DATA**2 + sigma**2)


def ode_endpoint_error(fn, steps: int, **opts) -> float:
    """Error against the exact probability-flow ODE solution, on a run ending at sigma_min (no
    final jump to 0, so the error is the solver's)."""
    sigmas = karras(steps)[:-1]
    x = MU + math.sqrt(S_DATA**2 + float(sigmas[0]) ** 2) * torch.randn(
        (2, 4, 8, 8), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = fn(gaussian, x.clone(), sigmas, **opts)
    scale = math.sqrt(S_DATA**2 + float(sigmas[-1]) ** 2) / math.sqrt(S_DATA**2 + float(sigmas[0]) ** 2)
    return float((out - (MU + (x - MU) * scale)).abs().max())


def test_exp_heun_2_x0_is_second_order():
    coarse = ode_endpoint_error(S.sample_exp_heun_2_x0, 10)
    fine = ode_endpoint_error(S.sample_exp_heun_2_x0, 20)
    # halving the step divides a 2nd-order error by about 4 (a 1st-order one by about 2)
    assert 3.0 < coarse / fine < 5.5, (coarse, fine)
    euler = ode_endpoint_error(S.sample_euler, 20)
    assert fine < 0.25 * euler, (fine, euler)


def test_exp_heun_2_x0_phi1_matches_independent_exponential_trapezoid():
    """solver_type phi_1 with r = 1: x_t = (σ_t/σ_s) x − expm1(−h)·(D_s + D_t)/2, written here
    from the SEEDS-2 formula in σ (λ = −log σ, α = 1)."""
    sigmas = torch.tensor([8.0, 3.0, 1.0, 0.3], dtype=torch.float64)
    x0 = torch.linspace(-2, 2, 32, dtype=torch.float64).reshape(1, 2, 4, 4) * 8.0
    out = S.sample_exp_heun_2_x0(gaussian, x0.clone(), sigmas, solver_type="phi_1")
    x = x0.clone()
    for s, t in zip(sigmas[:-1], sigmas[1:]):
        d_s = gaussian(x, s.reshape(1))
        x_t = (t / s) * x + (1 - t / s) * d_s  # the first stage lands on σ_t
        d_t = gaussian(x_t, t.reshape(1))
        x = (t / s) * x + (1 - t / s) * (d_s + d_t) / 2
    assert torch.allclose(out, x, atol=1e-12)


def test_exp_heun_2_x0_sde_with_eta_zero_is_exp_heun_2_x0():
    sigmas = karras(6)
    x = 10 * torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    det = S.sample_exp_heun_2_x0(gaussian, x.clone(), sigmas)
    sde0 = S.sample_exp_heun_2_x0_sde(gaussian, x.clone(), sigmas, eta=0.0)
    assert torch.equal(det, sde0)


def test_exp_heun_2_x0_sde_is_deterministic_for_a_seed_and_injects_noise():
    sigmas = karras(6)
    x = 10 * torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(5))
    a = S.sample_exp_heun_2_x0_sde(gaussian, x.clone(), sigmas.float(), extra_args={"seed": 3})
    b = S.sample_exp_heun_2_x0_sde(gaussian, x.clone(), sigmas.float(),
                                   noise_sampler=default_noise_sampler(x, 3))
    c = S.sample_exp_heun_2_x0_sde(gaussian, x.clone(), sigmas.float(), extra_args={"seed": 4})
    det = S.sample_exp_heun_2_x0(gaussian, x.clone(), sigmas.float())
    assert torch.equal(a, b)
    assert not torch.allclose(a, c) and not torch.allclose(a, det)


def test_exp_heun_2_x0_sde_keeps_exact_marginal_std():
    """Data = the point 0 (D = 0): each step's Brownian increment must leave std σ_next."""
    sigmas = torch.tensor([10.0, 4.0, 1.5, 0.6])
    x = sigmas[0] * torch.randn((64, 1, 32, 32), generator=torch.Generator().manual_seed(3))
    out = S.sample_exp_heun_2_x0_sde(lambda x, s, **_: torch.zeros_like(x), x, sigmas,
                                     noise_sampler=default_noise_sampler(x, seed=8))
    assert float(out.std()) == pytest.approx(0.6, rel=0.01)


def _run(model, sampler, guidance=None, negative_model=None, seed=7):
    latent = Latent(torch.zeros(1, 4, 4, 4))
    guidance = guidance or Guidance("cfg", (cond_value(1.0), cond_value(-1.0)), (3.0,))
    out, _ = sample_custom(model, guidance=guidance, sampler=sampler,
                           sigmas=karras(6).float(), noise=initial_noise(latent, seed), seed=seed,
                           latent=latent, negative_model=negative_model)
    return out.samples


def test_sampler_seeds2_node_phi2_r1_eta0_is_ksamplers_exp_heun_2_x0():
    (node_sampler,) = csn.SamplerSEEDS2(solver_type="phi_2", eta=0.0, s_noise=1.0, r=1.0)
    assert node_sampler.name == "seeds_2"
    assert torch.equal(_run(PromptModel(), node_sampler), _run(PromptModel(), Sampler("exp_heun_2_x0")))


def test_sampler_seeds2_node_phi2_r1_is_ksamplers_exp_heun_2_x0_sde():
    (node_sampler,) = csn.SamplerSEEDS2(solver_type="phi_2", eta=1.0, s_noise=1.0, r=1.0)
    a = _run(PromptModel(), node_sampler, seed=9)
    assert torch.equal(a, _run(PromptModel(), Sampler("exp_heun_2_x0_sde"), seed=9))
    assert not torch.equal(a, _run(PromptModel(), node_sampler, seed=10))


def test_sampler_seeds2_node_defaults_are_ksamplers_seeds_2():
    (node_sampler,) = csn.SamplerSEEDS2(solver_type="phi_1", eta=1.0, s_noise=1.0, r=0.5)
    assert torch.equal(_run(PromptModel(), node_sampler), _run(PromptModel(), Sampler("seeds_2")))


# ------------------------------------------------------------------------ DualModelGuider


def _dual(cfg, pos=2.0, neg=-1.0):
    return Guidance("dual_model", (cond_value(pos), cond_value(neg)), (cfg,))


def test_dual_model_guidance_runs_the_negative_on_the_second_model():
    main, second = PromptModel(k=1.0), PromptModel(k=3.0)
    x = torch.zeros(1, 4, 4, 4)  # x = 0: a prediction is k·c
    den = build_denoiser(_dual(2.5), main, x, None, ModelSampling("x0"), negative_model=second)
    out = den(x, torch.tensor([1.0]))
    cond, uncond = 1.0 * 2.0, 3.0 * -1.0
    assert torch.allclose(out, torch.full_like(out, uncond + 2.5 * (cond - uncond)))
    assert main.calls == [1] and second.calls == [1]  # positive on one, negative on the other


def test_dual_model_guidance_with_the_same_model_is_cfg():
    model = PromptModel()
    x = torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)
    sigma = torch.tensor([1.3])
    ms = ModelSampling("x0")
    dual = build_denoiser(_dual(3.5), model, x, None, ms, negative_model=model)(x, sigma)
    cfg = build_denoiser(Guidance("cfg", (cond_value(2.0), cond_value(-1.0)), (3.5,)), model, x, None, ms)(x, sigma)
    assert torch.allclose(dual, cfg, atol=1e-6)


def test_dual_model_guidance_at_cfg_one_never_runs_the_second_model():
    main, second = PromptModel(), PromptModel(k=3.0)
    x = torch.zeros(1, 4, 4, 4)
    den = build_denoiser(_dual(1.0), main, x, None, ModelSampling("x0"), negative_model=second)
    out = den(x, torch.tensor([1.0]))
    assert torch.allclose(out, torch.full_like(out, 2.0)) and second.calls == []
    with pytest.raises(ValueError, match="cfg 1"):
        den.with_uncond(x, torch.tensor([1.0]))


def test_dual_model_sampling_with_the_same_model_equals_cfg_guider():
    for name in ("euler", "dpmpp_2m", "seeds_2"):
        model = PromptModel()
        dual = _run(model, Sampler(name), _dual(3.0, 1.0, -1.0), negative_model=model)
        assert torch.allclose(dual, _run(PromptModel(), Sampler(name)), atol=1e-5), name


def test_dual_model_guider_node_payloads():
    pos, neg = cond_value(1.0), cond_value(-1.0)
    # the engine passes None for an unconnected optional input
    (plain,) = csn.DualModelGuider(model="main", model_negative=None, positive=pos, cfg=4.0,
                                   negative=neg)
    assert plain == Guider("main", Guidance("cfg", (pos, neg), (4.0,)))
    (dual,) = csn.DualModelGuider(model="main", model_negative="other", positive=pos, cfg=4.0,
                                  negative=neg)
    assert dual.guidance.kind == "dual_model" and dual.negative_model == "other"
    # unconnected negative: ComfyUI's text-free [[None, {}]] (refused only where a UNet runs it)
    (free,) = csn.DualModelGuider(model="main", model_negative="other", positive=pos, cfg=4.0,
                                  negative=None)
    assert free.guidance.conds == (pos, TEXT_FREE) and free.guidance.conds[1][0].cross_attn is None
    with pytest.raises(ValueError, match="negative_model"):
        Guider("main", Guidance("dual_model", (pos, neg), (4.0,)))
