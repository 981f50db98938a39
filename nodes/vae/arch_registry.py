"""The registry of VAE architectures (``arch_base.VaeArch``): one line per architecture.

``VaeHandle.arch`` names one; the handle asks ``get`` for the object that builds and runs it. The
VAE loader asks ``recognise`` which architecture other than the KL VAE a file holds (the KL
layouts stay the loader's own), and the refusal table lets such files through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.vae.arch_base import VaeArch, VaeFound
from mixgraph.nodes.vae.kl_arch import KL_ARCH
from mixgraph.nodes.vae.wan_arch import WAN_ARCH

__all__ = ["ARCHS", "register", "get", "recognise", "runs"]

ARCHS: dict[str, VaeArch] = {}


def register(arch: VaeArch) -> VaeArch:
    if not isinstance(arch, VaeArch):
        raise TypeError(f"{arch!r} does not implement the VaeArch protocol (nodes/vae/arch_base.py)")
    if arch.name in ARCHS and ARCHS[arch.name] is not arch:
        raise ValueError(f"VAE architecture {arch.name!r} is registered already")
    ARCHS[arch.name] = arch
    return arch


def get(name: str) -> VaeArch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown VAE architecture {name!r} (registered: {', '.join(ARCHS)})") from None


def recognise(info: Mapping[str, Any]) -> VaeFound | None:
    """The first registered architecture's reading of a file header, or None."""
    for arch in ARCHS.values():
        found = arch.recognise(info)
        if found is not None:
            return found
    return None


def runs(info: Mapping[str, Any]) -> bool:
    """Whether a registered architecture other than the KL VAE loads this file (a file that looks
    like one but does not fit is left to the refusal table; the loader reports the misfit)."""
    try:
        return recognise(info) is not None
    except (ValueError, NotImplementedError):
        return False


register(KL_ARCH)
register(WAN_ARCH)
