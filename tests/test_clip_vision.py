"""CLIP vision (loader, preprocessing, the tower against transformers), T2I-Adapter style models
(against torch's MultiheadAttention), unCLIP (the vector input against an independent DDPM
schedule and timestep embedding) and the six nodes end to end on tiny seeded models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders.clip_vision import CLIPVisionConfig, clip_preprocess
from mixgraph.nodes.encoders.clip_vision_handle import load_clip_vision
from mixgraph.nodes.adapters.style_model import StyleAdapter, load_style_model
from mixgraph.nodes.families.sd.unclip import NoiseAugmentor, unclip_adm
from mixgraph.nodes.payloads.conditioning import Cond, UnclipEntry
from mixgraph.ui import api
from tests.fixtures.tiny_vision import (
    PROJ, clip_vision_shapes, hf_vision_config, tiny_style_state_dict, write_clip_vision, write_sd2_unclip,
)

F32 = parse_spec("f32")
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)


def _image(h: int, w: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.rand(batch, h, w, 3, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("vision_models")
    write_clip_vision(root / "clip_vision" / "vit_tiny.safetensors", seed=1)
    write_clip_vision(root / "clip_vision" / "vit_tiny_openclip.safetensors", seed=1, layout="open_clip")
    write_sd2_unclip(root / "checkpoints" / "unclip.safetensors", seed=3)
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    (root / "style_models").mkdir()
    save_file(tiny_style_state_dict(seed=5, context_dim=32), str(root / "style_models" / "style.safetensors"))
    return root


# --- config and layouts ----------------------------------------------------------------------


@pytest.mark.parametrize("width, layers, mlp, proj, act", [
    (1024, 24, 4096, 768, "quick_gelu"),   # OpenAI ViT-L/14
    (1280, 32, 5120, 1024, "gelu"),        # OpenCLIP ViT-H/14
    (1664, 48, 8192, 1280, "gelu"),        # OpenCLIP ViT-bigG/14
])
def test_clip_vision_config_of_the_real_towers_from_shapes(width, layers, mlp, proj, act):
    shapes = clip_vision_shapes(width=width, layers=layers, patch=14, image=224, proj=proj, mlp=mlp)
    cfg = CLIPVisionConfig.from_shapes(shapes)
    assert (cfg.width, cfg.layers, cfg.intermediate, cfg.projection_dim) == (width, layers, mlp, proj)
    assert (cfg.patch_size, cfg.image_size, cfg.heads, cfg.activation) == (14, 224, 16, act)
    assert CLIPVisionConfig.from_shapes(clip_vision_shapes(width=1024, patch=14, image=336)).image_size == 336


def test_clip_vision_loader_reads_hf_and_open_clip_layouts_alike(models):
    hf = load_clip_vision(models / "clip_vision" / "vit_tiny.safetensors")
    oc = load_clip_vision(models / "clip_vision" / "vit_tiny_openclip.safetensors")
    assert hf.source.layout == "hf_clip_vision" and oc.source.layout == "open_clip_vision"
    assert hf.config == oc.config and hf.config.image_size == 32 and hf.config.projection_dim == PROJ
    image = _image(40, 48, seed=2)
    a, b = hf.encode(image, F32), oc.encode(image, F32)
    torch.testing.assert_close(a.image_embeds, b.image_embeds, rtol=0, atol=1e-6)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, rtol=0, atol=1e-6)


def test_clip_vision_loader_refuses_other_files_clearly(tmp_path):
    save_file({"foo.weight": torch.zeros(2, 2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a CLIP vision model"):
        load_clip_vision(tmp_path / "x.safetensors")


# --- numerics --------------------------------------------------------------------------------


def test_clip_vision_tower_matches_transformers(models):
    from safetensors.torch import load_file
    from transformers import CLIPVisionModelWithProjection

    sd = load_file(str(models / "clip_vision" / "vit_tiny.safetensors"))
    ref = CLIPVisionModelWithProjection(hf_vision_config()).eval()
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)
    handle = load_clip_vision(models / "clip_vision" / "vit_tiny.safetensors")
    image = _image(32, 32, seed=3, batch=2)
    out = handle.encode(image, F32)
    with torch.no_grad():
        r = ref(pixel_values=clip_preprocess(image, 32), output_hidden_states=True)
    torch.testing.assert_close(out.image_embeds, r.image_embeds, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.last_hidden_state, r.last_hidden_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.penultimate_hidden_states, r.hidden_states[-2], rtol=1e-4, atol=1e-4)
    assert out["image_embeds"] is out.image_embeds


def test_clip_preprocess_quantises_normalises_and_crops_the_centre():
    image = _image(32, 32, seed=4)
    expected = ((image.movedim(-1, 1) * 255).round() / 255 - MEAN) / STD
    torch.testing.assert_close(clip_preprocess(image, 32), expected, rtol=0, atol=1e-6)
    wide = _image(32, 64, seed=5)  # short side already 32: no resize, keep columns 16..47
    centre = ((wide[:, :, 16:48].movedim(-1, 1) * 255).round() / 255 - MEAN) / STD
    torch.testing.assert_close(clip_preprocess(wide, 32, crop=True), centre, rtol=0, atol=1e-6)
    flat = torch.full((1, 20, 50, 3), 0.6)  # "none" stretches: a flat image stays flat
    out = clip_preprocess(flat, 32, crop=False)
    assert out.shape == (1, 3, 32, 32)
    torch.testing.assert_close(out, ((torch.full((1, 3, 1, 1), 153 / 255) - MEAN) / STD).expand(1, 3, 32, 32),
                               rtol=0, atol=1e-5)


def _reference_style(sd, tokens, heads=8):
    """StyleAdapter written with torch.nn.MultiheadAttention (sequence-first) and F.layer_norm."""
    ln = lambda x, n: torch.nn.functional.layer_norm(x, x.shape[-1:], sd[n + ".weight"], sd[n + ".bias"])  # noqa: E731
    width = sd["style_embedding"].shape[-1]
    x = torch.cat([tokens, sd["style_embedding"].expand(tokens.shape[0], -1, -1)], dim=1)
    x = ln(x, "ln_pre").permute(1, 0, 2)  # [L, B, W]
    n = 0
    while f"transformer_layes.{n}.ln_1.weight" in sd:
        p = f"transformer_layes.{n}."
        mha = torch.nn.MultiheadAttention(width, heads)
        mha.load_state_dict({"in_proj_weight": sd[p + "attn.in_proj_weight"], "in_proj_bias": sd[p + "attn.in_proj_bias"],
                             "out_proj.weight": sd[p + "attn.out_proj.weight"],
                             "out_proj.bias": sd[p + "attn.out_proj.bias"]})
        h = ln(x, p + "ln_1")
        x = x + mha(h, h, h, need_weights=False)[0]
        h = torch.nn.functional.linear(ln(x, p + "ln_2"), sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"])
        x = x + torch.nn.functional.linear(h * torch.sigmoid(1.702 * h), sd[p + "mlp.c_proj.weight"],
                                           sd[p + "mlp.c_proj.bias"])
        n += 1
    x = x.permute(1, 0, 2)
    t = sd["style_embedding"].shape[1]
    return ln(x[:, -t:], "ln_post") @ sd["proj"]


def test_style_model_matches_a_multihead_attention_reference(models):
    handle = load_style_model(models / "style_models" / "style.safetensors")
    assert (handle.config.width, handle.config.num_tokens, handle.config.layers, handle.config.context_dim) == (64, 4, 2, 32)
    vision = load_clip_vision(models / "clip_vision" / "vit_tiny.safetensors").encode(_image(32, 32, 6, batch=2), F32)
    got = handle.get_cond(vision, F32)
    assert got.shape == (1, 8, 32)  # two images x 4 tokens, flattened into one sequence
    sd = tiny_style_state_dict(seed=5, context_dim=32)
    with torch.no_grad():
        ref = _reference_style(sd, vision.last_hidden_state)
    torch.testing.assert_close(got, ref.flatten(0, 1).unsqueeze(0), rtol=1e-4, atol=1e-4)
    module = StyleAdapter(handle.config)
    assert set(module.state_dict()) == set(sd)


def _ddpm_reference(embeds, level, seed, dim):
    from diffusers import DDPMScheduler
    from diffusers.models.embeddings import get_timestep_embedding

    ac = DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2").alphas_cumprod.double()
    noise = torch.randn(embeds.shape[-1], generator=torch.Generator().manual_seed(seed))
    noised = ac[level].sqrt().float() * embeds + (1 - ac[level]).sqrt().float() * noise
    emb = get_timestep_embedding(torch.tensor([level]), dim, flip_sin_to_cos=True, downscale_freq_shift=0)
    return torch.cat([noised.reshape(1, -1), emb], dim=1)


def test_unclip_adm_matches_an_independent_ddpm_reference():
    embeds = torch.randn(1, 16, generator=torch.Generator().manual_seed(7))
    aug = NoiseAugmentor(16)
    one = unclip_adm([UnclipEntry(embeds, 0.7, 0.25)], aug, seed=42)
    ref = _ddpm_reference(embeds[0], round(999 * 0.25), 32, 16) * 0.7  # seed - 10, ComfyUI's rule
    torch.testing.assert_close(one, ref, rtol=1e-5, atol=1e-5)
    # two images: the weighted sum is noised again at the merge level (0.05 -> 50), unweighted
    two = torch.randn(2, 16, generator=torch.Generator().manual_seed(8))
    got = unclip_adm([UnclipEntry(two, 1.5, 0.0)], aug, seed=42)
    s = _ddpm_reference(two[0], 0, 32, 16) * 1.5 + _ddpm_reference(two[1], 0, 32, 16) * 1.5
    torch.testing.assert_close(got, _ddpm_reference(s[0, :16], 50, 32, 16), rtol=1e-5, atol=1e-5)


# --- nodes -----------------------------------------------------------------------------------


def test_clip_vision_node_specs_match_comfyui():
    info = api.default_registry().object_info()
    enc = info["CLIPVisionEncode"]
    assert list(enc["input"]["required"]) == ["clip_vision", "image", "crop"]
    assert enc["input"]["required"]["crop"][0] == ["center", "none"]
    assert enc["output"] == ["CLIP_VISION_OUTPUT"]
    un = info["unCLIPConditioning"]["input"]["required"]
    assert list(un) == ["conditioning", "clip_vision_output", "strength", "noise_augmentation"]
    assert (un["strength"][1]["default"], un["strength"][1]["min"], un["strength"][1]["max"]) == (1.0, -10.0, 10.0)
    assert (un["noise_augmentation"][1]["default"], un["noise_augmentation"][1]["max"]) == (0.0, 1.0)
    st = info["StyleModelApply"]["input"]["required"]
    assert list(st) == ["conditioning", "style_model", "clip_vision_output", "strength", "strength_type"]
    assert st["strength_type"][0] == ["multiply", "attn_bias"] and st["strength"][1]["step"] == 0.001
    assert info["unCLIPCheckpointLoader"]["output"] == ["MODEL", "CLIP", "VAE", "CLIP_VISION"]
    assert info["CLIPVisionLoader"]["output"] == ["CLIP_VISION"]
    assert info["StyleModelLoader"]["output"] == ["STYLE_MODEL"]


def _save_image(folder, name, h, w, seed):
    folder.mkdir(parents=True, exist_ok=True)
    arr = (_image(h, w, seed)[0].numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).save(folder / name)


def _unclip_graph(strength, noise_augmentation=0.0, seed=11):
    g = api.Graph(precision="f32")
    ck = g.add("unCLIPCheckpointLoader", ckpt_name="unclip.safetensors")
    img = g.add("LoadImage", image="ref.png")
    vis = g.add("CLIPVisionEncode", clip_vision=ck[3], image=img, crop="center")
    pos = g.add("CLIPTextEncode", text="a cat", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    un = g.add("unCLIPConditioning", conditioning=pos, clip_vision_output=vis, strength=strength,
               noise_augmentation=noise_augmentation)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=ck[0], seed=seed, steps=3, cfg=3.0, sampler_name="euler", scheduler="normal",
               positive=un, negative=neg, latent_image=lat, denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return g, ck, vis, un, ks


def test_unclip_checkpoint_samples_end_to_end(models, tmp_path):
    _save_image(tmp_path / "in", "ref.png", 40, 36, seed=9)
    g, ck, vis, un, ks = _unclip_graph(1.0, 0.1)
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    model, _clip, _vae, vision = out[ck.node_id]
    assert model.parts.unclip is not None and model.parts.unclip.dim == PROJ and model.prediction == "v_prediction"
    assert vision.source.prefix == "embedder.model.visual." and vision.config.projection_dim == PROJ
    embeds = out[vis.node_id][0].image_embeds
    (cond,) = out[un.node_id][0]
    assert len(cond.unclip) == 1 and cond.unclip[0].noise_augmentation == pytest.approx(0.1)
    with torch.inference_mode():  # the sampler filled the weight store with inference tensors
        runner = model.runner(F32)
    y = runner.adm(cond, (4, 4), seed=11)
    torch.testing.assert_close(y, _ddpm_reference(embeds[0], round(999 * 0.1), 1, PROJ), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.adm(Cond(cond.cross_attn), (4, 4)), torch.zeros(1, 2 * PROJ))
    a = out[ks.node_id][0].samples
    g2, *_, ks2 = _unclip_graph(0.0)
    b = api.run(g2, models=models, input=tmp_path / "in", output=tmp_path / "out")[ks2.node_id][0].samples
    assert torch.isfinite(a).all() and (a - b).abs().max() > 1e-4  # the image embedding steers the sample


def test_style_model_apply_end_to_end(models, tmp_path):
    _save_image(tmp_path / "in", "style.png", 30, 50, seed=10)
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    cv = g.add("CLIPVisionLoader", clip_name="vit_tiny.safetensors")
    vis = g.add("CLIPVisionEncode", clip_vision=cv, image=g.add("LoadImage", image="style.png"), crop="none")
    sm = g.add("StyleModelLoader", style_model_name="style.safetensors")
    pos = g.add("CLIPTextEncode", text="a dog", clip=ck[1])
    mul = g.add("StyleModelApply", conditioning=pos, style_model=sm, clip_vision_output=vis, strength=0.5,
                strength_type="multiply")
    bias = g.add("StyleModelApply", conditioning=pos, style_model=sm, clip_vision_output=vis, strength=0.5,
                 strength_type="attn_bias")
    ks = g.add("KSampler", model=ck[0], seed=1, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=mul, negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
               latent_image=g.add("EmptyLatentImage", width=32, height=32, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    g.add("PreviewAny", source=bias)
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    text = out[pos.node_id][0][0].cross_attn
    scaled, plain = out[mul.node_id][0][0].cross_attn, out[bias.node_id][0][0].cross_attn
    assert scaled.shape == (1, text.shape[1] + 4, 32)
    torch.testing.assert_close(scaled[:, :text.shape[1]], text)
    torch.testing.assert_close(scaled[:, text.shape[1]:], plain[:, text.shape[1]:] * 0.5, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(out[ks.node_id][0].samples).all()
    assert math.isfinite(float(plain.abs().sum()))


def test_sdxl_revision_uses_the_noised_image_embedding_as_pooled_text():
    from mixgraph.nodes.families.sd.runner import UNetRunner
    from mixgraph.nodes.families.sd.unet import sdxl_adm
    from tests.fixtures.tiny_unet import TINY_POOLED, tiny_unet_config

    class _H:
        config = tiny_unet_config("sdxl")
        kind = "sdxl"
        unclip = None

    runner = UNetRunner.__new__(UNetRunner)
    runner.handle, runner.kind = _H, "sdxl"
    embeds = torch.randn(1, TINY_POOLED, generator=torch.Generator().manual_seed(12))
    cond = Cond(torch.zeros(1, 77, 64), pooled=torch.ones(1, TINY_POOLED), unclip=(UnclipEntry(embeds, 0.8, 0.3),))
    y = runner.adm(cond, (8, 8), seed=20)
    pooled = _ddpm_reference(embeds[0], round(999 * 0.3), 10, TINY_POOLED)[:, :TINY_POOLED] * 0.8
    torch.testing.assert_close(y, sdxl_adm(pooled, 64.0, 64.0), rtol=1e-5, atol=1e-5)


def test_unclip_entries_cross_the_custom_node_boundary():
    from mixgraph.ui.comfy.comfy_payloads import cond_from_comfy, cond_to_comfy

    embeds = torch.randn(2, 8)
    cond = Cond(torch.zeros(1, 77, 32), unclip=(UnclipEntry(embeds, 0.5, 0.2),))
    [[_, opts]] = cond_to_comfy((cond,))
    (entry,) = opts["unclip_conditioning"]
    assert entry["clip_vision_output"].image_embeds is embeds and entry["strength"] == 0.5
    (back,) = cond_from_comfy([[cond.cross_attn, opts]])
    assert back.unclip[0].image_embeds is embeds and back.unclip[0].noise_augmentation == pytest.approx(0.2)
