"""Flow matching (ComfyUI's CONST) as a parameterisation: the schedule against closed forms, the
CONST formulas, samplers on a flow model (one hand-computed Euler step; sampling Gaussian data
with its exact velocity field), fix_empty_latent_channels and Cond.model_inputs at the
custom-node boundary and in the output cache's codec."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from mixgraph.graph.codec import TreeCodec
from mixgraph.nodes.helpers import persistable
from mixgraph.nodes.families.base import PREDICTIONS as FAMILY_PREDICTIONS
from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import samplers
from mixgraph.nodes.sampling.ksampler import fix_empty_latent_channels, sample
from mixgraph.nodes.sampling.noise import default_noise_sampler, prepare_noise
from mixgraph.nodes.sampling.parameterization import PREDICTIONS, ModelSampling
from mixgraph.nodes.sampling.schedule_flow import flux_resolution_shift
from mixgraph.nodes.sampling.schedules import calculate_sigmas
from mixgraph.ui.comfy.comfy_payloads import cond_from_comfy, cond_to_comfy
from tests.fixtures.sampler_models import UNetSeam


def sd3_shift(t: float, shift: float) -> float:
    return shift * t / (1 + (shift - 1) * t)


def flux_shift(t: float, mu: float) -> float:
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1))


def flow(shift=3.0, multiplier=1000.0, kind="linear") -> ModelSampling:
    return ModelSampling.from_sampling(Sampling("flow", shift=shift, multiplier=multiplier, shift_kind=kind))


# ------------------------------------------------------------------------------- schedule


def test_predictions_match_the_family_seam():
    assert PREDICTIONS == FAMILY_PREDICTIONS


@pytest.mark.parametrize("shift", [1.0, 3.0, 6.0])
def test_linear_shift_closed_form(shift):
    ms = flow(shift)
    sched = ms.schedule
    assert len(sched.sigmas) == 1000
    assert float(ms.sigma_max) == pytest.approx(1.0, abs=1e-7)
    assert float(ms.sigma_min) == pytest.approx(sd3_shift(1 / 1000, shift), rel=1e-6)
    for k in (1, 137, 500, 999):
        assert float(sched.sigmas[k - 1]) == pytest.approx(sd3_shift(k / 1000, shift), rel=1e-6)
    for t in (0.1, 0.5, 0.9):
        assert float(sched.sigma(torch.tensor(t * 1000))) == pytest.approx(sd3_shift(t, shift), rel=1e-6)
    sig = torch.tensor([0.25, 0.8])
    assert torch.allclose(ms.timestep(sig), sig * 1000)
    assert ms.percent_to_sigma(0.0) == 1.0 and ms.percent_to_sigma(1.0) == 0.0
    for p in (0.1, 0.25, 0.5, 0.9):
        assert ms.percent_to_sigma(p) == pytest.approx(sd3_shift(1 - p, shift), rel=1e-12)
        assert sched.sigma_to_percent(ms.percent_to_sigma(p)) == pytest.approx(p, abs=1e-12)


def test_sd3_values_and_multiplier():
    ms = flow(3.0)
    assert ms.percent_to_sigma(0.5) == pytest.approx(0.75)      # 3·0.5 / (1 + 2·0.5)
    assert ms.percent_to_sigma(0.25) == pytest.approx(0.9)      # 3·0.75 / (1 + 2·0.75)
    aura = flow(1.73, multiplier=1.0)
    assert float(aura.timestep(torch.tensor(0.4))) == pytest.approx(0.4)
    assert float(aura.sigma_min) == pytest.approx(sd3_shift(0.001, 1.73), rel=1e-6)


def test_flux_exponential_shift_closed_form():
    mu = 1.15
    ms = flow(mu, kind="exponential")
    sched = ms.schedule
    assert len(sched.sigmas) == 10000
    assert float(ms.sigma_max) == pytest.approx(1.0)
    assert float(ms.sigma_min) == pytest.approx(math.exp(mu) / (math.exp(mu) + 9999), rel=1e-5)
    assert float(sched.sigmas[4999]) == pytest.approx(flux_shift(0.5, mu), rel=1e-6)
    assert float(ms.timestep(torch.tensor(0.3))) == pytest.approx(0.3)  # Flux sees σ itself
    assert ms.percent_to_sigma(0.5) == pytest.approx(math.exp(mu) / (math.exp(mu) + 1))
    for p in (0.2, 0.7):
        assert ms.percent_to_sigma(p) == pytest.approx(flux_shift(1 - p, mu))
        assert sched.sigma_to_percent(ms.percent_to_sigma(p)) == pytest.approx(p, abs=1e-12)


def test_flux_resolution_shift():
    assert flux_resolution_shift(1024, 1024) == pytest.approx(1.15)   # 4096 patches: max_shift
    assert flux_resolution_shift(256, 256) == pytest.approx(0.5)      # 256 patches: base_shift
    mid = 256 + (4096 - 256) / 2
    side = int(math.sqrt(mid * 256))
    assert flux_resolution_shift(side, side) == pytest.approx(0.5 + 0.65 * (side * side / 256 - 256) / 3840)


def test_table_schedulers_on_the_flow_schedule():
    ms = flow(3.0)
    simple = calculate_sigmas(ms.schedule, "simple", 4)
    want = [sd3_shift(k / 1000, 3.0) for k in (1000, 750, 500, 250)] + [0.0]
    assert torch.allclose(simple, torch.tensor(want), atol=1e-6)
    normal = calculate_sigmas(ms.schedule, "normal", 3)
    t_min = sd3_shift(0.001, 3.0) * 1000
    ts = [1000 + (t_min - 1000) * k / 2 for k in range(3)]
    assert torch.allclose(normal, torch.tensor([sd3_shift(t / 1000, 3.0) for t in ts] + [0.0]), atol=1e-5)
    karras = calculate_sigmas(ms.schedule, "karras", 5)
    assert float(karras[0]) == pytest.approx(1.0) and float(karras[-2]) == pytest.approx(float(ms.sigma_min))


# ------------------------------------------------------------------------- CONST formulas


def test_const_parameterisation_round_trip():
    ms = flow(3.0)
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(2, 4, 3, 3, generator=g), torch.randn(2, 4, 3, 3, generator=g)
    sigma = torch.tensor([0.3, 0.8])
    s = sigma.reshape(-1, 1, 1, 1)
    x = ms.noise_scaling(sigma, eps, x0)
    assert torch.allclose(x, s * eps + (1 - s) * x0)
    assert torch.equal(ms.noise_scaling(sigma, eps, x0, max_denoise=True), x)  # no max-denoise case
    assert torch.equal(ms.calculate_input(sigma, x), x)
    assert torch.allclose(ms.calculate_denoised(sigma, eps - x0, x), x0, atol=1e-6)  # v = ε − x0
    assert torch.allclose(ms.inverse_noise_scaling(sigma, x), x / (1 - s))
    assert torch.equal(ms.inverse_noise_scaling(torch.tensor(0.0), x), x)


def test_for_model_reads_family_sampling_else_old_attributes():
    @dataclass
    class WithSampling:
        sampling: Sampling = field(default_factory=lambda: Sampling("flow", shift=2.0))

    ms = ModelSampling.for_model(WithSampling())
    assert ms.is_flow and ms.percent_to_sigma(0.5) == pytest.approx(sd3_shift(0.5, 2.0))

    @dataclass
    class Old:
        prediction: str = "v_prediction"
        zsnr: bool = True

    old = ModelSampling.for_model(Old())
    assert old.prediction == "v_prediction" and old.schedule.zsnr and not old.is_flow


# ------------------------------------------------------------------------------ samplers


class VelocityDenoiser:
    """A flow denoiser as the samplers get it: D = x − σ·v(x, t) through the parameterisation,
    with ``ms`` where ``sampler_utils.model_sampling_of`` finds it (as on ``CondDenoiser``)."""

    def __init__(self, ms: ModelSampling, velocity):
        self.ms = ms
        self.velocity = velocity
        self.calls = 0

    def __call__(self, x, sigma, **_):
        self.calls += 1
        t = self.ms.timestep(sigma)
        out = self.velocity(self.ms.calculate_input(sigma, x), t / self.ms.schedule.multiplier)
        return self.ms.calculate_denoised(sigma, out, x)


def gaussian_velocity(mu: float, s: float):
    """The exact flow velocity E[ε − x0 | x_σ] for x0 ~ N(μ, s²), x_σ = (1 − σ)x0 + σε:
    with a = 1 − σ and V = a²s² + σ², E[x0|x] = μ + a s² (x − aμ)/V, E[ε|x] = σ (x − aμ)/V."""

    def v(x, sigma):
        sig = sigma.reshape(-1, *([1] * (x.ndim - 1)))
        a = 1 - sig
        var = a**2 * s**2 + sig**2
        return (sig - a * s**2) / var * (x - a * mu) - mu

    return v


def test_one_euler_step_on_a_flow_model_is_the_velocity_step():
    ms = flow(3.0)
    x = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    velocity = lambda x_in, sig: 0.5 * x_in + 0.25  # noqa: E731
    model = VelocityDenoiser(ms, velocity)
    sigmas = torch.tensor([0.8, 0.6])
    out = samplers.sample_euler(model, x.clone(), sigmas)
    assert torch.allclose(out, x + (0.6 - 0.8) * (0.5 * x + 0.25), atol=1e-6)


def _sample_gaussian(name, n=4096, steps=40, **opts):
    mu, s = 0.7, 0.5
    ms = flow(3.0)
    model = VelocityDenoiser(ms, gaussian_velocity(mu, s))
    sigmas = calculate_sigmas(ms.schedule, "simple", steps)
    noise = torch.randn(1, 1, 64, n // 64, generator=torch.Generator().manual_seed(3))
    x = ms.noise_scaling(sigmas[0], noise, torch.zeros_like(noise), ms.is_max_denoise(sigmas))
    out = samplers.get_sampler(name)(model, x, sigmas, extra_args={"seed": 5}, **opts)
    out = ms.inverse_noise_scaling(sigmas[-1], out)
    return float(out.mean()), float(out.std()), mu, s


@pytest.mark.parametrize("name,steps", [
    ("euler", 160), ("heun", 40), ("dpmpp_2m", 40), ("euler_cfg_pp", 160),
    # first order (Euler) and stochastic samplers converge slowly: more steps
    ("euler_ancestral", 640), ("euler_ancestral_cfg_pp", 640), ("dpmpp_2s_ancestral", 640),
    ("dpm_2_ancestral", 640), ("dpmpp_2m_sde", 160), ("dpmpp_3m_sde", 160), ("dpmpp_sde", 160)])
def test_flow_samplers_draw_gaussian_data_from_its_exact_velocity(name, steps):
    mean, std, mu, s = _sample_gaussian(name, steps=steps)
    assert mean == pytest.approx(mu, abs=0.03)
    assert std == pytest.approx(s, abs=0.03)


def test_lcm_renoises_with_the_flow_noise_scaling():
    ms = flow(3.0)
    model = VelocityDenoiser(ms, lambda x_in, sig: torch.full_like(x_in, 0.5))
    x = torch.ones(1, 1, 2, 2)
    sigmas = torch.tensor([0.8, 0.4, 0.0])
    z = torch.full_like(x, 2.0)
    out = samplers.sample_lcm(model, x, sigmas, noise_sampler=lambda a, b: z)
    d1 = 1.0 - 0.8 * 0.5                    # D = x − σ·v at σ = 0.8
    x1 = 0.4 * 2.0 + (1 - 0.4) * d1         # σ·n + (1 − σ)·D
    assert torch.allclose(out, torch.full_like(x, x1 - 0.4 * 0.5), atol=1e-6)


def test_rf_ancestral_at_eta_zero_is_euler():
    ms = flow(3.0)
    model = VelocityDenoiser(ms, gaussian_velocity(0.2, 1.5))
    sigmas = calculate_sigmas(ms.schedule, "simple", 6)
    x = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    a = samplers.sample_euler(model, x.clone(), sigmas)
    b = samplers.sample_euler_ancestral(model, x.clone(), sigmas, eta=0.0,
                                        noise_sampler=default_noise_sampler(x, 0))
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("name", ["er_sde", "seeds_2", "seeds_3", "exp_heun_2_x0",
                                  "exp_heun_2_x0_sde", "sa_solver", "sa_solver_pece"])
def test_samplers_without_a_flow_branch_refuse_flow_models(name):
    ms = flow(3.0)
    model = VelocityDenoiser(ms, gaussian_velocity(0.0, 1.0))
    sigmas = calculate_sigmas(ms.schedule, "simple", 3)
    with pytest.raises(NotImplementedError, match=f"'{name}' is not supported yet on flow-matching"):
        samplers.get_sampler(name)(model, torch.zeros(1, 1, 4, 4), sigmas, extra_args={"seed": 0})
    assert model.calls == 0


# ---------------------------------------------------------------- KSampler on a flow model


@dataclass
class FlowVelocityModel(UNetSeam):
    """A SamplerModel whose UNet returns the exact velocity of N(μ, s²) data, with a 16-channel
    latent format and the family seam's ``sampling``; records its inputs and timesteps."""

    sampling: Sampling = field(default_factory=lambda: Sampling("flow", shift=3.0))
    latent_format: LatentFormat = field(default_factory=lambda: LatentFormat(1.0, channels=16))
    in_channels: int = 16
    mu: float = 0.4
    s: float = 0.8
    timesteps: list = field(default_factory=list)
    inputs: list = field(default_factory=list)

    def unet(self, x, timesteps, context, y=None, control=None):
        self.timesteps.append(timesteps.clone())
        self.inputs.append(x.clone())
        return gaussian_velocity(self.mu, self.s)(x, timesteps / 1000)

    def adm(self, cond, latent_hw, negative=False):
        return None


def test_ksampler_samples_a_flow_model_from_an_empty_4_channel_latent():
    model = FlowVelocityModel()
    empty = Latent(torch.zeros(2, 4, 32, 32))
    out = sample(model, seed=7, steps=20, cfg=1.0, sampler_name="heun", scheduler="simple",
                 positive=(Cond(torch.zeros(1, 2, 3)),), negative=(Cond(torch.zeros(1, 2, 3)),),
                 latent=empty)
    assert out.samples.shape == (2, 16, 32, 32)
    assert float(out.samples.mean()) == pytest.approx(0.4, abs=0.03)
    assert float(out.samples.std()) == pytest.approx(0.8, abs=0.03)
    assert float(model.timesteps[0][0]) == pytest.approx(1000.0)  # σ = 1 → t = σ·1000
    # the first model input is σ0·noise = ComfyUI's noise for the resized latent
    assert torch.equal(model.inputs[0], prepare_noise(torch.zeros(2, 16, 32, 32), 7))


def test_fix_empty_latent_channels_rule():
    model = FlowVelocityModel()
    empty = Latent(torch.zeros(1, 4, 8, 8), batch_index=(3,))
    fixed = fix_empty_latent_channels(model, empty)
    assert fixed.samples.shape == (1, 16, 8, 8) and not fixed.samples.any()
    assert fixed.batch_index == (3,)
    nonzero = Latent(torch.ones(1, 4, 8, 8))
    assert fix_empty_latent_channels(model, nonzero) is nonzero  # only an empty latent
    same = Latent(torch.zeros(1, 16, 8, 8))
    assert fix_empty_latent_channels(model, same) is same

    @dataclass
    class NoFormat:
        latent_scale: float = 1.0

    assert fix_empty_latent_channels(NoFormat(), empty) is empty


# --------------------------------------------------------------------- Cond.model_inputs


def test_cond_model_inputs_round_trip_through_comfy():
    ref = [torch.randn(1, 16, 4, 4)]
    mask = torch.ones(1, 7)
    comfy = [[torch.zeros(1, 7, 8), {"pooled_output": torch.zeros(1, 5), "guidance": 3.5,
                                     "attention_mask": mask, "reference_latents": ref,
                                     "start_percent": 0.1, "end_percent": 0.9}]]
    (c,) = cond_from_comfy(comfy)
    assert set(c.model_inputs) == {"guidance", "attention_mask", "reference_latents"}
    assert c.model_inputs["guidance"] == 3.5 and c.model_inputs["attention_mask"] is mask
    assert c.timestep_range == (0.1, 0.9) and c.pooled is not None
    (t, opts) = cond_to_comfy((c,))[0]
    assert opts["guidance"] == 3.5 and opts["reference_latents"] is ref
    assert opts["attention_mask"] is mask and opts["start_percent"] == 0.1
    (back,) = cond_from_comfy([[t, opts]])
    assert back.model_inputs == {"guidance": 3.5, "attention_mask": mask, "reference_latents": ref}


def test_cond_model_inputs_is_a_private_copy_and_cond_stays_hashable():
    src = {"guidance": 2.0}
    c = Cond(torch.zeros(1, 2, 3), model_inputs=src)
    src["guidance"] = 9.0
    assert c.model_inputs == {"guidance": 2.0}
    hash(c)
    assert Cond(torch.zeros(1, 2, 3)).model_inputs == {}


def test_cond_with_model_inputs_survives_the_output_cache_codec():
    codec = TreeCodec()
    persistable.declare(codec)
    c = Cond(torch.ones(1, 2, 3), model_inputs={"guidance": 3.5, "ref": [torch.full((1, 2), 2.0)]})
    tensors, tree = codec.encode((c,))
    (back,) = codec.decode(tensors, tree)
    assert type(back.model_inputs) is dict and back.model_inputs["guidance"] == 3.5
    assert torch.equal(back.model_inputs["ref"][0], torch.full((1, 2), 2.0))
    assert torch.equal(back.cross_attn, c.cross_attn)
