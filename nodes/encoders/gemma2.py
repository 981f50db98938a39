"""Gemma 2 as a text encoder (Gemma Team 2024, "Gemma 2: Improving Open Language Models at a
Practical Size", arXiv:2408.00118): Lumina 2's ``gemma_2_2b`` (ComfyUI's ``Gemma2_2B``,
``comfy/text_encoders/llama.py``).

Attribute names equal the file's keys (``model.embed_tokens.weight``,
``model.layers.N.{input,post_attention,pre_feedforward,post_feedforward}_layernorm.weight``,
``model.layers.N.self_attn.q_proj.weight``, ``model.norm.weight``); the tokenizer the file
carries as ``spiece_model`` is read by ``llm_tokenizers``, not by this module.

A Gemma 2 block norms both sides of each sublayer: ``x + post_attn_norm(attn(input_norm(x)))``,
then ``x + post_ff_norm(mlp(pre_ff_norm(x)))``; every RMS norm scales by ``1 + weight``; the MLP
is tanh-GELU-gated; the token embeddings are multiplied by ``sqrt(hidden)``.

Sizes from shapes; head_dim is Gemma 2's 256 (no per-head norm tells it), attention scaled by
``1/sqrt(head_dim)`` (``query_pre_attn_scalar`` = head_dim for the 2B); RoPE theta 1e4, eps 1e-6.
As in ComfyUI, and unlike the reference implementation, attention logits are *not* soft-capped
(``attn_logit_softcapping`` 50) and no layer uses the 4096-token sliding window: ComfyUI's
Gemma2_2B config sets neither, and a prompt never reaches 4096 tokens. The final-logit
soft-capping only touches the LM head, which a text encoder does not use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.encoders.decoder_llm import (DecoderAttention, DecoderShape, DecoderTextEncoder, GatedMLP,
                                                 RMSNorm, causal_padding_mask, rope_cos_sin, shape_from)

__all__ = ["Gemma2Config", "Gemma2TextModel", "is_gemma2", "gemma2_config", "GEMMA2_HEAD_DIM", "GEMMA_BOS"]

GEMMA2_HEAD_DIM = 256
GEMMA_BOS = 2  # <bos>: starts every Gemma prompt, also the empty one weights are measured against
_MARKER = "model.layers.0.post_feedforward_layernorm.weight"


@dataclass(frozen=True)
class Gemma2Config:
    shape: DecoderShape
    rope_theta: float = 10_000.0
    eps: float = 1e-6


def is_gemma2(keys, prefix: str = "") -> bool:
    """A Gemma 2 decoder: feed-forward norms on both sides and no per-head q norm (which would be
    Gemma 3; ComfyUI's ``detect_te_model``)."""
    return prefix + _MARKER in keys and prefix + "model.layers.0.self_attn.q_norm.weight" not in keys


def gemma2_config(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> Gemma2Config:
    """The config from key -> shape (head_dim: Gemma 2's 256)."""
    return Gemma2Config(shape_from(shapes, prefix, GEMMA2_HEAD_DIM))


class Gemma2Block(nn.Module):
    def __init__(self, cfg: Gemma2Config) -> None:
        super().__init__()
        s = cfg.shape
        self.input_layernorm = RMSNorm(s.hidden, cfg.eps, add_one=True)
        self.self_attn = DecoderAttention(s, cfg.rope_theta)
        self.post_attention_layernorm = RMSNorm(s.hidden, cfg.eps, add_one=True)
        self.pre_feedforward_layernorm = RMSNorm(s.hidden, cfg.eps, add_one=True)
        self.mlp = GatedMLP(s, "gelu_tanh")
        self.post_feedforward_layernorm = RMSNorm(s.hidden, cfg.eps, add_one=True)

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), mask, cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma2Inner(nn.Module):
    """The file's ``model.`` part."""

    def __init__(self, cfg: Gemma2Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.shape.vocab_size, cfg.shape.hidden)
        self.layers = nn.ModuleList(Gemma2Block(cfg) for _ in range(cfg.shape.layers))
        self.norm = RMSNorm(cfg.shape.hidden, cfg.eps, add_one=True)


class Gemma2TextModel(DecoderTextEncoder):
    """``forward(embeds [N, T, D], mask [N, T], layer) -> hidden [N, T, D]``: the output of
    decoder layer ``layer`` (0-based, unnormed), or the normed last layer for None. `embeds` are
    the raw token embeddings; the ``sqrt(hidden)`` scale is applied here, to textual-inversion
    vectors too (ComfyUI scales whatever embeddings enter the model)."""

    empty_start = GEMMA_BOS
    # the (1 + w) norms stay f32: w is stored near 0, where fp8 or bf16 storage loses the most;
    # the 256,000-row token table is read a few rows at a time, so it stays as the file stores it
    keep_f32: tuple[str, ...] = ("model.norm", "model.layers.*.*_layernorm")
    keep_stored: tuple[str, ...] = ("model.embed_tokens",)

    def __init__(self, config: Gemma2Config) -> None:
        super().__init__(config, Gemma2Inner)

    def forward(self, embeds: Tensor, mask: Tensor, layer: int | None = None) -> Tensor:
        x = embeds * torch.tensor(self.config.shape.hidden ** 0.5, dtype=embeds.dtype)
        t = x.shape[1]
        cos, sin = rope_cos_sin(torch.arange(t, device=x.device), self.config.shape.head_dim, self.config.rope_theta)
        attn_mask = causal_padding_mask(mask, x.dtype)
        for i, block in enumerate(self.model.layers):
            x = block(x, attn_mask, cos, sin)
            if i == layer:
                return x
        return self.model.norm(x)
