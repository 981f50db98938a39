"""Qwen2.5-VL text encoder (Qwen-Image): parity with transformers' ``Qwen2_5_VLModel`` on a tiny
config in ComfyUI's key layout (text only, the vision tower, the language model with an image's
tokens in M-RoPE positions), the "qwen_image" template and its dropped tokens, the tokenizer ids
of the shipped Qwen2.5 files, and the set through CLIPLoader / CLIPTextEncode / the Edit nodes."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

from mixgraph.nodes.encoders.encoder_arch import get_arch, recognise
from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule, get_tokenizer
from mixgraph.nodes.encoders.qwen25_vl import (ImageEmbed, Qwen25VLTextModel, is_qwen25, mrope_positions,
                                               qwen25_vl_config)
from mixgraph.nodes.encoders.qwen25_vl_vision import IMAGE_MEAN, IMAGE_STD, VisionConfig, preprocess_image
from mixgraph.nodes.encoders.qwen_image_set import (EDIT_PLUS_TEMPLATE, QWEN25_7B, TEMPLATE, TEMPLATE_IMAGES,
                                                    qwen_image_join, template_end)

PAD = 0
IMAGE_ID = 290
RULE = OutputRule(pad_token=PAD, default_layer=None, norm_hidden=False, project_pooled=False)


def tiny_hf(seed: int = 0) -> Qwen2_5_VLModel:
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=300, hidden_size=256, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                         bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=8, hidden_size=160, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                           fullatt_block_indexes=[7]),
        image_token_id=IMAGE_ID, video_token_id=291, vision_start_token_id=292, attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen2_5_VLModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))  # norms away from their init
            else:
                p.normal_(0.0, 0.08)
    return model


def file_keys(hf: Qwen2_5_VLModel) -> dict[str, torch.Tensor]:
    """The key map onto ComfyUI's file: ``language_model.`` -> ``model.``; ``visual.`` as is."""
    out = {}
    for k, v in hf.state_dict().items():
        out[("model." + k[len("language_model."):]) if k.startswith("language_model.") else k] = v.clone()
    return out


def ours(sd: dict[str, torch.Tensor]) -> Qwen25VLTextModel:
    model = Qwen25VLTextModel(qwen25_vl_config({k: tuple(v.shape) for k, v in sd.items()}))
    model.load_state_dict(sd, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def pair():
    hf = tiny_hf()
    return hf, ours(file_keys(hf))


def test_config_from_shapes_and_recognition(pair):
    hf, model = pair
    sd = file_keys(hf)
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    cfg = qwen25_vl_config(shapes)
    s = cfg.shape
    assert (s.vocab_size, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate) == \
        (300, 256, 3, 2, 1, 128, 96)
    v = cfg.vision
    assert (v.hidden, v.out_hidden, v.depth, v.heads, v.intermediate, v.patch, v.temporal_patch, v.merge) == \
        (160, 256, 8, 2, 64, 14, 2, 2)
    assert cfg.mrope_section == (16, 24, 24)
    assert is_qwen25(sd) and is_qwen25({"text_encoders.qwen25_7b.transformer." + k: t for k, t in sd.items()},
                                       "text_encoders.qwen25_7b.transformer.")
    found = recognise(shapes)
    assert found is not None and (found.arch, found.prefix, found.width) == ("qwen2_5_vl", "", 256)
    assert get_arch("qwen2_5_vl").config(shapes, found, QWEN25_7B) == cfg
    # the bare vocabulary a slot may name reads through Qwen-Image's prompt layer
    assert get_arch("qwen2_5_vl").entry_tokenizer(None, "qwen2.5") == "qwen_image"
    assert get_arch("qwen2_5_vl").entry_tokenizer(None, "other") == "other"
    qwen3_like = dict(shapes, **{"model.layers.0.self_attn.q_norm.weight": (128,)})
    assert not is_qwen25(qwen3_like) and recognise(qwen3_like).arch == "qwen3"
    text_only = {k: t for k, t in shapes.items() if not k.startswith("visual.")}
    assert qwen25_vl_config(text_only).vision is None


@pytest.mark.parametrize("padded", [False, True])
def test_text_hidden_states_match_transformers(pair, padded):
    hf, model = pair
    ids = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12], [9, 3, 60, 22, 11, PAD, PAD, PAD]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3]) if padded else torch.ones_like(ids)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        embeds = model.embed(ids)
        for layer in range(2):
            got = model(embeds, mask, layer)
            torch.testing.assert_close(got, ref.hidden_states[layer + 1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(embeds, mask, None), ref.last_hidden_state, rtol=1e-4, atol=1e-5)
        # ComfyUI's layer "last": the final norm's output
        z = model.encode_chunks([[(int(t), 1.0) for t in ids[0]]], RULE, None, print)
        torch.testing.assert_close(z.hidden[0], ref.last_hidden_state[0], rtol=1e-4, atol=1e-5)
        assert z.tokens == tuple(int(t) for t in ids[0])


def _image(h: int = 150, w: int = 200, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, h, w, 3, generator=torch.Generator().manual_seed(seed))


def test_preprocess_patches_follow_the_merge_order():
    cfg = VisionConfig(hidden=160, out_hidden=64, depth=1, heads=2, intermediate=8)
    img = _image(140, 196)  # already multiples of 28: no resampling
    patches, grid = preprocess_image(img, cfg)
    assert grid == (1, 10, 14) and patches.shape == (140, 3 * 2 * 14 * 14)
    norm = (img[0].movedim(-1, 0) - torch.tensor(IMAGE_MEAN)[:, None, None]) / torch.tensor(IMAGE_STD)[:, None, None]
    # patch k: merged cell (r, c) of the 5 x 7 grid, then its 2 x 2 sub-patch (a, b)
    for k in (0, 1, 2, 3, 4, 57, 139):
        cell, sub = divmod(k, 4)
        r, c = divmod(cell, 7)
        a, b = divmod(sub, 2)
        y, x = (2 * r + a) * 14, (2 * c + b) * 14
        want = norm[:, y:y + 14, x:x + 14]  # [3, 14, 14], both frames equal
        got = patches[k].view(3, 2, 14, 14)
        torch.testing.assert_close(got[:, 0], want)
        torch.testing.assert_close(got[:, 1], want)
    small, grid = preprocess_image(_image(20, 30), cfg)  # below min_pixels: scaled up
    assert grid[1] * grid[2] * 14 * 14 >= 3136 and grid[1] % 2 == 0 and grid[2] % 2 == 0


def test_vision_tower_matches_transformers(pair):
    hf, model = pair
    patches, grid = preprocess_image(_image(), model.config.vision)
    assert grid == (1, 10, 14)  # 5 x 7 merged tokens: 4 windows of up to 4 x 4, one full-attention block
    with torch.no_grad():
        ref = hf.visual(patches, grid_thw=torch.tensor([grid])).pooler_output
        got = model.visual(patches, grid)
    assert got.shape == (35, 256)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=3e-5)  # 8 f32 blocks, then the merger


def test_mrope_positions_are_transformers_rope_index(pair):
    hf, _ = pair
    ids = torch.tensor([[5, 292] + [IMAGE_ID] * 35 + [7, 8, 9]])
    ref, _ = hf.get_rope_index(ids, (ids == IMAGE_ID).int(), image_grid_thw=torch.tensor([[1, 10, 14]]),
                               attention_mask=torch.ones_like(ids))
    got = mrope_positions(ids.shape[1], [(2, 5, 7)])
    assert torch.equal(got, ref[:, 0])


def test_language_model_with_an_image_matches_transformers(pair):
    hf, model = pair
    img = _image()
    patches, grid = preprocess_image(img, model.config.vision)
    before, after = [5, 17, 292], [293, 40, 41, 42]
    ids = torch.tensor([before + [IMAGE_ID] * 35 + after])
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=patches,
                 image_grid_thw=torch.tensor([grid]), mm_token_type_ids=(ids == IMAGE_ID).int()).last_hidden_state
        hf.rope_deltas = None
        # ComfyUI's form: one <|image_pad|> item that the image's 35 tokens replace
        out = model.encode_chunks([[(t, 1.0) for t in before] + [(ImageEmbed(img), 1.0)] + [(t, 1.0) for t in after]],
                                  RULE, None, print)
    assert out.hidden.shape == (1, 42, 256) and out.mask.tolist() == [[1] * 42]
    torch.testing.assert_close(out.hidden, ref, rtol=1e-4, atol=1e-5)
    assert isinstance(out.tokens[3], ImageEmbed) and len(out.tokens) == 8


def test_two_images_of_different_sizes_match_transformers(pair):
    """TextEncodeQwenImageEditPlus's prompt form: each image in its own M-RoPE span, the text after
    each resuming at its span's largest position + 1."""
    hf, model = pair
    a, b = _image(150, 200, seed=2), _image(84, 56, seed=3)
    (pa, ga), (pb, gb) = preprocess_image(a, model.config.vision), preprocess_image(b, model.config.vision)
    na, nb = ga[1] * ga[2] // 4, gb[1] * gb[2] // 4
    assert (ga, gb) == ((1, 10, 14), (1, 6, 4))
    head, mid, tail = [5, 292], [293, 40, 292], [293, 41, 42]
    ids = torch.tensor([head + [IMAGE_ID] * na + mid + [IMAGE_ID] * nb + tail])
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=torch.cat([pa, pb]),
                 image_grid_thw=torch.tensor([ga, gb]), mm_token_type_ids=(ids == IMAGE_ID).int()).last_hidden_state
        hf.rope_deltas = None
        row = ([(t, 1.0) for t in head] + [(ImageEmbed(a), 1.0)] + [(t, 1.0) for t in mid] + [(ImageEmbed(b), 1.0)]
               + [(t, 1.0) for t in tail])
        out = model.encode_chunks([row], RULE, None, print)
    torch.testing.assert_close(out.hidden, ref, rtol=1e-4, atol=1e-5)


def test_text_only_file_refuses_an_image():
    hf = tiny_hf()
    model = ours({k: v for k, v in file_keys(hf).items() if not k.startswith("visual.")})
    with pytest.raises(ValueError, match="no vision tower"):
        model.encode_chunks([[(5, 1.0), (ImageEmbed(_image()), 1.0)]], RULE, None, print)


# --------------------------------------------------------------------------------------------
# template, dropped tokens, tokenizer


def test_tokenizer_puts_the_prompt_in_the_template_with_weights_off():
    tok = get_tokenizer("qwen_image")
    qwen = get_tokenizer("qwen2.5")
    chunks = tok.tokenize_with_weights("a (red:1.3) fox")
    ids = [t for t, _ in chunks[0]]
    assert ids == qwen.encode(TEMPLATE.format("a (red:1.3) fox"))
    assert all(w == 1.0 for _, w in chunks[0])
    # the shipped vocabulary: <|im_start|> system \n ... user \n
    assert ids[:3] == [151644, 8948, 198]
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]  # <|im_end|> \n <|im_start|> assistant \n
    assert qwen.encode("<|vision_start|><|image_pad|><|vision_end|>") == [151652, 151655, 151653]
    assert [t for t, _ in tok.tokenize_with_weights("<|im_start|>user\nhi")[0]] == [151644, 872, 198, 6023]
    img = _image()
    with_image = tok.tokenize_with_weights("fox", images=[img])[0]
    pads = [i for i, (t, _) in enumerate(with_image) if isinstance(t, ImageEmbed)]
    assert len(pads) == 1 and with_image[pads[0]][0].pixels is img
    assert [t for t, _ in with_image if not isinstance(t, ImageEmbed)] == \
        [t for t in qwen.encode(TEMPLATE_IMAGES.format("fox")) if t != 151655]
    # transformers' Qwen2Tokenizer on the same shipped files gives the same ids
    from transformers import Qwen2Tokenizer
    from mixgraph.nodes.encoders.llm_tokenizers import QWEN_DIR
    hf_tok = Qwen2Tokenizer.from_pretrained(str(QWEN_DIR))
    for text in (TEMPLATE.format("a (red:1.3) fox, 12 \u00fcn\u00efcode \u732b"), TEMPLATE_IMAGES.format("fox")):
        assert qwen.encode(text) == hf_tok.encode(text, add_special_tokens=False)
    plus = tok.tokenize_with_weights("Picture 1: <|vision_start|><|image_pad|><|vision_end|>fox", images=[img],
                                     llama_template=EDIT_PLUS_TEMPLATE)[0]
    assert sum(isinstance(t, ImageEmbed) for t, _ in plus) == 1


def test_template_end_and_join_drop_the_system_prompt_and_user_header():
    qwen = get_tokenizer("qwen2.5")
    ids = qwen.encode(TEMPLATE.format("a fox"))
    second = [i for i, t in enumerate(ids) if t == 151644][1]
    assert ids[second:second + 3] == [151644, 872, 198]
    start = template_end(ids, len(ids))
    assert start == second + 3  # the output starts at the prompt: "a fox<|im_end|>\n<|im_start|>assistant\n"
    assert qwen.decode(ids[start:]) == "a fox<|im_end|>\n<|im_start|>assistant\n"
    hidden = torch.arange(len(ids), dtype=torch.float32)[None, :, None].expand(1, len(ids), 4)
    cond = qwen_image_join({QWEN25_7B: EncodedText(hidden, mask=torch.ones(1, len(ids), dtype=torch.long),
                                                   tokens=tuple(ids))})
    assert cond.cross_attn[0, :, 0].tolist() == list(range(start, len(ids)))
    assert "attention_mask" not in cond.model_inputs  # no masked token: ComfyUI drops the mask
    masked = torch.ones(1, len(ids), dtype=torch.long)
    masked[0, -2:] = 0
    cond = qwen_image_join({QWEN25_7B: EncodedText(hidden, mask=masked, tokens=tuple(ids))})
    assert cond.model_inputs["attention_mask"].tolist() == [[1] * (len(ids) - start - 2) + [0, 0]]
    # an image counts as one token before the cut; the image is after it, so the cut is the same
    with_image = qwen.encode(TEMPLATE_IMAGES.format("x"))
    second = [i for i, t in enumerate(with_image) if t == 151644][1]
    assert template_end(with_image, len(with_image) + 40) == second + 3
    # one <|im_start|> (a prompt written as its own chat turn): cut after "<|im_start|>user\n"
    assert template_end([151644, 872, 198, 6023], 4) == 3
    assert template_end([151644, 872, 198], 3) == 0  # ComfyUI moves past "user\n" only with more tokens after it
    assert template_end([5, 6, 7], 3) == -1  # no <|im_start|>: ComfyUI keeps the last token only


# --------------------------------------------------------------------------------------------
# end to end: CLIPLoader type "qwen_image", CLIPTextEncode and the Edit nodes through the engine


class _QwenImageTextFamily:
    """Only what CLIPLoader reads of a family taking type "qwen_image" (the Qwen-Image family
    itself is ``families/qwen_image``, another part of issue 23): its slot."""

    name = "qwen_image_text_test"
    display = "Qwen-Image (text encoder test)"
    precision_roles = {"text": "text"}
    refusals = ()
    clip_types = {"qwen_image": "qwen_image"}

    def detect(self, info, read=None, source=None):
        return None  # no diffusion model of its own

    def build(self, config):
        raise NotImplementedError("a test family without a model")

    runner = sampling = latent_format = trace_inputs = build

    def text_encoders(self, variant):
        from mixgraph.nodes.families.base import TextEncoderSlot
        from mixgraph.nodes.encoders.qwen_image_set import QWEN25_VL_RULE
        return (TextEncoderSlot(QWEN25_7B, "qwen_image", "text_large", prefix="text_encoders.qwen25_7b.transformer.",
                                layout="ldm", folder="text_encoder", encoding="qwen_image", rule=QWEN25_VL_RULE,
                                arch="qwen2_5_vl"),)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from mixgraph.nodes.families import registry as families
    from mixgraph.nodes.models import loader
    from tests.fixtures.checkpoints import write_vae
    from tests.fixtures.tiny_qwen25_vl import write_qwen25_vl
    root = tmp_path_factory.mktemp("qwen25_vl")
    (root / "text_encoders").mkdir()
    (root / "vae").mkdir()
    write_qwen25_vl(root / "text_encoders" / "qwen_2.5_vl_7b.safetensors")
    write_qwen25_vl(root / "text_encoders" / "qwen_2.5_vl_text_only.safetensors", vision=False)
    write_vae(root / "vae" / "tiny_vae.safetensors")
    from safetensors.torch import save_file
    from tests.fixtures.tiny_dit_templates import scaled_fp8
    from tests.fixtures.tiny_qwen25_vl import qwen25_vl_state_dict
    save_file(scaled_fp8(qwen25_vl_state_dict()), str(root / "text_encoders" / "qwen_2.5_vl_7b_fp8_scaled.safetensors"))
    family = None if loader.clip_type_families("qwen_image") else families.register(_QwenImageTextFamily())
    yield root
    if family is not None:
        families.unregister(family.name)


def _save_image(folder, name, h, w, seed=3):
    import numpy as np
    from PIL import Image
    folder.mkdir(parents=True, exist_ok=True)
    arr = (_image(h, w, seed)[0].numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).save(folder / name)


def test_cliploader_qwen_image_and_cliptextencode(models, tmp_path):
    from mixgraph.ui import api
    from tests.fixtures.tiny_qwen25_vl import WIDTH
    g = api.Graph(precision="f32")
    clip = g.add("CLIPLoader", clip_name="qwen_2.5_vl_7b.safetensors", type="qwen_image")
    pos = g.add("CLIPTextEncode", text="a red fox", clip=clip)
    g.add("PreviewAny", source=pos)
    out = api.run(g, models=models, output=tmp_path / "out")
    handle = out[clip.node_id][0]
    assert handle.kind == "qwen_image" and handle.encoders[0].tokenizer == "qwen_image"
    (cond,) = out[pos.node_id][0]
    qwen = get_tokenizer("qwen2.5")
    ids = qwen.encode(TEMPLATE.format("a red fox"))
    start = template_end(ids, len(ids))
    assert cond.cross_attn.shape == (1, len(ids) - start, WIDTH) and cond.pooled is None
    assert "attention_mask" not in cond.model_inputs
    # the same as the module run by hand on the template's tokens, cut after "<|im_start|>user\n"
    from safetensors.torch import load_file
    model = ours({k: v.float() for k, v in load_file(models / "text_encoders" / "qwen_2.5_vl_7b.safetensors").items()})
    with torch.no_grad():
        want = model(model.embed(torch.tensor([ids])), torch.ones(1, len(ids), dtype=torch.long), None)[:, start:]
    torch.testing.assert_close(cond.cross_attn, want)


def test_text_encode_qwen_image_edit_adds_image_tokens_and_reference_latent(models, tmp_path):
    from mixgraph.ui import api
    from tests.fixtures.tiny_qwen25_vl import WIDTH
    _save_image(tmp_path / "in", "ref.png", 48, 64)
    g = api.Graph(precision="f32")
    clip = g.add("CLIPLoader", clip_name="qwen_2.5_vl_7b.safetensors", type="qwen_image")
    vae = g.add("VAELoader", vae_name="tiny_vae.safetensors")
    img = g.add("LoadImage", image="ref.png")
    edit = g.add("TextEncodeQwenImageEdit", clip=clip, prompt="make it blue", vae=vae, image=img)
    text = g.add("TextEncodeQwenImageEdit", clip=clip, prompt="make it blue")
    plus = g.add("TextEncodeQwenImageEditPlus", clip=clip, prompt="make it blue", vae=vae, image1=img, image3=img)
    for n in (edit, text, plus):
        g.add("PreviewAny", source=n)
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    qwen = get_tokenizer("qwen2.5")
    # ComfyUI's sizes: 1M pixels at 3:4 for the VAE and the vision tower (round(64 * s), round(48 * s))
    (c,) = out[edit.node_id][0]
    w, h = round(64 * (1024 * 1024 / (64 * 48)) ** 0.5), round(48 * (1024 * 1024 / (64 * 48)) ** 0.5)
    assert (w, h) == (1182, 887)
    (ref,) = c.model_inputs["reference_latents"]
    assert ref.shape[-2:] == (h // 8, w // 8)
    # vision input: 887 x 1182 -> 896 x 1176 (multiples of 28) -> 64 x 84 patches -> 32 x 42 tokens
    n_image = 32 * 42
    ids = qwen.encode(TEMPLATE_IMAGES.format("make it blue"))
    start = template_end(ids, len(ids))
    assert c.cross_attn.shape == (1, len(ids) - 1 + n_image - start, WIDTH)
    (t,) = out[text.node_id][0]  # no image: the text template, no reference latent
    assert "reference_latents" not in t.model_inputs
    text_ids = qwen.encode(TEMPLATE.format("make it blue"))
    assert t.cross_attn.shape == (1, len(text_ids) - template_end(text_ids, len(text_ids)), WIDTH)
    (p,) = out[plus.node_id][0]
    assert len(p.model_inputs["reference_latents"]) == 2
    # Plus: 384 x 384 area at 3:4 -> 443 x 333 -> 448 x 336 (x28) -> 16 x 12 tokens per image
    plus_ids = qwen.encode(EDIT_PLUS_TEMPLATE.format(
        "Picture 1: <|vision_start|><|image_pad|><|vision_end|>Picture 3: <|vision_start|><|image_pad|><|vision_end|>"
        "make it blue"))
    start = template_end(plus_ids, len(plus_ids))
    assert p.cross_attn.shape == (1, len(plus_ids) - 2 + 2 * 16 * 12 - start, WIDTH)
    for ref in p.model_inputs["reference_latents"]:  # 1M pixels, sides rounded to multiples of 8
        assert ref.shape[-2:] == (888 // 8, 1184 // 8)
    # bf16 storage and compute (the vision tower included): close to f32
    g.precision = "bf16"
    bf16 = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    (b,) = bf16[edit.node_id][0]
    assert torch.isfinite(b.cross_attn).all() and b.cross_attn.dtype == torch.float32
    assert 0 < (b.cross_attn - c.cross_attn).norm() / c.cross_attn.norm() < 0.05


def test_text_only_file_loads_and_refuses_an_image_by_name(models, tmp_path):
    from mixgraph.graph.executor import NodeError
    from mixgraph.ui import api
    _save_image(tmp_path / "in", "ref.png", 32, 32)
    g = api.Graph(precision="f32")
    clip = g.add("CLIPLoader", clip_name="qwen_2.5_vl_text_only.safetensors", type="qwen_image")
    g.add("PreviewAny", source=g.add("CLIPTextEncode", text="a fox", clip=clip))
    api.run(g, models=models, output=tmp_path / "out")
    g.add("PreviewAny", source=g.add("TextEncodeQwenImageEdit", clip=clip, prompt="x",
                                     image=g.add("LoadImage", image="ref.png")))
    with pytest.raises(NodeError, match="no vision tower"):
        api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")


def test_edit_node_specs_match_comfyui():
    from mixgraph.ui import api
    info = api.default_registry().object_info()
    e, p = info["TextEncodeQwenImageEdit"], info["TextEncodeQwenImageEditPlus"]
    assert e["category"] == p["category"] == "advanced/conditioning"
    assert list(e["input"]["required"]) == ["clip", "prompt"] and list(e["input"]["optional"]) == ["vae", "image"]
    assert list(p["input"]["optional"]) == ["vae", "image1", "image2", "image3"]
    assert e["input"]["required"]["prompt"][1].get("multiline") is True
    assert e["output"] == p["output"] == ["CONDITIONING"]


def test_fp8_scaled_file_encodes_close_to_the_full_one(models, tmp_path):
    from mixgraph.ui import api
    _save_image(tmp_path / "in", "ref.png", 40, 40)
    conds = []
    for name in ("qwen_2.5_vl_7b.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors"):
        g = api.Graph(precision="f32")
        clip = g.add("CLIPLoader", clip_name=name, type="qwen_image")
        edit = g.add("TextEncodeQwenImageEdit", clip=clip, prompt="a fox", image=g.add("LoadImage", image="ref.png"))
        g.add("PreviewAny", source=edit)
        conds.append(api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")[edit.node_id][0][0])
    full, fp8 = (c.cross_attn for c in conds)
    assert full.shape == fp8.shape and torch.isfinite(fp8).all()
    assert 0 < (fp8 - full).norm() / full.norm() < 0.1


@pytest.mark.parametrize("spec", ["bf16", "fp8_e4m3fn:bf16", "int8", "f16"])
def test_image_prompt_runs_under_each_precision(pair, spec):
    from mixgraph.graph.precision import parse_spec
    from mixgraph.nodes.weights.cast import apply_precision
    _, model = pair
    row = [[(5, 1.0), (ImageEmbed(_image(60, 80)), 1.0), (7, 1.0)]]
    ref = model.encode_chunks(row, RULE, None, print).hidden
    got = apply_precision(model, parse_spec(spec)).encode_chunks(row, RULE, None, print).hidden
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert (got - ref).norm() / ref.norm() < 0.1
