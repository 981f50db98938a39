"""Plain functions for the hook nodes (ComfyUI ``comfy_extras/nodes_hooks.py`` on ``comfy/hooks.py``):
creating hooks and keyframe schedules, and setting hooks, masks and timestep ranges on conds.

Payloads are in ``nodes/payloads/hooks.py``; what a hook does while encoding and sampling is in
``nodes/models/hooks.py`` and ``nodes/sampling/hooks.py``. Every function returns new values.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
from collections.abc import Iterable, Sequence

import torch

from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.models.hooks import read_lora_weights
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.hooks import HookGroup, HookKeyframe, HookKeyframes, ModelWeights, WeightHook

Conditioning = tuple[Cond, ...]

INTERPOLATIONS = ("linear", "ease_in", "ease_out", "ease_in_out")

__all__ = ["INTERPOLATIONS", "lora_hook", "model_as_lora_hook", "keyframe", "interpolated_keyframes",
           "keyframes_from_floats", "set_hooks", "set_props", "set_props_and_combine",
           "set_default_and_combine"]


def _new_ref(what: str) -> str:
    # ComfyUI's hook_ref: every created hook is its own hook, even for the same file
    return f"{what}#{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------- hooks


def lora_hook(path: str | os.PathLike, strength_model: float, strength_clip: float,
              prev: HookGroup | None) -> HookGroup:
    """CreateHookLora: ``prev``'s hooks then a new LoRA hook; both strengths 0 gives ``prev``
    (an empty group when there is none), as ComfyUI."""
    prev = prev if prev is not None else HookGroup()
    if strength_model == 0 and strength_clip == 0:
        return prev
    weights = read_lora_weights(path)
    hook = WeightHook(_new_ref(weights.identity), weights, float(strength_model), float(strength_clip))
    return prev.combine(HookGroup((hook,)))


def model_as_lora_hook(model, clip, name: str, strength_model: float, strength_clip: float,
                       prev: HookGroup | None) -> HookGroup:
    """CreateHookModelAsLora: a hook blending another checkpoint's MODEL (and CLIP) in."""
    prev = prev if prev is not None else HookGroup()
    weights = ModelWeights(model, clip if strength_clip else None, name)
    hook = WeightHook(_new_ref(name), weights, float(strength_model), float(strength_clip))
    return prev.combine(HookGroup((hook,)))


# ------------------------------------------------------------------------------ keyframes


def keyframe(prev: HookKeyframes | None, strength_mult: float, start_percent: float) -> HookKeyframes:
    """CreateHookKeyframe: one keyframe (guaranteed for 1 step) added to ``prev``."""
    return (prev or HookKeyframes()).add(HookKeyframe(float(strength_mult), float(start_percent), 1))


def _weights(start: float, end: float, n: int, method: str) -> list[float]:
    """ComfyUI's ``InterpolationMethod.get_weights``: n values from start to end (float32, as
    ComfyUI computes them with torch.linspace) along the named curve."""
    index = torch.linspace(0, 1, n)
    diff = end - start
    if method == "linear":
        w = torch.linspace(start, end, n)
    elif method == "ease_in":
        w = diff * index.pow(2) + start
    elif method == "ease_out":
        w = diff * (1 - (1 - index).pow(2)) + start
    elif method == "ease_in_out":
        w = diff * ((1 - torch.cos(index * math.pi)) / 2) + start
    else:
        raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {method!r}")
    return [float(v) for v in w]


def _add_series(prev: HookKeyframes | None, percents: Sequence[float], strengths: Sequence[float],
                print_keyframes: bool, log=None) -> HookKeyframes:
    out = prev or HookKeyframes()
    for i, (p, s) in enumerate(zip(percents, strengths)):
        out = out.add(HookKeyframe(float(s), float(p), 1 if i == 0 else 0))  # only the first is guaranteed
        if print_keyframes and log is not None:
            log(f"Hook Keyframe - start_percent:{p} = {s}")
    return out


def interpolated_keyframes(prev: HookKeyframes | None, strength_start: float, strength_end: float,
                           interpolation: str, start_percent: float, end_percent: float, count: int,
                           print_keyframes: bool = False, log=None) -> HookKeyframes:
    """CreateHookKeyframesInterpolated: ``count`` keyframes at evenly spaced percents, strengths
    along the interpolation curve."""
    return _add_series(prev, _weights(start_percent, end_percent, count, "linear"),
                       _weights(strength_start, strength_end, count, interpolation), print_keyframes, log)


def keyframes_from_floats(prev: HookKeyframes | None, floats, start_percent: float, end_percent: float,
                          print_keyframes: bool = False, log=None) -> HookKeyframes:
    """CreateHookKeyframesFromFloats: one keyframe per float, at evenly spaced percents."""
    if isinstance(floats, (int, float)) and not isinstance(floats, bool):
        floats = [float(floats)]
    elif isinstance(floats, torch.Tensor):
        floats = [float(v) for v in floats.reshape(-1)]
    elif isinstance(floats, Iterable) and not isinstance(floats, (str, bytes)):
        floats = [float(v) for v in floats]
    else:
        raise ValueError(f"floats_strength must be a float or a list of floats, got {type(floats).__name__}")
    if not floats:
        raise ValueError("floats_strength is empty: no keyframe to create")
    return _add_series(prev, _weights(start_percent, end_percent, len(floats), "linear"), floats,
                       print_keyframes, log)


# ------------------------------------------------------------------------------ conds


def set_hooks(conds: Conditioning, hooks: HookGroup | None) -> Conditioning:
    """Hooks added to every cond: a cond's own hooks first, then the new ones (ComfyUI's
    ``set_hooks_for_conditioning`` with append_hooks)."""
    if hooks is None:
        return tuple(conds)
    return tuple(dataclasses.replace(c, hooks=hooks if c.hooks is None else c.hooks.combine(hooks))
                 for c in conds)


def set_props(conds: Conditioning, strength: float, set_cond_area: str, mask=None,
              hooks: HookGroup | None = None, timesteps: tuple[float, float] | None = None) -> Conditioning:
    """ComfyUI's ``set_conds_props`` for one CONDITIONING: hooks, then the mask (``strength`` is
    the mask's strength, used only with a mask), then the timestep range."""
    out = set_hooks(conds, hooks)
    if mask is not None:
        out = cond_ops.set_mask(out, mask, strength, set_cond_area)
    if timesteps is not None:
        out = cond_ops.set_timestep_range(out, timesteps[0], timesteps[1])
    return out


def set_props_and_combine(conds: Conditioning, new: Conditioning, strength: float = 1.0,
                          set_cond_area: str = "default", mask=None, hooks: HookGroup | None = None,
                          timesteps: tuple[float, float] | None = None) -> Conditioning:
    """``conds`` followed by ``new`` with the properties set (ComfyUI ``set_conds_props_and_combine``)."""
    return tuple(conds) + set_props(new, strength, set_cond_area, mask, hooks, timesteps)


def set_default_and_combine(conds: Conditioning, new: Conditioning, hooks: HookGroup | None = None,
                            timesteps: tuple[float, float] | None = None) -> Conditioning:
    """``conds`` followed by ``new`` marked default (``Cond.default``), with the hooks set."""
    marked = tuple(dataclasses.replace(c, default=True) for c in set_hooks(new, hooks))
    if timesteps is not None:
        marked = cond_ops.set_timestep_range(marked, timesteps[0], timesteps[1])
    return tuple(conds) + marked
