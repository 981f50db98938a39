"""Samplers on an analytic Gaussian denoiser.

Data x0 ~ N(mu, s²) per element has the optimal denoiser D(x, σ) = (s²x + σ²mu)/(s² + σ²), and
the probability-flow ODE maps x(σ_a) to x(σ_b) = mu + (x − mu)·sqrt(s² + σ_b²)/sqrt(s² + σ_a²).
"""

import math

import pytest
import torch

from mixgraph.nodes.sampling import samplers as S
from mixgraph.nodes.sampling.noise import (
    BrownianTreeNoiseSampler,
    default_noise_sampler,
    prepare_noise,
)
from mixgraph.nodes.sampling.schedules import karras_scheduler

MU, SD = 0.5, 0.8


def gaussian_denoiser(x, sigma, **_):
    sg = sigma.reshape(-1, *([1] * (x.ndim - 1)))
    return (SD * SD * x + sg * sg * MU) / (SD * SD + sg * sg)


def ode_endpoint(x, sigma_from, sigma_to):
    return MU + (x - MU) * math.sqrt(SD**2 + sigma_to**2) / math.sqrt(SD**2 + sigma_from**2)


FIRST_ORDER = ["euler", "ddim", "heunpp2"]
HIGHER_ORDER = ["heun", "dpm_2", "lms", "dpm_fast", "dpmpp_2m", "ipndm", "ipndm_v", "deis",
                "uni_pc", "uni_pc_bh2"]
ANCESTRAL = ["euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "ddpm"]
SDE = ["dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun",
       "dpmpp_2m_sde_heun_gpu", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu"]
MINE = FIRST_ORDER + HIGHER_ORDER + ANCESTRAL + SDE + ["lms", "dpm_adaptive", "lcm"]


def x_start(sigma0, shape=(8, 1, 2, 2), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (MU + torch.randn(shape, generator=g) * math.sqrt(SD**2 + sigma0**2)).to(dtype)


def ode_error(name, steps):
    # Ending at σ = 0.05 (no final zero) so the error measures the solver, not the last jump.
    sigmas = karras_scheduler(steps, 0.05, 14.6146)[:-1].double()
    x = x_start(float(sigmas[0]))
    out = S.get_sampler(name)(gaussian_denoiser, x, sigmas)
    return float((out - ode_endpoint(x, float(sigmas[0]), float(sigmas[-1]))).abs().max())


def test_sampler_names_are_comfyui_list():
    assert len(S.SAMPLER_NAMES) == len(set(S.SAMPLER_NAMES)) == 45
    assert S.SAMPLER_NAMES[:6] == ("euler", "euler_cfg_pp", "euler_ancestral",
                                   "euler_ancestral_cfg_pp", "heun", "heunpp2")
    assert S.SAMPLER_NAMES[-3:] == ("ddim", "uni_pc", "uni_pc_bh2")


def test_sampler_registry_maps_every_name_to_one_function():
    assert tuple(S.SAMPLERS) == S.SAMPLER_NAMES
    assert all(callable(fn) for fn in S.SAMPLERS.values())
    assert len({id(fn) for fn in S.SAMPLERS.values()}) == 45       # no name shares a function
    assert all(S.get_sampler(n) is S.SAMPLERS[n] for n in S.SAMPLER_NAMES)
    assert S.get_sampler("euler") is S.sample_euler
    assert S.get_sampler("dpmpp_2m_sde_gpu") is S.sample_dpmpp_2m_sde_gpu


def test_sampler_registry_rejects_unknown_names():
    assert "nope" not in S.SAMPLERS
    with pytest.raises(ValueError, match="unknown sampler 'nope'"):
        S.get_sampler("nope")


@pytest.mark.parametrize("name", FIRST_ORDER)
def test_first_order_sampler_converges_to_ode_endpoint(name):
    e10, e40 = ode_error(name, 10), ode_error(name, 40)
    assert e40 < 0.07
    assert e10 / e40 > 3.5  # first order: ~4x for 4x the steps


@pytest.mark.parametrize("name", HIGHER_ORDER)
def test_higher_order_sampler_converges_to_ode_endpoint(name):
    e10, e40 = ode_error(name, 10), ode_error(name, 40)
    assert e40 < 5e-3
    assert e10 / e40 > 12  # at least second order: ~16x for 4x the steps


@pytest.mark.parametrize("name", FIRST_ORDER + HIGHER_ORDER)
def test_deterministic_sampler_with_final_zero_lands_near_data_endpoint(name):
    sigmas = karras_scheduler(20, 0.0292, 14.6146)
    x = x_start(float(sigmas[0]), dtype=torch.float32)
    out = S.get_sampler(name)(gaussian_denoiser, x, sigmas)
    end = 0.0
    if name == "dpm_fast":
        end = float(sigmas[-2])  # ComfyUI stops dpm_fast/adaptive at the last non-zero σ
    ref = ode_endpoint(x, float(sigmas[0]), end)
    assert float((out - ref).abs().max()) < 0.15


def test_dpm_adaptive_meets_its_tolerance():
    sigmas = karras_scheduler(10, 0.05, 14.6146).double()
    x = x_start(float(sigmas[0]))
    out = S.sample_dpm_adaptive(gaussian_denoiser, x, sigmas, rtol=1e-5, atol=1e-6)
    ref = ode_endpoint(x, float(sigmas[0]), float(sigmas[-2]))
    assert float((out - ref).abs().max()) < 1e-3


@pytest.mark.parametrize("name,steps", [(n, 300) for n in ["euler_ancestral", "ddpm"]]
                         + [(n, 60) for n in ANCESTRAL[1:3] + SDE[::2]])
def test_stochastic_sampler_matches_data_distribution(name, steps):
    sigmas = karras_scheduler(steps, 0.0292, 14.6146)
    x = x_start(float(sigmas[0]), shape=(4096, 1, 2, 2), seed=1, dtype=torch.float32)
    out = S.get_sampler(name)(gaussian_denoiser, x, sigmas, extra_args={"seed": 7})
    assert float(out.mean()) == pytest.approx(MU, abs=0.02)
    assert float(out.std()) == pytest.approx(SD, abs=0.02)


@pytest.mark.parametrize("name", ANCESTRAL + ["dpmpp_sde", "dpmpp_2m_sde", "dpmpp_3m_sde", "lcm"])
def test_stochastic_sampler_same_seed_same_output(name):
    sigmas = karras_scheduler(6, 0.0292, 14.6146)
    x = x_start(float(sigmas[0]), shape=(2, 1, 3, 3), dtype=torch.float32)
    fn = S.get_sampler(name)
    a = fn(gaussian_denoiser, x, sigmas, extra_args={"seed": 3})
    b = fn(gaussian_denoiser, x, sigmas, extra_args={"seed": 3})
    c = fn(gaussian_denoiser, x, sigmas, extra_args={"seed": 4})
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_gpu_variant_on_cpu_equals_cpu_tree():
    sigmas = karras_scheduler(5, 0.0292, 14.6146)
    x = x_start(float(sigmas[0]), shape=(2, 1, 3, 3), dtype=torch.float32)
    a = S.sample_dpmpp_2m_sde(gaussian_denoiser, x, sigmas, extra_args={"seed": 3})
    b = S.sample_dpmpp_2m_sde_gpu(gaussian_denoiser, x, sigmas, extra_args={"seed": 3})
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(set(MINE) - {"dpm_fast", "dpm_adaptive"}))
def test_sampler_calls_back_once_per_step(name):
    sigmas = karras_scheduler(5, 0.0292, 14.6146)
    x = x_start(float(sigmas[0]), shape=(1, 1, 2, 2), dtype=torch.float32)
    seen = []
    S.get_sampler(name)(gaussian_denoiser, x, sigmas, extra_args={"seed": 1},
                        callback=lambda d: seen.append(d["i"]))
    assert seen == list(range(5))


def test_lcm_sampler_jumps_to_prediction_and_renoises():
    sigmas = torch.tensor([10.0, 2.0, 0.0])
    x = torch.zeros(1, 1, 2, 2)
    target = torch.full_like(x, 0.25)
    calls = []

    def oracle(x_in, sigma, **_):
        calls.append(x_in.clone())
        return target

    out = S.sample_lcm(oracle, x, sigmas, noise_sampler=lambda a, b: torch.ones_like(x))
    assert torch.equal(calls[1], target + 2.0)  # x0 + σ_next · noise
    assert torch.equal(out, target)


def test_denoise_with_uncond_plain_model_returns_prediction_twice():
    x, sigma = torch.ones(1, 1, 1, 1), torch.tensor([1.0])
    d, u = S.denoise_with_uncond(gaussian_denoiser, x, sigma)
    assert torch.equal(d, u)


def test_prepare_noise_reference_values_seed_42():
    noise = prepare_noise(torch.zeros(1, 4, 32, 32), 42)
    first = noise.flatten()[:5].tolist()
    assert first == pytest.approx([1.926915, 1.487284, 0.900717, -2.105521, 0.678418], abs=1e-6)


def test_prepare_noise_batch_index_picks_slices_of_batched_draw():
    full = prepare_noise(torch.zeros(3, 4, 8, 8), 5)
    picked = prepare_noise(torch.zeros(2, 4, 8, 8), 5, batch_index=(2, 0))
    assert torch.equal(picked[0], full[2]) and torch.equal(picked[1], full[0])


def test_default_noise_sampler_cpu_uses_node_seed_unchanged():
    """ComfyUI 0.3.64: a CPU generator seeded with the node seed itself (no offset)."""
    x = torch.zeros(2, 3)
    ns = default_noise_sampler(x, seed=10)
    gen = torch.Generator().manual_seed(10)
    for _ in range(3):  # one whole-shape draw per call, in call order
        assert torch.equal(ns(None, None), torch.randn(2, 3, generator=gen))


def test_brownian_noise_is_consistent_across_subdivision():
    x = torch.zeros(20000)
    ns = BrownianTreeNoiseSampler(x, 0.1, 10.0, seed=3, cpu=True)
    whole = ns(torch.tensor(8.0), torch.tensor(2.0)) * math.sqrt(6.0)
    a = ns(torch.tensor(8.0), torch.tensor(5.0)) * math.sqrt(3.0)
    b = ns(torch.tensor(5.0), torch.tensor(2.0)) * math.sqrt(3.0)
    assert torch.allclose(whole, a + b, atol=1e-4)  # W(t) increments add up
    unit = ns(torch.tensor(9.0), torch.tensor(1.0))
    assert float(unit.std()) == pytest.approx(1.0, abs=0.03)
