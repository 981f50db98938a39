"""ComfyUI nodes_text_overlay.py (1df2885): `TextOverlay`. Spec against ComfyUI's declaration;
where the glyphs land for each position / align; colours, outline and RGBA compositing; the
`fonts` folder listed and used through a graph run."""

from __future__ import annotations

import pytest
import torch
from PIL import ImageFont

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.helpers import folders, text_overlay
from mixgraph.ui import api

REG = api.default_registry()
H, W = 64, 128


def black(b=1, c=3):
    return torch.zeros(b, H, W, c)


def drawn(img: torch.Tensor) -> torch.Tensor:
    """[H, W] bool: the pixels the overlay touched in frame 0 (over a black frame)."""
    return img[0, ..., :3].abs().sum(-1) > 0


def test_text_overlay_spec_matches_comfyui():
    info = REG.object_info()["TextOverlay"]
    assert (info["category"], info["display_name"]) == ("text", "Draw Text Overlay")
    assert info["output"] == ["IMAGE"] and info["output_name"] == ["images"]
    req = info["input"]["required"]
    assert list(req) == ["images", "text", "font", "font_size", "color", "position", "align", "outline"]
    assert req["text"][0] == "STRING" and req["text"][1]["multiline"] is True and req["text"][1]["default"] == ""
    assert req["font"] == [[]]   # no fonts folder here
    assert {k: req["font_size"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 5.0, "min": 0.5, "max": 50.0, "step": 0.5}
    assert req["color"] == ["COLOR", {"default": "#ffffff", "socketless": True, "tooltip": "Color of the text."}]
    assert req["position"] == [["top", "bottom"]] and req["align"] == [["left", "center", "right"]]
    assert req["outline"] == ["BOOLEAN", {"default": True,
                                          "tooltip": "Draw a black outline around the text."}]


def test_text_overlay_empty_text_returns_input_unchanged():
    img = torch.rand(2, H, W, 3)
    assert text_overlay.overlay_text(img, "  \n ", None, 5.0, "#ffffff", "top", "left", True) is img


@pytest.mark.parametrize("position", ["top", "bottom"])
@pytest.mark.parametrize("align", ["left", "center", "right"])
def test_text_overlay_places_text_at_anchor(position, align):
    out = text_overlay.overlay_text(black(), "Hi", None, 20.0, "#ffffff", position, align, False)
    mask = drawn(out)
    assert mask.any()
    rows = mask.any(1).nonzero().flatten()
    cols = mask.any(0).nonzero().flatten()
    margin = round(0.01 * min(H, W))   # 1
    if position == "top":
        assert rows.min() >= margin and rows.max() < H // 2
    else:
        assert rows.max() <= H - 1 - margin + 1 and rows.min() >= H // 2
    centre = (cols.min() + cols.max()).item() / 2
    if align == "left":
        assert cols.min() <= margin + 3 and cols.max() < W // 2
    elif align == "right":
        assert cols.max() >= W - margin - 4 and cols.min() > W // 2
    else:
        assert abs(centre - W / 2) <= 3


def test_text_overlay_colour_outline_and_batch():
    img = black(b=2)
    out = text_overlay.overlay_text(img, "Hello", None, 25.0, "#ff0000", "top", "left", False)
    assert out.shape == img.shape and torch.equal(out[0], out[1])   # one layer for every frame
    hit = drawn(out)
    px = out[0][hit]
    assert (px[:, 1] == 0).all() and (px[:, 2] == 0).all() and px[:, 0].max() == 1.0
    # the outline is black: over a white frame it darkens pixels around the red glyphs
    white = torch.ones(1, H, W, 3)
    with_outline = text_overlay.overlay_text(white, "Hello", None, 25.0, "#ff0000", "top", "left", True)
    dark = (with_outline[0].sum(-1) < 0.5)
    assert dark.any()
    # literal "\n" in the prompt is a line break: two lines are taller than one
    one = drawn(text_overlay.overlay_text(black(), "AB", None, 10.0, "#fff", "top", "left", False))
    two = drawn(text_overlay.overlay_text(black(), "A\\nB", None, 10.0, "#fff", "top", "left", False))
    assert two.any(1).nonzero().max() > one.any(1).nonzero().max()


def test_text_overlay_rgba_is_source_over():
    img = torch.zeros(1, H, W, 4)
    img[..., 3] = 0.0   # fully transparent frame
    out = text_overlay.overlay_text(img, "Hi", None, 30.0, "#00ff00", "top", "left", False)
    a = out[0, ..., 3]
    assert a.max() == 1.0 and a.min() == 0.0
    opaque = a > 0.99
    assert torch.allclose(out[0][opaque][:, :3], torch.tensor([0.0, 1.0, 0.0]).expand(int(opaque.sum()), 3))
    # over an opaque frame alpha stays 1
    solid = torch.ones(1, H, W, 4) * 0.5
    solid[..., 3] = 1.0
    out2 = text_overlay.overlay_text(solid, "Hi", None, 30.0, "#00ff00", "top", "left", False)
    assert torch.allclose(out2[..., 3], torch.ones(1, H, W))


def test_text_overlay_wraps_long_words_to_the_width():
    font = ImageFont.load_default(size=12)
    lines = text_overlay.wrap_lines("a " + "W" * 40 + " end", font, 60)
    assert lines[0] == "a" and lines[-1].endswith("end")
    assert all(font.getlength(line) <= 60 for line in lines)
    assert "".join(line.replace(" ", "") for line in lines) == "a" + "W" * 40 + "end"
    assert len(lines) >= 4   # the 40 W's (~450 px at this size) are cut into several lines


def test_text_overlay_bad_colour_is_named():
    with pytest.raises(text_overlay.TextOverlayError, match="color"):
        text_overlay.overlay_text(black(), "x", None, 5.0, "#12zz00", "top", "left", True)


def test_text_overlay_font_from_fonts_folder_in_a_graph(tmp_path):
    models = tmp_path / "models"
    # a real TrueType file: PIL's built-in font, written out
    (tmp_path / "fonts").mkdir()
    (tmp_path / "fonts" / "aileron.ttf").write_bytes(ImageFont.load_default(size=10).font_bytes)
    (models / "fonts").mkdir(parents=True)
    (models / "fonts" / "notes.txt").write_text("not a font")
    env = Env.from_args(models=models, output=tmp_path / "out", temp=tmp_path / "temp",
                        input=tmp_path / "in")
    assert folders.list_files(env, "fonts") == ["aileron.ttf"]
    assert REG.object_info(env)["TextOverlay"]["input"]["required"]["font"] == [["aileron.ttf"]]
    ex = Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))
    wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": W, "height": H, "batch_size": 1, "color": 0}},
          "2": {"class_type": "TextOverlay", "inputs": {
              "images": ["1", 0], "text": "Hi", "font": "aileron.ttf", "font_size": 20.0,
              "color": "#ffffff", "position": "bottom", "align": "right", "outline": False}},
          "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}
    result = api.run(wf, executor=ex)
    got = result.outputs["2"][0]
    ref = text_overlay.overlay_text(black(), "Hi", tmp_path / "fonts" / "aileron.ttf", 20.0, "#ffffff",
                                    "bottom", "right", False)
    assert torch.allclose(got, ref) and drawn(got).any()
