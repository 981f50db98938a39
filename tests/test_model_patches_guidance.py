"""APG, TCFG, Self-Attention Guidance and Differential Diffusion: specs as ComfyUI's, hand-derived
values, identities (neutral settings equal a known plain result), per-run state, and end-to-end
runs on a tiny SD1.5 checkpoint."""

import math

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families.sd.unet import attention
from mixgraph.nodes.families.sd.unet_patches import AttentionRecorder, attention_with_probs
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import cfg_patches
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.nodes.sampling.ksampler import sample
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.ui import api

INFO = api.default_registry().object_info()
F32 = parse_spec("f32")


def test_guidance_patch_specs_match_comfyui():
    req = lambda n: INFO[n]["input"]["required"]  # noqa: E731
    assert INFO["APG"]["input_order"]["required"] == ["model", "eta", "norm_threshold", "momentum"]
    assert req("APG")["eta"][1] | {} == {**req("APG")["eta"][1], "default": 1.0, "min": -10.0, "max": 10.0,
                                         "step": 0.01}
    assert {k: req("APG")["norm_threshold"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 5.0, "min": 0.0, "max": 50.0, "step": 0.1}
    assert {k: req("APG")["momentum"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 0.0, "min": -5.0, "max": 1.0, "step": 0.01}  # V3 940df5e
    assert INFO["APG"]["category"] == "sampling/custom_sampling" and INFO["APG"]["output"] == ["MODEL"]
    assert INFO["TCFG"]["input_order"]["required"] == ["model"]
    assert INFO["TCFG"]["output_name"] == ["patched_model"] and INFO["TCFG"]["category"] == "advanced/guidance"
    sag = req("SelfAttentionGuidance")
    assert sag["scale"] == ["FLOAT", {"default": 0.5, "min": -2.0, "max": 5.0, "step": 0.01}]
    assert sag["blur_sigma"] == ["FLOAT", {"default": 2.0, "min": 0.0, "max": 10.0, "step": 0.1}]
    assert INFO["SelfAttentionGuidance"]["category"] == "_for_testing"
    dd = INFO["DifferentialDiffusion"]
    assert dd["input_order"] == {"required": ["model"], "optional": ["strength"]}
    assert dd["input"]["optional"]["strength"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.0001}]
    assert dd["category"] == "_for_testing"


def _args(x, cond, uncond, scale, sigma=2.0, state=None, evaluate_negative=None):
    return GuidanceArgs(x, torch.full((x.shape[0],), sigma), scale, cond, uncond, None, evaluate_negative,
                        {} if state is None else state)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_apg_neutral_is_cfg_one_higher():
    # eta 1, no threshold, no momentum: cond' = uncond + g + g/s, so CFG gives uncond + (s + 1)·g
    x, c, u = _rand(2, 4, 3, 3, seed=1), _rand(2, 4, 3, 3, seed=2), _rand(2, 4, 3, 3, seed=3)
    out = cfg_patches.guide((cfg_patches.APG(1.0, 0.0, 0.0),), _args(x, c, u, 4.0))
    assert torch.allclose(out, u + (c - u) * 5.0, atol=1e-5)


def test_apg_threshold_and_projection_hand_values():
    # cond = (1, 0), uncond = (-5, 0) [as 1×2×1×1]: g = (6, 0), fully parallel to cond.
    c = torch.tensor([1.0, 0.0]).reshape(1, 2, 1, 1)
    u = torch.tensor([-5.0, 0.0]).reshape(1, 2, 1, 1)
    x = torch.zeros_like(c)
    # threshold 3 -> g = (3, 0); eta 0.5 -> g' = (1.5, 0); cond' = u + g' + (c − u)/2 = (-0.5, 0);
    # CFG 2: u + 2·(cond' − u) = (-5 + 9, 0) = (4, 0)
    out = cfg_patches.guide((cfg_patches.APG(0.5, 3.0, 0.0),), _args(x, c, u, 2.0))
    assert torch.allclose(out.flatten(), torch.tensor([4.0, 0.0]))
    # an orthogonal guidance is kept whatever eta is: cond = (0, 1), uncond = (-1, 1): g = (1, 0)
    c2, u2 = torch.tensor([0.0, 1.0]).reshape(1, 2, 1, 1), torch.tensor([-1.0, 1.0]).reshape(1, 2, 1, 1)
    a = cfg_patches.guide((cfg_patches.APG(0.0, 0.0, 0.0),), _args(x, c2, u2, 3.0))
    b = cfg_patches.guide((cfg_patches.APG(1.0, 0.0, 0.0),), _args(x, c2, u2, 3.0))
    assert torch.allclose(a, b)


def test_apg_momentum_state_is_per_run_and_restarts_when_sigma_rises():
    patch = cfg_patches.APG(1.0, 0.0, 0.5)
    c, u, x = torch.full((1, 1, 1, 1), 2.0), torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
    state: dict = {}
    first = cfg_patches.guide((patch,), _args(x, c, u, 1.0, sigma=3.0, state=state))
    second = cfg_patches.guide((patch,), _args(x, c, u, 1.0, sigma=2.0, state=state))
    # g = 2 each step; running average 2 then 0.5·2 + 2 = 3; at cfg 1 the result is u + g + (c − u)
    assert float(first) == pytest.approx(4.0) and float(second) == pytest.approx(5.0)
    # sigma rises: a new run in the same state dict starts over; a fresh dict too
    assert float(cfg_patches.guide((patch,), _args(x, c, u, 1.0, sigma=3.0, state=state))) == pytest.approx(4.0)
    assert float(cfg_patches.guide((patch,), _args(x, c, u, 1.0, sigma=2.0))) == pytest.approx(4.0)


def test_tcfg_drops_the_tangential_part_of_the_uncond_score():
    x = torch.zeros(1, 2, 1, 1)
    # cond score (0, 2), uncond score (1, 0): top right-singular vector is (0, ±1), so the damped
    # uncond score is 0 and the uncond prediction becomes x; cond is unchanged
    cond, uncond = x - torch.tensor([0.0, 2.0]).reshape(1, 2, 1, 1), x - torch.tensor([1.0, 0.0]).reshape(1, 2, 1, 1)
    c2, u2 = cfg_patches.TangentialDampingCFG().pre(_args(x, cond, uncond, 3.0))
    assert torch.equal(c2, cond) and torch.allclose(u2, x, atol=1e-6)
    # parallel scores: nothing to drop
    cond, uncond = x - torch.tensor([2.0, 4.0]).reshape(1, 2, 1, 1), x - torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1)
    _, u3 = cfg_patches.TangentialDampingCFG().pre(_args(x, cond, uncond, 3.0))
    assert torch.allclose(u3, uncond, atol=1e-5)


def test_pre_cfg_patches_are_skipped_without_a_negative():
    x, c = _rand(1, 4, 2, 2, seed=4), _rand(1, 4, 2, 2, seed=5)
    a = _args(x, c, torch.zeros_like(c), 1.0)
    a.has_uncond = False
    assert torch.equal(cfg_patches.guide((cfg_patches.TangentialDampingCFG(),), a), c)


def test_attention_recorder_matches_attention_and_records_probabilities():
    q, k, v = _rand(2, 6, 8, seed=6), _rand(2, 6, 8, seed=7), _rand(2, 6, 8, seed=8)
    sink: list = []
    out = AttentionRecorder("attn1", ("middle", 0), sink).attention(q, k, v, 2)
    assert torch.allclose(out, attention(q, k, v, 2), atol=1e-5)
    (probs,) = sink
    assert probs.shape == (4, 6, 6) and torch.allclose(probs.sum(-1), torch.ones(4, 6))
    # hand check of one head: sample 1, head 0 uses the first 4 features
    ref = (q[1, :, :4] @ k[1, :, :4].T / 2.0).softmax(-1)
    assert torch.allclose(probs[2], ref, atol=1e-6)
    assert attention_with_probs(q, k, v, 2)[0].shape == q.shape


def test_gaussian_blur_keeps_constants_and_sag_blurs_only_attended_region():
    const = torch.full((1, 2, 8, 8), 0.7)
    assert torch.allclose(cfg_patches.gaussian_blur_2d(const, 9, 2.0), const, atol=1e-6)
    # 16 tokens of a 4×4 map over an 8×8 latent; every query attends to token 0 only, so token 0
    # receives 16 > 1 and the others 0: only the top-left 2×2 latent pixels are blurred
    attn = torch.zeros(2, 16, 16)
    attn[:, :, 0] = 1.0
    x0 = _rand(1, 2, 8, 8, seed=9)
    out = cfg_patches.sag_blur_map(x0, attn, sigma=2.0)
    blurred = cfg_patches.gaussian_blur_2d(x0, 9, 2.0)
    assert torch.allclose(out[..., :2, :2], blurred[..., :2, :2])
    keep = torch.ones(8, 8, dtype=torch.bool)
    keep[:2, :2] = False
    assert torch.equal(out[..., keep], x0[..., keep])


def test_differential_diffusion_thresholds_by_timestep_fraction():
    ms = ModelSampling("eps")
    sigmas = torch.tensor([float(ms.sigma_max), 1.0, 0.0])
    mask = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]).reshape(1, 1, 1, 5)
    dd = cfg_patches.DifferentialDiffusion()
    # first step: threshold 1, only the full-strength pixel is denoised
    assert dd.mask(sigmas[:1], mask, sigmas, ms).flatten().tolist() == [0, 0, 0, 0, 1]
    # at the sigma of timestep t the threshold is (t − t_min)/(999 − t_min), t_min = timestep(σ_min)
    t_min = float(ms.timestep(ms.sigma_min))
    t = float(ms.timestep(torch.tensor(1.0)))
    thr = (t - t_min) / (999 - t_min)
    expect = (mask >= thr).float()
    assert torch.equal(dd.mask(torch.tensor([1.0]), mask, sigmas, ms), expect)
    # at σ_min (the schedule's last model call) the threshold is 0: everything is denoised
    assert torch.equal(dd.mask(ms.sigma_min.reshape(1), mask, sigmas, ms), torch.ones_like(mask))
    # strength 0.5 blends binary and soft
    half = cfg_patches.DifferentialDiffusion(0.5).mask(torch.tensor([1.0]), mask, sigmas, ms)
    assert torch.allclose(half, 0.5 * expect + 0.5 * mask)


# --- on a tiny checkpoint ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    from tests.fixtures.checkpoints import tiny_sd15_model
    return tiny_sd15_model(seed=4)


def _sample(model, cfg=4.0, steps=3, size=8, mask=None, denoise=1.0, latent=None):
    g = torch.Generator().manual_seed(5)
    pos, neg = Cond(torch.randn(1, 77, 32, generator=g)), Cond(torch.randn(1, 77, 32, generator=g))
    lat = Latent(torch.zeros(1, 4, size, size) if latent is None else latent, noise_mask=mask)
    return sample(model.runner(F32), seed=1, steps=steps, cfg=cfg, sampler_name="euler", scheduler="normal",
                  positive=(pos,), negative=(neg,), latent=lat, denoise=denoise).samples


def test_apg_tcfg_sag_end_to_end(model):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    base = _sample(model, size=16)
    # APG neutral at cfg 3 is plain CFG at cfg 4
    apg = N.APG(model, 1.0, 0.0, 0.0)[0]
    assert torch.allclose(_sample(apg, cfg=3.0, size=16), base, rtol=1e-4, atol=1e-4)
    assert torch.allclose(_sample(N.SelfAttentionGuidance(model, 0.0, 2.0)[0], size=16), base)
    momentum = N.APG(model, 1.0, 5.0, 0.5)[0]
    first = _sample(momentum, size=16)
    assert torch.equal(_sample(momentum, size=16), first)  # no state leaks into the next run
    for patched in (momentum, N.TCFG(model)[0], N.SelfAttentionGuidance(model, 0.5, 2.0)[0]):
        out = _sample(patched, size=16)
        assert torch.isfinite(out).all() and not torch.allclose(out, base, rtol=1e-3, atol=1e-3)
    assert torch.equal(_sample(model, size=16), base)
    # SAG turns off the cfg = 1 shortcut: the negative is evaluated and the result changes
    sag1 = _sample(N.SelfAttentionGuidance(model, 1.0, 2.0)[0], cfg=1.0, size=16)
    assert not torch.allclose(sag1, _sample(model, cfg=1.0, size=16), atol=1e-3)


def test_differential_diffusion_full_mask_equals_plain_inpaint(model):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    lat = _rand(1, 4, 8, 8, seed=11)
    full = torch.ones(1, 8, 8)
    dd = N.DifferentialDiffusion(model, 1.0)[0]
    plain = _sample(model, mask=full, denoise=0.8, latent=lat)
    assert torch.allclose(_sample(dd, mask=full, denoise=0.8, latent=lat), plain, atol=1e-6)
    ramp = torch.linspace(0, 1, 8).reshape(1, 1, 8).expand(1, 8, 8)
    soft = _sample(model, mask=ramp, denoise=0.8, latent=lat)
    diff = _sample(dd, mask=ramp, denoise=0.8, latent=lat)
    assert torch.isfinite(diff).all() and not torch.allclose(diff, soft, atol=1e-3)


# --- continuous model sampling -------------------------------------------------------------------

def test_model_sampling_continuous_specs_match_comfyui():
    edm = INFO["ModelSamplingContinuousEDM"]["input"]["required"]
    assert edm["sampling"] == [["v_prediction", "edm", "edm_playground_v2.5", "eps", "cosmos_rflow"]]
    assert edm["sigma_max"] == ["FLOAT", {"default": 120.0, "min": 0.0, "max": 1000.0, "step": 0.001, "round": False}]
    assert edm["sigma_min"] == ["FLOAT", {"default": 0.002, "min": 0.0, "max": 1000.0, "step": 0.001, "round": False}]
    v = INFO["ModelSamplingContinuousV"]["input"]["required"]
    assert v["sampling"] == [["v_prediction"]]
    assert v["sigma_max"][1]["default"] == 500.0 and v["sigma_min"][1]["default"] == 0.03
    for n in ("ModelSamplingContinuousEDM", "ModelSamplingContinuousV"):
        assert INFO[n]["category"] == "advanced/model" and INFO[n]["output"] == ["MODEL"]
        assert INFO[n]["input_order"]["required"] == ["model", "sampling", "sigma_max", "sigma_min"]


def test_continuous_schedules_hand_values():
    from mixgraph.nodes.sampling.schedules import calculate_sigmas
    ms = ModelSampling("eps", continuous=("edm", 0.002, 120.0))
    assert float(ms.sigma_max) == pytest.approx(120.0, rel=1e-5) and float(ms.sigma_min) == pytest.approx(0.002, rel=1e-5)
    assert float(ms.timestep(torch.tensor(1.0))) == 0.0
    assert float(ms.timestep(torch.tensor(math.e ** 4))) == pytest.approx(1.0, rel=1e-6)
    # normal: linear in t = ¼·ln σ, i.e. geometric in σ: 120, sqrt(120·0.002), 0.002, then 0
    sig = calculate_sigmas(ms.schedule, "normal", 3)
    assert torch.allclose(sig, torch.tensor([120.0, (120 * 0.002) ** 0.5, 0.002, 0.0]), rtol=1e-4)
    assert ms.percent_to_sigma(0.5) == pytest.approx((120 * 0.002) ** 0.5, rel=1e-5)
    assert ms.schedule.sigma_to_percent(ms.percent_to_sigma(0.3)) == pytest.approx(0.3, abs=1e-6)
    v = ModelSampling("v_prediction", continuous=("v", 0.03, 500.0))
    assert float(v.timestep(torch.tensor(1.0))) == pytest.approx(0.5, rel=1e-6)
    assert float(v.schedule.sigma(torch.tensor(0.5))) == pytest.approx(1.0, rel=1e-5)


def test_edm_preconditioning_hand_value():
    ms = ModelSampling("edm", continuous=("edm", 0.002, 80.0))
    # σ = 1, σ_data = 0.5: c_skip = 0.25/1.25 = 0.2, c_out = 0.5/sqrt(1.25), c_in = 1/sqrt(1.25)
    x, out, s = torch.full((1, 1, 1, 1), 2.0), torch.ones(1, 1, 1, 1), torch.tensor([1.0])
    assert float(ms.calculate_denoised(s, out, x)) == pytest.approx(0.4 + 0.5 / 1.25**0.5, rel=1e-6)
    assert float(ms.calculate_input(s, x)) == pytest.approx(2.0 / 1.25**0.5, rel=1e-6)
    with pytest.raises(NotImplementedError, match="continuous schedule"):
        ModelSampling("edm")


def test_model_sampling_continuous_end_to_end(model):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    base = _sample(model)
    for patched in (N.ModelSamplingContinuousEDM(model, "eps", 14.6, 0.03)[0],
                    N.ModelSamplingContinuousEDM(model, "edm", 80.0, 0.002)[0],
                    N.ModelSamplingContinuousV(model, "v_prediction", 500.0, 0.03)[0]):
        out = _sample(patched)
        assert torch.isfinite(out).all() and not torch.allclose(out, base, atol=1e-3)
    assert torch.equal(_sample(model), base)
    with pytest.raises(NotImplementedError, match="cosmos_rflow"):
        N.ModelSamplingContinuousEDM(model, "cosmos_rflow", 80.0, 0.002)
    pg = N.ModelSamplingContinuousEDM(model, "edm_playground_v2.5", 80.0, 0.002)[0]  # tests/test_playground_edm.py
    assert pg.prediction == "edm" and pg.latent_format.name == "sdxl_playground_2_5"
    with pytest.raises(ValueError, match="sigma_min"):
        N.ModelSamplingContinuousV(model, "v_prediction", 1.0, 0.0)


def test_guidance_patch_nodes_run_in_a_workflow(tmp_path):
    from tests.fixtures.checkpoints import write_sd15
    (tmp_path / "checkpoints").mkdir()
    write_sd15(tmp_path / "checkpoints" / "sd15.safetensors", seed=4)
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    m = g.add("ModelSamplingContinuousEDM", model=ck[0], sampling="eps", sigma_max=14.6, sigma_min=0.03)
    m = g.add("APG", model=m, eta=0.5, norm_threshold=5.0, momentum=0.5)
    m = g.add("TCFG", model=m)
    m = g.add("SelfAttentionGuidance", model=m, scale=0.5, blur_sigma=2.0)
    m = g.add("DifferentialDiffusion", model=m, strength=1.0)
    pos = g.add("CLIPTextEncode", text="a cube", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    lat = g.add("EmptyLatentImage", width=128, height=128, batch_size=1)
    mask = g.add("SolidMask", value=0.5, width=128, height=128)
    lat = g.add("SetLatentNoiseMask", samples=lat, mask=mask)
    ks = g.add("KSampler", model=m, seed=1, steps=2, cfg=5.0, sampler_name="euler", scheduler="karras",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=ck[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=tmp_path, output=tmp_path / "out")
    assert torch.isfinite(out[dec.node_id][0]).all()
