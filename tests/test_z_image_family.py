"""The Z-Image family (``nodes/families/lumina``): NextDiT in its Z-Image settings against
diffusers' ``ZImageTransformer2DModel`` on a tiny config (captions of different lengths in one
batch, token counts off the 32-token padding), detection from shapes beside Lumina 2, ComfyUI's
sampling settings, a text-free pass on the learned pad tokens, and the Z-Image Turbo workflow
(UNETLoader on a bare ``z_image_turbo_bf16.safetensors``, KSampler at cfg 1 with
ConditioningZeroOut) on tiny files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families import refused
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.lumina import diffusers_keys
from mixgraph.nodes.families.lumina.detect import nextdit_config
from mixgraph.nodes.families.lumina.family import LUMINA2, Z_IMAGE
from mixgraph.nodes.families.lumina.nextdit import NextDiT
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT
from mixgraph.ui import api
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_nextdit import (CAP_WIDTH, LUMINA2_TINY, Z_IMAGE_TINY, nextdit_state_dict,
                                         reference_z_image)

F32 = parse_spec("f32")
MODEL_FILE = "z_image_turbo_bf16.safetensors"  # Comfy-Org's z_image_turbo split file: bare keys, bf16


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(a, b, rel=1e-4):
    assert a.shape == b.shape
    err = float((a - b).abs().max() / b.abs().max())
    assert err < rel, f"relative error {err:.2e}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("z_image")
    for folder in ("diffusion_models", "text_encoders"):
        (root / folder).mkdir()
    sd = nextdit_state_dict(Z_IMAGE_TINY, seed=5)
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, str(root / "diffusion_models" / MODEL_FILE))
    ref = reference_z_image(seed=6)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(root / "diffusion_models" / "diffusion_pytorch_model.safetensors"))
    save_file(tiny_clip_l_state_dict(4, width=CAP_WIDTH), str(root / "text_encoders" / "clip_l.safetensors"))
    return root


def test_z_image_matches_diffusers_on_captions_of_different_lengths():
    """A batch of a 7-token and a 40-token caption (padded to 32 and 64 with the learned caption
    pad token) and 15 image tokens (padded to 32 with the image pad token): diffusers takes the
    captions as a list, ours as one [B, T, D] tensor with a mask."""
    ref = reference_z_image()
    sd = diffusers_keys.to_comfy(ref.state_dict())
    assert nextdit_config(sd) == Z_IMAGE_TINY
    ours = NextDiT(Z_IMAGE_TINY).eval()
    ours.load_state_dict(sd, strict=True)
    x, context = _rand(2, 16, 6, 10, seed=1), _rand(2, 40, CAP_WIDTH, seed=2)
    sigma = torch.tensor([0.25, 0.9])
    mask = torch.ones(2, 40)
    mask[0, 7:] = 0
    with torch.no_grad():
        out = ref([x[0, :, None], x[1, :, None]], 1 - sigma, [context[0, :7], context[1]], return_dict=False)[0]
        expected = -torch.stack(out)[:, :, 0]  # [B, C, F=1, H, W] -> [B, C, H, W]
        _close(ours(x, sigma, context, mask), expected)
        _close(ours(x[:1], sigma[:1], context[:1, :7]), expected[:1])


def test_z_image_is_detected_apart_from_lumina2(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL_FILE)
    assert (model.family, model.kind, model.config) == ("z_image", "z_image", Z_IMAGE_TINY)
    assert model.source.prefix == "" and model.prediction == "flow"
    assert (model.sampling.shift, model.sampling.multiplier) == (3.0, 1.0)  # supported_models.ZImage
    assert model.latent_format == FLUX_LATENT
    z_info = nextdit_state_dict(Z_IMAGE_TINY)
    l_info = nextdit_state_dict(LUMINA2_TINY)
    assert Z_IMAGE.detect(z_info) is not None and LUMINA2.detect(z_info) is None
    assert LUMINA2.detect(l_info) is not None and Z_IMAGE.detect(l_info) is None
    assert refused.detect_family({"model.diffusion_model." + k: tuple(v.shape) for k, v in z_info.items()}) is None
    assert families.detect(z_info).family == "z_image"
    omni = {"model.diffusion_model." + k: tuple(v.shape) for k, v in z_info.items()}
    omni["model.diffusion_model.siglip_embedder.1.weight"] = (64, 32)
    assert refused.detect_family(omni) == "Z-Image Omni"  # a NextDiT option neither family runs
    slot, = Z_IMAGE.text_encoders("z_image")
    assert (slot.name, slot.arch, slot.tokenizer, slot.encoding) == ("qwen3_4b", "qwen3", "z_image", "z_image")
    assert Z_IMAGE.clip_types == {"lumina2": "z_image"} and LUMINA2.clip_types == {"lumina2": "lumina2"}


def test_z_image_runs_a_text_free_pass_on_its_pad_tokens(models):
    """ComfyUI's Z-Image takes no caption as one block of caption pad tokens (DualModelGuider's
    unconnected negative); Lumina 2 has no such form and refuses by name."""
    model = loader.load_unet(models / "diffusion_models" / MODEL_FILE)
    runner = model.runner(F32)
    assert runner.context_free_refusal() is None and runner.cond_inputs(Cond(None), (1, 16, 8, 8)) == {}
    x = _rand(1, 16, 8, 8, seed=3)
    out = runner(x, torch.tensor([0.5]), None, {})
    assert out.shape == x.shape and torch.isfinite(out).all()
    text = runner(x, torch.tensor([0.5]), _rand(1, 5, CAP_WIDTH, seed=4), {"attention_mask": torch.ones(1, 5)})
    assert not torch.allclose(out, text)


def test_z_image_loads_a_diffusers_layout_file(models):
    """diffusers' ``transformer/diffusion_pytorch_model.safetensors`` through UNETLoader: the
    same model as the same weights in ComfyUI's layout."""
    ref = reference_z_image(seed=6)
    model = loader.load_unet(models / "diffusion_models" / "diffusion_pytorch_model.safetensors")
    assert (model.family, model.config) == ("z_image", Z_IMAGE_TINY)
    x, context, sigma = _rand(1, 16, 4, 6, seed=7), _rand(1, 11, CAP_WIDTH, seed=8), torch.tensor([0.4])
    with torch.no_grad():
        expected = -ref([x[0, :, None]], 1 - sigma, [context[0]], return_dict=False)[0][0][None, :, 0]
        _close(model.runner(F32).model(x, sigma, context), expected)


def _prompt(sampler: str):
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": MODEL_FILE, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube on a table", "clip": ["2", 0]}},
        "4": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["3", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 80, "height": 48, "batch_size": 2}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 11, "steps": 3, "cfg": 1.0, "sampler_name": sampler, "scheduler": "simple",
            "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 11, "steps": 3, "cfg": 2.5, "sampler_name": sampler, "scheduler": "simple",
            "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "8": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "z_image/cfg1"}},
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": "z_image/cfg"}},
    }


@pytest.mark.parametrize("sampler", ["euler", "res_multistep"])
def test_z_image_turbo_workflow_samples(models, sampler):
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    res = api.run(_prompt(sampler), executor=executor, models=models, output=models / "out")
    turbo, guided = res.outputs["6"][0].samples, res.outputs["7"][0].samples
    assert turbo.shape == (2, 16, 6, 10) and torch.isfinite(turbo).all() and turbo.abs().max() > 0
    assert torch.isfinite(guided).all() and not torch.allclose(turbo, guided)
    assert not torch.equal(turbo[0], turbo[1])  # two noise draws
    half = api.run(_prompt(sampler), executor=executor, models=models, output=models / "out", precision="fp16")
    assert torch.isfinite(half.outputs["6"][0].samples).all()


def test_z_image_denoiser_uses_the_flow_prediction(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL_FILE)
    runner = model.runner(F32)
    text = _rand(1, 5, CAP_WIDTH, seed=9)
    x, sigma = _rand(1, 16, 8, 8, seed=10), torch.tensor([0.7])
    x0 = CFGDenoiser(runner, (Cond(text),), (), 1.0, torch.zeros_like(x))(x, sigma)
    with torch.no_grad():
        assert torch.allclose(x0, x - 0.7 * runner.model(x, sigma, text), atol=1e-5)
