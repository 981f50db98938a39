"""Our samplers and schedules against the reference implementation, k-diffusion (Crowson, MIT;
PyPI ``k-diffusion``), on the same denoisers, sigmas and noise.

Most of ComfyUI's samplers are its fork of k-diffusion, so upstream k-diffusion is an independent
check of the algorithms. Installed for CI with ``pip install --no-deps k-diffusion==0.1.1.post1
torchdiffeq==0.2.5``: its full dependency list pulls torchvision (which must not sit beside our
torch) and its package ``__init__`` imports torchvision, clip and clean-fid, so ``import
k_diffusion.sampling`` cannot work here. ``k_diffusion/sampling.py`` itself needs only torch,
scipy, torchsde, tqdm, torchdiffeq and ``utils.append_dims``, so we load that one file from the
installed distribution as a private module (``_kdiffusion_reference.sampling``) whose ``utils`` is
a one-function helper below. The algorithms under test are upstream's, unmodified. Without
k-diffusion (or torchdiffeq) installed the whole module skips.

Denoisers: the analytic optimum for Gaussian data (D(x, σ) = (s²x + σ²μ)/(s² + σ²), per channel)
and a tiny seeded random conv eps-model (nonlinear in x and σ, so multistep history and second
evaluations matter).

Where ComfyUI deliberately differs from upstream, the test compares what should match and states
the difference:

* per-step noise: upstream's ``default_noise_sampler(x)`` draws ``randn_like`` from the global
  RNG; ComfyUI 0.3.64 (and we) draw from a ``torch.Generator`` seeded with the node seed.
  Checked by seeding the global RNG with the seed for upstream.
* SDE samplers: upstream builds ``BrownianTreeNoiseSampler`` without a seed (random); ComfyUI
  seeds it with ``extra_args["seed"]`` on the CPU. We give upstream the seeded tree explicitly.
* ``lms``: ComfyUI (and we) finish the step to σ = 0 with ``x = denoised``; upstream integrates
  the Lagrange polynomial to 0. Checked as ours(σ) == D(upstream(σ[:-1]), σ[-2]).
* ``dpm_fast`` / ``dpm_adaptive``: upstream takes (σ_min, σ_max, n); ComfyUI's wrapper passes the
  last non-zero sigma, σ_0 and len(σ) − 1, which our sigma-list signature does internally.
* last step to σ = 0: ComfyUI (and we) set ``x = denoised`` in euler_ancestral / dpmpp_sde where
  upstream takes an Euler step to 0: equal up to float rounding (bitwise here).
* churn (s_churn > 0 in euler/heun/dpm_2): ComfyUI and upstream draw it with ``randn_like`` from
  the global RNG; we draw from the seeded noise sampler. Upstream draws on every step, ComfyUI
  (and we) only on steps inside [s_tmin, s_tmax]. Compared with the window covering all steps
  and the same stream fed to both.

The samplers in ComfyUI's fork only (heunpp2, ddpm, lcm, ipndm, ipndm_v, deis, uni_pc, res_*,
er_sde, seeds, sa_solver, CFG++) are not in upstream k-diffusion 0.1.1 and are not covered here.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from mixgraph.nodes.sampling import samplers as S
from mixgraph.nodes.sampling.noise import BrownianTreeNoiseSampler, default_noise_sampler
from mixgraph.nodes.sampling.schedules import (
    DiscreteSchedule,
    calculate_sigmas,
    exponential_scheduler,
    karras_scheduler,
)

_PKG = "_kdiffusion_reference"


def _append_dims(x: torch.Tensor, target_dims: int) -> torch.Tensor:
    """k-diffusion ``utils.append_dims``: trailing singleton dims up to ``target_dims``."""
    missing = target_dims - x.ndim
    if missing < 0:
        raise ValueError(f"input has {x.ndim} dims but target_dims is {target_dims}")
    return x.reshape(x.shape + (1,) * missing)


def _load_reference_sampling() -> types.ModuleType:
    if _PKG + ".sampling" in sys.modules:
        return sys.modules[_PKG + ".sampling"]
    spec = importlib.util.find_spec("k_diffusion")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("k-diffusion not installed (pip install --no-deps k-diffusion==0.1.1.post1)",
                    allow_module_level=True)
    pytest.importorskip("torchdiffeq")  # imported at the top of k_diffusion/sampling.py
    path = Path(list(spec.submodule_search_locations)[0]) / "sampling.py"
    if not path.is_file():
        pytest.skip(f"k-diffusion layout not recognised: {path} missing",
                    allow_module_level=True)
    pkg = types.ModuleType(_PKG)
    pkg.__path__ = []  # a package with no files: submodules are registered by hand
    utils = types.ModuleType(_PKG + ".utils")
    utils.append_dims = _append_dims
    pkg.utils = utils
    sys.modules[_PKG] = pkg
    sys.modules[_PKG + ".utils"] = utils
    mod_spec = importlib.util.spec_from_file_location(_PKG + ".sampling", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[_PKG + ".sampling"] = module
    try:
        mod_spec.loader.exec_module(module)
    except ImportError as exc:  # a dependency of sampling.py itself is missing
        for name in (_PKG + ".sampling", _PKG + ".utils", _PKG):
            sys.modules.pop(name, None)
        pytest.skip(f"k_diffusion/sampling.py cannot load: {exc}",
                    allow_module_level=True)
    return module


K = _load_reference_sampling()

pytestmark = [
    # torchsde: σ_max queried in float32 vs the tree's stored end (a 1-ulp mismatch)
    pytest.mark.filterwarnings("ignore:Should have tb<=t1"),
    # upstream's dpm_fast/dpm_adaptive wrap a tensor sigma in torch.tensor(...)
    pytest.mark.filterwarnings("ignore:To copy construct from a tensor"),
]

SEED = 1234
SCHEDULE = DiscreteSchedule()
SMIN, SMAX = float(SCHEDULE.sigma_min), float(SCHEDULE.sigma_max)

# ------------------------------------------------------------------------------ denoisers

_MU = torch.tensor([0.5, -0.3, 0.1, 0.8]).reshape(1, 4, 1, 1)
_SD = torch.tensor([0.8, 1.2, 0.5, 1.0]).reshape(1, 4, 1, 1)


def gaussian_denoiser(x, sigma, **_):
    """Optimal D for x0 ~ N(μ_c, s_c²) per channel."""
    sg = sigma.reshape(-1, 1, 1, 1)
    mu, sd = _MU.to(x.dtype), _SD.to(x.dtype)
    return (sd * sd * x + sg * sg * mu) / (sd * sd + sg * sg)


class TinyEpsNet(torch.nn.Module):
    """A seeded random eps-prediction net: the Gaussian optimum's ε plus a bounded nonlinear
    conv term (conv → +log σ embedding → SiLU → conv → tanh) of the scaled input
    x/sqrt(σ²+1), with the EPS parameterisation D = x − σ·ε. Close enough to a real denoiser
    that trajectories stay O(1), nonlinear enough that second evaluations and multistep history
    matter."""

    def __init__(self, seed: int = 7, channels: int = 4, hidden: int = 16):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(hidden, channels, 3, 3, generator=gen) * 0.3
        self.b1 = torch.randn(hidden, generator=gen) * 0.1
        self.we = torch.randn(hidden, generator=gen) * 0.3
        self.w2 = torch.randn(channels, hidden, 3, 3, generator=gen) * 0.2
        self.b2 = torch.randn(channels, generator=gen) * 0.05

    def forward(self, x, sigma, **_):
        dt = x.dtype
        sg = sigma.reshape(-1, 1, 1, 1)
        eps_opt = (x - gaussian_denoiser(x, sigma)) / sg
        h = torch.nn.functional.conv2d(x / (sg * sg + 1).sqrt(), self.w1.to(dt), self.b1.to(dt),
                                       padding=1)  # [B,hidden,H,W]
        h = h + self.we.to(dt).reshape(1, -1, 1, 1) * sg.log()
        extra = torch.nn.functional.conv2d(torch.nn.functional.silu(h), self.w2.to(dt),
                                           self.b2.to(dt), padding=1)  # [B,C,H,W]
        return x - sg * (eps_opt + 0.5 * torch.tanh(extra))


TINY_NET = TinyEpsNet()
DENOISERS = {"gaussian": gaussian_denoiser, "convnet": TINY_NET}


def start_latent(sigma0: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED)
    return (torch.randn(2, 4, 8, 8, generator=gen) * sigma0).to(dtype)  # [B,C,H,W]


def schedule_sigmas(name: str, steps: int = 8, dtype: torch.dtype = torch.float32):
    return calculate_sigmas(SCHEDULE, name, steps).to(dtype)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, info):
        self.calls.append((int(info["i"]), float(info["sigma"]), info["x"].clone(),
                           info["denoised"].clone()))


def assert_trajectories_match(ours: Recorder, ref: Recorder, atol: float):
    assert len(ours.calls) == len(ref.calls)
    for (i, s, x, d), (ri, rs, rx, rd) in zip(ours.calls, ref.calls):
        assert i == ri
        assert s == pytest.approx(rs, rel=1e-6)
        torch.testing.assert_close(x, rx, rtol=0, atol=atol)
        torch.testing.assert_close(d, rd, rtol=0, atol=atol)


def assert_bitwise(ours: torch.Tensor, ref: torch.Tensor):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert torch.equal(ours, ref), f"max abs diff {diff:.3g}"


def _our_noise(x):
    """A seeded per-step noise stream; a fresh one with the same seed replays it."""
    return default_noise_sampler(x, seed=SEED)


# Tolerances. Where ours performs the same float operations in the same order as upstream, the
# results are bitwise equal (``assert_bitwise``): euler, heun, dpm_2, dpmpp_2m, the ancestral samplers, lms,
# dpm_fast, dpm_adaptive, in float32 and float64. The SDE family follows ComfyUI's fork, which
# writes the steps with α_t = σ_t·e^λ_t (1 up to rounding, so that flow models fit the same code)
# and queries the CPU Brownian tree in float32; that reorders float32 rounding only: measured
# ≤ 5e-6 on values of size ≤ 8, asserted at ATOL.
ATOL = 2e-5
DTYPES = [pytest.param(torch.float32, id="f32"),
          pytest.param(torch.float64, id="f64")]


# ---------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("n", [1, 4, 20])
def test_karras_scheduler_matches_kdiffusion_bitwise(n):
    assert torch.equal(karras_scheduler(n, SMIN, SMAX), K.get_sigmas_karras(n, SMIN, SMAX))
    assert torch.equal(calculate_sigmas(SCHEDULE, "karras", n), K.get_sigmas_karras(n, SMIN, SMAX))


@pytest.mark.parametrize("n", [1, 4, 20])
def test_exponential_scheduler_matches_kdiffusion_bitwise(n):
    ref = K.get_sigmas_exponential(n, SMIN, SMAX)
    assert torch.equal(exponential_scheduler(n, SMIN, SMAX), ref)
    assert torch.equal(calculate_sigmas(SCHEDULE, "exponential", n), ref)


def test_karras_scheduler_reference_values_from_kdiffusion():
    ref = K.get_sigmas_karras(20, SMIN, SMAX)
    assert float(ref[0]) == pytest.approx(14.614643, abs=1e-5)
    assert float(ref[1]) == pytest.approx(11.725368, abs=1e-5)
    assert float(ref.sum()) == pytest.approx(66.509695, abs=1e-4)
    assert float(K.get_sigmas_exponential(20, SMIN, SMAX).sum()) == pytest.approx(52.295978,
                                                                                  abs=1e-4)


# ------------------------------------------------------------------------------ helpers


def test_to_d_and_ancestral_step_match_kdiffusion():
    x = start_latent(3.0)
    den = gaussian_denoiser(x, torch.full([2], 3.0))
    sigma = torch.full([2], 3.0)
    assert torch.equal(S.to_d(x, sigma, den), K.to_d(x, sigma, den))
    sigmas = schedule_sigmas("karras", 6)
    for a, b in zip(sigmas[:-1], sigmas[1:]):
        for eta in (0.0, 0.5, 1.0):
            ours, ref = S.get_ancestral_step(a, b, eta), K.get_ancestral_step(a, b, eta)
            assert float(ours[0]) == float(ref[0]) and float(ours[1]) == float(ref[1])


def test_default_noise_sampler_is_kdiffusion_global_draw_with_the_node_seed():
    """ComfyUI 0.3.64's fork seeds a generator with the node seed; upstream draws randn_like
    from the global RNG. Seeding the global RNG with the seed makes upstream's stream ours."""
    x = start_latent(1.0)
    ours = default_noise_sampler(x, seed=SEED)
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        ref = K.default_noise_sampler(x)
        ref_draws = [ref(None, None) for _ in range(3)]
    for r in ref_draws:
        assert torch.equal(ours(None, None), r)


def test_brownian_noise_sampler_matches_kdiffusion_bitwise():
    x = start_latent(1.0)
    sigmas = schedule_sigmas("karras", 8)
    smin, smax = sigmas[sigmas > 0].min(), sigmas.max()
    ours = BrownianTreeNoiseSampler(x, smin, smax, seed=SEED, cpu=True)
    ref = K.BrownianTreeNoiseSampler(x, smin, smax, seed=SEED)
    for a, b in zip(sigmas[:-2], sigmas[1:-1]):
        assert torch.equal(ours(a, b), ref(a, b))
    # batched entropy (one seed per image)
    ours_b = BrownianTreeNoiseSampler(x, smin, smax, seed=[3, 4], cpu=True)
    ref_b = K.BrownianTreeNoiseSampler(x, smin, smax, seed=[3, 4])
    assert torch.equal(ours_b(sigmas[0], sigmas[1]), ref_b(sigmas[0], sigmas[1]))


# ------------------------------------------------------------------------------ samplers

# Samplers whose signatures and semantics agree with upstream (given the same noise).
DETERMINISTIC = ["euler", "heun", "dpm_2", "dpmpp_2m"]
ANCESTRAL = ["euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral"]
SDE = ["dpmpp_sde", "dpmpp_2m_sde", "dpmpp_3m_sde"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheduler", ["karras", "normal"])
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_sampler_matches_kdiffusion(name, denoiser, scheduler, dtype):
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas(scheduler, dtype=dtype)
    x = start_latent(float(sigmas[0]), dtype)
    rec_ours, rec_ref = Recorder(), Recorder()
    ours = S.get_sampler(name)(model, x, sigmas, extra_args={"seed": SEED}, callback=rec_ours)
    ref = getattr(K, f"sample_{name}")(model, x, sigmas, callback=rec_ref, disable=True)
    assert ours.dtype == dtype
    assert_bitwise(ours, ref)
    assert_trajectories_match(rec_ours, rec_ref, atol=0.0)


@pytest.mark.parametrize("name", ["euler", "heun", "dpm_2"])
def test_churn_matches_kdiffusion_with_the_same_noise_stream(name):
    """s_churn > 0: upstream draws randn_like from the global RNG; we from the noise sampler.
    A generator and the global RNG seeded alike give the same stream. Upstream draws on every
    step, ComfyUI (and we) only where γ > 0, so the churn window covers all steps here."""
    sigmas = schedule_sigmas("karras")
    x = start_latent(float(sigmas[0]))
    opts = dict(s_churn=2.0, s_tmin=0.0, s_tmax=float("inf"), s_noise=1.003)
    noise = torch.Generator().manual_seed(SEED)
    ours = S.get_sampler(name)(
        TINY_NET, x, sigmas, noise_sampler=lambda a, b: torch.randn(x.shape, generator=noise),
        **opts)
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        ref = getattr(K, f"sample_{name}")(TINY_NET, x, sigmas, disable=True, **opts)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eta", [1.0, 0.5])
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
@pytest.mark.parametrize("name", ANCESTRAL)
def test_ancestral_sampler_matches_kdiffusion(name, denoiser, eta, dtype):
    """Default noise from the node seed (ComfyUI semantics) vs upstream fed the same stream."""
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas("karras", dtype=dtype)
    x = start_latent(float(sigmas[0]), dtype)
    rec_ours, rec_ref = Recorder(), Recorder()
    ours = S.get_sampler(name)(model, x, sigmas, extra_args={"seed": SEED}, callback=rec_ours,
                               eta=eta, s_noise=1.0)
    ref = getattr(K, f"sample_{name}")(model, x, sigmas, callback=rec_ref, disable=True,
                                       eta=eta, s_noise=1.0, noise_sampler=_our_noise(x))
    assert_bitwise(ours, ref)
    assert_trajectories_match(rec_ours, rec_ref, atol=0.0)


@pytest.mark.parametrize("eta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
@pytest.mark.parametrize("name", SDE)
def test_sde_sampler_matches_kdiffusion(name, denoiser, eta):
    """Our default (CPU Brownian tree seeded with the node seed, ComfyUI's) vs upstream given
    the same seeded tree."""
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas("karras")
    x = start_latent(float(sigmas[0]))
    ours = S.get_sampler(name)(model, x, sigmas, extra_args={"seed": SEED}, eta=eta)
    smin, smax = sigmas[sigmas > 0].min(), sigmas.max()
    tree = K.BrownianTreeNoiseSampler(x, smin, smax, seed=SEED)
    ref = getattr(K, f"sample_{name}")(model, x, sigmas, disable=True, eta=eta,
                                       noise_sampler=tree)
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("solver_type", ["heun", "midpoint"])
def test_dpmpp_2m_sde_solver_types_match_kdiffusion(solver_type):
    sigmas = schedule_sigmas("normal")
    x = start_latent(float(sigmas[0]))
    name = "dpmpp_2m_sde_heun" if solver_type == "heun" else "dpmpp_2m_sde"
    ours = S.get_sampler(name)(TINY_NET, x, sigmas, extra_args={"seed": SEED})
    smin, smax = sigmas[sigmas > 0].min(), sigmas.max()
    ref = K.sample_dpmpp_2m_sde(TINY_NET, x, sigmas, disable=True, solver_type=solver_type,
                                noise_sampler=K.BrownianTreeNoiseSampler(x, smin, smax,
                                                                         seed=SEED))
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
def test_lms_matches_kdiffusion_then_final_denoise(denoiser, dtype):
    """ComfyUI's lms ends with x = D(x, σ_last) where upstream integrates to 0."""
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas("karras", 10, dtype)
    x = start_latent(float(sigmas[0]), dtype)
    ours = S.sample_lms(model, x, sigmas)
    upto_last = K.sample_lms(model, x, sigmas[:-1], disable=True)
    ref = model(upto_last, sigmas[-2] * upto_last.new_ones([2]))
    assert_bitwise(ours, ref)
    # and the steps before agree one to one
    assert_bitwise(S.sample_lms(model, x, sigmas[:-1]), upto_last)


def test_lms_final_step_differs_from_upstream_integration():
    """The documented difference is real (so the test above is not vacuous)."""
    sigmas = schedule_sigmas("karras", 10)
    x = start_latent(float(sigmas[0]))
    ours = S.sample_lms(TINY_NET, x, sigmas)
    upstream = K.sample_lms(TINY_NET, x, sigmas, disable=True)
    assert (ours - upstream).abs().max() > 100 * ATOL


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
def test_dpm_fast_matches_kdiffusion(denoiser, dtype):
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas("karras", 10, dtype)
    x = start_latent(float(sigmas[0]), dtype)
    ours = S.sample_dpm_fast(model, x, sigmas, extra_args={"seed": SEED})
    ref = K.sample_dpm_fast(model, x, sigmas[-2], sigmas[0], len(sigmas) - 1, disable=True)
    assert_bitwise(ours, ref)


def test_dpm_fast_with_eta_matches_kdiffusion():
    sigmas = schedule_sigmas("karras", 10)
    x = start_latent(float(sigmas[0]))
    ours = S.sample_dpm_fast(TINY_NET, x, sigmas, noise_sampler=_our_noise(x), eta=0.7)
    ref = K.sample_dpm_fast(TINY_NET, x, float(sigmas[-2]), float(sigmas[0]), len(sigmas) - 1,
                            disable=True, eta=0.7, noise_sampler=_our_noise(x))
    assert_bitwise(ours, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("denoiser", sorted(DENOISERS))
def test_dpm_adaptive_matches_kdiffusion(denoiser, order, dtype):
    model = DENOISERS[denoiser]
    sigmas = schedule_sigmas("normal", 10, dtype)
    x = start_latent(float(sigmas[0]), dtype)
    ours = S.sample_dpm_adaptive(model, x, sigmas, extra_args={"seed": SEED}, order=order)
    ref, info = K.sample_dpm_adaptive(model, x, sigmas[-2], sigmas[0], disable=True,
                                      order=order, return_info=True)
    assert info["n_accept"] > 3  # the controller really ran several steps
    assert_bitwise(ours, ref)


def test_reference_detects_a_wrong_eta():
    """The comparison is sharp enough to see a small change of an option."""
    sigmas = schedule_sigmas("karras")
    x = start_latent(float(sigmas[0]))
    ours = S.sample_euler_ancestral(TINY_NET, x, sigmas, noise_sampler=_our_noise(x), eta=0.98)
    ref = K.sample_euler_ancestral(TINY_NET, x, sigmas, disable=True, eta=1.0,
                                   noise_sampler=_our_noise(x))
    assert (ours - ref).abs().max() > 100 * ATOL
