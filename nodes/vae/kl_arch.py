"""The LDM KL autoencoder (``vae.py``: SD 1.x / 2.x / SDXL, Flux's and SD3's 16-channel VAEs) as a
VAE architecture (``arch_base.VaeArch``). The calls are those ``VaeHandle`` made before it had
architectures, so its outputs are unchanged; the temporal tiling inputs do not apply to images."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from mixgraph.nodes.vae.arch_base import VaeFound
from mixgraph.nodes.vae.vae import AutoencoderKL, VAEConfig, decode_image, decode_tiled, encode_image, encode_tiled

__all__ = ["KL_ARCH"]


class KLArch:
    name = "kl"

    def build(self, config: VAEConfig) -> AutoencoderKL:
        return AutoencoderKL(config)

    def recognise(self, info: Mapping[str, Any]) -> VaeFound | None:
        return None  # the loader's KL layouts (LDM, diffusers, checkpoint prefixes) are its own

    def decode(self, module, samples: Tensor, config: VAEConfig) -> Tensor:
        """Latent [B,C,h,w] → IMAGE [B,8h,8w,3]; out-of-memory falls back to tiled decoding."""
        return decode_image(lambda z: module.decode(z).float(), samples, downscale=config.downscale)

    def decode_tiled(self, module, samples: Tensor, config: VAEConfig, tile_size: int, overlap: int,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        """tile_size and overlap in **pixels** (converted to latent pixels by the downscale factor;
        overlap is capped at tile_size/4, as ComfyUI's node does)."""
        if tile_size < overlap * 4:
            overlap = tile_size // 4
        f = config.downscale
        return decode_tiled(lambda z: module.decode(z).float(), samples, tile=tile_size // f, overlap=overlap // f,
                            downscale=f, out_channels=config.out_channels)

    def encode(self, module, pixels: Tensor, config: VAEConfig) -> Tensor:
        """IMAGE [B,H,W,C] → latent posterior mean [B,C,H/8,W/8] (H, W center-cropped to ×8)."""
        return encode_image(lambda x: module.encode(x).float(), pixels, downscale=config.downscale,
                            latent_channels=config.latent_channels)

    def encode_tiled(self, module, pixels: Tensor, config: VAEConfig, tile_size: int, overlap: int,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        return encode_tiled(lambda x: module.encode(x).float(), pixels, tile=tile_size, overlap=overlap,
                            downscale=config.downscale, latent_channels=config.latent_channels)

    def trace(self, config: VAEConfig, mode: str, batch: int, h: int, w: int):
        down = config.downscale
        if mode == "decode":
            return lambda m: m.decode(torch.empty(batch, config.z_channels if not config.use_quant_conv
                                                  else config.embed_dim, h // down, w // down))
        return lambda m: m.encode(torch.empty(batch, 3, h, w))


KL_ARCH = KLArch()
