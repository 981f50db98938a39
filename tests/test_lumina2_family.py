"""The Lumina Image 2.0 family (``nodes/families/lumina``): NextDiT against diffusers'
``Lumina2Transformer2DModel`` on a tiny config (weights converted by our key map, a padded
caption mask, batch of two), detection and config from shapes, ComfyUI's sampling settings and
conventions (timestep 1 − σ, negated output), and a workflow through UNETLoader and KSampler on
tiny files named like the real ones."""

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
from mixgraph.nodes.families.lumina.family import LUMINA2
from mixgraph.nodes.families.lumina.nextdit import NextDiT
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT
from mixgraph.ui import api
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_nextdit import CAP_WIDTH, LUMINA2_TINY, nextdit_state_dict, reference_lumina2

F32 = parse_spec("f32")
MODEL_FILE = "lumina_2_model_bf16.safetensors"  # Comfy-Org's Lumina_Image_2.0_Repackaged name


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(a, b, rel=1e-4):
    assert a.shape == b.shape
    err = float((a - b).abs().max() / b.abs().max())
    assert err < rel, f"relative error {err:.2e}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lumina2")
    (root / "diffusion_models").mkdir()
    (root / "checkpoints").mkdir()
    (root / "text_encoders").mkdir()
    sd = nextdit_state_dict(LUMINA2_TINY, seed=3)
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, str(root / "diffusion_models" / MODEL_FILE))
    save_file({"model.diffusion_model." + k: v for k, v in sd.items()},
              str(root / "checkpoints" / "lumina_2.safetensors"))
    save_file(tiny_clip_l_state_dict(4, width=CAP_WIDTH), str(root / "text_encoders" / "clip_l.safetensors"))
    return root


def test_lumina2_matches_diffusers_with_a_padded_caption():
    """diffusers' weights in ComfyUI's keys (q/k/v fused): the same velocity, up to the sign and
    the timestep convention (diffusers: t = 1 − σ, the flow towards data)."""
    ref = reference_lumina2()
    sd = diffusers_keys.to_comfy(ref.state_dict())
    cfg = nextdit_config(sd)
    assert cfg == LUMINA2_TINY.__class__(**{**LUMINA2_TINY.__dict__, "has_norm_final": False})
    ours = NextDiT(cfg).eval()
    ours.load_state_dict(sd, strict=True)
    x, context = _rand(2, 16, 6, 10, seed=1), _rand(2, 9, CAP_WIDTH, seed=2)
    sigma = torch.tensor([0.3, 0.85])
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # the second caption has 6 tokens and 3 of padding
    with torch.no_grad():
        expected = -ref(x, 1 - sigma, context, mask, return_dict=False)[0]
        _close(ours(x, sigma, context, mask), expected)
        # without padding the mask changes nothing; padding tokens take no part
        _close(ours(x, sigma, context), -ref(x, 1 - sigma, context, torch.ones_like(mask), return_dict=False)[0])
        alone = ours(x[1:], sigma[1:], context[1:, :6])
    _close(alone, expected[1:])


def test_lumina2_is_detected_with_comfyui_settings(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL_FILE)
    assert (model.family, model.kind, model.config) == ("lumina2", "lumina2", LUMINA2_TINY)
    assert model.source.prefix == "" and model.prediction == "flow"
    assert (model.sampling.shift, model.sampling.multiplier) == (6.0, 1.0)  # supported_models.Lumina2
    assert model.latent_format == FLUX_LATENT
    ms = ModelSampling.for_model(model)
    assert ms.is_flow and float(ms.timestep(torch.tensor(0.5))) == pytest.approx(0.5)
    ckpt, clip, vae = loader.load_checkpoint(models / "checkpoints" / "lumina_2.safetensors")
    assert (ckpt.family, ckpt.config, ckpt.source.prefix) == ("lumina2", LUMINA2_TINY, "model.diffusion_model.")
    assert clip is None and vae is None
    slot, = LUMINA2.text_encoders("lumina2")
    assert (slot.name, slot.arch, slot.tokenizer, slot.encoding) == ("gemma2_2b", "gemma2", "gemma", "lumina2")
    assert LUMINA2.clip_types == {"lumina2": "lumina2"}


def test_lumina2_loads_a_diffusers_layout_file(tmp_path):
    """diffusers' ``transformer/diffusion_pytorch_model.safetensors`` through UNETLoader (separate
    q / k / v, RMSNormZero, LayerNormContinuous names): converted on read."""
    ref = reference_lumina2(seed=2)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    model = loader.load_unet(path)
    assert model.family == "lumina2" and model.config.dim == LUMINA2_TINY.dim
    x, context, sigma = _rand(1, 16, 4, 6, seed=7), _rand(1, 5, CAP_WIDTH, seed=8), torch.tensor([0.4])
    with torch.no_grad():
        expected = -ref(x, 1 - sigma, context, torch.ones(1, 5, dtype=torch.long), return_dict=False)[0]
        _close(model.runner(F32).model(x, sigma, context), expected)


def test_lumina2_files_are_no_longer_refused():
    info = {"model.diffusion_model." + k: tuple(v.shape) for k, v in nextdit_state_dict(LUMINA2_TINY).items()}
    assert refused.detect_family(info) is None
    assert families.detect({k[len("model.diffusion_model."):]: v for k, v in info.items()}).family == "lumina2"
    only_signature = {"cap_embedder.1.weight": (48, 32)}  # not a whole NextDiT: still refused by name
    assert refused.detect_family(only_signature) == "Lumina 2"


def test_lumina2_runner_reads_the_caption_mask_and_keeps_lengths_apart(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL_FILE)
    runner = model.runner(F32)
    text = _rand(1, 9, CAP_WIDTH, seed=4)
    mask = torch.tensor([[1.0] * 6 + [0.0] * 3])
    inputs = runner.cond_inputs(Cond(text, model_inputs={"attention_mask": mask}), (1, 16, 8, 8))
    assert torch.equal(inputs["attention_mask"], mask)
    assert torch.equal(runner.cond_inputs(Cond(text), (1, 16, 8, 8))["attention_mask"], torch.ones(1, 9))
    concat = runner.cond_inputs(Cond(text, model_inputs={"attention_mask": mask[:, :4]}), (1, 16, 8, 8))
    assert concat["attention_mask"].tolist() == [[1.0] * 9]  # ConditioningConcat's tokens past the mask are real
    x = _rand(1, 16, 8, 8, seed=5)
    sigma = torch.tensor([0.6])

    def x0(cond):
        return CFGDenoiser(runner, (cond,), (), 1.0, torch.zeros_like(x))(x, sigma)

    masked = x0(Cond(text, model_inputs={"attention_mask": mask}))
    assert torch.allclose(masked, x0(Cond(text[:, :6])), atol=1e-5)  # padding drops out
    assert not torch.allclose(masked, x0(Cond(text)), atol=1e-4)
    # flow x0 = x − σ·v, v the model's (negated) output at timestep σ
    module = model.runner(F32).model
    with torch.no_grad():
        assert torch.allclose(x0(Cond(text)), x - 0.6 * module(x, sigma, text), atol=1e-5)
    with pytest.raises(ValueError, match="text features 16 wide; the model takes 32"):
        runner.cond_inputs(Cond(torch.zeros(1, 4, 16)), (1, 16, 8, 8))
    assert "Lumina Image 2.0" in runner.context_free_refusal()


def _prompt(sampler: str, unet: str = MODEL_FILE):
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncodeLumina2", "inputs": {
            "system_prompt": "superior", "user_prompt": "a red cube", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 48, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 7, "steps": 3, "cfg": 4.0, "sampler_name": sampler, "scheduler": "simple",
            "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "lumina2/ks"}},
    }


@pytest.mark.parametrize("sampler", ["euler", "res_multistep"])
def test_lumina2_samples_through_unet_loader_and_ksampler(models, sampler):
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    res = api.run(_prompt(sampler), executor=executor, models=models, output=models / "out")
    out = res.outputs["6"][0].samples
    assert out.shape == (1, 16, 6, 8) and torch.isfinite(out).all() and out.abs().max() > 0
    bf16 = api.run(_prompt(sampler), executor=executor, models=models, output=models / "out", precision="bf16")
    assert torch.isfinite(bf16.outputs["6"][0].samples).all()


def test_clip_text_encode_lumina2_spec_and_prompt(models):
    from mixgraph.nodes.declare.conditioning.lumina2_nodes import lumina2_prompt

    info = api.default_registry().object_info()["CLIPTextEncodeLumina2"]
    assert info["category"] == "model/conditioning/lumina" and info["display_name"] == "CLIP Text Encode (Lumina 2)"
    assert info["input_order"] == {"required": ["system_prompt", "user_prompt", "clip"]}
    assert info["input"]["required"]["system_prompt"][0] == ["superior", "alignment", "low-quality"]
    assert lumina2_prompt("alignment", "a cat") == (
        "You are an assistant designed to generate high-quality images with the highest degree of "
        "image-text alignment based on textual prompts. <Prompt Start> a cat")
    prompt = {"2": _prompt("euler")["2"], "3": _prompt("euler")["3"],
              "7": {"class_type": "CLIPTextEncode", "inputs": {"text": lumina2_prompt("superior", "a red cube"),
                                                                "clip": ["2", 0]}},
              "8": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
              "9": {"class_type": "PreviewAny", "inputs": {"source": ["7", 0]}}}
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    res = api.run(prompt, executor=executor, models=models, output=models / "out")
    assert torch.equal(res.outputs["3"][0][0].cross_attn, res.outputs["7"][0][0].cross_attn)


def test_lumina2_checkpoint_with_its_gemma_encoder_loads_it(tmp_path):
    """ComfyUI's all-in-one lumina_2.safetensors keeps Gemma 2 2B under
    ``text_encoders.gemma2_2b.transformer.``: CheckpointLoaderSimple gives it as the CLIP (its
    tokenizer the SentencePiece model stored beside it); a stub there is named, not loaded."""
    from tests.fixtures.tiny_llm import gemma2_state_dict

    sd = {"model.diffusion_model." + k: v for k, v in nextdit_state_dict(LUMINA2_TINY).items()}
    sd.update({"text_encoders.gemma2_2b.transformer." + k: v for k, v in gemma2_state_dict().items()})
    save_file(sd, str(tmp_path / "lumina_2.safetensors"))
    model, clip, _ = loader.load_checkpoint(tmp_path / "lumina_2.safetensors")
    assert model.family == "lumina2" and clip.kind == "lumina2" and clip.names == ("gemma2_2b",)
    assert clip.encoders[0].tokenizer.startswith("gemma:")

    stub = {"model.diffusion_model." + k: v for k, v in nextdit_state_dict(LUMINA2_TINY).items()}
    stub["text_encoders.gemma2_2b.transformer.model.embed_tokens.weight"] = torch.zeros(10, 8)
    save_file(stub, str(tmp_path / "lumina_2_stub.safetensors"))
    with pytest.raises(ValueError, match="not a gemma2 text encoder"):
        loader.load_checkpoint(tmp_path / "lumina_2_stub.safetensors")


def test_lumina2_memory_estimate_uses_the_family(models):
    from mixgraph.ui.estimate import estimate

    wf = api.load(_prompt("euler"), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    assert est["nodes"]["6"]["activation_bytes"] > 0 and est["nodes"]["6"]["weights_bytes"] > 0
