"""ComfyUI's Wan 2.1 / 2.2 video templates and its Qwen-Image (+ Edit) templates validate and run
unchanged, the Wan ones writing real video files.

As tests/test_dit_templates.py does for the image DiTs: the fixtures (tests/fixtures/comfy_templates,
verbatim from PyPI ``comfyui-workflow-templates-json``, MIT) are loaded as UI-format files, every
model file they name is written as a tiny stand-in of the right kind under exactly that name
(tests/fixtures/tiny_video_templates.py, tiny_qwen_templates in the same module set), then each
workflow is validated and run end to end through the executor. What the test changes, and only
here: frame sizes and counts, batch sizes and KSampler step counts (``small_sets``). The saved
videos are read back with PyAV: the frame count the latent length gives and the frame rate the
workflow's CreateVideo asks for.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.graph.prompt import Link
from mixgraph.graph.validate import validate
from mixgraph.ui import api
from tests.fixtures import tiny_video_templates

av = pytest.importorskip("av")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "comfy_templates"
PREFIXES = ("templates_text_to_video_wan", "templates_image_to_video_wan", "templates_video_wan",
            "templates_wan", "templates_image_qwen")
SIZE = 32      # frame / image side in pixels (the Wan 2.2 VAE's 16x needs a multiple of 16)
LENGTH = 5     # frames: 1 + 4k, so 2 latent frames

# The models the fixtures name: the kind of tiny model that stands in (tiny_video_templates.KINDS).
MODELS = {
    "diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors": "wan21_t2v_fp16",
    "diffusion_models/wan2.1_i2v_480p_14B_fp16.safetensors": "wan21_i2v_fp16",
    "diffusion_models/wan2.1_flf2v_720p_14B_fp16.safetensors": "wan21_flf2v_fp16",
    "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": "wan22_t2v_high_fp8_scaled",
    "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": "wan22_t2v_low_fp8_scaled",
    "diffusion_models/wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors": "wan22_i2v_high_fp8_scaled",
    "diffusion_models/wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors": "wan22_i2v_low_fp8_scaled",
    "diffusion_models/wan2.2_ti2v_5B_fp16.safetensors": "wan22_ti2v_5b_fp16",
    "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors": "umt5_fp8_scaled",
    "clip_vision/clip_vision_h.safetensors": "clip_vision_h",
    "vae/wan_2.1_vae.safetensors": "wan21_vae",
    "vae/wan2.2_vae.safetensors": "wan22_vae",
    "loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors": "wan_lora_high",
    "loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors": "wan_lora_low",
    "loras/wan2.2_i2v_lightx2v_4steps_lora_v1_high_noise.safetensors": "wan_lora_high",
    "loras/wan2.2_i2v_lightx2v_4steps_lora_v1_low_noise.safetensors": "wan_lora_low",
    "diffusion_models/qwen_image_fp8_e4m3fn.safetensors": "qwen_image_fp8",
    "diffusion_models/qwen_image_edit_fp8_e4m3fn.safetensors": "qwen_image_edit_fp8",
    "diffusion_models/qwen_image_edit_2509_fp8_e4m3fn.safetensors": "qwen_image_edit_fp8",
    "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors": "qwen25_vl_fp8_scaled",
    "vae/qwen_image_vae.safetensors": "wan21_vae",
    "loras/Qwen-Image-Lightning-8steps-V1.0.safetensors": "qwen_lora",
    "loras/Qwen-Image-Edit-Lightning-4steps-V1.0-bf16.safetensors": "qwen_lora",
    "loras/Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors": "qwen_lora",
}
LOADERS = {  # (class, input) -> models folder
    ("UNETLoader", "unet_name"): "diffusion_models", ("VAELoader", "vae_name"): "vae",
    ("CLIPLoader", "clip_name"): "text_encoders", ("LoraLoaderModelOnly", "lora_name"): "loras",
    ("CLIPVisionLoader", "clip_name"): "clip_vision",
}

# Templates that need what mixgraph does not do yet: what their run's refusal must say (a regex).
UNSUPPORTED: dict[str, str] = {}


def _fixtures() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("templates_*.json"))
            if p.name.startswith(PREFIXES)}


ALL = _fixtures()
RUNNABLE = sorted(n for n in ALL if n not in UNSUPPORTED)


def _prompt(name: str):
    return load_workflow(ALL[name], api.default_registry()).prompt


def _model_files(prompt) -> set[str]:
    return {f"{LOADERS[(c.class_type, k)]}/{v}" for c in prompt.values() for k, v in c.inputs.items()
            if (c.class_type, k) in LOADERS and isinstance(v, str)}


def _images(prompt) -> set[str]:
    return {c.inputs["image"] for c in prompt.values() if c.class_type == "LoadImage"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_templates")
    needed, pictures = set(), set()
    for name in ALL:
        prompt = _prompt(name)
        needed |= _model_files(prompt)
        pictures |= _images(prompt)
    assert needed <= set(MODELS), f"give these files a tiny stand-in in MODELS: {sorted(needed - set(MODELS))}"
    for rel in sorted(needed):
        tiny_video_templates.write_standin(root / "models" / rel, MODELS[rel])
    rng = np.random.default_rng(0)
    for name in sorted(pictures):
        path = root / "input" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(path)
    return root


@pytest.fixture(scope="module")
def executor(dirs):
    env = Env.from_args(models=dirs / "models", input=dirs / "input", output=dirs / "output")
    return Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 30))


def small_sets(prompt) -> dict[str, object]:
    """`--set` overrides that shrink a workflow: latent and image sizes to SIZE, LENGTH frames,
    batches of 1, KSampler to 2 steps, megapixel targets to their minimum."""
    sets: dict[str, object] = {}
    video = ("EmptyHunyuanLatentVideo", "WanImageToVideo", "WanFirstLastFrameToVideo", "Wan22ImageToVideoLatent")
    for nid, c in prompt.items():
        ins, t = c.inputs, c.class_type
        if t in video + ("EmptySD3LatentImage",):
            sets |= {f"{nid}.{k}": SIZE for k in ("width", "height") if isinstance(ins.get(k), int)}
            sets |= {f"{nid}.{k}": v for k, v in (("length", LENGTH), ("batch_size", 1)) if isinstance(ins.get(k), int)}
        elif t == "KSampler" and isinstance(ins.get("steps"), int):
            sets[f"{nid}.steps"] = 2
        elif t == "ImageScaleToTotalPixels":
            sets[f"{nid}.megapixels"] = 0.01
    return sets


@pytest.mark.parametrize("name", sorted(ALL))
def test_video_templates_validate(dirs, name):
    v = validate(_prompt(name), api.default_registry(), Env.from_args(models=dirs / "models", input=dirs / "input"))
    messages = [f"{p.node_id} {p.class_type}: {p.message} {p.details}" for p in v.errors]
    if name in UNSUPPORTED and not v.ok:
        assert UNSUPPORTED[name] in " ".join(messages), messages
        return
    assert v.ok and not v.errors, messages


def _fps(prompt) -> Fraction:
    """CreateVideo's frame rate: its literal, or the value of the primitive node feeding it."""
    (fps,) = [c.inputs["fps"] for c in prompt.values() if c.class_type == "CreateVideo"]
    while isinstance(fps, Link):
        fps = prompt[fps.node_id].inputs["value"]
    return Fraction(fps).limit_denominator(1001)


@pytest.mark.parametrize("name", RUNNABLE)
def test_video_templates_run_end_to_end(executor, dirs, name):
    prompt = _prompt(name)
    small = small_sets(prompt)
    out = dirs / "output" / name
    result = api.run(ALL[name], set=small, executor=executor, models=dirs / "models", input=dirs / "input",
                     output=out)
    assert result.report.to_json()["status"] == "success"
    for node_id, values in result.outputs.items():
        for value in values:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert torch.isfinite(value).all(), (name, node_id)
    videos = sorted(out.rglob("*.mp4"))
    if "wan" in name:
        assert len(videos) == 1, f"{name} saved {videos}"
        with av.open(str(videos[0])) as f:
            stream = f.streams.video[0]
            frames = [fr.to_ndarray(format="rgb24") for fr in f.decode(stream)]
            assert stream.average_rate == _fps(api.set_inputs(load_workflow(ALL[name], api.default_registry()),
                                                              small).prompt)
        decoded = [v[0] for nid, v in result.outputs.items() if prompt[nid].class_type == "VAEDecode"]
        assert len(decoded) == 1 and decoded[0].shape[0] in (LENGTH, 81)   # 81: a length the templates compute
        assert len(frames) == decoded[0].shape[0] and frames[0].shape == (SIZE, SIZE, 3), (len(frames), frames[0].shape)
    else:
        saved = sorted(out.rglob("*.png"))
        assert saved and not videos, f"{name} saved {saved + videos}"


WAN_T2V = "templates_text_to_video_wan.json"


THROUGH = (WAN_T2V, "templates_video_wan2_2_14B_t2v.json", "templates_image_qwen_image.json",
           "templates_image_qwen_image_edit_2509.json")


@pytest.mark.parametrize("name", THROUGH)
def test_templates_through_mixgraph_run(dirs, tmp_path, name):
    """`mixgraph run` on a Wan 2.1 text-to-video, the Wan 2.2 two-expert, a Qwen-Image and a
    Qwen-Image-Edit template (UI format, as the editor saves them): exit 0; the Wan ones write one
    MP4 of SIZE² frames (LENGTH, or the length the template computes), the Qwen ones one PNG."""
    from mixgraph.ui.cli import main

    wf = tmp_path / name
    wf.write_text(json.dumps(ALL[name]))
    argv = ["run", str(wf), "--models", str(dirs / "models"), "--input", str(dirs / "input"),
            "--output", str(tmp_path / "out"), "--quiet"]
    for k, v in small_sets(_prompt(name)).items():
        argv += ["--set", f"{k}={v}"]
    assert main(argv) == 0
    if "wan" not in name:
        assert len(sorted((tmp_path / "out").rglob("*.png"))) == 1
        return
    (video,) = sorted((tmp_path / "out").rglob("*.mp4"))
    with av.open(str(video)) as f:
        frames = list(f.decode(video=0))
    assert len(frames) in (LENGTH, 81) and (frames[0].width, frames[0].height) == (SIZE, SIZE)


@pytest.mark.parametrize("name", (WAN_T2V, "templates_image_qwen_image_edit_2509.json"))
def test_templates_through_the_server(dirs, tmp_path, name):
    """ComfyUI's HTTP API on the Wan 2.1 text-to-video and a Qwen-Image-Edit template: `POST /prompt`
    with the API form the editor sends; `/history` lists the saved file the way the editor shows it
    (a video: `images` + `animated: [true]`), and `/view` serves it (video/mp4, image/png)."""
    import asyncio
    import time

    from aiohttp.test_utils import TestClient, TestServer

    from mixgraph.graph.formats.workflow import dump_api
    from mixgraph.ui.server.server import create_app

    wf = api.set_inputs(load_workflow(ALL[name], api.default_registry()), small_sets(_prompt(name)))
    video = "wan" in name
    env = Env.from_args(models=dirs / "models", input=dirs / "input", output=tmp_path / "out")
    ex = Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 30))

    async def go():
        app = create_app(env, registry=api.default_registry(), executor=ex, user_dir=tmp_path / "user")
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/prompt", json={"prompt": dump_api(wf)})
            assert r.status == 200, await r.text()
            pid = (await r.json())["prompt_id"]
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                body = await (await c.get(f"/history/{pid}")).json()
                if body:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"{name} did not finish within 600 s")
            entry = body[pid]
            assert entry["status"]["status_str"] == "success", entry["status"]
            (shown,) = [o for o in entry["outputs"].values() if o.get("images")]
            assert shown.get("animated") == ([True] if video else None) and len(shown["images"]) == 1
            item = shown["images"][0]
            view = await c.get("/view", params={"filename": item["filename"], "subfolder": item["subfolder"],
                                                "type": item["type"]})
            assert view.status == 200 and view.content_type == ("video/mp4" if video else "image/png")
            return await view.read()

    data = asyncio.run(go())
    import io

    if video:
        with av.open(io.BytesIO(data)) as f:
            assert len(list(f.decode(video=0))) == LENGTH
    else:
        assert Image.open(io.BytesIO(data)).size[0] > 0
