"""comfy_extras/nodes_latent.py LatentApplyOperationCFG: a LATENT_OPERATION applied to the guidance
direction before CFG (ComfyUI's pre-CFG function), including cfg = 1 where only the conditional
prediction is evaluated; formulas against numpy, the denoiser on a tiny SD1.5, a workflow."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.latent import latent_extra_nodes as N
from mixgraph.nodes.helpers.latent_ops import BlendToward, TonemapReinhard
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling import cfg_patches
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.nodes.sampling.cfg_patches_extra import LatentOperationCFG
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.ui import api
from tests.test_model_patches_guidance import model  # noqa: F401 - fixture

F32 = parse_spec("f32")
INFO = api.default_registry().object_info()


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _numpy_reinhard(d: np.ndarray, multiplier: float) -> np.ndarray:
    m = np.sqrt((d ** 2).sum(axis=1, keepdims=True)) + 1e-10
    top = (m.std(axis=(1, 2, 3), ddof=1, keepdims=True) * 5 + m.mean(axis=(1, 2, 3), keepdims=True)) * multiplier
    mm = m / top
    return d / m * (mm / (mm + 1.0) * top)


def test_latent_apply_operation_cfg_spec_matches_comfyui():
    spec = INFO["LatentApplyOperationCFG"]
    assert spec["input_order"] == {"required": ["model", "operation"]}
    assert spec["input"]["required"] == {"model": ["MODEL"], "operation": ["LATENT_OPERATION"]}
    assert spec["output"] == ["MODEL"] and spec["category"] == "latent/advanced/operations"


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_pre_cfg_operation_matches_numpy(scale):
    x, c, u = _rand(2, 4, 5, 6, seed=1), _rand(2, 4, 5, 6, seed=2), _rand(2, 4, 5, 6, seed=3)
    patch = LatentOperationCFG(TonemapReinhard(0.7))
    got = cfg_patches.guide((patch,), GuidanceArgs(x, torch.full((2,), 2.0), scale, c, u, None, None, {}))
    cn, un = c.double().numpy(), u.double().numpy()
    ref = un + scale * _numpy_reinhard(cn - un, 0.7)  # cond' = op(c − u) + u, then CFG
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5)
    # without the negative (cfg = 1): uncond is zeros and the operation acts on cond itself
    alone = cfg_patches.guide((patch,), GuidanceArgs(x, torch.full((2,), 2.0), 1.0, c, torch.zeros_like(c),
                                                     None, None, {}, has_uncond=False))
    np.testing.assert_allclose(alone.numpy(), _numpy_reinhard(cn, 0.7), atol=1e-5)


def test_other_pre_cfg_patches_still_skip_cfg1():
    x, c = _rand(1, 4, 4, 4, seed=1), _rand(1, 4, 4, 4, seed=2)
    tcfg = cfg_patches.TangentialDampingCFG()
    out = cfg_patches.guide((tcfg,), GuidanceArgs(x, torch.full((1,), 2.0), 1.0, c, torch.zeros_like(c),
                                                  None, None, {}, has_uncond=False))
    assert torch.equal(out, c)


def _conds():
    return (Cond(_rand(1, 77, 32, seed=10)),), (Cond(_rand(1, 77, 32, seed=11)),)


def test_latent_operation_cfg_in_the_denoiser(model):  # noqa: F811 - fixture
    pos, neg = _conds()
    reference = _rand(1, 4, 8, 8, seed=12)
    op = BlendToward(reference, 0.3)
    patched = N.LatentApplyOperationCFG(model, op)[0]
    x, sigma, lat = _rand(1, 4, 8, 8, seed=13) * 3.0, torch.tensor([3.0]), torch.zeros(1, 4, 8, 8)
    plain = CFGDenoiser(model.runner(F32), pos, neg, 5.0, lat)
    with torch.no_grad():
        c, u = plain.calc_cond_batch([plain.positive, plain.negative], x, sigma)
        got = CFGDenoiser(patched.runner(F32), pos, neg, 5.0, lat)(x, sigma)
    d = (c - u).numpy()
    ref = u.numpy() + 5.0 * (d + 0.3 * (reference.numpy() - d))  # u + cfg · lerp(c − u, ref, 0.3)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5)


def test_latent_operation_cfg_at_cfg1_acts_on_the_lone_cond(model):  # noqa: F811 - fixture
    pos, _ = _conds()
    poisoned = (Cond(torch.full((1, 77, 32), float("nan"))),)  # evaluated -> NaN everywhere
    op = TonemapReinhard(0.5)
    patched = N.LatentApplyOperationCFG(model, op)[0]
    x, sigma, lat = _rand(1, 4, 8, 8, seed=13) * 3.0, torch.tensor([3.0]), torch.zeros(1, 4, 8, 8)
    with torch.no_grad():
        cond = CFGDenoiser(model.runner(F32), pos, poisoned, 1.0, lat)(x, sigma)
        got = CFGDenoiser(patched.runner(F32), pos, poisoned, 1.0, lat)(x, sigma)
    assert torch.isfinite(got).all()  # the negative was not evaluated
    np.testing.assert_allclose(got.numpy(), _numpy_reinhard(cond.double().numpy(), 0.5), atol=1e-5)


def test_latent_apply_operation_cfg_in_a_workflow(tmp_path):
    from tests.fixtures.checkpoints import write_sd15
    write_sd15(tmp_path / "checkpoints" / "sd15.safetensors", seed=4)

    def run(with_op: bool, cfg: float):
        g = api.Graph(precision="f32")
        ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
        m = ck[0]
        if with_op:
            sharpen = g.add("LatentOperationSharpen", sharpen_radius=2, sigma=1.0, alpha=0.5)
            m = g.add("LatentApplyOperationCFG", model=m, operation=sharpen)
        ks = g.add("KSampler", model=m, seed=1, steps=3, cfg=cfg, sampler_name="euler", scheduler="normal",
                   positive=g.add("CLIPTextEncode", text="a cube", clip=ck[1]),
                   negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
                   latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1), denoise=1.0)
        dec = g.add("VAEDecode", samples=ks, vae=ck[2])
        g.add("PreviewImage", images=dec)
        out = api.run(g, models=tmp_path, output=tmp_path / "out")
        return out[ks.node_id][0].samples, out[dec.node_id][0]

    for cfg in (1.0, 4.0):
        base, _ = run(False, cfg)
        got, image = run(True, cfg)
        assert torch.isfinite(image).all()
        assert (got - base).abs().max() > 1e-3, cfg
