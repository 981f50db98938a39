"""Custom sampling end to end on a tiny generated SD1.5 checkpoint, through the engine:
SamplerCustom and SamplerCustomAdvanced give KSampler's latent for the same settings, DisableNoise
+ AddNoise stages the noise, and the MODEL precision resolves as for KSampler."""

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
    root = tmp_path_factory.mktemp("custom_sampling")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models),
                    cache=OutputCache(max_bytes=1 << 30))


def base_prompt(sampler_name="euler_ancestral", scheduler="normal", denoise=1.0):
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage",
              "inputs": {"width": 64, "height": 64, "batch_size": 2}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": SEED, "steps": STEPS, "cfg": CFG,
            "sampler_name": sampler_name, "scheduler": scheduler, "positive": ["6", 0],
            "negative": ["7", 0], "latent_image": ["5", 0], "denoise": denoise}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler_name}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": ["4", 0], "scheduler": scheduler, "steps": STEPS, "denoise": denoise}},
        "20": {"class_type": "SamplerCustom", "inputs": {
            "model": ["4", 0], "add_noise": True, "noise_seed": SEED, "cfg": CFG,
            "positive": ["6", 0], "negative": ["7", 0], "sampler": ["10", 0],
            "sigmas": ["11", 0], "latent_image": ["5", 0]}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "CFGGuider", "inputs": {
            "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": CFG}},
        "21": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0],
            "sigmas": ["11", 0], "latent_image": ["5", 0]}},
    }


def run(executor, models, prompt, targets, **kw):
    """Run with a VAEDecode + PreviewImage after each target (a prompt needs output nodes)."""
    prompt = dict(prompt)
    for nid in targets:
        prompt[f"d{nid}"] = {"class_type": "VAEDecode",
                             "inputs": {"samples": [nid, 0], "vae": ["4", 2]}}
        prompt[f"p{nid}"] = {"class_type": "PreviewImage", "inputs": {"images": [f"d{nid}", 0]}}
    return api.run(prompt, executor=executor, models=models, output=models / "out", **kw)


@pytest.mark.parametrize("sampler_name,scheduler", [("euler_ancestral", "normal"),
                                                    ("dpmpp_2m_sde", "karras"),
                                                    ("euler", "simple")])
def test_custom_samplers_reproduce_ksampler_on_tiny_sd15(executor, models, sampler_name,
                                                         scheduler):
    res = run(executor, models, base_prompt(sampler_name, scheduler), ["3", "20", "21"])
    ks = res.outputs["3"][0].samples
    custom, custom_x0 = (v.samples for v in res.outputs["20"])
    adv, adv_x0 = (v.samples for v in res.outputs["21"])
    assert torch.isfinite(ks).all() and ks.abs().max() > 0
    assert torch.equal(custom, ks) and torch.equal(adv, ks)
    assert torch.equal(custom_x0, adv_x0)


def test_custom_sampling_denoise_matches_ksampler(executor, models):
    """denoise < 1 on a non-empty latent (scaled by the model's latent scale inside)."""
    prompt = base_prompt("euler", "karras", denoise=0.7)
    prompt["32"] = {"class_type": "KSampler", "inputs": {**prompt["3"]["inputs"],
                                                         "denoise": 1.0, "seed": SEED + 7}}
    for nid in ("3", "20", "21"):
        prompt[nid]["inputs"]["latent_image"] = ["32", 0]
    res = run(executor, models, prompt, ["3", "20", "21"])
    ks = res.outputs["3"][0].samples
    assert not torch.equal(ks, res.outputs["32"][0].samples)
    assert torch.equal(res.outputs["20"][0].samples, ks)
    assert torch.equal(res.outputs["21"][0].samples, ks)


def test_disable_noise_plus_add_noise_matches_random_noise(executor, models):
    """SamplerCustomAdvanced(DisableNoise) on AddNoise(RandomNoise)'s latent equals sampling
    with RandomNoise directly, for a schedule below σmax (no max-denoise rescale)."""
    prompt = base_prompt("euler", "karras", denoise=0.6)
    prompt["40"] = {"class_type": "DisableNoise", "inputs": {}}
    prompt["41"] = {"class_type": "AddNoise", "inputs": {
        "model": ["4", 0], "noise": ["12", 0], "sigmas": ["11", 0], "latent_image": ["5", 0]}}
    prompt["42"] = {"class_type": "SamplerCustomAdvanced", "inputs": {
        "noise": ["40", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
        "latent_image": ["41", 0]}}
    res = run(executor, models, prompt, ["21", "42"])
    direct, staged = res.outputs["21"][0].samples, res.outputs["42"][0].samples
    torch.testing.assert_close(staged, direct, rtol=0, atol=1e-4)


def test_sampler_custom_advanced_resolves_model_precision_like_ksampler(executor, models):
    res = run(executor, models, base_prompt("euler", "normal"), ["3", "21"], precision="bf16")
    nodes = res.report.to_json()["nodes"]
    assert nodes["21"]["precision"] == nodes["3"]["precision"] == "bf16"
    torch.testing.assert_close(res.outputs["21"][0].samples, res.outputs["3"][0].samples,
                               rtol=0, atol=0)


def test_sampler_custom_reports_progress_per_step(executor, models):
    events = []
    prompt = base_prompt("euler", "normal")
    prompt["20"]["inputs"]["noise_seed"] = SEED + 1  # not cached by the runs above
    run(executor, models, prompt, ["20"], on_event=lambda *a: events.append(a))
    progress = [(e.value, e.max) for (e,) in events
                if type(e).__name__ == "Progress" and e.node == "20"]
    assert progress == [(i, STEPS) for i in range(1, STEPS + 1)]
