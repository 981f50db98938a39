"""Prompt -> CONDITIONING through a set of CLIP-style text encoders, with ComfyUI's semantics.

ComfyUI facts reproduced here (``comfy/sd1_clip.py``, ``sd2_clip.py``, ``sdxl_clip.py``):

* Per-encoder settings (``encoder_set.OutputRule``; the SD family's in ``families/sd/encoders.py``): pad
  token, default layer, whether ``final_layer_norm`` is applied to an intermediate layer, whether
  the pooled output is projected. SD1 clip_l: pad 49407, last layer, normed hidden, unprojected
  pooled. SD2 clip_h: pad 0, penultimate, normed hidden. SDXL clip_l and clip_g: pad 0 for
  clip_g / 49407 for clip_l, penultimate, *raw* hidden. Refiner: clip_g only.
* CLIPSetLastLayer's ``stop_at_clip_layer`` n replaces the default layer of every encoder; an n
  with ``|n| > layers`` means the normed last layer.
* Weights: every chunk and the empty prompt ``[start, end, pad...]`` go through the encoder in
  one batch; a token of weight w != 1 becomes ``(z - z_empty) * w + z_empty`` (z_empty taken at
  the same position). This differs from A1111's mean renormalisation.
* Chunks are concatenated along tokens: cross_attn ``[1, 77 * chunks, D]``; the pooled output is
  the first chunk's. The encoders of a set join along features in set order (SDXL:
  ``cat(clip_l, clip_g)``, 768 + 1280 = 2048; all cut to the shortest token count); the pooled
  vector is that of the encoder whose rule says ``pooled`` (SDXL: clip_g, projected, 1280).
* Textual-inversion vectors take one slot each; a vector whose width differs from the encoder's is
  dropped with a warning, and the chunk is refilled with pad tokens at the end (the weights of the
  later slots stay by position, as in ComfyUI).

Precision: text tensors are float32 at this boundary (token ids int64; Cond tensors float32).
The encoders may be wrapped by ``nodes.weights.cast.apply_precision``; ComfyUI itself stores the
text encoder in fp16 but computes it in float32 (``manual_cast`` with float32 inputs), which is
the policy storage=f16, compute=f32.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.encoders.clip import CLIPTextModel
from mixgraph.nodes.encoders.encoder_set import EncodedText, EncoderEntry, Join, OutputRule, get_tokenizer
from mixgraph.nodes.encoders.tokenizer import END_TOKEN, START_TOKEN, EmbeddingLookup, TokenWeights
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = [
    "TextEncoder",
    "check_set",
    "tokenize",
    "encode_prompt",
    "encode_tokens",
]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class TextEncoder:
    """One encoder ready to run: an entry's name, output rule and tokenizer name with its
    precision-applied module."""

    name: str
    rule: OutputRule
    model: nn.Module
    tokenizer: str = "clip"


def check_set(names: Sequence[str], rules: Sequence[OutputRule], join: Join | None = None) -> None:
    """A set of encoders runs when it has one, its names are unique and, unless the set has a
    join of its own (``encoder_set.register_join``), at most one of them gives the pooled vector."""
    if not names:
        raise ValueError("text encoding needs at least one text encoder; this CLIP has none")
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise ValueError(f"a CLIP names each text encoder once; {', '.join(twice)} appears twice")
    pooled = [n for n, r in zip(names, rules) if r.pooled]
    if len(pooled) > 1 and join is None:
        raise NotImplementedError(f"a CLIP whose encoders {', '.join(pooled)} each give the pooled vector: "
                                  f"joining pooled vectors is not supported yet")


def _check_set(encoders: Sequence[TextEncoder], join: Join | None = None) -> None:
    check_set([e.name for e in encoders], [e.rule for e in encoders], join)


def tokenize(encoders: Sequence[TextEncoder | EncoderEntry], text: str, *,
             embedding_lookup: EmbeddingLookup | None = None, warn: Callable[[str], None] | None = None,
             texts: Mapping[str, str] | None = None, word_ids: bool = False) -> dict[str, list[TokenWeights]]:
    """encoder name -> chunks of (token, weight[, word id]) for `text` (or ``texts[name]``),
    each encoder with its own tokenizer and pad token (entries or loaded encoders alike)."""
    unknown = sorted(set(texts or {}) - {e.name for e in encoders})
    if unknown:
        raise ValueError(f"this CLIP has no text encoder {', '.join(unknown)}; it has "
                         f"{', '.join(e.name for e in encoders) or 'none'}")
    return {
        e.name: get_tokenizer(e.tokenizer).tokenize_with_weights(
            (texts or {}).get(e.name, text), pad_token=e.rule.pad_token, embedding_lookup=embedding_lookup,
            embedding_key=e.name, warn=warn, word_ids=word_ids, **_length_option(e.rule),
        )
        for e in encoders
    }


def _length_option(rule: OutputRule) -> dict[str, int]:
    """The rule's ``min_length`` / ``min_padding`` for its tokenizer, each given only where set
    (CLIP's has neither; only T5's tokenizer takes ``min_padding``)."""
    return {k: v for k, v in (("min_length", rule.min_length), ("min_padding", rule.min_padding))
            if v is not None}


def encode_prompt(
    encoders: Sequence[TextEncoder],
    text: str,
    *,
    layer_idx: int | None = None,
    embedding_lookup: EmbeddingLookup | None = None,
    warn: Callable[[str], None] | None = None,
    texts: Mapping[str, str] | None = None,
    join: Join | None = None,
) -> tuple[Cond, ...]:
    """CLIPTextEncode: one Cond with cross_attn [1, 77*chunks, D] and pooled [1, P].

    `layer_idx`: CLIPSetLastLayer's stop_at_clip_layer (-1 last, -2 penultimate), or None for the
    model's default. `embedding_lookup(name)` resolves ``embedding:name``. `warn` receives
    user-facing warnings (missing or mismatched embeddings); default: this module's logger.
    `texts`: a prompt per encoder name ("clip_l", "clip_g") replacing `text` for that encoder
    (CLIPTextEncodeSDXL's text_l / text_g); when the encoders then get different chunk counts,
    the shorter ones are padded with chunks of the empty prompt, as ComfyUI does.
    `join`: the set's join (``encoder_set.get_join``), None: along features.
    """
    warn = warn or logger.warning
    _check_set(encoders, join)
    tokenized = tokenize(encoders, text, embedding_lookup=embedding_lookup, warn=warn, texts=texts)
    return encode_tokens(encoders, tokenized, layer_idx=layer_idx, warn=warn, join=join)


def encode_tokens(
    encoders: Sequence[TextEncoder],
    tokenized: Mapping[str, list[TokenWeights]],
    *,
    layer_idx: int | None = None,
    warn: Callable[[str], None] | None = None,
    join: Join | None = None,
) -> tuple[Cond, ...]:
    """ComfyUI's ``encode_from_tokens``: the chunks of (token, weight) per encoder name (what
    ``tokenize_with_weights`` gives; word ids, if present, are dropped) -> one Cond.

    A CLIP encoder runs here (``_encode_chunks``); any other module runs its own
    ``encode_chunks(chunks, rule, layer_idx, warn) -> encoder_set.EncodedText``. `join` makes
    the cond from the outputs by encoder name (``encoder_set.register_join``): each encoder
    encodes its own chunks (no padding to a common count), one given no chunks ComfyUI's
    zero-length empty prompt (``[start, end]`` for CLIP, the module's ``empty_chunk()``
    otherwise), flagged ``EncodedText.empty``; None: shorter chunk lists are padded with the empty prompt, the hidden
    states join along features, cut to the shortest, and the pooled vector is that of the
    encoder whose rule says ``pooled``."""
    warn = warn or logger.warning
    _check_set(encoders, join)
    missing = [e.name for e in encoders if e.name not in tokenized]
    if missing:
        raise ValueError(f"text encoding: no tokens for {', '.join(missing)}")
    chunked = [[[(t[0], t[1]) for t in chunk] for chunk in tokenized[e.name]] for e in encoders]
    if join is None:
        n_chunks = max(len(c) for c in chunked)
        for e, chunks in zip(encoders, chunked):
            if len(chunks) < n_chunks:
                empty = get_tokenizer(e.tokenizer).tokenize_with_weights("", pad_token=e.rule.pad_token)
                while len(chunks) < n_chunks:
                    chunks.extend(empty)
    outputs: dict[str, EncodedText] = {}
    for e, chunks in zip(encoders, chunked):
        encode_chunks = getattr(e.model, "encode_chunks", None)
        empty = not chunks  # (a set with a join) no tokens: ComfyUI encodes its zero-length empty prompt
        if empty:
            chunks = [e.model.empty_chunk() if encode_chunks is not None else [(START_TOKEN, 1.0), (END_TOKEN, 1.0)]]
        if encode_chunks is not None:
            out = encode_chunks(chunks, e.rule, layer_idx, warn)
        else:
            out = EncodedText(*_encode_chunks(e.model, chunks, e.rule, layer_idx, warn))
        outputs[e.name] = dataclasses.replace(out, empty=True) if empty else out
    if join is not None:
        return (join(outputs),)
    outs = [outputs[e.name].hidden for e in encoders]
    pooled = next((outputs[e.name].pooled for e in encoders if e.rule.pooled), None)
    cut = min(z.shape[1] for z in outs)
    cross = torch.cat([z[:, :cut] for z in outs], dim=-1)  # [1, T, D_1 + D_2 + ...]
    return (Cond(cross_attn=cross.float(), pooled=None if pooled is None else pooled.float()),)


def _resolve_layer(requested: int | None, rule: OutputRule, n_layers: int) -> int | None:
    layer = rule.default_layer if requested is None else requested
    if layer is None or abs(layer) > n_layers:
        return None
    return layer


def _encode_chunks(
    model: CLIPTextModel,
    chunks: list[TokenWeights],
    rule: OutputRule,
    layer_idx: int | None,
    warn: Callable[[str], None],
) -> tuple[Tensor, Tensor]:
    """([1, 77*chunks, D], [1, P]) for one encoder, weights applied against the empty prompt."""
    width = model.config.width
    has_weights = any(w != 1.0 for chunk in chunks for _, w in chunk)
    length = max(len(c) for c in chunks)
    rows: list[list[int | Tensor]] = [_fit_row([t for t, _ in c], width, rule.pad_token, warn) for c in chunks]
    if has_weights:
        rows.append([START_TOKEN, END_TOKEN] + [rule.pad_token] * (length - 2))  # the empty prompt

    placeholder = 0  # any id except the end token; its embedding is overwritten
    tokens = torch.tensor([[t if isinstance(t, int) else placeholder for t in r] for r in rows])  # [N, T]
    layer = _resolve_layer(layer_idx, rule, model.config.layers)
    with torch.no_grad():
        embeds = None
        vectors = [(i, j, t) for i, r in enumerate(rows) for j, t in enumerate(r) if isinstance(t, Tensor)]
        if vectors:
            embeds = model.token_embeddings(tokens).clone()  # [N, T, D]
            for i, j, vec in vectors:
                embeds[i, j] = vec.to(embeds.dtype)
        hidden, pooled = model(
            tokens, layer, norm_hidden=rule.norm_hidden, embeds=embeds, project_pooled=rule.project_pooled
        )
        hidden, pooled = hidden.float(), pooled.float()
        z = hidden[: len(chunks)]  # [chunks, T, D]
        if has_weights:
            w = torch.tensor([[wt for _, wt in c] for c in chunks], dtype=torch.float32)[..., None]  # [chunks, T, 1]
            z_empty = hidden[-1]  # [T, D]
            z = torch.where(w != 1.0, (z - z_empty) * w + z_empty, z)
        z = z.reshape(1, -1, z.shape[-1])  # [chunks, T, D] -> [1, chunks*T, D]
    return z.clone(), pooled[:1].clone()


def _fit_row(row: list[int | Tensor], width: int, pad: int, warn: Callable[[str], None]) -> list[int | Tensor]:
    """Drop embedding vectors of the wrong width, refilling with pad tokens at the end."""
    kept = [t for t in row if not (isinstance(t, Tensor) and t.shape[-1] != width)]
    dropped = len(row) - len(kept)
    if dropped:
        bad = next(t for t in row if isinstance(t, Tensor) and t.shape[-1] != width)
        warn(f"embedding width {bad.shape[-1]} does not match the text encoder's {width}; ignored")
    return kept + [pad] * dropped
