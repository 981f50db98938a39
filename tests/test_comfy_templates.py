"""Public ComfyUI workflows for SD 1.x / 2.x / SDXL validate and run unchanged.

The fixtures (tests/fixtures/comfy_templates, sources and licences in its README) are ComfyUI's
workflow templates and ComfyUI_examples workflows, in the editor's UI format. Each is loaded the
way `mixgraph run` and `POST /prompt` load a UI file (`graph.formats.workflow.load_workflow`), every
model file it names is generated as a tiny seeded model of the right kind under exactly that
name, and it is validated and run end to end through the executor.

What the test changes, and only in the test: image sizes, batch sizes and step counts (`_small`),
so the runs take seconds on a CPU. Nothing else: samplers, schedulers, prompts, strengths,
denoise, areas (scaled with the image), LoRA/ControlNet/GLIGEN/unCLIP settings stay as published.

The DiT families' templates (Flux.1, Chroma, SD3.5, Z-Image, Lumina 2) and the editor's default
graph are tests/test_dit_templates.py's, the Wan and Qwen-Image ones tests/test_video_templates.py's
(`DIT_FIXTURES` leaves them out here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15, write_sd2, write_sdxl, write_sdxl_refiner, write_unet
from tests.fixtures.workflow_models import (write_controlnet, write_embedding_pt, write_gligen,
                                            write_lora, write_revision_clip_vision, write_sd15_4level,
                                            write_stable_zero123_ckpt, write_t2i_adapter, write_unclip_ckpt,
                                            write_upscaler)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "comfy_templates"
FACTS = FIXTURES / "facts_templates_0.1.40.json"
SIZE = 64  # the largest side of the main latent, in pixels

# The models the fixtures name, by folder and file name: what kind of tiny model stands in.
SD15 = ("v1-5-pruned-emaonly-fp16.safetensors", "DreamShaper_8_pruned.safetensors", "dreamshaper_8.safetensors",
        "majicmixRealistic_v7.safetensors", "japaneseStyleRealistic_v20.safetensors",
        "architecturerealmix_v11.safetensors", "awpainting_v14.safetensors")
MODELS = {
    **{f"checkpoints/{name}": "sd15" for name in SD15},
    "checkpoints/interiordesignsuperm_v2.safetensors": "sd15_4level",
    "checkpoints/v2-1_768-ema-pruned.safetensors": "sd2_v",
    "checkpoints/512-inpainting-ema.safetensors": "sd2_inpaint",
    "checkpoints/sd21-unclip-h.ckpt": "sd2_unclip_ckpt",
    "checkpoints/stable_zero123.ckpt": "stable_zero123_ckpt",
    "checkpoints/sd_xl_base_1.0.safetensors": "sdxl",
    "checkpoints/sd_xl_turbo_1.0_fp16.safetensors": "sdxl",
    "checkpoints/sd_xl_refiner_1.0.safetensors": "sdxl_refiner",
    "diffusion_models/lotus-depth-d-v1-1.safetensors": "lotus_unet",
    "vae/vae-ft-mse-840000-ema-pruned.safetensors": "vae",
    "loras/blindbox_v1_mix.safetensors": "lora_sd15",
    "loras/MoXinV1.safetensors": "lora_sd15",
    "controlnet/control_v11p_sd15_openpose_fp16.safetensors": "controlnet_sd15",
    "controlnet/control_v11p_sd15_scribble_fp16.safetensors": "controlnet_sd15",
    "controlnet/control_v11f1p_sd15_depth_fp16.safetensors": "controlnet_sd15",
    "controlnet/controlnetT2IAdapter_t2iAdapterDepth.safetensors": "t2i_adapter",
    "upscale_models/RealESRGAN_x4plus.safetensors": "esrgan",
    "gligen/gligen_sd14_textbox_pruned.safetensors": "gligen",
    "clip_vision/clip_vision_g.safetensors": "clip_vision_revision",
    "embeddings/SDA768.pt": "embedding_sd2",
}
LOADERS = {  # (class, input) -> models folder
    ("CheckpointLoaderSimple", "ckpt_name"): "checkpoints", ("unCLIPCheckpointLoader", "ckpt_name"): "checkpoints",
    ("ImageOnlyCheckpointLoader", "ckpt_name"): "checkpoints", ("UNETLoader", "unet_name"): "diffusion_models",
    ("VAELoader", "vae_name"): "vae", ("LoraLoader", "lora_name"): "loras",
    ("ControlNetLoader", "control_net_name"): "controlnet", ("UpscaleModelLoader", "model_name"): "upscale_models",
    ("GLIGENLoader", "gligen_name"): "gligen", ("CLIPVisionLoader", "clip_name"): "clip_vision",
}

# Fixtures that must be refused, and the family named in the refusal (none now: the families
# refused before, Flux and SD3.5, run, in tests/test_dit_templates.py).
REFUSED: dict[str, str] = {}
# The DiT families' fixtures and the frontend's default graph: tests/test_dit_templates.py's; the
# Wan and Qwen-Image ones: tests/test_video_templates.py's (its PREFIXES).
DIT_FIXTURES = ("templates_flux", "templates_sd3", "templates_image_z_image", "templates_image_chroma",
                "templates_image_netayume", "facts_frontend_", "templates_text_to_video_wan",
                "templates_image_to_video_wan", "templates_video_wan", "templates_wan", "templates_image_qwen")
# Fixtures that need a core node mixgraph does not have yet (docs/comfy-core-coverage.md).
MISSING: dict[str, str] = {}


def _fixtures() -> dict[str, dict]:
    """name -> UI-format workflow. Verbatim files, plus the fact sheets (UI graphs rebuilt from the
    recorded node types, links and widget values of templates whose licence does not allow copying)."""
    out = {p.name: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))
           if p != FACTS and not p.name.startswith(DIT_FIXTURES)}
    out |= json.loads(FACTS.read_text())
    return out


ALL = _fixtures()
RUNNABLE = sorted(n for n in ALL if n not in REFUSED)


def _model_files(prompt) -> set[str]:
    files = set()
    for call in prompt.values():
        for name, value in call.inputs.items():
            folder = LOADERS.get((call.class_type, name))
            if folder and isinstance(value, str):
                files.add(f"{folder}/{value}")
            if isinstance(value, str):
                files |= {f"embeddings/{m}" for m in re.findall(r"embedding:([\w.\-]+)", value)}
    return files


def _images(prompt) -> set[str]:
    return {call.inputs["image"] for call in prompt.values() if call.class_type == "LoadImage"}


def _write_model(root: Path, rel: str, kind: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    sd15 = root / "checkpoints" / SD15[0]
    writers = {
        "sd15": lambda: write_sd15(path, seed=1),
        "sd15_4level": lambda: write_sd15_4level(path),
        "sd2_v": lambda: write_sd2(path, v_prediction=True, seed=2),
        "sd2_inpaint": lambda: write_sd2(path, v_prediction=False, seed=3, inpaint=True),
        "lotus_unet": lambda: write_unet(path, kind="lotus", seed=4),  # SD2 + 4-wide task input, 1024 context
        "sd2_unclip_ckpt": lambda: write_unclip_ckpt(path),
        "stable_zero123_ckpt": lambda: write_stable_zero123_ckpt(path),
        "sdxl": lambda: write_sdxl(path, seed=5),
        "sdxl_refiner": lambda: write_sdxl_refiner(path, seed=6),
        "vae": lambda: _write_vae(path),
        "lora_sd15": lambda: write_lora(path, sd15),
        "controlnet_sd15": lambda: write_controlnet(path),
        "t2i_adapter": lambda: write_t2i_adapter(path),
        "esrgan": lambda: write_upscaler(path),
        "gligen": lambda: write_gligen(path),
        "clip_vision_revision": lambda: write_revision_clip_vision(path),
        "embedding_sd2": lambda: write_embedding_pt(path, width=48),
    }
    writers[kind]()


def _write_vae(path: Path) -> None:
    from tests.fixtures.checkpoints import write_vae
    write_vae(path, seed=9)


def _write_image(folder: Path, name: str, rng: np.random.Generator) -> None:
    """RGBA with a transparent square: LoadImage's MASK output is the inpaint/outpaint area."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    rgba = rng.integers(0, 255, (SIZE, SIZE, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    rgba[16:40, 16:40, 3] = 0
    Image.fromarray(rgba, "RGBA").save(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("comfy_templates")
    models, images = root / "models", root / "input"
    needed, pictures = set(), set()
    for name, wf in ALL.items():
        if name in MISSING:
            continue
        prompt = load_workflow(wf, api.default_registry()).prompt
        needed |= _model_files(prompt)
        pictures |= _images(prompt)
    unknown = needed - set(MODELS)
    assert not unknown, f"give these files a tiny stand-in in MODELS: {sorted(unknown)}"
    # the SD1.5 checkpoint first: the LoRAs are shaped after it
    for rel in sorted(needed, key=lambda r: (MODELS[r] != "sd15", r)):
        _write_model(models, rel, MODELS[rel])
    rng = np.random.default_rng(0)
    for name in sorted(pictures):
        _write_image(images, name, rng)
    return root


@pytest.fixture(scope="module")
def executor(dirs):
    env = Env.from_args(models=dirs / "models", input=dirs / "input", output=dirs / "output")
    return Executor(api.default_registry(), env, cache=OutputCache(max_bytes=2 << 30))


def _small(prompt) -> dict[str, object]:
    """`--set` overrides that shrink a workflow: the main latent's (EmptyLatentImage's or Stable
    Zero123's) longest side becomes SIZE (more
    where an area would fall below ConditioningSetArea's minimum), and every pixel quantity (areas, GLIGEN boxes, upscale targets, outpaint pads) is scaled with it;
    batches of 1; 2 sampling steps (KSamplerAdvanced keeps its phase split in proportion)."""
    sizes = [max(c.inputs["width"], c.inputs["height"]) for c in prompt.values()
             if c.class_type in ("EmptyLatentImage", "StableZero123_Conditioning")
             and isinstance(c.inputs.get("width"), int)]
    scale = SIZE / max(sizes) if sizes else SIZE / 512
    areas = [min(c.inputs["width"], c.inputs["height"]) for c in prompt.values()
             if c.class_type == "ConditioningSetArea"]
    if areas:  # ConditioningSetArea's minimum side is 64 px: keep the smallest area at that
        scale = max(scale, 64 / min(areas))

    def px(v: int) -> int:
        return max(8, int(round(v * scale / 8)) * 8)

    sets: dict[str, object] = {}
    for nid, c in prompt.items():
        ins, t = c.inputs, c.class_type
        lit = {k: v for k, v in ins.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if t == "EmptyLatentImage":
            sets |= {f"{nid}.{k}": px(lit[k]) for k in ("width", "height") if k in lit}
            sets[f"{nid}.batch_size"] = 1
        elif t in ("ConditioningSetArea", "GLIGENTextBoxApply", "LatentUpscale", "ImageScale",
                   "StableZero123_Conditioning"):
            sets |= {f"{nid}.{k}": px(v) if k in ("width", "height") else int(round(v * scale / 8)) * 8
                     for k, v in lit.items() if k in ("width", "height", "x", "y")}
        elif t == "ImagePadForOutpaint":
            sets |= {f"{nid}.{k}": int(round(v * scale / 8)) * 8 for k, v in lit.items()
                     if k in ("left", "top", "right", "bottom")}
        elif t == "ImageScaleToTotalPixels":
            sets[f"{nid}.megapixels"] = 0.01
        elif t == "KSampler" or t == "BasicScheduler":
            sets[f"{nid}.steps"] = 2
        elif t == "SDTurboScheduler":
            sets[f"{nid}.steps"] = 1
        elif t == "KSamplerAdvanced":
            steps = lit["steps"]
            sets[f"{nid}.steps"] = 4
            sets[f"{nid}.start_at_step"] = round(lit["start_at_step"] * 4 / steps)
            sets[f"{nid}.end_at_step"] = min(lit["end_at_step"], round(lit["end_at_step"] * 4 / steps))
    return sets


def test_comfy_templates_every_model_file_has_a_stand_in():
    for name, wf in ALL.items():
        if name in MISSING:
            continue
        files = _model_files(load_workflow(wf, api.default_registry()).prompt)
        assert files <= set(MODELS), (name, sorted(files - set(MODELS)))


@pytest.mark.parametrize("name", sorted(ALL))
def test_comfy_templates_validate(dirs, name):
    registry = api.default_registry()
    wf = load_workflow(ALL[name], registry)
    v = validate(wf.prompt, registry, Env.from_args(models=dirs / "models", input=dirs / "input"))
    if name in REFUSED:
        messages = " ".join(f"{p.message} {p.details}" for p in v.errors)
        assert not v.ok and f"model family {REFUSED[name]} is not supported" in messages, messages
        return
    if name in MISSING:
        assert not v.ok and any(p.type == "invalid_prompt" for p in v.errors)
        pytest.xfail(MISSING[name])
    assert v.ok and not v.errors, [f"{p.node_id} {p.class_type}: {p.message} {p.details}" for p in v.errors]


@pytest.mark.parametrize("name", RUNNABLE)
def test_comfy_templates_run_end_to_end(executor, dirs, name):
    if name in MISSING:
        pytest.xfail(MISSING[name])
    registry = api.default_registry()
    prompt = load_workflow(ALL[name], registry).prompt
    result = api.run(ALL[name], set=_small(prompt), executor=executor, models=dirs / "models",
                     input=dirs / "input", output=dirs / "output" / name)
    assert result.report.to_json()["status"] == "success"
    saved = [p for p in (dirs / "output" / name).rglob("*.png")]
    previews = [v for v in result.report.ui.values() if v.get("images")]
    assert saved or previews, f"{name} produced no image"
    for path in saved:
        png = Image.open(path)
        assert json.loads(png.text["workflow"])["nodes"]  # the UI graph travels in the PNG
    for node_id, values in result.outputs.items():
        for value in values:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert torch.isfinite(value).all(), (name, node_id)
