"""The T5 v1.1 encoder against transformers' ``T5EncoderModel`` on a tiny config in ComfyUI's key
layout, its ComfyUI encoding semantics (weights against the empty prompt, masks), and the T5
tokenizer against the `tokenizers` / transformers readings of the same shipped files."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from mixgraph.nodes.encoders import encoder_arch  # noqa: F401  (registers the "t5" tokenizer)
from mixgraph.nodes.encoders.encoder_set import get_tokenizer
from mixgraph.nodes.encoders.t5 import T5Config, T5EncoderModel, T5Rule, relative_position_bucket
from mixgraph.nodes.encoders.t5_tokenizer import T5_TOKENIZER_PATH, T5Tokenizer
from mixgraph.nodes.encoders.text_encode import TextEncoder, encode_tokens
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.graph.precision import Policy
from tests.fixtures.tiny_t5 import TINY_T5, hf_t5, tiny_t5_state_dict

transformers = pytest.importorskip("transformers")


def _ours(sd=None) -> T5EncoderModel:
    sd = sd or tiny_t5_state_dict()
    model = T5EncoderModel(T5Config.from_state_dict(sd))
    model.load_state_dict(sd, strict=True)
    return model.eval()


def test_config_from_shapes():
    cfg = T5Config.from_state_dict(tiny_t5_state_dict())
    assert cfg == T5Config(vocab=TINY_T5["vocab"], width=TINY_T5["d_model"], heads=TINY_T5["heads"],
                           head_dim=TINY_T5["d_kv"], ff=TINY_T5["d_ff"], layers=TINY_T5["layers"])


def test_buckets_match_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention
    pos = torch.arange(300)
    rel = pos[None, :] - pos[:, None]
    ref = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert torch.equal(relative_position_bucket(rel), ref)


@pytest.mark.parametrize("masked", [False, True])
def test_matches_transformers_t5_encoder(masked):
    sd = tiny_t5_state_dict()
    ref = hf_t5(sd)
    ours = _ours(sd)
    ids = torch.tensor([[5, 17, 3, 99, 1, 0, 0, 0], [8, 8, 1, 0, 0, 0, 0, 0]])
    mask = (torch.arange(8)[None] <= (ids == 1).float().argmax(1)[:, None]).long()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask if masked else None).last_hidden_state
        got, chosen = ours(ids, mask if masked else None)
    assert torch.equal(got, chosen)
    rel = (got - want).abs().max() / want.abs().max()
    assert rel < 1e-5, rel
    with torch.no_grad():
        hidden = ref(input_ids=ids, output_hidden_states=True).hidden_states  # [embeds, block 0, ...]
        _, mid = ours(ids, None, -2, norm_hidden=False)
    assert torch.allclose(mid, hidden[-2], atol=1e-5, rtol=1e-4)


def test_encode_chunks_weights_against_the_empty_prompt():
    model = _ours()
    rule = T5Rule()
    chunk = [(5, 1.0), (17, 1.5), (3, 1.0), (1, 1.0), (0, 1.0), (0, 1.0)]
    out = model.encode_chunks([chunk], rule, None, print)
    assert out.hidden.shape == (1, 6, TINY_T5["d_model"]) and out.pooled is None and out.mask is None
    with torch.no_grad():
        _, z = model(torch.tensor([[5, 17, 3, 1, 0, 0], [1, 0, 0, 0, 0, 0]]))
    want = z[0].clone()
    want[1] = (z[0, 1] - z[1, 1]) * 1.5 + z[1, 1]
    assert torch.allclose(out.hidden[0], want, atol=1e-6)
    # Chroma / PixArt: the empty prompt is all pad tokens; a masked rule returns its mask
    pix = model.encode_chunks([chunk], T5Rule(empty_end=False, attention_mask=True), None, print)
    with torch.no_grad():
        m = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
        _, z = model(torch.tensor([[5, 17, 3, 1, 0, 0], [0, 0, 0, 0, 0, 0]]), m)
    want = z[0].clone()
    want[1] = (z[0, 1] - z[1, 1]) * 1.5 + z[1, 1]
    assert torch.allclose(pix.hidden[0], want, atol=1e-6)
    assert pix.mask.tolist() == [[1, 1, 1, 1, 0, 0]]


def test_embedding_vectors_and_wrong_width():
    model = _ours()
    vec = torch.randn(TINY_T5["d_model"])
    warnings = []
    out = model.encode_chunks([[(5, 1.0), (vec, 1.0), (torch.randn(7), 1.0), (1, 1.0)]], T5Rule(), None,
                              warnings.append)
    with torch.no_grad():
        e = model.shared(torch.tensor([[5, 0, 1, 0]])).clone()
        e[0, 1] = vec
        _, z = model(torch.zeros(1, 4, dtype=torch.long), embeds=e)
    assert torch.allclose(out.hidden, z, atol=1e-6) and "does not match" in warnings[0]


def test_runs_under_bf16_with_f32_norms():
    model = _ours()
    cast = apply_precision(model, Policy(storage=torch.bfloat16, compute=torch.bfloat16))
    assert cast.encoder.final_layer_norm.weight.dtype == torch.float32
    assert cast.encoder.block[0].layer[1].DenseReluDense.wi_0.weight.dtype == torch.bfloat16
    ids = torch.tensor([[5, 17, 3, 1]])
    with torch.no_grad():
        got, _ = cast(ids)
        want, _ = model(ids)
    assert got.dtype == torch.float32 and (got - want).abs().max() / want.abs().max() < 0.05


# ---------------------------------------------------------------------------------------------
# tokenizer

PROMPTS = ["a photo of a cat", "A Red  Fox, jumping over 3 lazy dogs!", "naïve café — 東京 ümlaut",
           "hello\tworld\nnew line", "", "x" * 40]


def test_ids_match_the_tokenizers_library_and_transformers():
    ours = T5Tokenizer()
    ref = Tokenizer.from_file(str(T5_TOKENIZER_PATH))
    fast = transformers.T5TokenizerFast.from_pretrained(str(T5_TOKENIZER_PATH.parent), local_files_only=True)
    for text in PROMPTS:
        assert ours(text) == ref.encode(text).ids == fast(text)["input_ids"], text


def test_tokenize_with_weights_comfy_layout():
    tok = get_tokenizer("t5")
    ids = T5Tokenizer().encode
    chunks = tok.tokenize_with_weights("a (red:1.5) fox", pad_token=0)
    assert len(chunks) == 1 and len(chunks[0]) == 77  # SD3's min_length by default
    body = [(t, 1.0) for t in ids("a ")] + [(t, 1.5) for t in ids("red")] + [(t, 1.0) for t in ids(" fox")]
    assert chunks[0][: len(body) + 1] == body + [(1, 1.0)]
    assert set(chunks[0][len(body) + 1:]) == {(0, 1.0)}
    assert len(tok.tokenize_with_weights("a fox", pad_token=0, min_length=256)[0]) == 256  # Flux
    assert tok.tokenize_with_weights("a fox", pad_token=0, min_length=1)[0] == [(t, 1.0) for t in ids("a fox")] + [(1, 1.0)]
    long = tok.tokenize_with_weights("word " * 400, pad_token=0)
    assert len(long) == 1 and len(long[0]) > 400  # never split
    with_ids = tok.tokenize_with_weights("a (red:1.5)", pad_token=0, word_ids=True, min_length=1)
    assert {w for _, _, w in with_ids[0]} == {0, 1, 2}


def test_embedding_syntax():
    tok = get_tokenizer("t5")
    vec = torch.randn(2, TINY_T5["d_model"])
    seen = []

    def lookup(name):
        seen.append(name)
        return {"t5xxl": vec} if name == "mine" else None

    chunk = tok.tokenize_with_weights("a embedding:mine fox", pad_token=0, embedding_lookup=lookup,
                                      min_length=1)[0]
    tensors = [t for t, _ in chunk if isinstance(t, torch.Tensor)]
    assert seen == ["mine"] and len(tensors) == 2 and torch.equal(tensors[1], vec[1])


def test_set_encoding_through_encode_tokens():
    """A T5 entry runs its own encode_chunks from text_encode.encode_tokens."""
    model = _ours()
    enc = TextEncoder("t5xxl", T5Rule(min_length=1), model, "t5")
    tokens = {"t5xxl": get_tokenizer("t5").tokenize_with_weights("a fox", pad_token=0, min_length=1)}
    (cond,) = encode_tokens([enc], tokens)
    assert cond.cross_attn.shape == (1, len(tokens["t5xxl"][0]), TINY_T5["d_model"]) and cond.pooled is None
