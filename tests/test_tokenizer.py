"""CLIP tokenizer ids and ComfyUI prompt syntax (weights, embeddings, chunking)."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.encoders.tokenizer import (END_TOKEN, START_TOKEN, CLIPTokenizer, load_clip_vocab,
                                               parse_weights)


@pytest.fixture(scope="module")
def tok() -> CLIPTokenizer:
    return CLIPTokenizer()


PROMPTS = [
    "a photo of a cat",
    "Hello, World!!! It's 2024... don't   stop\n\tnow",
    "café naïve über 3.14159 $100 #tag @user",
    "emoji 🐱🚀 and ™ ©",
    "UPPER lower MiXeD CaSe",
    "he's we'll they'd I'm you've they're",
    "masterpiece, best quality, 1girl, (red hair:1.2), [blue eyes]",
    "''quoted'' \"double\" `back` tick",
    "x²+y³ ½ ① numbers 0123456789",
    "tab\there  nbsp\u00a0x",
    "a\u0301 e\u0301 combining accents",
    "ＡＢＣ full-width latin",
    "<|endoftext|> special",
    "url https://example.com/a_b-c?d=e&f=g",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx long nonsense zzzqqq",
]


def test_tokenizer_photo_of_a_cat_ids(tok):
    assert tok("a photo of a cat") == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert tok.vocab_size == 49408


def test_tokenizer_matches_transformers(tok):
    from transformers import CLIPTokenizer as HFTokenizer

    vocab, merges = load_clip_vocab()
    assert len(merges) == 48894
    ref = HFTokenizer(vocab=vocab, merges=merges)
    for prompt in PROMPTS:
        assert tok(prompt) == ref(prompt)["input_ids"], prompt


def test_tokenizer_basic_cleanup_as_comfyui(tok):
    # ComfyUI's (Python) CLIPTokenizer cleans text BERT-style when ftfy is absent: each CJK
    # ideograph is its own word, control characters are removed.
    assert tok.encode("猫咪") == tok.encode("猫") + tok.encode("咪")
    assert tok.encode("猫") != tok.encode("咪")
    assert tok.encode("ca\x07t") == tok.encode("cat")


def test_parse_weights_comfyui_rules():
    assert parse_weights("a (cat:1.2) b") == [("a ", 1.0), ("cat", 1.2), (" b", 1.0)]
    assert parse_weights("((cat))") == [("cat", 1.0 * 1.1 * 1.1)]
    assert parse_weights("((cat:0.5))") == [("cat", 0.5)]  # an explicit weight replaces, not multiplies
    assert parse_weights("[cat]") == [("[cat]", 1.0)]
    assert parse_weights(r"\(cat\) (dog)") == [("(cat) ", 1.0), ("dog", pytest.approx(1.1))]
    assert parse_weights("(a (b:1.5) c)") == [("a ", 1.1), ("b", 1.5), (" c", 1.1)]
    assert parse_weights("(x:abc)") == [("x:abc", pytest.approx(1.1))]  # not a number: kept as text
    assert parse_weights("(unclosed") == [("(unclosed", 1.0)]


def test_tokenize_with_weights_single_chunk(tok):
    chunks = tok.tokenize_with_weights("a (cat:1.5)", pad_token=END_TOKEN)
    assert len(chunks) == 1 and len(chunks[0]) == 77
    assert chunks[0][:4] == [(START_TOKEN, 1.0), (320, 1.0), (2368, 1.5), (END_TOKEN, 1.0)]
    assert all(t == END_TOKEN and w == 1.0 for t, w in chunks[0][4:])
    pad0 = tok.tokenize_with_weights("a cat", pad_token=0)[0]
    assert pad0[3] == (END_TOKEN, 1.0) and all(t == 0 for t, _ in pad0[4:])


def test_tokenize_with_weights_chunks_long_prompt(tok):
    words = " ".join(["cat"] * 80)
    chunks = tok.tokenize_with_weights(words, pad_token=END_TOKEN)
    assert [len(c) for c in chunks] == [77, 77]
    ids0 = [t for t, _ in chunks[0]]
    ids1 = [t for t, _ in chunks[1]]
    assert ids0 == [START_TOKEN] + [2368] * 75 + [END_TOKEN]  # a long segment is split at 75
    assert ids1[:7] == [START_TOKEN] + [2368] * 5 + [END_TOKEN]
    assert len(tok.tokenize_with_weights(" ".join(["cat"] * 75), pad_token=0)) == 1


def test_tokenize_with_weights_short_segment_moves_whole(tok):
    text = " ".join(["cat"] * 73) + " (a big dog:1.2)"  # 73 + 3 tokens: the group does not fit
    chunks = tok.tokenize_with_weights(text, pad_token=0)
    ids0 = [t for t, _ in chunks[0]]
    assert ids0[:75] == [START_TOKEN] + [2368] * 73 + [END_TOKEN] and set(ids0[75:]) == {0}
    assert chunks[1][1:5] == [(320, 1.2), (1205, 1.2), (1929, 1.2), (END_TOKEN, 1.0)]


def test_tokenize_with_weights_embeddings(tok):
    vec = torch.arange(6.0).reshape(2, 3)
    table = {"style": vec, "both": {"clip_l": vec[:1], "clip_g": vec}}
    warnings: list[str] = []
    chunk = tok.tokenize_with_weights(
        "a (embedding:style:1.3) cat embedding:both, dog embedding:nope sky",
        pad_token=0,
        embedding_lookup=table.get,
        embedding_key="clip_g",
        warn=warnings.append,
    )[0]
    slots = chunk[:12]
    assert slots[0] == (START_TOKEN, 1.0) and slots[1] == (320, 1.0)
    assert torch.equal(slots[2][0], vec[0]) and torch.equal(slots[3][0], vec[1]) and slots[2][1] == 1.3
    assert slots[4] == (2368, 1.0)  # " cat " is a separate word before " embedding:"
    assert torch.equal(slots[5][0], vec[0]) and torch.equal(slots[6][0], vec[1])  # clip_g entry
    assert slots[7] == (267, 1.0) and slots[8] == (1929, 1.0)  # ", dog" left over after the name
    assert slots[9] == (2390, 1.0) and slots[10] == (END_TOKEN, 1.0)  # missing embedding dropped
    assert warnings == ["embedding:nope sky does not exist, ignoring"]
    # without a lookup, "embedding:x" is plain text (ComfyUI without an embeddings folder)
    plain = [t for t, _ in tok.tokenize_with_weights("embedding:x", pad_token=0)[0]]
    assert plain[1:-1][: len(tok.encode("embedding:x"))] == tok.encode("embedding:x")
