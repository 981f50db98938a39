"""Every example workflow in workflows/ runs end to end on tiny generated checkpoints.

Sizes and step counts are overridden (as `mixgraph run --set` would) to keep CPU time small;
everything else — loaders, detection, text encoding, LoRA, ControlNet, sampling, VAE, PNG
metadata, precision regions — runs as a user's workflow would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from mixgraph.ui import api
from mixgraph.graph.executor import Executor
from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from tests.fixtures.checkpoints import write_sd15, write_sdxl, write_sdxl_refiner
from tests.fixtures.tiny_vision import write_sd2_unclip
from tests.fixtures.tiny_zero123 import stable_zero123_state_dict
from tests.fixtures.tiny_x4 import write_sd2_x4
from tests.fixtures.workflow_models import write_controlnet, write_lora

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"
SIZE = 64

# Per-workflow overrides: small images, few steps (phase splits keep their meaning).
SMALL_TXT2IMG = {"5.width": SIZE, "5.height": SIZE, "3.steps": 3}
OVERRIDES = {
    "txt2img_sd15.json": SMALL_TXT2IMG,
    "img2img_sd15.json": {"3.steps": 3},
    "inpaint_vae_encode_sd15.json": {"3.steps": 3},
    "inpaint_model_sd15.json": {"3.steps": 3},
    "lora_sd15.json": SMALL_TXT2IMG,
    "controlnet_sd15.json": SMALL_TXT2IMG,
    "hires_fix_sd15.json": {**SMALL_TXT2IMG, "10.width": 96, "10.height": 96, "11.steps": 2},
    "txt2img_sdxl_refiner.json": {"5.width": SIZE, "5.height": SIZE, "10.steps": 5,
                                  "10.end_at_step": 4, "11.steps": 5, "11.start_at_step": 4},
    "precision_bf16_unet_f32_vae.json": {**SMALL_TXT2IMG, "5.width": 32, "5.height": 32},
    "precision_f16_vae_fallback.json": {**SMALL_TXT2IMG, "5.width": 32, "5.height": 32},
    "precision_phase.json": {"5.width": 32, "5.height": 32, "3.steps": 4, "3.end_at_step": 3,
                             "13.steps": 4, "13.start_at_step": 3},
    "precision_f32_text_bf16_unet.json": {**SMALL_TXT2IMG, "5.width": 32, "5.height": 32,
                                          "3.steps": 2},
    "ui_txt2img_bf16_group.json": {**SMALL_TXT2IMG, "5.width": 32, "5.height": 32, "3.steps": 2},
    # on the embedded model and what was made for it (nodes/models/data/models), at their size
    "txt2img_shapes.json": {"3.steps": 3},
    "lora_shapes.json": {"3.steps": 3},
    "controlnet_shapes.json": {"3.steps": 3},
    "custom_sampling_sd15.json": {"5.width": SIZE, "5.height": SIZE, "11.steps": 4, "15.step": 2},
    "unclip_sd21.json": SMALL_TXT2IMG,
    "stable_zero123.json": {"3.width": SIZE, "3.height": SIZE, "4.steps": 3},
    "upscale_x4_sd2.json": {"12.scale_ratio": 1.0, "3.steps": 2},  # 64x64 in, 64x64 out
}
EXPECTED_SIZE = {"txt2img_shapes.json": 256, "lora_shapes.json": 256, "controlnet_shapes.json": 256,
                 "hires_fix_sd15.json": 96, "precision_bf16_unet_f32_vae.json": 32,
                 "precision_f16_vae_fallback.json": 32, "precision_phase.json": 32,
                 "precision_f32_text_bf16_unet.json": 32, "ui_txt2img_bf16_group.json": 32}
EXPECTED_PRECISION = {
    "precision_bf16_unet_f32_vae.json": {"3": "bf16", "8": "f32"},
    "precision_phase.json": {"3": "bf16", "13": "f32"},
    "precision_f32_text_bf16_unet.json": {"6": "f32", "7": "f32", "3": "bf16", "8": "f32"},
    "ui_txt2img_bf16_group.json": {"3": "bf16", "8": "f32", "6": "f32"},  # group region; auto=f32 on CPU
}


def _write_images(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(folder / "example.png")
    rgba = rng.integers(0, 255, (SIZE, SIZE, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    rgba[16:40, 16:40, 3] = 0  # transparent hole = area to inpaint
    Image.fromarray(rgba, "RGBA").save(folder / "inpaint_example.png")
    edges = np.zeros((SIZE, SIZE, 3), np.uint8)
    edges[::8] = 255
    Image.fromarray(edges).save(folder / "control_edges.png")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("workflows")
    ckpt = root / "models" / "checkpoints"
    ckpt.mkdir(parents=True)
    write_sd15(ckpt / "sd15.safetensors", seed=1)
    write_sd15(ckpt / "sd15_inpaint.safetensors", seed=2, inpaint=True)
    write_sdxl(ckpt / "sdxl_base.safetensors", seed=3)
    write_sdxl_refiner(ckpt / "sdxl_refiner.safetensors", seed=4)
    write_lora(root / "models" / "loras" / "sd15_lora.safetensors", ckpt / "sd15.safetensors")
    write_controlnet(root / "models" / "controlnet" / "sd15_controlnet.safetensors")
    write_sd2_unclip(ckpt / "sd21_unclip.safetensors", seed=5)
    # the released file is a pickle (.ckpt); the loader opens it with weights_only=True
    torch.save({"state_dict": stable_zero123_state_dict(seed=6)[0]}, ckpt / "stable_zero123.ckpt")
    write_sd2_x4(ckpt / "x4-upscaler-ema.safetensors", seed=6)
    _write_images(root / "input")
    return root


@pytest.fixture(scope="module")
def executor(dirs):
    return Executor(api.default_registry(), Env.from_args(models=dirs / "models", input=dirs / "input",
                                                          output=dirs / "output"),
                    cache=OutputCache(max_bytes=2 << 30))


def _run(executor, dirs, name, overrides=None, **kw):
    return api.run(WORKFLOWS / name, set=OVERRIDES.get(name, {}) | (overrides or {}),
                   executor=executor, models=dirs / "models", input=dirs / "input",
                   output=dirs / "output", **kw)


def test_workflows_all_validate(dirs):
    registry = api.default_registry()
    names = sorted(p.name for p in WORKFLOWS.glob("*.json"))
    assert set(names) == set(OVERRIDES), "every example workflow needs a test entry"
    env = Env.from_args(models=dirs / "models", input=dirs / "input")
    for name in names:
        wf = load_workflow(WORKFLOWS / name, registry)
        v = validate(wf.prompt, registry, env)
        assert v.ok and not v.errors, (name, v.errors)


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_workflow_runs_end_to_end(executor, dirs, name):
    result = _run(executor, dirs, name)
    report = result.report.to_json()
    assert report["status"] == "success"
    files = result.files
    assert files, f"{name} wrote no image"
    size = EXPECTED_SIZE.get(name, SIZE)
    for path in files:
        png = Image.open(path)
        assert png.size == (size, size)
        assert "prompt" in png.text and json.loads(png.text["prompt"])
        if name.startswith("ui_"):  # a UI-format file travels in the PNG's workflow chunk
            assert json.loads(png.text["workflow"])["nodes"]
    for node_id, values in result.outputs.items():
        for value in values:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert torch.isfinite(value).all(), (name, node_id)
    for node_id, spec in EXPECTED_PRECISION.get(name, {}).items():
        assert report["nodes"][node_id]["precision"] == spec, (name, node_id, report["nodes"][node_id])


def test_workflow_seed_change_reruns_only_sampler_and_descendants(executor, dirs):
    _run(executor, dirs, "txt2img_sd15.json")
    again = _run(executor, dirs, "txt2img_sd15.json", {"3.seed": 1234})
    assert sorted(again.report.executed) == ["3", "8", "9"]
    assert {"4", "5", "6", "7"} <= set(again.report.cached)


def test_workflow_f16_vae_overflow_falls_back_to_f32(tmp_path, dirs):
    """A VAE whose first decoder conv overflows f16 (|x| > 65504) but is fine in f32 (the norm
    after it rescales): the decode node alone re-runs in f32 and the report says so."""
    models = tmp_path / "models"
    (models / "checkpoints").mkdir(parents=True)
    sd = load_file(str(dirs / "models" / "checkpoints" / "sd15.safetensors"))
    sd["first_stage_model.decoder.conv_in.weight"] = sd["first_stage_model.decoder.conv_in.weight"] * 3e4
    save_file(sd, str(models / "checkpoints" / "sd15.safetensors"))
    ex = Executor(api.default_registry(), Env.from_args(models=models, output=tmp_path / "out"))
    result = api.run(WORKFLOWS / "precision_f16_vae_fallback.json", executor=ex, models=models,
                     output=tmp_path / "out", set=OVERRIDES["precision_f16_vae_fallback.json"])
    nodes = result.report.to_json()["nodes"]
    assert nodes["8"]["nan_fallback"] is True and nodes["8"]["precision"] == "f16:f32"
    assert nodes["3"]["nan_fallback"] is False and nodes["3"]["precision"] == "f16+upcast"
    assert torch.isfinite(result.outputs["8"][0]).all()
