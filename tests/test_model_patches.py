"""Model patches (RescaleCFG, CFGZeroStar, PAG, FreeU, attention multipliers): specs as
ComfyUI's, hand-derived values, identities (neutral settings equal no patch), no leaking into
other handles of the same weights, and end-to-end runs on a tiny SD1.5 checkpoint."""

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.adapters.lora import ScalePatch
from mixgraph.nodes.families.sd.unet import CrossAttention
from mixgraph.nodes.families.sd.unet_patches import FreeU, IdentityAttention, fourier_filter
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import cfg_patches
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.nodes.sampling.ksampler import sample
from mixgraph.ui import api

INFO = api.default_registry().object_info()
F32 = parse_spec("f32")


def test_model_patch_specs_match_comfyui():
    req = lambda n: INFO[n]["input"]["required"]  # noqa: E731
    assert req("RescaleCFG")["multiplier"] == ["FLOAT", {"default": 0.7, "min": 0.0, "max": 1.0, "step": 0.01}]
    assert INFO["RescaleCFG"]["category"] == "advanced/model"
    assert INFO["CFGZeroStar"]["output_name"] == ["patched_model"]
    assert INFO["CFGZeroStar"]["category"] == "advanced/guidance"
    assert req("PerturbedAttentionGuidance")["scale"] == ["FLOAT", {"default": 3.0, "min": 0.0, "max": 100.0,
                                                                    "step": 0.01, "round": 0.01}]
    for name, (b1, b2) in {"FreeU": (1.1, 1.2), "FreeU_V2": (1.3, 1.4)}.items():
        assert INFO[name]["input_order"]["required"] == ["model", "b1", "b2", "s1", "s2"]
        assert INFO[name]["category"] == "model_patches/unet"
        assert req(name)["b1"] == ["FLOAT", {"default": b1, "min": 0.0, "max": 10.0, "step": 0.01}]
        assert req(name)["b2"][1]["default"] == b2 and req(name)["s2"][1]["default"] == 0.2
    for name, first in {"UNetSelfAttentionMultiply": "model", "UNetCrossAttentionMultiply": "model",
                        "CLIPAttentionMultiply": "clip"}.items():
        assert INFO[name]["input_order"]["required"] == [first, "q", "k", "v", "out"]
        assert req(name)["q"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}]
        assert INFO[name]["category"] == "_for_testing/attention_experiments"


def _args(x, cond, uncond, scale, sigma=2.0, evaluate=None):
    return GuidanceArgs(x, torch.full((x.shape[0],), sigma), scale, cond, uncond, evaluate)


def test_rescale_cfg_zero_is_plain_cfg_and_one_matches_cond_std_in_v_space():
    g = torch.Generator().manual_seed(0)
    x, c, u = (torch.randn(2, 4, 3, 3, generator=g) for _ in range(3))
    plain = u + (c - u) * 5.0
    assert torch.allclose(cfg_patches.guide((cfg_patches.RescaleCFG(0.0),), _args(x, c, u, 5.0)), plain, atol=1e-5)
    # multiplier 1: the guided v prediction has the conditional v prediction's std, per sample
    s = 2.0
    out = cfg_patches.guide((cfg_patches.RescaleCFG(1.0),), _args(x, c, u, 5.0, s))
    xs = x / (s * s + 1)
    to_v = lambda d: (xs - d) * (s * s + 1) ** 0.5 / s  # noqa: E731
    assert torch.allclose(to_v(out).flatten(1).std(1), to_v(c).flatten(1).std(1), rtol=1e-5)


def test_cfg_zero_star_hand_values():
    one = lambda v: torch.full((1, 1, 1, 1), float(v))  # noqa: E731
    # x=0, cond=2, uncond=1: alpha = <-2,-1>/|-1|² = 2; cfg 3 -> 1 + 3·1 = 4;
    # 4 + 1·(2 − 1) + 3·1·(1 − 2) = 2
    out = cfg_patches.guide((cfg_patches.CFGZeroStar(),), _args(one(0), one(2), one(1), 3.0))
    assert float(out) == pytest.approx(2.0, rel=1e-6)
    # cond == uncond: alpha = 1, no change
    x = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(1))
    same = torch.full_like(x, 0.5)
    assert torch.allclose(cfg_patches.guide((cfg_patches.CFGZeroStar(),), _args(x, same, same, 7.0)), same)


def test_pag_adds_cond_minus_perturbed_times_scale():
    c, u, p = torch.full((1, 4, 2, 2), 2.0), torch.zeros(1, 4, 2, 2), torch.full((1, 4, 2, 2), 1.5)
    seen = []

    def evaluate(patches):
        seen.append(patches)
        return p

    out = cfg_patches.guide((cfg_patches.PerturbedAttentionGuidance(2.0),), _args(c, c, u, 1.0, evaluate=evaluate))
    assert torch.allclose(out, torch.full_like(c, 2.0 + 0.5 * 2.0))
    assert seen == [(IdentityAttention("attn1", ("middle", 0)),)]
    none = cfg_patches.guide((cfg_patches.PerturbedAttentionGuidance(0.0),), _args(c, c, u, 1.0, evaluate=evaluate))
    assert torch.equal(none, c) and len(seen) == 1


def test_identity_attention_returns_out_projection_of_values():
    attn = CrossAttention(8, None, heads=2, dim_head=4)
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(2))
    out = attn(x, replace=IdentityAttention().attention)
    assert torch.allclose(out, attn.to_out(attn.to_v(x)))


def test_fourier_filter_scales_the_dc_term():
    const = torch.full((1, 2, 6, 6), 3.0)
    assert torch.allclose(fourier_filter(const, 1, 0.5), torch.full_like(const, 1.5), atol=1e-5)
    x = torch.randn(1, 2, 6, 6, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(fourier_filter(x, 1, 1.0), x, atol=1e-5)
    # a pure Nyquist checkerboard is outside the low-frequency box: unchanged at any scale
    checker = (torch.arange(6)[:, None] + torch.arange(6)[None]) % 2 * 2.0 - 1.0
    assert torch.allclose(fourier_filter(checker.expand(1, 1, 6, 6), 1, 0.0), checker.expand(1, 1, 6, 6),
                          atol=1e-5)


def test_freeu_scales_half_the_backbone_channels_at_matching_width():
    p = FreeU(model_channels=4, b1=2.0, b2=3.0, s1=1.0, s2=1.0)
    h, skip = torch.ones(1, 8, 2, 2), torch.ones(1, 8, 2, 2)
    h2, _ = p.output_block(h, skip, 0)  # 8 channels = 2·model_channels -> b2
    assert torch.equal(h2[:, :4], torch.full((1, 4, 2, 2), 3.0)) and torch.equal(h2[:, 4:], h[:, 4:])
    h3, _ = p.output_block(torch.ones(1, 6, 2, 2), skip, 0)  # no level with 6 channels
    assert torch.equal(h3, torch.ones(1, 6, 2, 2))
    # v2: factor 1 + (b − 1)·normalised mean; a ramp of means 0..1 gives factors 1..b
    v2 = FreeU(model_channels=1, b1=1.0, b2=3.0, s1=1.0, s2=1.0, v2=True)
    ramp = torch.arange(4.0).reshape(1, 1, 2, 2).expand(1, 2, 2, 2)
    out, _ = v2.output_block(ramp, torch.zeros(1, 2, 2, 2), 0)
    assert torch.allclose(out[0, 0].flatten(), torch.tensor([0.0, 1 * (1 + 2 / 3), 2 * (1 + 4 / 3), 3 * 3.0]))


def test_scale_patch_multiplies_matching_weights_in_order():
    from mixgraph.nodes.adapters.lora import apply_patches
    sd = {"a.attn1.to_q.weight": torch.ones(2, 2), "a.attn2.to_q.weight": torch.ones(2, 2)}
    out = apply_patches(sd, [ScalePatch("unet", (("attn1.to_q.weight", 3.0),)),
                             ScalePatch("unet", (("to_q.weight", 0.5),))], target="unet")
    assert torch.equal(out["a.attn1.to_q.weight"], torch.full((2, 2), 1.5))
    assert torch.equal(out["a.attn2.to_q.weight"], torch.full((2, 2), 0.5))
    assert torch.equal(sd["a.attn1.to_q.weight"], torch.ones(2, 2))  # input untouched


# --- on a tiny checkpoint ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("patch_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    return root


def _sample(model, cfg=4.0, steps=3):
    g = torch.Generator().manual_seed(5)
    pos, neg = Cond(torch.randn(1, 77, 32, generator=g)), Cond(torch.randn(1, 77, 32, generator=g))
    return sample(model.runner(F32), seed=1, steps=steps, cfg=cfg, sampler_name="euler", scheduler="normal",
                  positive=(pos,), negative=(neg,), latent=Latent(torch.zeros(1, 4, 8, 8))).samples


def test_neutral_patches_equal_no_patch_and_do_not_leak(ckpt):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    model, clip, _ = loader.load_checkpoint(ckpt / "checkpoints" / "sd15.safetensors")
    base = _sample(model)
    freeu = N.FreeU(model, 1.0, 1.0, 1.0, 1.0)[0]
    assert torch.allclose(_sample(freeu), base, rtol=1e-4, atol=1e-3)  # FFT round trip
    assert torch.allclose(_sample(N.RescaleCFG(model, 0.0)[0]), base, rtol=1e-4, atol=1e-3)
    assert torch.allclose(_sample(N.PerturbedAttentionGuidance(model, 0.0)[0]), base, atol=1e-6)
    assert torch.allclose(_sample(N.UNetSelfAttentionMultiply(model, 1.0, 1.0, 1.0, 1.0)[0]), base)
    # real settings change the result, and the plain handle still gives the plain result
    for patched in (N.FreeU(model, 1.1, 1.2, 0.9, 0.2)[0], N.FreeU_V2(model, 1.3, 1.4, 0.9, 0.2)[0],
                    N.RescaleCFG(model, 0.7)[0], N.CFGZeroStar(model)[0],
                    N.PerturbedAttentionGuidance(model, 3.0)[0],
                    N.UNetCrossAttentionMultiply(model, 1.0, 1.0, 2.0, 1.0)[0]):
        out = _sample(patched)
        assert torch.isfinite(out).all() and not torch.allclose(out, base, rtol=1e-3, atol=1e-2)
        assert torch.equal(_sample(model), base)


def test_attention_multiply_scales_merged_weights(ckpt):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    model, clip, _ = loader.load_checkpoint(ckpt / "checkpoints" / "sd15.safetensors")
    plain = model.runner(F32).model.state_dict()
    scaled = N.UNetSelfAttentionMultiply(model, 2.0, 1.0, 1.0, 0.5)[0].runner(F32).model.state_dict()
    key = next(k for k in plain if k.endswith("attn1.to_q.weight"))
    assert torch.allclose(scaled[key], plain[key] * 2.0)
    out_b = next(k for k in plain if k.endswith("attn1.to_out.0.bias"))
    assert torch.allclose(scaled[out_b], plain[out_b] * 0.5)
    k2 = next(k for k in plain if k.endswith("attn2.to_q.weight"))
    assert torch.equal(scaled[k2], plain[k2])
    assert torch.equal(model.runner(F32).model.state_dict()[key], plain[key])
    # CLIP: q scaled by 0 gives uniform attention, a different encoding than the plain CLIP
    c0 = N.CLIPAttentionMultiply(clip, 0.0, 1.0, 1.0, 1.0)[0].encode("a cat", F32)[0].cross_attn
    c1 = N.CLIPAttentionMultiply(clip, 1.0, 1.0, 1.0, 1.0)[0].encode("a cat", F32)[0].cross_attn
    assert torch.allclose(c1, clip.encode("a cat", F32)[0].cross_attn) and not torch.allclose(c0, c1)


def test_model_patch_nodes_run_in_a_workflow(ckpt, tmp_path):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    m = g.add("FreeU_V2", model=ck[0], b1=1.3, b2=1.4, s1=0.9, s2=0.2)
    m = g.add("RescaleCFG", model=m, multiplier=0.7)
    m = g.add("PerturbedAttentionGuidance", model=m, scale=2.0)
    m = g.add("CFGZeroStar", model=m)
    clip = g.add("CLIPAttentionMultiply", clip=ck[1], q=1.1, k=1.0, v=1.0, out=1.0)
    pos = g.add("CLIPTextEncode", text="a cube", clip=clip)
    neg = g.add("CLIPTextEncode", text="", clip=clip)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=m, seed=1, steps=2, cfg=5.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=ck[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=ckpt, output=tmp_path)
    assert torch.isfinite(out[dec.node_id][0]).all()


def test_model_sampling_img_to_img_feeds_x_unscaled_and_predicts_x0():
    from mixgraph.nodes.sampling.parameterization import ModelSampling
    ms = ModelSampling("img_to_img")
    x = torch.full((1, 4, 2, 2), 3.0)
    sigma = torch.tensor([2.0])
    assert torch.equal(ms.calculate_input(sigma, x), x)
    assert torch.equal(ms.calculate_denoised(sigma, x * 0.5, x), x * 0.5)
    assert torch.allclose(ModelSampling("x0").calculate_input(sigma, x), x / 5**0.5)
