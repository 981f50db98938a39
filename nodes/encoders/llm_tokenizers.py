"""Tokenizers of the decoder-LLM text encoders, registered by name with ``encoder_set``:

* "qwen2.5": the Qwen2.5 byte-level BPE vocabulary (151,643 tokens + the special tokens of
  ``tokenizer_config.json``: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>``
  151645, ...), read by Qwen3 (ComfyUI's ``Qwen3Tokenizer``). Package data under
  ``data/qwen2.5/`` (Alibaba Cloud, Apache-2.0; see its NOTICE.md). The BPE itself is the
  `tokenizers` library's, assembled as transformers' ``Qwen2TokenizerFast`` does (NFC, Qwen's
  pre-split regex, byte-level symbols); the prompt layer (weights, embeddings) is ComfyUI's.
* "z_image": ComfyUI's ``ZImageTokenizer``: the same vocabulary, the prompt put in Qwen's chat
  template (``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``) and weights
  *disabled* (``(word:1.3)`` stays text, as in ComfyUI). The template is the set's, so it has
  its own name; Z-Image's text-encoder slot names it.
* Gemma (Lumina 2): a SentencePiece model that is not shipped: every Gemma text-encoder file
  carries its own as the uint8 tensor ``spiece_model``. **Choice:** the tokenizer is tied to the
  weights by a name per model fingerprint, ``"gemma:" + sha256(model bytes)[:16]``, registered
  when the file is recognised (``gemma_tokenizer_name(source)``) and written into the entry's
  ``tokenizer`` field; an entry still names its tokenizer, two files with the same model share
  one instance, and nothing needs the file again to tokenize. A handle made in a process that
  never recognised its file (none does today: handles are made by the loaders) would get
  "no tokenizer named gemma:..." from ``get_tokenizer``.

Prompt layer (ComfyUI's ``SDTokenizer`` with ``max_length`` unbounded, no end token, no padding
to a length, ``min_length=1``): one chunk, ``[start?] + tokens``; Gemma starts with ``<bos>``
(2), Qwen has no start token; an empty prompt is one pad token. Each weight segment (and each
piece between ``embedding:`` markers) is tokenized on its own, as in ComfyUI
(``tokenizer.weighted_groups``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import sentencepiece
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from mixgraph.nodes.encoders.encoder_set import register_tokenizer
from mixgraph.nodes.encoders.tokenizer import EmbeddingLookup, TokenWeights, weighted_groups
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file, read_tensors

__all__ = ["QWEN_DIR", "QWEN_PAD", "Z_IMAGE_TEMPLATE", "QwenTokenizer", "GemmaTokenizer", "gemma_tokenizer_name",
           "find_spiece_key", "register_gemma_tokenizer", "z_image_tokenizer"]

QWEN_DIR = Path(__file__).parent / "data" / "qwen2.5"
QWEN_PAD = 151643  # <|endoftext|>: Qwen3's pad token in ComfyUI
Z_IMAGE_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# transformers' Qwen2 PRETOKENIZE_REGEX (GPT-4's split with single digits)
_QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def _chunk_one(groups: list[TokenWeights], start: int | None, pad: int, word_ids: bool,
               min_length: int | None) -> list[list[tuple]]:
    """ComfyUI's packing with an unbounded max_length and no end token: one chunk, padded to
    `min_length` (ComfyUI's default for these tokenizers: 1)."""
    chunk: list[tuple] = [] if start is None else [(start, 1.0, 0)]
    for word, group in enumerate(groups, start=1):
        chunk.extend((t, w, word) for t, w in group)
    chunk.extend([(pad, 1.0, 0)] * max(0, (1 if min_length is None else min_length) - len(chunk)))
    return [chunk if word_ids else [(t, w) for t, w, _ in chunk]]


class QwenTokenizer:
    """The Qwen2.5 BPE tokenizer; `template` (with one ``{}``) wraps the prompt, `weights=False`
    turns off ComfyUI's weight syntax (Z-Image)."""

    start_token = None

    def __init__(self, template: str | None = None, weights: bool = True, folder: Path = QWEN_DIR) -> None:
        tok = Tokenizer(BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                      byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        added = json.loads((folder / "tokenizer_config.json").read_text())["added_tokens_decoder"]
        for id_, spec in sorted(added.items(), key=lambda kv: int(kv[0])):
            token = AddedToken(spec["content"], single_word=spec["single_word"], lstrip=spec["lstrip"],
                               rstrip=spec["rstrip"], normalized=spec["normalized"], special=spec["special"])
            tok.add_special_tokens([token]) if spec["special"] else tok.add_tokens([token])
            if tok.token_to_id(spec["content"]) != int(id_):
                raise ValueError(f"Qwen tokenizer data: {spec['content']!r} got id "
                                 f"{tok.token_to_id(spec['content'])}, the config says {id_}")
        self._tok = tok
        self.template = template
        self.weights = weights
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special tokens such as ``<|im_start|>`` recognised); no start/end."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def tokenize_with_weights(self, text: str, *, pad_token: int = QWEN_PAD,
                              embedding_lookup: EmbeddingLookup | None = None, embedding_key: str = "qwen3_4b",
                              warn: Callable[[str], None] | None = None, word_ids: bool = False,
                              min_length: int | None = None) -> list[list[tuple]]:
        """ComfyUI's ``tokenize_with_weights`` for this tokenizer: one chunk of (token, weight[, word id])."""
        if self.template is not None:
            text = self.template.format(text)
        groups = weighted_groups(text, self.encode, embedding_lookup=embedding_lookup,
                                 embedding_key=embedding_key, warn=warn, weights=self.weights)
        return _chunk_one(groups, None, pad_token, word_ids, min_length)


class GemmaTokenizer:
    """A SentencePiece model given as its serialized bytes (the ``spiece_model`` tensor);
    prompts start with its ``<bos>``. ``<end_of_turn>`` is id 107 wherever it appears (ComfyUI's
    ``special_tokens`` for Gemma 2: the text is split around it and the other parts encoded on
    their own). ComfyUI then also drops the first id of such a piece (its ``tokens_start=1``
    meant for the ``<bos>`` that path no longer adds); we keep it."""

    special_tokens = {"<end_of_turn>": 107}

    def __init__(self, model_bytes: bytes) -> None:
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        self.start_token = self._sp.bos_id()
        if self.start_token < 0:
            raise ValueError("the Gemma SentencePiece model has no <bos> token")
        self.vocab_size = self._sp.get_piece_size()
        self._special = re.compile("(" + "|".join(re.escape(t) for t in self.special_tokens) + ")")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without ``<bos>`` (ComfyUI's ``tokens_start=1`` drops it per piece)."""
        ids: list[int] = []
        for part in self._special.split(text):
            if part in self.special_tokens:
                ids.append(self.special_tokens[part])
            elif part:
                ids += self._sp.encode(part)
        return ids

    def tokenize_with_weights(self, text: str, *, pad_token: int = 0,
                              embedding_lookup: EmbeddingLookup | None = None, embedding_key: str = "gemma2_2b",
                              warn: Callable[[str], None] | None = None, word_ids: bool = False,
                              min_length: int | None = None) -> list[list[tuple]]:
        """ComfyUI's ``Gemma2BTokenizer.tokenize_with_weights``: ``[<bos>] + tokens``, weights on."""
        groups = weighted_groups(text, self.encode, embedding_lookup=embedding_lookup,
                                 embedding_key=embedding_key, warn=warn)
        return _chunk_one(groups, self.start_token, pad_token, word_ids, min_length)


# --------------------------------------------------------------------------------------------
# Gemma: one registered name per SentencePiece model


_SPIECE_FACTORIES: dict[str, Callable[[], object]] = {}


def register_spiece_tokenizer(kind: str, cls: Callable[[bytes], object], model_bytes: bytes) -> str:
    """Register ``cls(model_bytes)`` (a tokenizer over the SentencePiece model a text-encoder file
    carries) under the name ``<kind>:<fingerprint>`` and return that name; the same model registers
    once, under one factory."""
    name = f"{kind}:" + hashlib.sha256(model_bytes).hexdigest()[:16]
    if name not in _SPIECE_FACTORIES:
        _SPIECE_FACTORIES[name] = functools.partial(cls, bytes(model_bytes))
        register_tokenizer(name, _SPIECE_FACTORIES[name])
    return name


def register_gemma_tokenizer(model_bytes: bytes) -> str:
    """Register the SentencePiece model `model_bytes` as a Gemma tokenizer; returns its name
    (``gemma:<fingerprint>``)."""
    return register_spiece_tokenizer("gemma", GemmaTokenizer, model_bytes)


def find_spiece_key(keys, prefix: str) -> str | None:
    """Where a file keeps its SentencePiece model: ``spiece_model`` under `prefix` or under any
    shorter dotted prefix of it (a checkpoint may keep it beside the encoder's ``transformer.``)."""
    parts = prefix.split(".")[:-1] if prefix else []
    for n in range(len(parts), -1, -1):
        key = "".join(p + "." for p in parts[:n]) + "spiece_model"
        if key in keys:
            return key
    return None


def spiece_model_bytes(source: WeightSource, what: str, files: str) -> bytes:
    """The serialized SentencePiece model stored beside the encoder in `source` (``spiece_model``
    under its prefix or a shorter one); ValueError naming the file when there is none (`what`: the
    encoder, `files`: the files that carry it, for the message)."""
    if source.path is None:
        tensors = source.tensors or {}
        key = find_spiece_key(tensors, source.prefix)
        data = None if key is None else tensors[key]
    else:
        key = find_spiece_key(inspect_file(source.path), source.prefix)
        data = None if key is None else read_tensors(source.path, [key], strip_prefix=False)[key]
    if data is None:
        raise ValueError(f"{source.name}: a {what} text encoder without its tokenizer (no 'spiece_model' tensor "
                         f"under {source.prefix!r}); {files} carry it")
    return data.to(torch.uint8).numpy().tobytes()


def gemma_tokenizer_name(source: WeightSource) -> str:
    """The tokenizer name of the Gemma encoder in `source`, registered on the way; ValueError when
    the file has no ``spiece_model``."""
    return register_gemma_tokenizer(spiece_model_bytes(source, "Gemma", "ComfyUI's gemma_2_2b files"))


def z_image_tokenizer() -> QwenTokenizer:
    """ComfyUI's ``ZImageTokenizer``: Qwen's chat template around the prompt, weights off."""
    return QwenTokenizer(template=Z_IMAGE_TEMPLATE, weights=False)


register_tokenizer("qwen2.5", QwenTokenizer)
register_tokenizer("z_image", z_image_tokenizer)
