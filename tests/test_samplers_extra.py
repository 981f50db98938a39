"""Extra samplers (CFG++, RES, gradient estimation, ER-SDE, SEEDS, SA-Solver) on an analytic
Gaussian denoiser.

Data ~ N(mu, s^2) per element has the optimal denoiser D(x, sigma) = (s^2 x + sigma^2 mu) /
(s^2 + sigma^2), and the probability-flow ODE maps x_T at sigma_T to
mu + (x_T - mu) * s_t / s_T with s_t = sqrt(s^2 + sigma_t^2). Samplers finish with a denoising step
from sigma_min to 0, so the exact endpoint they approach is D(x_ode(sigma_min), sigma_min).
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import integrate

from mixgraph.nodes.sampling import samplers as se
from mixgraph.nodes.sampling.noise import default_noise_sampler
from mixgraph.nodes.sampling.solvers_sa import sa_solver_b_coeffs, sa_solver_default_tau
from mixgraph.nodes.sampling.solvers_sde import er_sde_default_noise_scaler
from tests.fixtures.sampler_models import UNetSeam

MU, S = 0.3, 0.5
SIGMA_MIN, SIGMA_MAX = 0.0292, 14.6146


def karras(n: int, sigma_min: float = SIGMA_MIN, sigma_max: float = SIGMA_MAX, rho: float = 7.0):
    """Karras et al. 2022 schedule (rho = 7) with a trailing 0; float32 like the glue's."""
    ramp = torch.linspace(0, 1, n, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sig = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sig, sig.new_zeros(1)]).float()


def gaussian_x0(x: torch.Tensor, sigma: torch.Tensor, mu: float) -> torch.Tensor:
    sigma = sigma.reshape(-1, *([1] * (x.ndim - 1)))
    return (S**2 * x + sigma**2 * mu) / (S**2 + sigma**2)


class Gaussian:
    """Optimal denoiser for N(MU, S^2); accepts (and ignores) ``seed`` like the real denoisers."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x, sigma, **extra_args):
        self.calls += 1
        return gaussian_x0(x, sigma, MU)


class GuidedGaussian:
    """CFG between two Gaussian 'conditions' (means ``mu_cond`` / ``mu_uncond``), exposing
    ``with_uncond`` as ``parameterization.CFGDenoiser`` does."""

    def __init__(self, mu_cond: float, mu_uncond: float, cfg: float):
        self.mu_cond, self.mu_uncond, self.cfg = mu_cond, mu_uncond, cfg

    def with_uncond(self, x, sigma, **extra_args):
        cond = gaussian_x0(x, sigma, self.mu_cond)
        uncond = gaussian_x0(x, sigma, self.mu_uncond)
        return uncond + self.cfg * (cond - uncond), uncond

    def __call__(self, x, sigma, **extra_args):
        return self.with_uncond(x, sigma)[0]


def start(shape, seed: int, sigma_max: float = SIGMA_MAX) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return MU + math.sqrt(S**2 + sigma_max**2) * torch.randn(shape, generator=g)


def exact_endpoint(x_t: torch.Tensor, sigma_max: float = SIGMA_MAX) -> torch.Tensor:
    x_min = MU + (x_t - MU) * math.sqrt(S**2 + SIGMA_MIN**2) / math.sqrt(S**2 + sigma_max**2)
    return gaussian_x0(x_min, torch.tensor([SIGMA_MIN]), MU)


def endpoint_error(fn, steps: int, **opts) -> float:
    x_t = start((2, 4, 8, 8), seed=0)
    out = fn(Gaussian(), x_t.clone(), karras(steps), **opts)
    return float((out - exact_endpoint(x_t)).abs().max())


DETERMINISTIC = {
    "euler_cfg_pp": (se.sample_euler_cfg_pp, {}),
    "dpmpp_2m_cfg_pp": (se.sample_dpmpp_2m_cfg_pp, {}),
    "res_multistep": (se.sample_res_multistep, {}),
    "res_multistep_cfg_pp": (se.sample_res_multistep_cfg_pp, {}),
    "gradient_estimation": (se.sample_gradient_estimation, {}),
    "gradient_estimation_cfg_pp": (se.sample_gradient_estimation_cfg_pp, {}),
    "seeds_2_ode": (se.sample_seeds_2, {"eta": 0.0}),
    "seeds_2_phi2_ode": (se.sample_seeds_2, {"eta": 0.0, "solver_type": "phi_2"}),
    "seeds_3_ode": (se.sample_seeds_3, {"eta": 0.0}),
    # phi(l) = l makes ER-SDE's ratio sigma_t / sigma_s and its noise 0: the ODE solver.
    "er_sde_ode": (se.sample_er_sde, {"noise_scaler": lambda lam: lam}),
    "sa_solver_ode": (se.sample_sa_solver, {"tau_func": lambda sigma: 0.0}),
    "sa_solver_pece_ode": (se.sample_sa_solver_pece, {"tau_func": lambda sigma: 0.0}),
    "sa_solver_simple2_ode": (se.sample_sa_solver, {"tau_func": lambda sigma: 0.0,
                                                     "predictor_order": 2, "corrector_order": 2,
                                                     "simple_order_2": True}),
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_deterministic_samplers_converge_to_exact_endpoint(name):
    fn, opts = DETERMINISTIC[name]
    coarse, fine = endpoint_error(fn, 20, **opts), endpoint_error(fn, 80, **opts)
    assert fine < 0.55 * coarse, (coarse, fine)
    assert fine < 0.05, fine  # Euler-like first-order samplers: ~0.043 at 80 steps


@pytest.mark.parametrize("name", ["res_multistep", "seeds_2_ode", "seeds_3_ode", "er_sde_ode",
                                  "sa_solver_ode", "sa_solver_pece_ode"])
def test_high_order_samplers_beat_euler_cfg_pp(name):
    fn, opts = DETERMINISTIC[name]
    euler = endpoint_error(se.sample_euler_cfg_pp, 40)
    assert endpoint_error(fn, 40, **opts) < 0.25 * euler


STOCHASTIC = {
    "euler_ancestral_cfg_pp": (se.sample_euler_ancestral_cfg_pp, {}),
    "dpmpp_2s_ancestral_cfg_pp": (se.sample_dpmpp_2s_ancestral_cfg_pp, {}),
    "res_multistep_ancestral": (se.sample_res_multistep_ancestral, {}),
    "res_multistep_ancestral_cfg_pp": (se.sample_res_multistep_ancestral_cfg_pp, {}),
    "er_sde": (se.sample_er_sde, {}),
    "seeds_2": (se.sample_seeds_2, {}),
    "seeds_3": (se.sample_seeds_3, {}),
    "sa_solver": (se.sample_sa_solver, {}),
    "sa_solver_pece": (se.sample_sa_solver_pece, {}),
}


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_stochastic_samplers_match_data_distribution(name):
    fn, opts = STOCHASTIC[name]
    x_t = start((16, 1, 32, 32), seed=1)  # 16384 samples: std error of the mean ~0.004
    # 100 steps: first-order ancestral Euler still loses ~0.02 of std to discretisation.
    out = fn(Gaussian(), x_t, karras(100), noise_sampler=default_noise_sampler(x_t, seed=5), **opts)
    assert abs(float(out.mean()) - MU) < 0.025
    assert abs(float(out.std()) - S) < 0.025
    # Noise really enters: not the ODE endpoint of the same start.
    assert float((out - exact_endpoint(x_t)).abs().mean()) > 0.05


class PointMass:
    """Data = the point 0: D(x, sigma) = 0 exactly, so every solver stage is exact and the only
    thing left to check is that the injected noise has exactly the right variance."""

    def __call__(self, x, sigma, **extra_args):
        return torch.zeros_like(x)


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_stochastic_samplers_keep_exact_marginal_std(name):
    fn, opts = STOCHASTIC[name]
    sigmas = torch.tensor([10.0, 4.0, 1.5, 0.6])  # partial run, large steps, inside SA's tau band
    x = sigmas[0] * torch.randn((64, 1, 32, 32), generator=torch.Generator().manual_seed(3))
    tau = {"tau_func": lambda sigma: 1.0} if name.startswith("sa_solver") else {}
    out = fn(PointMass(), x, sigmas, noise_sampler=default_noise_sampler(x, seed=8), **opts, **tau)
    assert float(out.std()) == pytest.approx(float(sigmas[-1]), rel=0.01)
    assert abs(float(out.mean())) < 0.01


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_stochastic_samplers_reproduce_under_seed(name):
    fn, opts = STOCHASTIC[name]
    x_t = start((1, 4, 8, 8), seed=2)
    a = fn(Gaussian(), x_t, karras(8), extra_args={"seed": 11}, **opts)
    b = fn(Gaussian(), x_t, karras(8), noise_sampler=default_noise_sampler(x_t, 11), **opts)
    c = fn(Gaussian(), x_t, karras(8), extra_args={"seed": 12}, **opts)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


CFG_PP_PAIRS = [
    ("res_multistep_cfg_pp", "res_multistep", {}),
    ("res_multistep_ancestral_cfg_pp", "res_multistep_ancestral", {}),
    ("gradient_estimation_cfg_pp", "gradient_estimation", {}),
]


@pytest.mark.parametrize("cfg_pp_name, base_name, opts", CFG_PP_PAIRS)
def test_cfg_pp_with_equal_conditions_reduces_to_base(cfg_pp_name, base_name, opts):
    cfg_pp, base = getattr(se, f"sample_{cfg_pp_name}"), getattr(se, f"sample_{base_name}")
    x_t = start((1, 4, 8, 8), seed=3)
    model = GuidedGaussian(MU, MU, cfg=1.0)
    a = cfg_pp(model, x_t, karras(12), extra_args={"seed": 4}, **opts)
    b = base(Gaussian(), x_t, karras(12), extra_args={"seed": 4}, **opts)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg_pp_name, base_name", [
    ("euler_cfg_pp", "euler"),
    ("euler_ancestral_cfg_pp", "euler_ancestral"),
    ("dpmpp_2s_ancestral_cfg_pp", "dpmpp_2s_ancestral"),
    ("dpmpp_2m_cfg_pp", "dpmpp_2m"),
])
def test_cfg_pp_with_equal_conditions_matches_core_sampler(cfg_pp_name, base_name):
    samplers = pytest.importorskip("nodes.sampling.samplers")
    base = getattr(samplers, f"sample_{base_name}", None)
    if base is None:
        pytest.skip(f"core sampler {base_name} not in samplers.py yet")
    cfg_pp = getattr(se, f"sample_{cfg_pp_name}")
    x_t = start((1, 4, 8, 8), seed=3)
    a = cfg_pp(GuidedGaussian(MU, MU, cfg=1.0), x_t, karras(12), extra_args={"seed": 4})
    b = base(Gaussian(), x_t, karras(12), extra_args={"seed": 4})
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_euler_cfg_pp_step_renoises_with_uncond_noise():
    # CFG++ DDIM (Chung et al. 2024, Alg. 1): x1 = D_guided(x0) + s1 (x0 - D_uncond(x0)) / s0
    model = GuidedGaussian(mu_cond=1.0, mu_uncond=-1.0, cfg=0.6)
    x0 = start((1, 4, 4, 4), seed=6, sigma_max=5.0)
    sig = torch.tensor([5.0, 2.0])
    guided, uncond = model.with_uncond(x0, sig[:1])
    expected = guided + 2.0 * (x0 - uncond) / 5.0
    torch.testing.assert_close(se.sample_euler_cfg_pp(model, x0, sig), expected)


@pytest.mark.parametrize("name", ["euler_cfg_pp", "dpmpp_2m_cfg_pp", "res_multistep_cfg_pp",
                                  "gradient_estimation_cfg_pp"])
def test_cfg_pp_uses_uncond_when_conditions_differ(name):
    fn = getattr(se, f"sample_{name}")
    x_t = start((1, 4, 8, 8), seed=7)
    model = GuidedGaussian(mu_cond=1.0, mu_uncond=-1.0, cfg=0.8)

    class GuidedOnly:  # the same CFG output, but no access to the unconditional prediction
        def __call__(self, x, sigma, **extra_args):
            return model(x, sigma)

    a = fn(model, x_t, karras(10))
    b = fn(GuidedOnly(), x_t, karras(10))
    assert float((a - b).abs().max()) > 1e-2


def test_callback_fires_once_per_step_with_contract_keys():
    seen = []
    x_t = start((1, 4, 4, 4), seed=8)
    sig = karras(6)
    se.sample_sa_solver_pece(Gaussian(), x_t, sig, extra_args={"seed": 1}, callback=seen.append)
    assert [d["i"] for d in seen] == list(range(6))
    assert all({"i", "x", "sigma", "sigma_hat", "denoised"} <= set(d) for d in seen)
    torch.testing.assert_close(torch.stack([d["sigma"] for d in seen]), sig[:-1])


def test_model_call_counts():
    x_t = start((1, 4, 4, 4), seed=9)
    counts = {}
    for name in ["seeds_2", "seeds_3", "sa_solver", "sa_solver_pece", "dpmpp_2s_ancestral_cfg_pp"]:
        model = Gaussian()
        getattr(se, f"sample_{name}")(model, x_t, karras(5), extra_args={"seed": 0})
        counts[name] = model.calls
    # Multi-stage: extra calls on every step but the final denoising step; PECE: one per correction.
    assert counts == {"seeds_2": 9, "seeds_3": 13, "sa_solver": 5, "sa_solver_pece": 9,
                      "dpmpp_2s_ancestral_cfg_pp": 9}


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_sa_solver_b_coeffs_integrate_polynomials_exactly(tau):
    nodes = torch.tensor([-1.3, -0.9, -0.6, -0.2], dtype=torch.float64)
    lam_s, lam_t = torch.tensor(-0.2, dtype=torch.float64), torch.tensor(0.35, dtype=torch.float64)
    sigma_t = torch.exp(-lam_t)
    b = sa_solver_b_coeffs(nodes, lam_s, lam_t, tau, sigma_t)
    k = 1 + tau**2
    for p in range(4):
        exact, _ = integrate.quad(lambda l: k * math.exp(k * (l - 0.35)) * l**p, -0.2, 0.35)
        # alpha_t = sigma_t * exp(lambda_t) = 1
        assert float((b * nodes**p).sum()) == pytest.approx(exact, rel=1e-9, abs=1e-12)


def test_sa_solver_default_tau_interval_matches_sd_schedule():
    tau = sa_solver_default_tau()
    assert tau(torch.tensor(5.0)) == 1.0 and tau(torch.tensor(0.6)) == 1.0
    assert tau(torch.tensor(5.2)) == 0.0 and tau(torch.tensor(0.55)) == 0.0
    assert tau(torch.tensor(14.6)) == 0.0 and tau(torch.tensor(0.03)) == 0.0


def test_er_sde_default_noise_scaler_formula():
    lam = torch.tensor([0.5, 2.0, 10.0])
    torch.testing.assert_close(er := er_sde_default_noise_scaler(lam),
                               lam * (torch.exp(lam**0.3) + 10.0))
    assert bool((er[1:] > er[:-1]).all())


def test_registry_dict_names_and_partial_schedules():
    newer = {
        "euler_cfg_pp", "euler_ancestral_cfg_pp", "dpmpp_2s_ancestral_cfg_pp", "dpmpp_2m_cfg_pp",
        "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
        "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
        "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece"}
    # A schedule cut before 0 (KSamplerAdvanced's leftover noise) stays finite and noisy.
    x_t = start((1, 4, 4, 4), seed=10)
    partial = karras(10)[:6]
    assert newer < set(se.SAMPLERS)
    for name in newer:
        fn = se.SAMPLERS[name]
        out = fn(Gaussian(), x_t, partial, extra_args={"seed": 3})
        assert torch.isfinite(out).all(), name
        assert float(out.std()) > S, name


class PromptShiftedEps(UNetSeam):
    """A real (non-mock) SamplerModel for ``CFGDenoiser``: an eps predictor linear in its input and
    shifted by the prompt embedding's mean, so different prompts give different x0."""

    prediction, zsnr, latent_scale, in_channels = "eps", False, 0.18215, 4

    def unet(self, x, timesteps, context, y=None, control=None):
        return 0.5 * x + context.mean(dim=(1, 2)).view(-1, 1, 1, 1)

    def adm(self, cond, latent_hw, negative=False):
        return None


def _cfg_denoiser(pos_value: float, neg_value: float, cfg: float):
    from mixgraph.nodes.payloads.conditioning import Cond
    from mixgraph.nodes.sampling.parameterization import CFGDenoiser

    pos = (Cond(cross_attn=torch.full((1, 3, 8), pos_value)),)
    neg = (Cond(cross_attn=torch.full((1, 3, 8), neg_value)),)
    return CFGDenoiser(PromptShiftedEps(), pos, neg, cfg, latent_image=torch.zeros(1, 4, 4, 4))


def test_cfg_pp_through_cfg_denoiser_equal_prompts_match_base():
    # Same prompt on both sides: guided == uncond at any cfg, so CFG++ is the base sampler.
    den = _cfg_denoiser(0.2, 0.2, cfg=4.0)
    x_t = start((1, 4, 4, 4), seed=12)
    for cfg_pp, base in [(se.sample_res_multistep_cfg_pp, se.sample_res_multistep),
                         (se.sample_gradient_estimation_cfg_pp, se.sample_gradient_estimation)]:
        torch.testing.assert_close(cfg_pp(den, x_t, karras(8)), base(den, x_t, karras(8)),
                                   rtol=1e-5, atol=1e-5)
    differing = _cfg_denoiser(0.2, -0.4, cfg=1.0)  # cfg 1: negative still evaluated for CFG++
    a = se.sample_euler_cfg_pp(differing, x_t, karras(8))
    b = se.sample_euler_cfg_pp(_cfg_denoiser(0.2, 0.2, cfg=1.0), x_t, karras(8))
    assert float((a - b).abs().max()) > 1e-3


def test_sa_solver_default_tau_uses_cfg_denoiser_schedule():
    den = _cfg_denoiser(0.1, 0.1, cfg=2.0)
    x_t = start((1, 4, 4, 4), seed=13)
    a = se.sample_sa_solver(den, x_t, karras(6), extra_args={"seed": 1})
    b = se.sample_sa_solver(den, x_t, karras(6), extra_args={"seed": 1},
                            tau_func=sa_solver_default_tau(den.ms.schedule))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
