"""The T5 v1.1 text encoder (T5-XXL of Flux.1, SD3/3.5, Chroma), with ComfyUI's semantics.

Architecture (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer"; v1.1: gated-GELU feed-forward, no parameter sharing of the input
embedding with an output layer), the encoder stack only:

* RMS norm without mean subtraction or bias (``T5LayerNorm``), before each sublayer and at the
  end (``encoder.final_layer_norm``); statistics in f32.
* Self-attention without the 1/sqrt(d) scaling (Mesh TensorFlow's initialisation absorbs it),
  with a learned bias per head over relative-position buckets (32 buckets, bidirectional,
  max distance 128) held by block 0 only and added in every block. umT5 (Chung et al. 2023,
  "UniMax"; Wan's umT5-XXL, ComfyUI's ``model_type: umt5``) is the same encoder with a bias
  table of its own in *every* block (``T5Config.per_layer_bias``, from the keys).
* Feed-forward ``wo(gelu_tanh(wi_0 x) * wi_1 x)``.

Attribute names are the checkpoint keys ComfyUI's T5-XXL files use (``encoder.block.N.layer.0.
SelfAttention.q.weight``, ``shared.weight``, ...), so loading needs no table; sizes come from
shapes (``T5Config.from_state_dict``).

Encoding (``encode_chunks``, ComfyUI ``comfy/sd1_clip.py`` + ``text_encoders/sd3_clip.py``):
the chunks (one for T5: its tokenizer never splits) run in one batch with, when any weight is
not 1, the empty prompt (``[end, pad...]``; PixArt / Chroma: all pad tokens); a token of weight w
becomes ``(z - z_empty) * w + z_empty``. Padding attends (no attention mask) unless the rule
says ``attention_mask`` (ComfyUI's ``enable_attention_masks``): then padding after the end token
is masked out and the mask comes back with the output (the joins pass it on as
``model_inputs["attention_mask"]``). ``zero_masked`` (ComfyUI's ``zero_out_masked``, Wan's
umT5) zeroes the hidden states of the padding after the end token, before the weights apply.
T5 has no pooled output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule

__all__ = ["T5Config", "T5Rule", "T5EncoderModel", "T5_END", "T5_PAD", "is_t5", "has_per_layer_bias",
           "relative_position_bucket"]

T5_END = 1  # </s>
T5_PAD = 0  # <pad>
NUM_BUCKETS = 32
MAX_DISTANCE = 128
_BLOCK_Q = re.compile(r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.q\.weight$")


@dataclass(frozen=True)
class T5Rule(OutputRule):
    """A T5 encoder's output rule: the ``OutputRule`` with T5's pad token, its last normed layer,
    no pooled output, plus how ComfyUI runs it for a set.

    attention_mask: padding after the end token is masked out of attention (ComfyUI's
        ``enable_attention_masks``; off for Flux, SD3 and Chroma).
    empty_end: the empty prompt the weights interpolate against is ``[end, pad...]`` (True) or
        all pad tokens (False: PixArt / Chroma, ComfyUI's ``pixart_t5.T5XXLModel``).
    zero_masked: the hidden states after the end token are zeroed (ComfyUI's
        ``zero_out_masked``: Wan's umT5-XXL), every row, before the weights apply.
    """

    pad_token: int = T5_PAD
    default_layer: int | None = None
    norm_hidden: bool = True
    project_pooled: bool = False
    attention_mask: bool = False
    empty_end: bool = True
    zero_masked: bool = False


@dataclass(frozen=True)
class T5Config:
    """Sizes of a T5 v1.1 encoder, from tensor shapes. T5-XXL: vocab 32128, width 4096, 64 heads
    of 64, feed-forward 10240, 24 blocks. umT5-XXL: the same with vocab 256384 and
    ``per_layer_bias`` (a relative-position table in every block, not block 0's shared)."""

    vocab: int
    width: int
    heads: int
    head_dim: int
    ff: int
    layers: int
    eps: float = 1e-6
    per_layer_bias: bool = False

    @classmethod
    def from_state_dict(cls, info: Mapping[str, Any]) -> "T5Config":
        """From key -> tensor / TensorInfo / shape with any prefix stripped."""
        shape = lambda k: tuple(getattr(info[k], "shape", info[k]))  # noqa: E731
        if not is_t5(info):
            raise ValueError("not a T5 v1.1 encoder: no encoder.block.0.layer.1.DenseReluDense.wi_0.weight "
                             "(T5 v1.0 and the original Wan umT5 layout are not supported yet)")
        layers = 1 + max(int(m.group(1)) for k in info if (m := _BLOCK_Q.match(k)))
        vocab, width = shape("shared.weight")
        heads = shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")[1]
        inner = shape("encoder.block.0.layer.0.SelfAttention.q.weight")[0]
        ff = shape("encoder.block.0.layer.1.DenseReluDense.wi_0.weight")[0]
        return cls(vocab=vocab, width=width, heads=heads, head_dim=inner // heads, ff=ff, layers=layers,
                   per_layer_bias=has_per_layer_bias(info))


def has_per_layer_bias(info: Mapping[str, Any], prefix: str = "") -> bool:
    """Whether block 1 holds a relative-position table of its own (umT5; T5 v1.1 keeps block 0's only)."""
    return prefix + "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in info


def is_t5(info: Mapping[str, Any], prefix: str = "") -> bool:
    """Whether ``info`` holds a T5 v1.1 encoder under ``prefix`` (gated feed-forward, relative
    attention bias in block 0, the shared embedding)."""
    return all(prefix + k in info for k in (
        "shared.weight", "encoder.final_layer_norm.weight",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"))


def relative_position_bucket(relative: Tensor, num_buckets: int = NUM_BUCKETS,
                             max_distance: int = MAX_DISTANCE) -> Tensor:
    """T5's bidirectional bucketing (Mesh TensorFlow): half the buckets per direction; within one,
    distances below a quarter of the buckets get their own bucket, larger ones share
    logarithmically wider ones up to `max_distance`. relative = key position - query position."""
    half = num_buckets // 2
    buckets = (relative > 0).long() * half
    distance = relative.abs()
    exact = half // 2
    log_bucket = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                          * (half - exact)).long()
    log_bucket = log_bucket.clamp(max=half - 1)
    return buckets + torch.where(distance < exact, distance, log_bucket)


class T5LayerNorm(nn.Module):
    """RMS norm: x / rms(x) * weight (no mean, no bias); statistics in f32."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * y).to(x.dtype)


class T5Attention(nn.Module):
    def __init__(self, cfg: T5Config, relative_bias: bool):
        super().__init__()
        inner = cfg.heads * cfg.head_dim
        self.heads = cfg.heads
        self.q = nn.Linear(cfg.width, inner, bias=False)
        self.k = nn.Linear(cfg.width, inner, bias=False)
        self.v = nn.Linear(cfg.width, inner, bias=False)
        self.o = nn.Linear(inner, cfg.width, bias=False)
        self.relative_attention_bias = nn.Embedding(NUM_BUCKETS, cfg.heads) if relative_bias else None

    def position_bias(self, length: int, device: torch.device) -> Tensor:
        """[1, heads, T, T] bias of this block's relative-position table (block 0's serves every block of T5 v1.1)."""
        pos = torch.arange(length, device=device)
        buckets = relative_position_bucket(pos[None, :] - pos[:, None])  # [T, T]
        return self.relative_attention_bias(buckets).permute(2, 0, 1)[None].float()  # [T, T, H] -> [1, H, T, T]

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).reshape(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))  # [B, H, T, d]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=1.0)  # no 1/sqrt(d)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, cfg: T5Config, relative_bias: bool):
        super().__init__()
        self.SelfAttention = T5Attention(cfg, relative_bias)
        self.layer_norm = T5LayerNorm(cfg.width, cfg.eps)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        return x + self.SelfAttention(self.layer_norm(x), bias)


class T5DenseGatedActDense(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.wi_0 = nn.Linear(cfg.width, cfg.ff, bias=False)
        self.wi_1 = nn.Linear(cfg.width, cfg.ff, bias=False)
        self.wo = nn.Linear(cfg.ff, cfg.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class T5LayerFF(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(cfg)
        self.layer_norm = T5LayerNorm(cfg.width, cfg.eps)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, cfg: T5Config, relative_bias: bool):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(cfg, relative_bias), T5LayerFF(cfg)])

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        return self.layer[1](self.layer[0](x, bias))


class T5Stack(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.block = nn.ModuleList(T5Block(cfg, relative_bias=cfg.per_layer_bias or i == 0)
                                   for i in range(cfg.layers))
        self.final_layer_norm = T5LayerNorm(cfg.width, cfg.eps)


class T5EncoderModel(nn.Module):
    """T5 v1.1 (or umT5) encoder. ``forward(tokens, ...) -> (last hidden [B,T,D] normed, chosen layer)``;
    ``encode_chunks`` is the text-encoder-set seam (``text_encode.encode_tokens``)."""

    # RMS norms: tiny vectors, and their statistics decide T5's stability in half precision
    keep_f32: tuple[str, ...] = ("encoder.final_layer_norm", "encoder.block.*.layer.*.layer_norm")
    # 32128 x 4096 table read a few rows at a time (as CLIP's token table)
    keep_stored: tuple[str, ...] = ("shared",)

    def __init__(self, config: T5Config):
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab, config.width)
        self.encoder = T5Stack(config)

    def forward(self, tokens: Tensor, mask: Tensor | None = None, layer_idx: int | None = None, *,
                norm_hidden: bool = True, embeds: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [B, T] int64 (or `embeds` [B, T, D] in their place); mask [B, T] (1 = attends,
        0 = masked) or None; layer_idx: which block's output is the second result (None: the
        last, normed; negative counts from the end), normed by ``final_layer_norm`` when
        `norm_hidden`. Returns (last [B, T, D], chosen [B, T, D])."""
        x = self.shared(tokens) if embeds is None else embeds
        b, t, _ = x.shape
        blocked = None
        if mask is not None:
            blocked = (1.0 - mask.float())[:, None, None, :] * -torch.finfo(torch.float32).max  # [B, 1, 1, T]
        bias = self._bias(0, t, x.device, blocked)  # [B or 1, H, T, T]
        n = len(self.encoder.block)
        stop = None if layer_idx is None else layer_idx % n
        chosen = None
        for i, block in enumerate(self.encoder.block):
            if i > 0 and self.config.per_layer_bias:  # umT5: each block its own table
                bias = self._bias(i, t, x.device, blocked)
            x = block(x, bias)
            if i == stop:
                chosen = x
        last = self.encoder.final_layer_norm(x)
        if chosen is None:
            chosen = last
        elif norm_hidden:
            chosen = self.encoder.final_layer_norm(chosen)
        return last, chosen

    def _bias(self, i: int, length: int, device: torch.device, blocked: Tensor | None) -> Tensor:
        """Block `i`'s position bias [1, H, T, T], plus the padding mask [B, 1, 1, T] when given."""
        bias = self.encoder.block[i].layer[0].SelfAttention.position_bias(length, device)
        return bias if blocked is None else bias + blocked

    def empty_chunk(self) -> list[tuple[int, float]]:
        """ComfyUI's zero-length empty prompt for T5 (no start token): the end token alone."""
        return [(T5_END, 1.0)]

    def encode_chunks(self, chunks: list[list[tuple]], rule: OutputRule, layer_idx: int | None,
                      warn: Callable[[str], None]) -> EncodedText:
        """ComfyUI's ``encode_token_weights`` for T5 (module docstring): chunks of
        (token id or embedding vector [D], weight) -> hidden [1, T·chunks, D] and, when the
        rule masks attention, the mask [1, T·chunks]."""
        masked = bool(getattr(rule, "attention_mask", False))
        empty_end = bool(getattr(rule, "empty_end", True))
        pad = rule.pad_token
        has_weights = any(w != 1.0 for chunk in chunks for _, w in chunk)
        length = max(len(c) for c in chunks)
        rows = [[t for t, _ in c] for c in chunks]
        if has_weights:
            empty = ([T5_END] if empty_end else []) + [pad] * length
            rows.append(empty[:length])
        embeds, mask = self._embed_rows(rows, pad, warn)  # [N, T, D], [N, T]
        layer = _resolve_layer(layer_idx, rule, self.config.layers)
        with torch.no_grad():
            _, hidden = self(torch.zeros(mask.shape, dtype=torch.long), mask if masked else None, layer,
                             norm_hidden=rule.norm_hidden, embeds=embeds)
            hidden = hidden.float()
            if getattr(rule, "zero_masked", False):  # ComfyUI's zero_out_masked: padding -> 0
                hidden = hidden * mask[..., None].float()  # [N, T, D] * [N, T, 1]
            z = hidden[: len(chunks)]  # [chunks, T, D]
            if has_weights:
                w = torch.tensor([[wt for _, wt in c] for c in chunks], dtype=torch.float32)[..., None]  # [chunks, T, 1]
                z = torch.where(w != 1.0, (z - hidden[-1]) * w + hidden[-1], z)
            z = z.reshape(1, -1, z.shape[-1])  # [chunks, T, D] -> [1, chunks*T, D]
        out_mask = mask[: len(chunks)].reshape(1, -1).float() if masked else None  # [1, chunks*T]
        return EncodedText(z.clone(), None, out_mask)

    def _embed_rows(self, rows: list[list[Any]], pad: int, warn: Callable[[str], None]) -> tuple[Tensor, Tensor]:
        """Token rows (ids and embedding vectors) -> (embeds [N, T, D] f32, mask [N, T]): ComfyUI's
        ``process_tokens``: attention up to and including the first end token; a vector of
        another width is dropped with a warning and the row refilled with masked pad tokens."""
        width = self.config.width
        out, masks = [], []
        for row in rows:
            kept = [t for t in row if not (isinstance(t, Tensor) and t.shape[-1] != width)]
            if len(kept) < len(row):
                bad = next(t for t in row if isinstance(t, Tensor) and t.shape[-1] != width)
                warn(f"embedding width {bad.shape[-1]} does not match the text encoder's {width}; ignored")
            mask, ended = [], False
            for t in kept:
                mask.append(0 if ended else 1)
                if isinstance(t, int) and t == T5_END:
                    ended = True
            mask += [0] * (len(row) - len(kept))
            kept += [pad] * (len(row) - len(kept))
            ids = torch.tensor([t if isinstance(t, int) else pad for t in kept])  # [T]
            with torch.no_grad():
                e = self.shared(ids).float().clone()  # [T, D]
                for j, t in enumerate(kept):
                    if isinstance(t, Tensor):
                        e[j] = t.float()
            out.append(e)
            masks.append(mask)
        return torch.stack(out), torch.tensor(masks)


def _resolve_layer(requested: int | None, rule: OutputRule, n_layers: int) -> int | None:
    """CLIPSetLastLayer applies to T5 as to CLIP (ComfyUI ``set_clip_options``): |n| beyond the
    depth is the last, normed layer."""
    layer = rule.default_layer if requested is None else requested
    if layer is None or abs(layer) > n_layers:
        return None
    return layer
