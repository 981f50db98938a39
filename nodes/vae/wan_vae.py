"""The Wan video autoencoders: Wan 2.1's 3-D causal VAE (also Qwen-Image's image VAE) and Wan 2.2's
48-channel VAE (Wan team 2025, "Wan: Open and Advanced Large-Scale Video Generative Models",
§3.1; the Wan 2.2 report's "high-compression VAE").

Attribute names equal the keys of the files people have (the original Wan layout, ComfyUI's
``wan_2.1_vae.safetensors`` / ``qwen_image_vae.safetensors`` / ``wan2.2_vae.safetensors``:
``encoder.conv1``, ``encoder.downsamples.N.residual.2``, ``decoder.upsamples.N...``, ``conv1`` /
``conv2``), so a state dict loads with no mapping table. Sizes come from tensor shapes
(``WanVAEConfig.from_state_dict``): a tiny file and the full-size one take the same path.

Time is causal: every 3-D convolution pads only toward the past, so frame t of the output depends
on frames <= t. That lets the VAE run over chunks of frames with a per-layer cache of the last
input frames (``FrameCache``): encode sees 1, 4, 4, ... frames at a time (``1 + 4k`` frames make
``1 + k`` latent frames; frames past the last whole chunk are dropped, as the reference does),
decode one latent frame at a time. Activations are bounded by a chunk, so memory does not grow
with the frame count (only the output does).

Wan 2.2 (``residual=True``) differs in three ways: the pixels are patchified 2x2 into 12 channels
before the encoder (and unpatchified after the decoder), each resolution level is one block with a
parameter-free shortcut that averages (down) or duplicates (up) pixels into channels around its
resnets, and the decoder is wider than the encoder. 16x spatial, 48 latent channels.

Encoding returns the posterior mean (ComfyUI's ``WanVAE.encode``), unscaled: the per-channel
normalisation is the latent format's (``video_latent_formats.WAN21_LATENT`` / ``WAN22_LATENT``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = ["WanVAEConfig", "WanVAE", "FrameCache", "is_wan_vae", "encoded_frames", "decoded_frames"]

CACHE_T = 2            # input frames a causal 3-D conv keeps for the next chunk (its temporal padding)
TIME_CHUNK = 4         # pixel frames per encoder chunk after the first


def encoded_frames(frames: int) -> int:
    """Latent frames for ``frames`` pixel frames: ``1 + (frames - 1) // 4`` (the rest is dropped)."""
    return 1 + (frames - 1) // TIME_CHUNK


def decoded_frames(latent_frames: int) -> int:
    """Pixel frames a decode of ``latent_frames`` gives: ``1 + 4 (latent_frames - 1)``."""
    return max(0, TIME_CHUNK * latent_frames - (TIME_CHUNK - 1))


def is_wan_vae(keys) -> bool:
    """Whether a state dict's keys are a Wan VAE's (2.1 or 2.2) in the original layout."""
    return "decoder.middle.0.residual.0.gamma" in keys and "encoder.conv1.weight" in keys


# --------------------------------------------------------------------------------------------
# config from shapes


@dataclass(frozen=True)
class WanVAEConfig:
    """Sizes of a Wan VAE. The defaults are Wan 2.1's (``wan_2.1_vae``); Wan 2.2's file gives
    dim 160, dec_dim 256, z_dim 48, patch 2, residual True."""

    dim: int = 96                                  # encoder base width
    dec_dim: int = 96                              # decoder base width
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_down: tuple[bool, ...] = (False, True, True)   # per level but the last
    residual: bool = False                         # Wan 2.2's residual level blocks
    patch: int = 1                                 # pixel patchify factor (Wan 2.2: 2)

    @property
    def downscale(self) -> int:
        """Pixels per latent pixel along each side (8; Wan 2.2: 16)."""
        return 2 ** (len(self.dim_mult) - 1) * self.patch

    @property
    def latent_channels(self) -> int:
        return self.z_dim

    @property
    def time_downscale(self) -> int:
        return 2 ** sum(self.temporal_down)

    @property
    def pixel_channels(self) -> int:
        return 3 * self.patch * self.patch

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, object]) -> "WanVAEConfig":
        """Derive the config from tensor shapes (``sd`` values need only a ``.shape``)."""

        def shape(key: str) -> tuple[int, ...]:
            try:
                return _shape(sd[key])
            except KeyError:
                raise ValueError(f"Wan VAE weights: missing {key!r}") from None

        dim, pixel_channels = shape("encoder.conv1.weight")[:2]
        patch = math.isqrt(pixel_channels // 3)
        if 3 * patch * patch != pixel_channels:
            raise ValueError(f"Wan VAE weights: encoder.conv1 takes {pixel_channels} channels, not 3·p² pixels")
        residual = "decoder.upsamples.0.upsamples.0.residual.2.weight" in sd
        levels = _encoder_levels(sd, residual)
        widths = [lv[0] for lv in levels]
        mult = tuple(w // dim for w in widths)
        if any(w % dim for w in widths):
            raise ValueError(f"Wan VAE weights: level widths {widths} are not multiples of {dim}")
        z_dim = shape("conv2.weight")[0]
        dec_dim = shape("decoder.conv1.weight")[0] // mult[-1]
        return cls(dim=dim, dec_dim=dec_dim, z_dim=z_dim, dim_mult=mult, num_res_blocks=levels[0][1],
                   temporal_down=tuple(lv[2] for lv in levels[:-1]), residual=residual, patch=patch)


def _shape(value) -> tuple[int, ...]:
    """A tensor's, TensorInfo's or shape sequence's shape."""
    return tuple(getattr(value, "shape", value))


def _encoder_levels(sd, residual: bool) -> list[tuple[int, int, bool]]:
    """(width, resnets, temporal downsample) per encoder level, read from the keys."""
    if residual:  # encoder.downsamples.<level>.downsamples.<j>
        groups: list = []
        while f"encoder.downsamples.{len(groups)}.downsamples.0.residual.0.gamma" in sd:
            groups.append(_walk(sd, f"encoder.downsamples.{len(groups)}.downsamples."))
    else:         # one flat sequence: resnets, then a resample closing each level but the last
        groups, current = [], []
        for item in _walk(sd, "encoder.downsamples."):
            current.append(item)
            if item[0] != "res":
                groups.append(current)
                current = []
        groups.append(current)
    if not groups or not groups[0]:
        raise ValueError("Wan VAE weights: no encoder.downsamples.0.* resnets")
    levels = []
    for items in groups:
        res = [it for it in items if it[0] == "res"]
        if not res:
            raise ValueError("Wan VAE weights: an encoder level without resnets")
        levels.append((res[-1][1], len(res), any(it[0] == "down3d" for it in items)))
    return levels


def _walk(sd, prefix: str) -> list[tuple[str, int]]:
    """("res", width) / ("down2d" | "down3d", 0) for ``prefix``.0, .1, ... until a gap."""
    out, n = [], 0
    while True:
        p = f"{prefix}{n}."
        if p + "residual.2.weight" in sd:
            out.append(("res", _shape(sd[p + "residual.2.weight"])[0]))
        elif p + "resample.1.weight" in sd:
            out.append(("down3d" if p + "time_conv.weight" in sd else "down2d", 0))
        elif p + "to_qkv.weight" in sd:
            raise NotImplementedError("Wan VAE with attention inside its levels (attn_scales): not supported yet")
        else:
            return out
        n += 1


# --------------------------------------------------------------------------------------------
# causal pieces


class FrameCache:
    """What each causal layer keeps from one chunk of frames for the next (its last input frames,
    or a marker), keyed by the layer; ``first`` is True while the first chunk runs."""

    REPEAT = "repeat"   # an upsample that has seen its first chunk (which it passes through)

    def __init__(self) -> None:
        self._state: dict[nn.Module, object] = {}
        self.first = True

    def get(self, layer: nn.Module):
        return self._state.get(layer)

    def put(self, layer: nn.Module, value) -> None:
        self._state[layer] = value


class CausalConv3d(nn.Conv3d):
    """A 3-D convolution whose temporal padding is all in the past (2·p frames before, none after);
    ``past`` frames, when given, replace as many of those zero frames. Computes in the input's
    dtype (the weights may be stored in another)."""

    def __init__(self, c_in: int, c_out: int, kernel, stride=1, padding=0):
        super().__init__(c_in, c_out, kernel, stride=stride, padding=0)
        pt, ph, pw = padding if isinstance(padding, tuple) else (padding,) * 3
        self.causal_pad = (pw, pw, ph, ph, 2 * pt, 0)   # F.pad order: W, H, T

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        pad = list(self.causal_pad)
        if past is not None and pad[4] > 0:
            x = torch.cat([past.to(x.dtype), x], dim=2)
            pad[4] -= past.shape[2]
        x = F.pad(x, pad)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.conv3d(x, self.weight.to(x.dtype), bias, self.stride)


def cached_conv(conv: CausalConv3d, x: Tensor, cache: FrameCache) -> Tensor:
    """``conv`` on one chunk, continuing the previous chunk: the last ``CACHE_T`` input frames are
    kept for the next call (with a one-frame chunk, the frame before it from the last cache)."""
    past = cache.get(conv)
    keep = x[:, :, -CACHE_T:]
    if keep.shape[2] < CACHE_T and past is not None:
        keep = torch.cat([past[:, :, -1:], keep], dim=2)
    cache.put(conv, keep.clone())
    return conv(x, past)


class RMSNorm(nn.Module):
    """x / ||x|| over channels, times sqrt(C) and a learned gain (no mean subtraction)."""

    def __init__(self, dim: int, images: bool = False):
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones((dim, 1, 1) if images else (dim, 1, 1, 1)))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma.to(x.dtype)


def _frames_2d(fn, x: Tensor) -> Tensor:
    """Apply a 2-D ``fn`` to every frame: [B, C, T, H, W] -> [B*T, C, H, W] -> back."""
    b, _, t = x.shape[:3]
    y = fn(x.transpose(1, 2).flatten(0, 1))
    # [B*T, C', H', W'] -> [B, C', T, H', W']
    return y.unflatten(0, (b, t)).transpose(1, 2)


class ResidualBlock(nn.Module):
    """norm, SiLU, 3x3x3 conv, twice, plus a (1x1x1 conv) shortcut. ``residual`` indices are the
    file's: 0 norm, 2 conv, 3 norm, 6 conv (1, 4, 5: SiLU, SiLU, dropout)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(c_in), nn.SiLU(), CausalConv3d(c_in, c_out, 3, padding=1),
            RMSNorm(c_out), nn.SiLU(), nn.Identity(), CausalConv3d(c_out, c_out, 3, padding=1))
        self.shortcut = CausalConv3d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        r = self.residual
        h = cached_conv(r[2], F.silu(r[0](x)), cache)
        h = cached_conv(r[6], F.silu(r[3](h)), cache)
        return h + self.shortcut(x)


class AttentionBlock(nn.Module):
    """Single-head self-attention over each frame's pixels (1x1 conv projections)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def _frame(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        qkv = self.to_qkv(self.norm(x))
        # [N, 3C, H, W] -> 3 x [N, H*W, C]
        q, k, v = (t.flatten(2).transpose(1, 2) for t in qkv.chunk(3, dim=1))
        y = attention(q, k, v, heads=1)
        # [N, H*W, C] -> [N, C, H, W]
        return self.proj(y.transpose(1, 2).reshape(n, c, h, w))

    def forward(self, x: Tensor, cache: FrameCache | None = None) -> Tensor:
        return x + _frames_2d(self._frame, x)


class Resample(nn.Module):
    """2x spatial down/upsampling per frame; the "3d" modes also halve / double time with a causal
    temporal conv (``time_conv``). The first chunk passes through time unchanged (one frame)."""

    def __init__(self, dim: int, mode: str, up_out: int | None = None):
        super().__init__()
        self.mode = mode
        if mode.startswith("up"):
            self.resample = nn.Sequential(nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                                          nn.Conv2d(dim, up_out or dim // 2, 3, padding=1))
            if mode == "up3d":
                self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
            if mode == "down3d":
                self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        if self.mode == "up3d":
            x = self._double_time(x, cache)
        x = _frames_2d(self.resample, x)
        if self.mode == "down3d":
            x = self._halve_time(x, cache)
        return x

    def _double_time(self, x: Tensor, cache: FrameCache) -> Tensor:
        past = cache.get(self)
        if past is None:                 # the first chunk: one frame stays one frame
            cache.put(self, FrameCache.REPEAT)
            return x
        keep = x[:, :, -CACHE_T:]
        if keep.shape[2] < CACHE_T:
            before = torch.zeros_like(keep) if past is FrameCache.REPEAT else past[:, :, -1:]
            keep = torch.cat([before, keep], dim=2)
        y = self.time_conv(x, None if past is FrameCache.REPEAT else past)
        cache.put(self, keep.clone())
        b, c, t, h, w = x.shape
        # [B, 2C, T, H, W] -> [B, 2, C, T, H, W] -> [B, C, T, 2, H, W] -> [B, C, 2T, H, W]
        return y.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)

    def _halve_time(self, x: Tensor, cache: FrameCache) -> Tensor:
        past = cache.get(self)
        cache.put(self, x[:, :, -1:].clone())
        if past is None:                 # the first chunk: its one frame is kept as is
            return x
        return self.time_conv(torch.cat([past.to(x.dtype), x], dim=2))


def avg_down(x: Tensor, c_out: int, ft: int, fs: int) -> Tensor:
    """Wan 2.2's down shortcut: fold ft frames and fs x fs pixels into channels, then average
    groups of channels down to ``c_out`` (time padded at the front to a multiple of ft)."""
    x = F.pad(x, (0, 0, 0, 0, (ft - x.shape[2] % ft) % ft, 0))
    b, c, t, h, w = x.shape
    # [B, C, T, H, W] -> [B, C, T/ft, ft, H/fs, fs, W/fs, fs] -> [B, C, ft, fs, fs, T/ft, H/fs, W/fs]
    x = x.view(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6)
    # -> [B, c_out, group, T', H', W'] -> mean over the group
    return x.reshape(b, c_out, -1, t // ft, h // fs, w // fs).mean(dim=2)


def dup_up(x: Tensor, c_out: int, ft: int, fs: int, first: bool) -> Tensor:
    """Wan 2.2's up shortcut: repeat channels, then unfold them into ft frames and fs x fs pixels
    (the inverse arrangement of ``avg_down``); the first chunk drops its ft - 1 leading frames."""
    b, c, t, h, w = x.shape
    x = x.repeat_interleave(c_out * ft * fs * fs // c, dim=1)
    # [B, c_out*ft*fs*fs, T, H, W] -> [B, c_out, ft, fs, fs, T, H, W] -> [B, c_out, T, ft, H, fs, W, fs]
    x = x.view(b, c_out, ft, fs, fs, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, c_out, t * ft, h * fs, w * fs)
    return x[:, :, ft - 1:] if first else x


class DownLevel(nn.Module):
    """Wan 2.2 encoder level: resnets (+ resample) beside an ``avg_down`` shortcut."""

    def __init__(self, c_in: int, c_out: int, blocks: int, down: str | None):
        super().__init__()
        layers: list[nn.Module] = [ResidualBlock(c_in if i == 0 else c_out, c_out) for i in range(blocks)]
        if down is not None:
            layers.append(Resample(c_out, down))
        self.downsamples = nn.Sequential(*layers)
        self.c_out, self.ft, self.fs = c_out, 2 if down == "down3d" else 1, 1 if down is None else 2

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        h = x
        for layer in self.downsamples:
            h = layer(h, cache)
        return h + avg_down(x, self.c_out, self.ft, self.fs)


class UpLevel(nn.Module):
    """Wan 2.2 decoder level: resnets (+ resample) beside a ``dup_up`` shortcut."""

    def __init__(self, c_in: int, c_out: int, blocks: int, up: str | None):
        super().__init__()
        layers: list[nn.Module] = [ResidualBlock(c_in if i == 0 else c_out, c_out) for i in range(blocks)]
        if up is not None:
            layers.append(Resample(c_out, up, up_out=c_out))
        self.upsamples = nn.Sequential(*layers)
        self.up, self.c_out, self.ft = up, c_out, 2 if up == "up3d" else 1

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        h = x
        for layer in self.upsamples:
            h = layer(h, cache)
        if self.up is None:
            return h
        return h + dup_up(x, self.c_out, self.ft, 2, cache.first)


def _head(c: int, c_out: int) -> nn.Sequential:
    # indices are the file's: 0 norm, 1 SiLU, 2 conv
    return nn.Sequential(RMSNorm(c), nn.SiLU(), CausalConv3d(c, c_out, 3, padding=1))


def _middle(c: int) -> nn.Sequential:
    return nn.Sequential(ResidualBlock(c, c), AttentionBlock(c), ResidualBlock(c, c))


class Encoder3d(nn.Module):
    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]
        last = len(cfg.dim_mult) - 1
        self.conv1 = CausalConv3d(cfg.pixel_channels, dims[0], 3, padding=1)
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
            down = None if i == last else ("down3d" if cfg.temporal_down[i] else "down2d")
            if cfg.residual:
                layers.append(DownLevel(c_in, c_out, cfg.num_res_blocks, down))
                continue
            for j in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(c_in if j == 0 else c_out, c_out))
            if down is not None:
                layers.append(Resample(c_out, down))
        self.downsamples = nn.Sequential(*layers)
        self.middle = _middle(dims[-1])
        self.head = _head(dims[-1], 2 * cfg.z_dim)

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        x = cached_conv(self.conv1, x, cache)
        for layer in (*self.downsamples, *self.middle):
            x = layer(x, cache)
        return cached_conv(self.head[2], F.silu(self.head[0](x)), cache)


class Decoder3d(nn.Module):
    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        mult = cfg.dim_mult
        dims = [cfg.dec_dim * m for m in (mult[-1], *mult[::-1])]
        temporal_up = cfg.temporal_down[::-1]
        last = len(mult) - 1
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = _middle(dims[0])
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
            up = None if i == last else ("up3d" if temporal_up[i] else "up2d")
            if cfg.residual:
                layers.append(UpLevel(c_in, c_out, cfg.num_res_blocks + 1, up))
                continue
            if i > 0:
                c_in //= 2   # Wan 2.1's upsampling convs halve the width
            for j in range(cfg.num_res_blocks + 1):
                layers.append(ResidualBlock(c_in if j == 0 else c_out, c_out))
            if up is not None:
                layers.append(Resample(c_out, up))
        self.upsamples = nn.Sequential(*layers)
        self.head = _head(dims[-1], cfg.pixel_channels)

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        x = cached_conv(self.conv1, x, cache)
        for layer in (*self.middle, *self.upsamples):
            x = layer(x, cache)
        return cached_conv(self.head[2], F.silu(self.head[0](x)), cache)


def patchify(x: Tensor, p: int) -> Tensor:
    """[B, C, T, H, W] -> [B, C·p·p, T, H/p, W/p], channels ordered (c, column, row) as Wan 2.2's."""
    if p == 1:
        return x
    b, c, t, h, w = x.shape
    # [B, C, T, H/p, p(row), W/p, p(col)] -> [B, C, col, row, T, H/p, W/p]
    x = x.view(b, c, t, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * p * p, t, h // p, w // p)


def unpatchify(x: Tensor, p: int) -> Tensor:
    """The inverse of ``patchify``."""
    if p == 1:
        return x
    b, cpp, t, h, w = x.shape
    # [B, C, col, row, T, H, W] -> [B, C, T, H, row, W, col]
    x = x.view(b, cpp // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cpp // (p * p), t, h * p, w * p)


class WanVAE(nn.Module):
    """``encode``: pixels in [-1, 1] [B, 3, T, H, W] -> posterior mean [B, z, 1 + (T-1)//4, H/f, W/f];
    ``decode``: latent [B, z, T, h, w] -> pixels ≈[-1, 1] [B, 3, 1 + 4(T-1), h·f, w·f]
    (``decode_chunks`` yields them chunk by chunk). Both compute in the dtype the precision layer
    gave the module's 2-D convs (f32 for a plain module) and return that dtype."""

    keep_f32: tuple[str, ...] = ()
    # as the KL VAE: int8 would leave banding; its 2-D convs stay cast layers
    int8_skip: tuple[str, ...] = ("encoder", "decoder")

    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder3d(cfg)
        self.conv1 = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)

    def compute_dtype(self) -> torch.dtype:
        """The dtype ``apply_precision`` gave the 2-D convs (they are cast layers; the 3-D convs
        compute in their input's dtype), else the weights'."""
        conv = self.decoder.middle[1].to_qkv
        return getattr(conv, "compute_dtype", conv.weight.dtype)

    def encode(self, x: Tensor) -> Tensor:
        dtype, cache = self.compute_dtype(), FrameCache()
        # frames 0, then 1-4, 5-8, ...: 1 + 4k frames make 1 + k latent frames (the rest is dropped)
        bounds = [(0, 1)] + [(1 + TIME_CHUNK * i, 1 + TIME_CHUNK * (i + 1))
                             for i in range(encoded_frames(x.shape[2]) - 1)]
        out = []
        for a, b in bounds:   # each chunk cast and patchified on its own: no second copy of the video
            out.append(self.encoder(patchify(x[:, :, a:b].to(dtype), self.config.patch), cache))
            cache.first = False
        moments = self.conv1(torch.cat(out, dim=2))
        return moments[:, : self.config.z_dim]   # (mean, logvar) along channels: the mean

    def decode_chunks(self, z: Tensor) -> Iterator[Tensor]:
        """Pixels for one latent frame at a time: 1 frame, then 4 per latent frame."""
        x = self.conv2(z.to(self.compute_dtype()))
        cache = FrameCache()
        for i in range(x.shape[2]):
            cache.first = i == 0
            yield unpatchify(self.decoder(x[:, :, i:i + 1], cache), self.config.patch)

    def decode(self, z: Tensor) -> Tensor:
        out = None
        t0 = 0
        for chunk in self.decode_chunks(z):
            if out is None:
                b, c, _, h, w = chunk.shape
                out = chunk.new_empty(b, c, decoded_frames(z.shape[2]), h, w)
            out[:, :, t0:t0 + chunk.shape[2]] = chunk
            t0 += chunk.shape[2]
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))
