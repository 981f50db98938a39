"""Text encoders as a set: a CLIP handle of any named encoders, each with its own precision role,
tokenizer and output rule (``nodes/encoders/encoder_set.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights import store
from mixgraph.nodes.encoders.encoder_set import OutputRule, get_tokenizer, register_tokenizer, tokenizer_names
from mixgraph.nodes.models.handles import ClipHandle
from mixgraph.nodes.adapters.lora import load_lora_patches
from mixgraph.nodes.encoders.tokenizer import END_TOKEN, CLIPTokenizer
from tests.fixtures import checkpoints as C
from tests.fixtures.tiny_lora import CLIP_TARGETS, lora_file

F32, BF16 = parse_spec("f32"), parse_spec("bf16")
TEXT = "a (photo:1.2) of a cat"


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """clip_l (role "text") and a second clip_l-shaped encoder "aux" (role "aux_text", the pooled
    one) from two files, so the weight store tells their storage dtypes apart."""
    d = tmp_path_factory.mktemp("set")
    C.write_clip_l(d / "l.safetensors", seed=1)
    C.write_clip_l(d / "aux.safetensors", seed=2)
    one = loader.load_clip([d / "l.safetensors"]).encoder("clip_l")
    other = loader.load_clip([d / "aux.safetensors"]).encoder("clip_l")
    aux = dataclasses.replace(other, name="aux", role="aux_text",
                              rule=OutputRule(END_TOKEN, -2, False, True, pooled=True))
    plain = dataclasses.replace(one, rule=dataclasses.replace(one.rule, pooled=False))
    return plain, aux


def _one(conds):
    assert len(conds) == 1
    return conds[0]


def test_a_set_of_any_encoders_runs_each_under_its_roles_policy(entries):
    plain, aux = entries
    both = ClipHandle("toy", (plain, aux))
    assert both.names == ("clip_l", "aux")
    store.clear()
    c = _one(both.encode(TEXT, F32, policies={"aux_text": BF16}))
    # each encoder's weights were materialized in its own role's storage dtype
    held = dict(store.held())
    assert held[plain.source.path] == torch.float32 and held[aux.source.path] == torch.bfloat16
    # the features join in set order; each half is what that encoder alone gives under its policy
    alone_l = _one(ClipHandle("toy", (dataclasses.replace(plain, rule=dataclasses.replace(plain.rule, pooled=True)),))
                   .encode(TEXT, F32))
    alone_aux = _one(ClipHandle("toy", (aux,)).encode(TEXT, BF16))
    aux_f32 = _one(ClipHandle("toy", (aux,)).encode(TEXT, F32))
    assert c.cross_attn.shape == (1, 77, 64) and c.cross_attn.dtype == torch.float32
    assert torch.equal(c.cross_attn[..., :32], alone_l.cross_attn)
    assert torch.equal(c.cross_attn[..., 32:], alone_aux.cross_attn)
    assert not torch.equal(alone_aux.cross_attn, aux_f32.cross_attn)  # bf16 really ran
    assert torch.equal(c.pooled, alone_aux.pooled)  # the pooled vector is the entry whose rule says so
    # a role without an entry in `policies` runs under the one policy
    c_f32 = _one(both.encode(TEXT, F32, policies={"other": BF16}))
    assert torch.equal(c_f32.cross_attn[..., 32:], aux_f32.cross_attn)
    # per-role policies reach encode_tokens too
    t = _one(both.encode_tokens(both.tokenize(TEXT), F32, policies={"aux_text": BF16}))
    assert torch.equal(t.cross_attn, c.cross_attn)


def test_lookup_by_name_and_unknown_names(entries):
    plain, aux = entries
    both = ClipHandle("toy", (plain, aux))
    assert both.encoder("aux") is aux and both.encoder("clip_l") is plain
    with pytest.raises(ValueError, match=r"no text encoder 'clip_g'; it has clip_l, aux"):
        both.encoder("clip_g")
    with pytest.raises(ValueError, match="no text encoder clip_g"):
        both.encode(TEXT, F32, texts={"clip_g": "x"})
    # texts by name: aux reads its own prompt
    c = _one(both.encode(TEXT, F32, texts={"aux": "a dog"}))
    assert torch.equal(c.cross_attn[..., 32:], _one(ClipHandle("toy", (aux,)).encode("a dog", F32)).cross_attn)


def test_a_set_names_each_encoder_once_and_one_pooled_vector(entries):
    plain, aux = entries
    with pytest.raises(ValueError, match="aux appears twice"):
        ClipHandle("toy", (aux, aux))
    with pytest.raises(NotImplementedError, match="pooled"):
        ClipHandle("toy", (dataclasses.replace(plain, rule=aux.rule), aux))
    with pytest.raises(TypeError, match="EncoderEntry"):
        ClipHandle("toy", ("clip_l",))
    with pytest.raises(ValueError, match="at least one"):
        ClipHandle("toy", ())


def test_patches_target_encoders_by_name(entries, tmp_path):
    plain, aux = entries
    both = ClipHandle("toy", (plain, aux))
    shapes = both.weight_shapes()
    assert set(shapes) == {"clip_l", "aux"}
    # a LoRA in ComfyUI's generic naming reaches the encoder of any name
    key = CLIP_TARGETS[0]
    module = "text_encoders.aux.transformer." + key.removesuffix(".weight")
    path = tmp_path / "aux_lora.safetensors"
    save_file(lora_file({module: shapes["aux"][key]}, "lora", seed=3), str(path))
    _, patched = load_lora_patches(path, None, both, 0.0, 1.0)
    assert [p.target for p in patched.patches] == ["aux"]
    base, lora = _one(both.encode(TEXT, F32)), _one(patched.encode(TEXT, F32))
    assert torch.equal(lora.cross_attn[..., :32], base.cross_attn[..., :32])  # clip_l untouched
    assert not torch.equal(lora.cross_attn[..., 32:], base.cross_attn[..., 32:])


def test_sd_entries_carry_their_tokenizer_role_and_rule(tmp_path):
    path = C.write_sdxl(tmp_path / "xl.safetensors")
    _, clip, _ = loader.load_checkpoint(path)
    assert clip.names == ("clip_l", "clip_g")
    assert [(e.tokenizer, e.role) for e in clip.encoders] == [("clip", "text"), ("clip", "text")]
    assert [e.rule.pad_token for e in clip.encoders] == [END_TOKEN, 0]
    assert [e.rule.pooled for e in clip.encoders] == [False, True]
    assert hash(clip) == hash(dataclasses.replace(clip))  # a hashable recipe


def test_tokenizers_by_name():
    assert "clip" in tokenizer_names()
    tok = get_tokenizer("clip")
    assert isinstance(tok, CLIPTokenizer) and get_tokenizer("clip") is tok  # built once
    with pytest.raises(ValueError, match="no tokenizer named 'nope'; registered: clip"):
        get_tokenizer("nope")
    register_tokenizer("clip", CLIPTokenizer)  # the same factory again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_tokenizer("clip", lambda: None)


def test_an_entry_reads_the_tokenizer_it_names(entries):
    """A later family registers its tokenizer by name; the handle needs no change."""

    class DogTokenizer(CLIPTokenizer):
        def tokenize_with_weights(self, text, **kw):
            return super().tokenize_with_weights(text.replace("cat", "dog"), **kw)

    register_tokenizer("test_dog", DogTokenizer)
    plain, aux = entries
    dog = dataclasses.replace(aux, tokenizer="test_dog")
    got = _one(ClipHandle("toy", (dog,)).encode("a cat", F32))
    want = _one(ClipHandle("toy", (aux,)).encode("a dog", F32))
    assert torch.equal(got.cross_attn, want.cross_attn)
