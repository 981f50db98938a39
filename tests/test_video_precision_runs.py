"""Precision on video and Qwen-Image runs, as a user builds them (issue 23, the video-diffusion
precision plan): the NaN guard re-runs an f16 region whose Wan DiT overflows in f32 by itself and
gives the f32 result, while a region that does not overflow stays f16; a Wan run with bf16 for its
first steps and f32 for its last (two KSamplerAdvanced in two precision regions); a Qwen-Image run
with a bf16 DiT and an f32 VAE (`--precision MODEL=bf16,VAE=f32`).

What each part computed in is read from the models themselves (a spy on the blocks' forward), not
only from the run report. The models are the tiny stand-ins of the template tests
(tests/fixtures/tiny_video_templates.py) under the templates' file names; the overflowing Wan DiT
is the same file with one block's FFN gate and bias raised (finite in f16 storage, its residual
past f16's range)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.families.qwen_image.model import QwenImageBlock
from mixgraph.nodes.families.wan.model import WanBlock
from mixgraph.nodes.vae.wan_vae import CausalConv3d
from mixgraph.ui import api
from tests.fixtures import tiny_video_templates

WAN = "wan2.1_t2v_1.3B_fp16.safetensors"
OVERFLOW = "wan2.1_t2v_overflow_fp16.safetensors"
UMT5 = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
VAE = "wan_2.1_vae.safetensors"
QWEN = "qwen_image_fp8_e4m3fn.safetensors"
QWEN_TE = "qwen_2.5_vl_7b_fp8_scaled.safetensors"
QWEN_VAE = "qwen_image_vae.safetensors"
FILES = {f"diffusion_models/{WAN}": "wan21_t2v_fp16", f"text_encoders/{UMT5}": "umt5_fp8_scaled",
         f"vae/{VAE}": "wan21_vae", f"diffusion_models/{QWEN}": "qwen_image_fp8",
         f"text_encoders/{QWEN_TE}": "qwen25_vl_fp8_scaled", f"vae/{QWEN_VAE}": "wan21_vae"}
BLOCK = "model.diffusion_model.blocks.0."


def write_overflowing_wan(path: Path) -> None:
    """The fp16 Wan 2.1 stand-in with block 0's MLP gate (modulation row 5) at 3e4 and its MLP
    output bias at 300: every weight is finite in f16, but the block's residual
    ``x + ffn(..) * gate`` is about 9e6, past f16's largest finite value (65504), so f16 compute
    turns it into inf (then NaN after the next norm); f32 computes it, and the norms after it
    bring it back to the usual range."""
    sd = tiny_video_templates.KINDS["wan21_t2v_fp16"]()
    sd[BLOCK + "modulation"][:, 5] = 3e4
    sd[BLOCK + "ffn.2.bias"][:] = 300.0
    assert all(torch.isfinite(v).all() for v in sd.values() if v.is_floating_point())
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_precision_runs")
    for rel, kind in FILES.items():
        tiny_video_templates.write_standin(root / rel, kind)
    write_overflowing_wan(root / "diffusion_models" / OVERFLOW)
    return root


def _executor(models) -> Executor:
    """A fresh executor (an empty output cache), so every run samples again."""
    env = Env.from_args(models=models, output=models / "out")
    return Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 28))


def _run(models, prompt: dict, regions: dict[str, tuple[list[str], str]] = (), default: str | None = None,
         precision: str | None = None):
    """Run an API prompt as a mixgraph envelope with these precision regions (name -> (node ids,
    SPEC)), as a workflow file a user writes does."""
    config: dict = {"regions": [{"name": n, "nodes": ids, "precision": spec} for n, (ids, spec) in dict(regions).items()]}
    if default is not None:
        config["default"] = default
    envelope = {"format": "mixgraph/1", "prompt": prompt, "precision": config}
    ex = _executor(models)
    return ex.run(load_workflow(envelope, ex.registry), precision=precision)


@pytest.fixture
def computed(monkeypatch):
    """The dtype each forward of a spied class received, in call order: `spy(cls)` wraps
    `cls.forward` (for every instance, materialized before or after) and returns the list."""

    def spy(cls) -> list[torch.dtype]:
        seen: list[torch.dtype] = []
        forward = cls.forward

        def recording(self, x, *args, **kwargs):
            seen.append(x.dtype)
            return forward(self, x, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", recording)
        return seen

    return spy


def t2v(unet: str = WAN, steps: int = 2) -> dict:
    """ComfyUI's Wan 2.1 text-to-video graph (its template's nodes), 32x32, 5 frames, the latent
    saved."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": UMT5, "type": "wan"}},
        "4": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube turning", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 32, "height": 32, "length": 5,
                                                                    "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": 3, "steps": steps, "cfg": 4.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "wan/prec"}},
    }


# --------------------------------------------------------------------------------------------
# the NaN guard on video


def test_f16_wan_region_that_overflows_falls_back_to_f32(models, computed):
    """An f16 region around the KSampler of an overflowing Wan DiT: the sampled latent holds
    NaN/Inf, the guard warns and re-runs the node with f32 compute (storage kept f16), and the
    result is the one an f16:f32 region gives, which is the all-f32 result (an fp16 file)."""
    seen = computed(WanBlock)
    report = _run(models, t2v(OVERFLOW), {"dit [f16]": (["3"], "f16")}, default="f32")
    node = report.nodes["3"]
    assert node.nan_fallback is True and node.precision == "f16:f32"
    assert any("produced NaN/Inf under f16" in w and "f32 compute" in w for w in report.warnings)
    # the f16 attempt ran (and overflowed), then the whole node again in f32
    assert seen and seen[0] == torch.float16 and seen[-1] == torch.float32
    first_f32 = seen.index(torch.float32)
    assert set(seen[:first_f32]) == {torch.float16} and set(seen[first_f32:]) == {torch.float32}
    got = report.values["3"][0].samples
    assert torch.isfinite(got).all() and got.abs().max() > 0

    explicit = _run(models, t2v(OVERFLOW), {"dit": (["3"], "f16:f32")}, default="f32")
    assert not explicit.nodes["3"].nan_fallback and explicit.nodes["3"].precision == "f16:f32"
    assert torch.equal(got, explicit.values["3"][0].samples)
    f32 = _run(models, t2v(OVERFLOW), default="f32").values["3"][0].samples
    assert torch.allclose(got, f32, rtol=1e-5, atol=1e-6)


def test_f16_wan_region_that_does_not_overflow_stays_f16(models, computed):
    """The same region on the stand-in as shipped: no fallback, no warning about it, every block
    computed in f16, and the video within f16 rounding of the f32 one."""
    seen = computed(WanBlock)
    report = _run(models, t2v(WAN), {"dit [f16]": (["3"], "f16")}, default="f32")
    node = report.nodes["3"]
    assert node.nan_fallback is False and node.precision == "f16"
    assert not any("NaN/Inf" in w for w in report.warnings)
    assert seen and set(seen) == {torch.float16}
    half = report.values["3"][0].samples
    f32 = _run(models, t2v(WAN), default="f32").values["3"][0].samples
    assert torch.isfinite(half).all() and not torch.equal(half, f32)
    assert (half - f32).abs().max() <= 0.01 * f32.abs().max()


# --------------------------------------------------------------------------------------------
# per-component precision


def two_phase(steps: int = 4, split: int = 2) -> dict:
    """The Wan t2v graph sampled by two KSamplerAdvanced on one model: "h" the first `split`
    steps (returning its leftover noise), "l" the rest without new noise (Wan 2.2's two-sampler
    layout, one model)."""
    p = t2v()
    del p["3"]
    common = {"model": ["4", 0], "noise_seed": 3, "steps": steps, "cfg": 4.0, "sampler_name": "euler",
              "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0]}
    p["h"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "add_noise": "enable", "latent_image": ["5", 0], "start_at_step": 0, "end_at_step": split,
        "return_with_leftover_noise": "enable"}}
    p["l"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "add_noise": "disable", "latent_image": ["h", 0], "start_at_step": split,
        "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
    p["9"]["inputs"]["samples"] = ["l", 0]
    return p


def test_wan_bf16_first_steps_f32_last_steps(models, computed):
    """Two precision regions, `first steps [bf16]` around the first sampler and `last steps [f32]`
    around the second: the first sampler's model computes in bf16, the second's in f32 (each
    asked of the blocks as they run), the report says so, and the video is within bf16 rounding
    of the all-f32 one (and not equal to it)."""
    seen = computed(WanBlock)
    regions = {"first steps [bf16]": (["h"], "bf16"), "last steps [f32]": (["l"], "f32")}
    report = _run(models, two_phase(), regions)
    assert report.nodes["h"].precision == "bf16" and report.nodes["l"].precision == "f32"
    assert not report.nodes["h"].nan_fallback and not report.nodes["l"].nan_fallback
    # "h" runs first (the second sampler takes its latent): its two steps' calls, then "l"'s
    half = len(seen) // 2
    assert len(seen) == 2 * half > 0
    assert set(seen[:half]) == {torch.bfloat16} and set(seen[half:]) == {torch.float32}
    mixed = report.values["l"][0].samples

    f32 = _run(models, two_phase(), default="f32")
    assert f32.nodes["h"].precision == f32.nodes["l"].precision == "f32"
    want = f32.values["l"][0].samples
    assert torch.isfinite(mixed).all() and not torch.equal(mixed, want)
    assert (mixed - want).abs().max() <= 0.05 * want.abs().max()
    # the last steps in f32 do count: all-bf16 lands elsewhere than bf16-then-f32
    bf16 = _run(models, two_phase(), default="bf16").values["l"][0].samples
    assert not torch.equal(bf16, mixed)


def test_qwen_image_bf16_dit_f32_vae(models, computed):
    """Qwen-Image text-to-image with `--precision MODEL=bf16,VAE=f32`: the DiT's blocks compute in
    bf16, the Wan VAE's 3-D convolutions decode in f32, the report names each policy, and the
    image is within bf16 rounding of the all-f32 one."""
    dit, vae = computed(QwenImageBlock), computed(CausalConv3d)
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": QWEN, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": QWEN_TE, "type": "qwen_image"}},
        "4": {"class_type": "ModelSamplingAuraFlow", "inputs": {"model": ["1", 0], "shift": 3.1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube on a table", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "9": {"class_type": "VAELoader", "inputs": {"vae_name": QWEN_VAE}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["9", 0]}},
        "10": {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}},
    }
    report = _run(models, p, precision="MODEL=bf16,VAE=f32")
    assert report.nodes["3"].precision == "bf16" and report.nodes["8"].precision == "f32"
    assert dit and set(dit) == {torch.bfloat16}
    assert vae and set(vae) == {torch.float32}
    image = report.values["8"][0]
    assert image.dtype == torch.float32 and image.shape == (1, 32, 32, 3)

    dit.clear()
    vae.clear()
    f32 = _run(models, p, precision="f32")
    assert set(dit) == {torch.float32} and set(vae) == {torch.float32}
    want = f32.values["8"][0]
    assert not torch.equal(image, want) and (image - want).abs().max() <= 0.05
