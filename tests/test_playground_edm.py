"""Playground v2.5: ModelSamplingContinuousEDM "edm_playground_v2.5" (EDM with σ_data = 0.5 and the
per-channel latent format of ComfyUI's ``SDXL_Playground_2_5``), checked against hand values and a
sampling loop written here from the formulas, on a tiny SDXL checkpoint."""

import math
from types import SimpleNamespace

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
from mixgraph.nodes.models import loader
from mixgraph.nodes.vae.latent_format import PLAYGROUND_V2_5, LatentFormat, format_of
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.sampling import Guidance, Sampler
from mixgraph.nodes.helpers.previews import previewer_for
from mixgraph.nodes.sampling.ksampler import add_noise, sample, sample_custom
from mixgraph.nodes.sampling.parameterization import CondDenoiser, ModelSampling
from mixgraph.nodes.families.sd.family import SD
from mixgraph.nodes.families.sd.runner import UNetRunner
from mixgraph.nodes.sampling.preview import Latent2RGBPreviewer, latent_to_rgb, make_previewer, preview_format

F32 = parse_spec("f32")
MEAN = torch.tensor([-1.6574, 1.886, -1.383, 2.5155]).view(1, 4, 1, 1)
STD = torch.tensor([8.4927, 5.9022, 6.5498, 5.2299]).view(1, 4, 1, 1)
SIGMA_DATA = 0.5


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- the latent format ---------------------------------------------------------------------------

def test_latent_format_playground_hand_values():
    # channel c holds mean_c + k_c·std_c, so process_in gives k_c·0.5 exactly
    k = torch.tensor([0.0, 1.0, -2.0, 4.0]).view(1, 4, 1, 1)
    z = (MEAN + k * STD).expand(1, 4, 2, 3)
    x = PLAYGROUND_V2_5.process_in(z)
    assert torch.allclose(x, (k * 0.5).expand(1, 4, 2, 3), atol=1e-5)
    # process_out: x·std/0.5 + mean; x = 1 on every channel gives mean + 2·std
    out = PLAYGROUND_V2_5.process_out(torch.ones(1, 4, 1, 1))
    assert torch.allclose(out.flatten(), torch.tensor([-1.6574 + 2 * 8.4927, 1.886 + 2 * 5.9022,
                                                       -1.383 + 2 * 6.5498, 2.5155 + 2 * 5.2299]), atol=1e-5)
    assert (PLAYGROUND_V2_5.scale_factor, PLAYGROUND_V2_5.channels, PLAYGROUND_V2_5.downscale) == (0.5, 4, 8)


def test_latent_format_round_trip_and_dtypes():
    z = _randn(2, 4, 5, 6, seed=1) * 6.0
    assert torch.allclose(PLAYGROUND_V2_5.process_out(PLAYGROUND_V2_5.process_in(z)), z, atol=1e-5)
    x = _randn(2, 4, 5, 6, seed=2)
    assert torch.allclose(PLAYGROUND_V2_5.process_in(PLAYGROUND_V2_5.process_out(x)), x, atol=1e-5)
    assert PLAYGROUND_V2_5.process_in(z.double()).dtype == torch.float64
    with pytest.raises(ValueError, match="4-channel"):
        PLAYGROUND_V2_5.process_in(torch.zeros(1, 3, 2, 2))
    with pytest.raises(ValueError, match="mean and std"):
        LatentFormat(0.5, mean=(0.0,) * 4)


def test_latent_format_scalar_formats_unchanged():
    z = _randn(1, 4, 3, 3, seed=3)
    for s in (0.18215, 0.13025, 0.08333):
        fmt = LatentFormat(s)
        assert not fmt.is_affine
        assert torch.equal(fmt.process_in(z), z * s) and torch.equal(fmt.process_out(z), z / s)
    # a bare sampler model with only a latent scale, and one with neither
    assert format_of(SimpleNamespace(latent_scale=0.5)) == LatentFormat(0.5)
    assert torch.equal(format_of(SimpleNamespace()).process_in(z), z)


# --- the node ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sdxl
    root = tmp_path_factory.mktemp("playground")
    (root / "checkpoints").mkdir()
    write_sdxl(root / "checkpoints" / "sdxl.safetensors", seed=6)
    model, clip, vae = loader.load_checkpoint(root / "checkpoints" / "sdxl.safetensors")
    return SimpleNamespace(root=root, model=model, clip=clip, vae=vae)


def test_edm_playground_node_sets_edm_and_latent_format(sdxl):
    base = sdxl.model
    pg = N.ModelSamplingContinuousEDM(base, "edm_playground_v2.5", 80.0, 0.002)[0]
    assert pg.prediction == "edm" and pg.continuous_sampling == ("edm", 0.002, 80.0)
    assert pg.latent_format == PLAYGROUND_V2_5
    assert base.latent_format == SD.latent_format("sdxl") and base.prediction == "eps"  # unchanged
    ms = ModelSampling.for_model(pg.runner(F32))
    assert ms.sigma_data == SIGMA_DATA
    assert float(ms.sigma_max) == pytest.approx(80.0, rel=1e-5)
    assert format_of(pg.runner(F32)) == PLAYGROUND_V2_5
    # a later "edm" keeps the replaced format (ComfyUI's object patch stays); eps / v keep σ_data 1
    again = N.ModelSamplingContinuousEDM(pg, "edm", 120.0, 0.002)[0]
    assert again.latent_format == PLAYGROUND_V2_5
    assert N.ModelSamplingContinuousEDM(base, "edm", 80.0, 0.002)[0].latent_format == base.latent_format
    for p in ("eps", "v_prediction"):
        assert ModelSampling.for_model(N.ModelSamplingContinuousEDM(base, p, 80.0, 0.002)[0]).sigma_data == 1.0
    with pytest.raises(NotImplementedError, match="cosmos_rflow.*not supported yet"):
        N.ModelSamplingContinuousEDM(base, "cosmos_rflow", 80.0, 0.002)


# --- sampling against a loop written from the formulas ----------------------------------------------

def _karras(n, sigma_min=0.002, sigma_max=80.0, rho=7.0):
    ramp = torch.linspace(0, 1, n, dtype=torch.float64)
    s = (sigma_max ** (1 / rho) + ramp * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return [float(v) for v in s] + [0.0]


def _conds(sdxl):
    pos = sdxl.clip.encode("a red cube", F32)[0]
    neg = sdxl.clip.encode("blurry", F32)[0]
    return pos, neg


def _reference(runner, pos, neg, z, noise, sigmas, cfg, max_denoise):
    """Euler with CFG in the EDM parameterisation (Karras et al. 2022, σ_data = 0.5), in the
    Playground latent space; returns (sample, last x0), both back in VAE latent space."""
    H, W = z.shape[-2:]
    x = (z - MEAN) * 0.5 / STD
    s0 = sigmas[0]
    x = x + noise * (math.sqrt(1 + s0 ** 2) if max_denoise else s0)
    y_p, y_n = runner.adm(pos, (H, W)), runner.adm(neg, (H, W), negative=True)
    denoised = None
    for i in range(len(sigmas) - 1):
        s = sigmas[i]
        c_in = 1 / math.sqrt(s ** 2 + SIGMA_DATA ** 2)
        c_skip = SIGMA_DATA ** 2 / (s ** 2 + SIGMA_DATA ** 2)
        c_out = s * SIGMA_DATA / math.sqrt(s ** 2 + SIGMA_DATA ** 2)
        t = torch.tensor([0.25 * math.log(s)])
        f_p = runner.unet(x * c_in, t, pos.cross_attn, y_p).float()
        f_n = runner.unet(x * c_in, t, neg.cross_attn, y_n).float()
        d_p, d_n = c_skip * x + c_out * f_p, c_skip * x + c_out * f_n
        denoised = d_n + (d_p - d_n) * cfg
        x = x + (x - denoised) / s * (sigmas[i + 1] - s)
    return x * STD / 0.5 + MEAN, denoised * STD / 0.5 + MEAN


@pytest.mark.parametrize("denoise", [1.0, 0.5])
def test_playground_ksampler_matches_reference_loop(sdxl, denoise):
    pg = N.ModelSamplingContinuousEDM(sdxl.model, "edm_playground_v2.5", 80.0, 0.002)[0]
    runner = pg.runner(F32)
    pos, neg = _conds(sdxl)
    z = MEAN + STD * _randn(1, 4, 16, 16, seed=7) * 0.3  # a VAE-space latent (img2img)
    steps, seed, cfg = 2, 11, 2.5
    out = sample(runner, seed=seed, steps=steps, cfg=cfg, sampler_name="euler", scheduler="karras",
                 positive=(pos,), negative=(neg,), latent=Latent(z), denoise=denoise).samples
    sigmas = _karras(int(steps / denoise))[-(steps + 1):]
    noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(seed))
    want, _ = _reference(runner, pos, neg, z, noise, sigmas, cfg, max_denoise=denoise == 1.0)
    assert torch.isfinite(out).all() and out.abs().max() > 1.0
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-3), (out - want).abs().max()
    # the same run without the Playground format is a different result
    plain = N.ModelSamplingContinuousEDM(sdxl.model, "edm", 80.0, 0.002)[0].runner(F32)
    other = sample(plain, seed=seed, steps=steps, cfg=cfg, sampler_name="euler", scheduler="karras",
                   positive=(pos,), negative=(neg,), latent=Latent(z), denoise=denoise).samples
    assert not torch.allclose(other, out, atol=1e-2)


def test_playground_sampler_custom_outputs_and_add_noise(sdxl):
    pg = N.ModelSamplingContinuousEDM(sdxl.model, "edm_playground_v2.5", 80.0, 0.002)[0]
    runner = pg.runner(F32)
    pos, neg = _conds(sdxl)
    z = MEAN + STD * _randn(1, 4, 16, 16, seed=8) * 0.3
    noise = _randn(1, 4, 16, 16, seed=9)
    sigmas = _karras(3, 0.002, 80.0)[1:3]  # two nonzero sigmas: one step that leaves noise
    out, denoised = sample_custom(runner, guidance=Guidance("cfg", ((pos,), (neg,)), (2.0,)),
                                  sampler=Sampler("euler"), sigmas=torch.tensor(sigmas), noise=noise, seed=3,
                                  latent=Latent(z))
    want, want_x0 = _reference(runner, pos, neg, z, noise, sigmas, 2.0, max_denoise=False)
    assert torch.allclose(out.samples, want, rtol=1e-4, atol=1e-3)
    assert torch.allclose(denoised.samples, want_x0, rtol=1e-4, atol=1e-3)  # process_out'd x0
    # AddNoise: process_in, + noise·|σ_first − σ_last|, process_out
    level = abs(sigmas[0] - sigmas[1])
    noisy = add_noise(pg, noise, torch.tensor(sigmas), Latent(z)).samples
    assert torch.allclose(noisy, ((z - MEAN) * 0.5 / STD + noise * level) * STD / 0.5 + MEAN, atol=1e-4)
    # the empty latent is not shifted on the way in (ComfyUI), only on the way out
    empty = add_noise(pg, noise, torch.tensor(sigmas), Latent(torch.zeros_like(z))).samples
    assert torch.allclose(empty, (noise * level) * STD / 0.5 + MEAN, atol=1e-4)


def test_playground_inpaint_concat_latent_goes_through_process_in():
    """An SD inpaint runner whose handle carries Playground's format: the concat latent is
    brought into the sampler's space by that format (the SD runner's ``concat``)."""
    handle = SimpleNamespace(config=SimpleNamespace(in_channels=9), latent_format=PLAYGROUND_V2_5,
                             parts=None, unet_patches=())
    runner = UNetRunner.__new__(UNetRunner)
    runner.handle, runner.in_channels, runner.latent_format = handle, 9, PLAYGROUND_V2_5
    z = MEAN + STD * _randn(1, 4, 8, 8, seed=10)
    cond = Cond(_randn(1, 77, 32, seed=11), concat_latent=z, concat_mask=torch.zeros(1, 1, 8, 8))
    model = SimpleNamespace(prediction="eps", zsnr=False, in_channels=9, latent_format=PLAYGROUND_V2_5,
                            concat=runner.concat)
    den = CondDenoiser(model, [[cond]], [False], torch.zeros(1, 4, 8, 8), control_to_uncond=None)
    concat = den.lists[0][0].concat  # [B, 1 + 4, H, W]: mask, masked latent
    assert torch.allclose(concat[:, 1:], (z - MEAN) * 0.5 / STD, atol=1e-5)


# --- previews ------------------------------------------------------------------------------------

def test_playground_latent2rgb_preview_uses_its_factors(sdxl):
    pg = N.ModelSamplingContinuousEDM(sdxl.model, "edm_playground_v2.5", 80.0, 0.002)[0]
    runner = pg.runner(F32)
    assert preview_format(runner) == PLAYGROUND_V2_5 and preview_format(sdxl.model) == SD.latent_format("sdxl")
    x0 = _randn(1, 4, 3, 2, seed=12)
    factors = torch.tensor([[0.3920, 0.4054, 0.4549], [-0.2634, -0.0196, 0.0653],
                            [0.0568, 0.1687, -0.0755], [-0.3112, -0.2359, -0.2076]])
    want = ((x0[0].movedim(0, -1) @ factors + 1.0) / 2.0).clamp(0, 1)  # no bias
    assert torch.allclose(latent_to_rgb(x0, preview_format(runner)), want, atol=1e-6)
    assert not torch.allclose(latent_to_rgb(x0, SD.latent_format("sdxl")), want, atol=1e-3)
    ctx = SimpleNamespace(env=SimpleNamespace(settings={"preview_method": "latent2rgb"}))
    previewer = previewer_for(ctx, runner)
    assert isinstance(previewer, Latent2RGBPreviewer) and previewer.format == PLAYGROUND_V2_5
    asked = []
    make_previewer("taesd", preview_format(runner), lambda name: asked.append(name))  # no file: latent2rgb
    assert asked == ["taesdxl_decoder"]


def test_playground_step_previews_see_the_sampler_latent(sdxl):
    pg = N.ModelSamplingContinuousEDM(sdxl.model, "edm_playground_v2.5", 80.0, 0.002)[0]
    runner = pg.runner(F32)
    pos, neg = _conds(sdxl)
    images = []
    out = sample(runner, seed=2, steps=2, cfg=1.0, sampler_name="euler", scheduler="karras", positive=(pos,),
                 negative=(neg,), latent=Latent(torch.zeros(1, 4, 16, 16)),
                 on_step=lambda i, total, image: images.append(image),
                 preview=lambda x0: latent_to_rgb(x0, preview_format(runner))).samples
    # euler's last x0 is the sample: the preview is latent2rgb of it in the sampler's space
    assert len(images) == 2
    assert torch.allclose(images[-1], latent_to_rgb(PLAYGROUND_V2_5.process_in(out), PLAYGROUND_V2_5),
                          atol=1e-5)


def test_playground_workflow_runs(sdxl, tmp_path):
    from mixgraph.ui import api
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")
    m = g.add("ModelSamplingContinuousEDM", model=ck[0], sampling="edm_playground_v2.5", sigma_max=80.0,
              sigma_min=0.002)
    pos = g.add("CLIPTextEncode", text="a cube", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    lat = g.add("EmptyLatentImage", width=128, height=128, batch_size=1)
    ks = g.add("KSampler", model=m, seed=1, steps=2, cfg=3.0, sampler_name="dpmpp_2m", scheduler="karras",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=ck[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=sdxl.root, output=tmp_path / "out")
    samples = out[ks.node_id][0].samples
    assert samples.shape == (1, 4, 16, 16) and torch.isfinite(samples).all()
    assert torch.isfinite(out[dec.node_id][0]).all()


# --- loading a Playground v2.5 checkpoint ------------------------------------------------------------

def test_loader_detects_playground_checkpoint(tmp_path):
    from tests.fixtures.checkpoints import save_state_dict, sd15_state_dict, sdxl_state_dict
    markers = {"edm_mean": MEAN.clone(), "edm_std": STD.clone()}
    path = save_state_dict(tmp_path / "pg.safetensors", sdxl_state_dict(seed=6) | markers)
    model, clip, vae = loader.load_checkpoint(path)
    assert (model.kind, model.prediction, model.continuous_sampling) == ("sdxl", "edm", ("edm", 0.002, 80.0))
    assert model.latent_format == PLAYGROUND_V2_5 and clip is not None and vae is not None
    assert ModelSampling.for_model(model.runner(F32)).sigma_data == SIGMA_DATA
    unet = loader.load_unet(path)  # UNETLoader reads the same markers
    assert (unet.prediction, unet.continuous_sampling, unet.latent_format) == \
        ("edm", ("edm", 0.002, 80.0), PLAYGROUND_V2_5)
    # a loaded Playground model samples exactly as the node-patched plain SDXL one
    plain, _, _ = loader.load_checkpoint(save_state_dict(tmp_path / "sdxl.safetensors", sdxl_state_dict(seed=6)))
    patched = N.ModelSamplingContinuousEDM(plain, "edm_playground_v2.5", 80.0, 0.002)[0]
    cond = clip.encode("a cube", F32)[0]
    z = MEAN + STD * _randn(1, 4, 16, 16, seed=13) * 0.3
    runs = [sample(m.runner(F32), seed=4, steps=2, cfg=2.0, sampler_name="euler", scheduler="karras",
                   positive=(cond,), negative=(cond,), latent=Latent(z), denoise=0.6).samples
            for m in (model, patched)]
    assert torch.equal(runs[0], runs[1])
    # a plain SDXL file, edm_mean without edm_std, an SD1 file with the markers, edm_vpred: not Playground
    assert plain.prediction == "eps" and plain.latent_format == SD.latent_format("sdxl")
    with pytest.raises(NotImplementedError, match="not supported yet"):
        loader.load_checkpoint(save_state_dict(tmp_path / "half.safetensors", sdxl_state_dict(seed=6) | {"edm_mean": MEAN}))
    with pytest.raises(NotImplementedError, match="not supported yet"):
        loader.load_checkpoint(save_state_dict(tmp_path / "sd1.safetensors", sd15_state_dict(seed=1) | markers))
    with pytest.raises(NotImplementedError, match="edm_vpred.*not supported yet"):
        loader.load_checkpoint(save_state_dict(tmp_path / "vpred.safetensors",
                                     sdxl_state_dict(seed=6) | {"edm_vpred.sigma_max": torch.tensor([120.0])}))
