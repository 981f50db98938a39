"""DualModelGuider end to end on tiny generated SD1.5 checkpoints, through the engine: with the
same model for both passes it is CFGGuider; a second checkpoint changes only the negative pass;
an unconnected negative is ComfyUI's text-free pass, which these SD-layout UNets refuse with a
clear error naming the node (tests/test_dual_model_text_free.py runs it where it can run)."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15

SEED, STEPS, CFG = 5, 3, 6.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dual_model")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "a.safetensors", seed=1)
    write_sd15(root / "checkpoints" / "b.safetensors", seed=2)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models),
                    cache=OutputCache(max_bytes=1 << 30))


def prompt(negative_model=("4", 0), cfg=CFG):
    p = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
        "8": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "b.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": ["4", 0], "scheduler": "normal", "steps": STEPS, "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "CFGGuider", "inputs": {
            "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": cfg}},
        "14": {"class_type": "DualModelGuider", "inputs": {
            "model": ["4", 0], "model_negative": list(negative_model), "positive": ["6", 0],
            "negative": ["7", 0], "cfg": cfg}},
    }
    for nid, guider in (("21", "13"), ("22", "14")):
        p[nid] = {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": [guider, 0], "sampler": ["10", 0],
            "sigmas": ["11", 0], "latent_image": ["5", 0]}}
        p[f"d{nid}"] = {"class_type": "VAEDecode", "inputs": {"samples": [nid, 0], "vae": ["4", 2]}}
        p[f"p{nid}"] = {"class_type": "PreviewImage", "inputs": {"images": [f"d{nid}", 0]}}
    return p


def _latents(executor, models, p):
    res = api.run(p, executor=executor, models=models, output=models / "out")
    return res.outputs["21"][0].samples, res.outputs["22"][0].samples


def test_dual_model_guider_with_the_same_model_is_cfg_guider(executor, models):
    cfg, dual = _latents(executor, models, prompt())
    assert torch.isfinite(cfg).all() and cfg.abs().max() > 0
    # equal up to float rounding (the two passes are separate UNet calls, not one batch)
    assert (dual - cfg).abs().max() < 1e-4 * cfg.abs().max()


def test_dual_model_guider_second_checkpoint_changes_the_negative_pass(executor, models):
    cfg, dual = _latents(executor, models, prompt(("8", 0)))
    assert torch.isfinite(dual).all()
    assert (dual - cfg).abs().max() > 0.05 * cfg.abs().max()
    # at cfg 1 only the positive runs: the second model has no effect
    cfg1, dual1 = _latents(executor, models, prompt(("8", 0), cfg=1.0))
    assert torch.equal(dual1, cfg1)


def test_dual_model_guider_without_negative_is_a_clear_error(executor, models):
    p = prompt(("8", 0))
    del p["14"]["inputs"]["negative"]
    with pytest.raises(Exception, match="'negative' is not connected"):
        _latents(executor, models, p)
