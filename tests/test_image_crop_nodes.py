"""ComfyUI nodes_images.py (015e604): PrimitiveBoundingBox, ImageCropV2 and ImageCropToMask. Specs
against ComfyUI's declarations, crops against hand-sliced references, ImageCropToMask against a
reference built from its rules (bbox, centred square, zero padding, composite) and resized with
PIL's LANCZOS directly, and graph runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers import crop_ops
from mixgraph.ui import api

REG = api.default_registry()


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


def ramp(b, h, w, c=3):
    return torch.arange(b * h * w * c, dtype=torch.float32).reshape(b, h, w, c) / (b * h * w * c)


def pil_lanczos(chw: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """ComfyUI's lanczos written out on PIL: truncate to uint8, LANCZOS, back to 0..1. [3,h,w] in,
    [height,width,3] out."""
    arr = np.clip(255.0 * chw.permute(1, 2, 0).numpy(), 0, 255).astype(np.uint8)
    out = Image.fromarray(arr).resize((width, height), Image.Resampling.LANCZOS)
    return torch.from_numpy(np.asarray(out, dtype=np.float32) / 255.0)


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp", input=tmp_path / "in")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))


def test_image_crop_nodes_specs_match_comfyui():
    info = REG.object_info()
    box = info["PrimitiveBoundingBox"]
    assert box["category"] == "utilities/primitive" and box["display_name"] == "Bounding Box"
    assert box["output"] == ["BOUNDING_BOX"]
    req = box["input"]["required"]
    assert req["x"] == ["INT", {"default": 0, "min": 0, "max": 16384}] == req["y"]
    assert req["width"] == ["INT", {"default": 512, "min": 1, "max": 16384}] == req["height"]

    crop = info["ImageCropV2"]
    assert (crop["category"], crop["display_name"], crop["output"]) == ("image/transform", "Crop Image", ["IMAGE"])
    assert crop["input"]["required"]["crop_region"] == [
        "BOUNDING_BOX", {"default": {"x": 0, "y": 0, "width": 512, "height": 512}, "socketless": True,
                         "component": "ImageCrop"}]
    assert crop["has_intermediate_output"] is True

    tm = info["ImageCropToMask"]
    assert list(tm["input"]["required"]) == ["images", "masks", "width", "height", "pad_factor",
                                             "grow_mask", "background"]
    req = tm["input"]["required"]
    assert {k: req["width"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 1024, "min": 64, "max": 4096, "step": 8}
    assert {k: req["pad_factor"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 1.0, "min": 1.0, "max": 2.0, "step": 0.01}
    assert {k: req["grow_mask"][1][k] for k in ("default", "min", "max")} == {"default": 0, "min": -32, "max": 32}
    assert req["background"][0] == "COLOR" and req["background"][1]["default"] == "#000000"
    assert tm["output"] == ["IMAGE"] and tm["output_name"] == ["images"]


def test_image_crop_v2_cuts_the_box():
    img = ramp(2, 10, 12)
    out = crop_ops.crop_region(img, crop_ops.BoundingBox(3, 2, 4, 5))
    assert torch.equal(out, img[:, 2:7, 3:7, :])


def test_image_crop_v2_out_of_range_box_is_clamped_not_padded():
    img = ramp(1, 10, 12)
    # past the right/bottom edge: cut at the edge
    assert torch.equal(crop_ops.crop_region(img, crop_ops.BoundingBox(8, 6, 100, 100)), img[:, 6:, 8:])
    # a corner outside the image moves onto the last row / column: a 1-pixel-wide strip
    out = crop_ops.crop_region(img, crop_ops.BoundingBox(50, 40, 5, 5))
    assert out.shape == (1, 1, 1, 3) and torch.equal(out, img[:, 9:10, 11:12])


def test_image_crop_v2_box_parsing_defaults_and_errors():
    assert crop_ops.BoundingBox.parse({"x": 4}) == crop_ops.BoundingBox(4, 0, 512, 512)
    assert crop_ops.BoundingBox.parse({"x": 1.0, "y": 2, "width": 3, "height": 4}).x == 1
    for bad, why in (([1, 2], "dict"), ({"x": -1}, ">= 0"), ({"width": 0}, ">= 1"),
                     ({"x": "a"}, "integer"), ({"x": 1, "z": 2}, "z")):
        with pytest.raises(crop_ops.CropError, match=why):
            crop_ops.BoundingBox.parse(bad)


def _subject(h=32, w=32):
    """A gray image with a 10x10 subject at rows 0..9, cols 0..9 (mask 1 there)."""
    img = torch.full((1, h, w, 3), 0.5)
    img[0, :10, :10] = torch.tensor([0.2, 0.6, 0.9])
    mask = torch.zeros(1, h, w)
    mask[0, :10, :10] = 1.0
    return img, mask


def test_image_crop_to_mask_pads_out_of_bounds_with_background():
    img, mask = _subject()
    out = crop_ops.crop_to_mask(img, mask, 64, 64, pad_factor=2.0, grow_mask=0, background="#ff0000")
    # bbox 10x10 centred at (4.5, 4.5); crop 20x20 from (-5, -5): 5 rows/cols of padding, whose
    # mask is 0, so they show the background; the subject sits at [5:15, 5:15]; the rest of the
    # crop (inside the image, mask 0) is background too
    expect = torch.zeros(3, 20, 20)
    expect[:] = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
    expect[:, 5:15, 5:15] = torch.tensor([0.2, 0.6, 0.9]).view(3, 1, 1)
    assert out.shape == (1, 64, 64, 3)
    assert torch.allclose(out[0], pil_lanczos(expect, 64, 64), atol=1e-6)


def test_image_crop_to_mask_wide_subject_and_aspect():
    img = ramp(1, 40, 48)
    mask = torch.zeros(1, 40, 48)
    mask[0, 20:30, 10:40] = 1.0                      # 30 wide, 10 high
    out = crop_ops.crop_to_mask(img, mask, 64, 128, pad_factor=1.0, grow_mask=0, background="#000000")
    # aspect 0.5, bw/bh = 3 >= 0.5: crop_w = 30, crop_h = int(30 / 0.5) = 60; centre (24.5, 24.5):
    # x1 = int(24.5 - 15) = 9, y1 = int(24.5 - 30) = -5 -> 5 rows of zero padding on top, 15 below
    # (the image has 40 rows: -5 .. 54)
    chw = img[0].permute(2, 0, 1)
    padded = torch.nn.functional.pad(chw, (0, 0, 5, 15))
    m = torch.nn.functional.pad(mask, (0, 0, 5, 15))
    crop = padded[:, 0:60, 9:39] * m[:, 0:60, 9:39]
    assert out.shape == (1, 128, 64, 3)
    assert torch.allclose(out[0], pil_lanczos(crop, 64, 128), atol=1e-6)


def test_image_crop_to_mask_inverted_mask_and_grow():
    img, mask = _subject()
    direct = crop_ops.crop_to_mask(img, mask, 64, 64, 1.5, 0, "#000000")
    border_bright = 1.0 - torch.zeros(1, 32, 32)
    border_bright[0, 8:24, 8:24] = 0.0                # bright border, dark centre: turned around
    a = crop_ops.crop_one_to_mask(img[0], border_bright[0], max_size=64, pad_factor=1.0, grow=0,
                                  background=(0, 0, 0), aspect=1.0)
    # foreground 8..23 (centre 15.5, half 8): x1 = int(7.5) = 7, so the crop is 7..22 and its
    # first row and column lie outside the (turned around) mask: black
    expect = img[0, 7:23, 7:23].clone()
    expect[0, :] = 0.0
    expect[:, 0] = 0.0
    assert a.shape == (1, 3, 16, 16) and torch.equal(a[0].permute(1, 2, 0), expect)
    grown = crop_ops.crop_one_to_mask(img[0], mask[0], max_size=64, pad_factor=1.0, grow=2,
                                      background=(0, 0, 0), aspect=1.0)
    assert grown.shape[-2:] == (12, 12)               # rows 0..11 after dilating by 2
    assert direct.shape == (1, 64, 64, 3)


def test_image_crop_to_mask_zero_mask_is_turned_around_and_downscaled():
    img = ramp(1, 128, 96)
    out = crop_ops.crop_to_mask(img, torch.zeros(1, 128, 96), 64, 64, 1.0, 0, "#000000")
    # no foreground, but the inverted mask has some: it is used (ComfyUI's rule), so the whole
    # image is the subject. First brought down to the output's larger side with lanczos
    # (96x128 -> 48x64), then squared: 64 wide from x = int(23.5 - 32) = -8, zeros either side
    small = pil_lanczos(img[0].permute(2, 0, 1), 48, 64).permute(2, 0, 1)
    expect = pil_lanczos(torch.nn.functional.pad(small, (8, 8)), 64, 64)
    assert out.shape == (1, 64, 64, 3) and torch.allclose(out[0], expect, atol=1e-6)


def test_image_crop_to_mask_undecided_mask_keeps_the_whole_image():
    img = ramp(1, 16, 16)
    # 0.5 everywhere: neither the mask nor its inverse has a pixel above 0.8 -> whole image,
    # composited at half strength over the background
    out = crop_ops.crop_one_to_mask(img[0], torch.full((16, 16), 0.5), max_size=64, pad_factor=1.0,
                                    grow=0, background=(1.0, 1.0, 1.0), aspect=1.0)
    assert torch.allclose(out[0].permute(1, 2, 0), img[0] * 0.5 + 0.5)


def test_image_crop_to_mask_batches_and_mask_sizes():
    img, mask = _subject()
    two = torch.cat([img, img * 0.5])
    out = crop_ops.crop_to_mask(two, mask, 64, 64, 1.0, 0, "#000000")   # one mask, two images
    assert out.shape == (2, 64, 64, 3)
    small = torch.nn.functional.interpolate(mask[:, None], size=(16, 16), mode="bilinear")[:, 0]
    assert crop_ops.crop_to_mask(img, small, 64, 64, 1.0, 0, "#000000").shape == (1, 64, 64, 3)
    with pytest.raises(crop_ops.CropError, match="mask batch"):
        crop_ops.crop_to_mask(two, torch.cat([mask] * 3), 64, 64, 1.0, 0, "#000000")


def test_image_crop_to_mask_colour_rules():
    assert crop_ops.parse_color("#336699") == (0x33 / 255, 0x66 / 255, 0x99 / 255)
    assert crop_ops.parse_color("#fff") == (0.0, 0.0, 0.0)      # ComfyUI: not 6 digits -> black
    with pytest.raises(crop_ops.CropError):
        crop_ops.parse_color("#zzzzzz")


def test_image_crop_nodes_in_a_graph(ex, tmp_path):
    # an RGBA input whose alpha is 0 on a square: LoadImage's MASK (1 - alpha) marks the subject
    rgba = np.zeros((48, 40, 4), np.uint8)
    rgba[..., :3] = 120
    rgba[..., 3] = 255
    rgba[10:20, 5:25, :3] = (250, 10, 10)
    rgba[10:20, 5:25, 3] = 0
    (tmp_path / "in").mkdir()
    Image.fromarray(rgba, "RGBA").save(tmp_path / "in" / "subject.png")
    wf = {"1": call("LoadImage", image="subject.png"),
          "2": call("PrimitiveBoundingBox", x=5, y=10, width=20, height=10),
          "3": call("ImageCropV2", image=["1", 0], crop_region=["2", 0]),
          "4": call("ImageCropV2", image=["1", 0], crop_region={"x": 30, "y": 40, "width": 64, "height": 64}),
          "5": call("ImageCropToMask", images=["1", 0], masks=["1", 1], width=64, height=64,
                    pad_factor=1.0, grow_mask=0, background="#00ff00"),
          "6": call("PreviewImage", images=["3", 0]),
          "7": call("PreviewImage", images=["4", 0]),
          "8": call("PreviewImage", images=["5", 0])}
    result = api.run(wf, executor=ex)
    red = torch.tensor([250, 10, 10]) / 255.0
    cut = result.outputs["3"][0]
    assert cut.shape == (1, 10, 20, 3) and torch.allclose(cut[0], red.expand(10, 20, 3))
    assert result.outputs["4"][0].shape == (1, 8, 10, 3)            # cut at the image's edge
    assert result.report.ui["3"]["images"][0]["type"] == "temp"      # ImageCropV2's preview
    sq = result.outputs["5"][0]
    # the 20x10 subject in a 20x20 square: red band in the middle rows, green above and below
    assert sq.shape == (1, 64, 64, 3)
    assert torch.allclose(sq[0, 32, 32], red, atol=1 / 255)
    assert torch.allclose(sq[0, 2, 32], torch.tensor([0.0, 1.0, 0.0]), atol=1 / 255)


def test_image_crop_nodes_validation_names_bad_literals():
    wf = {"1": call("EmptyImage", width=8, height=8, batch_size=1, color=0),
          "2": call("ImageCropV2", image=["1", 0], crop_region={"x": -3, "y": 0, "width": 4, "height": 4}),
          "3": call("PreviewImage", images=["2", 0]),
          "4": call("SolidMask", value=1.0, width=8, height=8),
          "5": call("ImageCropToMask", images=["1", 0], masks=["4", 0], width=64, height=64,
                    pad_factor=1.0, grow_mask=0, background="#12345g"),
          "6": call("PreviewImage", images=["5", 0])}
    errors = validate(load_workflow(wf, REG).prompt, REG).errors
    got = {(p.node_id, p.input_name, p.type) for p in errors}
    assert got == {("2", "crop_region", "custom_validation_failed"),
                   ("5", "background", "custom_validation_failed")}
    assert any(">= 0" in p.details for p in errors)
