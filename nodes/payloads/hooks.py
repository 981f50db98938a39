"""HOOKS and HOOK_KEYFRAMES: ComfyUI's scheduled weight hooks (``comfy/hooks.py``) as frozen data.

A hook is a LoRA (or another checkpoint used as a LoRA) that is *not* merged into the MODEL or
CLIP handle: it rides on conds (``Cond.hooks``) and on a CLIP handle (``SetClipHooks``), and is
applied only while those conds are evaluated (sampling) or that text is encoded. Its strength
is multiplied, step by step, by the keyframe active at the current sampling percent.

Payloads hold no weights merged onto a model: a ``LoraWeights`` keeps the file's tensors and is
mapped onto a model's keys when a hook is applied (``nodes/models/hooks.py``), so one hook works
on any SD 1.x / 2.x / SDXL model its LoRA fits, as in ComfyUI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["HookKeyframe", "HookKeyframes", "LoraWeights", "ModelWeights", "WeightHook", "HookGroup"]


@dataclass(frozen=True)
class HookKeyframe:
    """One keyframe: from ``start_percent`` of sampling on, the hook's strengths are multiplied by
    ``strength``; it stays active for at least ``guarantee_steps`` model calls (steps) once
    reached, unless it starts before the sampled range (ComfyUI's ``HookKeyframe``)."""

    strength: float
    start_percent: float = 0.0
    guarantee_steps: int = 1


@dataclass(frozen=True)
class HookKeyframes:
    """HOOK_KEYFRAMES: keyframes ordered by ``start_percent`` (equal percents keep the order they
    were added in). Empty: strength multiplier 1 throughout."""

    keyframes: tuple[HookKeyframe, ...] = ()

    def add(self, kf: HookKeyframe) -> "HookKeyframes":
        # sorted() is stable: keyframes at one percent stay in the order they were added
        return HookKeyframes(tuple(sorted(self.keyframes + (kf,), key=lambda k: k.start_percent)))


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """A LoRA file's tensors (not yet mapped onto a model). Equal and hashed by ``identity``
    (the file's path, size and mtime), so a weight-store key built from it is stable."""

    tensors: Mapping[str, torch.Tensor] = field(repr=False)
    name: str
    identity: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoraWeights) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


@dataclass(frozen=True)
class ModelWeights:
    """CreateHookModelAsLora: another checkpoint's MODEL and CLIP handles, blended into the
    model's weights by the hook's strength."""

    model: Any  # ModelHandle | None
    clip: Any  # ClipHandle | None
    name: str = ""


@dataclass(frozen=True)
class WeightHook:
    """One weight hook (ComfyUI's ``WeightHook``, hooked-only scope).

    ref:       what makes two hooks the same hook (ComfyUI's ``hook_ref``): combining hook
               groups keeps one hook per ref, the first.
    weights:   ``LoraWeights`` or ``ModelWeights``.
    strength_model, strength_clip: the hook's strengths; at a step each is multiplied by the
               active keyframe's strength.
    keyframes: the schedule (``SetHookKeyframes``).
    """

    ref: str
    weights: LoraWeights | ModelWeights
    strength_model: float = 1.0
    strength_clip: float = 1.0
    keyframes: HookKeyframes = HookKeyframes()


@dataclass(frozen=True)
class HookGroup:
    """HOOKS: an ordered set of hooks (by ``ref``)."""

    hooks: tuple[WeightHook, ...] = ()

    def __len__(self) -> int:
        return len(self.hooks)

    def combine(self, other: "HookGroup | None") -> "HookGroup":
        """This group's hooks, then the other's whose ref is new (ComfyUI ``clone_and_combine``)."""
        if other is None:
            return self
        refs = {h.ref for h in self.hooks}
        return HookGroup(self.hooks + tuple(h for h in other.hooks if h.ref not in refs))

    def with_keyframes(self, keyframes: HookKeyframes | None) -> "HookGroup":
        """Every hook scheduled by ``keyframes`` (None: no schedule), refs kept."""
        kf = keyframes if keyframes is not None else HookKeyframes()
        return HookGroup(tuple(WeightHook(h.ref, h.weights, h.strength_model, h.strength_clip, kf)
                               for h in self.hooks))

    @staticmethod
    def combine_all(groups) -> "HookGroup | None":
        """CombineHooks: the given groups (None skipped) combined in order; None when none."""
        present = [g for g in groups if g is not None]
        if not present:
            return None
        out = present[0]
        for g in present[1:]:
            out = out.combine(g)
        return out
