"""Nodes added by the comfy_extras audit (docs/comfy-core-coverage.md): specs as ComfyUI's, values
derived by hand or from the formulas ComfyUI documents."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.helpers import image_filters, image_ops, latent_ops
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def _req(name):
    return INFO[name]["input"]["required"]


def _lat(*shape):
    n = int(np.prod(shape))
    return Latent(torch.arange(float(n)).reshape(shape), batch_index=(3,) * shape[0])


# --- nodes_latent.py ------------------------------------------------------------------------------

def test_latent_concat_cut_specs_match_comfyui():
    assert INFO["LatentConcat"]["input_order"]["required"] == ["samples1", "samples2", "dim"]
    assert _req("LatentConcat")["dim"][0] == ["x", "-x", "y", "-y", "t", "-t"]
    assert INFO["LatentCut"]["input_order"]["required"] == ["samples", "dim", "index", "amount"]
    assert _req("LatentCut")["dim"][0] == ["x", "y", "t"]
    assert _req("LatentCut")["index"] == ["INT", {"default": 0, "min": -16384, "max": 16384, "step": 1}]
    assert _req("LatentCut")["amount"] == ["INT", {"default": 1, "min": 1, "max": 16384, "step": 1}]
    assert _req("LatentCutToBatch")["dim"][0] == ["t", "x", "y"]
    assert _req("LatentCutToBatch")["slice_size"] == ["INT", {"default": 1, "min": 1, "max": 16384, "step": 1}]
    for n in ("LatentConcat", "LatentCut", "LatentCutToBatch", "LatentApplyOperation"):
        assert INFO[n]["output"] == ["LATENT"]


def test_latent_concat_orders_and_axes():
    a, b = _lat(1, 1, 2, 2), Latent(torch.full((1, 1, 2, 2), -1.0))
    x = latent_ops.concat(a, b, "x").samples
    assert x.shape == (1, 1, 2, 4) and x[0, 0].tolist() == [[0, 1, -1, -1], [2, 3, -1, -1]]
    assert latent_ops.concat(a, b, "-x").samples[0, 0].tolist() == [[-1, -1, 0, 1], [-1, -1, 2, 3]]
    y = latent_ops.concat(a, b, "-y").samples
    assert y[0, 0].tolist() == [[-1, -1], [-1, -1], [0, 1], [2, 3]]
    t = latent_ops.concat(a, b, "t").samples  # on a 4-D latent "t" is the channel axis, as in ComfyUI
    assert t.shape == (1, 2, 2, 2)
    two = latent_ops.concat(_lat(2, 1, 2, 2), b, "x")  # b's batch is tiled to a's
    assert two.samples.shape == (2, 1, 2, 4) and two.batch_index == (3, 3)
    with pytest.raises(ValueError, match="differ on another axis"):
        latent_ops.concat(a, Latent(torch.zeros(1, 1, 3, 2)), "x")


def test_latent_cut_clamps_and_counts_from_the_end():
    lat = _lat(1, 1, 1, 5)  # x = 0..4
    row = lambda idx, amt: latent_ops.cut(lat, "x", idx, amt).samples[0, 0, 0].tolist()  # noqa: E731
    assert row(1, 2) == [1, 2]
    assert row(3, 10) == [3, 4]
    assert row(9, 3) == [4]  # index clamped to the last entry
    assert row(-2, 5) == [3, 4]
    assert row(-9, 2) == [0, 1]  # clamped to -size
    assert latent_ops.cut(_lat(1, 1, 4, 1), "y", 1, 2).samples[0, 0, :, 0].tolist() == [1, 2]
    assert latent_ops.cut(_lat(1, 4, 1, 1), "t", 2, 1).samples.flatten().tolist() == [2]


def test_latent_cut_to_batch_stacks_slices():
    lat = _lat(2, 1, 1, 5)
    out = latent_ops.cut_to_batch(lat, "x", 2).samples  # 5 columns → 2 slices of 2, the fifth dropped
    assert out.shape == (4, 1, 1, 2)
    assert out[:, 0, 0].tolist() == [[0, 1], [2, 3], [5, 6], [7, 8]]
    assert latent_ops.cut_to_batch(lat, "x", 9).samples.shape == (2, 1, 1, 5)
    same = _lat(1, 4, 2, 2)
    assert latent_ops.cut_to_batch(same, "t", 2) is same  # channel axis: unchanged, as in ComfyUI


def test_latent_operation_specs_match_comfyui():
    assert _req("LatentOperationTonemapReinhard")["multiplier"] == ["FLOAT", {"default": 1.0, "min": 0.0,
                                                                              "max": 100.0, "step": 0.01}]
    assert _req("LatentOperationSharpen") == {
        "sharpen_radius": ["INT", {"default": 9, "min": 1, "max": 31, "step": 1}],
        "sigma": ["FLOAT", {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1}],
        "alpha": ["FLOAT", {"default": 0.1, "min": 0.0, "max": 5.0, "step": 0.01}]}
    assert _req("LatentOperationBlend")["strength"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0,
                                                                  "step": 0.0001}]
    assert INFO["LatentApplyOperation"]["input_order"]["required"] == ["samples", "operation"]
    for n in ("LatentOperationTonemapReinhard", "LatentOperationSharpen", "LatentOperationBlend"):
        assert INFO[n]["output"] == ["LATENT_OPERATION"]


def test_latent_tonemap_reinhard_reference_values():
    # two pixels, 2 channels: vectors (3, 4) |5| and (0, 1) |1|
    x = torch.tensor([[[[3.0, 0.0]], [[4.0, 1.0]]]])
    out = latent_ops.apply_operation(Latent(x), latent_ops.TonemapReinhard(2.0)).samples
    mags = np.array([5.0, 1.0])
    top = (mags.mean() + 5 * mags.std(ddof=1)) * 2.0
    new = mags / top / (mags / top + 1.0) * top
    assert torch.allclose(out[0, :, 0, 0], torch.tensor([3.0, 4.0]) / 5 * new[0], atol=1e-5)
    assert torch.allclose(out[0, :, 0, 1], torch.tensor([0.0, 1.0]) * new[1], atol=1e-5)


def test_latent_sharpen_flat_field_unchanged_and_alpha_zero_identity():
    flat = torch.ones(1, 4, 6, 6) * torch.tensor([1.0, -2.0, 0.5, 3.0]).view(1, 4, 1, 1)
    op = latent_ops.SharpenDirections(2, 1.0, 0.7)
    assert torch.allclose(op(latent=flat), flat, atol=1e-5)  # the kernel sums to 1
    x = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(latent_ops.SharpenDirections(3, 1.0, 0.0)(latent=x), x, atol=1e-5)


def test_latent_sharpen_matches_a_direct_convolution():
    x = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    r, sigma, alpha = 1, 1.0, 0.5
    lum = np.linalg.norm(x.numpy(), axis=1)[:, None] + 1e-6
    unit = np.pad(x.numpy() / lum, ((0, 0), (0, 0), (r, r), (r, r)), mode="reflect")
    g = np.linspace(-1, 1, 3)
    d2 = g[:, None] ** 2 + g[None, :] ** 2
    k = np.exp(-d2 / (2 * sigma**2))
    k = k / k.sum() * (-10 * alpha)
    k[1, 1] += 1.0 - k.sum()
    ref = np.zeros_like(x.numpy())
    for i in range(5):
        for j in range(5):
            ref[:, :, i, j] = (unit[:, :, i:i + 3, j:j + 3] * k).sum(axis=(2, 3))
    out = latent_ops.SharpenDirections(r, sigma, alpha)(latent=x)
    assert torch.allclose(out, torch.from_numpy(ref * lum).float(), atol=1e-4)


def test_latent_operation_blend_resizes_nearest_and_lerps():
    ref = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    op = latent_ops.BlendToward(ref, 0.25)
    out = op(latent=torch.zeros(2, 1, 4, 4))
    assert out.shape == (2, 1, 4, 4)
    assert out[1, 0].tolist() == [[0.25, 0.25, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5],
                                  [0.75, 0.75, 1.0, 1.0], [0.75, 0.75, 1.0, 1.0]]
    z = torch.ones(1, 1, 2, 2)
    assert latent_ops.BlendToward(ref, 0.0)(latent=z) is z


def test_latent_operations_run_in_a_graph(tmp_path):
    prompt = {
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "2": {"class_type": "LatentOperationTonemapReinhard", "inputs": {"multiplier": 1.0}},
        "3": {"class_type": "LatentApplyOperation", "inputs": {"samples": ["1", 0], "operation": ["2", 0]}},
        "4": {"class_type": "LatentCut", "inputs": {"samples": ["3", 0], "dim": "x", "index": -2, "amount": 4}},
        "5": {"class_type": "SaveLatent", "inputs": {"samples": ["4", 0], "filename_prefix": "t"}},
    }
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    ex = Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 20))
    result = api.run(prompt, executor=ex)
    assert result.outputs["4"][0].samples.shape == (1, 4, 8, 2)


# --- nodes_images.py / nodes_morphology.py / nodes_mask.py ---------------------------------------

def test_image_scale_to_max_dimension_spec_and_sizes():
    assert INFO["ImageScaleToMaxDimension"]["input_order"]["required"] == ["image", "upscale_method", "largest_size"]
    assert _req("ImageScaleToMaxDimension")["upscale_method"][0] == ["area", "lanczos", "bilinear", "nearest-exact",
                                                                     "bilinear", "bicubic"]
    assert _req("ImageScaleToMaxDimension")["largest_size"] == ["INT", {"default": 512, "min": 0, "max": 16384,
                                                                        "step": 1}]
    tall = torch.rand(1, 30, 20, 3)
    assert image_ops.scale_to_max_dimension(tall, "bilinear", 45).shape == (1, 45, 30, 3)
    wide = torch.rand(2, 10, 30, 3)
    assert image_ops.scale_to_max_dimension(wide, "area", 16).shape == (2, 5, 16, 3)  # round(5.33) = 5
    assert image_ops.scale_to_max_dimension(torch.rand(1, 7, 7, 3), "nearest-exact", 9).shape == (1, 9, 9, 3)
    flat = torch.full((1, 4, 8, 3), 0.25)
    assert torch.allclose(image_ops.scale_to_max_dimension(flat, "bicubic", 16), torch.full((1, 8, 16, 3), 0.25))


def test_image_from_batch_takes_negative_indices():
    assert _req("ImageFromBatch")["batch_index"] == ["INT", {"default": 0, "min": -16384, "max": 16384}]
    images = torch.arange(4.0).view(4, 1, 1, 1)
    assert image_ops.from_batch(images, -1, 3).flatten().tolist() == [3.0]
    assert image_ops.from_batch(images, -3, 2).flatten().tolist() == [1.0, 2.0]
    assert image_ops.from_batch(images, -9, 1).flatten().tolist() == [0.0]


def test_image_yuv_specs_and_reference_values():
    assert INFO["ImageRGBToYUV"]["output"] == ["IMAGE", "IMAGE", "IMAGE"]
    assert INFO["ImageRGBToYUV"]["output_name"] == ["Y", "U", "V"]
    assert INFO["ImageYUVToRGB"]["input_order"]["required"] == ["Y", "U", "V"]
    rgb = torch.tensor([[[[1.0, 0.0, 0.0], [0.2, 0.4, 0.6]]]])  # [1, 1, 2, 3]
    y, u, v = image_filters.rgb_to_ycbcr(rgb)
    assert y.shape == u.shape == v.shape == (1, 1, 2, 3)
    # red: Y = 0.299, Cb = (0 - 0.299)·0.564 + 0.5, Cr = (1 - 0.299)·0.713 + 0.5 (JPEG / kornia)
    assert torch.allclose(y[0, 0, 0], torch.full((3,), 0.299))
    assert abs(float(u[0, 0, 0, 0]) - (0.5 - 0.299 * 0.564)) < 1e-6
    assert abs(float(v[0, 0, 0, 1]) - (0.5 + 0.701 * 0.713)) < 1e-6
    back = image_filters.ycbcr_to_rgb(y, u, v)
    assert torch.allclose(back, rgb, atol=2e-3)  # the rounded constants invert to ~1e-3


def test_mask_preview_spec_and_run(tmp_path):
    spec = INFO["MaskPreview"]
    assert spec["output_node"] and spec["output"] == ["MASK"] and spec["output_name"] == ["mask"]
    assert spec["input_order"]["required"] == ["mask"]
    prompt = {"1": {"class_type": "SolidMask", "inputs": {"value": 0.5, "width": 16, "height": 8}},
              "2": {"class_type": "MaskPreview", "inputs": {"mask": ["1", 0]}}}
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    ex = Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 20))
    result = api.run(prompt, executor=ex)
    entry = result.report.ui["2"]["images"][0]
    assert entry["type"] == "temp"
    png = np.asarray(Image.open(tmp_path / "temp" / entry["subfolder"] / entry["filename"]))
    assert png.shape == (8, 16, 3) and int(png[0, 0, 0]) in (127, 128)
    assert torch.equal(result.outputs["2"][0], torch.full((1, 8, 16), 0.5))
