"""The T5 v1.1 tokenizer with ComfyUI's prompt syntax (tokenizer name "t5").

The pieces are the `tokenizers` library's, read from Google's ``tokenizer.json`` (package data,
``data/t5_v1_1/``, Apache-2.0): SentencePiece Unigram, 32,100 ids, ``<pad>`` 0, ``</s>`` 1.
ComfyUI's layer on top (``comfy/text_encoders/sd3_clip.py`` / ``flux.py`` / ``pixart_t5.py``,
its ``SDTokenizer`` with ``has_start_token=False, pad_with_end=False``) is the CLIP tokenizer's
prompt syntax (``tokenizer.weighted_groups``: ``(word:1.2)``, ``embedding:name``) and chunking
(``tokenizer.chunk_groups``) with T5's settings: no start token, end token 1, pad 0, one chunk
of any length (ComfyUI's max_length 99999999), the prompt padded to at least ``min_length``
tokens: 77 by default (SD3), 256 for Flux, 1 (no padding) for Chroma / PixArt, per set through
the encoder's rule (``OutputRule.min_length``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from mixgraph.nodes.encoders.t5 import T5_END, T5_PAD
from mixgraph.nodes.encoders.tokenizer import EmbeddingLookup, TokenWeights, chunk_groups, weighted_groups

__all__ = ["T5_TOKENIZER_PATH", "T5Tokenizer", "DEFAULT_MIN_LENGTH", "MAX_LENGTH"]

logger = logging.getLogger(__name__)

T5_TOKENIZER_PATH = Path(__file__).parent / "data" / "t5_v1_1" / "tokenizer.json"
DEFAULT_MIN_LENGTH = 77  # ComfyUI's sd3_clip.T5XXLTokenizer default
MAX_LENGTH = 99999999  # ComfyUI: a T5 prompt is never split into chunks


class T5Tokenizer:
    """Text -> T5 v1.1 ids, and ComfyUI's weighted prompt tokenization."""

    def __init__(self, path: Path = T5_TOKENIZER_PATH) -> None:
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without the end token."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def __call__(self, text: str) -> list[int]:
        """Ids with the end token, like ``T5TokenizerFast(text)["input_ids"]``."""
        return [*self.encode(text), T5_END]

    def tokenize_with_weights(
        self,
        text: str,
        *,
        pad_token: int = T5_PAD,
        embedding_lookup: EmbeddingLookup | None = None,
        embedding_key: str = "t5xxl",
        warn: Callable[[str], None] | None = None,
        word_ids: bool = False,
        min_length: int | None = None,
        min_padding: int | None = None,
    ) -> list[TokenWeights]:
        """One chunk ``[tokens..., end, pad...]`` of at least `min_length` (None: 77) entries
        (token, weight) or, with `word_ids`, (token, weight, word id) as ComfyUI's
        ``return_word_ids``; `min_padding` pad tokens follow the end token first (ComfyUI's
        T5TokenizerOptions)."""
        groups = weighted_groups(text, self.encode, embedding_lookup=embedding_lookup,
                                 embedding_key=embedding_key, warn=warn or logger.warning)
        chunks = chunk_groups(groups, start=None, end=T5_END, pad=pad_token, max_length=MAX_LENGTH,
                              pad_to_max_length=False,
                              min_length=DEFAULT_MIN_LENGTH if min_length is None else min_length,
                              min_padding=min_padding)
        return chunks if word_ids else [[(t, w) for t, w, _ in c] for c in chunks]
