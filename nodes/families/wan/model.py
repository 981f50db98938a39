"""The Wan video DiT (Wan 2.1 / 2.2, Alibaba 2025, "Wan: Open and Advanced Large-Scale Video
Generative Models"), in the key layout of the released files and ComfyUI's (attribute names = keys
after ``model.diffusion_model.``).

A video latent [B, C, T, H, W] is cut into 1x2x2 patches (``patch_embedding``, a strided Conv3d
run in f32 as in the reference) and the tokens run through ``num_layers`` blocks. Each block:
self-attention with q / k RMS norms across the heads and a 3-D rotary embedding over the token's
(frame, row, column) position; cross-attention to the text tokens (``text_embedding``: umT5-XXL's
4096-wide states) and, for image-to-video models, to CLIP-vision image tokens through their own
k / v (``k_img`` / ``v_img``; ``img_emb`` projects ViT-H's 1280-wide penultimate states, plus a
learned position table ``emb_pos`` in first-last-frame models); a GELU MLP. The timestep drives
six shift / scale / gate vectors per block (``time_projection`` plus each block's learned
``modulation``) and two in the output ``head``. Wan 2.2's 5B model takes one timestep per latent
frame (its first frame is the given image, at t = 0): the modulation is then per frame and
repeated over the frame's tokens.

Head width is 128 (ComfyUI's ``num_heads = dim // 128``). The RoPE splits it into
d − 4·(d // 6) frequencies for time and 2·(d // 6) each for rows and columns (base 10000).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = ["WanConfig", "WanModel", "HEAD_WIDTH", "sinusoidal_embedding", "rope_table", "apply_rope",
           "unpatchify", "PATCH"]

HEAD_WIDTH = 128
PATCH = (1, 2, 2)  # (t, h, w): every released Wan model
ROPE_THETA = 10000.0
CLIP_WIDTH = 1280  # ViT-H/14 penultimate states (ComfyUI's MLPProj in_dim)


@dataclass(frozen=True)
class WanConfig:
    """Sizes of a Wan DiT, read from tensor shapes (``detect.wan_config``).

    in_dim / out_dim: latent channels in / out (t2v 16 / 16; i2v 36 = 16 latent + 4 mask + 16
    image latent; Wan 2.2 5B 48 / 48). dim: width (1.3B 1536, 5B 3072, 14B 5120); heads = dim //
    128. ffn_dim: MLP width. text_dim: text-token width (umT5-XXL: 4096). image: cross-attention
    to CLIP image tokens (``img_emb``, ``k_img`` / ``v_img``: i2v / flf2v). image_dim: their width
    (1280). flf_tokens: ``img_emb.emb_pos`` length (first-last-frame models: 514), or None.
    vace_layers: the main blocks that get a VACE hint, one per ``vace_blocks`` entry (ComfyUI:
    every ``num_layers // vace_count``-th block), () without VACE; vace_in_dim: its input channels."""

    in_dim: int = 16
    out_dim: int = 16
    dim: int = 1536
    ffn_dim: int = 8960
    num_layers: int = 30
    text_dim: int = 4096
    freq_dim: int = 256
    image: bool = False
    image_dim: int = CLIP_WIDTH
    flf_tokens: int | None = None
    eps: float = 1e-6
    vace_layers: tuple[int, ...] = ()
    vace_in_dim: int = 0

    @property
    def heads(self) -> int:
        return max(1, self.dim // HEAD_WIDTH)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def rope_axes(self) -> tuple[int, int, int]:
        d = self.head_dim
        return (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))


# ---------------------------------------------------------------------------------------------
# embeddings


def sinusoidal_embedding(t: Tensor, dim: int) -> Tensor:
    """[N] timesteps -> [N, dim] (cos first, then sin; frequencies 10000^(−i / (dim/2))), in f32."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float32, device=t.device).div(half))
    args = torch.outer(t.float(), freqs)  # [N, half]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


def rope_table(frames: int, rows: int, cols: int, axes: tuple[int, int, int], device=None) -> tuple[Tensor, Tensor]:
    """(cos, sin) [L, head_dim / 2] for the L = frames·rows·cols tokens in (t, h, w) order: one
    rotation angle per pair of head channels, the pairs split over the three axes (``axes``)."""
    grids = torch.meshgrid(torch.arange(frames, dtype=torch.float64, device=device),
                           torch.arange(rows, dtype=torch.float64, device=device),
                           torch.arange(cols, dtype=torch.float64, device=device), indexing="ij")
    angles = []
    for pos, width in zip(grids, axes):
        omega = 1.0 / ROPE_THETA ** (torch.arange(0, width, 2, dtype=torch.float64, device=device) / width)
        angles.append(pos.reshape(-1, 1) * omega)  # [L, width / 2]
    a = torch.cat(angles, dim=1)  # [L, head_dim / 2]
    return torch.cos(a).float(), torch.sin(a).float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate consecutive channel pairs (x0, x1) of x [B, L, heads, d] by the table's angles."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, L, heads, d/2, 2]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None], sin[None, :, None]  # [1, L, 1, d/2]
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
    return out.flatten(-2).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm over the last dim with a learned scale (Wan's q / k norms across all heads),
    computed in f32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# blocks


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        b, n, d = x.shape
        q = apply_rope(self.norm_q(self.q(x)).view(b, n, self.heads, -1), *rope)  # [B, L, heads, hd]
        k = apply_rope(self.norm_k(self.k(x)).view(b, n, self.heads, -1), *rope)
        out = attention(q.reshape(b, n, d), k.reshape(b, n, d), self.v(x), self.heads)
        return self.o(out)


class CrossAttention(nn.Module):
    """Attention to the text tokens; with ``image``, also to the image tokens through ``k_img`` /
    ``v_img``, the two results summed."""

    def __init__(self, dim: int, heads: int, eps: float, image: bool):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)
        if image:
            self.k_img, self.v_img = nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.norm_k_img = RMSNorm(dim, eps)

    def forward(self, x: Tensor, text: Tensor, image: Tensor | None) -> Tensor:
        q = self.norm_q(self.q(x))
        out = attention(q, self.norm_k(self.k(text)), self.v(text), self.heads)
        if image is not None and hasattr(self, "k_img"):
            out = out + attention(q, self.norm_k_img(self.k_img(image)), self.v_img(image), self.heads)
        return self.o(out)


def per_token(mod: Tensor, tokens: int) -> Tensor:
    """A modulation vector [B, F, dim] (F = 1, or one per latent frame) -> broadcastable over
    [B, tokens, dim]: each frame's vector repeated over that frame's tokens."""
    if mod.shape[1] == 1:
        return mod
    return mod.repeat_interleave(tokens // mod.shape[1], dim=1)  # [B, L, dim]


def modulate(norm_x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return (norm_x.float() * (1 + scale) + shift).to(norm_x.dtype)


class WanBlock(nn.Module):
    """One Wan block (adaLN: shift / scale / gate from the timestep for self-attention and MLP;
    the cross-attention behind an affine LayerNorm ``norm3``, unmodulated)."""

    def __init__(self, c: WanConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(c.dim, c.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(c.dim, c.heads, c.eps)
        self.norm3 = nn.LayerNorm(c.dim, c.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(c.dim, c.heads, c.eps, c.image)
        self.norm2 = nn.LayerNorm(c.dim, c.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(c.dim, c.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(c.ffn_dim, c.dim))
        self.modulation = nn.Parameter(torch.zeros(1, 6, c.dim))

    def forward(self, x: Tensor, e: Tensor, rope, text: Tensor, image: Tensor | None) -> Tensor:
        """x [B, L, dim]; e [B, F, 6, dim] (f32) the timestep's six vectors per frame group; text /
        image: the embedded text and image tokens (image None: none)."""
        L = x.shape[1]
        mods = (self.modulation.float().unsqueeze(0) + e).unbind(2)  # 6 x [B, F, dim]
        shift1, scale1, gate1, shift2, scale2, gate2 = (per_token(m, L) for m in mods)
        y = self.self_attn(modulate(self.norm1(x), shift1, scale1), rope)
        x = (x.float() + y.float() * gate1).to(x.dtype)
        x = x + self.cross_attn(self.norm3(x), text, image)
        y = self.ffn(modulate(self.norm2(x), shift2, scale2))
        return (x.float() + y.float() * gate2).to(x.dtype)


class VaceBlock(WanBlock):
    """A VACE block: a Wan block over the hint tokens; the first adds the projected hint to the
    video tokens (``before_proj``), each gives its hint for one main block (``after_proj``)."""

    def __init__(self, c: WanConfig, index: int):
        super().__init__(replace(c, image=False))  # text-only cross-attention, as ComfyUI builds them
        if index == 0:
            self.before_proj = nn.Linear(c.dim, c.dim)
        self.after_proj = nn.Linear(c.dim, c.dim)

    def forward_hint(self, c: Tensor, x: Tensor, e: Tensor, rope, text: Tensor):
        if hasattr(self, "before_proj"):
            c = self.before_proj(c) + x
        c = super().forward(c, e, rope, text, None)
        return self.after_proj(c), c


class Head(nn.Module):
    def __init__(self, c: WanConfig):
        super().__init__()
        self.norm = nn.LayerNorm(c.dim, c.eps, elementwise_affine=False)
        self.head = nn.Linear(c.dim, c.out_dim * math.prod(PATCH))
        self.modulation = nn.Parameter(torch.zeros(1, 2, c.dim))

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        """e [B, F, dim] (f32): the time embedding per frame group."""
        shift, scale = (self.modulation.float().unsqueeze(0) + e.unsqueeze(2)).unbind(2)  # [B, F, dim]
        L = x.shape[1]
        return self.head(modulate(self.norm(x), per_token(shift, L), per_token(scale, L)))


class ImageProjection(nn.Module):
    """CLIP-vision tokens -> the model's width (ComfyUI's MLPProj: LN, Linear, GELU, Linear, LN);
    first-last-frame models add ``emb_pos`` to the (two images') tokens first."""

    def __init__(self, c: WanConfig):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(c.image_dim), nn.Linear(c.image_dim, c.image_dim), nn.GELU(),
                                  nn.Linear(c.image_dim, c.dim), nn.LayerNorm(c.dim))
        if c.flf_tokens is not None:
            self.emb_pos = nn.Parameter(torch.zeros(1, c.flf_tokens, c.image_dim))

    def forward(self, clip: Tensor) -> Tensor:
        if hasattr(self, "emb_pos"):
            n = self.emb_pos.shape[1]
            clip = clip[:, :n] + self.emb_pos[:, :clip.shape[1]].to(clip.dtype)
        return self.proj(clip)


def unpatchify(tokens: Tensor, grid: tuple[int, int, int], channels: int) -> Tensor:
    """[B, f·h·w, pt·ph·pw·C] -> [B, C, f·pt, h·ph, w·pw]."""
    b = tokens.shape[0]
    f, h, w = grid
    pt, ph, pw = PATCH
    u = tokens[:, :f * h * w].reshape(b, f, h, w, pt, ph, pw, channels)
    u = torch.einsum("bfhwpqrc->bcfphqwr", u)
    return u.reshape(b, channels, f * pt, h * ph, w * pw)


# ---------------------------------------------------------------------------------------------
# the model


class WanModel(nn.Module):
    """x [B, in_dim, T, H, W] (latent + any concat channels), timestep [B] (σ·1000) or [B, T]
    (Wan 2.2 5B: one per latent frame), context [B, N, text_dim], clip_fea [B, M, 1280] (i2v) ->
    velocity [B, out_dim, T, H, W]. ``vace`` (VACE models): a list of (hint latent
    [B, vace_in_dim, T, H, W], strength)."""

    # The timestep path runs once per step on one vector per frame: f32 keeps σ·1000 exact under
    # half storage (ComfyUI computes it in the model dtype; Wan's reference in f32). The patch
    # embedding is a Conv3d the precision layer does not cast: it stays f32, as in ComfyUI.
    keep_f32: tuple[str, ...] = ("time_embedding", "time_projection", "patch_embedding", "vace_patch_embedding")
    keep_f32_inputs: tuple[str, ...] = ("timestep",)

    def __init__(self, config: WanConfig):
        super().__init__()
        c = self.config = config
        self.patch_embedding = nn.Conv3d(c.in_dim, c.dim, kernel_size=PATCH, stride=PATCH)
        self.text_embedding = nn.Sequential(nn.Linear(c.text_dim, c.dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(c.dim, c.dim))
        self.time_embedding = nn.Sequential(nn.Linear(c.freq_dim, c.dim), nn.SiLU(), nn.Linear(c.dim, c.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(c.dim, c.dim * 6))
        self.blocks = nn.ModuleList(WanBlock(c) for _ in range(c.num_layers))
        self.head = Head(c)
        if c.image:
            self.img_emb = ImageProjection(c)
        if c.vace_layers:
            self.vace_patch_embedding = nn.Conv3d(c.vace_in_dim, c.dim, kernel_size=PATCH, stride=PATCH)
            self.vace_blocks = nn.ModuleList(VaceBlock(c, i) for i in range(len(c.vace_layers)))

    def embed(self, conv: nn.Conv3d, x: Tensor) -> Tensor:
        """Patch embedding in f32: [B, C, T, H, W] -> [B, f·h·w, dim] in x's dtype."""
        w = conv.weight
        out = F.conv3d(x.float(), w.float(), None if conv.bias is None else conv.bias.float(), stride=PATCH)
        return out.flatten(2).transpose(1, 2).to(x.dtype)

    def forward(self, x: Tensor, timestep: Tensor, context: Tensor, clip_fea: Tensor | None = None,
                vace: list | None = None) -> Tensor:
        c = self.config
        b, _, t, h, w = x.shape
        pad = [0, (-w) % PATCH[2], 0, (-h) % PATCH[1], 0, (-t) % PATCH[0]]
        if any(pad):
            x = F.pad(x, pad, mode="circular")  # ComfyUI's pad_to_patch_size
        grid = (x.shape[2] // PATCH[0], x.shape[3] // PATCH[1], x.shape[4] // PATCH[2])
        tokens = self.embed(self.patch_embedding, x)  # [B, L, dim]
        rope = rope_table(*grid, c.rope_axes, device=x.device)

        ts = timestep.float().reshape(b, -1)  # [B, 1] or [B, F]
        e = self.time_embedding(sinusoidal_embedding(ts.flatten(), c.freq_dim)).float()
        e = e.reshape(b, ts.shape[1], c.dim)  # [B, F, dim]
        e0 = self.time_projection(e).float().unflatten(2, (6, c.dim))  # [B, F, 6, dim]

        text = self.text_embedding(context)
        image = None
        if c.image:
            # without a CLIP vision output ComfyUI's image cross-attention reads the text tokens
            # (its context_img_len None slices the whole context): the same here
            image = text if clip_fea is None else self.img_emb(clip_fea.to(text.dtype))

        hints = self.vace_hints(vace, tokens, e0, rope, text) if vace else {}
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, e0, rope, text, image)
            for hint, strength in hints.get(i, ()):
                tokens = tokens + hint * strength
        out = self.head(tokens, e)
        return unpatchify(out, grid, c.out_dim)[:, :, :t, :h, :w]

    def vace_hints(self, vace: list, tokens: Tensor, e0: Tensor, rope, text: Tensor) -> dict:
        """block index -> [(hint tokens, strength)] for each VACE input (ComfyUI adds every
        input's hint after the block its VACE block serves)."""
        c = self.config
        if not c.vace_layers:
            raise ValueError("VACE conditioning (WanVaceToVideo) on a Wan model without VACE blocks")
        out: dict[int, list] = {}
        for frames, strength in vace:
            hint = self.embed(self.vace_patch_embedding, frames.to(tokens.dtype))
            hint = hint[:, :tokens.shape[1]]
            for i, block in enumerate(self.vace_blocks):
                skip, hint = block.forward_hint(hint, tokens, e0, rope, text)
                out.setdefault(c.vace_layers[i], []).append((skip, float(strength)))
        return out
