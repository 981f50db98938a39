"""TAESD, the Tiny AutoEncoder for Stable Diffusion (Ollin Boer Bohan 2023,
github.com/madebyollin/taesd): the decoder (sampler previews) and, with the encoder, a whole VAE
(``TAESDAutoencoder``, what ComfyUI's VAELoader builds for the names "taesd" / "taesdxl").

The module is an ``nn.Sequential`` whose indices equal the keys of ``taesd_decoder.safetensors``
/ ``taesdxl_decoder.safetensors`` (``1.weight`` is the first conv, ``3.conv.0.weight`` the first
block's first conv ...), so the file loads with no mapping table. Layout, top to bottom:
soft clamp ``tanh(x/3)·3``, conv latent→64, ReLU, then three stages of three residual blocks,
each followed by a ×2 nearest upsample and a bias-free conv, one more block and a conv 64→3.
The output is an image in [0, 1] (roughly: previews clamp it).

The encoder (``taesd_encoder.*``) is likewise an ``nn.Sequential`` keyed by index: conv 3→64,
one block, then three stages of a stride-2 bias-free conv and three blocks, and a conv 64→latent
(``0.weight`` ... ``14.weight``). It maps an image in [0, 1] to the *scaled* latent.

``TAESDAutoencoder`` follows ComfyUI ``comfy/taesd/taesd.py`` (``TAESD.encode`` / ``decode``,
with the ``vae_scale`` / ``vae_shift`` values ``nodes.py VAELoader.load_taesd`` sets: taesd
0.18215 / 0, taesdxl 0.13025 / 0), so VAE latents stay in the unscaled space the sampler expects:
``encode(x∈[-1,1]) = enc(x/2 + 1/2) / scale + shift``,
``decode(z) = (dec((z - shift) · scale) - 1/2) · 2`` (then clamped to [0, 1] as an image).

Sizes come from tensor shapes (``TAESDConfig.from_state_dict``): the latent channel count from
the first conv, the width from its output channels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights.safetensors_io import read_tensors

__all__ = ["TAESDConfig", "TAESDDecoder", "TAESDEncoder", "TAESDAutoencoder", "TAESD_VAE_SCALES",
           "load_taesd_decoder", "load_taesd_encoder", "load_taesd_autoencoder", "TAESDFileError"]

# ComfyUI nodes.py VAELoader.load_taesd: name -> (vae_scale, vae_shift)
TAESD_VAE_SCALES = {"taesd": (0.18215, 0.0), "taesdxl": (0.13025, 0.0)}

_BLOCKS_PER_STAGE = 3
_STAGES = 3


class TAESDFileError(ValueError):
    """A file that is not a TAESD decoder; the message names the file and what is wrong."""


@dataclass(frozen=True)
class TAESDConfig:
    latent_channels: int = 4
    width: int = 64

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Tensor], where: str = "state dict") -> "TAESDConfig":
        first = sd.get("1.weight")
        last = sd.get(f"{_last_index()}.weight")
        if first is None or first.ndim != 4 or last is None or last.ndim != 4 or last.shape[0] != 3:
            raise TAESDFileError(
                f"{where}: not a TAESD decoder (expected keys '1.weight' [width, latent, 3, 3] and "
                f"'{_last_index()}.weight' [3, width, 3, 3])")
        return cls(latent_channels=int(first.shape[1]), width=int(first.shape[0]))


def _last_index() -> int:
    # clamp, conv, relu, then per stage: blocks + upsample + conv, then one block and the out conv
    return 3 + _STAGES * (_BLOCKS_PER_STAGE + 2) + 1


def _conv(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class SoftClamp(nn.Module):
    """tanh(x / 3) · 3: keeps wild latents (early sampler steps) within ±3."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x / 3) * 3


class Block(nn.Module):
    """Three 3×3 convs with ReLUs between, plus a residual (1×1 conv when widths differ)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = nn.Sequential(_conv(n_in, n_out), nn.ReLU(), _conv(n_out, n_out), nn.ReLU(),
                                  _conv(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.fuse = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.fuse(self.conv(x) + self.skip(x))


class TAESDDecoder(nn.Sequential):
    """Latent [B, C, h, w] (the sampler's scaled latent) → image [B, 3, 8h, 8w] in about [0, 1]."""

    def __init__(self, config: TAESDConfig = TAESDConfig()):
        w = config.width
        layers: list[nn.Module] = [SoftClamp(), _conv(config.latent_channels, w), nn.ReLU()]
        for _ in range(_STAGES):
            layers += [Block(w, w) for _ in range(_BLOCKS_PER_STAGE)]
            layers += [nn.Upsample(scale_factor=2), _conv(w, w, bias=False)]
        layers += [Block(w, w), _conv(w, 3)]
        super().__init__(*layers)
        self.config = config


def load_taesd_decoder(path: str | os.PathLike) -> TAESDDecoder:
    """The decoder in ``path`` (safetensors or a pickle), float32 on the CPU, eval mode."""
    sd = read_tensors(path, dtype=torch.float32)
    config = TAESDConfig.from_state_dict(sd, os.fspath(path))
    return _loaded(TAESDDecoder(config), sd, path, "decoder")


def _loaded(model: nn.Module, sd: dict, path: str | os.PathLike, what: str) -> nn.Module:
    """``model`` holding ``sd`` exactly (eval mode, no grad); a layout mismatch names the file."""
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise TAESDFileError(
            f"{os.fspath(path)}: not a TAESD {what} layout (missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]})")
    return model.eval().requires_grad_(False)


class TAESDEncoder(nn.Sequential):
    """Image [B, 3, H, W] in [0, 1] → scaled latent [B, C, H/8, W/8]."""

    def __init__(self, latent_channels: int = 4, width: int = 64):
        w = width
        layers: list[nn.Module] = [_conv(3, w), Block(w, w)]
        for _ in range(_STAGES):
            layers += [nn.Conv2d(w, w, 3, stride=2, padding=1, bias=False)]
            layers += [Block(w, w) for _ in range(_BLOCKS_PER_STAGE)]
        layers += [_conv(w, latent_channels)]
        super().__init__(*layers)
        self.config = TAESDConfig(latent_channels=latent_channels, width=width)


_ENCODER_LAST = 2 + _STAGES * (1 + _BLOCKS_PER_STAGE)


def load_taesd_encoder(path: str | os.PathLike) -> TAESDEncoder:
    """The encoder in ``path`` (safetensors or a pickle), float32 on the CPU, eval mode."""
    sd = read_tensors(path, dtype=torch.float32)
    first, last = sd.get("0.weight"), sd.get(f"{_ENCODER_LAST}.weight")
    if first is None or first.ndim != 4 or first.shape[1] != 3 or last is None or last.ndim != 4:
        raise TAESDFileError(
            f"{os.fspath(path)}: not a TAESD encoder (expected keys '0.weight' [width, 3, 3, 3] and "
            f"'{_ENCODER_LAST}.weight' [latent, width, 3, 3])")
    return _loaded(TAESDEncoder(int(last.shape[0]), int(first.shape[0])), sd, path, "encoder")


class TAESDAutoencoder(nn.Module):
    """ComfyUI's TAESD VAE: ``encode`` takes pixels in [-1, 1], ``decode`` returns them (the
    AutoencoderKL interface the VAE nodes call); latents are unscaled."""

    def __init__(self, encoder: TAESDEncoder, decoder: TAESDDecoder, scale: float, shift: float = 0.0):
        super().__init__()
        if encoder.config.latent_channels != decoder.config.latent_channels:
            raise TAESDFileError(f"TAESD encoder ({encoder.config.latent_channels} latent channels) and "
                                 f"decoder ({decoder.config.latent_channels}) do not match")
        self.taesd_encoder = encoder
        self.taesd_decoder = decoder
        self.register_buffer("vae_scale", torch.tensor(float(scale)))
        self.register_buffer("vae_shift", torch.tensor(float(shift)))

    @property
    def latent_channels(self) -> int:
        return self.taesd_decoder.config.latent_channels

    def encode(self, x: Tensor) -> Tensor:
        return self.taesd_encoder(x * 0.5 + 0.5) / self.vae_scale + self.vae_shift

    def decode(self, z: Tensor) -> Tensor:
        return self.taesd_decoder((z - self.vae_shift) * self.vae_scale).sub(0.5).mul(2)


def load_taesd_autoencoder(encoder_path: str | os.PathLike, decoder_path: str | os.PathLike,
                           name: str) -> TAESDAutoencoder:
    """The encoder/decoder pair as a VAE with ``name``'s scale and shift (``TAESD_VAE_SCALES``)."""
    if name not in TAESD_VAE_SCALES:
        raise NotImplementedError(f"TAESD VAE {name!r}: not supported yet (supported: "
                                  f"{', '.join(TAESD_VAE_SCALES)})")
    scale, shift = TAESD_VAE_SCALES[name]
    model = TAESDAutoencoder(load_taesd_encoder(encoder_path), load_taesd_decoder(decoder_path), scale, shift)
    return model.eval().requires_grad_(False)
