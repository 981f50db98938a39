"""ImageHistogram and CurveEditor (ComfyUI 0.22+ colour-curve core nodes): specs as the editor
reads them, histograms against counts made by hand, the CURVE widget value through an API prompt
and a UI-format workflow shaped as the official colour-adjustment template saves them."""

from __future__ import annotations

import json

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.graph.validate import validate
from mixgraph.nodes.helpers.colour import curve_ops
from mixgraph.ui import api

REG = api.default_registry()
CURVE = {"points": [[0, 0], [0.39, 0.53], [0.74, 0.45], [1, 1]], "interpolation": "monotone_cubic"}


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp", input=tmp_path / "in")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))


def test_specs_match_the_editor():
    info = REG.object_info()
    hist = info["ImageHistogram"]
    assert hist["display_name"] == "Image Histogram"
    assert hist["input"]["required"] == {"image": ["IMAGE"]}
    assert hist["output"] == ["HISTOGRAM"] * 5
    assert hist["output_name"] == ["rgb", "luminance", "red", "green", "blue"]
    curve = info["CurveEditor"]
    assert curve["display_name"] == "Curve Editor"
    assert curve["input"]["required"]["curve"] == [
        "CURVE", {"default": {"points": [[0.0, 0.0], [1.0, 1.0]], "interpolation": "monotone_cubic"}}]
    assert curve["input"]["optional"] == {"histogram": ["HISTOGRAM"]}
    assert (curve["output"], curve["output_name"]) == (["CURVE"], ["curve"])


def test_histograms_count_8_bit_levels():
    img = torch.zeros(2, 2, 3, 3)
    img[0, 0, 0] = torch.tensor([1.0, 0.0, 0.5])        # red 255, green 0, blue round(127.5) = 128
    img[1, 1, 2] = torch.tensor([2.0, -1.0, 1.0])        # clamped: 255, 0, 255
    h = curve_ops.histograms(img)
    assert all(len(v) == 256 and sum(v) == 12 for k, v in h.items() if k != "rgb")
    assert h["red"][255] == 2 and h["red"][0] == 10
    assert h["green"][0] == 12
    assert h["blue"][128] == 1 and h["blue"][255] == 1 and h["blue"][0] == 10
    assert h["rgb"] == tuple(r + g + b for r, g, b in zip(h["red"], h["green"], h["blue"]))
    assert sum(h["rgb"]) == 36
    # Rec. 709 weights: (1, 0, .5) -> 0.2487 -> level 63; (1, 0, 1) -> 0.2848 -> level 73
    assert h["luminance"][63] == h["luminance"][73] == 1 and h["luminance"][0] == 10
    lum = curve_ops.histograms(torch.tensor([1.0, 0.0, 0.0]).reshape(1, 1, 1, 3))["luminance"]
    assert lum[54] == 1
    grey = curve_ops.histograms(torch.full((1, 2, 2, 1), 0.5))     # one channel counts as grey
    assert grey["red"][128] == grey["green"][128] == grey["blue"][128] == 4
    rgba = curve_ops.histograms(torch.ones(1, 1, 1, 4))             # alpha ignored
    assert sum(rgba["rgb"]) == 3


def test_curve_values_are_checked():
    assert curve_ops.parse_curve({"points": [[1, 1], [0, 0]], "interpolation": "linear"}) == {
        "points": [[0.0, 0.0], [1.0, 1.0]], "interpolation": "linear"}
    for bad, words in [([0, 1], "dict"), ({"points": [[0, 0]], "interpolation": "cubic"}, "interpolation"),
                       ({"points": [], "interpolation": "linear"}, "non-empty"),
                       ({"points": [[0, "a"]], "interpolation": "linear"}, "point 0"),
                       ({"points": [[0, float("nan")]], "interpolation": "linear"}, "finite")]:
        with pytest.raises(curve_ops.CurveError, match=words):
            curve_ops.parse_curve(bad)
    v = validate(load_workflow({"1": call("CurveEditor", curve={"points": [[0, 0]], "interpolation": "x"}),
                                "2": call("PreviewAny", source=["1", 0])}, REG).prompt, REG)
    assert not v.clean and "interpolation" in json.dumps(v.node_errors["1"])


def test_histogram_to_curve_editor_runs_and_shows_the_histogram(ex):
    img = torch.zeros(1, 4, 4, 3)
    img[0, :2] = 1.0
    wf = {"1": call("EmptyImage", width=4, height=4, batch_size=1, color=0xFF0000),
          "2": call("ImageHistogram", image=["1", 0]),
          "3": call("CurveEditor", curve=CURVE, histogram=["2", 2]),
          "4": call("CurveEditor", curve=["3", 0]),                  # a linked curve passes through
          "5": call("PreviewAny", source=["4", 0])}
    result = api.run(wf, executor=ex)
    red = result.outputs["2"][2]
    assert len(red) == 256 and red[255] == 16
    assert result.report.ui["3"]["histogram"] == list(red)
    assert "4" not in result.report.ui or "histogram" not in result.report.ui["4"]
    assert result.outputs["4"][0] == curve_ops.parse_curve(CURVE)


def test_ui_format_template_shape(ex):
    """The colour-adjustment template's nodes as the editor saves them: the curve widget's value
    is the one entry of `widgets_values`; the histogram input is linked."""
    ui = {"last_node_id": 4, "last_link_id": 3, "nodes": [
        {"id": 1, "type": "EmptyImage", "mode": 0, "inputs": [], "outputs": [
            {"name": "IMAGE", "type": "IMAGE", "links": [1]}], "widgets_values": [4, 4, 1, 0]},
        {"id": 2, "type": "ImageHistogram", "mode": 0,
         "inputs": [{"name": "image", "type": "IMAGE", "link": 1}],
         "outputs": [{"name": n, "type": "HISTOGRAM", "links": [2] if n == "rgb" else []}
                     for n in ("rgb", "luminance", "red", "green", "blue")], "widgets_values": []},
        {"id": 3, "type": "CurveEditor", "mode": 0, "inputs": [
            {"name": "histogram", "shape": 7, "type": "HISTOGRAM", "link": 2},
            {"name": "curve", "type": "CURVE", "widget": {"name": "curve"}, "link": None}],
         "outputs": [{"name": "curve", "type": "CURVE", "links": [3]}], "widgets_values": [CURVE]},
        {"id": 4, "type": "PreviewAny", "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 3}],
         "outputs": [{"name": "STRING", "type": "STRING", "links": []}], "widgets_values": []}],
        "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "HISTOGRAM"], [3, 3, 0, 4, 0, "CURVE"]],
        "groups": [], "extra": {}, "version": 0.4}
    wf = load_workflow(ui, REG)
    assert wf.prompt["3"].inputs["curve"] == CURVE
    result = api.run(wf, executor=ex)
    assert result.report.ui["3"]["histogram"][0] == 48           # 16 black pixels x 3 channels
    assert result.outputs["3"][0]["points"][1] == [0.39, 0.53]


def test_seed_and_colour_picker(ex):
    info = REG.object_info()
    seed = info["SeedNode"]
    assert (seed["display_name"], seed["output"], seed["output_name"]) == ("Seed", ["INT"], ["seed"])
    assert seed["input"]["required"]["seed"][1]["control_after_generate"] is True
    pick = info["ColorToRGBInt"]
    assert pick["display_name"] == "Color Picker"
    assert (pick["output"], pick["output_name"]) == (["INT", "COLOR", "FLOAT"], ["rgb_int", "hex", "alpha"])
    assert pick["input"]["required"]["color"] == ["COLOR", {"default": "#ffffff"}]
    wf = {"1": call("ColorToRGBInt", color="#ff8000"), "2": call("ColorToRGBInt", color="#00000080"),
          "3": call("SeedNode", seed=42),
          "4": call("PreviewAny", source=["1", 0]), "5": call("PreviewAny", source=["2", 2]),
          "6": call("PreviewAny", source=["3", 0])}
    result = api.run(wf, executor=ex)
    assert result.outputs["1"] == (0xFF8000, "#ff8000", 1.0)
    assert result.outputs["2"][0] == 0 and result.outputs["2"][2] == pytest.approx(128 / 255)
    assert result.outputs["3"] == (42,)
    v = validate(load_workflow({"1": call("ColorToRGBInt", color="#12"),
                                "2": call("PreviewAny", source=["1", 0])}, REG).prompt, REG)
    assert not v.clean and "colour '#12'" in json.dumps(v.node_errors["1"])


def test_nodes_known_by_name_are_refused_with_the_reason():
    def error(ct):
        v = validate(load_workflow({"1": call(ct), "2": call("PreviewAny", source=["1", 0])}, REG).prompt, REG)
        return v.node_errors["1"]["errors"][0]
    e = error("FluxProUltraImageNode")
    assert e["type"] == "invalid_prompt"
    assert e["message"].startswith("Cannot execute because node FluxProUltraImageNode is not supported yet: "
                                   "it is a ComfyUI partner (API) node")
    assert "OpenGL" in error("GLSLShader")["message"]
    assert "LTX-Video" in error("LTXVConditioning")["message"]
    assert "audio" in error("LoadAudio")["message"]
    assert error("NoSuchNode")["message"] == "Cannot execute because node NoSuchNode does not exist."
    assert REG.refusal("KSampler") is None                       # registered names are never refused


def test_save_and_preview_nodes_pass_their_input_on(ex):
    """Today's ComfyUI gives its save / preview nodes an output that passes the input on (the
    frontend's node definitions; templates link SaveImage -> ImageCompare, SaveVideo ->
    GetVideoComponents)."""
    info = REG.object_info()
    for name, out, out_name in (("SaveImage", "IMAGE", "images"), ("PreviewImage", "IMAGE", "images"),
                                ("SaveAnimatedWEBP", "IMAGE", "images"), ("SaveAnimatedPNG", "IMAGE", "images"),
                                ("SaveWEBM", "IMAGE", "images"), ("SaveVideo", "VIDEO", "video"),
                                ("SaveLatent", "LATENT", "samples")):
        assert (info[name]["output"], info[name]["output_name"]) == ([out], [out_name]), name
        assert info[name]["output_node"] is True
    wf = {"1": call("EmptyImage", width=4, height=4, batch_size=1, color=0x00FF00),
          "2": call("SaveImage", images=["1", 0], filename_prefix="pass"),
          "3": call("PreviewImage", images=["2", 0]),
          "4": call("ImageInvert", image=["3", 0]),
          "5": call("PreviewAny", source=["4", 0])}
    result = api.run(wf, executor=ex)
    assert result.outputs["2"][0] is result.outputs["1"][0]
    assert result.report.ui["2"]["images"][0]["type"] == "output"
    assert torch.equal(result.outputs["4"][0][0, 0, 0], torch.tensor([1.0, 0.0, 1.0]))
