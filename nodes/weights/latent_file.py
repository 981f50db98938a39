"""ComfyUI's ``.latent`` files (nodes.py SaveLatent / LoadLatent): safetensors holding
``latent_tensor`` (the unscaled latent, [B, C, H, W]) and the empty marker
``latent_format_version_0``, with the workflow in the metadata like saved images.

Version 0 is the current format: the tensor is stored as the VAE produced it. Files without the
marker come from before it and hold latents multiplied by SD1's scale factor, so loading divides
them by 0.18215 (ComfyUI's rule, whatever the model).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from mixgraph.nodes.weights.save import write_safetensors

__all__ = ["VERSION_KEY", "LEGACY_SCALE", "save_latent", "load_latent"]

VERSION_KEY = "latent_format_version_0"
LEGACY_SCALE = 0.18215


def save_latent(path: str | os.PathLike, samples: Tensor, metadata: Mapping[str, str] | None = None) -> None:
    write_safetensors(path, {"latent_tensor": samples.detach().to("cpu").contiguous(),
                             VERSION_KEY: torch.tensor([])}, metadata)


def load_latent(path: str | os.PathLike) -> Tensor:
    """The latent tensor of a ``.latent`` file, float32, in today's (unscaled) convention."""
    try:
        sd = load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{os.fspath(path)}: not a readable .latent (safetensors) file: {e}") from None
    if "latent_tensor" not in sd:
        raise ValueError(f"{os.fspath(path)}: no 'latent_tensor' in this file (keys: {sorted(sd)[:5]})")
    scale = 1.0 if VERSION_KEY in sd else 1.0 / LEGACY_SCALE
    return sd["latent_tensor"].float() * scale
