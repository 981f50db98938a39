"""Tokenizers of the decoder-LLM text encoders: the shipped Qwen2.5 BPE against transformers and an
independent byte-level BPE; Z-Image's template; Gemma's SentencePiece model from the file."""

from __future__ import annotations

import functools
import json
import unicodedata

import pytest
import regex
import sentencepiece
import torch
from safetensors.torch import save_file
from transformers import Qwen2Tokenizer

from mixgraph.nodes.encoders.encoder_set import get_tokenizer
from mixgraph.nodes.encoders.llm_tokenizers import (QWEN_DIR, QWEN_PAD, GemmaTokenizer, find_spiece_key,
                                                    gemma_tokenizer_name, register_gemma_tokenizer)
from mixgraph.nodes.weights.safetensors_io import WeightSource
from tests.fixtures.tiny_llm import spiece_model_bytes, spiece_tensor

TEXTS = [
    "a photo of a cat",
    "A Red  fox, 1234 jumps!\n\nOver the lazy dog's tail... (really) \t end",
    "<|im_start|>user\nDraw Ünïcödé 東京タワー 🙂<|im_end|>\n<|im_start|>assistant\n",
    "café e\u0301 — “quotes” <tool_call>x</tool_call><|endoftext|>",
    "",
]


@functools.cache
def _slow_bpe():
    """GPT-2-style byte-level BPE written from the paper's description (Sennrich et al. 2016,
    Radford et al. 2019), independent of the `tokenizers` library: the reference for ids."""
    vocab = json.loads((QWEN_DIR / "vocab.json").read_text())
    merges = [tuple(line.split()) for line in (QWEN_DIR / "merges.txt").read_text().split("\n")[1:] if line]
    ranks = {m: i for i, m in enumerate(merges)}
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    byte_map, n = {}, 0
    for b in range(256):
        if b in printable:
            byte_map[b] = chr(b)
        else:
            byte_map[b] = chr(256 + n)
            n += 1
    added = {v["content"]: int(k) for k, v in json.loads((QWEN_DIR / "tokenizer_config.json").read_text())
             ["added_tokens_decoder"].items()}
    split = regex.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

    def bpe(word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts

    def encode(text: str) -> list[int]:
        ids = []
        special = regex.compile("(" + "|".join(regex.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        for piece in special.split(text):
            if piece in added:
                ids.append(added[piece])
                continue
            for word in split.findall(unicodedata.normalize("NFC", piece)):
                ids += [vocab[p] for p in bpe("".join(byte_map[b] for b in word.encode("utf-8")))]
        return ids

    return encode


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_ids_match_transformers_and_a_reference_bpe(text):
    ours = get_tokenizer("qwen2.5")
    ref = Qwen2Tokenizer.from_pretrained(str(QWEN_DIR))
    ids = ours.encode(text)
    assert ids == ref(text, add_special_tokens=False)["input_ids"]
    assert ids == _slow_bpe()(text)
    assert ours.decode(ids) == unicodedata.normalize("NFC", text)


def test_qwen_special_tokens_and_chat_template_ids():
    tok = get_tokenizer("qwen2.5")
    assert tok.encode("<|endoftext|><|im_start|><|im_end|>") == [151643, 151644, 151645] and QWEN_PAD == 151643
    assert tok.encode("<|im_start|>user\n") == [151644, 872, 198]


def test_qwen_weights_and_z_image_template():
    plain = get_tokenizer("qwen2.5").tokenize_with_weights("a (red:1.3) fox", pad_token=QWEN_PAD, word_ids=True)
    assert len(plain) == 1 and plain[0][0][0] != QWEN_PAD  # no start token, no padding
    assert {round(w, 3) for _, w, _ in plain[0]} == {1.0, 1.3}
    z = get_tokenizer("z_image").tokenize_with_weights("a (red:1.3) fox", pad_token=QWEN_PAD)
    tok = get_tokenizer("qwen2.5")
    assert [t for t, _ in z[0]] == tok.encode("<|im_start|>user\na (red:1.3) fox<|im_end|>\n<|im_start|>assistant\n")
    assert all(w == 1.0 for _, w in z[0])  # ComfyUI's ZImageTokenizer disables weights
    assert z[0][:3] == [(151644, 1.0), (872, 1.0), (198, 1.0)]
    assert get_tokenizer("qwen2.5").tokenize_with_weights("", pad_token=QWEN_PAD) == [[(QWEN_PAD, 1.0)]]


def test_qwen_embeddings_take_one_slot_per_vector():
    vec = torch.randn(2, 32)
    out = get_tokenizer("qwen2.5").tokenize_with_weights(
        "a cat embedding:thing", pad_token=QWEN_PAD, embedding_lookup=lambda n: vec if n == "thing" else None)
    assert [torch.is_tensor(t) for t, _ in out[0]][-2:] == [True, True]


def test_gemma_tokenizer_from_spiece_bytes():
    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece_model_bytes())
    tok = GemmaTokenizer(spiece_model_bytes())
    chunks = tok.tokenize_with_weights("a photo of a (red cat:1.2)<end_of_turn>", pad_token=0, word_ids=True)
    assert len(chunks) == 1
    ids = [t for t, _, _ in chunks[0]]
    # ComfyUI: <bos>, then each weight segment tokenized on its own; <end_of_turn> is id 107
    assert ids == [2] + sp.encode("a photo of a ") + sp.encode("red cat") + [107]
    assert [w for _, w, _ in chunks[0]] == [1.0] + [1.0] * len(sp.encode("a photo of a ")) + \
        [1.2] * len(sp.encode("red cat")) + [1.0]
    assert tok.encode("cat<end_of_turn>sky") == sp.encode("cat") + [107] + sp.encode("sky")
    assert chunks[0][0] == (2, 1.0, 0)
    assert tok.tokenize_with_weights("", pad_token=0) == [[(2, 1.0)]]


def test_gemma_tokenizer_is_named_by_the_files_model(tmp_path):
    name = register_gemma_tokenizer(spiece_model_bytes())
    assert name.startswith("gemma:") and register_gemma_tokenizer(spiece_model_bytes()) == name
    other = register_gemma_tokenizer(spiece_model_bytes(seed=1, vocab_size=100))
    assert other != name
    path = tmp_path / "te.safetensors"
    save_file({"text_encoders.gemma2_2b.spiece_model": spiece_tensor(),
               "text_encoders.gemma2_2b.transformer.model.norm.weight": torch.ones(4)}, str(path))
    src = WeightSource.from_file(path, prefix="text_encoders.gemma2_2b.transformer.")
    assert gemma_tokenizer_name(src) == name
    assert get_tokenizer(name).tokenize_with_weights("a cat", pad_token=0)[0][0] == (2, 1.0)
    mem = WeightSource.from_state_dict({"spiece_model": spiece_tensor(), "model.norm.weight": torch.ones(4)})
    assert gemma_tokenizer_name(mem) == name
    with pytest.raises(ValueError, match="spiece_model"):
        gemma_tokenizer_name(WeightSource.from_state_dict({"model.norm.weight": torch.ones(4)}))
    assert find_spiece_key({"a.spiece_model"}, "a.b.c.") == "a.spiece_model"
