"""The Qwen-Image family (``nodes/families/qwen_image``) on tiny files: detection from shapes
(ComfyUI's bare and ``model.diffusion_model.`` files, diffusers' transformer file, Comfy-Org's
Edit-2511 marker, Qwen-Image-Layered refused by name), ComfyUI's sampling settings, the runner's
reference latents, a text-to-image workflow (UNETLoader -> ModelSamplingAuraFlow -> KSampler on
EmptySD3LatentImage) and an Edit-2511 one (ReferenceLatent + FluxKontextMultiReferenceLatentMethod)
through ``mixgraph.ui.api``, and LoRAs in the names people share them in.

The text comes from the tiny SD CLIP fixture (CLIPLoader type stable_diffusion), whose width the
tiny model's text input has; the Qwen2.5-VL encoder is another part's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families import refused
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.qwen_image.family import QWEN_IMAGE
from mixgraph.nodes.families.qwen_image.model import QwenImage, QwenImageConfig
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT
from mixgraph.ui import api
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_qwen_image import (CONTEXT_WIDTH, QWEN_IMAGE_TINY, qwen_image_state_dict,
                                            reference_qwen_image, write_qwen_image)

F32 = parse_spec("f32")
MODEL = "qwen_image_bf16.safetensors"  # Comfy-Org's split file: bare keys, bf16
EDIT_2511 = "qwen_image_edit_2511_bf16.safetensors"
RANK, STRENGTH = 2, 0.7


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_image")
    write_qwen_image(root / "diffusion_models" / MODEL, seed=1)
    write_qwen_image(root / "diffusion_models" / EDIT_2511, seed=2, edit_2511=True)
    write_qwen_image(root / "checkpoints" / "qwen_image_aio.safetensors", seed=1, prefix="model.diffusion_model.")
    ref = reference_qwen_image(seed=3)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(root / "diffusion_models" / "diffusion_pytorch_model.safetensors"))
    (root / "text_encoders").mkdir()
    save_file(tiny_clip_l_state_dict(4, width=CONTEXT_WIDTH), str(root / "text_encoders" / "clip_l.safetensors"))
    return root


def test_detection_sampling_and_text_encoder(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL)
    assert (model.family, model.kind, model.config) == ("qwen_image", "qwen_image", QWEN_IMAGE_TINY)
    assert model.prediction == "flow" and model.latent_format == WAN21_LATENT
    assert (model.sampling.shift, model.sampling.multiplier, model.sampling.shift_kind) == (1.15, 1.0, "linear")
    edit = loader.load_unet(models / "diffusion_models" / EDIT_2511)
    assert edit.config.default_ref_method == "index_timestep_zero"
    diffusers_file = loader.load_unet(models / "diffusion_models" / "diffusion_pytorch_model.safetensors")
    assert diffusers_file.config == QWEN_IMAGE_TINY

    info = {k: tuple(v.shape) for k, v in qwen_image_state_dict().items()}
    assert families.detect(info).family == "qwen_image"
    comfy = {"model.diffusion_model." + k: v for k, v in info.items()}
    assert refused.detect_family(comfy) is None and refused.detect_family(info) is None
    layered = dict(comfy, **{"model.diffusion_model.time_text_embed.addition_t_embedding.weight": (2, 64)})
    assert refused.detect_family(layered) == "Qwen-Image-Layered" and QWEN_IMAGE.detect(
        {k[len("model.diffusion_model."):]: v for k, v in layered.items()}) is None
    nunchaku = {k: v for k, v in comfy.items() if ".attn.to_q." not in k}
    nunchaku["model.diffusion_model.transformer_blocks.0.attn.to_qkv.qweight"] = (192, 8)
    assert refused.detect_family(nunchaku) == "Qwen-Image (Nunchaku quantized)"
    # the released model's shapes (from the module tree on the meta device) give ComfyUI's defaults
    with torch.device("meta"):
        full = {k: tuple(v.shape) for k, v in QwenImage(QwenImageConfig()).state_dict().items()}
    assert QWEN_IMAGE.detect(full).config == QwenImageConfig()
    assert (QwenImageConfig().dim, QwenImageConfig().heads, QwenImageConfig().axes_dims) == (3072, 24, (16, 56, 56))
    slot, = QWEN_IMAGE.text_encoders("qwen_image")
    assert (slot.name, slot.arch, slot.encoding, slot.tokenizer) == ("qwen25_7b", "qwen2_5_vl", "qwen_image", "qwen2.5")
    assert slot.prefix == "text_encoders.qwen25_7b.transformer."
    assert QWEN_IMAGE.clip_types == {"qwen_image": "qwen_image"}


def test_checkpoint_file_loads_the_same_model(models):
    model, _, _ = loader.load_checkpoint(models / "checkpoints" / "qwen_image_aio.safetensors")
    split = loader.load_unet(models / "diffusion_models" / MODEL)
    assert model.family == "qwen_image" and model.source.prefix == "model.diffusion_model."
    x, text, sigma = _rand(1, 16, 4, 6, seed=4), _rand(1, 5, CONTEXT_WIDTH, seed=5), torch.tensor([0.5])
    with torch.no_grad():
        assert torch.equal(model.runner(F32).model(x, sigma, text), split.runner(F32).model(x, sigma, text))


def test_diffusers_pipeline_folder_loads(models, tmp_path):
    """CheckpointLoaderSimple on a diffusers ``QwenImagePipeline`` folder: its ``transformer/``
    holds the model under the family's own key names (no conversion)."""
    root = tmp_path / "Qwen-Image"
    (root / "transformer").mkdir(parents=True)
    ref = reference_qwen_image(seed=3)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(root / "transformer" / "diffusion_pytorch_model.safetensors"))
    (root / "model_index.json").write_text('{"_class_name": "QwenImagePipeline"}')
    model, clip, vae = loader.load_checkpoint(root)
    assert (model.family, model.config, clip, vae) == ("qwen_image", QWEN_IMAGE_TINY, None, None)
    x, text, sigma = _rand(1, 16, 4, 4, seed=9), _rand(1, 3, CONTEXT_WIDTH, seed=10), torch.tensor([0.5])
    split = loader.load_unet(models / "diffusion_models" / "diffusion_pytorch_model.safetensors")
    with torch.no_grad():
        assert torch.equal(model.runner(F32).model(x, sigma, text), split.runner(F32).model(x, sigma, text))


def test_runner_reference_latents_and_flow_denoiser(models):
    model = loader.load_unet(models / "diffusion_models" / MODEL)
    runner = model.runner(F32)
    text = _rand(1, 6, CONTEXT_WIDTH, seed=6)
    ref = _rand(1, 16, 1, 4, 4, seed=7)  # the Wan VAE's one-frame latent
    assert runner.cond_inputs(Cond(text), (1, 16, 4, 4)) == {}
    inputs = runner.cond_inputs(Cond(text, model_inputs={"reference_latents": [ref]}), (1, 16, 4, 4))
    assert torch.allclose(inputs["ref_latent_0"], WAN21_LATENT.process_in(ref)) and inputs["ref_method"].item() == 0
    offset = runner.cond_inputs(Cond(text, model_inputs={"reference_latents": [ref],
                                                         "reference_latents_method": "offset"}), (1, 16, 4, 4))
    assert offset["ref_method"].item() == 1
    with pytest.raises(ValueError, match="wide"):
        runner.cond_inputs(Cond(_rand(1, 6, 48)), (1, 16, 4, 4))
    # a text mask travels on (newer ComfyUI's model_base.QwenImage); a shorter one is padded with ones
    masked = runner.cond_inputs(Cond(text, model_inputs={"attention_mask": torch.tensor([[1, 1, 1, 0]])}),
                                (1, 16, 4, 4))
    assert masked["attention_mask"].tolist() == [[1, 1, 1, 0, 1, 1]]
    x, sigma = _rand(1, 16, 4, 4, seed=8), torch.tensor([0.7])
    with torch.no_grad():
        direct = runner.model(x, sigma, text, ref_latents=[inputs["ref_latent_0"]], ref_method="index")
        assert torch.allclose(runner(x, sigma, text, inputs), direct)
        assert torch.allclose(runner(x, sigma, text, masked),
                              runner.model(x, sigma, text, txt_mask=masked["attention_mask"]))
        x0 = CFGDenoiser(runner, (Cond(text),), (), 1.0, torch.zeros_like(x))(x, sigma)
        assert torch.allclose(x0, x - 0.7 * runner.model(x, sigma, text), atol=1e-5)
    with pytest.raises(ValueError, match="text context"):
        runner(x, sigma, None, {})


def _t2i(g: api.Graph, unet: str, cfg: float = 2.5):
    model = g.add("UNETLoader", unet_name=unet, weight_dtype="default")
    sampled = g.add("ModelSamplingAuraFlow", model=model.out, shift=3.1)
    clip = g.add("CLIPLoader", clip_name="clip_l.safetensors", type="stable_diffusion")
    pos = g.add("CLIPTextEncode", clip=clip.out, text="a red cube on a wooden table")
    neg = g.add("CLIPTextEncode", clip=clip.out, text="")
    latent = g.add("EmptySD3LatentImage", width=96, height=64, batch_size=2)
    ks = g.add("KSampler", model=sampled.out, seed=7, steps=3, cfg=cfg, sampler_name="euler", scheduler="simple",
               positive=pos.out, negative=neg.out, latent_image=latent.out, denoise=1.0)
    return sampled, pos, neg, ks


def test_text_to_image_and_edit_2511_workflows(models):
    g = api.Graph()
    _, pos, neg, t2i = _t2i(g, MODEL)
    g.add("SaveLatent", samples=t2i.out, filename_prefix="qwen/t2i")
    # Edit-2511: the t2i result as the reference of both conds, timestep-zero references
    edit = g.add("UNETLoader", unet_name=EDIT_2511, weight_dtype="default")
    conds = []
    for c in (pos, neg):
        r = g.add("ReferenceLatent", conditioning=c.out, latent=t2i.out)
        conds.append(g.add("FluxKontextMultiReferenceLatentMethod", conditioning=r.out,
                           reference_latents_method="index_timestep_zero"))
    ks = g.add("KSampler", model=edit.out, seed=8, steps=2, cfg=2.0, sampler_name="euler", scheduler="simple",
               positive=conds[0].out, negative=conds[1].out, latent_image=t2i.out, denoise=0.6)
    g.add("SaveLatent", samples=ks.out, filename_prefix="qwen/edit")
    res = api.run(g, models=models, output=models / "out")
    image = res[t2i.node_id][0].samples
    assert image.shape == (2, 16, 8, 12) and torch.isfinite(image).all() and image.abs().max() > 0
    assert not torch.equal(image[0], image[1])  # two noise draws
    edited = res[ks.node_id][0].samples
    assert edited.shape == image.shape and torch.isfinite(edited).all() and not torch.allclose(edited, image)
    half = api.run(g, models=models, output=models / "out", precision="bf16")
    assert torch.isfinite(half[ks.node_id][0].samples).all()


def test_skip_layer_guidance_leaves_blocks_out(models):
    """SkipLayerGuidanceDiT's double_layers name Qwen-Image's blocks (ComfyUI's "double_block"
    replace patches): a skipped block passes both streams through; other patches are refused."""
    from mixgraph.nodes.models.block_skip import SkipBlocks

    runner = loader.load_unet(models / "diffusion_models" / MODEL).runner(F32)
    assert runner.skippable_blocks == {"double_block": 2}
    x, text, sigma = _rand(1, 16, 4, 4, seed=13), _rand(1, 5, CONTEXT_WIDTH, seed=14), torch.tensor([0.5])
    with torch.no_grad():
        skipped = runner(x, sigma, text, {}, patches=(SkipBlocks("double_block", (1, 7)),))
        assert torch.allclose(skipped, runner.model(x, sigma, text, skip={1}))
        assert not torch.allclose(skipped, runner(x, sigma, text, {}), atol=1e-4)
    with pytest.raises(NotImplementedError, match="object"):
        runner(x, sigma, text, {}, patches=(object(),))
    g = api.Graph()
    sampled, pos, neg, ks = _t2i(g, MODEL)
    slg = g.add("SkipLayerGuidanceDiT", model=sampled.out, double_layers="1", single_layers="", scale=3.0,
                start_percent=0.0, end_percent=1.0, rescaling_scale=0.0)
    latent = g.add("EmptySD3LatentImage", width=96, height=64, batch_size=2)
    guided = g.add("KSampler", model=slg.out, seed=7, steps=3, cfg=2.5, sampler_name="euler", scheduler="simple",
                   positive=pos.out, negative=neg.out, latent_image=latent.out, denoise=1.0)
    g.add("SaveLatent", samples=ks.out, filename_prefix="qwen/plain")
    g.add("SaveLatent", samples=guided.out, filename_prefix="qwen/slg")
    res = api.run(g, models=models, output=models / "out")
    plain, slg_out = res[ks.node_id][0].samples, res[guided.node_id][0].samples
    assert torch.isfinite(slg_out).all() and not torch.allclose(plain, slg_out)


def test_model_sampling_aura_flow_sets_the_shift(models):
    g = api.Graph()
    model = g.add("UNETLoader", unet_name=MODEL, weight_dtype="default")
    sampled = g.add("ModelSamplingAuraFlow", model=model.out, shift=3.1)
    g.add("PreviewAny", source=sampled.out)
    res = api.run(g, models=models, output=models / "out")
    handle = res[sampled.node_id][0]
    assert (handle.sampling.shift, handle.sampling.multiplier) == (3.1, 1.0)


# ---------------------------------------------------------------------------------------------
# LoRAs: diffusers / PEFT, lightx2v (Qwen-Image-Lightning), kohya / musubi, ComfyUI names


def _lora(base: dict, name, seed: int, slots=("lora_A", "lora_B")) -> tuple[dict, dict]:
    """(LoRA over every other Linear weight, the expected patched weights): ``name(module)`` is
    the LoRA's module name; an ``.alpha`` on every other module."""
    g = torch.Generator().manual_seed(seed)
    lora, want = {}, dict(base)
    linears = [k for k, v in base.items() if k.endswith(".weight") and v.ndim == 2]
    for i, key in enumerate(linears[::2]):
        module = key[: -len(".weight")]
        out_f, in_f = base[key].shape
        a, b = torch.randn(RANK, in_f, generator=g) * 0.3, torch.randn(out_f, RANK, generator=g) * 0.3
        lora[f"{name(module)}.{slots[0]}.weight"], lora[f"{name(module)}.{slots[1]}.weight"] = a, b
        alpha = float(RANK)
        if i % 2:
            alpha = 1.0
            lora[f"{name(module)}.alpha"] = torch.tensor(alpha)
        want[key] = base[key] + STRENGTH * (alpha / RANK) * (b @ a)
    return lora, want


@pytest.mark.parametrize("form", ["diffusers", "lightx2v", "kohya", "comfy", "dotted"])
def test_lora_names_reach_the_weights(models, tmp_path, form):
    names = {"diffusers": (lambda m: "transformer." + m, ("lora_A", "lora_B")),
             "lightx2v": (lambda m: m, ("lora_down", "lora_up")),
             "kohya": (lambda m: "lora_unet_" + m.replace(".", "_"), ("lora_down", "lora_up")),
             "comfy": (lambda m: "diffusion_model." + m, ("lora_down", "lora_up")),
             "dotted": (lambda m: "transformer." + m, ("lora.down", "lora.up"))}
    name, slots = names[form]
    base = {k: v.float() for k, v in loader.load_unet(models / "diffusion_models" / MODEL)
            .runner(F32).model.state_dict().items()}
    lora, want = _lora(base, name, seed=len(form), slots=slots)
    (tmp_path / "loras").mkdir()
    save_file({k: v.contiguous() for k, v in lora.items()}, str(tmp_path / "loras" / "qwen_lora.safetensors"))
    write_qwen_image(tmp_path / "diffusion_models" / MODEL, seed=1)
    g = api.Graph()
    unet = g.add("UNETLoader", unet_name=MODEL, weight_dtype="default")
    patched = g.add("LoraLoaderModelOnly", model=unet.out, lora_name="qwen_lora.safetensors", strength_model=STRENGTH)
    g.add("PreviewAny", source=patched.out)
    res = api.run(g, models=tmp_path, output=tmp_path / "out")
    got = {k: v.detach() for k, v in res[patched.node_id][0].runner(F32).model.state_dict().items()}
    assert set(got) == set(want)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-5), k
    modules = [k for k in lora if k.endswith(f".{slots[0]}.weight")]
    assert sum(not torch.equal(got[k], base[k]) for k in want) == len(modules) > 0


def test_memory_estimate_and_fp8_storage(models):
    """The estimate traces the family's model on the sampled latent's size; under fp8 storage the
    timestep embedder, the output AdaLN and the q / k norms stay f32 (``QwenImage.keep_f32``)."""
    from mixgraph.graph.env import Env
    from mixgraph.ui.estimate import estimate

    g = api.Graph()
    _, _, _, ks = _t2i(g, MODEL)
    g.add("SaveLatent", samples=ks.out, filename_prefix="qwen/est")
    wf = api.load(g.build(), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    node = est["nodes"][ks.node_id]
    assert node["activation_bytes"] > 0 and "assumed" not in node and node["size"] == [2, 64, 96]
    assert sum(n["weights_bytes"] for n in est["nodes"].values()) > 0

    fp8 = loader.load_unet(models / "diffusion_models" / MODEL).runner(parse_spec("fp8_e4m3fn:bf16"))
    block = fp8.model.transformer_blocks[0]
    assert block.attn.to_q.weight.dtype == torch.float8_e4m3fn
    assert block.attn.norm_added_k.weight.dtype == torch.float32
    assert fp8.model.time_text_embed.timestep_embedder.linear_1.weight.dtype == torch.float32
    x, text = _rand(1, 16, 4, 6, seed=11), _rand(1, 5, CONTEXT_WIDTH, seed=12)
    assert torch.isfinite(fp8(x, torch.tensor([0.3]), text, {})).all()


def test_comfy_fp8_mixed_edit_file_loads(tmp_path):
    """A file as Comfy-Org's ``qwen_image_edit_2511_fp8mixed``: per-tensor fp8 block Linears with
    ``weight_scale`` / ``comfy_quant``, the rest bf16, the 2511 marker, ``model.diffusion_model.``
    keys; it runs as its dequantised weights do."""
    import json

    prefix = "model.diffusion_model."
    sd = {k: v.float() for k, v in qwen_image_state_dict(seed=4).items()}
    stored, dequantised = {}, {}
    quant = json.dumps({"format": "float8_e4m3fn", "full_precision_matrix_mult": True}).encode()
    for k, v in sd.items():
        if k.startswith("transformer_blocks.") and k.endswith(".weight") and v.ndim == 2:
            scale = (v.abs().amax() / torch.finfo(torch.float8_e4m3fn).max).float()
            q = (v / scale).to(torch.float8_e4m3fn)
            layer = k[: -len(".weight")]
            stored[prefix + k] = q
            stored[prefix + layer + ".weight_scale"] = scale
            stored[prefix + layer + ".comfy_quant"] = torch.tensor(list(quant), dtype=torch.uint8)
            dequantised[k] = q.float() * scale
        else:
            stored[prefix + k] = v.to(torch.bfloat16)
            dequantised[k] = v.to(torch.bfloat16).float()
    stored[prefix + "__index_timestep_zero__"] = torch.empty(0)
    save_file(stored, str(tmp_path / "mixed.safetensors"))
    save_file(dequantised, str(tmp_path / "plain.safetensors"))
    got = loader.load_unet(tmp_path / "mixed.safetensors")
    ref = loader.load_unet(tmp_path / "plain.safetensors")
    assert got.config == replace(QWEN_IMAGE_TINY, default_ref_method="index_timestep_zero")
    x, text, sigma = _rand(1, 16, 4, 6, seed=15), _rand(1, 5, CONTEXT_WIDTH, seed=16), torch.tensor([0.4])
    with torch.no_grad():
        a = got.runner(F32).model(x, sigma, text)
        b = ref.runner(F32).model(x, sigma, text)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
