"""Qwen3 as a text encoder (Qwen team 2025, "Qwen3 Technical Report", arXiv:2505.09388): Z-Image's
``qwen_3_4b.safetensors`` (ComfyUI's ``Qwen3_4B``, ``comfy/text_encoders/llama.py``).

Attribute names equal the file's keys (``model.embed_tokens.weight``,
``model.layers.N.self_attn.q_proj.weight``, ``...q_norm.weight``, ``model.norm.weight``), so a
standalone file loads with no table; a checkpoint that bundles it keeps those keys under a prefix
(``WeightSource.prefix``). A ``lm_head.weight`` some files carry is not used (hidden states only).

Sizes come from shapes: head_dim from ``q_norm`` (128 for every Qwen3), heads and key/value heads
from the projections. What shapes cannot tell is the family's constant: RoPE theta 1e6, RMS eps
1e-6. A Qwen3 block: pre-norm attention (q/k RMS-normed per head before RoPE) and a SiLU-gated
MLP, both residual; plain RMS norms (weight, not 1 + weight).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.encoders.decoder_llm import (DecoderShape, DecoderTextEncoder, PreNormBlock, PreNormDecoder,
                                                 causal_padding_mask, rope_cos_sin, shape_from)

__all__ = ["Qwen3Config", "Qwen3TextModel", "is_qwen3", "qwen3_config"]

_MARKER = "model.layers.0.self_attn.q_norm.weight"


@dataclass(frozen=True)
class Qwen3Config:
    shape: DecoderShape
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6


def is_qwen3(keys, prefix: str = "") -> bool:
    """A Qwen3 decoder: per-head q/k norms and no Gemma feed-forward norms (ComfyUI's
    ``detect_te_model``)."""
    return (prefix + _MARKER in keys and prefix + "model.layers.0.post_attention_layernorm.weight" in keys
            and prefix + "model.layers.0.post_feedforward_layernorm.weight" not in keys)


def qwen3_config(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> Qwen3Config:
    """The config from key -> shape (head_dim from ``q_norm``)."""
    head_dim = int(shapes[prefix + _MARKER][0])
    return Qwen3Config(shape_from(shapes, prefix, head_dim))


def Qwen3Inner(cfg: Qwen3Config) -> PreNormDecoder:
    """The file's ``model.`` part."""
    return PreNormDecoder(cfg.shape, cfg.eps, lambda i: PreNormBlock(cfg.shape, cfg.eps, cfg.rope_theta, qk_norm_eps=cfg.eps))


class Qwen3TextModel(DecoderTextEncoder):
    """``forward(embeds [N, T, D], mask [N, T], layer) -> hidden [N, T, D]``: the output of
    decoder layer ``layer`` (0-based, unnormed), or the normed last layer for None."""

    # norms stay f32 (their weights are vectors that fp8 or bf16 storage would distort); the
    # 151,936-row token table is read a few rows at a time, so it stays as the file stores it
    keep_f32: tuple[str, ...] = ("model.norm", "model.layers.*.input_layernorm",
                                 "model.layers.*.post_attention_layernorm", "model.layers.*.self_attn.q_norm",
                                 "model.layers.*.self_attn.k_norm")
    keep_stored: tuple[str, ...] = ("model.embed_tokens",)

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config, Qwen3Inner)

    def forward(self, embeds: Tensor, mask: Tensor, layer: int | None = None) -> Tensor:
        x = embeds
        t = x.shape[1]
        cos, sin = rope_cos_sin(torch.arange(t, device=x.device), self.config.shape.head_dim, self.config.rope_theta)
        attn_mask = causal_padding_mask(mask, x.dtype)
        for i, block in enumerate(self.model.layers):
            x = block(x, attn_mask, cos, sin)
            if i == layer:
                return x
        return self.model.norm(x)
