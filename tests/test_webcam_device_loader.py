"""WebcamCapture and ImageOnlyCheckpointLoaderDevice: specs against ComfyUI's (nodes_webcam.py,
nodes_video_model.py; hand-copied below), the annotated temp file the editor uploads, the
capture_on_queue re-run rule, UI-format widget values, and device options: "default" and the
run's device load the model, another device is a clear error, unknown options pass validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.report import NodeError, ValidationFailed
from mixgraph.graph.node import MAX_RESOLUTION
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.loaders import extra_loader_nodes  # noqa: F401  (registers the nodes)
from mixgraph.nodes.helpers import folders  # noqa: F401  (registers the nodes)
from mixgraph.nodes.declare.image import webcam_nodes  # noqa: F401  (registers the nodes)
from mixgraph.nodes.helpers.device_options import check_placement, device_options, resolve_device_option
from mixgraph.ui import api
from tests.fixtures.tiny_zero123 import write_stable_zero123


def test_webcam_capture_spec_matches_comfyui():
    spec = REGISTRY.get("WebcamCapture")
    got = [(n, i.type, i.default if i.has_default else None, i.min, i.max) for n, i in spec.inputs]
    assert got == [("image", "WEBCAM", None, None, None),
                   ("width", "INT", 0, 0, MAX_RESOLUTION), ("height", "INT", 0, 0, MAX_RESOLUTION),
                   ("capture_on_queue", "BOOLEAN", True, None, None)]
    assert [o.type for o in spec.outputs] == ["IMAGE"]
    assert spec.category == "image" and spec.input_map["image"].is_widget


def test_image_only_loader_device_spec_matches_comfyui():
    spec = REGISTRY.get("ImageOnlyCheckpointLoaderDevice")
    assert [(n, i.type, i.optional) for n, i in spec.inputs] == [
        ("ckpt_name", "COMBO", False), ("model_device", "COMBO", True),
        ("clip_vision_device", "COMBO", True), ("vae_device", "COMBO", True)]
    assert [o.type for o in spec.outputs] == ["MODEL", "CLIP_VISION", "VAE"]
    assert spec.category == "loaders/video_models"
    assert device_options()[:2] == ["default", "cpu"]


@pytest.fixture()
def dirs(tmp_path):
    for sub in ("input", "temp/webcam", "output", "models/checkpoints"):
        (tmp_path / sub).mkdir(parents=True)
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3) * 2
    Image.fromarray(rgb).save(tmp_path / "temp" / "webcam" / "1700000000.png")
    return tmp_path, rgb


def _webcam_graph(image="webcam/1700000000.png [temp]", capture_on_queue=True):
    g = api.Graph()
    cam = g.add("WebcamCapture", image=image, width=640, height=480,
                capture_on_queue=capture_on_queue)
    g.add("PreviewAny", source=cam[0])
    return g, cam


def _env(root):
    return Env.from_args(models=root / "models", input=root / "input", output=root / "output",
                         temp=root / "temp")


def _run(g, root, **kw):
    executor = Executor(api.default_registry(), _env(root), cache=OutputCache(max_bytes=1 << 28))
    return api.run(g, executor=executor, **kw)


def test_annotated_path_picks_the_folder(dirs):
    root, _ = dirs
    env = _env(root)
    assert folders.annotated_path(env, "webcam/a.png [temp]") == root / "temp" / "webcam" / "a.png"
    assert folders.annotated_path(env, "a.png [output]") == root / "output" / "a.png"
    assert folders.annotated_path(env, "a.png") == root / "input" / "a.png"
    with pytest.raises(folders.FolderError):
        folders.annotated_path(env, "../secret.png [temp]")


def test_webcam_capture_loads_the_uploaded_temp_frame(dirs):
    root, rgb = dirs
    g, cam = _webcam_graph()
    out = _run(g, root)
    (image,) = out[cam.node_id]
    assert image.shape == (1, 4, 6, 3)
    assert torch.allclose(image[0], torch.from_numpy(rgb).float() / 255.0)


def test_webcam_capture_missing_frame_fails_validation(dirs):
    root, _ = dirs
    g, _ = _webcam_graph(image="webcam/none.png [temp]")
    with pytest.raises(ValidationFailed, match="Invalid image file"):
        _run(g, root)


def test_webcam_capture_empty_frame_value_fails_validation(dirs):
    """A UI-format workflow saves no frame (the widget's value is null): a clear error."""
    root, _ = dirs
    g, _ = _webcam_graph(image=None)
    with pytest.raises(ValidationFailed, match="no webcam frame"):
        _run(g, root)


def test_webcam_capture_on_queue_always_reruns_else_by_content(dirs):
    root, _ = dirs
    env = _env(root)
    value = "webcam/1700000000.png [temp]"
    fp = REGISTRY.get("WebcamCapture").fingerprint
    assert math.isnan(fp(env, image=value, width=0, height=0, capture_on_queue=True))
    first = fp(env, image=value, width=0, height=0, capture_on_queue=False)
    assert first is not None and first == fp(env, image=value, width=0, height=0, capture_on_queue=False)
    Image.new("RGB", (5, 5), "red").save(root / "temp" / "webcam" / "1700000000.png")
    assert fp(env, image=value, width=0, height=0, capture_on_queue=False) != first


def test_webcam_capture_ui_format_widget_values(dirs):
    root, rgb = dirs
    workflow = {"nodes": [
        {"id": 1, "type": "WebcamCapture", "mode": 0, "pos": [0, 0], "size": [300, 300],
         "inputs": [], "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [1]}],
         "widgets_values": ["webcam/1700000000.png [temp]", 640, 480, False]},
        {"id": 2, "type": "PreviewAny", "mode": 0, "pos": [400, 0], "size": [200, 100],
         "inputs": [{"name": "source", "type": "*", "link": 1}], "outputs": [],
         "widgets_values": []}],
        "links": [[1, 1, 0, 2, 0, "IMAGE"]], "groups": [], "version": 0.4}
    out = _run(workflow, root)
    (image,) = out["1"]
    assert torch.allclose(image[0], torch.from_numpy(rgb).float() / 255.0)


def test_device_options_resolve_like_comfyui():
    assert resolve_device_option("default") is None and resolve_device_option(None) is None
    assert resolve_device_option("cpu") == torch.device("cpu")
    assert resolve_device_option("gpu:999") is None  # no such GPU: falls back to default
    assert resolve_device_option("gpu:bad") is None
    check_placement("N", "model_device", "cpu", "cpu")  # the run's own device: fine
    check_placement("N", "model_device", "gpu:999", "cpu")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="model_device 'cpu': placing one model"):
            check_placement("N", "model_device", "cpu", "cuda")


@pytest.fixture()
def zero123(dirs):
    root, _ = dirs
    write_stable_zero123(root / "models" / "checkpoints" / "z.safetensors", seed=1)
    return root


def test_image_only_loader_device_loads_like_image_only_loader(zero123):
    g = api.Graph(precision="f32")
    plain = g.add("ImageOnlyCheckpointLoader", ckpt_name="z.safetensors")
    dev = g.add("ImageOnlyCheckpointLoaderDevice", ckpt_name="z.safetensors", model_device="cpu",
                clip_vision_device="default", vae_device="gpu:999")
    g.add("PreviewAny", source=plain[1])
    g.add("PreviewAny", source=dev[1])
    out = _run(g, zero123)
    model_a, vision_a, vae_a = out[plain.node_id]
    model_b, vision_b, vae_b = out[dev.node_id]
    assert model_a == model_b and vision_a == vision_b and vae_a == vae_b


def test_image_only_loader_device_other_device_is_a_clear_error(zero123):
    if not torch.cuda.is_available():
        pytest.skip("needs a run device other than the CPU")
    g = api.Graph(precision="f32")
    dev = g.add("ImageOnlyCheckpointLoaderDevice", ckpt_name="z.safetensors", vae_device="cpu")
    g.add("PreviewAny", source=dev[1])
    with pytest.raises(NodeError, match="vae_device 'cpu': placing one model"):
        _run(g, zero123, device="cuda")
