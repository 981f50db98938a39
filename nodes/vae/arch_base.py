"""The seam between the VAE handle and an autoencoder architecture (the LDM KL VAE, the Wan video
VAEs, ...): ``VaeHandle`` holds an architecture name and asks the architecture registry
(``arch_registry.py``) for the object that builds the module and maps IMAGE <-> latent with it, so
shared code has no branch per architecture.

An architecture gets the materialized module (precision applied) and the handle's config; it runs
inside the handle's ``torch.inference_mode``. Latents in and out are unscaled (the latent format
is the sampler's); IMAGE tensors are [N, H, W, 3] float32 in 0..1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from mixgraph.nodes.vae.latent_format import LatentFormat

__all__ = ["VaeArch", "VaeFound"]


@dataclass(frozen=True)
class VaeFound:
    """What an architecture recognised in a VAE file: its registry name, the config from shapes,
    the latent format it encodes to, the key prefix of its tensors in the file and their key
    layout (``weights/layouts.py``; None: the module's own names)."""

    arch: str
    config: Any
    latent_format: LatentFormat
    prefix: str = ""
    layout: str | None = None


@runtime_checkable
class VaeArch(Protocol):
    name: str

    def build(self, config: Any) -> nn.Module:
        """The module of ``config`` (built on the meta device by the weight store)."""

    def recognise(self, info: Mapping[str, Any]) -> VaeFound | None:
        """This architecture's reading of a file's header (key -> object with ``.shape``), or None."""

    def decode(self, module: nn.Module, samples: Tensor, config: Any) -> Tensor:
        """VAEDecode: latent -> IMAGE."""

    def decode_tiled(self, module: nn.Module, samples: Tensor, config: Any, tile_size: int, overlap: int,
                     temporal_size: int, temporal_overlap: int) -> Tensor:
        """VAEDecodeTiled (sizes in pixels and pixel frames, as the node's inputs)."""

    def encode(self, module: nn.Module, pixels: Tensor, config: Any) -> Tensor:
        """VAEEncode: IMAGE -> latent (the posterior mean)."""

    def encode_tiled(self, module: nn.Module, pixels: Tensor, config: Any, tile_size: int, overlap: int,
                     temporal_size: int, temporal_overlap: int) -> Tensor:
        """VAEEncodeTiled."""

    def trace(self, config: Any, mode: str, batch: int, h: int, w: int) -> Callable[[nn.Module], Any]:
        """The memory estimate's run of one ``mode`` ("decode" | "encode") call on an h x w image
        (pixels) with dummy inputs, given the module."""
