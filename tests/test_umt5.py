"""Wan's text side: the umT5 encoder against transformers' ``UMT5EncoderModel`` on a tiny config in
ComfyUI's key layout (also stored as scaled fp8), its SentencePiece tokenizer from the file's
``spiece_model`` against sentencepiece itself and ComfyUI's rules (end token, padding to 512),
ComfyUI's ``zero_out_masked`` encoding, CLIPLoader type "wan" + CLIPTextEncode through
``mixgraph.ui.api``, and the ViT-H-shaped CLIP vision output Wan's image-to-video reads.

The family is test-only (``WanTextToy``: declares CLIPLoader type "wan" with the umT5 slot a Wan
family declares, ``tiny_umt5.UMT5_SLOT``), so these tests need no Wan family."""

from __future__ import annotations

import pytest
import sentencepiece
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders import encoder_arch
from mixgraph.nodes.encoders.encoder_set import get_join, get_tokenizer
from mixgraph.nodes.encoders.t5 import T5Config, T5EncoderModel, T5Rule
from mixgraph.nodes.encoders.umt5 import UMT5XXL, WAN, WAN_RULES, is_umt5, umt5_config
from mixgraph.nodes.encoders.umt5_tokenizer import UMT5Tokenizer, register_umt5_tokenizer, umt5_tokenizer_name
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.ui import api
from tests.fixtures.checkpoints import save_state_dict
from tests.fixtures.tiny_t5 import tiny_t5_state_dict
from tests.fixtures.tiny_umt5 import (CHECKPOINT_PREFIX, TINY_UMT5, UMT5_SLOT, WanTextToy, hf_umt5,
                                      tiny_umt5_state_dict, umt5_spiece_bytes, umt5_spiece_tensor, write_umt5)

transformers = pytest.importorskip("transformers")

F32 = parse_spec("f32")
D = TINY_UMT5["d_model"]
FAMILY = WanTextToy()


@pytest.fixture(scope="module", autouse=True)
def registered():
    families.register(FAMILY)
    yield
    families.unregister(FAMILY.name)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("umt5")
    te = root / "text_encoders"
    sd = write_umt5(te / "umt5_xxl_fp16.safetensors", seed=1)
    dequantised = write_umt5(te / "umt5_xxl_fp8_e4m3fn_scaled.safetensors", seed=1, fp8=True)
    save_state_dict(te / "umt5_dequantised.safetensors", {**dequantised, "spiece_model": umt5_spiece_tensor()})
    write_umt5(te / "wan_checkpoint_text.safetensors", seed=1, checkpoint=True)
    write_umt5(te / "umt5_no_spiece.safetensors", seed=1, spiece=False)
    return root, sd


def _ours(sd) -> T5EncoderModel:
    model = T5EncoderModel(umt5_config(sd))
    model.load_state_dict(sd, strict=True)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# the encoder


def test_detection_and_config_from_shapes(models):
    root, sd = models
    cfg = umt5_config(sd)
    assert cfg == T5Config(vocab=TINY_UMT5["vocab"], width=D, heads=TINY_UMT5["heads"], head_dim=TINY_UMT5["d_kv"],
                           ff=TINY_UMT5["d_ff"], layers=TINY_UMT5["layers"], per_layer_bias=True)
    assert is_umt5(sd) and not is_umt5(tiny_t5_state_dict())
    assert T5Config.from_state_dict(tiny_t5_state_dict()).per_layer_bias is False
    for name, prefix in (("umt5_xxl_fp16", ""), ("umt5_xxl_fp8_e4m3fn_scaled", ""),
                         ("wan_checkpoint_text", CHECKPOINT_PREFIX + "transformer.")):
        found = encoder_arch.recognise(inspect_file(root / "text_encoders" / f"{name}.safetensors"))
        assert (found.arch, found.prefix, found.width) == ("umt5", prefix, D)
    assert encoder_arch.recognise(tiny_t5_state_dict()).arch == "t5"  # T5 v1.1 stays T5
    # a one-block file shows no block-1 table: umT5 by its vocabulary
    one = tiny_umt5_state_dict(layers=1, vocab=256384, d_model=8, heads=2, d_kv=4, d_ff=8)
    assert is_umt5(one) and umt5_config(one).per_layer_bias


@pytest.mark.parametrize("masked", [False, True])
def test_matches_transformers_umt5_encoder(models, masked):
    _, sd = models
    ref, ours = hf_umt5(sd), _ours(sd)
    ids = torch.tensor([[5, 17, 3, 99, 1, 0, 0, 0], [8, 8, 1, 0, 0, 0, 0, 0]])
    mask = (torch.arange(8)[None] <= (ids == 1).float().argmax(1)[:, None]).long()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask if masked else None, output_hidden_states=True)
        got, chosen = ours(ids, mask if masked else None)
        _, mid = ours(ids, mask if masked else None, -2, norm_hidden=False)
    assert torch.equal(got, chosen)
    rel = (got - want.last_hidden_state).abs().max() / want.last_hidden_state.abs().max()
    assert rel < 1e-5, rel
    rows = mask.bool() if masked else torch.ones_like(mask, dtype=torch.bool)  # HF's padded rows differ
    torch.testing.assert_close(mid[rows], want.hidden_states[-2][rows], atol=1e-5, rtol=1e-5)
    # every block's own table matters (a T5 v1.1 reading of the file gives other numbers)
    t5 = T5EncoderModel(T5Config(**{**umt5_config(sd).__dict__, "per_layer_bias": False}))
    t5.load_state_dict(sd, strict=False)
    with torch.no_grad():
        assert not torch.allclose(t5.eval()(ids)[0], got, atol=1e-3)


def test_encode_chunks_zero_out_masked_then_weights():
    """ComfyUI's UMT5XXlModel: attention masked after the end token, those hidden states zeroed
    (every row, the empty prompt's too), then ``(z - z_empty) * w + z_empty``; no mask returned."""
    sd = tiny_umt5_state_dict(seed=2)
    model, rule = _ours(sd), WAN_RULES[UMT5XXL]
    chunk = [(5, 1.0), (17, 1.5), (3, 1.0), (1, 1.0), (0, 1.0), (0, 1.0)]
    out = model.encode_chunks([chunk], rule, None, print)
    assert out.hidden.shape == (1, 6, D) and out.pooled is None
    ids = torch.tensor([[5, 17, 3, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    m = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        z = hf_umt5(sd)(input_ids=ids, attention_mask=m).last_hidden_state * m[..., None]
    want = z[0].clone()
    want[1] = (z[0, 1] - z[1, 1]) * 1.5 + z[1, 1]
    torch.testing.assert_close(out.hidden[0], want, atol=1e-5, rtol=1e-5)
    assert torch.all(out.hidden[0, 4:] == 0)
    assert get_join(WAN)({UMT5XXL: out}).model_inputs == {}  # ComfyUI returns no attention mask for Wan


def test_t5_rule_without_zeroing_is_unchanged():
    """T5 v1.1's sets keep their padding's hidden states (zero_masked is Wan's alone)."""
    model = _ours(tiny_umt5_state_dict(seed=3))
    chunk = [(5, 1.0), (1, 1.0), (0, 1.0)]
    plain = model.encode_chunks([chunk], T5Rule(attention_mask=True), None, print)
    zeroed = model.encode_chunks([chunk], T5Rule(attention_mask=True, zero_masked=True), None, print)
    assert torch.equal(plain.hidden[:, :2], zeroed.hidden[:, :2]) and plain.hidden[0, 2].abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# the tokenizer


def test_tokenizer_ids_match_sentencepiece():
    sp = sentencepiece.SentencePieceProcessor(model_proto=umt5_spiece_bytes())
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    tok = UMT5Tokenizer(umt5_spiece_bytes())
    for text in ("a red fox jumps over snow", "cinematic shot of waves, slow motion", "Zebra 42 !"):
        assert tok.encode(text) == sp.encode(text)
        assert tok(text) == sp.encode(text, add_eos=True)  # ComfyUI's SPieceTokenizer(add_eos=True)


def test_tokenize_with_weights_comfy_layout():
    """ComfyUI's UMT5XXlTokenizer: no start token, each weight segment encoded alone, the end
    token 1, pad 0 up to 512 tokens, one chunk however long the prompt."""
    sp = sentencepiece.SentencePieceProcessor(model_proto=umt5_spiece_bytes())
    tok = UMT5Tokenizer(umt5_spiece_bytes())
    (chunk,) = tok.tokenize_with_weights("a cat (red fox:1.3) river")
    ids = sp.encode("a cat ") + sp.encode("red fox") + sp.encode(" river")
    assert [t for t, _ in chunk] == ids + [1] + [0] * (512 - len(ids) - 1)
    assert [w for _, w in chunk[: len(ids)]] == ([1.0] * len(sp.encode("a cat ")) + [1.3] * len(sp.encode("red fox"))
                                                 + [1.0] * len(sp.encode(" river")))
    long = " ".join(["cinematic shot of waves"] * 200)
    (one,) = tok.tokenize_with_weights(long)
    assert len(one) == len(sp.encode(long)) + 1 > 512 and one[-1] == (1, 1.0)
    assert tok.tokenize_with_weights("", min_length=1) == [[(1, 1.0)]]
    (words,) = tok.tokenize_with_weights("a dog", word_ids=True, min_length=8)
    n = len(sp.encode("a dog"))
    assert words == [(t, 1.0, 1) for t in sp.encode("a dog")] + [(1, 1.0, 0)] + [(0, 1.0, 0)] * (7 - n)


def test_tokenizer_comes_from_the_file(models):
    root, _ = models
    name = umt5_tokenizer_name(WeightSource.from_file(root / "text_encoders" / "umt5_xxl_fp16.safetensors"))
    assert name == register_umt5_tokenizer(umt5_spiece_bytes()) and name.startswith("umt5:")
    ckpt = WeightSource.from_file(root / "text_encoders" / "wan_checkpoint_text.safetensors",
                                  CHECKPOINT_PREFIX + "transformer.")
    assert umt5_tokenizer_name(ckpt) == name  # the model kept beside the checkpoint's encoder
    assert get_tokenizer(name).tokenize_with_weights("a cat", min_length=1)[0][-1] == (1, 1.0)
    with pytest.raises(ValueError, match="spiece_model"):
        umt5_tokenizer_name(WeightSource.from_file(root / "text_encoders" / "umt5_no_spiece.safetensors"))


# ---------------------------------------------------------------------------------------------
# CLIPLoader type "wan", CLIPTextEncode


def _reference(sd, text: str) -> torch.Tensor:
    """ComfyUI's Wan cond from transformers' encoder: ids + end, pad to 512, masked attention,
    padding zeroed."""
    sp = sentencepiece.SentencePieceProcessor(model_proto=umt5_spiece_bytes())
    row = sp.encode(text) + [1]
    ids = torch.tensor([row + [0] * (512 - len(row))])
    mask = (torch.arange(512) < len(row)).long()[None]
    with torch.no_grad():
        return hf_umt5(sd)(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]


def _encode(clip, text: str, policy=F32):
    """``clip.encode`` as the executor runs a node (in inference mode: the weight store shares
    the tensors it read for the workflows of the other tests)."""
    with torch.inference_mode():
        return clip.encode(text, policy)


def _run(graph, root, *shown):
    for ref in shown:
        graph.add("PreviewAny", source=ref)
    return api.run(graph, models=root, output=root / "out", precision="f32").outputs


def test_clip_loader_wan_and_clip_text_encode(models):
    root, sd = models
    g = api.Graph()
    clip = g.add("CLIPLoader", clip_name="umt5_xxl_fp16.safetensors", type="wan")[0]
    pos = g.add("CLIPTextEncode", clip=clip, text="a red fox jumps over snow")
    weighted = g.add("CLIPTextEncode", clip=clip, text="a (red fox:1.2) jumps")
    out = _run(g, root, pos, weighted)
    (cond,), (wcond,) = out[pos.node_id][0], out[weighted.node_id][0]
    assert cond.cross_attn.shape == (1, 512, D) and cond.pooled is None and cond.model_inputs == {}
    torch.testing.assert_close(cond.cross_attn, _reference(sd, "a red fox jumps over snow"), atol=1e-5, rtol=1e-4)
    assert wcond.cross_attn.shape == (1, 512, D)
    handle = loader.load_clip([root / "text_encoders" / "umt5_xxl_fp16.safetensors"], "wan")
    assert handle.kind == WAN and handle.names == (UMT5XXL,)
    entry = handle.encoder(UMT5XXL)
    assert entry.tokenizer.startswith("umt5:") and entry.config.per_layer_bias and entry.role == UMT5_SLOT.role


def test_clip_loader_wan_reads_the_checkpoint_prefix_and_refuses_what_does_not_fit(models):
    root, _ = models
    te = root / "text_encoders"
    a = _encode(loader.load_clip([te / "umt5_xxl_fp16.safetensors"], "wan"), "a cat")[0].cross_attn
    b = _encode(loader.load_clip([te / "wan_checkpoint_text.safetensors"], "wan"), "a cat")[0].cross_attn
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="spiece_model"):
        loader.load_clip([te / "umt5_no_spiece.safetensors"], "wan")
    save_state_dict(root / "plain" / "t5.safetensors", tiny_t5_state_dict())
    with pytest.raises(ValueError, match="umt5xxl"):  # a T5 v1.1 file is no umT5
        loader.load_clip([root / "plain" / "t5.safetensors"], "wan")


def test_t5_tokenizer_options_reach_the_umt5_tokenizer(models):
    """T5TokenizerOptions names umt5xxl among ComfyUI's T5 encoders: its min_padding / min_length
    replace the set's 512."""
    from mixgraph.nodes.helpers.cond_ops import t5_tokenizer_options

    root, _ = models
    clip = t5_tokenizer_options(loader.load_clip([root / "text_encoders" / "umt5_xxl_fp16.safetensors"], "wan"), 3, 0)
    (chunk,) = clip.tokenize("a red fox")[UMT5XXL]
    n = len(sentencepiece.SentencePieceProcessor(model_proto=umt5_spiece_bytes()).encode("a red fox"))
    assert [t for t, *_ in chunk][n:] == [1, 0, 0, 0]


@pytest.mark.parametrize("storage", ["f32", "fp8_e4m3fn:f32"])
def test_scaled_fp8_file_matches_its_dequantised_weights(models, storage):
    """ComfyUI's umt5_xxl_fp8_e4m3fn_scaled layout through the common quantised-file reader."""
    root, _ = models
    te = root / "text_encoders"
    got = loader.load_clip([te / "umt5_xxl_fp8_e4m3fn_scaled.safetensors"], "wan")
    want = loader.load_clip([te / "umt5_dequantised.safetensors"], "wan")
    assert got.encoder(UMT5XXL).config == want.encoder(UMT5XXL).config
    (a,) = _encode(got, "a red fox", parse_spec(storage))
    (b,) = _encode(want, "a red fox")
    if storage == "f32":
        torch.testing.assert_close(a.cross_attn, b.cross_attn, rtol=1e-5, atol=1e-5)
    else:  # the quantised Linears exact, embeddings and bias tables through fp8 storage
        assert (a.cross_attn - b.cross_attn).norm() <= 0.1 * b.cross_attn.norm()


# ---------------------------------------------------------------------------------------------
# CLIP vision for Wan image-to-video: ViT-H/14's penultimate hidden states


def test_vit_h_shaped_clip_vision_penultimate_hidden_states(tmp_path):
    """clip_vision_h's shapes (width 1280, 16 heads of 80, GELU, 224 px in 14 px patches: 257
    tokens), fewer and narrower-MLP layers: ``penultimate_hidden_states`` is transformers'
    ``hidden_states[-2]``; CLIPVisionEncode's crop "none" stretches, "center" crops."""
    from transformers import CLIPVisionConfig as HFConfig, CLIPVisionModelWithProjection

    from mixgraph.nodes.encoders.clip_vision import clip_preprocess
    from mixgraph.nodes.encoders.clip_vision_handle import load_clip_vision
    from tests.fixtures.tiny_vision import write_clip_vision

    sizes = dict(width=1280, layers=2, patch=14, image=224, proj=1024, mlp=256)
    sd = write_clip_vision(tmp_path / "clip_vision_h.safetensors", seed=4, **sizes)
    handle = load_clip_vision(tmp_path / "clip_vision_h.safetensors")
    assert (handle.config.heads, handle.config.activation, handle.config.image_size) == (16, "gelu", 224)
    ref = CLIPVisionModelWithProjection(HFConfig(
        hidden_size=1280, intermediate_size=256, num_hidden_layers=2, num_attention_heads=16, image_size=224,
        patch_size=14, projection_dim=1024, hidden_act="gelu", layer_norm_eps=1e-5)).eval()
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)
    image = torch.rand(1, 160, 240, 3, generator=torch.Generator().manual_seed(5))
    for crop in (False, True):
        out = handle.encode(image, F32, crop=crop)
        with torch.no_grad():
            r = ref(pixel_values=clip_preprocess(image, 224, crop=crop), output_hidden_states=True)
        assert out.penultimate_hidden_states.shape == (1, 257, 1280)
        torch.testing.assert_close(out.penultimate_hidden_states, r.hidden_states[-2], rtol=1e-4, atol=1e-4)
    stretched = clip_preprocess(image, 224, crop=False)
    direct = torch.nn.functional.interpolate(image.movedim(-1, 1), size=(224, 224), mode="bicubic", antialias=True)
    assert stretched.shape == (1, 3, 224, 224)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    torch.testing.assert_close(stretched, ((direct.clamp(0, 1) * 255).round() / 255 - mean) / std)
