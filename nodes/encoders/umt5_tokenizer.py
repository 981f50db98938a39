"""The umT5-XXL tokenizer (Wan), read from the SentencePiece model its text-encoder file carries.

ComfyUI facts (``comfy/text_encoders/wan.py`` ``UMT5XXlTokenizer``, ``spiece_tokenizer.py``,
``sd1_clip.SDTokenizer``; ``comfy/sd.py`` puts the file's ``spiece_model`` tensor into the
tokenizer data):

* The pieces are the SentencePiece model stored in the file as the uint8 tensor ``spiece_model``
  (Google's umT5 vocabulary, ``<pad>`` 0, ``</s>`` 1; the encoder's token table has 256,384
  rows). Nothing is shipped: without the tensor the file cannot tokenize, and loading it says so.
* No start token; each prompt piece is encoded on its own with SentencePiece's end token, which
  is then dropped (``tokens_start=0``, ``[0:-1]``); the end token (the model's ``eos_id``, the id
  ComfyUI reads from encoding the empty string) closes the one chunk (max_length 99999999: a
  prompt is never split), and pad tokens 0 fill it to ``min_length`` 512 (the rule's
  ``min_length`` when set). ``(word:1.2)`` weights and ``embedding:name`` as everywhere
  (``tokenizer.weighted_groups``; embedding key "umt5xxl").

**Choice** (as Gemma's, ``llm_tokenizers``): a tokenizer is registered per SentencePiece model,
named ``"umt5:" + sha256(model bytes)[:16]``, when the encoder's file is recognised
(``umt5_tokenizer_name(source)``); the slot names "umt5", the entry the fingerprinted name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sentencepiece

from mixgraph.nodes.encoders.llm_tokenizers import register_spiece_tokenizer, spiece_model_bytes
from mixgraph.nodes.encoders.tokenizer import EmbeddingLookup, TokenWeights, chunk_groups, weighted_groups
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["UMT5_MIN_LENGTH", "UMT5_PAD", "UMT5Tokenizer", "register_umt5_tokenizer", "umt5_tokenizer_name"]

logger = logging.getLogger(__name__)

UMT5_MIN_LENGTH = 512  # ComfyUI's UMT5XXlTokenizer min_length
UMT5_PAD = 0
MAX_LENGTH = 99999999  # ComfyUI: one chunk, never split


class UMT5Tokenizer:
    """Text -> ids of a SentencePiece model given as its serialized bytes, with ComfyUI's prompt
    layer for Wan (module docstring)."""

    def __init__(self, model_bytes: bytes) -> None:
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        self.end_token = self._sp.eos_id()
        if self.end_token < 0:
            raise ValueError("the umT5 SentencePiece model has no end-of-sequence token (ComfyUI's tokenizer "
                             "closes every prompt with it)")
        self.vocab_size = self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without the end token."""
        return self._sp.encode(text)

    def __call__(self, text: str) -> list[int]:
        """Ids with the end token (ComfyUI's ``SPieceTokenizer``, ``add_eos=True``)."""
        return [*self.encode(text), self.end_token]

    def tokenize_with_weights(self, text: str, *, pad_token: int = UMT5_PAD,
                              embedding_lookup: EmbeddingLookup | None = None, embedding_key: str = "umt5xxl",
                              warn: Callable[[str], None] | None = None, word_ids: bool = False,
                              min_length: int | None = None, min_padding: int | None = None) -> list[list[tuple]]:
        """One chunk ``[tokens..., end, pad...]`` of at least `min_length` (None: 512) entries
        (token, weight) or, with `word_ids`, (token, weight, word id); `min_padding` pad tokens
        follow the end token first (ComfyUI's ``min_padding`` option)."""
        groups: list[TokenWeights] = weighted_groups(text, self.encode, embedding_lookup=embedding_lookup,
                                                     embedding_key=embedding_key, warn=warn or logger.warning)
        chunks = chunk_groups(groups, start=None, end=self.end_token, pad=pad_token, max_length=MAX_LENGTH,
                              pad_to_max_length=False,
                              min_length=UMT5_MIN_LENGTH if min_length is None else min_length,
                              min_padding=min_padding)
        return chunks if word_ids else [[(t, w) for t, w, _ in c] for c in chunks]


def register_umt5_tokenizer(model_bytes: bytes) -> str:
    """Register the SentencePiece model `model_bytes` as a umT5 tokenizer; returns its name
    (``umt5:<fingerprint>``)."""
    return register_spiece_tokenizer("umt5", UMT5Tokenizer, model_bytes)


def umt5_tokenizer_name(source: WeightSource, slot_tokenizer: str = "umt5") -> str:
    """The tokenizer name of the umT5 encoder in `source` (``encoder_arch.EncoderArch.tokenizer``),
    registered on the way."""
    return register_umt5_tokenizer(spiece_model_bytes(source, "umT5", "ComfyUI's umt5_xxl files"))
