"""PhotoMakerLoader / PhotoMakerEncode (ComfyUI comfy_extras/nodes_photomaker.py) on a tiny seeded
PhotoMaker v1 file in the real layout (a pickle {"id_encoder": {...}, "lora_weights": {...}})
and the tiny SDXL checkpoint. The fused token is checked against the fuse formulas written out
here, on an independent vision reference (transformers' CLIPVisionModel)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.executor import NodeError
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders.clip_vision import clip_preprocess
from mixgraph.nodes.adapters.photomaker import PhotoMakerError, load_photomaker
from mixgraph.nodes.weights.synthetic import random_state_dict
from mixgraph.nodes.encoders.tokenizer import CLIPTokenizer
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15, write_sdxl
from tests.fixtures.tiny_vision import clip_vision_shapes, tiny_clip_vision_state_dict

WIDTH, LAYERS, PATCH, IMAGE = 64, 2, 8, 32
EMBED, PROJ1, PROJ2 = 64, 24, 40  # the tiny SDXL cond is 32 (clip_l) + 32 (clip_g) wide
F32 = parse_spec("f32")


def photomaker_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The id_encoder keys: a HF CLIP vision tower, visual_projection_2 and fuse_module.*"""
    sd = tiny_clip_vision_state_dict(seed, width=WIDTH, layers=LAYERS, patch=PATCH, image=IMAGE, proj=PROJ1)
    d = EMBED
    shapes = {"visual_projection_2.weight": (PROJ2, WIDTH), "fuse_module.layer_norm.weight": (d,),
              "fuse_module.layer_norm.bias": (d,)}
    for name, d_in, residual in (("mlp1", 2 * d, False), ("mlp2", d, True)):
        p = f"fuse_module.{name}."
        shapes |= {p + "layernorm.weight": (d_in,), p + "layernorm.bias": (d_in,), p + "fc1.weight": (d, d_in),
                   p + "fc1.bias": (d,), p + "fc2.weight": (d, d), p + "fc2.bias": (d,)}
    return sd | random_state_dict(shapes, seed + 1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("photomaker_models")
    write_sdxl(root / "checkpoints" / "sdxl.safetensors", seed=2)
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=5)
    (root / "photomaker").mkdir()
    sd = photomaker_state_dict(seed=7)
    lora = {"unet.down.lora_A.weight": torch.zeros(2, 2)}  # ComfyUI reads id_encoder only
    torch.save({"id_encoder": sd, "lora_weights": lora}, root / "photomaker" / "photomaker-v1.bin")
    save_file({"something.else": torch.zeros(3)}, str(root / "photomaker" / "bad.safetensors"))
    return root, sd


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photomaker_in")
    for name, (h, w, seed) in {"face.png": (40, 30, 3), "other.png": (36, 36, 4)}.items():
        arr = torch.rand(h, w, 3, generator=torch.Generator().manual_seed(seed))
        Image.fromarray((arr.numpy() * 255).round().astype(np.uint8)).save(folder / name)
    return folder


def _reference_fuse(sd, prompt, ids, eps=1e-5):
    """FuseModule written out: mlp1(cat(prompt, id)) + prompt -> mlp2 (residual) -> layer_norm."""
    ln = torch.nn.functional.layer_norm

    def mlp(x, p, residual):
        h = ln(x, x.shape[-1:], sd[p + "layernorm.weight"], sd[p + "layernorm.bias"], eps)
        h = torch.nn.functional.gelu(h @ sd[p + "fc1.weight"].T + sd[p + "fc1.bias"])
        h = h @ sd[p + "fc2.weight"].T + sd[p + "fc2.bias"]
        return h + x if residual else h

    x = mlp(torch.cat([prompt, ids], -1), "fuse_module.mlp1.", False) + prompt
    x = mlp(x, "fuse_module.mlp2.", True)
    return ln(x, x.shape[-1:], sd["fuse_module.layer_norm.weight"], sd["fuse_module.layer_norm.bias"], eps)


def _reference_ids(sd, image):
    """cat(visual_projection(pooled), visual_projection_2(pooled)) by transformers' CLIP vision model
    (QuickGELU, 16-wide heads: ComfyUI's PhotoMaker vision config at this width)."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    cfg = CLIPVisionConfig(hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_hidden_layers=LAYERS,
                           num_attention_heads=WIDTH // 16, image_size=IMAGE, patch_size=PATCH, projection_dim=PROJ1,
                           hidden_act="quick_gelu", layer_norm_eps=1e-5)
    model = CLIPVisionModelWithProjection(cfg).eval()
    tower = {k: v for k, v in sd.items() if k.startswith(("vision_model.", "visual_projection."))}
    missing, unexpected = model.load_state_dict(tower, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)
    with torch.no_grad():
        r = model(pixel_values=clip_preprocess(image[:1], IMAGE, crop=True))
    pooled = model.vision_model.post_layernorm(r.last_hidden_state[0, 0]).detach()  # [W]
    torch.testing.assert_close(pooled @ sd["visual_projection.weight"].T, r.image_embeds[0])
    return torch.cat([pooled @ sd["visual_projection.weight"].T, pooled @ sd["visual_projection_2.weight"].T])


def _encode_graph(text, image="face.png", batch_with=None):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")
    pm = g.add("PhotoMakerLoader", photomaker_model_name="photomaker-v1.bin")
    img = g.add("LoadImage", image=image)
    if batch_with is not None:
        img = g.add("ImageBatch", image1=img, image2=g.add("LoadImage", image=batch_with))
    enc = g.add("PhotoMakerEncode", photomaker=pm, image=img, clip=ck[1], text=text)
    g.add("PreviewAny", source=enc)
    return g, ck, img, enc


def _run(g, models, inputs, tmp_path):
    return api.run(g, models=models[0], input=inputs, output=tmp_path / "out")


def _plain(models, inputs, tmp_path, text):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")
    enc = g.add("CLIPTextEncode", text=text, clip=ck[1])
    g.add("PreviewAny", source=enc)
    (cond,) = _run(g, models, inputs, tmp_path)[enc.node_id][0]
    return cond


def test_photomaker_node_specs_match_comfyui():
    info = api.default_registry().object_info()
    loader, enc = info["PhotoMakerLoader"], info["PhotoMakerEncode"]
    assert list(loader["input"]["required"]) == ["photomaker_model_name"]
    assert loader["output"] == ["PHOTOMAKER"] and loader["category"] == "_for_testing/photomaker"
    req = enc["input"]["required"]
    assert list(req) == ["photomaker", "image", "clip", "text"]
    assert [req[k][0] for k in ("photomaker", "image", "clip", "text")] == ["PHOTOMAKER", "IMAGE", "CLIP", "STRING"]
    assert req["text"][1] == {"default": "photograph of photomaker", "multiline": True, "dynamicPrompts": True}
    assert enc["output"] == ["CONDITIONING"] and enc["category"] == "_for_testing/photomaker"
    assert loader["experimental"] is True and enc["experimental"] is True


def test_photomaker_loader_derives_sizes_from_shapes(models):
    handle = load_photomaker(models[0] / "photomaker" / "photomaker-v1.bin")
    c = handle.config
    assert (c.vision.width, c.vision.layers, c.vision.patch_size, c.vision.image_size) == (WIDTH, LAYERS, PATCH, IMAGE)
    assert (c.vision.projection_dim, c.proj2, c.embed_dim, c.mlp1_hidden, c.mlp2_hidden) == (PROJ1, PROJ2, EMBED,
                                                                                           EMBED, EMBED)
    assert c.vision.activation == "quick_gelu" and handle.source.prefix == "id_encoder."


def test_photomaker_loader_reads_a_prefixed_safetensors_file_alike(models, tmp_path):
    sd = models[1]
    save_file({"id_encoder." + k: v for k, v in sd.items()}, str(tmp_path / "pm.safetensors"))
    assert load_photomaker(tmp_path / "pm.safetensors").config == \
        load_photomaker(models[0] / "photomaker" / "photomaker-v1.bin").config


def test_photomaker_loader_refuses_other_files_clearly(models, inputs, tmp_path):
    with pytest.raises(PhotoMakerError, match=r"bad.safetensors: not a PhotoMaker ID encoder: no "
                                              r"'vision_model.embeddings.patch_embedding.weight'"):
        load_photomaker(models[0] / "photomaker" / "bad.safetensors")
    shapes = clip_vision_shapes()
    save_file(random_state_dict(shapes, 0), str(tmp_path / "vision_only.safetensors"))
    with pytest.raises(PhotoMakerError, match="vision_only.safetensors: .*no 'visual_projection_2.weight'"):
        load_photomaker(tmp_path / "vision_only.safetensors")
    g = api.Graph(precision="f32")
    g.add("PreviewAny", source=g.add("PhotoMakerEncode", photomaker=g.add("PhotoMakerLoader",
          photomaker_model_name="bad.safetensors"), image=g.add("LoadImage", image="face.png"),
          clip=g.add("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")[1], text="photomaker"))
    with pytest.raises(NodeError, match="PhotoMakerLoader.*bad.safetensors: not a PhotoMaker ID encoder"):
        _run(g, models, inputs, tmp_path)


def test_photomaker_v2_files_and_hooked_clips_are_not_supported_yet(models, tmp_path):
    sd = {"id_encoder." + k: v for k, v in models[1].items()}
    sd["id_encoder.qformer_perceiver.token_proj.0.weight"] = torch.zeros(4, 4)
    save_file(sd, str(tmp_path / "photomaker-v2.safetensors"))
    with pytest.raises(NotImplementedError, match="photomaker-v2.safetensors: PhotoMaker v2 .*not supported yet"):
        load_photomaker(tmp_path / "photomaker-v2.safetensors")
    from mixgraph.nodes.models.loader import load_checkpoint
    clip = load_checkpoint(models[0] / "checkpoints" / "sdxl.safetensors")[1]
    hooked = dataclasses.replace(clip, hooks=("a hook group",))
    with pytest.raises(NotImplementedError, match="CLIP that has hooks .*not supported yet"):
        hooked.encode_tokens(hooked.tokenize("a man photomaker"), F32)


def test_photomaker_encode_fuses_the_class_word_and_drops_the_trigger(models, inputs, tmp_path):
    # "(man:1.1)" and " photomaker" are separate tokenizer words (weight segments), so ComfyUI's
    # word-id filter removes the trigger; the class word "man" sits at token 1
    g, ck, img, enc = _encode_graph("(man:1.1) photomaker")
    out = _run(g, models, inputs, tmp_path)
    (cond,) = out[enc.node_id][0]
    plain = _plain(models, inputs, tmp_path, "(man:1.1)")
    assert cond.cross_attn.shape == plain.cross_attn.shape == (1, 77, EMBED)
    keep = [i for i in range(77) if i != 1]
    torch.testing.assert_close(cond.cross_attn[:, keep], plain.cross_attn[:, keep])
    torch.testing.assert_close(cond.pooled, plain.pooled)
    image = out[img.node_id][0]
    want = _reference_fuse(models[1], plain.cross_attn[0, 1], _reference_ids(models[1], image))
    torch.testing.assert_close(cond.cross_attn[0, 1], want, rtol=1e-4, atol=1e-4)
    assert (cond.cross_attn[0, 1] - plain.cross_attn[0, 1]).abs().max() > 1e-2


def test_photomaker_encode_default_prompt_keeps_the_trigger_tokens_as_comfyui(models, inputs, tmp_path):
    # one tokenizer word for the whole prompt: ComfyUI's filter (word id 3) removes nothing, and the
    # token at position 3 - 1 = 2 ("of") gets the fused embedding
    text = "photograph of photomaker"
    g, ck, img, enc = _encode_graph(text)
    out = _run(g, models, inputs, tmp_path)
    (cond,) = out[enc.node_id][0]
    plain = _plain(models, inputs, tmp_path, text)
    keep = [i for i in range(77) if i != 2]
    torch.testing.assert_close(cond.cross_attn[:, keep], plain.cross_attn[:, keep])
    want = _reference_fuse(models[1], plain.cross_attn[0, 2], _reference_ids(models[1], out[img.node_id][0]))
    torch.testing.assert_close(cond.cross_attn[0, 2], want, rtol=1e-4, atol=1e-4)


def test_photomaker_encode_uses_the_first_image_of_a_batch(models, inputs, tmp_path):
    g1, _, _, one = _encode_graph("(man:1.1) photomaker")
    g2, _, _, two = _encode_graph("(man:1.1) photomaker", batch_with="other.png")
    a = _run(g1, models, inputs, tmp_path)[one.node_id][0][0].cross_attn
    b = _run(g2, models, inputs, tmp_path)[two.node_id][0][0].cross_attn
    torch.testing.assert_close(a, b)


def test_photomaker_encode_without_the_trigger_word_is_the_text_conditioning(models, inputs, tmp_path):
    for text in ("photograph of a man", "photograph of photomaker,"):  # "photomaker," is no match (split(" "))
        g, ck, img, enc = _encode_graph(text)
        (cond,) = _run(g, models, inputs, tmp_path)[enc.node_id][0]
        plain = _plain(models, inputs, tmp_path, text)
        torch.testing.assert_close(cond.cross_attn, plain.cross_attn)
        torch.testing.assert_close(cond.pooled, plain.pooled)


def test_photomaker_encode_trigger_past_the_first_chunk_is_a_clear_error(models, inputs, tmp_path):
    g, ck, img, enc = _encode_graph("a " * 80 + "photomaker")
    with pytest.raises(NodeError, match="PhotoMakerEncode.*word 81 of the text; the class word before it must lie"):
        _run(g, models, inputs, tmp_path)


def test_photomaker_encode_with_a_non_sdxl_clip_is_a_clear_error(models, inputs, tmp_path):
    g = api.Graph(precision="f32")
    g.add("PreviewAny", source=g.add("PhotoMakerEncode", photomaker=g.add("PhotoMakerLoader",
          photomaker_model_name="photomaker-v1.bin"), image=g.add("LoadImage", image="face.png"),
          clip=g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")[1], text="a man photomaker"))
    with pytest.raises(NodeError, match="fuses 64-wide text tokens, the CLIP gives 32 .*made for SDXL"):
        _run(g, models, inputs, tmp_path)


def test_tokenizer_word_ids_are_comfyui_words():
    tok = CLIPTokenizer()
    (chunk,) = tok.tokenize_with_weights("(man:1.1) photomaker", pad_token=0, word_ids=True)
    ids = [w for _, _, w in chunk]
    n_trigger = len(tok.encode(" photomaker"))
    assert ids[:2] == [0, 1] and ids[2:2 + n_trigger] == [2] * n_trigger and set(ids[2 + n_trigger:]) == {0}
    (plain,) = tok.tokenize_with_weights("(man:1.1) photomaker", pad_token=0)
    assert plain == [(t, w) for t, w, _ in chunk]


def test_photomaker_sdxl_samples_end_to_end(models, inputs, tmp_path):
    def graph(text_node):
        g, ck, img, enc = _encode_graph("a photo of a (man:1.0) photomaker")
        pos = enc if text_node is None else g.add("CLIPTextEncode", text=text_node, clip=ck[1])
        ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=3.0, sampler_name="euler", scheduler="normal",
                   positive=pos, negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
                   latent_image=g.add("EmptyLatentImage", width=32, height=32, batch_size=1), denoise=1.0)
        dec = g.add("VAEDecode", samples=ks, vae=ck[2])
        g.add("PreviewImage", images=dec)
        return g, ks, dec

    g, ks, dec = graph(None)
    out = _run(g, models, inputs, tmp_path)
    a = out[ks.node_id][0].samples
    assert torch.isfinite(a).all() and out[dec.node_id][0].shape == (1, 32, 32, 3)
    g2, ks2, _ = graph("a photo of a (man:1.0)")
    b = _run(g2, models, inputs, tmp_path)[ks2.node_id][0].samples
    assert (a - b).abs().max() > 1e-4  # the fused ID token steers the sample
