"""ComfyUI nodes_sdpose.py (47e4a90): SDPoseDrawKeypoints (drawing as keypoint_draw.py 1294041),
SDPoseFaceBBoxes, CropByBBoxes, and SDPoseKeypointExtractor's refusal of a model without a heatmap head. Specs against
ComfyUI's declarations; pixel colours of a drawn limb; face boxes against values worked by hand;
crops against hand-sliced, area-resized references; a graph run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.declare.image import sdpose_nodes
from mixgraph.nodes.helpers import sdpose_ops
from mixgraph.ui import api

REG = api.default_registry()


def person(body=None, face=None, rhand=None):
    """A person with every point at score 0 except those given: {index: (x, y)} (score 1)."""
    def flat(n, given):
        out = [0.0] * (n * 3)
        for i, (x, y) in (given or {}).items():
            out[3 * i:3 * i + 3] = [float(x), float(y), 1.0]
        return out
    return {"pose_keypoints_2d": flat(18, body), "face_keypoints_2d": flat(70, face),
            "hand_right_keypoints_2d": flat(21, rhand), "hand_left_keypoints_2d": flat(21, None)}


def frame(people, w=100, h=80):
    return {"canvas_width": w, "canvas_height": h, "people": people}


def draw(kps, **kw):
    args = dict(draw_body=True, draw_hands=True, draw_face=True, draw_feet=False, stick_width=4,
                face_point_size=3, score_threshold=0.3, draw_head=True)
    args.update(kw)
    return sdpose_ops.draw_keypoints(kps, **args)


def rgb(img, x, y):
    return tuple(int(round(v * 255)) for v in img[0, y, x].tolist())


def test_sdpose_specs_match_comfyui():
    info = REG.object_info()
    d = info["SDPoseDrawKeypoints"]
    assert (d["category"], d["display_name"], d["output"]) == ("image/detection", "SDPose Draw Keypoints", ["IMAGE"])
    req = d["input"]["required"]
    assert list(req) == ["keypoints", "draw_body", "draw_hands", "draw_face", "draw_feet", "stick_width",
                         "face_point_size", "score_threshold", "draw_head"]
    assert req["keypoints"] == ["POSE_KEYPOINT"]
    assert [req[k][1]["default"] for k in ("draw_body", "draw_hands", "draw_face", "draw_feet", "draw_head")] == \
        [True, True, True, False, True]
    assert req["stick_width"] == ["INT", {"default": 4, "min": 1, "max": 10, "step": 1}]
    assert req["face_point_size"] == ["INT", {"default": 3, "min": 1, "max": 10, "step": 1}]
    assert req["score_threshold"] == ["FLOAT", {"default": 0.3, "min": 0.0, "max": 1.0, "step": 0.01}]

    f = info["SDPoseFaceBBoxes"]
    assert (f["category"], f["display_name"], f["output"], f["output_name"]) == \
        ("image/detection", "SDPose Face Bounding Boxes", ["BOUNDING_BOX"], ["bboxes"])
    assert {k: f["input"]["required"]["scale"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 1.5, "min": 1.0, "max": 10.0, "step": 0.1}
    assert f["input"]["required"]["force_square"][1]["default"] is True

    c = info["CropByBBoxes"]
    assert (c["category"], c["display_name"], c["output"]) == ("image/transform", "Crop By Bounding Boxes", ["IMAGE"])
    assert c["has_intermediate_output"] is True
    req = c["input"]["required"]
    assert list(req) == ["image", "bboxes", "output_width", "output_height", "padding", "keep_aspect"]
    assert req["bboxes"] == ["BOUNDING_BOX", {"default": {"x": 0, "y": 0, "width": 512, "height": 512},
                                              "socketless": True, "forceInput": True}]
    assert {k: req["output_width"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 512, "min": 64, "max": 4096, "step": 8}
    assert {k: req["padding"][1][k] for k in ("default", "min", "max")} == {"default": 0, "min": 0, "max": 1024}
    assert req["keep_aspect"][0] == ["stretch", "pad"]

    e = info["SDPoseKeypointExtractor"]
    assert (e["category"], e["display_name"], e["output"], e["output_name"]) == \
        ("image/detection", "SDPose Keypoint Extractor", ["POSE_KEYPOINT"], ["keypoints"])
    assert list(e["input"]["required"]) == ["model", "vae", "image", "batch_size"]
    assert e["input"]["required"]["batch_size"] == ["INT", {"default": 16, "min": 1, "max": 10000, "step": 1}]
    assert e["input"]["optional"]["bboxes"][0] == "BOUNDING_BOX"
    assert e["input"]["optional"]["bboxes"][1]["forceInput"] is True


def test_sdpose_extractor_refuses_a_model_without_heatmap_head():
    from mixgraph.nodes.helpers import sdpose_extract
    with pytest.raises(ValueError, match="does not have a heatmap_head"):
        sdpose_extract.extract(object(), None, torch.zeros(1, 8, 8, 3), 16, None, None, None)


def test_sdpose_draw_limb_colours_at_midpoint_and_joints():
    # neck (1) -> right shoulder (2): DWPose limb 0, red; joints in colours 1 and 2
    img = draw([frame([person(body={1: (20, 30), 2: (60, 30)})])])
    assert img.shape == (1, 80, 100, 3)
    assert rgb(img, 40, 30) == (255, 0, 0)           # limb midpoint
    # the ellipse polygon (half-width 4 + 0.5, vertices rounded to 25.5 -> 26 and 34.5 -> 34)
    # filled with half-open scanlines: rows 26..33
    assert rgb(img, 40, 26) == (255, 0, 0) and rgb(img, 40, 33) == (255, 0, 0)
    assert rgb(img, 40, 25) == (0, 0, 0) and rgb(img, 40, 34) == (0, 0, 0)
    assert rgb(img, 20, 30) == (255, 85, 0)          # neck dot, colour 1
    assert rgb(img, 60, 30) == (255, 170, 0)         # right shoulder dot, colour 2
    thin = draw([frame([person(body={1: (20, 30), 2: (60, 30)})])], stick_width=1)
    assert [rgb(thin, 40, y)[0] for y in range(27, 33)] == [0, 0, 255, 255, 0, 0]
    # neck -> nose is limb 12, blue; draw_head=False leaves the head out
    head = {1: (50, 60), 0: (50, 20)}
    img = draw([frame([person(body=head)])])
    assert rgb(img, 50, 40) == (0, 0, 255) and rgb(img, 50, 20) == (255, 0, 0)   # nose dot colour 0
    img = draw([frame([person(body=head)])], draw_head=False)
    assert rgb(img, 50, 40) == (0, 0, 0) and rgb(img, 50, 20) == (0, 0, 0)
    assert rgb(img, 50, 60) == (255, 85, 0)
    # below the threshold nothing is drawn; draw_body=False neither
    assert not draw([frame([person(body={1: (20, 30), 2: (60, 30)})])], score_threshold=1.01).any()
    assert not draw([frame([person(body={1: (20, 30), 2: (60, 30)})])], draw_body=False).any()


def test_sdpose_draw_face_hands_and_empty_input():
    img = draw([frame([person(face={5: (70, 50)}, rhand={0: (10, 70), 1: (30, 70)})])])
    assert rgb(img, 70, 50) == (255, 255, 255) and rgb(img, 73, 50) == (255, 255, 255)
    assert rgb(img, 75, 50) == (0, 0, 0)
    assert rgb(img, 20, 70) == (255, 0, 0)           # hand edge 0: hue 0
    assert rgb(img, 10, 70) == (0, 0, 255) and rgb(img, 30, 70) == (0, 0, 255)   # blue hand dots
    off = draw([frame([person(face={5: (70, 50)}, rhand={0: (10, 70), 1: (30, 70)})])],
               draw_face=False, draw_hands=False)
    assert not off.any()
    empty = draw([])
    assert empty.shape == (1, 64, 64, 3) and not empty.any()
    two = draw([frame([]), frame([person(body={1: (20, 30), 2: (60, 30)})], w=10, h=10)])
    assert two.shape == (2, 80, 100, 3) and not two[0].any() and two[1].any()   # first frame's size


def face_person(w_pts):
    face = {i: (50, 55) for i in range(70)}
    face.update(w_pts)
    return person(face=face)


def test_sdpose_face_bboxes_match_hand_values():
    p = face_person({0: (40, 50), 1: (60, 60)})   # extent 20 x 10 at (40, 50)
    # scale 2: area 400, new 28.284 x 14.142; dw 4.142, dh 1.036 -> x 35..64, y 46..61
    assert sdpose_ops.face_bboxes([frame([p], 200, 200)], 2.0, False) == [[{"x": 35, "y": 46, "width": 29, "height": 15}]]
    # square: side 29 around centre (49, 53), half 14
    assert sdpose_ops.face_bboxes([frame([p], 200, 200)], 2.0, True) == [[{"x": 35, "y": 39, "width": 29, "height": 29}]]
    # clamped at the bottom (h 64), then re-anchored upward
    assert sdpose_ops.face_bboxes([frame([p], 200, 64)], 2.0, True) == [[{"x": 35, "y": 35, "width": 29, "height": 29}]]
    # no face points / a flat face: no box; frames keep their place
    flat = face_person({i: (50, 55) for i in range(70)})
    no_face = {k: v for k, v in p.items() if k != "face_keypoints_2d"}
    assert sdpose_ops.face_bboxes([frame([flat, no_face]), frame([p], 200, 200)], 1.5, True)[0] == []


def ramp(b, h, w, c=3):
    return torch.arange(b * h * w * c, dtype=torch.float32).reshape(b, h, w, c) / (b * h * w * c)


def area(crop_bhwc, w, h):
    return F.interpolate(crop_bhwc.movedim(-1, 1), size=(h, w), mode="area").movedim(1, -1)


def test_crop_by_bboxes_union_padding_stretch_and_pad():
    img = ramp(2, 40, 60)
    boxes = [[{"x": 10, "y": 5, "width": 20, "height": 10}, {"x": 25, "y": 8, "width": 10, "height": 10}]]
    out = sdpose_ops.crop_by_bboxes(img, boxes, 64, 64, 0, "stretch")
    assert out.shape == (2, 64, 64, 3)                       # the last box list serves frame 1
    assert torch.allclose(out[0:1], area(img[0:1, 5:18, 10:35], 64, 64), atol=1e-6)
    assert torch.allclose(out[1:2], area(img[1:2, 5:18, 10:35], 64, 64), atol=1e-6)
    padded = sdpose_ops.crop_by_bboxes(img[:1], [[boxes[0][0]]], 64, 64, 7, "stretch")
    assert torch.allclose(padded, area(img[0:1, 0:22, 3:37], 64, 64), atol=1e-6)   # clamped at y 0
    fit = sdpose_ops.crop_by_bboxes(img[:1], {"x": 10, "y": 5, "width": 20, "height": 10}, 64, 64, 0, "pad")
    assert fit.shape == (1, 64, 64, 3)
    assert not fit[0, :16].any() and not fit[0, 48:].any()   # 64 x 32 centred on black
    assert torch.allclose(fit[:, 16:48], area(img[0:1, 5:15, 10:30], 64, 32), atol=1e-6)


def test_crop_by_bboxes_skips_falls_back_and_passes_through():
    img = ramp(2, 40, 60)
    assert sdpose_ops.crop_by_bboxes(img, [], 64, 64, 0, "stretch") is img
    only_second = sdpose_ops.crop_by_bboxes(img, [[], [{"x": 0, "y": 0, "width": 8, "height": 8}]], 64, 64, 0, "stretch")
    assert only_second.shape == (1, 64, 64, 3)
    assert torch.allclose(only_second, area(img[1:2, 0:8, 0:8], 64, 64), atol=1e-6)
    assert sdpose_ops.crop_by_bboxes(img, [[], []], 64, 64, 0, "stretch") is img
    # a box off the image: a 12 px square (0.3 * 40) at x 24, y 4
    fb = sdpose_ops.crop_by_bboxes(img[:1], [[{"x": 100, "y": 0, "width": 5, "height": 5}]], 64, 64, 0, "stretch")
    assert torch.allclose(fb, area(img[0:1, 4:16, 24:36], 64, 64), atol=1e-6)
    with pytest.raises(sdpose_ops.PoseError, match="bboxes"):
        sdpose_ops.crop_by_bboxes(img, [["nope"]], 64, 64, 0, "stretch")


def test_crop_by_bboxes_in_a_graph_previews_source(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp", input=tmp_path / "in")
    ex = Executor(REG, env, cache=OutputCache(max_bytes=1 << 24))
    wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0xFF0000}},
          "2": {"class_type": "PrimitiveBoundingBox", "inputs": {"x": 8, "y": 4, "width": 16, "height": 16}},
          "3": {"class_type": "CropByBBoxes", "inputs": {"image": ["1", 0], "bboxes": ["2", 0], "output_width": 64,
                                                         "output_height": 64, "padding": 0, "keep_aspect": "stretch"}},
          "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
    result = api.run(wf, executor=ex)
    out = result.outputs["3"][0]
    assert out.shape == (1, 64, 64, 3) and torch.allclose(out[0, 10, 10], torch.tensor([1.0, 0.0, 0.0]))
    ui = result.report.ui["3"]
    assert ui["input_bboxes"] == [{"x": 8, "y": 4, "width": 16, "height": 16}]
    assert ui["source_images"][0]["type"] == "temp"
    assert ui["source_images"][0]["filename"].startswith("comfy.crop_bboxes.source_temp_")
