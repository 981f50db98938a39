"""The Swin Transformer backbone as BiRefNet uses it (ComfyUI ``comfy/background_removal/birefnet.py``,
read at comfyanonymous/ComfyUI 2974cffe): patch embedding, stages of window attention with
shifted windows every other block (ComfyUI's region mask, -100 between regions), patch merging,
and a LayerNorm on each stage's output (``norm0``..``norm3``). Returns the four feature maps
[B, C_i, H_i, W_i]. Key names follow ComfyUI's (``patch_embed``, ``layers.i.blocks.j.attn``...)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["SwinTransformer"]


def _windows(x: Tensor, ws: int) -> Tensor:
    """[B, H, W, C] -> [B * nW, ws * ws, C]"""
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def _unwindows(win: Tensor, ws: int, h: int, w: int) -> Tensor:
    """[B * nW, ws * ws, C] -> [B, H, W, C]"""
    c = win.shape[-1]
    b = win.shape[0] // ((h // ws) * (w // ws))
    x = win.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def _relative_index(ws: int) -> Tensor:
    ys, xs = torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")
    pos = torch.stack((ys.flatten(), xs.flatten()))               # [2, N]
    rel = pos[:, :, None] - pos[:, None, :] + (ws - 1)            # [2, N, N], each in 0..2ws-2
    return rel[0] * (2 * ws - 1) + rel[1]


class WindowAttention(nn.Module):
    def __init__(self, dim: int, ws: int, heads: int):
        super().__init__()
        self.heads, self.ws = heads, ws
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, heads))
        self.register_buffer("relative_position_index", _relative_index(ws))
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        bw, n, c = x.shape
        q, k, v = self.qkv(x).view(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1)             # [bw, heads, n, n]
        bias = self.relative_position_bias_table[self.relative_position_index.long().reshape(-1)]
        attn = attn + bias.view(n, n, -1).permute(2, 0, 1).to(attn.dtype).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = (attn.view(bw // nw, nw, self.heads, n, n) + mask[None, :, None]).view(bw, self.heads, n, n)
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(bw, n, c)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ws: int, shift: int, hidden: int):
        super().__init__()
        self.ws, self.shift = ws, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x: Tensor, h: int, w: int, mask: Tensor) -> Tensor:
        b, _, c = x.shape
        ws = self.ws
        y = self.norm1(x).view(b, h, w, c)
        pad_b, pad_r = (-h) % ws, (-w) % ws
        y = F.pad(y, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = h + pad_b, w + pad_r
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), dims=(1, 2))
        y = _unwindows(self.attn(_windows(y, ws), mask if self.shift else None), ws, hp, wp)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), dims=(1, 2))
        y = y[:, :h, :w].reshape(b, h * w, c)
        x = x + y
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor, h: int, w: int) -> Tensor:
        b, _, c = x.shape
        x = F.pad(x.view(b, h, w, c), (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat((x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]), -1)
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c)))


class SwinStage(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, ws: int, hidden: int, downsample: bool):
        super().__init__()
        self.ws = ws
        self.shift = ws // 2
        self.blocks = nn.ModuleList(SwinBlock(dim, heads, ws, 0 if i % 2 == 0 else ws // 2, hidden)
                                    for i in range(depth))
        self.downsample = PatchMerging(dim) if downsample else None

    def _shift_mask(self, h: int, w: int, x: Tensor) -> Tensor:
        """Swin's shifted-window mask (-100 between tokens from different regions); ComfyUI's
        region slices (0, -ws), (-ws, -shift), (-shift, None) along each axis."""
        ws, s = self.ws, self.shift
        hp, wp = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
        region = torch.zeros(1, hp, wp, 1, device=x.device, dtype=x.dtype)
        n = 0
        for hs in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
            for wsl in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
                region[:, hs, wsl] = n
                n += 1
        win = _windows(region, ws).squeeze(-1)                    # [nW, ws*ws]
        diff = win.unsqueeze(1) - win.unsqueeze(2)
        return torch.where(diff != 0, torch.full_like(diff, -100.0), torch.zeros_like(diff))

    def forward(self, x: Tensor, h: int, w: int):
        mask = self._shift_mask(h, w, x)
        for blk in self.blocks:
            x = blk(x, h, w, mask)
        if self.downsample is None:
            return x, x, h, w
        return x, self.downsample(x, h, w), (h + 1) // 2, (w + 1) // 2


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, cin: int, dim: int, norm: bool):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(cin, dim, patch, patch)
        self.norm = nn.LayerNorm(dim) if norm else None

    def forward(self, x: Tensor) -> Tensor:
        p = self.patch
        x = F.pad(x, (0, (-x.shape[3]) % p, 0, (-x.shape[2]) % p))
        x = self.proj(x)
        if self.norm is not None:
            b, c, h, w = x.shape
            x = self.norm(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(b, c, h, w)
        return x


class SwinTransformer(nn.Module):
    def __init__(self, embed_dim: int, depths, num_heads, window_size: int, mlp_hidden, patch_size: int = 4,
                 in_channels: int = 3, patch_norm: bool = True):
        super().__init__()
        self.patch_embed = PatchEmbed(patch_size, in_channels, embed_dim, patch_norm)
        n = len(depths)
        self.widths = [embed_dim * 2 ** i for i in range(n)]
        self.layers = nn.ModuleList(
            SwinStage(self.widths[i], depths[i], num_heads[i], window_size, mlp_hidden[i],
                      downsample=i < n - 1) for i in range(n))
        for i in range(n):
            self.add_module(f"norm{i}", nn.LayerNorm(self.widths[i]))

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.patch_embed(x)
        h, w = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)
        outs = []
        for i, stage in enumerate(self.layers):
            out, x, nh, nw = stage(x, h, w)
            out = getattr(self, f"norm{i}")(out)
            outs.append(out.view(-1, h, w, self.widths[i]).permute(0, 3, 1, 2).contiguous())
            h, w = nh, nw
        return outs
