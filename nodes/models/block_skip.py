"""Leaving transformer blocks out of one model call: the forward-time patch skip-layer guidance
hands the model (ComfyUI's ``patches_replace["dit"][(kind, i)]`` replaced by the identity).

A family runner that can skip blocks says which (``skippable_blocks``: block kind -> count,
e.g. ``{"double_block": 24}`` for SD3's joint blocks) and takes ``SkipBlocks`` patches in its
``__call__``; a skipped block passes its tokens through unchanged. Indices at or beyond the
count are ignored, as ComfyUI ignores a replacement no block asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SkipBlocks", "skipped_blocks"]


@dataclass(frozen=True)
class SkipBlocks:
    """Leave the blocks ``indices`` of kind ``kind`` ("double_block", "single_block") out of
    this model call."""

    kind: str
    indices: tuple[int, ...]


def skipped_blocks(patches: Iterable, kind: str) -> frozenset[int]:
    """The indices of ``kind`` blocks the ``SkipBlocks`` among ``patches`` leave out."""
    return frozenset(i for p in patches if isinstance(p, SkipBlocks) and p.kind == kind for i in p.indices)
