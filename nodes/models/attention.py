"""Multi-head attention over packed `[B, T, heads*dim_head]` tensors.

The one attention entry point of the model runtime. It uses PyTorch's
`F.scaled_dot_product_attention` (which picks a fused kernel where the device has one), so no
hand-written backend selection lives here. `upcast=True` runs scores and softmax in float32, the
remedy for fp16 overflow in attention logits (ComfyUI's `attn_precision`, diffusers'
`upcast_attention`); the result is cast back to the input dtype.

``BACKENDS`` names the implementations a model can be pinned to (ModelAttentionBackend). There is
one: "pytorch", this function, which is what ComfyUI's "pytorch attention" runs
(``F.scaled_dot_product_attention``). ComfyUI's other choice there, Comfy Kitchen's quantized
INT8 attention, computes something else (quantized scores) and has no implementation here; a
name outside ``BACKENDS`` is refused, never replaced by another algorithm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["attention", "BACKENDS", "check_backend", "MultiheadSelfAttention", "QuickGELU", "ResidualAttentionBlock"]


def attention(
    q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None, upcast: bool = False
) -> Tensor:
    """Scaled dot-product attention, softmax(q k^T / sqrt(d)) v, per head.

    q: [B, Tq, heads*dim_head]; k, v: [B, Tk, heads*dim_head]. `mask` is boolean (True = attend)
    or additive float, broadcastable to [B, heads, Tq, Tk]; a 2-D/3-D mask is treated as
    [Tq, Tk] / [B, Tq, Tk]. Returns [B, Tq, heads*dim_head] in q's dtype.
    """
    b, tq, inner = q.shape
    if inner % heads:
        raise ValueError(f"attention: width {inner} is not divisible by heads={heads}")
    dim_head = inner // heads
    out_dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    # [B, T, heads*dh] -> [B, heads, T, dh]
    qh = q.view(b, tq, heads, dim_head).transpose(1, 2)
    kh = k.view(b, k.shape[1], heads, dim_head).transpose(1, 2)
    vh = v.view(b, v.shape[1], heads, dim_head).transpose(1, 2)
    if mask is not None:
        if mask.ndim == 2:  # [Tq, Tk] -> [1, 1, Tq, Tk]
            mask = mask[None, None]
        elif mask.ndim == 3:  # [B, Tq, Tk] -> [B, 1, Tq, Tk]
            mask = mask[:, None]
        if mask.dtype != torch.bool:
            mask = mask.to(qh.dtype)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    # [B, heads, Tq, dh] -> [B, Tq, heads*dh]
    out = out.transpose(1, 2).reshape(b, tq, inner)
    return out.to(out_dtype)


# name -> what computes it (the UNet's CrossAttention calls ``attention`` above)
BACKENDS = {"pytorch": "torch.nn.functional.scaled_dot_product_attention"}


def check_backend(name: str | None) -> str | None:
    """``name`` if mixgraph has that attention implementation (None: the default); else a
    NotImplementedError naming it."""
    if name is not None and name not in BACKENDS:
        raise NotImplementedError(f"attention backend {name!r}: not supported yet (mixgraph has: "
                                  f"{', '.join(sorted(BACKENDS))})")
    return name


# --------------------------------------------------------------------------------------------
# OpenAI-CLIP-style transformer block (the style adapter's and the union ControlNet's)


class MultiheadSelfAttention(nn.Module):
    """``nn.MultiheadAttention``'s parameter names (in_proj_weight [3W, W], out_proj), computed
    with the shared SDPA ``attention`` so precision policies apply as everywhere else."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.upcast_attention = False
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * width))
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        qkv = nn.functional.linear(x, self.in_proj_weight.to(x.dtype), self.in_proj_bias.to(x.dtype))
        q, k, v = qkv.chunk(3, dim=-1)  # [B, N, 3W] -> 3 x [B, N, W]
        return self.out_proj(attention(q, k, v, self.heads, upcast=self.upcast_attention))


class QuickGELU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = MultiheadSelfAttention(width, heads)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(width, 4 * width))
        self.mlp.add_module("gelu", QuickGELU())
        self.mlp.add_module("c_proj", nn.Linear(4 * width, width))
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
