"""Precision and memory for the video and Qwen-Image families (issue 23): the memory estimate grows
with frames x resolution as a Wan run does (the DiT on [B, C, T, H, W], the Wan VAE by chunks of
frames plus the frames it writes), a huge video is estimated from the file header in seconds and
refused by name, the refusal naming the longest video length that fits. The NaN guard on an
overflowing f16 Wan DiT and per-component precision (bf16 first steps, f32 last; a bf16 DiT with an
f32 VAE) are in tests/test_video_precision_runs.py.

The models are the tiny stand-ins of the template tests (tests/fixtures/tiny_video_templates.py)
under the templates' file names."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest
import torch

from mixgraph.graph.env import Env
from mixgraph.nodes.models import memory_budget
from mixgraph.nodes.weights.synthetic import write_header_only
from mixgraph.ui import api
from mixgraph.ui.estimate import estimate, refusal
from tests.fixtures import tiny_video_templates

WAN = "wan2.1_t2v_1.3B_fp16.safetensors"
UMT5 = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
VAE = "wan_2.1_vae.safetensors"
QWEN = "qwen_image_fp8_e4m3fn.safetensors"
QWEN_TE = "qwen_2.5_vl_7b_fp8_scaled.safetensors"
FILES = {f"diffusion_models/{WAN}": "wan21_t2v_fp16", f"text_encoders/{UMT5}": "umt5_fp8_scaled",
         f"vae/{VAE}": "wan21_vae", f"diffusion_models/{QWEN}": "qwen_image_fp8",
         f"text_encoders/{QWEN_TE}": "qwen25_vl_fp8_scaled"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_precision")
    for rel, kind in FILES.items():
        tiny_video_templates.write_standin(root / rel, kind)
    return root


def t2v(width=32, height=32, length=5, steps=2, cfg=4.0, seed=3, unet=WAN, decode=True):
    """ComfyUI's Wan 2.1 text-to-video graph (its template's nodes) in API form."""
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": UMT5, "type": "wan"}},
        "4": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube turning", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": width, "height": height,
                                                                    "length": length, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": seed, "steps": steps, "cfg": cfg, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
    }
    if decode:
        p["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["9", 0]}}
        p["9"] = {"class_type": "VAELoader", "inputs": {"vae_name": VAE}}
        p["10"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}}
    return p


def _env(models):
    return Env.from_args(models=models)


# --------------------------------------------------------------------------------------------
# the memory estimate on video


def test_estimate_grows_with_frames_and_resolution(models):
    reg = api.default_registry()
    est = {(side, n): estimate(api.load(t2v(side, side, n), reg), reg, _env(models), "f32")
           for side in (64, 128) for n in (5, 81)}
    act = {k: e["nodes"]["3"]["activation_bytes"] for k, e in est.items()}
    assert act[(128, 81)] > 2.5 * act[(128, 5)]     # 21 latent frames against 2
    assert act[(128, 81)] > 2.5 * act[(64, 81)]     # 4x the tokens
    assert est[(128, 81)]["nodes"]["3"]["frames"] == 81
    # the VAE decode: its conv activations come a chunk at a time (the same for 5 and 81 frames),
    # the frames it writes grow: [81, 128, 128, 3] f32 against [5, ...]
    dec = {k: e["nodes"]["8"] for k, e in est.items()}
    assert dec[(128, 81)]["size"] == [1, 128, 128]
    assert dec[(128, 81)]["activation_bytes"] == dec[(128, 5)]["activation_bytes"]
    grown = dec[(128, 81)]["peak_bytes"] - dec[(128, 5)]["peak_bytes"]
    frames = (81 - 5) * 128 * 128 * 3 * 4
    sampled = (21 - 2) * 16 * 16 * 16 * 4          # the sampler's latent output, kept for the decode
    assert grown == frames + sampled


def test_video_vae_encode_counts_its_latent_channels(models):
    """VAEEncode of 9 frames with the Wan VAE: one video of 3 latent frames of 16 channels (not 9
    images of 4 channels), and the encode traced once, not once per frame."""
    reg = api.default_registry()
    p = {"9": {"class_type": "VAELoader", "inputs": {"vae_name": VAE}},
         "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 9, "color": 0}},
         "2": {"class_type": "VAEEncode", "inputs": {"pixels": ["1", 0], "vae": ["9", 0]}},
         "3": {"class_type": "VAEDecode", "inputs": {"samples": ["2", 0], "vae": ["9", 0]}},
         "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
    est = estimate(api.load(p, reg), reg, _env(models), "f32")
    one = dict(p, **{"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1,
                                                                  "color": 0}}})
    est1 = estimate(api.load(one, reg), reg, _env(models), "f32")
    enc, enc1 = est["nodes"]["2"], est1["nodes"]["2"]
    latent = 16 * 3 * 8 * 8 * 4
    # the f32 video and its [-1, 1] copy grow with the frames, the chunked activations do not
    assert enc["activation_bytes"] - enc1["activation_bytes"] == pytest.approx(1.5 * 2 * 8 * 64 * 64 * 3 * 4, abs=2)
    assert enc["peak_bytes"] - enc["activation_bytes"] - (enc1["peak_bytes"] - enc1["activation_bytes"]) == \
        latent - 16 * 1 * 8 * 8 * 4
    assert est["nodes"]["3"]["size"] == [1, 64, 64]          # one video of 9 frames decoded


def _wan14b_models(models: Path, tmp_path: Path):
    """A models folder with a header-only full-size Wan 2.1 14B t2v (`wan14b.safetensors`) beside
    the tiny umT5 and VAE: the estimate sees the real sizes, nothing is computed."""
    from mixgraph.nodes.families.wan.model import WanConfig, WanModel

    cfg = WanConfig(dim=5120, ffn_dim=13824, num_layers=40, text_dim=4096)
    with torch.device("meta"):
        shapes = {"model.diffusion_model." + k: tuple(v.shape) for k, v in WanModel(cfg).state_dict().items()}
    root = tmp_path / "models"
    write_header_only(root / "diffusion_models" / "wan14b.safetensors", shapes)
    for rel in (f"text_encoders/{UMT5}", f"vae/{VAE}"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((models / rel).read_bytes())
    return cfg, root


def test_huge_video_is_estimated_fast_and_refused_by_name(models, tmp_path):
    """1280x720, 161 frames on a full-size Wan 2.1 14B t2v (header only): the estimate takes
    seconds (fake tensors: no memory, no arithmetic, no per-token cost) and, in 24 GiB, the run is
    refused with the estimate and what would fit."""
    cfg, root = _wan14b_models(models, tmp_path)
    reg = api.default_registry()
    wf = api.load(t2v(1280, 720, 161, unet="wan14b.safetensors"), reg)
    start = time.perf_counter()
    roomy = memory_budget.Budget("cpu", 64 * 2**30, "test")   # the 28 GB model held whole
    est = estimate(wf, reg, _env(root), "bf16", budget=roomy)
    assert time.perf_counter() - start < 30
    node = est["nodes"]["3"]
    # (the weights load at the first node that uses the model, ModelSamplingSD3, and stay held)
    assert node["frames"] == 161 and est["weights_bytes"] >= 2 * 14e9 * 0.99
    # within a 16 GiB budget its blocks stream: counted at the streamed footprint
    tight = estimate(wf, reg, _env(root), "bf16", budget=memory_budget.Budget("cpu", 16 * 2**30, "test"))
    assert tight["nodes"]["3"]["streamed"] == ["MODEL"] and tight["nodes"]["3"]["weights_bytes"] < 12 * 2**30
    # 41 latent frames x 45 x 80 tokens of 5120 (bf16), batch 2 for CFG: GiBs of activations
    tokens = 41 * 45 * 80
    assert node["activation_bytes"] > 2 * tokens * cfg.dim * 2
    small = estimate(api.load(t2v(320, 192, 17, unet="wan14b.safetensors"), reg), reg, _env(root), "bf16",
                     budget=roomy)
    # (both carry the emulated-bf16 working copies of the weights on a CPU without native bf16)
    assert node["activation_bytes"] - small["nodes"]["3"]["activation_bytes"] > tokens * cfg.dim * 2
    start = time.perf_counter()
    msg = refusal(wf, reg, _env(root), "bf16", available=24 * 2**30)
    assert time.perf_counter() - start < 60
    assert msg is not None and "not enough memory" in msg and "KSampler" in msg


def test_refused_video_suggests_a_length_that_fits(models, tmp_path):
    """A Wan 2.1 14B run (header only) of 161 frames at 832x480 with memory between what 1 frame
    and 161 frames need: the refusal names the longest length (1 + 4k frames) that fits under the
    same precision and the `--set` that asks for it, and the estimate agrees: that length fits,
    four frames more do not. A video no length of which fits says so; an image run gets no
    length hint."""
    from mixgraph.ui.estimate import BASE_BYTES

    cfg, root = _wan14b_models(models, tmp_path)
    reg = api.default_registry()

    def peak(length: int) -> int:
        return estimate(api.load(t2v(832, 480, length, unet="wan14b.safetensors"), reg), reg, _env(root),
                        "bf16")["peak_bytes"]

    one, full = peak(1), peak(161)
    assert one < full
    room = (one + full) // 2
    wf = api.load(t2v(832, 480, 161, unet="wan14b.safetensors"), reg)
    msg = refusal(wf, reg, _env(root), "bf16", available=room - BASE_BYTES)
    assert msg is not None and "not enough memory" in msg
    found = re.search(r"or a shorter video under this precision: length (\d+) would fit .*--set 5\.length=(\d+)", msg)
    assert found, msg
    n = int(found.group(1))
    assert int(found.group(2)) == n and (n - 1) % 4 == 0 and 1 <= n < 161
    assert peak(n) <= room < peak(n + 4)

    # over the memory budget while the machine has room: the budget's refusal names a length too
    memory_budget.set_budget("cpu", max(1.0, (one + full) / 2 / 2**30 - 1.0))
    try:
        over = refusal(wf, reg, _env(root), "bf16", available=2 * full)
    finally:
        memory_budget.reset()
    assert over is not None and "even with model blocks streamed" in over, over
    assert re.search(r"--memory-budget \d+ would fit; or a shorter video under this precision: length \d+ "
                     r"would fit|not even one frame fits", over), over

    tight = refusal(wf, reg, _env(root), "bf16", available=one - BASE_BYTES - 2**30)
    assert tight is not None and "not even one frame fits at this size" in tight
    image = api.load(t2v(832, 480, 1, unet="wan14b.safetensors"), reg)
    image.prompt["5"] = dataclasses.replace(image.prompt["5"], class_type="EmptySD3LatentImage", inputs={
        "width": 832, "height": 480, "batch_size": 1})
    flat = refusal(image, reg, _env(root), "bf16", available=one // 2)
    assert flat is not None and "length" not in flat
