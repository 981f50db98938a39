"""The registry of model families: one line per family (``base.Family``; DESIGN §11).

Loaders ask ``detect`` which family a state dict belongs to, in registration order (the more
specific signature of two families sharing a layout first); handles find their family with
``get``. Tests register toy families with ``register`` and remove them with ``unregister``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.families.base import Detection, Family
from mixgraph.nodes.families.lumina.family import LUMINA2, Z_IMAGE
from mixgraph.nodes.families.flux.family import FLUX
from mixgraph.nodes.families.qwen_image.family import QWEN_IMAGE
from mixgraph.nodes.families.sd.family import SD
from mixgraph.nodes.families.sd3.family import SD3
from mixgraph.nodes.families.wan.family import WAN

__all__ = ["FAMILIES", "register", "unregister", "get", "detect"]

FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if not isinstance(family, Family):
        raise TypeError(f"{family!r} does not implement the Family protocol (nodes/families/base.py)")
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"model family {family.name!r} is registered already")
    FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    FAMILIES.pop(name, None)


def get(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"model family {name!r} is not registered (known: {', '.join(FAMILIES)})") from None


def detect(info: Mapping[str, Any], read: Any = None, source: Any = None) -> Detection | None:
    """The first registered family that recognises ``info`` (``base.Family.detect``: the file's
    keys, the diffusion model's prefix stripped -> TensorInfo), or None."""
    for family in FAMILIES.values():
        found = family.detect(info, read, source)
        if found is not None:
            return found
    return None


# -- the registry: one line per family, the more specific signature first
register(FLUX)
register(SD)
register(LUMINA2)
register(Z_IMAGE)
register(SD3)
register(QWEN_IMAGE)
register(WAN)
