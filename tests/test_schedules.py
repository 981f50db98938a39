"""Schedules and schedulers against ComfyUI reference values (comfy-conventions.md)."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from mixgraph.nodes.sampling.schedules import (
    SCHEDULER_NAMES,
    DiscreteSchedule,
    beta_scheduler,
    calculate_sigmas,
)


@pytest.fixture(scope="module")
def sched():
    return DiscreteSchedule()


def test_schedule_sigma_range_matches_reference(sched):
    assert sched.sigmas.dtype == torch.float32 and sched.sigmas.shape == (1000,)
    assert float(sched.sigma_min) == pytest.approx(0.0291672, abs=1e-7)
    assert float(sched.sigma_max) == pytest.approx(14.6146412, abs=1e-6)


def test_schedule_timestep_is_nearest_and_sigma_interpolates_log(sched):
    t = torch.tensor([0, 1, 500, 999])
    assert torch.equal(sched.timestep(sched.sigma(t.float())), t)
    mid = sched.sigma(torch.tensor(10.5))
    expect = math.exp(0.5 * (float(sched.log_sigmas[10]) + float(sched.log_sigmas[11])))
    assert float(mid) == pytest.approx(expect, rel=1e-6)
    assert int(sched.timestep(torch.tensor(float(sched.sigmas[321]) * 1.0001))) == 321


def test_scheduler_names_in_comfyui_order():
    assert SCHEDULER_NAMES == (
        "simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
        "linear_quadratic", "kl_optimal",
    )


def test_normal_4_steps_reference(sched):
    s = calculate_sigmas(sched, "normal", 4)
    ref = torch.tensor([14.61464, 2.91831, 0.93236, 0.02917, 0.0])
    assert torch.allclose(s, ref, atol=1e-5)


def test_karras_and_exponential_reference_sums(sched):
    k = calculate_sigmas(sched, "karras", 20)
    assert len(k) == 21 and float(k[-1]) == 0.0
    assert float(k[0]) == pytest.approx(14.614643, abs=2e-6)
    assert float(k[1]) == pytest.approx(11.725368, abs=2e-6)
    assert float(k.sum()) == pytest.approx(66.509695, abs=2e-5)
    e = calculate_sigmas(sched, "exponential", 20)
    assert float(e.sum()) == pytest.approx(52.295978, abs=2e-5)


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
@pytest.mark.parametrize("steps", [1, 3, 10])
def test_every_scheduler_decreasing_ending_in_zero(sched, name, steps):
    s = calculate_sigmas(sched, name, steps)
    assert s.dtype == torch.float32
    assert float(s[-1]) == 0.0
    assert len(s) <= steps + 1
    if name != "beta":  # beta drops duplicate timesteps
        assert len(s) == steps + 1
    assert bool((s[:-1] > s[1:]).all())


def test_simple_scheduler_formula(sched):
    s = calculate_sigmas(sched, "simple", 3)
    idx = [-(1 + int(i * 1000 / 3)) for i in range(3)]
    assert s.tolist()[:3] == [float(sched.sigmas[i]) for i in idx]


def test_ddim_uniform_scheduler_formula(sched):
    s = calculate_sigmas(sched, "ddim_uniform", 4)
    expect = [float(sched.sigmas[i]) for i in (751, 501, 251, 1)] + [0.0]
    assert s.tolist() == pytest.approx(expect, abs=0)


def test_beta_scheduler_formula(sched):
    s = calculate_sigmas(sched, "beta", 5)
    ts = np.rint(scipy.stats.beta.ppf(1 - np.linspace(0, 1, 5, endpoint=False), 0.6, 0.6) * 999)
    assert s[:-1].tolist() == [float(sched.sigmas[int(t)]) for t in ts]


def test_kl_optimal_and_sgm_uniform_formulas(sched):
    s = calculate_sigmas(sched, "kl_optimal", 4)
    lo, hi = math.atan(float(sched.sigma_min)), math.atan(float(sched.sigma_max))
    expect = [math.tan(hi + (lo - hi) * i / 3) for i in range(4)]
    assert s[:-1].tolist() == pytest.approx(expect, rel=1e-5)
    g = calculate_sigmas(sched, "sgm_uniform", 4)
    ts = torch.linspace(999, 0, 5)[:-1]
    assert g[:-1].tolist() == pytest.approx([float(sched.sigma(t)) for t in ts], rel=1e-6)


def test_linear_quadratic_starts_at_sigma_max(sched):
    s = calculate_sigmas(sched, "linear_quadratic", 6)
    assert float(s[0]) == pytest.approx(float(sched.sigma_max))
    assert calculate_sigmas(sched, "linear_quadratic", 1).tolist() == pytest.approx(
        [float(sched.sigma_max), 0.0])


def test_unknown_scheduler_names_choices(sched):
    with pytest.raises(ValueError, match="karras"):
        calculate_sigmas(sched, "nope", 3)


def test_zsnr_rescale_gives_zero_terminal_snr():
    z = DiscreteSchedule(zsnr=True)
    # alphas_bar[-1] pinned at 4.8973451890853435e-08
    assert float(z.sigma_max) == pytest.approx(math.sqrt((1 - 4.8973451890853435e-08)
                                                         / 4.8973451890853435e-08), rel=1e-5)
    assert float(z.sigma_min) == pytest.approx(0.0291672, rel=1e-3)


def test_distilled_lcm_schedule_has_50_steps():
    d = DiscreteSchedule(distilled=True)
    assert d.sigmas.shape == (50,)
    full = DiscreteSchedule()
    assert float(d.sigma_max) == float(full.sigma_max)
    assert d.timestep(d.sigmas[:3]).tolist() == [19, 39, 59]
    assert float(d.sigma(torch.tensor(39.0))) == pytest.approx(float(d.sigmas[1]), rel=1e-6)


def test_percent_to_sigma_round_trip(sched):
    assert sched.percent_to_sigma(0.0) > 1e8 and sched.percent_to_sigma(1.0) == 0.0
    for p in (0.1, 0.5, 0.9):
        assert sched.sigma_to_percent(sched.percent_to_sigma(p)) == pytest.approx(p, abs=1e-6)


@pytest.mark.parametrize("alpha,beta", [(0.6, 0.6), (0.1, 2.0), (3.7, 0.3), (50.0, 50.0)])
def test_beta_scheduler_matches_scipy_stats_beta_ppf_bit_for_bit(sched, alpha, beta):
    """The schedule uses scipy.special.betaincinv (a cheaper import than scipy.stats); it must
    give exactly the timesteps of scipy.stats.beta.ppf, ComfyUI's call."""
    for steps in (1, 2, 7, 20, 150, 1000):
        q = 1 - np.linspace(0, 1, steps, endpoint=False)
        ts = np.rint(scipy.stats.beta.ppf(q, alpha, beta) * 999)
        expect, last = [], -1
        for t in ts:
            if t != last:
                expect.append(float(sched.sigmas[int(t)]))
            last = t
        assert beta_scheduler(sched, steps, alpha, beta)[:-1].tolist() == expect
