"""ComfyUI 0.38.1's ResizeImageMaskNode: its DynamicCombo spec, the size each resize_type gives
(ComfyUI's arithmetic, half-to-even rounding), hand-computed pixels, and graph runs that validate
the chosen option's sub-inputs."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.prompt import Link
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers import resize_ops
from mixgraph.ui import api

REG = api.default_registry()


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


def image(h, w, b=1, c=3):
    return torch.arange(b * h * w * c, dtype=torch.float32).reshape(b, h, w, c) / (b * h * w * c)


def resize(x, key, method="nearest-exact", **subs):
    return resize_ops.resize(x, {"resize_type": key, **subs}, method)


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 22))


def test_resize_image_mask_spec_matches_comfyui():
    info = REG.object_info()["ResizeImageMaskNode"]
    req = info["input"]["required"]
    assert list(req) == ["input", "resize_type", "scale_method"]
    assert req["input"][1]["template"] == {"template_id": "input_type", "allowed_types": "IMAGE,MASK"}
    options = req["resize_type"][1]["options"]
    assert [o["key"] for o in options] == list(resize_ops.RESIZE_TYPES)
    subs = {o["key"]: list(o["inputs"]["required"]) for o in options}
    assert subs["scale dimensions"] == ["width", "height", "crop"]
    assert subs["match size"] == ["match", "crop"] and subs["scale to multiple"] == ["multiple"]
    dims = options[0]["inputs"]["required"]
    assert dims["width"][1]["default"] == 512 and dims["width"][1]["min"] == 0
    assert dims["crop"][0] == ["disabled", "center"] and dims["crop"][1]["default"] == "center"
    mult = options[1]["inputs"]["required"]["multiplier"][1]
    assert (mult["default"], mult["min"], mult["max"]) == (1.0, 0.01, 8.0)
    assert options[8]["inputs"]["required"]["multiple"][1]["min"] == 1
    assert req["scale_method"][0] == ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
    assert req["scale_method"][1]["default"] == "area"
    assert info["output"] == ["COMFY_MATCHTYPE_V3"] and info["output_name"] == ["resized"]
    assert info["output_matchtypes"] == ["input_type"] and info["category"] == "transform"


def test_resize_image_mask_sizes_follow_comfyui_arithmetic():
    x = image(6, 9)
    assert resize(x, "scale longer dimension", longer_size=12).shape == (1, 8, 12, 3)
    assert resize(x, "scale shorter dimension", shorter_size=4).shape == (1, 4, 6, 3)
    assert resize(image(5, 5), "scale longer dimension", longer_size=3).shape == (1, 3, 3, 3)
    assert resize(image(3, 5), "scale by multiplier", multiplier=1.5).shape == (1, 4, 8, 3)  # 4.5->4, 7.5->8
    assert resize(image(10, 20), "scale width", width=10).shape == (1, 5, 10, 3)
    assert resize(image(10, 20), "scale height", height=5).shape == (1, 5, 10, 3)
    assert resize(image(10, 20), "scale dimensions", width=0, height=0, crop="disabled").shape == (1, 10, 20, 3)
    # 0.01 MP = int(10485.76) pixels; sqrt(10485 / 4096) * 64 = 102.398 -> 102
    assert resize(image(64, 64), "scale total pixels", megapixels=0.01).shape == (1, 102, 102, 3)


def test_resize_image_mask_nearest_and_centre_crop_pixels():
    x = torch.tensor([[[1.0, 2.0]]])                       # a 1x2 MASK
    out = resize(x, "scale by multiplier", multiplier=2.0)
    assert torch.equal(out, torch.tensor([[[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]]))
    wide = image(4, 8)
    ref = image(4, 4)
    got = resize(wide, "match size", match=ref, crop="center")
    assert torch.equal(got, wide[:, :, 2:6])               # centre crop, then an identity resize
    stretched = resize(wide, "scale dimensions", width=4, height=4, crop="disabled")
    assert torch.equal(stretched, wide[:, :, 1::2])        # nearest-exact: source column floor((i + .5) * 2)


def test_resize_image_mask_scale_to_multiple_covers_then_crops():
    x = image(10, 13)                                      # target 8x12: scaled to 10x12, crop rows 1..9
    out = resize(x, "scale to multiple", multiple=4, method="bilinear")
    full = resize_ops.resize_to(x, 12, 10, "bilinear")
    assert out.shape == (1, 8, 12, 3) and torch.allclose(out, full[:, 1:9], atol=0)
    same = image(8, 8)
    assert resize(same, "scale to multiple", multiple=4) is same
    assert resize(same, "scale to multiple", multiple=1) is same


def test_resize_image_mask_area_downscale_averages():
    x = torch.tensor([[[0.0, 1.0, 2.0, 3.0]]]).expand(1, 2, 4).contiguous()
    out = resize(x, "scale dimensions", method="area", width=2, height=1, crop="disabled")
    assert torch.allclose(out, torch.tensor([[[0.5, 2.5]]]), atol=1e-6)


def test_resize_image_mask_in_a_graph_mask_and_image(ex):
    wf = {"1": call("EmptyImage", width=16, height=8, batch_size=1, color=0xFF0000),
          "2": call("ResizeImageMaskNode", input=["1", 0], scale_method="bilinear",
                    resize_type="scale longer dimension", **{"resize_type.longer_size": 32}),
          "3": call("SolidMask", value=0.5, width=6, height=4),
          "4": call("ResizeImageMaskNode", input=["3", 0], scale_method="area",
                    resize_type="match size", **{"resize_type.match": ["1", 0],
                                                 "resize_type.crop": "disabled"}),
          "5": call("PreviewImage", images=["2", 0]), "6": call("MaskToImage", mask=["4", 0]),
          "7": call("PreviewImage", images=["6", 0])}
    r = api.run(wf, executor=ex)
    img, mask = r.outputs["2"][0], r.outputs["4"][0]
    assert img.shape == (1, 16, 32, 3) and torch.allclose(img[..., 0], torch.ones(1, 16, 32))
    assert mask.shape == (1, 8, 16) and torch.allclose(mask, torch.full((1, 8, 16), 0.5))


def test_resize_image_mask_validation_names_node_and_sub_input():
    wf = {"1": call("EmptyImage", width=16, height=8, batch_size=1, color=0),
          "2": call("ResizeImageMaskNode", input=["1", 0], scale_method="area",
                    resize_type="scale by multiplier", **{"resize_type.multiplier": 9.0}),
          "3": call("PreviewImage", images=["2", 0])}
    v = validate(load_workflow(wf, REG).prompt, REG)
    (p,) = v.errors
    assert (p.node_id, p.input_name, p.type) == ("2", "resize_type.multiplier", "value_bigger_than_max")
    wf["2"]["inputs"] = {"input": ["1", 0], "scale_method": "area", "resize_type": "match size",
                         "resize_type.crop": "center"}
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.input_name, p.type) == ("resize_type.match", "required_input_missing")
    wf["2"]["inputs"]["resize_type.match"] = ["1", 0]
    wf["3"] = call("SolidMask", value=1.0, width=4, height=4)
    wf["4"] = call("PreviewImage", images=["2", 0])
    wf["2"]["inputs"]["input"] = ["3", 0]                  # a MASK resized: PreviewImage wants IMAGE
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.node_id, p.type) == ("4", "return_type_mismatch") and "MASK" in p.details


def _ui(resize_widgets, resize_inputs=(), extra_links=()):
    return {"nodes": [
        {"id": 1, "type": "EmptyImage", "mode": 0, "inputs": [], "widgets_values": [16, 8, 1, 0],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [1, 3]}]},
        {"id": 2, "type": "ResizeImageMaskNode", "mode": 0, "widgets_values": resize_widgets,
         "inputs": [{"name": "input", "type": "COMFY_MATCHTYPE_V3", "link": 1}, *resize_inputs],
         "outputs": [{"name": "resized", "type": "IMAGE", "links": [2]}]},
        {"id": 3, "type": "PreviewImage", "mode": 0, "widgets_values": [],
         "inputs": [{"name": "images", "type": "IMAGE", "link": 2}], "outputs": []}],
        "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"], *extra_links]}


def test_resize_image_mask_ui_widgets_values_carry_the_chosen_options_widgets():
    prompt = load_workflow(_ui(["scale dimensions", 100, 50, "disabled", "bicubic"]), REG).prompt
    assert prompt["2"].inputs == {"input": Link("1", 0), "resize_type": "scale dimensions",
                                  "resize_type.width": 100, "resize_type.height": 50,
                                  "resize_type.crop": "disabled", "scale_method": "bicubic"}
    assert validate(prompt, REG).clean
    prompt = load_workflow(_ui(["scale by multiplier", 2.0, "area"]), REG).prompt
    assert prompt["2"].inputs["resize_type.multiplier"] == 2.0
    assert prompt["2"].inputs["scale_method"] == "area"
    ui = _ui(["match size", "center", "lanczos"],
             [{"name": "resize_type.match", "type": "IMAGE,MASK", "link": 3}],
             [[3, 1, 0, 2, 1, "IMAGE"]])
    prompt = load_workflow(ui, REG).prompt
    assert prompt["2"].inputs["resize_type.match"] == Link("1", 0)
    assert prompt["2"].inputs["resize_type.crop"] == "center"
    assert prompt["2"].inputs["scale_method"] == "lanczos"
    assert validate(prompt, REG).clean


def test_resize_image_mask_ui_export_writes_the_sub_widgets_after_the_combo():
    from mixgraph.graph.formats.ui_export import to_ui
    wf = load_workflow({"1": call("EmptyImage", width=16, height=8, batch_size=1, color=0),
                        "2": call("ResizeImageMaskNode", input=["1", 0], scale_method="bicubic",
                                  resize_type="scale dimensions",
                                  **{"resize_type.width": 100, "resize_type.height": 50,
                                     "resize_type.crop": "disabled"}),
                        "3": call("PreviewImage", images=["2", 0])}, REG)
    ui = to_ui(wf, REG)
    node = next(n for n in ui["nodes"] if n["type"] == "ResizeImageMaskNode")
    assert node["widgets_values"] == ["scale dimensions", 100, 50, "disabled", "bicubic"]
    back = load_workflow(ui, REG).prompt["2"].inputs
    assert back == wf.prompt["2"].inputs
