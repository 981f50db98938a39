"""ComfyUI nodes_images.py (015e604): SaveImageAdvanced. Its spec (the `format` DynamicCombo with
a nested `save_mode`), PNG at 8 and 16 bits read back by Pillow (and the 16-bit RGB samples by
inflating the IDAT stream), EXR read back by the OpenEXR library, ComfyUI's colour transforms
against their closed forms, file naming, metadata, the ui payload, and avif validation (its files:
tests/test_save_image_avif.py)."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers import image_codecs, image_save
from mixgraph.ui import api

REG = api.default_registry()
WORKFLOW = {"nodes": [], "links": [], "version": 0.4}


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))


def run(ex, wf):
    return ex.run(load_workflow(wf, REG), extra_data={"extra_pnginfo": {"workflow": WORKFLOW}})


def png_samples(path) -> np.ndarray:
    """The samples of a non-interlaced PNG written with filter 0 on every row: [H, W*C] of the
    stored integers, read straight from the chunks (Pillow reads RGB48 as 8-bit RGB)."""
    data = path.read_bytes()
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, bits, color_type = ihdr[:4]
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, -1)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].copy().view(">u2" if bits == 16 else np.uint8).astype(np.int64)


def values(h, w, c):
    """Values whose 16-bit codes are not multiples of 257 (so an 8-bit file could not hold them)."""
    v = (torch.arange(h * w * c, dtype=torch.float32).reshape(h, w, c) * 0.0123457 + 0.0031) % 1.0
    return v


def test_save_image_advanced_spec_matches_comfyui():
    info = REG.object_info()["SaveImageAdvanced"]
    assert (info["category"], info["display_name"], info["output_node"]) == ("image", "Save Image (Advanced)", True)
    assert info["output"] == ["IMAGE"] and info["output_name"] == ["images"]
    req = info["input"]["required"]
    assert list(req) == ["images", "filename_prefix", "format"]
    assert req["filename_prefix"][1]["default"] == "ComfyUI"
    kind, opts = req["format"]
    assert kind == "COMFY_DYNAMICCOMBO_V3"
    options = {o["key"]: o["inputs"]["required"] for o in opts["options"]}
    assert list(options) == ["png", "exr", "avif"]
    assert options["png"]["bit_depth"][0] == ["8-bit", "16-bit"]
    assert options["png"]["input_color_space"][0] == ["sRGB"]
    assert options["exr"]["bit_depth"][0] == ["32-bit float"]
    assert options["exr"]["input_color_space"][0] == ["sRGB", "HDR", "linear"]
    avif = options["avif"]
    assert list(avif) == ["bit_depth", "input_color_space", "crf", "save_mode"]
    assert avif["bit_depth"][0] == ["auto", "8-bit YUV420", "10-bit YUV420"]
    assert avif["input_color_space"][0] == ["sRGB", "HDR", "HDR PQ"]
    assert {k: avif["crf"][1][k] for k in ("default", "min", "max")} == {"default": 18, "min": 1, "max": 63}
    mode_kind, mode = avif["save_mode"]
    assert mode_kind == "COMFY_DYNAMICCOMBO_V3" and mode["display_name"] == "save mode"
    assert [o["key"] for o in mode["options"]] == ["still images", "animated"]
    animated = mode["options"][1]["inputs"]["required"]
    assert animated["fps"][1] == {"default": 6.0, "min": 0.01, "max": 1000.0, "step": 0.01}
    assert {k: animated["loop_count"][1][k] for k in ("default", "min", "max")} == {"default": 0, "min": 0, "max": 1000}
    assert info["input"]["hidden"] == {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}


def test_save_image_advanced_png_16bit_keeps_full_precision(ex, tmp_path):
    img = values(6, 5, 3)
    saved = image_save.save_advanced(img[None], tmp_path / "out", "deep/shot", "png", "16-bit", "sRGB",
                                     prompt={"3": {"class_type": "SaveImageAdvanced"}},
                                     extra_pnginfo={"workflow": WORKFLOW})
    assert saved == [{"filename": "shot_00001.png", "subfolder": "deep", "type": "output"}]
    path = tmp_path / "out" / "deep" / "shot_00001.png"
    want = (img * 65535.0).clamp(0, 65535).to(torch.int32).numpy().reshape(6, -1)
    assert (want % 257 != 0).any()                        # values an 8-bit file cannot hold
    got = png_samples(path)
    assert np.array_equal(got, want)
    with Image.open(path) as im:                          # Pillow: a valid RGB PNG whose
        assert im.mode == "RGB" and im.size == (5, 6)     # 8-bit view is the high byte
        assert np.array_equal(np.asarray(im).reshape(6, -1), want >> 8)
        assert json.loads(im.text["prompt"]) == {"3": {"class_type": "SaveImageAdvanced"}}
        assert json.loads(im.text["workflow"]) == WORKFLOW


def test_save_image_advanced_png_16bit_grey_and_8bit_rgba(tmp_path):
    grey = values(4, 3, 1)
    path = tmp_path / "g.png"
    path.write_bytes(image_codecs.encode_png(grey, 16))
    with Image.open(path) as im:                          # Pillow keeps 16-bit grey whole
        assert im.mode == "I;16"
        assert np.array_equal(np.asarray(im), (grey[..., 0] * 65535).to(torch.int32).numpy())
    rgba = values(4, 3, 4)
    path.write_bytes(image_codecs.encode_png(rgba, 8))
    with Image.open(path) as im:
        assert im.mode == "RGBA"
        # ComfyUI's 8-bit rule: 255 x, clamped, truncated
        assert np.array_equal(np.asarray(im), (rgba * 255).to(torch.int32).numpy())
    with pytest.raises(image_codecs.CodecError, match="channel"):
        image_codecs.encode_png(torch.zeros(4, 3, 2), 8)


def test_save_image_advanced_exr_reads_back_linear_with_metadata(tmp_path):
    openexr = pytest.importorskip("OpenEXR")
    img = values(6, 5, 3) * 1.5 - 0.2                     # outside 0..1: EXR keeps it
    text = image_codecs.metadata_items({"1": {"class_type": "X"}}, {"workflow": WORKFLOW})
    for space, primaries in (("linear", "Rec.709"), ("sRGB", "Rec.709"), ("HDR", "Rec.2020")):
        path = tmp_path / f"{space}.exr"
        path.write_bytes(image_codecs.encode_exr(img, space, text))
        f = openexr.File(str(path))
        header = f.header()
        assert json.loads(header["prompt"]) == {"1": {"class_type": "X"}}
        assert json.loads(header["workflow"]) == WORKFLOW
        assert header["gamma"] == 1.0 and "NO_COMPRESSION" in str(header["compression"])
        assert np.allclose(header["chromaticities"], image_codecs.CHROMATICITIES[primaries], atol=1e-7)
        rgb = f.channels()["RGB"].pixels
        assert rgb.dtype == np.float32 and rgb.shape == (6, 5, 3)
        want = image_codecs.TO_LINEAR[space](img).numpy()
        assert np.array_equal(rgb, want)
    rgba = values(2, 3, 4)
    path = tmp_path / "a.exr"
    path.write_bytes(image_codecs.encode_exr(rgba, "sRGB"))
    px = openexr.File(str(path)).channels()["RGBA"].pixels
    assert np.array_equal(px[..., 3], rgba[..., 3].numpy())        # alpha is not transformed


def test_save_image_advanced_colour_transforms_match_closed_forms():
    t = torch.tensor([[0.0, 0.02, 0.04045, 0.5, 1.0]]).T.expand(5, 3).contiguous()
    lin = image_codecs.srgb_to_linear(t)[:, 0]
    assert torch.allclose(lin, torch.tensor([0.0, 0.02 / 12.92, 0.04045 / 12.92,
                                             ((0.5 + 0.055) / 1.055) ** 2.4, 1.0]), atol=1e-7)
    h = image_codecs.hlg_to_linear(torch.tensor([[0.25, 0.5, 0.75, 1.0]]).T.expand(4, 3).contiguous())[:, 0]
    a, b, c = 0.17883277, 0.28466892, 0.55991072928
    ref = [0.25 ** 2 / 3, 0.5 ** 2 / 3] + [(np.exp((e - c) / a) + b) / 12 for e in (0.75, 1.0)]
    assert torch.allclose(h, torch.tensor(ref, dtype=torch.float32), atol=1e-6)
    assert abs(float(h[-1]) - 1.0) < 1e-4                  # HLG 1.0 is scene-linear 1.0


def test_save_image_advanced_in_a_graph_names_files_and_returns_images(ex, tmp_path):
    wf = {"0": call("EmptyImage", width=8, height=6, batch_size=2, color=0x336699),
          "9": call("EmptyImage", width=8, height=6, batch_size=2, color=0xF0A011),
          "1": call("ImageBlend", image1=["0", 0], image2=["9", 0], blend_factor=0.37, blend_mode="normal"),
          "2": call("SaveImageAdvanced", images=["1", 0], filename_prefix="adv_%batch_num%",
                    format="png", **{"format.bit_depth": "16-bit", "format.input_color_space": "sRGB"}),
          "3": call("SaveImageAdvanced", images=["1", 0], filename_prefix="hdr/img", format="exr",
                    **{"format.bit_depth": "32-bit float", "format.input_color_space": "linear"}),
          "4": call("SaveImage", images=["2", 0], filename_prefix="adv_0")}
    report = run(ex, wf)
    out = tmp_path / "out"
    assert report.ui["2"]["images"] == [
        {"filename": "adv_0_00001.png", "subfolder": "", "type": "output"},
        {"filename": "adv_1_00002.png", "subfolder": "", "type": "output"}]
    assert report.ui["3"]["images"][1] == {"filename": "img_00002.exr", "subfolder": "hdr", "type": "output"}
    assert torch.equal(report.values["2"][0], report.values["1"][0])    # images pass through
    got = png_samples(out / "adv_0_00001.png")
    want = (report.values["1"][0][0] * 65535).clamp(0, 65535).to(torch.int32).numpy().reshape(6, -1)
    assert np.array_equal(got, want) and (want % 257 != 0).any()
    with Image.open(out / "adv_1_00002.png") as im:
        assert set(im.text) == {"prompt", "workflow"}
        assert json.loads(im.text["prompt"])["2"]["class_type"] == "SaveImageAdvanced"
    # a second run continues the counter past every file of that stem (SaveImage's included)
    saved = [f.name for f in out.iterdir() if f.name.startswith("adv_0")]
    assert sorted(saved) == ["adv_0_00001.png", "adv_0_00002_.png", "adv_0_00003_.png"]
    wf["2"]["inputs"]["filename_prefix"] = "adv_0"
    wf.pop("4")
    ex2 = Executor(REG, ex.env, cache=OutputCache(max_bytes=1 << 24))
    again = run(ex2, {k: wf[k] for k in ("0", "9", "1", "2")})
    assert [i["filename"] for i in again.ui["2"]["images"]] == ["adv_0_00004.png", "adv_0_00005.png"]


def test_save_image_advanced_avif_validation():
    wf = {"1": call("EmptyImage", width=8, height=8, batch_size=1, color=0),
          "2": call("SaveImageAdvanced", images=["1", 0], filename_prefix="a", format="avif",
                    **{"format.bit_depth": "auto", "format.input_color_space": "sRGB", "format.crf": 18,
                       "format.save_mode": "animated", "format.save_mode.fps": 8.0,
                       "format.save_mode.loop_count": 0})}
    # written now (tests/test_save_image_avif.py); what Pillow cannot honour is refused there
    assert validate(load_workflow(wf, REG).prompt, REG).errors == []
    # the nested DynamicCombo is checked like any other: a bad fps is named with its full path
    wf["2"]["inputs"]["format.save_mode.fps"] = 0.0
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.input_name, p.type) == ("format.save_mode.fps", "value_smaller_than_min")
    wf["2"]["inputs"]["format.save_mode.fpz"] = 1.0
    names = {p.input_name for p in validate(load_workflow(wf, REG).prompt, REG).errors}
    assert "format.save_mode.fpz" in names
