"""PatchModelAddDownscale (Kohya Deep Shrink): ComfyUI's spec, the patch's sigma window and
resizes, and a tiny SD1.x model sampling with it."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.families.sd.unet_patches import DeepShrink
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.ui import api


def test_patch_model_add_downscale_spec_matches_comfyui():
    info = api.default_registry().object_info()["PatchModelAddDownscale"]
    req = info["input"]["required"]
    assert list(req) == ["model", "block_number", "downscale_factor", "start_percent", "end_percent",
                         "downscale_after_skip", "downscale_method", "upscale_method"]
    assert req["block_number"] == ["INT", {"default": 3, "min": 1, "max": 32, "step": 1}]
    assert req["downscale_factor"] == ["FLOAT", {"default": 2.0, "min": 0.1, "max": 9.0, "step": 0.001}]
    assert req["end_percent"] == ["FLOAT", {"default": 0.35, "min": 0.0, "max": 1.0, "step": 0.001}]
    assert req["downscale_after_skip"] == ["BOOLEAN", {"default": True}]
    assert req["downscale_method"][0] == ["bicubic", "nearest-exact", "bilinear", "area", "bislerp"]
    assert info["category"] == "model_patches/unet"
    assert info["display_name"] == "PatchModelAddDownscale (Kohya Deep Shrink)"


def test_deep_shrink_acts_only_in_its_block_and_sigma_window():
    p = DeepShrink(3, 2.0, sigma_start=10.0, sigma_end=2.0, after_skip=True,
                   downscale_method="bilinear", upscale_method="nearest-exact")
    h = torch.arange(64, dtype=torch.float32).reshape(1, 1, 8, 8)
    assert p.input_block(h, 3) is h                                  # unbound: no sigma, no change
    assert p.at_sigma(12.0).input_block(h, 3) is h                   # above sigma_start
    assert p.at_sigma(1.0).input_block(h, 3) is h                    # below sigma_end
    assert p.at_sigma(5.0).input_block(h, 2) is h                    # another block
    small = p.at_sigma(2.0).input_block(h, 3)                        # the window is inclusive
    # bilinear 8x8 -> 4x4 (align_corners=False): each output is the mean of a 2x2 block
    assert torch.allclose(small, torch.nn.functional.avg_pool2d(h, 2))
    skip = torch.zeros(1, 3, 8, 8)
    up, same = p.output_block(small, skip, 0)
    assert up.shape == (1, 1, 8, 8) and same is skip
    assert torch.equal(up[0, 0, :2, :2], small[0, 0, :1, :1].expand(2, 2))  # nearest-exact
    assert p.output_block(h, skip, 0)[0] is h
    # factor 3 on 8x8: round(8 / 3) = 3
    thirds = DeepShrink(0, 3.0, 1.0, 0.0, False, "area", "area").at_sigma(0.5)
    assert thirds.input_block(h, 0).shape == (1, 1, 3, 3)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("shrink_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=6)
    return root


def _graph(block: int, end: float, method: str = "bicubic", patched: bool = True):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    shrink = g.add("PatchModelAddDownscale", model=ckpt[0], block_number=block, downscale_factor=2.0,
                   start_percent=0.0, end_percent=end, downscale_after_skip=True,
                   downscale_method=method, upscale_method="bicubic")
    pos = g.add("CLIPTextEncode", text="a hill", clip=ckpt[1])
    neg = g.add("CLIPTextEncode", text="", clip=ckpt[1])
    ks = g.add("KSampler", model=shrink if patched else ckpt[0], seed=2, steps=3, cfg=2.0,
               sampler_name="euler",
               scheduler="normal", positive=pos, negative=neg,
               latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ckpt[2]))
    return g, shrink, ks


def test_patch_model_add_downscale_samples_and_changes_the_result(models, tmp_path):
    g, shrink, ks = _graph(1, 0.35)
    out = api.run(g, models=models, output=tmp_path)
    handle = out[shrink.node_id][0]
    (patch,) = handle.unet_patches
    ms = ModelSampling.for_model(handle)
    assert patch.sigma_start == pytest.approx(ms.percent_to_sigma(0.0))
    assert patch.sigma_end == pytest.approx(ms.percent_to_sigma(0.35))
    shrunk = out[ks.node_id][0].samples
    assert torch.isfinite(shrunk).all()
    g0, _, ks0 = _graph(1, 0.0)            # start 0 = end 0: sigma_end is above every sigma
    plain = api.run(g0, models=models, output=tmp_path)[ks0.node_id][0].samples
    assert not torch.allclose(shrunk, plain, atol=1e-4)
    g1, _, ks1 = _graph(1, 0.35, patched=False)
    unpatched = api.run(g1, models=models, output=tmp_path)[ks1.node_id][0].samples
    assert torch.allclose(plain, unpatched, atol=1e-6)   # outside its window the patch is inert


def test_patch_model_add_downscale_runs_bislerp(models, tmp_path):
    # bislerp was refused until models/resize.py had it (tests/test_model_patches_extra.py)
    g, _, ks = _graph(1, 0.35, method="bislerp")
    bis = api.run(g, models=models, output=tmp_path)[ks.node_id][0].samples
    g2, _, ks2 = _graph(1, 0.35, method="bicubic")
    cubic = api.run(g2, models=models, output=tmp_path)[ks2.node_id][0].samples
    assert torch.isfinite(bis).all() and not torch.allclose(bis, cubic, atol=1e-4)
