"""CFGNorm, Mahiro, FreSca, PerpNeg (model patch), CFGOverride and ManualSigmas (ComfyUI 0.38.1):
specs, the formulas against independent numpy computations, equivalences on a tiny SD1.5
checkpoint, and one workflow through the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.model_patches import guidance_extra_nodes as N
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import cfg_patches, cfg_patches_extra as P
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.nodes.sampling.guidance import PerpNegDenoiser
from mixgraph.nodes.sampling.ksampler import sample
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.nodes.sampling.sigma_tools import manual_sigmas
from mixgraph.ui import api
from tests.test_model_patches_guidance import model  # noqa: F401 - fixture

INFO = api.default_registry().object_info()
F32 = parse_spec("f32")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _args(x, cond, uncond, scale, sigma=2.0):
    return GuidanceArgs(x, torch.full((x.shape[0],), sigma), scale, cond, uncond, None, None, {})


def _xcu(seed=0, shape=(2, 4, 5, 6)):
    return _rand(*shape, seed=seed), _rand(*shape, seed=seed + 1), _rand(*shape, seed=seed + 2)


# --- specs --------------------------------------------------------------------------------------

def test_guidance_extra_specs_match_comfyui():
    cn = INFO["CFGNorm"]
    assert cn["input_order"] == {"required": ["model", "strength"], "optional": ["pre_cfg"]}
    assert cn["input"]["required"]["strength"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.01}]
    assert cn["input"]["optional"]["pre_cfg"][1]["default"] is False
    assert cn["output_name"] == ["patched_model"] and cn["category"] == "advanced/guidance"
    assert INFO["Mahiro"]["output_name"] == ["patched_model"] and INFO["Mahiro"]["category"] == "_for_testing"
    fr = INFO["FreSca"]["input"]["required"]
    assert INFO["FreSca"]["input_order"]["required"] == ["model", "scale_low", "scale_high", "freq_cutoff"]
    assert fr["scale_high"][1]["default"] == 1.25 and fr["freq_cutoff"][1]["max"] == 10000
    pn = INFO["PerpNeg"]
    assert pn["input_order"]["required"] == ["model", "empty_conditioning", "neg_scale"]
    assert pn["display_name"] == "Perp-Neg (DEPRECATED by Perp-Neg Guider)"
    co = INFO["CFGOverride"]
    assert co["input_order"]["required"] == ["model", "cfg", "start_percent", "end_percent"]
    assert co["input"]["required"]["cfg"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}]
    assert co["input"]["required"]["end_percent"][1]["default"] == 1.0
    ms = INFO["ManualSigmas"]
    assert ms["input"]["required"]["sigmas"] == ["STRING", {"default": "1, 0.5"}] and ms["output"] == ["SIGMAS"]


# --- formulas vs numpy --------------------------------------------------------------------------

def test_cfg_norm_post_cfg_matches_numpy():
    x, c, u = _xcu(1)
    for strength in (1.0, 0.5):
        out = cfg_patches.guide((P.CFGNorm(strength),), _args(x, c, u, 5.0))
        cn, un = c.numpy(), u.numpy()
        den = un + 5.0 * (cn - un)
        scale = np.linalg.norm(cn, axis=1, keepdims=True) / (np.linalg.norm(den, axis=1, keepdims=True) + 1e-8)
        ref = den * np.clip(scale, 0, 1) * strength
        assert np.allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)
    # attenuate only: per pixel the output's channel norm never exceeds the guided one's
    assert (out.norm(dim=1) <= (u + 5.0 * (c - u)).norm(dim=1) + 1e-9).all()
    with pytest.raises(RuntimeError, match="strength=50"):
        big = torch.full((1, 4, 2, 2), 1e307, dtype=torch.float64)
        cfg_patches.guide((P.CFGNorm(50.0),), _args(big, big, big * 0, 1.0))


def test_cfg_norm_pre_cfg_matches_numpy():
    x, c, u = _xcu(4)
    for strength in (1.0, 0.3):
        out = cfg_patches.guide((P.CFGNormPreCFG(strength),), _args(x, c, u, 4.0))
        ec, eu = (x - c).numpy(), (x - u).numpy()
        comb = eu + 4.0 * (ec - eu)
        r = np.linalg.norm(ec, axis=1, keepdims=True) / np.linalg.norm(comb, axis=1, keepdims=True)
        eps = strength * comb * r + (1 - strength) * comb
        assert np.allclose(out.numpy(), x.numpy() - eps, rtol=1e-10, atol=1e-12)


def test_mahiro_matches_numpy():
    x, c, u = _xcu(7)
    out = cfg_patches.guide((P.Mahiro(),), _args(x, c, u, 6.0))
    cn, un = c.numpy(), u.numpy()
    cfg = un + 6.0 * (cn - un)
    leap, u_leap = 6.0 * cn, 6.0 * un
    merge = (leap + cfg) / 2
    a = np.sqrt(np.abs(u_leap)) * np.sign(u_leap)
    b = np.sqrt(np.abs(merge)) * np.sign(merge)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-8)
    w = 2 * (cos.mean() + 1)
    assert np.allclose(out.numpy(), (w * cfg + (4 - w) * leap) / 4, rtol=1e-10, atol=1e-12)


def _numpy_fresca(g, low, high, cutoff):
    spec = np.fft.fftshift(np.fft.fft2(g, axes=(-2, -1)), axes=(-2, -1))
    h, w = g.shape[-2:]
    mask = np.full(g.shape, high)
    ch, cw = min(cutoff, h // 2), min(cutoff, w // 2)
    mask[..., h // 2 - ch:h // 2 + ch, w // 2 - cw:w // 2 + cw] = low
    return np.fft.ifft2(np.fft.ifftshift(spec * mask, axes=(-2, -1)), axes=(-2, -1)).real


def test_fresca_filters_the_guidance_like_numpy():
    x, c, u = _xcu(10, shape=(1, 4, 9, 12))
    for low, high, cutoff in ((1.0, 1.25, 2), (0.5, 2.0, 3), (0.7, 1.5, 100)):
        out = cfg_patches.guide((P.FreSca(low, high, cutoff),), _args(x, c, u, 3.0))
        g = _numpy_fresca((c - u).numpy(), low, high, cutoff)
        ref = u.numpy() + 3.0 * g
        assert np.allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)  # the FFT runs in float32
    # unit scales leave plain CFG
    same = cfg_patches.guide((P.FreSca(1.0, 1.0, 20),), _args(x, c, u, 3.0))
    assert torch.allclose(same, u + 3.0 * (c - u), atol=1e-5)
    # a cutoff past the centre scales the whole (even-sized) spectrum by scale_low; on an odd
    # side the box is 2·(n//2) bins wide, so the outermost bin keeps scale_high, as in ComfyUI
    even = c[:, :, :8, :]
    assert torch.allclose(P.fourier_filter(even, 0.5, 9.0, 50), 0.5 * even, atol=1e-5)
    assert not torch.allclose(P.fourier_filter(c, 0.5, 9.0, 50), 0.5 * c, atol=1e-3)


def test_manual_sigmas_reads_numbers_as_comfyui():
    assert manual_sigmas("1, 0.5").tolist() == [1.0, 0.5]
    got = manual_sigmas(" 14.6146 ,7.0;  .5\n0 ").tolist()
    assert got == pytest.approx([14.6146, 7.0, 0.5, 0.0])
    assert manual_sigmas("-1, +2").tolist() == [-1.0, 2.0]
    assert manual_sigmas("1e-3").tolist() == [1.0, -3.0]  # ComfyUI's pattern has no exponent
    assert manual_sigmas("").numel() == 0 and manual_sigmas("").dtype == torch.float32
    with pytest.raises(ValueError, match="'1..5' is not a number"):
        manual_sigmas("3, 1..5, 0")


# --- on a tiny checkpoint -----------------------------------------------------------------------

# `model`: the tiny SD 1.5 UNet fixture of the guidance-patch tests


def _conds(seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(Cond(torch.randn(1, 77, 32, generator=g)),) for _ in range(3)]


def test_perpneg_patch_equals_perpneg_guider(model):
    pos, neg, empty = _conds()
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3)) * 5
    sigma = torch.tensor([5.0])
    lat = torch.zeros(1, 4, 8, 8)
    for cfg, neg_scale in ((6.0, 1.0), (3.0, 0.5)):
        patched = N.PerpNeg(model, empty, neg_scale)[0]
        got = CFGDenoiser(patched.runner(F32), pos, neg, cfg, lat)(x, sigma)
        ref = PerpNegDenoiser(model.runner(F32), pos, neg, empty, cfg, neg_scale, lat)(x, sigma)
        # the two paths sum the same terms in another order: float32 rounding at the outputs'
        # scale (|x0| up to ~30 here), which depends on the CPU's kernels (AVX-512 vs AVX2)
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
        plain = CFGDenoiser(model.runner(F32), pos, neg, cfg, lat)(x, sigma)
        assert not torch.allclose(got, plain, atol=1e-4)


def test_cfg_override_sets_cfg_inside_its_sigma_range(model):
    pos, neg, _ = _conds(6)
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(4)) * 3
    lat = torch.zeros(1, 4, 8, 8)

    def den(m, cfg, s):
        return CFGDenoiser(m.runner(F32), pos, neg, cfg, lat)(x, torch.tensor([s]))

    # start 0 / end 1 covers every sigma: the guider runs at the override's cfg
    over = N.CFGOverride(model, 2.5, 0.0, 1.0)[0]
    assert torch.allclose(den(over, 8.0, 3.0), den(model, 2.5, 3.0), atol=1e-6)
    # a window (sigma_lo, sigma_hi]: inside it the override, outside the guider's cfg
    win = model.with_sampler_patch(P.CFGOverride(1.0, 4.0, 2.0))
    assert torch.allclose(den(win, 8.0, 3.0), den(model, 1.0, 3.0), atol=1e-6)
    assert torch.allclose(den(win, 8.0, 4.0), den(model, 1.0, 4.0), atol=1e-6)   # sigma_hi included
    assert torch.allclose(den(win, 8.0, 2.0), den(model, 8.0, 2.0), atol=1e-6)   # sigma_lo excluded
    assert torch.allclose(den(win, 8.0, 5.0), den(model, 8.0, 5.0), atol=1e-6)
    # overlapping overrides: the last applied (nearest the sampler) wins
    both = N.CFGOverride(N.CFGOverride(model, 3.0, 0.0, 1.0)[0], 5.0, 0.0, 1.0)[0]
    assert torch.allclose(den(both, 8.0, 3.0), den(model, 5.0, 3.0), atol=1e-6)
    # the percents become sigmas through the model's schedule
    p = N.CFGOverride(model, 2.0, 0.25, 0.75)[0].sampler_patches[-1]
    assert p.sigma_high > p.sigma_low > 0


def test_cfg_override_and_perpneg_guider(model):
    pos, neg, empty = _conds(8)
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(9)) * 3
    lat = torch.zeros(1, 4, 8, 8)
    over = N.CFGOverride(model, 2.0, 0.0, 1.0)[0]
    got = PerpNegDenoiser(over.runner(F32), pos, neg, empty, 7.0, 1.0, lat)(x, torch.tensor([3.0]))
    ref = PerpNegDenoiser(model.runner(F32), pos, neg, empty, 2.0, 1.0, lat)(x, torch.tensor([3.0]))
    assert torch.allclose(got, ref, atol=1e-6)


def _sample(m, cfg=4.0, steps=3):
    pos, neg, _ = _conds(12)
    return sample(m.runner(F32), seed=1, steps=steps, cfg=cfg, sampler_name="euler", scheduler="normal",
                  positive=pos, negative=neg, latent=Latent(torch.zeros(1, 4, 8, 8))).samples


def test_guidance_patches_end_to_end(model):
    base = _sample(model)
    # CFGOverride over the whole run is KSampler at that cfg
    assert torch.allclose(_sample(N.CFGOverride(model, 2.0, 0.0, 1.0)[0]), _sample(model, cfg=2.0), atol=1e-5)
    # FreSca with unit scales is plain CFG
    assert torch.allclose(_sample(N.FreSca(model, 1.0, 1.0, 20)[0]), base, atol=1e-4)
    for patched in (N.CFGNorm(model, 1.0)[0], N.CFGNorm(model, 1.0, True)[0], N.Mahiro(model)[0],
                    N.FreSca(model, 1.0, 1.25, 2)[0], N.PerpNeg(model, _conds(13)[2], 1.0)[0]):
        out = _sample(patched)
        assert torch.isfinite(out).all() and not torch.allclose(out, base, atol=1e-4)
    assert torch.equal(_sample(model), base)


def test_guidance_extra_nodes_run_in_a_workflow(tmp_path):
    from tests.fixtures.checkpoints import write_sd15
    (tmp_path / "checkpoints").mkdir()
    write_sd15(tmp_path / "checkpoints" / "sd15.safetensors", seed=4)
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    pos = g.add("CLIPTextEncode", text="a cube", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="blurry", clip=ck[1])
    empty = g.add("CLIPTextEncode", text="", clip=ck[1])
    m = g.add("FreSca", model=ck[0], scale_low=1.0, scale_high=1.25, freq_cutoff=20)
    m = g.add("PerpNeg", model=m, empty_conditioning=empty, neg_scale=1.0)
    m = g.add("Mahiro", model=m)
    m = g.add("CFGNorm", model=m, strength=1.0, pre_cfg=False)
    m = g.add("CFGOverride", model=m, cfg=3.0, start_percent=0.5, end_percent=1.0)
    sig = g.add("ManualSigmas", sigmas="14.6146, 6.0, 2.5, 0.8, 0")
    sampler = g.add("KSamplerSelect", sampler_name="euler")
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    sc = g.add("SamplerCustom", model=m, add_noise=True, noise_seed=1, cfg=6.0, positive=pos,
               negative=neg, sampler=sampler, sigmas=sig, latent_image=lat)
    dec = g.add("VAEDecode", samples=sc[0], vae=ck[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=tmp_path, output=tmp_path / "out")
    assert out[sig.node_id][0].tolist() == pytest.approx([14.6146, 6.0, 2.5, 0.8, 0.0])
    assert torch.isfinite(out[dec.node_id][0]).all()
