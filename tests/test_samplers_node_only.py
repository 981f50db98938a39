"""bislerp resizing, the node-only samplers (SamplerLCMUpscale, SamplerEulerCFGpp) against
hand-computed references on toy denoisers, and both nodes through SamplerCustom end to end."""

from __future__ import annotations

import math

import pytest
import torch

from mixgraph.nodes.models.resize import bislerp, upscale
from mixgraph.nodes.sampling.samplers import SAMPLER_NAMES, get_sampler
from mixgraph.nodes.sampling.solvers_extra import sample_euler_pp, sample_lcm_upscale
from mixgraph.ui import api


def test_bislerp_slerps_channel_vectors_between_neighbours():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).t().reshape(1, 2, 1, 2)  # two unit vectors, 90° apart
    out = bislerp(x, 4, 1)[0, :, 0].t()  # half-pixel positions: 0, 0.25, 0.75, 1 (clamped ends)
    c, s = math.cos(math.pi / 8), math.sin(math.pi / 8)
    expected = torch.tensor([[1.0, 0.0], [c, s], [s, c], [0.0, 1.0]])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    # norms interpolate linearly: (2, 0) -> (0, 4) at ratio 0.25 has norm 2.5
    y = torch.tensor([[2.0, 0.0], [0.0, 4.0]]).t().reshape(1, 2, 1, 2)
    assert float(bislerp(y, 4, 1)[0, :, 0, 1].norm()) == pytest.approx(2.5, abs=1e-6)
    z = torch.randn(2, 4, 5, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(bislerp(z, 7, 5), z, rtol=0, atol=1e-6)  # same size: unchanged
    assert upscale(z, 14, 10, "bislerp", "disabled").shape == (2, 4, 10, 14)


def test_node_only_samplers_stay_out_of_ksamplers_list():
    assert "lcm_upscale" not in SAMPLER_NAMES and "euler_pp" not in SAMPLER_NAMES
    assert get_sampler("lcm_upscale") is sample_lcm_upscale and get_sampler("euler_pp") is sample_euler_pp


def test_lcm_upscale_grows_the_latent_over_the_first_steps():
    def model(x, sigma, **_):
        return 0.5 * x

    x = torch.ones(1, 4, 8, 8)
    sigmas = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    seen = []
    torch.manual_seed(7)
    out = sample_lcm_upscale(model, x, sigmas, callback=lambda d: seen.append(tuple(d["x"].shape[-2:])),
                             total_upscale=2.0, upscale_method="nearest-exact")
    # 4 steps, default upscale steps max(5 // 2 + 1, 2) = 3 -> factors 1.5, 2.0 after steps 0, 1
    assert seen == [(8, 8), (12, 12), (16, 16), (16, 16)]
    torch.manual_seed(7)
    ref = x
    for i, f in enumerate((1.5, 2.0, None, None)):
        ref = 0.5 * ref
        if f is not None:
            ref = torch.nn.functional.interpolate(ref, size=(round(8 * f),) * 2, mode="nearest-exact")
        if sigmas[i + 1] > 0:
            ref = ref + sigmas[i + 1] * torch.randn(ref.shape)
    torch.testing.assert_close(out, ref)
    torch.manual_seed(7)  # scale_steps 1: one upscale step straight to the full factor
    one = sample_lcm_upscale(model, x, sigmas, total_upscale=2.0, upscale_method="bilinear", upscale_steps=1)
    assert one.shape == (1, 4, 16, 16)


class _Cfg:
    """A toy CFG denoiser: cond x0 = 0.2·x, uncond x0 = 0.6·x, cfg 3."""

    def __call__(self, x, sigma, **_):
        return self.with_uncond(x, sigma)[0]

    def with_uncond(self, x, sigma, **_):
        c, u = 0.2 * x, 0.6 * x
        return u + 3.0 * (c - u), u


def test_euler_pp_step_uses_the_unconditional_prediction():
    x = torch.randn(1, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    sigmas = torch.tensor([2.0, 0.5])
    out = sample_euler_pp(_Cfg(), x, sigmas)
    d_cfg, d_u = -0.6 * x, 0.6 * x  # 0.6 + 3 (0.2 - 0.6) = -0.6
    expected = x + (x - 2 * d_cfg + d_u) / 2.0 * (0.5 - 2.0)
    torch.testing.assert_close(out, expected)


def _custom(models, tmp_path, sampler_node: dict):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    sampler = g.add(sampler_node.pop("class_type"), **sampler_node)
    sig = g.add("BasicScheduler", model=ck[0], scheduler="normal", steps=4, denoise=1.0)
    sc = g.add("SamplerCustom", model=ck[0], add_noise=True, noise_seed=3, cfg=2.0,
               positive=g.add("CLIPTextEncode", text="a tree", clip=ck[1]),
               negative=g.add("CLIPTextEncode", text="", clip=ck[1]), sampler=sampler, sigmas=sig,
               latent_image=g.add("EmptyLatentImage", width=32, height=32, batch_size=1))
    g.add("PreviewImage", images=g.add("VAEDecode", samples=sc, vae=ck[2]))
    return api.run(g, models=models, output=tmp_path)[sc.node_id][0].samples


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("node_only_samplers")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=2)
    return root


def test_sampler_nodes_run_through_sampler_custom(models, tmp_path):
    info = api.default_registry().object_info()
    lcm = info["SamplerLCMUpscale"]["input"]["required"]
    assert list(lcm) == ["scale_ratio", "scale_steps", "upscale_method"]
    assert lcm["upscale_method"][0] == ["bislerp", "nearest-exact", "bilinear", "area", "bicubic"]
    assert info["SamplerEulerCFGpp"]["input"]["required"]["version"][0] == ["regular", "alternative"]
    big = _custom(models, tmp_path, {"class_type": "SamplerLCMUpscale", "scale_ratio": 1.5, "scale_steps": -1,
                                     "upscale_method": "bislerp"})
    assert big.shape == (1, 4, 6, 6) and torch.isfinite(big).all()
    regular = _custom(models, tmp_path, {"class_type": "SamplerEulerCFGpp", "version": "regular"})
    alt = _custom(models, tmp_path, {"class_type": "SamplerEulerCFGpp", "version": "alternative"})
    ksel = _custom(models, tmp_path, {"class_type": "KSamplerSelect", "sampler_name": "euler_cfg_pp"})
    torch.testing.assert_close(regular, ksel)
    assert torch.isfinite(alt).all() and (alt - regular).abs().max() > 1e-4
