"""The KL autoencoder of latent diffusion (Rombach et al. 2022, "High-Resolution Image Synthesis
with Latent Diffusion Models", appendix G), in the LDM checkpoint layout.

Attribute names equal the keys under ``first_stage_model.`` in single-file SD1/SD2/SDXL
checkpoints (``encoder.down.0.block.0.conv1.weight``, ``decoder.mid.attn_1.q.weight``,
``quant_conv.weight`` ...), so a stripped state dict loads with no mapping table. SD1, SD2 and
SDXL share the architecture; sizes come from tensor shapes (``VAEConfig.from_state_dict``).

Encoding returns the **mean** of the diagonal Gaussian posterior, not a sample: ComfyUI's VAE
uses ``DiagonalGaussianRegularizer(sample=False)``, i.e. the mode, which for a Gaussian is the
mean, so VAEEncode is deterministic. The latent scale factor (0.18215 SD1/2, 0.13025 SDXL) belongs
to the diffusion model kind and is applied by the sampler, never here (comfy-conventions §6.4).

Tiled decode/encode follows ComfyUI's ``tiled_scale``: tiles overlap by ``overlap`` latent pixels;
each tile's output is weighted by a linear feather ramp ``(t+1)/feather`` over the ``overlap``
(scaled) outermost rows/columns on every side, and overlapping outputs are averaged with those
weights. The result is the mean of three such passes with different tile shapes (see
``decode_tiled``), so tile borders fall in different places and seams average out.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = [
    "VAEConfig",
    "AutoencoderKL",
    "tiled_map",
    "decode_image",
    "encode_image",
    "decode_tiled",
    "encode_tiled",
    "crop_to_multiple",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VAEConfig:
    """Sizes of an LDM KL autoencoder. The defaults are SD1/SD2/SDXL's."""

    in_channels: int = 3
    out_channels: int = 3
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 4
    embed_dim: int = 4
    use_quant_conv: bool = True

    @property
    def downscale(self) -> int:
        """Pixels per latent pixel along each side (8 for SD)."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def latent_channels(self) -> int:
        return self.embed_dim if self.use_quant_conv else self.z_channels

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, object], prefix: str = "") -> "VAEConfig":
        """Derive the config from tensor shapes (``sd`` values need only a ``.shape``)."""

        def shape(key: str) -> tuple[int, ...]:
            try:
                return tuple(sd[prefix + key].shape)  # type: ignore[union-attr]
            except KeyError:
                raise ValueError(f"VAE weights: missing {prefix + key!r}") from None

        ch, in_channels = shape("encoder.conv_in.weight")[:2]
        levels = 0
        while f"{prefix}encoder.down.{levels}.block.0.conv1.weight" in sd:
            levels += 1
        if levels == 0:
            raise ValueError(f"VAE weights: no {prefix}encoder.down.0.block.0.* keys")
        num_res_blocks = 0
        while f"{prefix}encoder.down.0.block.{num_res_blocks}.conv1.weight" in sd:
            num_res_blocks += 1
        ch_mult = tuple(shape(f"encoder.down.{i}.block.0.conv2.weight")[0] // ch for i in range(levels))
        z_channels = shape("decoder.conv_in.weight")[1]
        use_quant = prefix + "post_quant_conv.weight" in sd
        embed_dim = shape("post_quant_conv.weight")[1] if use_quant else z_channels
        return cls(
            in_channels=in_channels,
            out_channels=shape("decoder.conv_out.weight")[0],
            ch=ch,
            ch_mult=ch_mult,
            num_res_blocks=num_res_blocks,
            z_channels=z_channels,
            embed_dim=embed_dim,
            use_quant_conv=use_quant,
        )


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.norm1 = _norm(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        if c_in != c_out:
            self.nin_shortcut = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        skip = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all spatial positions (1×1 conv projections)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = _norm(c)
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)
        self.upcast_attention = False

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        # [B, C, H, W] -> [B, H*W, C]
        q, k, v = (m(y).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = attention(q, k, v, heads=1, upcast=self.upcast_attention)
        # [B, H*W, C] -> [B, C, H, W]
        y = y.transpose(1, 2).reshape(b, c, h, w)
        return x + self.proj_out(y)


class Downsample(nn.Module):
    """Stride-2 3×3 conv with LDM's asymmetric (right/bottom) zero padding."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Mid(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1 = ResnetBlock(c, c)
        self.attn_1 = AttnBlock(c)
        self.block_2 = ResnetBlock(c, c)

    def forward(self, x: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Level(nn.Module):
    """One resolution: ``block`` resnets, then an optional ``downsample``/``upsample``."""

    def __init__(self, blocks: list[ResnetBlock], resample: nn.Module | None, name: str):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        if resample is not None:
            setattr(self, name, resample)
        self._resample = name if resample is not None else None

    def forward(self, x: Tensor) -> Tensor:
        for blk in self.block:
            x = blk(x)
        return getattr(self, self._resample)(x) if self._resample else x


class Encoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        chans = [cfg.ch * m for m in cfg.ch_mult]
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        c = cfg.ch
        for i, c_out in enumerate(chans):
            blocks = []
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResnetBlock(c, c_out))
                c = c_out
            last = i == len(chans) - 1
            self.down.append(Level(blocks, None if last else Downsample(c), "downsample"))
        self.mid = Mid(c)
        self.norm_out = _norm(c)
        self.conv_out = nn.Conv2d(c, 2 * cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(self.mid(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        chans = [cfg.ch * m for m in cfg.ch_mult]
        c = chans[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c, 3, padding=1)
        self.mid = Mid(c)
        levels: list[Level] = []
        for i in reversed(range(len(chans))):
            blocks = []
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResnetBlock(c, chans[i]))
                c = chans[i]
            levels.append(Level(blocks, Upsample(c) if i != 0 else None, "upsample"))
        self.up = nn.ModuleList(reversed(levels))  # up[i] is resolution level i, run last-to-first
        self.norm_out = _norm(c)
        self.conv_out = nn.Conv2d(c, cfg.out_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        x = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class AutoencoderKL(nn.Module):
    """``encode``: pixels in [-1, 1] [B,3,H,W] → posterior mean [B,C,H/f,W/f];
    ``decode``: latent → pixels in ≈[-1, 1]. Both run in the dtype of the weights; the handle
    layer (``handles.VaeHandle``) casts f32 in and out."""

    keep_f32: tuple[str, ...] = ()
    # int8 leaves the whole VAE f32: on the embedded model its int8 convs cost 8 dB of PSNR against
    # f32 (mean 41.6 dB vs 49.4 dB with f32 VAE convs, worst 16.9 vs 35.0 dB over 24 prompts)
    int8_skip: tuple[str, ...] = ("encoder", "decoder", "quant_conv", "post_quant_conv")

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        if cfg.use_quant_conv:
            self.quant_conv = nn.Conv2d(2 * cfg.z_channels, 2 * cfg.embed_dim, 1)
            self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)

    def encode(self, x: Tensor) -> Tensor:
        moments = self.encoder(x)
        if self.config.use_quant_conv:
            moments = self.quant_conv(moments)
        # [B, 2C, h, w] = (mean, logvar) along channels; the posterior mode is the mean
        return moments[:, : moments.shape[1] // 2]

    def decode(self, z: Tensor) -> Tensor:
        if self.config.use_quant_conv:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))


# --------------------------------------------------------------------------------------------
# image <-> latent, whole and tiled


def crop_to_multiple(pixels: Tensor, multiple: int) -> Tensor:
    """Center-crop IMAGE [B,H,W,C] so H and W are multiples of ``multiple`` (ComfyUI VAEEncode)."""
    for dim in (1, 2):
        n = pixels.shape[dim]
        keep = (n // multiple) * multiple
        if keep != n:
            pixels = pixels.narrow(dim, (n % multiple) // 2, keep)
    return pixels


def tiled_map(
    x: Tensor,
    fn: Callable[[Tensor], Tensor],
    tile: tuple[int, int],
    overlap: int,
    scale: float,
    out_channels: int,
) -> Tensor:
    """Apply ``fn`` (which maps [1,C,h,w] to [1,out_channels,h·scale,w·scale]) tile by tile.

    x: [B, C, H, W]; tile = (tile_h, tile_w) and overlap in input pixels. Tiles start every
    ``tile - overlap`` pixels; the last tile is clipped to the border. Each output tile is
    weighted by a mask that ramps linearly as (t+1)/feather over the feather = round(overlap·scale)
    outermost rows and columns on each side; the result is Σ(out·mask) / Σ(mask), so each pixel is
    a feathered average of the tiles that cover it.
    """
    b, _, h, w = x.shape
    out_h, out_w = round(h * scale), round(w * scale)
    result = torch.empty(b, out_channels, out_h, out_w, dtype=torch.float32)
    for i in range(b):
        xi = x[i : i + 1]
        if h <= tile[0] and w <= tile[1]:
            result[i : i + 1] = fn(xi).float()
            continue
        acc = torch.zeros(1, out_channels, out_h, out_w)
        weight = torch.zeros(1, 1, out_h, out_w)
        starts = [
            range(0, size - overlap, t - overlap) if size > t else [0] for size, t in ((h, tile[0]), (w, tile[1]))
        ]
        for y0, x0 in itertools.product(*starts):
            y0 = max(0, min(h - overlap, y0))
            x0 = max(0, min(w - overlap, x0))
            th, tw = min(tile[0], h - y0), min(tile[1], w - x0)
            out = fn(xi[:, :, y0 : y0 + th, x0 : x0 + tw]).float()
            mask = torch.ones(1, 1, out.shape[2], out.shape[3])
            feather = round(overlap * scale)
            for dim in (2, 3):
                if feather >= mask.shape[dim]:
                    continue
                for t in range(feather):
                    a = (t + 1) / feather
                    mask.narrow(dim, t, 1).mul_(a)
                    mask.narrow(dim, mask.shape[dim] - 1 - t, 1).mul_(a)
            oy, ox = round(y0 * scale), round(x0 * scale)
            acc[:, :, oy : oy + out.shape[2], ox : ox + out.shape[3]] += out * mask
            weight[:, :, oy : oy + out.shape[2], ox : ox + out.shape[3]] += mask
        result[i : i + 1] = acc / weight
    return result


def _to_image(x: Tensor) -> Tensor:
    # [B, 3, H, W] in [-1, 1] -> IMAGE [B, H, W, 3] in [0, 1]
    return torch.clamp((x.float() + 1.0) / 2.0, 0.0, 1.0).permute(0, 2, 3, 1).contiguous()


def _from_image(pixels: Tensor, multiple: int) -> Tensor:
    # IMAGE [B, H, W, C>=3] in [0, 1] -> [B, 3, H', W'] in [-1, 1]
    pixels = crop_to_multiple(pixels[..., :3], multiple)
    return pixels.permute(0, 3, 1, 2).float() * 2.0 - 1.0


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def decode_image(vae: Callable[[Tensor], Tensor], z: Tensor, *, downscale: int = 8) -> Tensor:
    """Latent [B,C,h,w] (unscaled) → IMAGE [B,h·f,w·f,3] float32 in 0..1.

    ``vae`` maps a latent to pixels in [-1, 1]. On out-of-memory, retries tiled like ComfyUI
    (three passes with 64×64-equivalent tiles, overlap 16; see ``decode_tiled``).
    """
    if z.ndim == 5:  # [B, C, T, h, w] -> [B*T, C, h, w] (ComfyUI flattens 5-D batches)
        z = z.transpose(1, 2).flatten(0, 1)
    try:
        return _to_image(vae(z))
    except (RuntimeError, torch.OutOfMemoryError) as e:
        if not _is_oom(e):
            raise
        log.warning("VAE decode ran out of memory; retrying with tiled VAE decoding")
        return decode_tiled(vae, z, tile=64, overlap=16, downscale=downscale)


def decode_tiled(
    vae: Callable[[Tensor], Tensor], z: Tensor, *, tile: int = 64, overlap: int = 16, downscale: int = 8,
    out_channels: int = 3,
) -> Tensor:
    """Tiled decode, tile and overlap in latent pixels → IMAGE [B,H,W,3].

    ComfyUI's ``decode_tiled_``: the mean of three ``tiled_map`` passes with tile shapes
    (h, w) = (2t, t/2), (t/2, 2t) and (t, t), so tile borders fall in different places in each.
    """
    passes = [(tile * 2, tile // 2), (tile // 2, tile * 2), (tile, tile)]
    total = sum(tiled_map(z, vae, shape, overlap, downscale, out_channels) for shape in passes)
    return _to_image(total / 3.0)


def encode_image(
    vae_encode: Callable[[Tensor], Tensor], pixels: Tensor, *, downscale: int = 8, latent_channels: int = 4
) -> Tensor:
    """IMAGE [B,H,W,C] in 0..1 → latent posterior mean [B,latent_channels,H/f,W/f], unscaled.

    H and W are center-cropped to multiples of ``downscale`` first. Out-of-memory → tiled
    encode with 512-pixel tiles, overlap 64 (ComfyUI's fallback).
    """
    x = _from_image(pixels, downscale)
    try:
        return vae_encode(x).float()
    except (RuntimeError, torch.OutOfMemoryError) as e:
        if not _is_oom(e):
            raise
        log.warning("VAE encode ran out of memory; retrying with tiled VAE encoding")
        return _encode_tiled_prepared(vae_encode, x, 512, 64, downscale, latent_channels)


def encode_tiled(
    vae_encode: Callable[[Tensor], Tensor], pixels: Tensor, *, tile: int = 512, overlap: int = 64,
    downscale: int = 8, latent_channels: int = 4,
) -> Tensor:
    """Tiled encode, tile and overlap in image pixels: mean of passes (t,t), (t/2,2t), (2t,t/2)."""
    return _encode_tiled_prepared(vae_encode, _from_image(pixels, downscale), tile, overlap, downscale, latent_channels)


def _encode_tiled_prepared(vae_encode, x: Tensor, tile: int, overlap: int, downscale: int, channels: int) -> Tensor:
    passes = [(tile, tile), (tile // 2, tile * 2), (tile * 2, tile // 2)]
    total = sum(tiled_map(x, vae_encode, shape, overlap, 1.0 / downscale, channels) for shape in passes)
    return total / 3.0
