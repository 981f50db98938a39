"""The MMDiT of Stable Diffusion 3 / 3.5 (Esser et al. 2024, "Scaling Rectified Flow Transformers
for High-Resolution Image Synthesis"), in the checkpoint layout of Stability's and ComfyUI's
files (attribute names = keys after ``model.diffusion_model.``).

The latent is cut into p x p patches (a strided conv, ``x_embedder.proj``) and a fixed 2-D
sin-cos position table (``pos_embed``, stored in the file for a ``pos_embed_max_size``² grid) is
cropped around its centre to the latent's patch grid. The text tokens (``context_embedder``) and
the image tokens run through ``depth`` joint blocks: each has a ``context_block`` and an
``x_block``, both modulated by the conditioning vector c = t_embedder(t) + y_embedder(pooled)
(adaLN-Zero: shift / scale / gate per sub-layer), attending jointly over [text; image] tokens.
SD3.5 adds RMS norms on q and k per head (``attn.ln_q`` / ``ln_k``) and, in SD3.5 Medium, a
second image-only self-attention in some x blocks (``x_block.attn2``, 9 modulations). The last
context block is "pre-only": its text tokens feed the last attention and are dropped after it.
The width is 64 per head with ``depth`` heads (ComfyUI's ``hidden_size = 64 * depth``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = ["MMDiTConfig", "MMDiT", "config_from_shapes", "timestep_embedding", "HEAD_WIDTH", "SIGNATURE"]

HEAD_WIDTH = 64  # ComfyUI's "magic": hidden_size = 64 * depth, num_heads = depth
MLP_RATIO = 4
TIME_FREQS = 256  # width of the sinusoidal timestep embedding
SIGNATURE = "joint_blocks.0.context_block.attn.qkv.weight"


@dataclass(frozen=True)
class MMDiTConfig:
    """Sizes of an MMDiT, all read from tensor shapes (``config_from_shapes``).

    depth: joint blocks, also the number of heads (width = 64 · depth). context_in: the text
    token width ``context_embedder`` takes (SD3: 4096, T5-XXL's; None: no embedder).
    adm_in_channels: the pooled text width ``y_embedder`` takes (SD3: 2048 = CLIP-L + CLIP-G;
    None: no vector input). pos_embed_max_size: side of the stored position grid (SD3 medium:
    192, SD3.5 large: 192). qk_norm: RMS norms on q and k (SD3.5). x_block_self_attn_layers:
    the blocks whose x block has the second self-attention (SD3.5 medium: 0..12)."""

    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    depth: int = 24
    pos_embed_max_size: int = 192
    context_in: int | None = 4096
    adm_in_channels: int | None = 2048
    qk_norm: bool = False
    x_block_self_attn_layers: tuple[int, ...] = ()

    @property
    def hidden(self) -> int:
        return HEAD_WIDTH * self.depth

    @property
    def heads(self) -> int:
        return self.depth


def _shape(info: Mapping[str, Any], key: str) -> tuple[int, ...]:
    return tuple(getattr(info[key], "shape", info[key]))


def config_from_shapes(info: Mapping[str, Any]) -> MMDiTConfig | None:
    """The config of the MMDiT whose keys (no prefix) and shapes are ``info`` (ComfyUI's
    ``model_detection`` rules), or None when the keys are not a complete MMDiT of the kind this
    module builds (no ``pos_embed``, or a context processor)."""
    needed = (SIGNATURE, "x_embedder.proj.weight", "final_layer.linear.weight", "pos_embed",
              "t_embedder.mlp.0.weight")
    if any(k not in info for k in needed) or "context_processor.layers.0.attn.qkv.weight" in info:
        return None
    proj = _shape(info, "x_embedder.proj.weight")  # [hidden, C, p, p]
    pos = _shape(info, "pos_embed")  # [1, N², hidden]
    if len(proj) != 4 or proj[0] % HEAD_WIDTH or len(pos) != 3:
        return None
    patch = proj[2]
    grid = round(math.sqrt(pos[1]))
    ctx = _shape(info, "context_embedder.weight")[1] if "context_embedder.weight" in info else None
    adm = _shape(info, "y_embedder.mlp.0.weight")[1] if "y_embedder.mlp.0.weight" in info else None
    suffix = ".x_block.attn2.qkv.weight"
    self_attn = sorted(int(k[len("joint_blocks."):-len(suffix)]) for k in info
                       if k.startswith("joint_blocks.") and k.endswith(suffix))
    out_channels = _shape(info, "final_layer.linear.weight")[0] // (patch * patch)
    return MMDiTConfig(in_channels=proj[1], out_channels=out_channels, patch_size=patch,
                       depth=proj[0] // HEAD_WIDTH, pos_embed_max_size=grid, context_in=ctx, adm_in_channels=adm,
                       qk_norm="joint_blocks.0.context_block.attn.ln_q.weight" in info,
                       x_block_self_attn_layers=tuple(self_attn))


def timestep_embedding(t: Tensor, dim: int = TIME_FREQS, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding [cos, sin] of the timesteps [N] (LDM's, which SD3 keeps); f32 [N, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]  # [N, half]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class RMSNorm(nn.Module):
    """x / rms(x) · weight over the last dim (the per-head q/k norm of SD3.5)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SelfAttention(nn.Module):
    """The q/k/v projection (one Linear) with optional per-head q/k RMS norms, and the output
    projection (absent in a pre-only block)."""

    def __init__(self, dim: int, heads: int, pre_only: bool = False, qk_norm: bool = False):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        if not pre_only:
            self.proj = nn.Linear(dim, dim)
        if qk_norm:
            self.ln_q = RMSNorm(dim // heads)
            self.ln_k = RMSNorm(dim // heads)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, L, D] -> q, k, v [B, L, D] (q and k normed per head when the block has norms)."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).unbind(2)  # [B, L, H, d] each
        if hasattr(self, "ln_q"):
            q, k = self.ln_q(q), self.ln_k(k)
        return q.reshape(b, n, d), k.reshape(b, n, d), v.reshape(b, n, d)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DismantledBlock(nn.Module):
    """One stream (text or image) of a joint block: adaLN-Zero around the joint attention and
    the MLP. ``pre_only``: only the attention input (the last text block); ``self_attn``: the
    SD3.5-medium second, image-only attention (``attn2``)."""

    def __init__(self, dim: int, heads: int, pre_only: bool = False, qk_norm: bool = False,
                 self_attn: bool = False):
        super().__init__()
        self.pre_only, self.self_attn = pre_only, self_attn
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim, heads, pre_only, qk_norm)
        if self_attn:
            self.attn2 = SelfAttention(dim, heads, False, qk_norm)
        if not pre_only:
            self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
            self.mlp = Mlp(dim, dim * MLP_RATIO)
        mods = 9 if self_attn else 2 if pre_only else 6
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, mods * dim))

    def pre_attention(self, x: Tensor, c: Tensor):
        """(q, k, v) for the joint attention, (q, k, v) of ``attn2`` or None, and the
        modulations the rest of the block uses."""
        mods = self.adaLN_modulation(c).chunk(9 if self.self_attn else 2 if self.pre_only else 6, dim=1)
        h = self.norm1(x)
        qkv = self.attn.project(modulate(h, mods[0], mods[1]))
        qkv2 = self.attn2.project(modulate(h, mods[6], mods[7])) if self.self_attn else None
        return qkv, qkv2, mods

    def post_attention(self, x: Tensor, attn: Tensor, attn2: Tensor | None, mods) -> Tensor:
        _, _, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods[:6]
        x = x + gate_msa[:, None] * self.attn.proj(attn)
        if attn2 is not None:
            x = x + mods[8][:, None] * self.attn2.proj(attn2)
        return x + gate_mlp[:, None] * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class JointBlock(nn.Module):
    """Text and image streams attending jointly over the [text; image] tokens."""

    def __init__(self, dim: int, heads: int, pre_only: bool, qk_norm: bool, self_attn: bool):
        super().__init__()
        self.heads = heads
        self.context_block = DismantledBlock(dim, heads, pre_only=pre_only, qk_norm=qk_norm)
        self.x_block = DismantledBlock(dim, heads, qk_norm=qk_norm, self_attn=self_attn)

    def forward(self, context: Tensor, x: Tensor, c: Tensor) -> tuple[Tensor | None, Tensor]:
        ctx_qkv, _, ctx_mods = self.context_block.pre_attention(context, c)
        x_qkv, x_qkv2, x_mods = self.x_block.pre_attention(x, c)
        q, k, v = (torch.cat((a, b), dim=1) for a, b in zip(ctx_qkv, x_qkv))  # [B, T + N, D] each
        joint = attention(q, k, v, self.heads)
        n_ctx = context.shape[1]
        attn2 = attention(*x_qkv2, self.heads) if x_qkv2 is not None else None
        x = self.x_block.post_attention(x, joint[:, n_ctx:], attn2, x_mods)
        if self.context_block.pre_only:
            return None, x
        return self.context_block.post_attention(context, joint[:, :n_ctx], None, ctx_mods), x


class PatchEmbed(nn.Module):
    """p x p patches -> tokens (a strided conv); sides not divisible by p are padded circularly
    (ComfyUI's ``pad_to_patch_size``)."""

    def __init__(self, channels: int, dim: int, patch: int):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        pad_h, pad_w = (-h) % self.patch, (-w) % self.patch
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h), mode="circular")
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, D, gh, gw] -> [B, gh·gw, D]


class TimestepEmbedder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIME_FREQS, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, TIME_FREQS))


class VectorEmbedder(nn.Module):
    def __init__(self, width: int, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, y: Tensor) -> Tensor:
        return self.mlp(y)


class FinalLayer(nn.Module):
    def __init__(self, dim: int, patch: int, channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch * patch * channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class MMDiT(nn.Module):
    """x [B, C, H, W], timesteps [B] (σ·1000), context [B, T, context_in], y [B, adm] or None
    -> velocity [B, C, H, W]. ``skip``: indices of joint blocks to leave out (skip-layer
    guidance: a skipped block passes text and image tokens through unchanged). ``control``:
    ControlNet residuals [B, N, D], entry i added to the image tokens after joint block i (also
    after a skipped one, as ComfyUI)."""

    # the conditioning embedders, the position table and the q/k norm weights stay f32 (small, and
    # feed every block; fp8 would round the per-head norm scales)
    keep_f32: tuple[str, ...] = ("t_embedder", "y_embedder", "pos_embed", "*.ln_q", "*.ln_k")
    keep_f32_inputs: tuple[str, ...] = ("timesteps", "y")

    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        self.x_embedder = PatchEmbed(cfg.in_channels, d, cfg.patch_size)
        self.t_embedder = TimestepEmbedder(d)
        if cfg.adm_in_channels is not None:
            self.y_embedder = VectorEmbedder(cfg.adm_in_channels, d)
        self.context_embedder = nn.Linear(cfg.context_in, d) if cfg.context_in is not None else nn.Identity()
        self.register_buffer("pos_embed", torch.zeros(1, cfg.pos_embed_max_size ** 2, d))
        layers = set(cfg.x_block_self_attn_layers)
        self.joint_blocks = nn.ModuleList(
            JointBlock(d, cfg.heads, pre_only=i == cfg.depth - 1, qk_norm=cfg.qk_norm, self_attn=i in layers)
            for i in range(cfg.depth))
        self.final_layer = FinalLayer(d, cfg.patch_size, cfg.out_channels)

    def cropped_pos_embed(self, gh: int, gw: int) -> Tensor:
        """The centre gh x gw of the stored position grid, [1, gh·gw, D]."""
        n = self.cfg.pos_embed_max_size
        if gh > n or gw > n:
            raise ValueError(f"SD3: a {gh}x{gw} patch grid is larger than the model's {n}x{n} position table "
                             f"(at most {n * self.cfg.patch_size * 8} px a side)")
        top, left = (n - gh) // 2, (n - gw) // 2
        grid = self.pos_embed.reshape(1, n, n, -1)[:, top:top + gh, left:left + gw]  # [1, gh, gw, D]
        return grid.reshape(1, gh * gw, -1)

    def forward(self, x: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None = None,
                skip: Collection[int] = (), control: Sequence[Tensor | None] = ()) -> Tensor:
        b, _, h, w = x.shape
        p = self.cfg.patch_size
        gh, gw = -(-h // p), -(-w // p)
        img = self.x_embedder(x)
        img = img + self.cropped_pos_embed(gh, gw).to(img.dtype)
        c = self.t_embedder(timesteps)  # [B, D]
        if y is not None and hasattr(self, "y_embedder"):
            c = c + self.y_embedder(y)
        txt = self.context_embedder(context)
        for i, block in enumerate(self.joint_blocks):
            if i not in skip:
                new_txt, img = block(txt, img, c)
                txt = txt if new_txt is None else new_txt
            if i < len(control) and control[i] is not None:  # ControlNet residual i (ComfyUI's control["output"])
                img = img + control[i].to(img.dtype)
        out = self.final_layer(img, c)  # [B, gh·gw, p·p·C]
        out = out.reshape(b, gh, gw, p, p, self.cfg.out_channels)
        out = torch.einsum("nhwpqc->nchpwq", out).reshape(b, self.cfg.out_channels, gh * p, gw * p)
        return out[:, :, :h, :w]
