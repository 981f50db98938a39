"""UPSCALE_MODEL: an ESRGAN-family upscaler (``esrgan.py``) loaded by shape, and ComfyUI's
``ImageUpscaleWithModel``: the image goes through the model tile by tile (512 px tiles
overlapping by 32, feather-blended as ``vae.tiled_map`` / ComfyUI's ``tiled_scale``), and the tile
is halved after an out-of-memory error down to 128 px. The scale comes from the model."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.image_models.esrgan import RRDBConfig, RRDBNet, UpscaleModelError, old_layout_rename
from mixgraph.nodes.weights.safetensors_io import WeightFileError, WeightSource, inspect_file
from mixgraph.nodes.vae.vae import tiled_map

__all__ = ["UpscaleModelHandle", "load_upscale_model", "upscale_image", "UpscaleModelError"]

TILE, OVERLAP, MIN_TILE = 512, 32, 128


@dataclass(frozen=True)
class UpscaleModelHandle:
    """UPSCALE_MODEL: an RRDBNet recipe; ``runner(policy)`` is the precision-applied module."""

    source: WeightSource
    config: RRDBConfig
    precision: PolicyLike | None = None

    @property
    def scale(self) -> float:
        return self.config.scale

    def runner(self, policy: PolicyLike) -> torch.nn.Module:
        stored = (inspect_file(self.source.path) if self.source.path is not None
                  else (self.source.tensors or {}))
        p = self.source.prefix
        keys = [k[len(p):] for k in stored if k.startswith(p)]
        rename = old_layout_rename(keys) if self.config.old_layout else (lambda k: k)
        module = store.materialize("upscale_model", self.source, self.config, policy.storage, (),
                                   RRDBNet, rename)
        return apply_precision(module, policy)

    def with_precision(self, policy: PolicyLike | None) -> "UpscaleModelHandle":
        return dataclasses.replace(self, precision=policy)


def load_upscale_model(path: str | os.PathLike) -> UpscaleModelHandle:
    """UpscaleModelLoader: the file's architecture and sizes from its header."""
    try:
        info = inspect_file(path)
    except WeightFileError as e:
        raise UpscaleModelError(str(e)) from e
    shapes = {k: tuple(v.shape) for k, v in info.items()}
    prefix = "module." if shapes and all(k.startswith("module.") for k in shapes) else ""
    if prefix:
        shapes = {k[len(prefix):]: v for k, v in shapes.items()}
    config = RRDBConfig.from_shapes(shapes, os.fspath(path))
    return UpscaleModelHandle(WeightSource.from_file(path, prefix), config)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


@torch.no_grad()
def upscale_image(model: torch.nn.Module, config: RRDBConfig, image: Tensor, tile: int = TILE,
                  overlap: int = OVERLAP) -> Tensor:
    """IMAGE [B, H, W, C] in [0, 1] → [B, H·scale, W·scale, C], clamped to [0, 1]; ``model`` is
    a runner of a handle with ``config``."""
    if image.shape[-1] != config.in_channels:
        raise UpscaleModelError(f"the upscale model takes {config.in_channels}-channel images, "
                                f"got {image.shape[-1]} channels")
    device = next(model.parameters()).device
    x = image.movedim(-1, 1).float()                             # [B, C, H, W]
    scale, out_channels = config.scale, config.out_channels

    def run(t: Tensor) -> Tensor:
        return model(t.to(device)).float().cpu()

    while True:
        try:
            out = tiled_map(x, run, (tile, tile), overlap, scale, out_channels)
            break
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e) or tile // 2 < MIN_TILE:
                raise
            tile //= 2
    return out.clamp(0.0, 1.0).movedim(1, -1)                    # [B, H', W', C]
