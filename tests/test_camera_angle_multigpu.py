"""CameraAngle (ComfyUI nodes_camera_angle.py 59090bd) and the device nodes of nodes_multigpu.py
(374ae43): specs, CameraAngle's exact prompt strings and camera dict, and the device nodes'
pass-through / "not supported yet" rules (mixgraph runs every model on the run's device)."""

from __future__ import annotations

import math

import pytest
import torch

from mixgraph.graph.context import Context
from mixgraph.graph.env import Env
from mixgraph.nodes.declare.conditioning import camera_angle_nodes as C
from mixgraph.nodes.declare.loaders import multigpu_nodes as M
from mixgraph.nodes.helpers.device_options import device_options
from mixgraph.ui import api

INFO = api.default_registry().object_info()


# --- CameraAngle ---------------------------------------------------------------------------------

def test_camera_angle_spec_matches_comfyui():
    c = INFO["CameraAngle"]
    assert c["display_name"] == "Camera Angle" and c["category"] == "3d"
    assert c["output"] == ["LOAD3D_CAMERA", "STRING"] and c["output_name"] == ["camera_info", "prompt"]
    assert c["input_order"] == {"required": ["horizontal_angle", "vertical_angle", "zoom"],
                                "optional": ["image", "view"]}
    req = c["input"]["required"]
    def nums(name):
        return {k: req[name][1][k] for k in ("default", "min", "max", "step")}

    assert req["horizontal_angle"][0] == "INT" and req["vertical_angle"][0] == "INT"
    assert nums("horizontal_angle") == dict(default=0, min=0, max=360, step=1)
    assert nums("vertical_angle") == dict(default=0, min=-30, max=60, step=1)
    assert req["zoom"][0] == "FLOAT" and nums("zoom") == dict(default=5.0, min=0.0, max=10.0, step=0.1)
    assert req["zoom"][1]["tooltip"] == "How close the camera is: 0 is a wide shot, 10 a close-up."
    opt = c["input"]["optional"]
    assert opt["image"][0] == "IMAGE"
    assert opt["view"] == ["STRING", {"default": "", "socketless": True, "widgetType": "CAMERA_ANGLE_VIEW"}]
    assert c["search_aliases"] == ["multi angle", "camera view", "orbit camera", "shot angle", "camera prompt"]
    assert c["description"].startswith("Pick a camera angle around a subject with a 3D preview.")


@pytest.mark.parametrize("h,v,z,prompt", [
    (0, 0, 5.0, "front view eye-level shot medium shot"),
    (22, -16, 1.9, "front view low-angle shot wide shot"),
    (23, -15, 2.0, "front-right quarter view eye-level shot medium shot"),  # 22.5 and the bounds: next term
    (90, 14, 5.9, "right side view eye-level shot medium shot"),
    (135, 15, 6.0, "back-right quarter view elevated shot close-up"),
    (180, 44, 10.0, "back view elevated shot close-up"),
    (225, 45, 0.0, "back-left quarter view high-angle shot wide shot"),
    (270, 60, 7.5, "left side view high-angle shot close-up"),
    (315, -30, 3.0, "front-left quarter view low-angle shot medium shot"),
    (337, 0, 5.0, "front-left quarter view eye-level shot medium shot"),
    (338, 0, 5.0, "front view eye-level shot medium shot"),
    (360, 0, 5.0, "front view eye-level shot medium shot"),
    (400, 90, 12.0, "front view high-angle shot close-up"),  # clamped to 360, 60, 10
    (-5, -40, -1.0, "front view low-angle shot wide shot"),  # clamped to 0, -30, 0
])
def test_camera_angle_prompt_strings(h, v, z, prompt):
    assert C.CameraAngle(h, v, z)[1] == prompt


def test_camera_angle_camera_info():
    info, _ = C.CameraAngle(90, 30, 5.0)
    d = 6.0 - 2.8 * 0.5
    assert info["position"] == pytest.approx({"x": d * math.cos(math.pi / 6), "y": 0.5 + d * 0.5, "z": 0.0}, abs=1e-12)
    assert info["target"] == {"x": 0.0, "y": 0.5, "z": 0.0}
    assert info["zoom"] == 1.0 and info["cameraType"] == "perspective" and info["fov"] == 35.0
    front, _ = C.CameraAngle(0, 0, 0.0)  # zoom 0: the far distance 6, straight ahead on +z
    assert front["position"] == pytest.approx({"x": 0.0, "y": 0.5, "z": 6.0})
    near, _ = C.CameraAngle(180, -30, 10.0)  # zoom 10: 3.2, behind and below
    assert near["position"] == pytest.approx(
        {"x": 0.0, "y": 0.5 - 1.6, "z": -3.2 * math.cos(math.pi / 6)}, abs=1e-12)
    # clamped inputs give the clamped camera
    assert C.CameraAngle(999, 99, 99.0)[0] == C.CameraAngle(360, 60, 10.0)[0]


def test_camera_angle_runs_in_a_workflow(tmp_path):
    g = api.Graph()
    cam = g.add("CameraAngle", horizontal_angle=45, vertical_angle=50, zoom=8.0)
    g.add("PreviewAny", source=cam[1])
    out = api.run(g, models=tmp_path, output=tmp_path / "out")
    assert out[cam.node_id][1] == "front-right quarter view high-angle shot close-up"
    assert out[cam.node_id][0]["fov"] == 35.0


# --- the device nodes ----------------------------------------------------------------------------

def test_multigpu_specs_match_comfyui():
    for name, sock, display in (("SelectModelDevice", "model", "Select Model Device"),
                                ("SelectCLIPDevice", "clip", "Select CLIP Device"),
                                ("SelectVAEDevice", "vae", "Select VAE Device")):
        s = INFO[name]
        assert s["display_name"] == display and s["category"] == "advanced/multigpu"
        assert s["input_order"] == {"required": [sock, "device"]} and s["output"] == [sock.upper()]
    assert INFO["SelectModelDevice"]["input"]["required"]["device"] == [device_options()]
    assert INFO["SelectCLIPDevice"]["input"]["required"]["device"] == [device_options()]
    assert INFO["SelectVAEDevice"]["input"]["required"]["device"] == [[o for o in device_options() if o != "cpu"]]
    assert device_options()[:2] == ["default", "cpu"]
    w = INFO["MultiGPU_WorkUnits"]
    assert w["display_name"] == "MultiGPU CFG Split" and w["category"] == "advanced/multigpu"
    assert w["input"]["required"] == {"model": ["MODEL"], "max_gpus": ["INT", {"default": 2, "min": 1, "step": 1}]}
    assert w["output"] == ["MODEL"]
    assert w["description"].startswith("Prepares model to have sampling accelerated via splitting work units.")


def _ctx(device: str, node: str = "SelectModelDevice") -> Context:
    return Context("1", node, Env(device=device), None, None)


MODEL = object()  # the nodes never look inside what they pass through


@pytest.mark.parametrize("fn", [M.SelectModelDevice, M.SelectCLIPDevice, M.SelectVAEDevice])
def test_select_device_passes_through_default_own_and_missing_devices(fn):
    cpu = _ctx("cpu")
    for option in ("default", "gpu:99", "nonsense"):
        assert fn(cpu, MODEL, option)[0] is MODEL
    assert fn(cpu, MODEL, "cpu")[0] is MODEL  # the run's own device (VAE: "cpu" is passed over)


@pytest.mark.parametrize("fn", [M.SelectModelDevice, M.SelectCLIPDevice])
def test_select_device_refuses_another_device_of_this_machine(fn):
    # a CUDA run asking for the CPU: one model on a device of its own is not supported yet
    with pytest.raises(ValueError, match="device 'cpu': placing one model on a device of its own is not supported yet"):
        fn(_ctx("cuda"), MODEL, "cpu")


def test_select_vae_device_passes_cpu_through_as_comfyui():
    assert M.SelectVAEDevice(_ctx("cuda"), MODEL, "cpu")[0] is MODEL


def test_select_device_accepts_any_value_at_validation(tmp_path):
    from tests.fixtures.checkpoints import write_sd15
    (tmp_path / "checkpoints").mkdir()
    write_sd15(tmp_path / "checkpoints" / "sd15.safetensors", seed=4)
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    m = g.add("SelectModelDevice", model=ck[0], device="gpu:7")
    c = g.add("SelectCLIPDevice", clip=ck[1], device="default")
    v = g.add("SelectVAEDevice", vae=ck[2], device="cpu")
    w = g.add("MultiGPU_WorkUnits", model=m, max_gpus=2)
    for x in (w, c, v):
        g.add("PreviewAny", source=x)
    out = api.run(g, models=tmp_path, output=tmp_path / "out")
    assert out[w.node_id][0] == out[ck.node_id][0] and out[c.node_id][0] == out[ck.node_id][1]
    assert out[v.node_id][0] == out[ck.node_id][2]


def test_multigpu_work_units_one_device_passes_through():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert M.MultiGPU_WorkUnits(MODEL, 1)[0] is MODEL
    if gpus <= 1:
        assert M.MultiGPU_WorkUnits(MODEL, 2)[0] is MODEL
    else:
        with pytest.raises(NotImplementedError, match="not supported yet"):
            M.MultiGPU_WorkUnits(MODEL, 2)
