"""Mask and image nodes (ComfyUI nodes_mask / nodes_images / nodes_post_processing / nodes.py):
specs as ComfyUI's, and values derived by hand on tiny tensors."""

import math

import pytest
import torch

from mixgraph.nodes.helpers import image_ops, mask_ops
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def _inputs(name):
    spec = INFO[name]
    return {k: v for part in spec["input"].values() for k, v in part.items()}, spec


@pytest.mark.parametrize("name,expected,outputs", [
    ("GrowMask", {"mask": ["MASK"], "expand": ["INT", {"default": 0, "min": -16384, "max": 16384, "step": 1}],
                  "tapered_corners": ["BOOLEAN", {"default": True}]}, ["MASK"]),
    ("FeatherMask", {"mask": ["MASK"], **{k: ["INT", {"default": 0, "min": 0, "max": 16384, "step": 1}]
                                          for k in ("left", "top", "right", "bottom")}}, ["MASK"]),
    ("SolidMask", {"value": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}],
                   "width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
                   "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}]}, ["MASK"]),
    ("ThresholdMask", {"mask": ["MASK"], "value": ["FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.01}]},
     ["MASK"]),
    ("ImagePadForOutpaint", {"image": ["IMAGE"], **{k: ["INT", {"default": 0, "min": 0, "max": 16384, "step": 8}]
                                                    for k in ("left", "top", "right", "bottom")},
                             "feathering": ["INT", {"default": 40, "min": 0, "max": 16384, "step": 1}]},
     ["IMAGE", "MASK"]),
    ("EmptyImage", {"width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
                    "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
                    "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}],
                    "color": ["INT", {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1}]}, ["IMAGE"]),
    ("ImageBlur", {"image": ["IMAGE"], "blur_radius": ["INT", {"default": 1, "min": 1, "max": 31, "step": 1}],
                   "sigma": ["FLOAT", {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1}]}, ["IMAGE"]),
])
def test_mask_image_specs_match_comfyui(name, expected, outputs):
    inputs, spec = _inputs(name)
    assert inputs == expected
    assert list(spec["input_order"]["required"]) == [k for k in expected]
    assert spec["output"] == outputs


def test_mask_image_option_lists_and_order():
    assert _inputs("MaskComposite")[0]["operation"][0] == ["multiply", "add", "subtract", "and", "or", "xor"]
    assert _inputs("ImageToMask")[0]["channel"][0] == ["red", "green", "blue", "alpha"]
    assert _inputs("ImageBlend")[0]["blend_mode"][0] == ["normal", "multiply", "screen", "overlay",
                                                          "soft_light", "difference"]
    assert _inputs("ImageQuantize")[0]["dither"][0] == ["none", "floyd-steinberg", "bayer-2", "bayer-4",
                                                         "bayer-8", "bayer-16"]
    composite = INFO["ImageCompositeMasked"]
    assert composite["input_order"] == {"required": ["destination", "source", "x", "y", "resize_source"],
                                        "optional": ["mask"]}
    assert INFO["LatentCompositeMasked"]["input"]["required"]["x"][1]["step"] == 8
    assert INFO["ImageToMask"]["display_name"] == "Convert Image to Mask"


def _centre_dot(n=5):
    m = torch.zeros(1, n, n)
    m[0, n // 2, n // 2] = 1.0
    return m


def test_grow_mask_tapered_cross_and_square():
    cross = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 0, 0],
                          [0, 0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(mask_ops.grow(_centre_dot(), 1, True)[0], cross)
    square = torch.zeros(5, 5)
    square[1:4, 1:4] = 1
    assert torch.equal(mask_ops.grow(_centre_dot(), 1, False)[0], square)
    diamond = mask_ops.grow(_centre_dot(), 2, True)[0]  # two cross steps: |dy| + |dx| <= 2
    expect = torch.tensor([[float(abs(r - 2) + abs(c - 2) <= 2) for c in range(5)] for r in range(5)])
    assert torch.equal(diamond, expect)


def test_grow_mask_erodes_and_repeats_edges():
    square = torch.zeros(1, 5, 5)
    square[0, 1:4, 1:4] = 1
    assert torch.equal(mask_ops.grow(square, -1, True), _centre_dot())
    ones = torch.ones(1, 3, 3)  # the border repeats the edge: erosion keeps a full mask full
    assert torch.equal(mask_ops.grow(ones, -1, False), ones)
    corner = torch.zeros(1, 3, 3)
    corner[0, 0, 0] = 0.7  # grey values dilate as a max
    grown = mask_ops.grow(corner, 1, True)[0]
    assert torch.equal(grown, torch.tensor([[0.7, 0.7, 0], [0.7, 0, 0], [0, 0, 0]]))


def test_feather_mask_ramps_including_comfyui_minus_zero_index():
    out = mask_ops.feather(torch.ones(1, 3, 4), 2, 0, 2, 0)[0]
    # left ramp: col0 x 1/2, col1 x 2/2; right ramp indexes -0 (= col0) x 1/2, col -1 x 2/2
    assert torch.allclose(out[0], torch.tensor([0.25, 1.0, 1.0, 1.0]))
    out = mask_ops.feather(torch.ones(1, 3, 2), 0, 3, 0, 0)[0]
    assert torch.allclose(out[:, 0], torch.tensor([1 / 3, 2 / 3, 1.0]))
    assert torch.equal(mask_ops.feather(torch.ones(1, 2, 2), 9, 0, 0, 0)[0, 0], torch.tensor([0.5, 1.0]))


def test_mask_composite_operations_and_overhang():
    dest = torch.zeros(1, 3, 3)
    src = torch.ones(1, 2, 2)
    out = mask_ops.composite(dest, src, 2, 2, "add")[0]
    expect = torch.zeros(3, 3)
    expect[2, 2] = 1  # only the part that lies inside the destination
    assert torch.equal(out, expect)
    dest = torch.full((1, 2, 2), 0.6)
    src = torch.full((1, 2, 2), 0.4)
    assert torch.allclose(mask_ops.composite(dest, src, 0, 0, "multiply"), torch.full((1, 2, 2), 0.24))
    assert torch.allclose(mask_ops.composite(dest, src, 0, 0, "subtract"), torch.full((1, 2, 2), 0.2))
    assert torch.equal(mask_ops.composite(dest, src, 0, 0, "xor"), torch.ones(1, 2, 2))  # 1 xor 0
    assert torch.equal(mask_ops.composite(dest, src, 0, 0, "and"), torch.zeros(1, 2, 2))
    assert torch.equal(mask_ops.composite(dest, dest, 0, 0, "add"), torch.ones(1, 2, 2))  # clamped


def test_mask_conversions_solid_crop_threshold_invert():
    img = torch.zeros(2, 2, 3, 3)
    img[..., 1] = 0.25
    assert torch.equal(mask_ops.image_to_mask(img, "green"), torch.full((2, 2, 3), 0.25))
    as_img = mask_ops.mask_to_image(torch.full((1, 2, 3), 0.5))
    assert as_img.shape == (1, 2, 3, 3) and torch.equal(as_img, torch.full((1, 2, 3, 3), 0.5))
    assert torch.equal(mask_ops.solid(0.3, 4, 2), torch.full((1, 2, 4), 0.3))
    m = torch.arange(16.0).reshape(4, 4) / 16
    assert torch.equal(mask_ops.crop(m, 1, 2, 2, 5), (m[2:4, 1:3]).unsqueeze(0))
    assert torch.equal(mask_ops.threshold(torch.tensor([0.2, 0.5, 0.51]), 0.5), torch.tensor([0.0, 0, 1]))
    assert torch.allclose(mask_ops.invert(torch.tensor([0.25])), torch.tensor([0.75]))


def test_image_color_to_mask_matches_packed_rgb():
    img = torch.zeros(1, 1, 2, 3)
    img[0, 0, 0] = torch.tensor([1.0, 128 / 255, 0.0])
    img[0, 0, 1] = torch.tensor([1.0, 127 / 255, 0.0])
    assert torch.equal(mask_ops.color_to_mask(img, 0xFF8000), torch.tensor([[[1.0, 0.0]]]))


def test_image_composite_masked_known_mask_and_overhang():
    dest = torch.zeros(1, 4, 4, 3)
    src = torch.ones(1, 2, 2, 3)
    out = image_ops.composite_masked(dest, src, 1, 2, False, torch.full((1, 2, 2), 0.5))
    expect = torch.zeros(1, 4, 4, 3)
    expect[:, 2:4, 1:3] = 0.5
    assert torch.equal(out, expect)
    out = image_ops.composite_masked(dest, src, 3, 0, False, None)
    expect = torch.zeros(1, 4, 4, 3)
    expect[:, 0:2, 3] = 1.0
    assert torch.equal(out, expect)
    assert torch.equal(dest, torch.zeros(1, 4, 4, 3))  # the input is untouched


def test_image_pad_for_outpaint_grey_border_and_feather_ramp():
    img = torch.ones(1, 5, 5, 3)
    out, mask = image_ops.pad_for_outpaint(img, 2, 0, 0, 0, 2)
    assert out.shape == (1, 5, 7, 3) and torch.all(out[:, :, :2] == 0.5) and torch.all(out[:, :, 2:] == 1)
    # only the left edge is padded: d = column j; ((2 - j) / 2)^2 for j < 2
    row = torch.tensor([1.0, 1.0, 1.0, 0.25, 0.0, 0.0, 0.0])
    assert mask.shape == (1, 5, 7) and torch.equal(mask[0], row.expand(5, 7))
    _, no_feather = image_ops.pad_for_outpaint(img, 0, 0, 0, 8, 3)  # 2 * 3 > 5: no feathering
    assert torch.equal(no_feather[0, :5], torch.zeros(5, 5)) and torch.all(no_feather[0, 5:] == 1)


def test_empty_image_color_and_invert_batch_crop():
    img = image_ops.empty(3, 2, 2, 0xFF8000)
    assert img.shape == (2, 2, 3, 3)
    assert torch.allclose(img[1, 1, 2], torch.tensor([1.0, 128 / 255, 0.0]))
    assert torch.allclose(image_ops.invert(img)[0, 0, 0], torch.tensor([0.0, 127 / 255, 1.0]))
    both = image_ops.batch(torch.zeros(1, 2, 2, 3), torch.ones(2, 2, 2, 3))
    assert both.shape == (3, 2, 2, 3) and both[1:].min() == 1
    resized = image_ops.batch(torch.zeros(1, 2, 2, 3), torch.ones(1, 4, 4, 3))
    assert resized.shape == (2, 2, 2, 3) and torch.allclose(resized[1], torch.ones(2, 2, 3))
    x = torch.arange(2 * 4 * 5 * 3.0).reshape(2, 4, 5, 3)
    assert torch.equal(image_ops.crop(x, 2, 3, 4, 1), x[:, 1:4, 4:5])
    assert torch.equal(image_ops.crop(x, 2, 2, 9, 9), x[:, 3:4, 4:5])  # origin clamped inside
    assert torch.equal(image_ops.from_batch(x, 5, 3), x[1:2])
    assert image_ops.repeat_batch(x, 3).shape == (6, 4, 5, 3)


def test_image_blend_modes_by_formula():
    a, b = torch.full((1, 2, 2, 3), 0.4), torch.full((1, 2, 2, 3), 0.5)
    assert torch.allclose(image_ops.blend(a, b, 0.5, "multiply"), torch.full_like(a, 0.3))
    assert torch.allclose(image_ops.blend(a, b, 0.5, "screen"), torch.full_like(a, 0.55))
    assert torch.allclose(image_ops.blend(a, b, 1.0, "overlay"), torch.full_like(a, 0.4))  # 2ab
    assert torch.allclose(image_ops.blend(a, b, 0.25, "normal"), torch.full_like(a, 0.425))
    assert torch.allclose(image_ops.blend(a, b, 1.0, "difference"), torch.zeros_like(a))  # clamped
    # soft light, b <= 0.5: a - (1 - 2b) a (1 - a) = a when b = 0.5
    assert torch.allclose(image_ops.blend(a, b, 1.0, "soft_light"), a)


def test_image_blur_is_comfyui_gaussian_on_unit_grid():
    img = torch.zeros(1, 5, 5, 3)
    img[0, 2, 2] = 1.0
    out = image_ops.blur(img, 1, 1.0)
    g = [1.0, math.exp(-0.5), math.exp(-1.0)]  # centre, edge (d^2 = 1), corner (d^2 = 2)
    total = g[0] + 4 * g[1] + 4 * g[2]
    assert out[0, 2, 2, 0].item() == pytest.approx(g[0] / total, abs=1e-6)
    assert out[0, 1, 2, 1].item() == pytest.approx(g[1] / total, abs=1e-6)
    assert out[0, 1, 1, 2].item() == pytest.approx(g[2] / total, abs=1e-6)
    assert out[0, 0, 0].abs().max() == 0
    flat = torch.full((1, 4, 4, 3), 0.3)  # reflect padding keeps a flat image flat
    assert torch.allclose(image_ops.blur(flat, 2, 0.7), flat, atol=1e-6)


def test_image_sharpen_kernel_sums_to_one():
    flat = torch.full((1, 4, 4, 3), 0.3)
    assert torch.allclose(image_ops.sharpen(flat, 1, 1.0, 1.0), flat, atol=1e-6)
    img = torch.zeros(1, 5, 5, 3)
    img[0, 2, 2] = 0.05
    g_centre = 1 / (1 + 4 * math.exp(-0.5) + 4 * math.exp(-1.0))
    out = image_ops.sharpen(img, 1, 1.0, 0.1)  # centre tap: 1 + 10 alpha (1 - g_c)
    assert out[0, 2, 2, 0].item() == pytest.approx(0.05 * (1 + 1.0 * (1 - g_centre)), abs=1e-6)
    assert out[0, 1, 2, 0].item() == 0.0  # negative, clamped


def test_image_quantize_keeps_an_image_that_fits_the_palette():
    img = torch.zeros(1, 4, 4, 3)
    img[0, :2, :, 0] = 1.0
    img[0, 2:, :, 2] = 1.0
    for dither in ("none", "floyd-steinberg", "bayer-4"):
        out = image_ops.quantize(img, 2, dither)
        assert out.shape == img.shape
        assert torch.equal(out, img), dither


def test_image_scale_to_total_pixels_size():
    out = image_ops.scale_to_total_pixels(torch.zeros(1, 16, 16, 3), "nearest-exact", 0.01)
    # sqrt(0.01 * 1024^2 / 256) = 6.4 -> round(16 * 6.4) = 102
    assert out.shape == (1, 102, 102, 3)


def test_workflow_chains_mask_image_primitive_and_string_nodes(tmp_path):
    """An API-format prompt through the engine: pad for outpainting, grow the mask by a primitive,
    invert it, composite black through it, save under a prefix built by string nodes."""
    from mixgraph.graph.cache import OutputCache
    from mixgraph.graph.env import Env
    from mixgraph.graph.executor import Executor

    env = Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    prompt = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1,
                                                     "color": 0xFFFFFF}},
        "2": {"class_type": "ImagePadForOutpaint", "inputs": {"image": ["1", 0], "left": 8, "top": 0,
                                                              "right": 0, "bottom": 0, "feathering": 0}},
        "3": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
        "4": {"class_type": "GrowMask", "inputs": {"mask": ["2", 1], "expand": ["3", 0],
                                                   "tapered_corners": False}},
        "5": {"class_type": "InvertMask", "inputs": {"mask": ["4", 0]}},
        "6": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 1, "color": 0}},
        "7": {"class_type": "ImageCompositeMasked", "inputs": {"destination": ["2", 0], "source": ["6", 0],
                                                               "x": 0, "y": 0, "resize_source": False,
                                                               "mask": ["5", 0]}},
        "8": {"class_type": "StringConcatenate", "inputs": {"string_a": "outpaint", "string_b": "check",
                                                            "delimiter": "_"}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": ["8", 0]}},
    }
    result = Executor(api.default_registry(), env, OutputCache(2**24)).run(prompt)
    assert result.status == "success"
    image = result.values["7"][0]
    assert image.shape == (1, 8, 16, 3)
    assert torch.all(image[:, :, :8] == 0.5)  # grey padding, mask 1 there: kept
    assert torch.all(image[:, :, 8] == 1.0)  # grown by one column into the white image: kept
    assert torch.all(image[:, :, 9:] == 0.0)  # inverted mask 1: black source pasted
    assert result.ui["9"]["images"][0]["filename"] == "outpaint_check_00001_.png"
    assert (tmp_path / "out" / "outpaint_check_00001_.png").is_file()
