"""What the decoder-only LLM text encoders share (Qwen3 for Z-Image, Gemma 2 for Lumina 2):
RMS norms, rotary position embeddings, grouped-query causal attention, the gated MLP, and how a
prompt's chunks become one ``encoder_set.EncodedText`` (ComfyUI's ``SDClipModel`` path with
``enable_attention_masks`` / ``return_attention_masks``, ``comfy/sd1_clip.py``).

Facts reproduced from ComfyUI (``comfy/text_encoders/llama.py``, ``sd1_clip.py``):

* Hidden layer: ``layer_idx=-2`` by default for both families: the output of the second-to-last
  decoder layer (0-based index ``L - 2``), *without* the final ``model.norm``
  (``layer_norm_hidden_state=False``). CLIPSetLastLayer's n replaces it (-1: the last layer's
  output, unnormed; ``|n| > L``: the last layer after ``model.norm``).
* Attention mask: a row's tokens count (1) up to its first pad token; that pad token and all
  after it are 0 (these models have no end token; ComfyUI compares with the pad token). The mask
  is additive on keys, finfo.min / 4 like ComfyUI (finite, so a row whose keys are all padding
  gives no NaN), plus the causal mask.
* Weights: when any token's weight is not 1, the empty prompt (``[start?] + pad...``) is encoded
  in the same batch and a weighted token becomes ``(z - z_empty) * w + z_empty``.
* Output: the chunks along tokens ``[1, T * chunks, D]`` and their attention mask
  ``[1, T * chunks]`` (ComfyUI puts it in the cond as ``attention_mask``); no pooled vector.

RoPE is the Llama / GPT-NeoX form (rotate halves; Su et al. 2021, "RoFormer", arXiv:2104.09864),
computed in float32 as ComfyUI does. Grouped-query attention repeats each key/value head for its
query group (Ainslie et al. 2023, arXiv:2305.13245).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule
from mixgraph.nodes.models.attention import attention

__all__ = ["DecoderShape", "RMSNorm", "rope_cos_sin", "apply_rope", "DecoderAttention", "GatedMLP",
           "PreNormBlock", "PreNormDecoder",
           "DecoderTextEncoder", "count_layers", "resolve_layer", "shape_from", "padding_mask", "causal_padding_mask"]


@dataclass(frozen=True)
class DecoderShape:
    """The sizes every decoder LLM here has, all read from tensor shapes (head_dim from the q/k
    norms where the family has them, else the family's constant)."""

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


def count_layers(keys, stem: str) -> int:
    """1 + the largest N of ``{stem}N.`` among `keys`; KeyError when there is none."""
    found = set()
    for k in keys:
        if k.startswith(stem):
            n = k[len(stem):].split(".", 1)[0]
            if n.isdigit():
                found.add(int(n))
    if not found:
        raise KeyError(f"no decoder layers under {stem!r}")
    return max(found) + 1


def shape_from(shapes, prefix: str, head_dim: int) -> DecoderShape:
    """A ``DecoderShape`` from key -> shape (``model.embed_tokens.weight``, layer 0's projections)."""
    p = prefix + "model."
    embed = shapes[p + "embed_tokens.weight"]
    q = shapes[p + "layers.0.self_attn.q_proj.weight"]
    k = shapes[p + "layers.0.self_attn.k_proj.weight"]
    gate = shapes[p + "layers.0.mlp.gate_proj.weight"]
    if q[0] % head_dim or k[0] % head_dim:
        raise ValueError(f"decoder attention widths q={q[0]}, k={k[0]} are not multiples of head_dim {head_dim}")
    return DecoderShape(vocab_size=int(embed[0]), hidden=int(embed[1]), layers=count_layers(shapes, p + "layers."),
                        heads=int(q[0]) // head_dim, kv_heads=int(k[0]) // head_dim, head_dim=head_dim,
                        intermediate=int(gate[0]))


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in float32 and returned in the
    input's dtype. ``add_one``: Gemma's form, scaled by ``1 + weight`` (its weights are stored
    around 0)."""

    def __init__(self, dim: int, eps: float, add_one: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.add_one = add_one
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight.float()
        w = w + 1.0 if self.add_one else w
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * w).to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [T, head_dim] (float32) for integer `positions` [T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
    return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, hd] rotated in float32, returned in x's dtype (ComfyUI's ``apply_rope``)."""
    out = x.float() * cos + _rotate_half(x.float()) * sin
    return out.to(x.dtype)


class DecoderAttention(nn.Module):
    """Causal grouped-query self-attention with RoPE; optional per-head RMS norms of q and k
    (Qwen3's ``q_norm`` / ``k_norm``, applied before RoPE); ``qkv_bias``: q/k/v with biases
    (Qwen2 / Qwen2.5). Keys: q_proj, k_proj, v_proj, o_proj. ``cos`` / ``sin`` are [T, hd] or,
    per row (M-RoPE), [N, 1, T, hd]."""

    def __init__(self, shape: DecoderShape, theta: float, qk_norm_eps: float | None = None,
                 qkv_bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = shape.heads, shape.kv_heads, shape.head_dim, theta
        self.upcast_attention = False
        inner, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        self.q_proj = nn.Linear(shape.hidden, inner, bias=qkv_bias)
        self.k_proj = nn.Linear(shape.hidden, kv, bias=qkv_bias)
        self.v_proj = nn.Linear(shape.hidden, kv, bias=qkv_bias)
        self.o_proj = nn.Linear(inner, shape.hidden, bias=False)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(shape.head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(shape.head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)  # [B, T, H*hd] -> [B, T, H, hd]
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)  # [B, T, KV, hd]
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, H, T, hd]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, KV, T, hd]
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)  # [B, KV, T, hd] -> [B, H, T, hd]
        v = v.transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, T, hd]

        def packed(z: Tensor) -> Tensor:  # [B, H, T, hd] -> [B, T, H*hd]
            return z.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)

        out = attention(packed(q), packed(k), packed(v), self.heads, mask=mask, upcast=self.upcast_attention)
        return self.o_proj(out)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: SiLU for Qwen3, tanh-approximated GELU for Gemma 2."""

    def __init__(self, shape: DecoderShape, activation: str) -> None:
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"decoder MLP activation must be 'silu' or 'gelu_tanh', got {activation!r}")
        self.tanh_gelu = activation == "gelu_tanh"
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        g = self.gate_proj(x)
        g = F.gelu(g, approximate="tanh") if self.tanh_gelu else F.silu(g)
        return self.down_proj(g * self.up_proj(x))


class PreNormBlock(nn.Module):
    """A Qwen-style decoder layer: ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` with a SiLU
    gated MLP (Qwen3: q/k norms, ``qk_norm_eps``; Qwen2 / Qwen2.5: ``qkv_bias``). Keys:
    input_layernorm, self_attn.*, post_attention_layernorm, mlp.*."""

    def __init__(self, shape: DecoderShape, eps: float, theta: float, qk_norm_eps: float | None = None,
                 qkv_bias: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, eps)
        self.self_attn = DecoderAttention(shape, theta, qk_norm_eps=qk_norm_eps, qkv_bias=qkv_bias)
        self.post_attention_layernorm = RMSNorm(shape.hidden, eps)
        self.mlp = GatedMLP(shape, "silu")

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class PreNormDecoder(nn.Module):
    """A file's ``model.`` part for ``PreNormBlock`` decoders: the token table, the layers
    (``block(i)`` builds layer i) and the final norm."""

    def __init__(self, shape: DecoderShape, eps: float, block: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden)
        self.layers = nn.ModuleList(block(i) for i in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, eps)


def resolve_layer(requested: int | None, rule: OutputRule, n_layers: int) -> int | None:
    """The 0-based layer whose output is the hidden state, or None for the normed last layer
    (ComfyUI's ``set_clip_options``: ``|n| > layers`` means "last")."""
    layer = rule.default_layer if requested is None else requested
    if layer is None or abs(layer) > n_layers:
        return None
    return layer % n_layers


def padding_mask(tokens: list[int], pad: int) -> list[int]:
    """ComfyUI's mask for a row without an end token: 1 up to the first pad token, 0 from it on."""
    out, ended = [], False
    for t in tokens:
        ended = ended or t == pad
        out.append(0 if ended else 1)
    return out


class DecoderTextEncoder(nn.Module):
    """Base of the decoder text encoders: ``encode_chunks`` over a subclass's ``forward(embeds,
    mask, layer) -> hidden``; the subclass builds its layers as ``self.model`` (``inner(config)``,
    holding ``embed_tokens``) so that attribute names are the files' ``model.*`` keys.
    ``empty_start``: the token the empty prompt starts with (Gemma's BOS; None for Qwen3, whose
    empty prompt is all padding)."""

    empty_start: int | None = None

    def __init__(self, config: Any, inner: Callable[[Any], nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.n_layers = config.shape.layers
        self.width = config.shape.hidden
        self.model = inner(config)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.model.embed_tokens(tokens)

    def encode_chunks(self, chunks: list, rule: OutputRule, layer_idx: int | None,
                      warn: Callable[[str], None]) -> EncodedText:
        """chunks of (token or embedding vector [D], weight) -> ``EncodedText`` (float32)."""
        has_weights = any(w != 1.0 for chunk in chunks for _, w in chunk)
        length = max(len(c) for c in chunks)
        rows = [self._fit_row([t for t, _ in c], rule.pad_token, warn) for c in chunks]
        rows = [r + [rule.pad_token] * (length - len(r)) for r in rows]
        if has_weights:
            start = [] if self.empty_start is None else [self.empty_start]
            rows.append(start + [rule.pad_token] * (length - len(start)))
        ids = torch.tensor([[t if isinstance(t, int) else rule.pad_token for t in r] for r in rows])  # [N, T]
        mask = torch.tensor([padding_mask([t if isinstance(t, int) else -1 for t in r], rule.pad_token)
                             for r in rows])  # [N, T]; an embedding vector is a real token
        layer = resolve_layer(layer_idx, rule, self.n_layers)
        with torch.no_grad():
            embeds = self.embed(ids).float()  # [N, T, D]
            for i, r in enumerate(rows):
                for j, t in enumerate(r):
                    if isinstance(t, Tensor):
                        embeds[i, j] = t.float()
            hidden = self(embeds, mask, layer).float()  # [N, T, D]
            z = hidden[: len(chunks)]
            if has_weights:
                w = torch.tensor([[wt for _, wt in c] + [1.0] * (length - len(c)) for c in chunks],
                                 dtype=torch.float32)[..., None]  # [chunks, T, 1]
                z_empty = hidden[-1]  # [T, D]
                z = torch.where(w != 1.0, (z - z_empty) * w + z_empty, z)
            z = z.reshape(1, -1, z.shape[-1])  # [chunks, T, D] -> [1, chunks*T, D]
            m = mask[: len(chunks)].reshape(1, -1)  # [chunks, T] -> [1, chunks*T]
        return EncodedText(hidden=z.clone(), pooled=None, mask=m.clone())

    def _fit_row(self, row: list, pad: int, warn: Callable[[str], None]) -> list:
        """Drop embedding vectors of the wrong width, refilling with pad tokens at the end (their
        mask is 0), as ComfyUI's ``process_tokens`` does."""
        kept = [t for t in row if not (isinstance(t, Tensor) and t.shape[-1] != self.width)]
        dropped = len(row) - len(kept)
        if dropped:
            bad = next(t for t in row if isinstance(t, Tensor) and t.shape[-1] != self.width)
            warn(f"embedding width {bad.shape[-1]} does not match the text encoder's {self.width}; ignored")
        return kept + [pad] * dropped


def causal_padding_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[N, T] 1/0 token mask -> additive [N, 1, T, T] mask in `dtype`: padded keys and future
    positions get finfo.min / 4 each (ComfyUI's values; finite, so no row is all -inf)."""
    n, t = mask.shape
    low = torch.finfo(dtype).min / 4
    pad = (1.0 - mask.to(dtype))[:, None, None, :].expand(n, 1, t, t) * low  # [N, 1, T(q), T(k)]
    causal = torch.full((t, t), low, dtype=dtype, device=mask.device).triu_(1)  # [T, T]
    return pad + causal
