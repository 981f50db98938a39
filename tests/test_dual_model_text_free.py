"""DualModelGuider with no negative wired: ComfyUI's text-free negative (``[[None, {}]]``, no
``c_crossattn``), evaluated with no cross-attention context (each cross-attention then attends to
the image tokens, ComfyUI's ``default(context, x)``). Run on a tiny SD1.5-layout UNet whose
cross-attention takes its own block width (so it can run text-free), against a hand-made UNet
call; refused with a clear error on the SD-layout UNets, whose text is wider than their blocks,
and never evaluated at cfg 1."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.sampling import custom_sampling_nodes as csn
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict
from mixgraph.nodes.families.sd.unet import UNetConfig, UNetModel, context_free_mismatch
from mixgraph.nodes.payloads.conditioning import TEXT_FREE, Cond
from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.sampling.guidance import build_denoiser
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.ui import api
from tests.fixtures.checkpoints import (UNET_PREFIX, VAE_PREFIX, with_prefix, save_state_dict, sd15_state_dict,
                                        tiny_clip_l_state_dict, tiny_vae_state_dict)
from tests.fixtures.tiny_unet import tiny_unet, tiny_unet_config

F32 = parse_spec("f32")


def _text_free_config() -> UNetConfig:
    """The tiny SD1.5 UNet with one channel width (32) everywhere, equal to its text width."""
    return UNetConfig(**{**vars(tiny_unet_config("sd15")), "channel_mult": (1, 1)})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_free")
    (root / "checkpoints").mkdir()
    unet = random_state_dict(module_shapes(lambda: UNetModel(_text_free_config())), 3)
    sd = with_prefix(UNET_PREFIX, unet) | with_prefix(VAE_PREFIX, tiny_vae_state_dict(4))
    sd |= with_prefix("cond_stage_model.transformer.", tiny_clip_l_state_dict(5, width=32))
    save_state_dict(root / "checkpoints" / "free.safetensors", sd)
    save_state_dict(root / "checkpoints" / "sd15.safetensors", sd15_state_dict(6))
    return root


def test_context_free_mismatch_names_the_first_wider_text():
    assert context_free_mismatch(tiny_unet("sd15")) == (32, 64)  # the middle block: 64 wide
    assert context_free_mismatch(tiny_unet("sdxl")) == (64, 128)
    with torch.device("meta"):
        assert context_free_mismatch(UNetModel(_text_free_config())) is None


def test_dual_model_guider_unconnected_negative_is_text_free():
    pos = (Cond(torch.ones(1, 2, 3)),)
    (g,) = csn.DualModelGuider(model="m", model_negative=None, positive=pos, cfg=3.0, negative=None)
    assert g.guidance.kind == "cfg" and g.guidance.conds == (pos, TEXT_FREE)
    assert TEXT_FREE[0].cross_attn is None


def _text_free_x0(runner, x, sigma):
    """The UNet called by hand with no context, turned into x0."""
    ms = ModelSampling.for_model(runner)
    out = runner.unet(ms.calculate_input(sigma, x), ms.timestep(sigma).float(), None)
    return ms.calculate_denoised(sigma, out.float(), x)


@pytest.mark.parametrize("kind", ["cfg", "dual_model"])
def test_text_free_negative_runs_the_unet_without_context(models, kind):
    handle, _, _ = loader.load_checkpoint(models / "checkpoints" / "free.safetensors")
    runner = handle.runner(F32)
    g = torch.Generator().manual_seed(1)
    pos = (Cond(torch.randn(1, 77, 32, generator=g)),)
    x = torch.randn(1, 4, 8, 8, generator=g)
    sigma = torch.tensor([3.0])
    (guider,) = csn.DualModelGuider(model=handle, model_negative=handle if kind == "dual_model" else None,
                                    positive=pos, cfg=4.0, negative=None)
    assert guider.guidance.kind == kind
    ms = ModelSampling.for_model(runner)
    den = build_denoiser(guider.guidance, runner, x, None, ms,
                         negative_model=runner if kind == "dual_model" else None)
    (cond,) = den.calc_cond_batch([den.positive], x, sigma)
    uncond = _text_free_x0(runner, x, sigma)
    assert torch.allclose(den(x, sigma), uncond + 4.0 * (cond - uncond), atol=1e-5)
    # a text-free prediction is not the positive's, nor a zero-text one
    zero = build_denoiser(Guidance("cfg", (pos, (Cond(torch.zeros(1, 77, 32)),)), (4.0,)),
                          runner, x, None, ms)
    assert not torch.allclose(uncond, zero.calc_cond_batch([zero.negative], x, sigma)[0], atol=1e-3)


def _prompt(ckpt, cfg):
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": ["4", 0], "scheduler": "normal", "steps": 2, "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": 3}},
        "13": {"class_type": "BasicGuider", "inputs": {"model": ["4", 0], "conditioning": ["6", 0]}},
        "14": {"class_type": "DualModelGuider", "inputs": {
            "model": ["4", 0], "model_negative": ["4", 0], "positive": ["6", 0], "cfg": cfg}},
        "21": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["5", 0]}},
        "22": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["14", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["5", 0]}},
        "d21": {"class_type": "VAEDecode", "inputs": {"samples": ["21", 0], "vae": ["4", 2]}},
        "d22": {"class_type": "VAEDecode", "inputs": {"samples": ["22", 0], "vae": ["4", 2]}},
        "p21": {"class_type": "PreviewImage", "inputs": {"images": ["d21", 0]}},
        "p22": {"class_type": "PreviewImage", "inputs": {"images": ["d22", 0]}},
    }


def _run(models, prompt):
    ex = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 28))
    return api.run(prompt, executor=ex, models=models, output=models / "out").outputs


def test_text_free_negative_end_to_end(models):
    out = _run(models, _prompt("free.safetensors", 5.0))
    guided, positive_only = out["22"][0].samples, out["21"][0].samples
    assert torch.isfinite(guided).all()
    assert (guided - positive_only).abs().max() > 0.05 * positive_only.abs().max()


def test_text_free_negative_refused_on_sd_layout_unet_and_free_at_cfg_one(models):
    prompt = _prompt("sd15.safetensors", 5.0)
    with pytest.raises(Exception, match=r"'negative' is not connected.*32-wide text tokens, not its 64-wide"):
        _run(models, prompt)
    # at cfg 1 the negative is never evaluated: DualModelGuider is the positive alone
    out = _run(models, _prompt("sd15.safetensors", 1.0))
    assert torch.equal(out["22"][0].samples, out["21"][0].samples)
