"""The Wan video VAEs (``wan_vae.py``: Wan 2.1 / Qwen-Image, Wan 2.2) as a VAE architecture
(``arch_base.VaeArch``), with ComfyUI's shapes and frame handling (``comfy/sd.py`` ``VAE`` with
``latent_dim == 3``):

- encode: IMAGE [N, H, W, 3] is one video of N frames, [1, 3, N, H, W] (H, W center-cropped to the
  downscale) -> latent [1, C, 1 + (N-1)//4, H/f, W/f]; frames past ``1 + 4k`` are dropped, as the
  reference's chunk loop drops them. A single image (Qwen-Image) gives [1, C, 1, h, w].
- decode: latent [B, C, T, h, w] -> IMAGE [B·(1 + 4(T-1)), h·f, w·f, 3] (ComfyUI's VAEDecode joins
  the batch and frame axes); a 4-D latent [B, C, h, w] is B one-frame videos. Frames are written
  into the IMAGE as the decoder yields them, one latent frame at a time.
- out of memory: both fall back to ComfyUI's tiled path (256-pixel tiles, a quarter overlap, all
  frames at once).
- VAEDecodeTiled / VAEEncodeTiled: ComfyUI's 3-D tiling over (frames, height, width): the
  ``temporal_size`` / ``temporal_overlap`` inputs are pixel frames, turned into latent frames by
  the time factor 4 (``tiled_nd.tiled_nd``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from mixgraph.nodes.vae.arch_base import VaeFound
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.vae.tiled_nd import tiled_nd
from mixgraph.nodes.vae.vae import crop_to_multiple
from mixgraph.nodes.vae.video_latent_formats import TIME_DOWNSCALE, WAN21_LATENT, WAN22_LATENT
from mixgraph.nodes.vae.wan_diffusers_keys import LAYOUT as DIFFUSERS_LAYOUT
from mixgraph.nodes.vae.wan_diffusers_keys import diffusers_header, is_diffusers_wan_vae
from mixgraph.nodes.vae.wan_vae import WanVAE, WanVAEConfig, decoded_frames, is_wan_vae

__all__ = ["WAN_ARCH", "wan_latent_format"]

log = logging.getLogger(__name__)

FALLBACK_TILE = 256   # pixels: ComfyUI's tiled fallback after an out-of-memory error


def wan_latent_format(cfg: WanVAEConfig) -> LatentFormat:
    """Wan 2.1's or 2.2's format for the full-size VAEs; a plain unit-scale format of the right
    width for other sizes (tiny test files)."""
    for fmt in (WAN21_LATENT, WAN22_LATENT):
        if (fmt.channels, fmt.downscale) == (cfg.z_dim, cfg.downscale):
            return fmt
    return LatentFormat(scale_factor=1.0, channels=cfg.z_dim, downscale=cfg.downscale,
                        name=f"wan_vae_{cfg.z_dim}ch")


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def _video(samples: Tensor) -> Tensor:
    """A LATENT as videos: [B, C, T, h, w]; a 4-D [B, C, h, w] is B one-frame videos."""
    if samples.ndim == 4:
        return samples.unsqueeze(2)
    if samples.ndim != 5:
        raise ValueError(f"a Wan VAE decodes [B, C, T, h, w] (or [B, C, h, w]) latents, got {tuple(samples.shape)}")
    return samples


def _check_channels(z: Tensor, cfg: WanVAEConfig) -> None:
    if z.shape[1] != cfg.z_dim:
        raise ValueError(f"a {z.shape[1]}-channel latent for a {cfg.z_dim}-channel Wan VAE")


def _to_image(x: Tensor) -> Tensor:
    # [B, 3, T, H, W] in [-1, 1] -> IMAGE [B*T, H, W, 3] in [0, 1]
    x = torch.clamp((x.float() + 1.0) / 2.0, 0.0, 1.0)
    return x.permute(0, 2, 3, 4, 1).flatten(0, 1).contiguous()


def _pixels(pixels: Tensor, cfg: WanVAEConfig) -> Tensor:
    # IMAGE [N, H, W, C>=3] -> one video [1, 3, N, H', W'] in [0, 1] (H', W' cropped to the downscale)
    pixels = crop_to_multiple(pixels[..., :3], cfg.downscale)
    return pixels.permute(3, 0, 1, 2).unsqueeze(0).float()


class WanArch:
    name = "wan"

    def build(self, config: WanVAEConfig) -> WanVAE:
        return WanVAE(config)

    def recognise(self, info: Mapping[str, Any]) -> VaeFound | None:
        """The original Wan layout (ComfyUI's files), or diffusers' (``wan_diffusers_keys``)."""
        layout = None
        if is_diffusers_wan_vae(info):
            info, layout = diffusers_header(info), DIFFUSERS_LAYOUT
        if not is_wan_vae(info):
            return None
        cfg = WanVAEConfig.from_state_dict(info)
        return VaeFound(arch=self.name, config=cfg, latent_format=wan_latent_format(cfg), layout=layout)

    # ---------------------------------------------------------------------------------- decode

    def decode(self, module: WanVAE, samples: Tensor, config: WanVAEConfig) -> Tensor:
        z = _video(samples)
        _check_channels(z, config)
        try:
            return self._decode_frames(module, z)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            if not _is_oom(e):
                raise
        log.warning("Wan VAE decode ran out of memory; retrying with tiled VAE decoding")
        tile = FALLBACK_TILE // config.downscale
        return self._decode_3d(module, z, config, (999, tile, tile), (1, tile // 4, tile // 4))

    @staticmethod
    def _decode_frames(module: WanVAE, z: Tensor) -> Tensor:
        """Each video decoded a latent frame at a time, straight into the IMAGE rows."""
        b, _, t, h, w = z.shape
        f = module.config.downscale
        frames = decoded_frames(t)
        image = torch.empty(b * frames, h * f, w * f, 3)
        for i in range(b):
            row = i * frames
            for chunk in module.decode_chunks(z[i:i + 1]):
                part = _to_image(chunk)   # [frames of the chunk, H, W, 3]
                image[row:row + part.shape[0]] = part
                row += part.shape[0]
        return image

    def decode_tiled(self, module: WanVAE, samples: Tensor, config: WanVAEConfig, tile_size: int, overlap: int,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        """ComfyUI's VAEDecodeTiled for a video VAE: pixel sizes to latent ones (spatial by the
        downscale, time by 4, at least 2 latent frames a tile and 1 of overlap)."""
        if tile_size < overlap * 4:
            overlap = tile_size // 4
        if temporal_size < temporal_overlap * 2:
            temporal_overlap = temporal_overlap // 2
        tile_t = max(2, temporal_size // TIME_DOWNSCALE)
        overlap_t = max(1, min(tile_t // 2, temporal_overlap // TIME_DOWNSCALE))
        f = config.downscale
        z = _video(samples)
        _check_channels(z, config)
        return self._decode_3d(module, z, config, (tile_t, tile_size // f, tile_size // f),
                               (overlap_t, overlap // f, overlap // f))

    @staticmethod
    def _decode_3d(module: WanVAE, z: Tensor, config: WanVAEConfig, tile, overlap) -> Tensor:
        f = config.downscale
        out = tiled_nd(z, lambda a: module.decode(a).float(), tile, overlap,
                       size=(decoded_frames, lambda n: n * f, lambda n: n * f),
                       pos=(lambda p: TIME_DOWNSCALE * p, lambda p: p * f, lambda p: p * f), out_channels=3)
        return _to_image(out)

    # ---------------------------------------------------------------------------------- encode

    def encode(self, module: WanVAE, pixels: Tensor, config: WanVAEConfig) -> Tensor:
        x = _pixels(pixels, config)
        try:
            return module.encode(x * 2.0 - 1.0).float()
        except (RuntimeError, torch.OutOfMemoryError) as e:
            if not _is_oom(e):
                raise
        log.warning("Wan VAE encode ran out of memory; retrying with tiled VAE encoding")
        return self._encode_3d(module, x, config, (9999, FALLBACK_TILE, FALLBACK_TILE),
                               (1, FALLBACK_TILE // 4, FALLBACK_TILE // 4))

    def encode_tiled(self, module: WanVAE, pixels: Tensor, config: WanVAEConfig, tile_size: int, overlap: int,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        """ComfyUI's ``VAE.encode_tiled`` for a video VAE: a time tile of ``1 + 4(k-1)`` frames for
        k = max(2, latent frames of temporal_size), the overlap likewise, and the video cut to
        ``1 + 4k`` frames first."""
        x = _pixels(pixels, config)
        tile_lat = max(2, encoded_frames_floor(temporal_size))
        overlap_lat = max(1, min(tile_lat // 2, encoded_frames_floor(temporal_overlap)))
        keep = decoded_frames(encoded_frames_floor(x.shape[2]))
        return self._encode_3d(module, x[:, :, :keep], config, (decoded_frames(tile_lat), tile_size, tile_size),
                               (decoded_frames(overlap_lat), overlap, overlap))

    @staticmethod
    def _encode_3d(module: WanVAE, x: Tensor, config: WanVAEConfig, tile, overlap) -> Tensor:
        f = config.downscale
        return tiled_nd(x, lambda a: module.encode(a * 2.0 - 1.0).float(), tile, overlap,
                        size=(encoded_frames_floor, lambda n: n / f, lambda n: n / f),
                        pos=(lambda p: p / TIME_DOWNSCALE, lambda p: p / f, lambda p: p / f),
                        out_channels=config.z_dim)

    # ---------------------------------------------------------------------------------- estimate

    def trace(self, config: WanVAEConfig, mode: str, batch: int, h: int, w: int):
        """Two latent frames (the first chunk and one of 4 frames): activations are bounded by a
        chunk, so more frames add only their output."""
        f = config.downscale
        if mode == "decode":
            return lambda m: m.decode(torch.empty(batch, config.z_dim, 2, max(1, h // f), max(1, w // f)))
        return lambda m: m.encode(torch.empty(batch, 3, 5, h, w))


def encoded_frames_floor(frames: float) -> int:
    """ComfyUI's time ``downscale_ratio``: ``max(0, floor((frames + 3) / 4))`` (0 for no frames)."""
    return max(0, int((frames + 3) // TIME_DOWNSCALE))


WAN_ARCH = WanArch()
