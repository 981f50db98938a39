"""The decoder of TAESD, the Tiny AutoEncoder for Stable Diffusion (Ollin Boer Bohan 2023,
github.com/madebyollin/taesd), used for sampler previews.

The module is an ``nn.Sequential`` whose indices equal the keys of ``taesd_decoder.safetensors``
/ ``taesdxl_decoder.safetensors`` (``1.weight`` is the first conv, ``3.conv.0.weight`` the first
block's first conv ...), so the file loads with no mapping table. Layout, top to bottom:
soft clamp ``tanh(x/3)·3``, conv latent→64, ReLU, then three stages of three residual blocks,
each followed by a ×2 nearest upsample and a bias-free conv, one more block and a conv 64→3.
The output is an image in [0, 1] (roughly: previews clamp it).

Sizes come from tensor shapes (``TAESDConfig.from_state_dict``): the latent channel count from
the first conv, the width from its output channels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor, nn

from mixgraph.nodes.models.safetensors_io import read_tensors

__all__ = ["TAESDConfig", "TAESDDecoder", "load_taesd_decoder", "TAESDFileError"]

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
    model = TAESDDecoder(config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise TAESDFileError(
            f"{os.fspath(path)}: not a TAESD decoder layout (missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]})")
    return model.eval().requires_grad_(False)
