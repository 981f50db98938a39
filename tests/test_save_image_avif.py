"""SaveImageAdvanced's avif format (ComfyUI nodes_images.py, 015e604) written with Pillow: read
back by Pillow's decoder (dav1d) and compared with the input within lossy-coding tolerances that
shrink as crf falls, ComfyUI's EXIF metadata (prompt under 0x0110, workflow under 0x010F), still
images one file each and an animated batch in one looping file, and the choices Pillow cannot
honour (10-bit, HDR colour spaces, a finite loop count) refused at validation with their input."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence, features

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers import image_codecs, image_save
from mixgraph.ui import api

pytestmark = pytest.mark.skipif(not features.check("avif"), reason="Pillow without AVIF")

REG = api.default_registry()
WORKFLOW = {"nodes": [], "links": [], "version": 0.4}
PROMPT = {"2": {"class_type": "SaveImageAdvanced"}}


def smooth(h=48, w=64, shift=0.0):
    """A smooth RGB gradient [H, W, 3] in 0..1 (lossy coding keeps it close)."""
    y = torch.linspace(0, 1, h)[:, None].expand(h, w)
    x = torch.linspace(0, 1, w)[None, :].expand(h, w)
    return torch.stack([0.15 + 0.7 * x, 0.2 + 0.6 * y, (0.5 + 0.4 * torch.sin(3 * x + 2 * y + shift)) * 0.9], -1)


def quantized(img):
    return (img * 255).clamp(0, 255).to(torch.int32).numpy()


def read(path, as_sequence=False):
    """(RGB frames, EXIF tags, format); ``as_sequence``: a copy with the `avis` major brand
    restored, so libavif decodes the animation track (the file says `avif`, as ComfyUI's)."""
    if as_sequence:
        data = bytearray(path.read_bytes())
        assert data[8:12] == b"avif" and b"avis" in data[16:struct.unpack_from(">I", data)[0]]
        data[8:12] = b"avis"
        path = path.with_suffix(".seq.avif")
        path.write_bytes(bytes(data))
    with Image.open(path) as im:
        frames = [np.asarray(f.convert("RGB")).astype(np.int64) for f in ImageSequence.Iterator(im)]
        return frames, dict(im.getexif()), im.format


def boxes(data, start=0, end=None):
    end = len(data) if end is None else end
    out, pos = {}, start
    while pos < end:
        size, kind = struct.unpack_from(">I4s", data, pos)
        out.setdefault(kind, (pos, size))
        pos += size
    return out


def test_save_image_avif_crf_is_the_av1_quantizer():
    for crf in range(0, 64):
        q = image_codecs.avif_quality_for_crf(crf)
        assert ((100 - q) * 63 + 50) // 100 == crf      # libavif's quality -> quantizer mapping
    with pytest.raises(image_codecs.CodecError):
        image_codecs.avif_quality_for_crf(64)


def test_save_image_avif_still_reads_back_within_tolerance(tmp_path):
    img = smooth()
    text = image_codecs.metadata_items(PROMPT, {"workflow": WORKFLOW})
    errors, sizes = {}, {}
    for crf in (1, 18, 50):
        path = tmp_path / f"{crf}.avif"
        path.write_bytes(image_codecs.encode_avif([img], crf, None, text))
        (got,), exif, fmt = read(path)
        assert fmt == "AVIF" and got.shape == (48, 64, 3)
        errors[crf] = np.abs(got - quantized(img)).mean()
        sizes[crf] = path.stat().st_size
        assert exif[0x0110] == "prompt:" + json.dumps(PROMPT)
        assert exif[0x010F] == "workflow:" + json.dumps(WORKFLOW)
    # near-lossless at crf 1 (8-bit 4:2:0 limited range), coarser as crf rises
    assert errors[1] < 1.5 and errors[18] < 3.0 and errors[50] < 12.0
    assert errors[1] < errors[50] and sizes[1] > sizes[18] > sizes[50]


def test_save_image_avif_colour_tags_are_srgb_limited_range(tmp_path):
    data = image_codecs.encode_avif([smooth(16, 16)], 18)
    assert data[4:12] == b"ftypavif"
    i = data.index(b"colrnclx")
    primaries, transfer, matrix, full = struct.unpack_from(">HHHB", data, i + 8)
    assert (primaries, transfer, full >> 7) == (1, 13, 0)   # BT.709, sRGB, limited range


def test_save_image_avif_grey_is_written_as_rgb_and_rgba_is_refused(tmp_path):
    grey = smooth()[..., :1]
    path = tmp_path / "g.avif"
    path.write_bytes(image_codecs.encode_avif([grey], 1))
    (got,), _, _ = read(path)
    want = quantized(grey)
    assert np.abs(got - want).mean() < 1.5
    assert np.abs(got[..., 0] - got[..., 2]).max() <= 2      # neutral chroma
    with pytest.raises(image_codecs.CodecError, match="RGBA"):
        image_codecs.encode_avif([torch.zeros(4, 4, 4)], 18)


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))


def _wf(mode="still images", **extra):
    inputs = {"format.bit_depth": "auto", "format.input_color_space": "sRGB", "format.crf": 10,
              "format.save_mode": mode}
    if mode == "animated":
        inputs |= {"format.save_mode.fps": 4.0, "format.save_mode.loop_count": 0}
    inputs |= extra
    return {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 3,
                                                         "color": 0x3366AA}},
            "2": {"class_type": "SaveImageAdvanced",
                  "inputs": {"images": ["1", 0], "filename_prefix": "av/img_%batch_num%",
                             "format": "avif", **inputs}}}


def _run(ex, wf):
    return ex.run(load_workflow(wf, REG), extra_data={"extra_pnginfo": {"workflow": WORKFLOW}})


def test_save_image_avif_still_images_in_a_graph(ex, tmp_path):
    report = _run(ex, _wf())
    assert report.ui["2"]["images"] == [
        {"filename": f"img_{i}_{i + 1:05}.avif", "subfolder": "av", "type": "output"} for i in range(3)]
    assert "animated" not in report.ui["2"]
    colour = np.array([0x33, 0x66, 0xAA])
    for i in range(3):
        (got,), exif, _ = read(tmp_path / "out" / "av" / f"img_{i}_{i + 1:05}.avif")
        assert np.abs(got - colour).max() <= 2
        assert json.loads(exif[0x0110].removeprefix("prompt:"))["2"]["class_type"] == "SaveImageAdvanced"
        assert json.loads(exif[0x010F].removeprefix("workflow:")) == WORKFLOW


def test_save_image_avif_animated_batch_is_one_looping_file(tmp_path):
    frames = [smooth(shift=s) for s in (0.0, 1.0, 2.0)]
    saved = image_save.save_advanced(torch.stack(frames), tmp_path, "anim", "avif", "8-bit YUV420", "sRGB",
                                     prompt=PROMPT, extra_pnginfo={"workflow": WORKFLOW},
                                     avif={"format": "avif", "crf": 5,
                                           "save_mode": {"save_mode": "animated", "fps": 4.0, "loop_count": 0}})
    assert saved == [{"filename": "anim_00001.avif", "subfolder": "", "type": "output"}]
    path = tmp_path / "anim_00001.avif"
    data = path.read_bytes()
    assert data[8:12] == b"avif"                     # major brand, as ComfyUI rewrites it
    i = data.index(b"elst")                          # the edit list: repeat (loop forever)
    assert struct.unpack_from(">I", data, i + 4)[0] & 1 == 1
    (first,), exif, _ = read(path)                   # libavif: the primary item
    assert np.abs(first - quantized(frames[0])).mean() < 2.0
    assert exif[0x0110] == "prompt:" + json.dumps(PROMPT)
    got, exif, _ = read(path, as_sequence=True)
    assert len(got) == 3
    for g, f in zip(got, frames):
        assert np.abs(g - quantized(f)).mean() < 2.0
    assert exif[0x010F] == "workflow:" + json.dumps(WORKFLOW)
    with Image.open(path.with_suffix(".seq.avif")) as im:
        im.seek(1)
        im.load()
        assert (im.info["timestamp"], im.info["duration"]) == (250, 250)   # 1000 / fps ms
    # without metadata the file keeps libavif's avis major brand
    plain = image_codecs.encode_avif(frames, 5, 4.0)
    assert plain[8:12] == b"avis"


def test_save_image_avif_animated_in_a_graph_flags_animation(ex, tmp_path):
    report = _run(ex, _wf("animated"))
    assert report.ui["2"]["images"] == [{"filename": "img_0_00001.avif", "subfolder": "av", "type": "output"}]
    assert report.ui["2"]["animated"] == (True,)
    got, _, _ = read(tmp_path / "out" / "av" / "img_0_00001.avif", as_sequence=True)
    assert len(got) == 3


@pytest.mark.parametrize("inputs, name, words", [
    ({"format.bit_depth": "10-bit YUV420"}, "format.bit_depth", "8 bits"),
    ({"format.input_color_space": "HDR"}, "format.input_color_space", "HLG"),
    ({"format.input_color_space": "HDR PQ", "format.bit_depth": "8-bit YUV420"}, "format.input_color_space", "PQ"),
])
def test_save_image_avif_refuses_what_pillow_cannot_write(inputs, name, words):
    (p,) = validate(load_workflow(_wf(**inputs), REG).prompt, REG).errors
    assert (p.node_id, p.input_name, p.type) == ("2", name, "custom_validation_failed")
    assert words in p.details


def test_save_image_avif_refuses_a_finite_loop_count_only_when_animated():
    (p,) = validate(load_workflow(_wf("animated", **{"format.save_mode.loop_count": 3}), REG).prompt, REG).errors
    assert (p.input_name, p.type) == ("format.save_mode.loop_count", "custom_validation_failed")
    assert "loops forever" in p.details
    assert validate(load_workflow(_wf("animated"), REG).prompt, REG).errors == []
    assert validate(load_workflow(_wf("still images", **{"format.bit_depth": "8-bit YUV420"}), REG).prompt,
                    REG).errors == []
