"""Latent batch/composite/transform/arithmetic nodes: specs as ComfyUI's and hand-derived values."""

import math

import pytest
import torch

from mixgraph.nodes.helpers import latent_ops
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_latent_extra_specs_match_comfyui():
    req = lambda n: INFO[n]["input"]["required"]  # noqa: E731
    assert req("LatentFromBatch")["batch_index"] == ["INT", {"default": 0, "min": 0, "max": 63}]
    assert req("LatentFromBatch")["length"] == ["INT", {"default": 1, "min": 1, "max": 64}]
    assert req("RepeatLatentBatch")["amount"] == ["INT", {"default": 1, "min": 1, "max": 64}]
    assert req("LatentRotate")["rotation"][0] == ["none", "90 degrees", "180 degrees", "270 degrees"]
    assert req("LatentFlip")["flip_method"][0] == ["x-axis: vertically", "y-axis: horizontally"]
    assert INFO["LatentCrop"]["input_order"]["required"] == ["samples", "width", "height", "x", "y"]
    assert req("LatentCrop")["width"] == ["INT", {"default": 512, "min": 64, "max": 16384, "step": 8}]
    assert INFO["LatentComposite"]["input_order"]["required"] == ["samples_to", "samples_from", "x", "y",
                                                                 "feather"]
    assert req("LatentBlend")["blend_factor"] == ["FLOAT", {"default": 0.5, "min": 0, "max": 1, "step": 0.01}]
    assert req("LatentMultiply")["multiplier"] == ["FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0,
                                                             "step": 0.01}]
    assert req("LatentInterpolate")["ratio"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}]
    assert req("LatentBatchSeedBehavior")["seed_behavior"] == [["random", "fixed"], {"default": "fixed"}]
    assert INFO["SetLatentNoiseMask"]["input_order"]["required"] == ["samples", "mask"]
    for n in ("LatentAdd", "LatentSubtract", "LatentBatch", "LatentInterpolate"):
        assert list(INFO[n]["input_order"]["required"])[:2] == ["samples1", "samples2"]
        assert INFO[n]["output"] == ["LATENT"]


def _lat(b=1, c=1, h=2, w=2, start=0.0):
    return torch.arange(start, start + b * c * h * w).reshape(b, c, h, w)


def test_latent_from_batch_slices_samples_masks_and_indices():
    lat = Latent(_lat(4), noise_mask=torch.stack([torch.zeros(1, 2, 2), torch.ones(1, 2, 2)]))
    out = latent_ops.from_batch(lat, 1, 2)
    assert torch.equal(out.samples, lat.samples[1:3]) and out.batch_index == (1, 2)
    # a 2-mask batch is tiled to the 4 latents: rows 1, 2 -> masks 1, 0
    assert torch.equal(out.noise_mask[:, 0, 0, 0], torch.tensor([1.0, 0.0]))
    clipped = latent_ops.from_batch(Latent(_lat(2), batch_index=(7, 9)), 5, 4)
    assert clipped.samples.shape[0] == 1 and clipped.batch_index == (9,)


def test_repeat_latent_batch_continues_batch_index():
    out = latent_ops.repeat_batch(Latent(_lat(2), batch_index=(2, 3)), 3)
    assert out.samples.shape[0] == 6 and out.batch_index == (2, 3, 4, 5, 6, 7)
    assert torch.equal(out.samples[4:], _lat(2))
    single_mask = torch.ones(1, 1, 2, 2)
    assert latent_ops.repeat_batch(Latent(_lat(1), single_mask), 2).noise_mask.shape[0] == 1


def test_latent_composite_paste_and_feather_weights():
    to, src = Latent(torch.zeros(1, 1, 6, 6)), Latent(torch.ones(1, 1, 3, 3))
    plain = latent_ops.composite(to, src, 8, 16, 0).samples[0, 0]
    expect = torch.zeros(6, 6)
    expect[2:5, 1:4] = 1
    assert torch.equal(plain, expect)
    # feather 16 px = 2 latent px: edge lines x 1/2, the next x 2/2, on every inner edge
    out = latent_ops.composite(to, src, 8, 8, 16).samples[0, 0]
    ramp = torch.tensor([0.5, 1.0, 0.5])
    assert torch.allclose(out[1:4, 1:4], ramp[:, None] * ramp[None, :])
    corner = latent_ops.composite(to, src, 0, 0, 16).samples[0, 0]  # top/left edges are not feathered
    edge = torch.tensor([1.0, 1.0, 0.5])
    assert torch.allclose(corner[0:3, 0:3], edge[:, None] * edge[None, :])


def test_latent_composite_masked_known_mask():
    dest, src = Latent(torch.zeros(1, 2, 4, 4)), Latent(torch.full((1, 2, 2, 2), 2.0))
    out = latent_ops.composite_masked(dest, src, 8, 16, False, torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))
    expect = torch.zeros(1, 2, 4, 4)
    expect[:, :, 2, 1] = 2.0
    expect[:, :, 3, 2] = 2.0
    assert torch.equal(out.samples, expect)
    resized = latent_ops.composite_masked(dest, src, 0, 0, True, None)
    assert torch.equal(resized.samples, torch.full((1, 2, 4, 4), 2.0))


def test_latent_rotate_flip_crop_blend():
    lat = Latent(torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]))
    assert torch.equal(latent_ops.rotate(lat, "90 degrees").samples[0, 0], torch.tensor([[3.0, 1.0], [4.0, 2.0]]))
    assert torch.equal(latent_ops.rotate(lat, "180 degrees").samples[0, 0], torch.tensor([[4.0, 3.0], [2.0, 1.0]]))
    assert torch.equal(latent_ops.flip(lat, "x-axis: vertically").samples[0, 0], torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    assert torch.equal(latent_ops.flip(lat, "y-axis: horizontally").samples[0, 0], torch.tensor([[2.0, 1.0], [4.0, 3.0]]))
    big = Latent(_lat(1, 1, 16, 16))
    out = latent_ops.crop(big, 64, 64, 8, 80).samples  # y = 10 clamped to 16 - 8
    assert torch.equal(out, big.samples[:, :, 8:16, 1:9])
    blended = latent_ops.blend(Latent(torch.ones(1, 1, 2, 2)), Latent(torch.full((1, 1, 2, 2), 3.0)), 0.25)
    assert torch.allclose(blended.samples, torch.full((1, 1, 2, 2), 0.25 + 0.75 * 3.0))


def test_latent_arithmetic_and_batch_broadcast():
    a, b = Latent(torch.ones(2, 1, 2, 2)), Latent(torch.full((1, 1, 2, 2), 0.5))
    assert torch.equal(latent_ops.add(a, b).samples, torch.full((2, 1, 2, 2), 1.5))
    assert torch.equal(latent_ops.subtract(a, b).samples, torch.full((2, 1, 2, 2), 0.5))
    assert torch.equal(latent_ops.multiply(a, -2.0).samples, torch.full((2, 1, 2, 2), -2.0))
    bigger = Latent(torch.full((1, 1, 4, 4), 0.5))  # resized to a's size
    assert torch.allclose(latent_ops.add(a, bigger).samples, torch.full((2, 1, 2, 2), 1.5))


def test_latent_interpolate_slerp_like_by_hand():
    s1 = torch.tensor([3.0, 4.0]).reshape(1, 2, 1, 1)
    s2 = torch.tensor([0.0, 2.0]).reshape(1, 2, 1, 1)
    out = latent_ops.interpolate(Latent(s1), Latent(s2), 0.5).samples.flatten()
    t = (0.3, 0.9)  # lerp of unit directions (0.6, 0.8) and (0, 1)
    n = math.sqrt(t[0] ** 2 + t[1] ** 2)
    mag = 0.5 * 5 + 0.5 * 2
    assert out.tolist() == pytest.approx([t[0] / n * mag, t[1] / n * mag], abs=1e-6)
    zero = latent_ops.interpolate(Latent(s1), Latent(torch.zeros_like(s2)), 0.25).samples.flatten()
    assert zero.tolist() == pytest.approx([0.6 * 1.25, 0.8 * 1.25], abs=1e-6)  # no NaN


def test_latent_batch_and_seed_behavior():
    out = latent_ops.concat_batch(Latent(torch.zeros(1, 1, 2, 2)), Latent(torch.ones(2, 1, 4, 4)))
    assert out.samples.shape == (3, 1, 2, 2) and out.batch_index == (0, 0, 1)
    fixed = latent_ops.seed_behavior(Latent(torch.zeros(2, 1, 1, 1), batch_index=(5, 6)), "fixed")
    assert fixed.batch_index == (5, 5)
    assert latent_ops.seed_behavior(Latent(torch.zeros(3, 1, 1, 1)), "fixed").batch_index == (0, 0, 0)
    assert latent_ops.seed_behavior(fixed, "random").batch_index is None


def test_set_latent_noise_mask_shape():
    out = latent_ops.with_noise_mask(Latent(torch.zeros(1, 4, 2, 2)), torch.ones(2, 16, 16))
    assert out.noise_mask.shape == (2, 1, 16, 16)
