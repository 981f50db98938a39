"""KSampler glue and the CFG denoiser, with small hand-written SamplerModels (no mocks: real
objects whose UNet is a closed-form function)."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from mixgraph.nodes.payloads.conditioning import Cond, Control, SizeCond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling.ksampler import compute_sigmas, cut_sigmas, sample
from mixgraph.nodes.sampling.noise import prepare_noise
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from tests.fixtures.sampler_models import UNetSeam

POS = torch.full((1, 2, 3), 1.0)
NEG = torch.full((1, 2, 3), -1.0)


@dataclass
class ContextModel(UNetSeam):
    """x0-predicting model whose prediction is the cond's first context value everywhere;
    records every UNet call."""

    prediction: str = "x0"
    zsnr: bool = False
    latent_scale: float = 0.5
    in_channels: int = 4
    calls: list = field(default_factory=list)

    def unet(self, x, timesteps, context, y=None, control=None):
        self.calls.append({"x": x.clone(), "t": timesteps.clone(), "context": context.clone(),
                           "y": y, "control": control})
        return context[:, 0, 0].reshape(-1, 1, 1, 1).expand(x.shape[0], 4, *x.shape[2:]).clone()

    def adm(self, cond, latent_hw, negative=False):
        return None


@dataclass
class GaussianEpsModel(ContextModel):
    """eps-predicting model: the optimal eps for N(mu, s²) data, from c_in·x and σ(t)."""

    prediction: str = "eps"
    mu: float = 0.3
    s: float = 1.0

    def unet(self, x, timesteps, context, y=None, control=None):
        super().unet(x, timesteps, context, y, control)
        sigma = ModelSampling("eps").schedule.sigma(timesteps).reshape(-1, 1, 1, 1)
        x_ve = x * (sigma**2 + 1).sqrt()
        denoised = (self.s**2 * x_ve + sigma**2 * self.mu) / (self.s**2 + sigma**2)
        return (x_ve - denoised) / sigma


def _latent(b=1, h=8, w=8, value=0.0):
    return Latent(torch.full((b, 4, h, w), value))


def _run(model, **kw):
    args = dict(seed=1, steps=4, cfg=1.0, sampler_name="euler", scheduler="normal",
                positive=(Cond(POS),), negative=(Cond(NEG),), latent=_latent())
    args.update(kw)
    return sample(model, **args)


def test_ksampler_cfg_one_never_evaluates_negative():
    m = ContextModel()
    _run(m, cfg=1.0)
    assert len(m.calls) == 4
    assert all(bool((c["context"] > 0).all()) for c in m.calls)


def test_ksampler_cfg_batches_cond_and_uncond_in_one_call():
    m = ContextModel()
    out = _run(m, cfg=3.0)
    assert len(m.calls) == 4 and all(c["x"].shape[0] == 2 for c in m.calls)
    # ComfyUI batch order: uncond first
    assert float(m.calls[0]["context"][0, 0, 0]) == -1.0
    # x0 = uncond + (cond − uncond)·cfg = −1 + 2·3 = 5, then process_out (÷ 0.5)
    assert torch.allclose(out.samples, torch.full_like(out.samples, 10.0), atol=1e-4)


def test_ksampler_gaussian_model_reaches_data_mean_and_is_seeded():
    m = GaussianEpsModel()
    a = _run(m, steps=20, scheduler="karras", latent=_latent(b=2, h=16, w=16))
    b = _run(m, steps=20, scheduler="karras", latent=_latent(b=2, h=16, w=16))
    assert a.samples.dtype == torch.float32 and torch.equal(a.samples, b.samples)
    assert float(a.samples.mean() * 0.5) == pytest.approx(0.3, abs=0.1)


def test_ksampler_full_denoise_starts_from_noise_times_reference_scale():
    ms = ModelSampling("eps")
    sigmas = compute_sigmas(ms, "normal", "euler", 20)
    noise = prepare_noise(torch.zeros(1, 4, 32, 32), 42)
    assert ms.is_max_denoise(sigmas)
    x = ms.noise_scaling(sigmas[0], noise, torch.zeros_like(noise), ms.is_max_denoise(sigmas))
    assert float(x.flatten()[0] / noise.flatten()[0]) == pytest.approx(14.648812, abs=1e-5)
    # and the UNet sees c_in·x = the noise itself
    m = GaussianEpsModel()
    _run(m, seed=42, latent=Latent(torch.zeros(1, 4, 32, 32)))
    assert torch.allclose(m.calls[0]["x"], noise, atol=1e-5)


def test_ksampler_denoise_keeps_last_steps_of_longer_schedule():
    ms = ModelSampling("eps")
    s = compute_sigmas(ms, "normal", "euler", 10, denoise=0.5)
    full = compute_sigmas(ms, "normal", "euler", 20)
    assert torch.equal(s, full[-11:])
    assert len(compute_sigmas(ms, "normal", "euler", 10, denoise=0.0)) == 0
    assert torch.equal(compute_sigmas(ms, "karras", "euler", 5, denoise=0.99995),
                       compute_sigmas(ms, "karras", "euler", 5))


def test_ksampler_discards_penultimate_sigma_for_dpm2_and_unipc():
    ms = ModelSampling("eps")
    for name in ("dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"):
        s = compute_sigmas(ms, "karras", name, 5)
        six = compute_sigmas(ms, "karras", "euler", 6)
        assert torch.equal(s, torch.cat([six[:-2], six[-1:]]))


def test_ksampler_denoise_zero_returns_input_without_model_calls():
    m = ContextModel()
    lat = _latent(value=0.7)
    out = _run(m, latent=lat, denoise=0.0)
    assert torch.equal(out.samples, lat.samples) and not m.calls


def test_ksampler_advanced_cuts():
    s = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    assert cut_sigmas(s, None, 2, False).tolist() == [5.0, 4.0, 3.0]
    assert cut_sigmas(s, None, 2, True).tolist() == [5.0, 4.0, 0.0]
    assert cut_sigmas(s, 2, None, False).tolist() == [3.0, 2.0, 1.0, 0.0]
    assert cut_sigmas(s, 1, 3, True).tolist() == [4.0, 3.0, 0.0]
    assert cut_sigmas(s, 5, None, False) is None
    assert s.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]  # not modified in place


def test_ksampler_start_past_end_returns_input_unchanged():
    m = ContextModel()
    lat = _latent(value=0.2)
    out = _run(m, latent=lat, start_step=4, last_step=10000)
    assert torch.equal(out.samples, lat.samples) and not m.calls


def test_ksampler_leftover_noise_and_no_added_noise():
    m = GaussianEpsModel()
    lat = _latent(value=0.4)
    out = _run(m, latent=lat, add_noise=False, start_step=0, last_step=2, steps=4,
               force_full_denoise=False)
    assert len(m.calls) == 2
    # no noise added: the UNet's first input is the scaled latent times c_in at σ_0
    sigma0 = float(compute_sigmas(ModelSampling("eps"), "normal", "euler", 4)[0])
    assert torch.allclose(m.calls[0]["x"], lat.samples * 0.5 / math.sqrt(sigma0**2 + 1))
    assert out.samples.shape == lat.samples.shape


def test_ksampler_empty_latent_is_not_scaled():
    m = ContextModel()
    _run(m, add_noise=False)  # zeros latent, no noise: UNet input stays exactly 0
    assert float(m.calls[0]["x"].abs().max()) == 0.0


def test_ksampler_on_step_progress_and_cancel_within_one_step():
    m = ContextModel()
    seen = []
    _run(m, steps=5, on_step=lambda i, n: seen.append((i, n)))
    assert seen == [(i, 5) for i in range(1, 6)]

    class Cancelled(Exception):
        pass

    def cancel(i, n):
        if i == 2:
            raise Cancelled

    m2 = ContextModel()
    with pytest.raises(Cancelled):
        _run(m2, steps=5, on_step=cancel)
    assert len(m2.calls) == 2


def test_ksampler_noise_mask_keeps_unmasked_region():
    m = GaussianEpsModel()
    lat = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :, 4:] = 1.0
    out = _run(m, latent=Latent(lat, noise_mask=mask), steps=6)
    assert torch.allclose(out.samples[..., :4], lat[..., :4], atol=1e-5)
    assert not torch.allclose(out.samples[..., 4:], lat[..., 4:], atol=1e-2)
    assert out.noise_mask is mask


def test_ksampler_inpaint_model_gets_mask_and_masked_latent_concat():
    m = ContextModel(in_channels=9)
    lat = torch.full((1, 4, 8, 8), 2.0)
    mask = torch.zeros(1, 1, 16, 16)
    mask[..., 8:, :] = 0.9
    _run(m, latent=Latent(lat, noise_mask=mask), steps=2)
    x = m.calls[0]["x"]
    assert x.shape == (1, 9, 8, 8)
    assert torch.equal(x[0, 4, 4:], torch.ones(4, 8)) and torch.equal(x[0, 4, :4], torch.zeros(4, 8))
    assert torch.equal(x[:, 5:], lat * 0.5)  # process_in-scaled latent


def test_cfg_denoiser_area_conds_weighted_average():
    m = ContextModel()
    area_ctx = torch.full((1, 2, 3), 3.0)
    pos = (Cond(POS), Cond(area_ctx, area=(16, 16, 16, 16), strength=1.0))
    x = torch.zeros(1, 4, 48, 48)
    den = CFGDenoiser(m, pos, (), 1.0, x)
    out = den(x, torch.tensor([1.0]))
    assert float(out[0, 0, 0, 0]) == pytest.approx(1.0)
    assert float(out[0, 0, 24, 24]) == pytest.approx(2.0)  # (1 + 3) / 2 inside, past feathering
    # feathered edge over min(8, 16 // 4) = 4 px: weight 1/4 on the area's first row
    assert float(out[0, 0, 16, 24]) == pytest.approx((1 + 3 / 4) / (1 + 1 / 4), rel=1e-5)
    assert float(out[0, 0, 19, 24]) == pytest.approx(2.0)


def test_cfg_denoiser_mask_and_strength_weights():
    m = ContextModel()
    mask = torch.zeros(8, 8)
    mask[:, :4] = 1.0
    pos = (Cond(POS), Cond(torch.full((1, 2, 3), 5.0), mask=mask, strength=3.0))
    x = torch.zeros(1, 4, 8, 8)
    out = CFGDenoiser(m, pos, (), 1.0, x)(x, torch.tensor([1.0]))
    assert float(out[0, 0, 0, 0]) == pytest.approx((1 + 5 * 3) / 4)
    assert float(out[0, 0, 0, 7]) == pytest.approx(1.0)


def test_cfg_denoiser_timestep_range_selects_cond_by_sigma():
    m = ContextModel()
    late = Cond(torch.full((1, 2, 3), 7.0), timestep_range=(0.5, 1.0))
    early = Cond(POS, timestep_range=(0.0, 0.5))
    x = torch.zeros(1, 4, 4, 4)
    den = CFGDenoiser(m, (early, late), (), 1.0, x)
    assert float(den(x, torch.tensor([10.0]))[0, 0, 0, 0]) == pytest.approx(1.0)
    assert float(den(x, torch.tensor([0.1]))[0, 0, 0, 0]) == pytest.approx(7.0)


@dataclass
class AdmModel(ContextModel):
    def adm(self, cond, latent_hw, negative=False):
        size = cond.size or SizeCond()
        h = size.height or latent_hw[0] * 8
        return torch.tensor([[float(h), float(size.crop_h)]])


def test_cfg_denoiser_passes_sdxl_adm_vector():
    m = AdmModel()
    x = torch.zeros(1, 4, 4, 6)
    den = CFGDenoiser(m, (Cond(POS, size=SizeCond(height=1024, crop_h=8)),), (Cond(NEG),), 2.0, x)
    den(x, torch.tensor([1.0]))
    y = m.calls[0]["y"]
    assert y.tolist() == [[32.0, 0.0], [1024.0, 8.0]]  # uncond (defaults) first, then cond


@dataclass
class PromptTypeAdmModel(ContextModel):
    def adm(self, cond, latent_hw, negative=False):
        return torch.tensor([[2.5 if negative else 6.0]])  # the refiner's aesthetic default


def test_cfg_denoiser_tells_adm_which_conds_are_negative():
    m = PromptTypeAdmModel()
    x = torch.zeros(1, 4, 4, 4)
    CFGDenoiser(m, (Cond(POS),), (Cond(NEG),), 2.0, x)(x, torch.tensor([1.0]))
    assert m.calls[0]["y"].tolist() == [[2.5], [6.0]]  # uncond first, then cond


class RecordingControl:
    def __init__(self):
        self.seen = []

    def residuals(self, x_in, timesteps, context, y, sigma, percent):
        self.seen.append((x_in.shape, percent))
        return Control(input=(torch.ones(1),), middle=None)


def test_cfg_denoiser_controlnet_residuals_and_apply_to_uncond():
    m = ContextModel()
    ctrl = RecordingControl()
    x = torch.zeros(1, 4, 4, 4)
    den = CFGDenoiser(m, (Cond(POS, control=ctrl, control_apply_to_uncond=True),),
                      (Cond(NEG),), 2.0, x)
    den(x, torch.tensor([float(ModelSampling().percent_to_sigma(0.25))]))
    assert len(m.calls) == 1  # same control object on both sides: one batched call
    assert isinstance(m.calls[0]["control"], Control)
    assert ctrl.seen[0][0] == (2, 4, 4, 4)
    assert ctrl.seen[0][1] == pytest.approx(0.25, abs=1e-4)


def test_parameterization_v_prediction_and_eps_recover_x0():
    x0 = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    n = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(2))
    sigma = torch.tensor([0.5, 7.0])
    s = sigma.reshape(-1, 1, 1, 1)
    x = x0 + s * n
    eps = ModelSampling("eps").calculate_denoised(sigma, n, x)
    v = (n - s * x0) / (s**2 + 1).sqrt()  # α·n − σ_vp·x0 in VE units
    vp = ModelSampling("v_prediction").calculate_denoised(sigma, v, x)
    assert torch.allclose(eps, x0, atol=1e-5) and torch.allclose(vp, x0, atol=1e-5)
    assert torch.allclose(ModelSampling("eps").calculate_input(sigma, x), x / (s**2 + 1).sqrt())


def test_parameterization_lcm_boundary_condition():
    ms = ModelSampling("lcm")
    x = torch.ones(1, 1, 1, 1)
    eps = torch.full_like(x, 0.5)
    high = ms.calculate_denoised(ms.sigma_max.reshape(1), eps, x)
    # at t = 999, c_skip ≈ 0 and c_out ≈ 1: the eps estimate of x0
    assert float(high) == pytest.approx(1 - 0.5 * float(ms.sigma_max), rel=1e-4)
    with pytest.raises(NotImplementedError, match="not supported yet"):
        ModelSampling("edm")


def test_cfg_denoiser_adds_same_area_uncond_for_area_conds():
    m = ContextModel()
    pos = (Cond(POS), Cond(torch.full((1, 2, 3), 3.0), area=(16, 16, 8, 8)))
    x = torch.zeros(1, 4, 32, 32)
    CFGDenoiser(m, pos, (Cond(NEG),), 2.0, x)(x, torch.tensor([1.0]))
    shapes = sorted(tuple(c["x"].shape) for c in m.calls)
    assert shapes == [(2, 4, 16, 16), (2, 4, 32, 32)]
    area_call = next(c for c in m.calls if c["x"].shape[-1] == 16)
    assert sorted(area_call["context"][:, 0, 0].tolist()) == [-1.0, 3.0]


def test_ksampler_ddim_is_euler_except_inpaint_noise():
    lat = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    a = _run(GaussianEpsModel(), sampler_name="ddim", latent=Latent(lat))
    b = _run(GaussianEpsModel(), sampler_name="euler", latent=Latent(lat))
    assert torch.equal(a.samples, b.samples)
    mask = torch.ones(1, 1, 8, 8)
    mask[..., :4] = 0.0
    ma, mb = GaussianEpsModel(), GaussianEpsModel()
    _run(ma, sampler_name="ddim", latent=Latent(lat, noise_mask=mask))
    _run(mb, sampler_name="euler", latent=Latent(lat, noise_mask=mask))
    xa, xb = ma.calls[1]["x"], mb.calls[1]["x"]
    assert torch.equal(xa[..., 4:], xb[..., 4:])  # sampled region: same trajectory
    assert not torch.allclose(xa[..., :4], xb[..., :4])  # kept region re-noised with seed+1


def test_sd_runner_concat_follows_the_unet_input_width():
    """``UNetRunner.concat`` (ComfyUI's ``concat_cond``): none for a 4-channel UNet, the image
    latent for 8 (instruct-pix2pix; zeros without one), mask + masked latent for 9 (inpaint; all
    ones + the grey latent without a mask), and a clear refusal for another width."""
    from types import SimpleNamespace

    from mixgraph.nodes.families.sd.family import SD
    from mixgraph.nodes.families.sd.runner import UNetRunner
    from mixgraph.nodes.models.concat_cond import blank_inpaint_latent

    def runner(in_channels):
        r = UNetRunner.__new__(UNetRunner)
        r.handle = SimpleNamespace(parts=None)
        r.in_channels, r.latent_format = in_channels, SD.latent_format("sd1")
        return r

    lat = torch.full((2, 4, 4, 6), 0.5)
    image = torch.randn(1, 4, 4, 6, generator=torch.Generator().manual_seed(0))
    assert runner(4).concat(Cond(POS), lat, None, 0) is None
    assert torch.equal(runner(8).concat(Cond(POS), lat, None, 0), torch.zeros_like(lat))
    assert torch.equal(runner(8).concat(Cond(POS, concat_latent=image), lat, None, 0), image.expand(2, -1, -1, -1))
    blank = runner(9).concat(Cond(POS), lat, None, 0)
    assert torch.equal(blank, torch.cat([torch.ones(2, 1, 4, 6), blank_inpaint_latent(lat)], dim=1))
    mask = torch.zeros(2, 4, 4, 6)
    mask[:, :, 2:] = 1.0
    masked = runner(9).concat(Cond(POS), lat, mask, 0)
    assert torch.equal(masked, torch.cat([mask[:, :1], lat], dim=1))
    with pytest.raises(NotImplementedError, match="a 6-channel model with a 4-channel latent: only inpaint"):
        runner(6).concat(Cond(POS), lat, None, 0)
