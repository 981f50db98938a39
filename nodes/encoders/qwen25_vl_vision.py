"""Qwen2.5-VL's vision tower (Bai et al. 2025, arXiv:2502.13923; ComfyUI's
``Qwen2VLVisionTransformer``, ``comfy/text_encoders/qwen_vl.py``; transformers'
``Qwen2_5_VisionTransformerPretrainedModel``), the ``visual.*`` keys of ComfyUI's
``qwen_2.5_vl_7b`` file, and the image preprocessing ComfyUI does before it
(``process_qwen2vl_images``).

A ViT over 14x14 patches of 2 frames (an image is repeated along time): RMS-normed blocks with 2-D
RoPE (each head's first half rotates by the patch row, the second by its column), attention within
112-pixel windows except in the full-attention blocks (7, 15, 23, 31), a SiLU-gated MLP with biases;
then the merger (2x2 patches normed, concatenated, a GELU MLP to the language model's width) and
the tokens put back in row-major order of the merged grid. Sizes from shapes; heads from the
constant head_dim 80 (1280 / 16).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.decoder_llm import RMSNorm, count_layers

__all__ = ["VisionConfig", "VisionTower", "vision_config", "preprocess_image", "VISION_HEAD_DIM", "IMAGE_MEAN",
           "IMAGE_STD", "FULL_ATTENTION_BLOCKS"]

VISION_HEAD_DIM = 80  # Qwen2.5-VL's ViT: 1280 wide, 16 heads
FULL_ATTENTION_BLOCKS = (7, 15, 23, 31)  # ComfyUI's / transformers' fullatt_block_indexes
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # the OpenAI CLIP statistics Qwen2-VL normalises with
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's sizes from shapes (heads from the constant head_dim 80)."""

    hidden: int
    out_hidden: int
    depth: int
    heads: int
    intermediate: int
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2
    window: int = 112
    in_channels: int = 3
    full_attention: tuple[int, ...] = FULL_ATTENTION_BLOCKS


def vision_config(shapes: Mapping[str, tuple[int, ...]], prefix: str = "visual.") -> VisionConfig | None:
    """The vision tower's config from key -> shape, or None when the file has no tower."""
    patch = shapes.get(prefix + "patch_embed.proj.weight")
    if patch is None:
        return None
    hidden, channels, temporal, ph, _ = (int(n) for n in patch)
    merged = int(shapes[prefix + "merger.mlp.0.weight"][1])
    merge = math.isqrt(merged // hidden)
    if hidden % VISION_HEAD_DIM or merge * merge * hidden != merged:
        raise ValueError(f"Qwen2.5-VL vision tower: width {hidden} / merger input {merged} do not fit "
                         f"head_dim {VISION_HEAD_DIM} and a square patch merge")
    return VisionConfig(hidden=hidden, out_hidden=int(shapes[prefix + "merger.mlp.2.weight"][0]),
                        depth=count_layers(shapes, prefix + "blocks."), heads=hidden // VISION_HEAD_DIM,
                        intermediate=int(shapes[prefix + "blocks.0.mlp.gate_proj.weight"][0]), patch=ph,
                        temporal_patch=temporal, merge=merge, in_channels=channels)



def preprocess_image(pixels: Tensor, cfg: VisionConfig, min_pixels: int = 3136,
                     max_pixels: int = 12845056) -> tuple[Tensor, tuple[int, int, int]]:
    """IMAGE [N, H, W, 3] -> the first image's patches [t*h*w, C*2*p*p] (in 2x2 merge order)
    and its grid (t, h, w) in patches: resized (bilinear) to multiples of 28 between min and max
    pixels, normalised by CLIP's mean / std, repeated over the 2 frames of a temporal patch
    (ComfyUI's ``process_qwen2vl_images``)."""
    if pixels.ndim != 4 or pixels.shape[-1] < 3:
        raise ValueError(f"Qwen2.5-VL image: expected IMAGE [N, H, W, 3], got {tuple(pixels.shape)}")
    _, height, width, _ = pixels.shape
    p, m, tp = cfg.patch, cfg.merge, cfg.temporal_patch
    factor = p * m
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    img = pixels[:1, :, :, :3].float().movedim(-1, 1)  # [1, 3, H, W]
    img = F.interpolate(img, size=(h_bar, w_bar), mode="bilinear", align_corners=False)[0]  # [3, h, w]
    mean = torch.tensor(IMAGE_MEAN, dtype=img.dtype)[:, None, None]
    std = torch.tensor(IMAGE_STD, dtype=img.dtype)[:, None, None]
    img = (img - mean) / std
    gh, gw = h_bar // p, w_bar // p
    frames = img[None].expand(tp, -1, -1, -1)  # [tp, 3, h, w]
    patches = frames.reshape(1, tp, 3, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [t, gh/m, gw/m, m, m, 3, tp, p, p]
    return patches.reshape(gh * gw, 3 * tp * p * p), (1, gh, gw)


class PatchEmbed(nn.Module):
    """A Conv3d with stride = kernel (2 x 14 x 14): one linear map per patch."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        k = (cfg.temporal_patch, cfg.patch, cfg.patch)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden, kernel_size=k, stride=k, bias=False)

    def forward(self, patches: Tensor) -> Tensor:
        w = self.proj.weight  # kept as stored by the precision layer (no cast Conv3d there)
        dtype = w.dtype if w.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32
        return patches.to(dtype) @ w.to(dtype).reshape(w.shape[0], -1).t()  # [P, C*t*p*p] -> [P, hidden]


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=True)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=True)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bounds: list[int]) -> Tensor:
        n, d = x.shape
        q, k, v = self.qkv(x).view(n, 3, self.heads, d // self.heads).unbind(1)  # each [P, H, hd]
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)  # cos [P, 1, hd]; rotated in f32
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):  # attention within each window (or the whole image)
            qs, ks, vs = (z[a:b].transpose(0, 1) for z in (q, k, v))  # [H, L, hd]
            out.append(F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1).reshape(b - a, d))
        return self.proj(torch.cat(out))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=True)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden, 1e-6)
        self.attn = VisionAttention(cfg)
        self.norm2 = RMSNorm(cfg.hidden, 1e-6)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bounds: list[int]) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Each merge x merge group of patches: RMS-normed, concatenated, GELU MLP to the LM width."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.width = cfg.hidden * cfg.merge * cfg.merge
        self.ln_q = RMSNorm(cfg.hidden, 1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, cfg.out_hidden))

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(self.ln_q(x).reshape(-1, self.width))  # [P, hidden] -> [P/m^2, m^2*hidden] -> [P/m^2, out]


class VisionTower(nn.Module):
    """``forward(patches [P, C*t*p*p], grid (t, h, w)) -> tokens [P / merge^2, out_hidden]`` in
    row-major order of the merged grid."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)

    def windows(self, grid: tuple[int, int, int]) -> tuple[Tensor, list[int]]:
        """The merged-token order that groups each window (window x window pixels) together and
        the window bounds in patches (transformers' ``get_window_index``, empty windows skipped)."""
        t, h, w = grid
        m = self.cfg.merge
        size = self.cfg.window // m // self.cfg.patch  # merged tokens per window side
        lh, lw = h // m, w // m
        index = torch.arange(t * lh * lw).reshape(t, lh, lw)
        order, bounds = [], [0]
        for f in range(t):
            for r in range(0, lh, size):
                for c in range(0, lw, size):
                    win = index[f, r:r + size, c:c + size].reshape(-1)
                    order.append(win)
                    bounds.append(bounds[-1] + win.numel() * m * m)
        return torch.cat(order), bounds

    def rotary(self, grid: tuple[int, int, int]) -> Tensor:
        """[P, head_dim / 2] angles: the patch's row then column, each over head_dim / 4 pairs,
        patches listed in 2x2 merge order."""
        t, h, w = grid
        m = self.cfg.merge
        dim = self.cfg.hidden // self.cfg.heads // 2
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        rows = torch.arange(h)[:, None].expand(h, w).reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).reshape(-1)
        cols = torch.arange(w)[None].expand(h, w).reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).reshape(-1)
        pos = torch.stack([rows, cols], dim=-1).repeat(t, 1)  # [P, 2]
        return (pos[..., None].float() * inv_freq).reshape(pos.shape[0], -1)  # [P, 2, dim/2] -> [P, dim]

    def forward(self, patches: Tensor, grid: tuple[int, int, int]) -> Tensor:
        unit = self.cfg.merge ** 2
        x = self.patch_embed(patches)  # [P, hidden]
        p = x.shape[0]
        order, window_bounds = self.windows(grid)
        x = x.view(p // unit, unit, -1)[order].reshape(p, -1)  # patches grouped by window
        angles = self.rotary(grid).to(x.device)
        angles = angles.view(p // unit, unit, -1)[order.to(x.device)].reshape(p, -1)
        emb = torch.cat((angles, angles), dim=-1)[:, None]  # [P, 1, head_dim]
        cos, sin = emb.cos(), emb.sin()
        full = [0] + [grid[1] * grid[2] * (f + 1) for f in range(grid[0])]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full if i in self.cfg.full_attention else window_bounds)
        merged = self.merger(x)  # [P / unit, out] in window order
        return merged[torch.argsort(order).to(merged.device)]  # back to row-major order
