"""Weight hooks onto models: a hook's LoRA (or model-as-LoRA) as weight patches of a given MODEL
or CLIP handle, the CLIP keyframe schedule, and text encoding with hooks (``SetClipHooks``).

The hook payloads are in ``nodes/payloads/hooks.py``. A hook is applied by appending ordinary
weight patches to a handle (``LoraPatch`` mapped by ``lora.load_lora``, the one LoRA key mapping;
``MergePatch`` for a checkpoint used as a LoRA), so the weight store merges and caches a hooked
model like any LoRA stack (one entry per distinct set of strengths).

Model as LoRA (ComfyUI's "model_as_lora" weight patch): the hook adds ``s · (W_other −
W_original)`` to the current weights W (already patched by a LoraLoader or a merge before the
hook), W_original being the hooked model's checkpoint weights without any patch. It is two
``merge.MergePatch`` entries in one float32 pass: ``W − s · W_original``, then ``+ s · W_other``
(in that order, so an unpatched model at s = 1 gets W_other exactly; a key the other model
lacks, or with another shape, is left as it is).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections import OrderedDict

from mixgraph.nodes.adapters.lora import LoraFile, LoraKeyWarning, load_lora
from mixgraph.nodes.adapters.lora_keys import group_modules
from mixgraph.nodes.weights.merge import CLIP_SKIP, MergePatch
from mixgraph.nodes.weights.safetensors_io import WeightSource, read_tensors
from mixgraph.nodes.payloads.hooks import HookGroup, LoraWeights, ModelWeights, WeightHook

__all__ = ["read_lora_weights", "unet_patches", "clip_patches", "clip_schedule", "encode_with_hooks"]


def read_lora_weights(path: str | os.PathLike) -> LoraWeights:
    """A LoRA file's tensors for a hook (CreateHookLora). Raises ValueError naming the file when
    it cannot be read or holds no LoRA tensors (a checkpoint or other model picked by mistake)."""
    name = os.path.basename(os.fspath(path))
    try:
        sd = read_tensors(path)
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file, said with its name
        raise ValueError(f"LoRA {name!r} could not be read: {e}") from e
    grouped, stray = group_modules(sd)
    if not grouped:
        examples = ", ".join(list(stray)[:3]) or "none"
        raise ValueError(
            f"{name!r} is not a LoRA file: none of its {len(sd)} tensors is a LoRA/LyCORIS weight "
            f"(lora_up/lora_down, lora_A/lora_B, hada_*, lokr_*, diff), e.g. {examples}")
    return LoraWeights(sd, name, repr(WeightSource.from_file(path).file_identity))


_MAPPED: OrderedDict = OrderedDict()  # (weights, part, model identity) -> LoraFile, a small LRU


def _mapped(weights: LoraWeights, part: str, handle) -> LoraFile:
    """``weights`` mapped onto the UNet (part "unet") or the text encoders (part "clip") of
    ``handle``; remembered per (file, model weights) so a sampling run maps a hook once."""
    if part == "unet":
        ident = (handle.source,)
    else:
        ident = handle.encoders  # the entries: names, weights and configs
    key = (weights, part, ident)
    hit = _MAPPED.get(key)
    if hit is not None:
        _MAPPED.move_to_end(key)
        return hit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoraKeyWarning)  # ComfyUI maps hooks with log_missing=False
        if part == "unet":
            lf = load_lora(weights.tensors, handle.weight_shapes(), None, name=weights.name,
                           identity=weights.identity, unet_names=handle.lora_names())
        else:
            lf = load_lora(weights.tensors, None, handle.weight_shapes(), name=weights.name,
                           identity=weights.identity)
    _MAPPED[key] = lf
    while len(_MAPPED) > 32:
        _MAPPED.popitem(last=False)
    return lf


def unet_patches(hook: WeightHook, multiplier: float, model) -> tuple:
    """Weight patches of ``hook`` for the MODEL handle ``model`` at keyframe strength
    ``multiplier`` (strength = strength_model · multiplier; 0 gives no patch)."""
    s = hook.strength_model * multiplier
    if s == 0.0:
        return ()
    w = hook.weights
    if isinstance(w, LoraWeights):
        lf = _mapped(w, "unet", model)
        return (lf.patch("unet", s),) if lf.adapters.get("unet") else ()
    if isinstance(w, ModelWeights) and w.model is not None:
        other = w.model
        return (MergePatch("unet", model.source, model.config, (), (1.0, -s)),
                MergePatch("unet", other.source, other.config, tuple(other.patches), (1.0, s)))
    return ()


def clip_patches(hook: WeightHook, multiplier: float, clip) -> tuple:
    """Weight patches of ``hook`` for the CLIP handle ``clip`` (strength_clip · multiplier)."""
    s = hook.strength_clip * multiplier
    if s == 0.0:
        return ()
    w = hook.weights
    if isinstance(w, LoraWeights):
        lf = _mapped(w, "clip", clip)
        return tuple(lf.patch(t, s) for t in clip.names if lf.adapters.get(t))
    if isinstance(w, ModelWeights) and w.clip is not None:
        out = []
        for mine in clip.encoders:
            name = mine.name
            if name not in w.clip.names:
                continue
            theirs = w.clip.encoder(name)
            own = tuple(p for p in w.clip.patches if getattr(p, "target", name) == name)
            out.append(MergePatch(name, mine.source, mine.config, (), (1.0, -s), (), CLIP_SKIP))
            out.append(MergePatch(name, theirs.source, theirs.config, own, (1.0, s), (), CLIP_SKIP))
        return tuple(out)
    return ()


def clip_schedule(group: HookGroup) -> list[tuple[tuple[float, float], list[tuple[WeightHook, float]]]]:
    """ComfyUI's ``get_hooks_for_clip_schedule``: the sampling-percent ranges over which every
    hook's keyframe strength is constant, each with (hook, keyframe strength) per hook.

    A hook's ranges run from each keyframe whose strength differs from the previous one to the
    next such keyframe (the last to 1.0); keyframes at the same percent keep the last one.
    Outside a hook's ranges (before its first keyframe) its multiplier is 1."""
    per_hook: list[tuple[WeightHook, list[tuple[tuple[float, float], float | None]]]] = []
    for hook in group.hooks:
        kfs = hook.keyframes.keyframes
        if not kfs:
            per_hook.append((hook, [((0.0, 1.0), None)]))
            continue
        ranges: list[tuple[tuple[float, float], float | None]] = []
        prev = kfs[0]
        for kf in kfs:
            if kf.start_percent > prev.start_percent and not math.isclose(kf.strength, prev.strength):
                ranges.append(((prev.start_percent, kf.start_percent), prev.strength))
                prev = kf
            elif kf.start_percent == prev.start_percent:
                prev = kf
        if not math.isclose(prev.start_percent, 1.0):
            ranges.append(((prev.start_percent, 1.0), prev.strength))
        per_hook.append((hook, ranges))
    bounds = sorted({0.0} | {b for _, ranges in per_hook for r, _ in ranges for b in r})
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        pairs = []
        for hook, ranges in per_hook:
            strength = next((s for (a, b), s in ranges if a < hi and b > lo), None)
            pairs.append((hook, 1.0 if strength is None else float(strength)))
        out.append(((lo, hi), pairs))
    return out


def encode_with_hooks(clip, text: str, policy, **kw) -> tuple:
    """``ClipHandle.encode`` for a handle carrying hooks (SetClipHooks; ComfyUI's
    ``encode_from_tokens_scheduled``).

    Without ``hooks_schedule`` the text is encoded once with every hook's CLIP part at
    strength_clip (keyframes ignored). With it, once per range of ``clip_schedule`` at the
    keyframe strengths, each cond limited to its range (``Cond.clip_range``, intersected with the
    cond's timestep range at sampling). With ``hooks_to_conds`` the conds carry the hooks
    (keyframes kept), so the UNet applies them at sampling too."""
    group: HookGroup = clip.hooks
    base = dataclasses.replace(clip, hooks=None)
    if clip.hooks_schedule:
        schedule = clip_schedule(group)
    else:
        schedule = [((0.0, 1.0), [(h, 1.0) for h in group.hooks])]
    out = []
    for (lo, hi), pairs in schedule:
        patches = tuple(p for hook, m in pairs for p in clip_patches(hook, m, base))
        conds = (base.with_patches(patches) if patches else base).encode(text, policy, **kw)
        changes = {}
        if clip.hooks_schedule:
            changes["clip_range"] = (lo, hi)
        if clip.hooks_to_conds:
            changes["hooks"] = group
        out.extend(dataclasses.replace(c, **changes) if changes else c for c in conds)
    return tuple(out)
