"""TangentialAmplifyingGuidance (ComfyUI nodes_tag.py 110b1dc) and RenormCFG (nodes_lumina2.py
09494bc): specs, the formulas against independent numpy computations, and on a tiny SD1.5
checkpoint: the identity settings equal plain CFG, others change the result."""

from __future__ import annotations

import numpy as np
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.model_patches import guidance_extra_nodes as N
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import cfg_patches, cfg_patches_extra as P
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.nodes.sampling.ksampler import sample
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.ui import api
from tests.test_model_patches_guidance import model  # noqa: F401 - fixture

INFO = api.default_registry().object_info()
F32 = parse_spec("f32")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _args(x, cond, uncond, scale, sigma=2.0):
    return GuidanceArgs(x, torch.full((x.shape[0],), sigma), scale, cond, uncond, None, None, {})


def test_tag_and_renorm_cfg_specs_match_comfyui():
    t = INFO["TangentialAmplifyingGuidance"]
    assert t["display_name"] == "Tangential Amplifying Guidance" and t["category"] == "experimental"
    assert t["experimental"] is True and t["output"] == ["MODEL"]
    assert t["input_order"] == {"required": ["model", "t_scale", "r_scale", "start_percent", "end_percent"]}
    req = t["input"]["required"]
    assert req["t_scale"] == ["FLOAT", {"default": 1.05, "min": 0.0, "max": 10.0, "step": 0.001,
                                        "tooltip": "scale for the tangential (orthogonal) component"}]
    assert req["r_scale"][1] == {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.001,
                                 "tooltip": "scale for the radial (parallel) component"}
    assert req["start_percent"] == ["FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.01, "advanced": True}]
    assert req["end_percent"][1]["default"] == 1.0 and req["end_percent"][1]["advanced"] is True
    r = INFO["RenormCFG"]
    assert r["category"] == "model/patch" and r["output"] == ["MODEL"] and r["display_name"] == "RenormCFG"
    assert r["input_order"] == {"required": ["model", "cfg_trunc", "renorm_cfg"]}
    assert r["input"]["required"]["cfg_trunc"] == ["FLOAT", {"default": 100, "min": 0.0, "max": 100.0,
                                                             "step": 0.01, "advanced": True}]
    assert r["input"]["required"]["renorm_cfg"][1] == {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.01,
                                                       "advanced": True}


def _tag_numpy(x0, p, t, r):
    out = np.empty_like(x0)
    for b in range(x0.shape[0]):
        v = p[b] / (np.sqrt((p[b] ** 2).sum()) + 1e-8)
        dx = x0[b] - p[b]
        radial = (dx * v).sum() * v
        out[b] = p[b] + t * (dx - radial) + r * radial
    return out


def test_tangential_amplify_matches_numpy_inside_its_window():
    x, c, u = _rand(2, 4, 5, 6, seed=1), _rand(2, 4, 5, 6, seed=2), _rand(2, 4, 5, 6, seed=3)
    patch = P.TangentialAmplify(1.3, 0.7, sigma_high=5.0, sigma_low=1.0)
    guided = u + 4.0 * (c - u)
    for sigma in (1.0, 3.0, 5.0):  # both ends included
        out = cfg_patches.guide((patch,), _args(x, c, u, 4.0, sigma))
        assert np.allclose(out.numpy(), _tag_numpy(guided.numpy(), x.numpy(), 1.3, 0.7), rtol=1e-10, atol=1e-12)
    for sigma in (0.5, 6.0):  # outside: the guided x0 unchanged
        assert torch.equal(cfg_patches.guide((patch,), _args(x, c, u, 4.0, sigma)), guided)
    # unit scales give the guided x0 back; dimensions of size 1 take no part in the norms
    one = cfg_patches.guide((P.TangentialAmplify(1.0, 1.0, 5.0, 1.0),), _args(x, c, u, 4.0))
    assert torch.allclose(one, guided, atol=1e-12)
    x1, c1, u1 = _rand(2, 1, 5, 6, seed=4), _rand(2, 1, 5, 6, seed=5), _rand(2, 1, 5, 6, seed=6)
    out = cfg_patches.guide((patch,), _args(x1, c1, u1, 2.0))
    ref = _tag_numpy((u1 + 2.0 * (c1 - u1)).numpy(), x1.numpy(), 1.3, 0.7)
    assert np.allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)


def _renorm_numpy(c, u, s, trunc, renorm, sigma, n):
    out = c.copy()
    if sigma < trunc:
        for b in range(c.shape[0]):
            e = u[b, :n] + s * (c[b, :n] - u[b, :n])
            if renorm > 0:
                mx = np.sqrt((c[b, :n] ** 2).sum()) * renorm
                ne = np.sqrt((e ** 2).sum())
                if ne >= mx:
                    e = e * (mx / ne)
            out[b, :n] = e
    return out


def test_renorm_cfg_matches_numpy():
    x, c, u = _rand(2, 4, 3, 5, seed=7), _rand(2, 4, 3, 5, seed=8), _rand(2, 4, 3, 5, seed=9)
    u[1] = c[1] * 0.99  # sample 1: the guided norm stays below the clamp
    for trunc, renorm, sigma, n in ((100.0, 1.0, 2.0, 4), (100.0, 0.5, 2.0, 4), (100.0, 0.0, 2.0, 4),
                                    (1.5, 1.0, 2.0, 4), (100.0, 1.0, 2.0, 2)):
        got = cfg_patches.guide((P.RenormCFG(trunc, renorm, n),), _args(x, c, u, 6.0, sigma))
        ref = _renorm_numpy(c.numpy(), u.numpy(), 6.0, trunc, renorm, sigma, n)
        assert np.allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12), (trunc, renorm, n)
    # renorm_cfg 0 is plain CFG; at or above cfg_trunc the conditional prediction alone
    plain = cfg_patches.guide((P.RenormCFG(100.0, 0.0, 4),), _args(x, c, u, 6.0))
    assert torch.allclose(plain, u + 6.0 * (c - u))
    assert torch.equal(cfg_patches.guide((P.RenormCFG(2.0, 1.0, 4),), _args(x, c, u, 6.0, 2.0)), c)
    # the clamp: the result's norm is at most renorm_cfg·‖cond‖ per sample
    out = cfg_patches.guide((P.RenormCFG(100.0, 1.0, 4),), _args(x, c, u, 6.0))
    assert (out.flatten(1).norm(dim=1) <= c.flatten(1).norm(dim=1) * (1 + 1e-12)).all()


# --- on a tiny checkpoint -------------------------------------------------------------------------

def _sample(m, cfg=4.0, steps=3):
    g = torch.Generator().manual_seed(12)
    pos, neg = (Cond(torch.randn(1, 77, 32, generator=g)),), (Cond(torch.randn(1, 77, 32, generator=g)),)
    return sample(m.runner(F32), seed=1, steps=steps, cfg=cfg, sampler_name="euler", scheduler="normal",
                  positive=pos, negative=neg, latent=Latent(torch.zeros(1, 4, 8, 8))).samples


def test_tag_and_renorm_cfg_nodes_on_a_tiny_model(model):
    base = _sample(model)
    unit = N.TangentialAmplifyingGuidance(model, 1.0, 1.0, 0.0, 1.0)[0]
    assert torch.allclose(_sample(unit), base, rtol=1e-5, atol=1e-4)
    assert torch.allclose(_sample(N.RenormCFG(model, 100.0, 0.0)[0]), base, rtol=1e-5, atol=1e-4)
    for patched in (N.TangentialAmplifyingGuidance(model, 1.05, 1.0, 0.0, 1.0)[0],
                    N.RenormCFG(model, 100.0, 1.0)[0]):
        out = _sample(patched)
        assert torch.isfinite(out).all() and not torch.allclose(out, base, rtol=1e-3, atol=1e-2)
    # the percents become the window's sigmas through the model's schedule
    ms = ModelSampling.for_model(model)
    p = N.TangentialAmplifyingGuidance(model, 1.05, 1.0, 0.25, 0.75)[0].sampler_patches[-1]
    assert (p.sigma_high, p.sigma_low) == (float(ms.percent_to_sigma(0.25)), float(ms.percent_to_sigma(0.75)))
    assert N.RenormCFG(model, 100.0, 1.0)[0].sampler_patches[-1].in_channels == model.config.in_channels


def test_tag_outside_its_window_is_plain_cfg(model):
    g = torch.Generator().manual_seed(6)
    pos, neg = (Cond(torch.randn(1, 77, 32, generator=g)),), (Cond(torch.randn(1, 77, 32, generator=g)),)
    x = torch.randn(1, 4, 8, 8, generator=g) * 3
    lat = torch.zeros(1, 4, 8, 8)
    win = model.with_sampler_patch(P.TangentialAmplify(2.0, 1.0, 4.0, 2.0))

    def den(m, s):
        return CFGDenoiser(m.runner(F32), pos, neg, 5.0, lat)(x, torch.tensor([s]))

    assert torch.allclose(den(win, 5.0), den(model, 5.0), atol=1e-6)
    assert not torch.allclose(den(win, 3.0), den(model, 3.0), atol=1e-4)
