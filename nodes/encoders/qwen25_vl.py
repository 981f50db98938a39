"""Qwen2.5-VL as a text encoder (Bai et al. 2025, "Qwen2.5-VL Technical Report", arXiv:2502.13923):
Qwen-Image's ``qwen_2.5_vl_7b(_fp8_scaled).safetensors`` (ComfyUI's ``Qwen25_7BVLI``,
``comfy/text_encoders/llama.py``, ``qwen_vl.py``).

Attribute names equal the file's keys: the language model under ``model.`` (``embed_tokens``,
``layers.N.self_attn.{q,k,v,o}_proj``, ``norm``) and the vision tower under ``visual.``
(``patch_embed.proj``, ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.*}``, ``merger.ln_q``,
``merger.mlp.{0,2}``). A ``lm_head.weight`` is not used.

The language model is a Qwen2 decoder: pre-norm attention with biased q/k/v, no q/k norms,
grouped-query heads, SiLU-gated MLP, RMS norms (eps 1e-6). Sizes come from shapes; head_dim is the
family's constant 128 (shapes give only heads * head_dim), RoPE theta 1e6. Positions are M-RoPE
(``mrope_section`` (16, 24, 24) of head_dim / 2 frequency pairs take the temporal, height and
width position): a text token has one position on all three axes, which is plain RoPE; the
tokens of an image take (start, start + row, start + column) and the text after it resumes at
``start + max(rows, columns)`` (ComfyUI's ``Qwen25_7BVLI.forward``, transformers'
``get_rope_index``).

The vision tower (``VisionTower``): 14x14 patches over 2 frames (an image is repeated along
time), 32 blocks of RMS-normed attention (2-D RoPE over the patch row and column, window
attention over 112-pixel windows except in blocks 7, 15, 23, 31, which attend over the whole
image) and a SiLU-gated MLP with biases, then the merger: each 2x2 group of patches normed,
concatenated and projected by a GELU MLP to the language model's width. Its head_dim is the
constant 80 (1280 / 16 heads). An image's tokens replace its one ``<|image_pad|>`` token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.decoder_llm import (DecoderAttention, DecoderShape, DecoderTextEncoder, GatedMLP,
                                                 RMSNorm, causal_padding_mask, count_layers, padding_mask,
                                                 resolve_layer, shape_from)
from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule

__all__ = ["VisionConfig", "Qwen25VLConfig", "Qwen25VLTextModel", "VisionTower", "ImageEmbed", "is_qwen25",
           "qwen25_vl_config", "vision_config", "preprocess_image", "mrope_positions", "mrope_cos_sin",
           "HEAD_DIM", "VISION_HEAD_DIM"]

HEAD_DIM = 128  # every Qwen2.5 language model
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


@dataclass(frozen=True)
class Qwen25VLConfig:
    shape: DecoderShape
    vision: VisionConfig | None = None
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6
    mrope_section: tuple[int, int, int] = (16, 24, 24)


def is_qwen25(keys, prefix: str = "") -> bool:
    """A Qwen2 / Qwen2.5 decoder: biased q/k/v projections and no q/k norms (Qwen3 has them) nor
    Gemma's feed-forward norms (ComfyUI's ``detect_te_model``: the ``k_proj.bias``)."""
    p = prefix + "model.layers.0."
    return (p + "self_attn.k_proj.bias" in keys and p + "self_attn.q_norm.weight" not in keys
            and p + "post_feedforward_layernorm.weight" not in keys and prefix + "model.embed_tokens.weight" in keys)


def _mrope_section(head_dim: int) -> tuple[int, int, int]:
    """(16, 24, 24) for head_dim 128, scaled alike for the narrower heads of test models."""
    if head_dim % 16:
        raise ValueError(f"Qwen2.5-VL head_dim {head_dim}: M-RoPE needs a multiple of 16")
    return head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16


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


def qwen25_vl_config(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> Qwen25VLConfig:
    """The config from key -> shape (language model under ``model.``, vision tower under ``visual.``)."""
    shape = shape_from(shapes, prefix, HEAD_DIM)
    return Qwen25VLConfig(shape, vision_config(shapes, prefix + "visual."), mrope_section=_mrope_section(HEAD_DIM))


# --------------------------------------------------------------------------------------------
# the language model


def mrope_cos_sin(positions: Tensor, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """positions [N, 3, T] (temporal, height, width) -> cos, sin [N, 1, T, head_dim] (float32):
    frequency pair i takes the axis its ``section`` slice names, in both halves of head_dim."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [N, 3, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, 3, T, hd]
    pieces = emb.split(list(section) * 2, dim=-1)
    picked = torch.cat([piece[:, i % 3] for i, piece in enumerate(pieces)], dim=-1)  # [N, T, hd]
    return picked.cos()[:, None], picked.sin()[:, None]


def mrope_positions(length: int, images: Sequence[tuple[int, int, int]]) -> Tensor:
    """[3, length] M-RoPE positions of a row whose images sit at (start index, merged rows,
    merged columns), in order (ComfyUI's ``Qwen25_7BVLI.forward``)."""
    pos = torch.arange(length).expand(3, length).clone()  # [3, T]
    offset = 0  # position minus index, after the images so far
    for start, rows, cols in images:
        end = start + rows * cols
        base = start + offset
        pos[0, start:end] = base
        pos[1, start:end] = base + torch.arange(rows).repeat_interleave(cols)
        pos[2, start:end] = base + torch.arange(cols).repeat(rows)
        offset += max(rows, cols) - (end - start)
        pos[:, end:] = torch.arange(end, length) + offset
    return pos


class Qwen25Block(nn.Module):
    def __init__(self, cfg: Qwen25VLConfig) -> None:
        super().__init__()
        s = cfg.shape
        self.input_layernorm = RMSNorm(s.hidden, cfg.eps)
        self.self_attn = DecoderAttention(s, cfg.rope_theta, qkv_bias=True)
        self.post_attention_layernorm = RMSNorm(s.hidden, cfg.eps)
        self.mlp = GatedMLP(s, "silu")

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen25Inner(nn.Module):
    """The file's ``model.`` part."""

    def __init__(self, cfg: Qwen25VLConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.shape.vocab_size, cfg.shape.hidden)
        self.layers = nn.ModuleList(Qwen25Block(cfg) for _ in range(cfg.shape.layers))
        self.norm = RMSNorm(cfg.shape.hidden, cfg.eps)


@dataclass(frozen=True, eq=False)
class ImageEmbed:
    """An image in a token row (it replaces one ``<|image_pad|>``): pixels [N, H, W, 3] in 0..1;
    the vision tower reads the first (ComfyUI's ``process_qwen2vl_images``)."""

    pixels: Tensor


class Qwen25VLTextModel(DecoderTextEncoder):
    """``forward(embeds [N, T, D], mask [N, T], layer, positions [N, 3, T] | None) -> hidden``:
    decoder layer ``layer``'s output (0-based, unnormed) or the normed last layer for None;
    ``encode_chunks`` also takes ``ImageEmbed`` items, each becoming the vision tower's tokens."""

    keep_f32: tuple[str, ...] = ("model.norm", "model.layers.*.input_layernorm",
                                 "model.layers.*.post_attention_layernorm", "visual.blocks.*.norm1",
                                 "visual.blocks.*.norm2", "visual.merger.ln_q")
    keep_stored: tuple[str, ...] = ("model.embed_tokens",)

    def __init__(self, config: Qwen25VLConfig) -> None:
        super().__init__(config, Qwen25Inner)
        self.visual = None if config.vision is None else VisionTower(config.vision)

    def forward(self, embeds: Tensor, mask: Tensor, layer: int | None = None,
                positions: Tensor | None = None) -> Tensor:
        x = embeds
        n, t = x.shape[:2]
        if positions is None:
            positions = torch.arange(t, device=x.device).expand(n, 3, t)
        cos, sin = mrope_cos_sin(positions.to(x.device), self.config.shape.head_dim, self.config.rope_theta,
                                 self.config.mrope_section)
        attn_mask = causal_padding_mask(mask, x.dtype)
        for i, block in enumerate(self.model.layers):
            x = block(x, attn_mask, cos, sin)
            if i == layer:
                return x
        return self.model.norm(x)

    def image_tokens(self, image: ImageEmbed) -> tuple[Tensor, int, int]:
        """The image's tokens [n, D] (float32) and its merged (rows, columns)."""
        if self.visual is None:
            raise ValueError("this Qwen2.5-VL text-encoder file has no vision tower (no 'visual.*' weights); "
                             "an image prompt needs the full qwen_2.5_vl_7b file")
        v = self.config.vision
        patches, grid = preprocess_image(image.pixels, v)
        tokens = self.visual(patches.to(self.visual.patch_embed.proj.weight.device), grid)
        return tokens.float(), grid[1] // v.merge, grid[2] // v.merge

    def encode_chunks(self, chunks: list, rule: OutputRule, layer_idx: int | None,
                      warn: Callable[[str], None]) -> EncodedText:
        """chunks of (token | embedding vector [D] | ImageEmbed, weight) -> ``EncodedText``; a row
        with images runs alone in M-RoPE positions (ComfyUI's ``process_tokens`` with the
        ``preprocess_embed`` of its images)."""
        if not any(isinstance(t, ImageEmbed) for c in chunks for t, _ in c):
            out = super().encode_chunks(chunks, rule, layer_idx, warn)
            return EncodedText(out.hidden, out.pooled, out.mask, tokens=_ids(chunks))
        if len(chunks) != 1 or any(w != 1.0 for _, w in chunks[0]):
            raise NotImplementedError("a Qwen2.5-VL prompt with images in more than one chunk or with token "
                                      "weights: not supported yet")
        row = self._fit_row([t for t, _ in chunks[0]], rule.pad_token, warn)
        ids = torch.tensor([[t if isinstance(t, int) else rule.pad_token for t in row]])  # [1, T]
        mask = padding_mask([t if isinstance(t, int) else -1 for t in row], rule.pad_token)
        with torch.no_grad():
            embeds = self.embed(ids).float()[0]  # [T, D]
            pieces, keep, images, at = [], [], [], 0
            for j, t in enumerate(row):
                if isinstance(t, ImageEmbed):
                    tokens, rows, cols = self.image_tokens(t)
                    images.append((at, rows, cols))
                    pieces.append(tokens)
                    keep += [1] * tokens.shape[0]
                    at += tokens.shape[0]
                else:
                    pieces.append((t.float() if isinstance(t, Tensor) else embeds[j])[None])
                    keep.append(mask[j])
                    at += 1
            x = torch.cat(pieces)[None]  # [1, T', D]
            m = torch.tensor([keep])  # [1, T']
            layer = resolve_layer(layer_idx, rule, self.n_layers)
            pos = mrope_positions(x.shape[1], images)[None]  # [1, 3, T']
            hidden = self(x.to(embeds.dtype), m, layer, pos).float()
        return EncodedText(hidden=hidden.clone(), pooled=None, mask=m.clone(), tokens=_ids(chunks))


def _ids(chunks: list) -> tuple:
    """The first chunk's items as given (token ids; an image or a vector as itself), for a join
    that cuts by token (Qwen-Image drops its template's tokens)."""
    return tuple(t for t, _ in chunks[0]) if chunks else ()


# --------------------------------------------------------------------------------------------
# the vision tower


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
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)  # cos [P, 1, hd]
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
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
