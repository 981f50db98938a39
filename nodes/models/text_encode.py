"""Prompt -> CONDITIONING for SD1, SD2, SDXL and the SDXL refiner, with ComfyUI's semantics.

ComfyUI facts reproduced here (``comfy/sd1_clip.py``, ``sd2_clip.py``, ``sdxl_clip.py``):

* Per-encoder settings (`ENCODER_SPECS`): pad token, default layer, whether ``final_layer_norm``
  is applied to an intermediate layer, whether the pooled output is projected.
  SD1 clip_l: pad 49407, last layer, normed hidden, unprojected pooled. SD2 clip_h: pad 0,
  penultimate, normed hidden. SDXL clip_l and clip_g: pad 0 for clip_g / 49407 for clip_l,
  penultimate, *raw* hidden. Refiner: clip_g only.
* CLIPSetLastLayer's ``stop_at_clip_layer`` n replaces the default layer of every encoder; an n
  with ``|n| > layers`` means the normed last layer.
* Weights: every chunk and the empty prompt ``[start, end, pad...]`` go through the encoder in
  one batch; a token of weight w != 1 becomes ``(z - z_empty) * w + z_empty`` (z_empty taken at
  the same position). This differs from A1111's mean renormalisation.
* Chunks are concatenated along tokens: cross_attn ``[1, 77 * chunks, D]``; the pooled output is
  the first chunk's. SDXL: ``cat(clip_l, clip_g)`` along features (768 + 1280 = 2048; both cut to
  the shorter token count), pooled from clip_g (projected, 1280).
* Textual-inversion vectors take one slot each; a vector whose width differs from the encoder's is
  dropped with a warning, and the chunk is refilled with pad tokens at the end (the weights of the
  later slots stay by position, as in ComfyUI).

Precision: text tensors are float32 at this boundary (token ids int64; Cond tensors float32).
The encoders may be wrapped by ``nodes.models.cast.apply_precision``; ComfyUI itself stores the
text encoder in fp16 but computes it in float32 (``manual_cast`` with float32 inputs), which is
the policy storage=f16, compute=f32.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.models.clip import CLIPTextModel
from mixgraph.nodes.models.tokenizer import END_TOKEN, START_TOKEN, CLIPTokenizer, EmbeddingLookup, TokenWeights
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = [
    "TextEncoders",
    "EncoderSpec",
    "ENCODER_SPECS",
    "CHECKPOINT_PREFIXES",
    "encode_prompt",
    "encode_tokens",
    "text_encoders_from_checkpoint",
]

logger = logging.getLogger(__name__)

KINDS = ("sd1", "sd2", "sdxl", "sdxl_refiner")


@dataclass(frozen=True)
class EncoderSpec:
    name: str  # TextEncoders field, and the key of this encoder in textual-inversion files
    pad_token: int
    default_layer: int | None  # None = last layer (after final_layer_norm)
    norm_hidden: bool  # final_layer_norm on an intermediate layer's output
    project_pooled: bool


ENCODER_SPECS: dict[str, tuple[EncoderSpec, ...]] = {
    "sd1": (EncoderSpec("clip_l", END_TOKEN, None, True, False),),
    "sd2": (EncoderSpec("clip_h", 0, -2, True, True),),
    "sdxl": (EncoderSpec("clip_l", END_TOKEN, -2, False, True), EncoderSpec("clip_g", 0, -2, False, True)),
    "sdxl_refiner": (EncoderSpec("clip_g", 0, -2, False, True),),
}

# Where each encoder sits in a single-file checkpoint (comfy-conventions section 8).
CHECKPOINT_PREFIXES: dict[str, dict[str, str]] = {
    "sd1": {"clip_l": "cond_stage_model.transformer."},
    "sd2": {"clip_h": "cond_stage_model.model."},
    "sdxl": {"clip_l": "conditioner.embedders.0.transformer.", "clip_g": "conditioner.embedders.1.model."},
    "sdxl_refiner": {"clip_g": "conditioner.embedders.0.model."},
}


@dataclass(frozen=True)
class TextEncoders:
    """The text encoders of one model family. The cross_attn features concatenate the encoders
    in `ENCODER_SPECS` order; the pooled output is the last encoder's."""

    kind: str  # "sd1" | "sd2" | "sdxl" | "sdxl_refiner"
    clip_l: CLIPTextModel | None = None
    clip_g: CLIPTextModel | None = None
    clip_h: CLIPTextModel | None = None

    def __post_init__(self) -> None:
        if self.kind not in ENCODER_SPECS:
            raise ValueError(f"unknown text encoder kind {self.kind!r}; expected one of {KINDS}")
        missing = [s.name for s in ENCODER_SPECS[self.kind] if getattr(self, s.name) is None]
        if missing:
            raise ValueError(f"{self.kind} text encoding needs {', '.join(missing)}, which is not loaded")


def text_encoders_from_checkpoint(sd: Mapping[str, Tensor], kind: str) -> TextEncoders:
    """Build the encoders of `kind` from a single-file checkpoint's state dict."""
    models = {name: CLIPTextModel.from_state_dict(sd, prefix=p) for name, p in CHECKPOINT_PREFIXES[kind].items()}
    return TextEncoders(kind, **models)


def encode_prompt(
    encoders: TextEncoders,
    tokenizer: CLIPTokenizer,
    text: str,
    *,
    layer_idx: int | None = None,
    embedding_lookup: EmbeddingLookup | None = None,
    warn: Callable[[str], None] | None = None,
    texts: Mapping[str, str] | None = None,
) -> tuple[Cond, ...]:
    """CLIPTextEncode: one Cond with cross_attn [1, 77*chunks, D] and pooled [1, P].

    `layer_idx`: CLIPSetLastLayer's stop_at_clip_layer (-1 last, -2 penultimate), or None for the
    model's default. `embedding_lookup(name)` resolves ``embedding:name``. `warn` receives
    user-facing warnings (missing or mismatched embeddings); default: this module's logger.
    `texts`: a prompt per encoder name ("clip_l", "clip_g") replacing `text` for that encoder
    (CLIPTextEncodeSDXL's text_l / text_g); when the encoders then get different chunk counts,
    the shorter ones are padded with chunks of the empty prompt, as ComfyUI does.
    """
    warn = warn or logger.warning
    specs = ENCODER_SPECS[encoders.kind]
    unknown = sorted(set(texts or {}) - {s.name for s in specs})
    if unknown:
        raise ValueError(f"{encoders.kind} text encoding has no encoder {', '.join(unknown)}")
    tokenized = {
        spec.name: tokenizer.tokenize_with_weights(
            (texts or {}).get(spec.name, text), pad_token=spec.pad_token, embedding_lookup=embedding_lookup,
            embedding_key=spec.name, warn=warn,
        )
        for spec in specs
    }
    return encode_tokens(encoders, tokenizer, tokenized, layer_idx=layer_idx, warn=warn)


def encode_tokens(
    encoders: TextEncoders,
    tokenizer: CLIPTokenizer,
    tokenized: Mapping[str, list[TokenWeights]],
    *,
    layer_idx: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[Cond, ...]:
    """ComfyUI's ``encode_from_tokens``: the chunks of (token, weight) per encoder name (what
    ``tokenize_with_weights`` gives; word ids, if present, are dropped) -> one Cond."""
    warn = warn or logger.warning
    specs = ENCODER_SPECS[encoders.kind]
    missing = [s.name for s in specs if s.name not in tokenized]
    if missing:
        raise ValueError(f"{encoders.kind} text encoding: no tokens for {', '.join(missing)}")
    tokenized = [[[(t[0], t[1]) for t in chunk] for chunk in tokenized[spec.name]] for spec in specs]
    n_chunks = max(len(c) for c in tokenized)
    for spec, chunks in zip(specs, tokenized):
        if len(chunks) < n_chunks:
            empty = tokenizer.tokenize_with_weights("", pad_token=spec.pad_token)
            while len(chunks) < n_chunks:
                chunks.extend(empty)
    outs: list[Tensor] = []
    pooled: Tensor | None = None
    for spec, chunks in zip(specs, tokenized):
        model = getattr(encoders, spec.name)
        z, pooled = _encode_chunks(model, chunks, spec, layer_idx, warn)
        outs.append(z)
    cut = min(z.shape[1] for z in outs)
    cross = torch.cat([z[:, :cut] for z in outs], dim=-1)  # [1, T, D_l + D_g]
    return (Cond(cross_attn=cross.float(), pooled=None if pooled is None else pooled.float()),)


def _resolve_layer(requested: int | None, spec: EncoderSpec, n_layers: int) -> int | None:
    layer = spec.default_layer if requested is None else requested
    if layer is None or abs(layer) > n_layers:
        return None
    return layer


def _encode_chunks(
    model: CLIPTextModel,
    chunks: list[TokenWeights],
    spec: EncoderSpec,
    layer_idx: int | None,
    warn: Callable[[str], None],
) -> tuple[Tensor, Tensor]:
    """([1, 77*chunks, D], [1, P]) for one encoder, weights applied against the empty prompt."""
    width = model.config.width
    has_weights = any(w != 1.0 for chunk in chunks for _, w in chunk)
    length = max(len(c) for c in chunks)
    rows: list[list[int | Tensor]] = [_fit_row([t for t, _ in c], width, spec.pad_token, warn) for c in chunks]
    if has_weights:
        rows.append([START_TOKEN, END_TOKEN] + [spec.pad_token] * (length - 2))  # the empty prompt

    placeholder = 0  # any id except the end token; its embedding is overwritten
    tokens = torch.tensor([[t if isinstance(t, int) else placeholder for t in r] for r in rows])  # [N, T]
    layer = _resolve_layer(layer_idx, spec, model.config.layers)
    with torch.no_grad():
        embeds = None
        vectors = [(i, j, t) for i, r in enumerate(rows) for j, t in enumerate(r) if isinstance(t, Tensor)]
        if vectors:
            embeds = model.token_embeddings(tokens).clone()  # [N, T, D]
            for i, j, vec in vectors:
                embeds[i, j] = vec.to(embeds.dtype)
        hidden, pooled = model(
            tokens, layer, norm_hidden=spec.norm_hidden, embeds=embeds, project_pooled=spec.project_pooled
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
