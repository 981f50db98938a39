"""Model merging as weight patches (ComfyUI's comfy_extras/nodes_model_merging.py semantics).

A merge never touches either model's shared weights: it appends a ``MergePatch`` to the first
model's handle. The patch names the second model's recipe (its weight source, config and its own
patches) and, per key prefix, the two strengths of ComfyUI's ``add_patches(patches,
strength_patch, strength_model)``. When the weight store materializes the merged handle it also
materializes the second model (same storage dtype, so the second model's own cache entry is
shared) and merges key by key, in float32, then casts once to the storage dtype:

    W = W1 · strength_model + strength_patch · W2

(ComfyUI's ``calculate_weight``: the weight is first multiplied by ``strength_model``, then the
"diff" patch adds ``strength_patch · W2``.) With that formula the nodes are:

- ModelMergeSimple / CLIPMergeSimple: strength_model = ratio, strength_patch = 1 - ratio, so
  ``ratio`` is model1's share (ratio 1.0 returns model1 unchanged).
- ModelMergeBlocks / ModelMergeSD1 / SD2 / SDXL: the same with a ratio per key prefix; the
  longest prefix that the key starts with wins, and keys matching none take the first ratio
  input's value.
- ModelMergeSubtract / CLIPMergeSubtract: strength_model = multiplier, strength_patch =
  -multiplier, i.e. ``multiplier · (W1 - W2)``.
- ModelMergeAdd / CLIPMergeAdd: ``W1 + W2``.

Only keys both models have are merged (keys only in model2 are ignored, as ComfyUI's
``add_patches`` only patches keys of model1). A key whose shapes differ is multiplied by
strength_model and left otherwise unmerged, with a warning (ComfyUI's "WEIGHT NOT MERGED").
CLIP merges skip ``position_ids`` and ``logit_scale``.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["MergePatch", "MergeWarning", "merged_weight", "strengths", "merge_model", "merge_clip", "SIMPLE",
           "SUBTRACT", "ADD", "CLIP_SKIP"]

SIMPLE, SUBTRACT, ADD = "simple", "subtract", "add"
# text-encoder keys a merge leaves alone (position ids and logit scale are not weights)
CLIP_SKIP = (".position_ids", ".logit_scale", "position_ids", "logit_scale")


class MergeWarning(UserWarning):
    """Some keys of a merge have different shapes in the two models and were not merged."""


def strengths(mode: str, value: float) -> tuple[float, float]:
    """(strength_model, strength_patch) of ComfyUI's ``add_patches`` for one merge mode."""
    if mode == SIMPLE:
        return float(value), 1.0 - float(value)
    if mode == SUBTRACT:
        return float(value), -float(value)
    if mode == ADD:
        return 1.0, 1.0
    raise ValueError(f"unknown merge mode {mode!r}")


@dataclass(frozen=True)
class MergePatch:
    """Merge another model's weights into the patched model's (hashable; a weight-store key).

    target:   which part it patches ("unet" or a text encoder's name: "clip_l", ...), as LoraPatch.
    source, config, patches: the other model's recipe (its ``WeightSource``, module config and
              its own patches, merged before it is blended in).
    default:  (strength_model, strength_patch) for keys no prefix matches.
    prefixed: ((key prefix, strength_model, strength_patch), ...); the longest matching prefix wins.
    skip:     key suffixes never merged.
    kind:     the weight-store kind of the other model when it differs from ``target`` (a diff
              ControlNet adds the "unet" weights of its base model).
    build:    the other model's module class, so its per-key storage dtypes are its own.
    """

    target: str
    source: Hashable
    config: Hashable
    patches: tuple
    default: tuple[float, float]
    prefixed: tuple[tuple[str, float, float], ...] = ()
    skip: tuple[str, ...] = ()
    kind: str = ""
    build: Hashable = None

    def strengths_for(self, key: str) -> tuple[float, float] | None:
        """(strength_model, strength_patch) for ``key``; None when the key is skipped."""
        if self.skip and key.endswith(self.skip):
            return None
        best, length = self.default, -1
        for prefix, sm, sp in self.prefixed:
            if key.startswith(prefix) and len(prefix) > length:
                best, length = (sm, sp), len(prefix)
        return best


def merged_weight(w32: Tensor, other: Tensor | None, strength_model: float, strength_patch: float) -> bool:
    """In place on the float32 working copy ``w32``: ``w32 · strength_model + strength_patch ·
    other``. Returns False (weight only scaled) when the shapes differ."""
    if strength_model != 1.0:
        w32 *= strength_model
    if other is None or strength_patch == 0.0:
        return True
    if tuple(other.shape) != tuple(w32.shape):
        return False
    w32 += strength_patch * other.to(torch.float32)
    return True


def warn_mismatches(patch: MergePatch, keys: list[str], shapes: Mapping[str, tuple]) -> None:
    if keys:
        examples = ", ".join(f"{k} {list(shapes[k])}" for k in keys[:3])
        warnings.warn(f"model merge ({patch.target}): {len(keys)} weights have other shapes in the second "
                      f"model and were not merged, e.g. {examples}", MergeWarning, stacklevel=3)


def merge_model(model1, model2, mode: str, value: float = 1.0, prefixed: Mapping[str, float] | None = None,
                default: float | None = None):
    """MODEL handle: ``model1`` with ``model2`` merged in (``mode``: simple / subtract / add).

    ``prefixed`` maps UNet key prefixes (e.g. "input_blocks.4.") to ratios (block merges);
    ``default`` is the ratio of keys no prefix matches (``value`` when None)."""
    base = strengths(mode, value if default is None else default)
    per = tuple((p, *strengths(mode, r)) for p, r in (prefixed or {}).items())
    patch = MergePatch("unet", model2.source, model2.config, tuple(model2.patches), base, per)
    return model1.with_patches((patch,))


def merge_clip(clip1, clip2, mode: str, value: float = 1.0):
    """CLIP handle: ``clip1`` with ``clip2`` merged in, encoder by encoder of the same name (clip_l
    with clip_l, ...); encoders only one of them has are left as they are."""
    patches = []
    for name in clip1.names:
        if name not in clip2.names:
            continue
        other = clip2.encoder(name)
        own = tuple(p for p in clip2.patches if getattr(p, "target", name) == name)
        patches.append(MergePatch(name, other.source, other.config, own, strengths(mode, value), (), CLIP_SKIP))
    return clip1.with_patches(tuple(patches)) if patches else clip1
