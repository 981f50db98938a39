"""CLIP BPE tokenizer and ComfyUI prompt syntax (weights, embeddings, 77-token chunks).

The byte-pair encoding itself is the `tokenizers` library's BPE model; this module only assembles
it the way CLIP needs it and adds ComfyUI's prompt layer on top, which no library provides:

* Vocabulary: OpenAI's ``bpe_simple_vocab_16e6.txt.gz`` (package data, MIT). Ids are 256 byte
  symbols, the same 256 with ``</w>``, 48894 merges, then ``<|startoftext|>`` (49406) and
  ``<|endoftext|>`` (49407): 49408 in all.
* Text cleanup: ComfyUI runs transformers' Python ``CLIPTokenizer`` without ``ftfy`` installed, so
  the text goes through BERT's basic cleanup (control characters dropped, whitespace unified,
  spaces around CJK ideographs, NFC, lowercase, accents kept) before CLIP's regex split. We
  reproduce that with ``BertNormalizer`` + ``NFC``. (transformers' tokenizers-backed
  ``CLIPTokenizer`` differs only on CJK ideographs and control characters.)
* Prompt syntax, as ComfyUI's ``comfy/sd1_clip.py`` (version 0.3.64):
  ``(text)`` multiplies the weight by 1.1 per nesting level, ``(text:1.3)`` *sets* it to 1.3,
  ``\\(``/``\\)`` are literal parentheses, ``[text]`` is plain text (no down-weighting),
  ``embedding:name`` inserts a textual-inversion embedding (a missing one is dropped with a
  warning), and long prompts are split into chunks of 75 tokens + start/end tokens, keeping a
  weighted segment of fewer than 8 tokens whole.
"""

from __future__ import annotations

import functools
import gzip
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE

__all__ = [
    "START_TOKEN",
    "END_TOKEN",
    "VOCAB_PATH",
    "CLIPTokenizer",
    "TokenWeights",
    "EmbeddingLookup",
    "parse_weights",
    "load_clip_vocab",
    "weighted_groups",
    "chunk_groups",
]

logger = logging.getLogger(__name__)

VOCAB_PATH = Path(__file__).parent / "data" / "bpe_simple_vocab_16e6.txt.gz"
START_TOKEN = 49406
END_TOKEN = 49407
_N_MERGES = 49152 - 256 - 2  # the vocabulary file holds more merges than CLIP uses
_CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
_EMBEDDING_PREFIX = "embedding:"
_MAX_WORD_LENGTH = 8  # ComfyUI: segments shorter than this are never split across chunks

# One chunk: (token id or one embedding vector [D], weight) pairs.
TokenWeights = list[tuple["int | torch.Tensor", float]]
# embedding:name -> [n, D] tensor, or a dict of them keyed by encoder ("clip_l", "clip_g", ...)
EmbeddingLookup = Callable[[str], "torch.Tensor | Mapping[str, torch.Tensor] | None"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from the 256 byte values to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


@functools.lru_cache(maxsize=2)
def load_clip_vocab(path: Path = VOCAB_PATH) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab token -> id, merges in rank order) built from the gzipped merges file."""
    lines = gzip.open(path).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : _N_MERGES + 1]]
    symbols = list(_bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, merges


class CLIPTokenizer:
    """Text -> CLIP token ids, and ComfyUI's weighted, chunked prompt tokenization."""

    def __init__(self, vocab_path: Path = VOCAB_PATH) -> None:
        vocab, merges = load_clip_vocab(Path(vocab_path))
        tok = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                continuing_subword_prefix="",
                end_of_word_suffix="</w>",
                fuse_unk=False,
                unk_token="<|endoftext|>",
            )
        )
        tok.normalizer = normalizers.Sequence(
            [
                normalizers.BertNormalizer(
                    clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True
                ),
                normalizers.NFC(),
            ]
        )
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
        self._tok = tok
        self.vocab_size = len(vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without start/end tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def __call__(self, text: str) -> list[int]:
        """Token ids with start and end tokens, like ``CLIPTokenizer(text)["input_ids"]``."""
        return [START_TOKEN, *self.encode(text), END_TOKEN]

    def tokenize_with_weights(
        self,
        text: str,
        *,
        pad_token: int,
        embedding_lookup: EmbeddingLookup | None = None,
        embedding_key: str = "clip_l",
        max_length: int = 77,
        warn: Callable[[str], None] | None = None,
        word_ids: bool = False,
    ) -> list[TokenWeights]:
        """ComfyUI's ``SDTokenizer.tokenize_with_weights``: chunks of `max_length` (token, weight).

        Each chunk is ``[start, up to 75 tokens, end, pad...]``. Start/end/pad tokens have weight
        1.0. Embedding vectors take one slot each. `pad_token` is 49407 (the end token) for SD1's
        clip_l and 0 for OpenCLIP encoders (SD2 clip_h, SDXL clip_g). Without `embedding_lookup`,
        ``embedding:name`` is ordinary text (ComfyUI without an embeddings folder).
        `word_ids`: (token, weight, word id) triples, ComfyUI's ``return_word_ids``: a "word" is
        one piece between ``embedding:`` markers within one weight segment (ids from 1, counted
        over the whole prompt; an embedding is a word of its own); start/end/pad tokens have id 0.
        """
        groups = weighted_groups(text, self.encode, embedding_lookup=embedding_lookup,
                                 embedding_key=embedding_key, warn=warn)
        chunks = chunk_groups(groups, start=START_TOKEN, end=END_TOKEN, pad=pad_token, max_length=max_length)
        return chunks if word_ids else [[(t, w) for t, w, _ in c] for c in chunks]


def weighted_groups(text: str, encode: Callable[[str], list[int]], *,
                    embedding_lookup: EmbeddingLookup | None = None, embedding_key: str = "clip_l",
                    warn: Callable[[str], None] | None = None, weights: bool = True) -> list[TokenWeights]:
    """ComfyUI's prompt layer before chunking, shared by every tokenizer that reads its syntax
    (CLIP, T5, ...): ``(text:w)`` weights, ``embedding:name`` vectors (one slot each, the
    encoder's own by `embedding_key`), each remaining piece through `encode` (ids without
    special tokens). One group per piece; a group's tokens stay together when chunked.
    ``weights=False`` is ComfyUI's ``disable_weights``: the whole prompt is one segment of weight
    1.0 (parentheses stay text; ``\\(`` still unescapes to ``(``)."""
    warn = warn or logger.warning
    segments = parse_weights(text) if weights else [(text.replace("\\)", ")").replace("\\(", "("), 1.0)]
    groups: list[TokenWeights] = []
    for segment, weight in segments:
        for word in _split_embeddings(segment):
            if word.startswith(_EMBEDDING_PREFIX) and embedding_lookup is not None:
                name = word[len(_EMBEDDING_PREFIX) :].strip("\n")
                embed, leftover = _find_embedding(name, embedding_lookup, embedding_key)
                if embed is None:
                    warn(f"embedding:{name} does not exist, ignoring")
                else:
                    vectors = embed.reshape(-1, embed.shape[-1])  # [n, D]
                    groups.append([(vectors[i], weight) for i in range(vectors.shape[0])])
                if leftover == "":
                    continue
                word = leftover
            groups.append([(t, weight) for t in encode(word)])
    return groups


def chunk_groups(groups: list[TokenWeights], *, start: int | None, end: int, pad: int, max_length: int,
                 pad_to_max_length: bool = True, min_length: int | None = None,
                 min_padding: int | None = None) -> list[list[tuple]]:
    """ComfyUI's ``SDTokenizer`` chunking: token groups -> chunks of (token, weight, word id),
    each ``[start?, tokens..., end]``, at most `max_length` long, padded with `pad` to
    `max_length` (`pad_to_max_length`, CLIP), the last one then extended by `min_padding` pads
    and padded to at least `min_length` (T5), in ComfyUI's order (`min_padding` only without
    `pad_to_max_length`: T5's tokenizer is the one that takes it)."""
    if min_padding and pad_to_max_length:
        raise ValueError("min_padding applies to tokenizers that do not pad to max_length (T5), not to CLIP's")
    chunks = _chunk(groups, pad_token=pad, max_length=max_length, start=start, end=end,
                    pad_to_max_length=pad_to_max_length)
    last = chunks[-1]
    if min_padding:
        last.extend([(pad, 1.0, 0)] * min_padding)
    if min_length is not None and len(last) < min_length:
        last.extend([(pad, 1.0, 0)] * (min_length - len(last)))
    return chunks


def _chunk(groups: list[TokenWeights], *, pad_token: int, max_length: int, start: int | None = START_TOKEN,
           end: int = END_TOKEN, pad_to_max_length: bool = True) -> list[list[tuple]]:
    """Pack token groups into end-delimited chunks as ComfyUI does: (token, weight, word id)."""
    head = [] if start is None else [(start, 1.0, 0)]
    chunks: list[list[tuple]] = []
    batch: list[tuple] = list(head)
    chunks.append(batch)
    for word, pairs in enumerate(groups, start=1):
        group = [(t, w, word) for t, w in pairs]
        is_large = len(group) >= _MAX_WORD_LENGTH
        while group:
            if len(group) + len(batch) > max_length - 1:
                remaining = max_length - len(batch) - 1
                if is_large:  # split the segment across the chunk boundary
                    batch.extend(group[:remaining])
                    batch.append((end, 1.0, 0))
                    group = group[remaining:]
                else:  # close this chunk; the segment moves whole to the next one
                    batch.append((end, 1.0, 0))
                    if pad_to_max_length:
                        batch.extend([(pad_token, 1.0, 0)] * remaining)
                batch = list(head)
                chunks.append(batch)
            else:
                batch.extend(group)
                group = []
    batch.append((end, 1.0, 0))
    if pad_to_max_length:
        batch.extend([(pad_token, 1.0, 0)] * (max_length - len(batch)))
    return chunks


def _split_embeddings(segment: str) -> list[str]:
    """Split a segment before each `` embedding:``/``\\nembedding:`` (ComfyUI's rule)."""
    parts = re.split(f" {_EMBEDDING_PREFIX}|\n{_EMBEDDING_PREFIX}", segment)
    words = [parts[0]] + [_EMBEDDING_PREFIX + p for p in parts[1:]]
    return [w for w in words if w != ""]


def _select_embedding(
    value: torch.Tensor | Mapping[str, torch.Tensor] | None, key: str
) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    if key in value:
        return value[key]
    return next(iter(value.values()), None)


def _find_embedding(
    name: str, lookup: EmbeddingLookup, key: str
) -> tuple[torch.Tensor | None, str]:
    """(embedding or None, text left over after the name): ComfyUI's ``_try_get_embedding``."""
    parts = name.split()
    if not parts:
        return None, ""
    name, leftover = parts[0], " ".join(parts[1:])
    embed = _select_embedding(lookup(name), key)
    if embed is None:
        stripped = name.strip(",")
        if len(stripped) < len(name):
            embed = _select_embedding(lookup(stripped), key)
            return embed, f"{name[len(stripped):]} {leftover}"
    return embed, leftover


def _parse_parentheses(text: str) -> list[str]:
    """Split into top-level ``(...)`` groups and the text between them (unbalanced kept as is)."""
    out: list[str] = []
    current = ""
    depth = 0
    for ch in text:
        if ch == "(":
            if depth == 0:
                if current:
                    out.append(current)
                current = "("
            else:
                current += ch
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                out.append(current + ")")
                current = ""
            else:
                current += ch
        else:
            current += ch
    if current:
        out.append(current)
    return out


def _token_weights(text: str, weight: float) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for part in _parse_parentheses(text):
        if len(part) >= 2 and part[0] == "(" and part[-1] == ")":
            inner = part[1:-1]
            w = weight * 1.1
            colon = inner.rfind(":")
            if colon > 0:
                try:
                    w = float(inner[colon + 1 :])
                    inner = inner[:colon]
                except ValueError:
                    pass
            out += _token_weights(inner, w)
        else:
            out.append((part, weight))
    return out


def parse_weights(text: str) -> list[tuple[str, float]]:
    """ComfyUI prompt weights: [(segment, weight)], with ``\\(`` ``\\)`` unescaped in segments."""
    escaped = text.replace("\\)", "\0\1").replace("\\(", "\0\2")
    return [
        (seg.replace("\0\1", ")").replace("\0\2", "("), w)
        for seg, w in _token_weights(escaped, 1.0)
    ]
