"""LoRA in bypass mode (ComfyUI's ``LoraLoaderBypass``: ``comfy/sd.py``
``load_bypass_lora_for_models`` and ``comfy/weight_adapter/bypass.py``, 407805c): the adapted
layers compute ``f(x) + h(x)`` in the forward pass, h the adapter's path at the patch strength,
instead of running with merged weights ``W + ΔW``.

A ``BypassPatch`` sits in a handle's ``patches`` like a ``LoraPatch`` (hashable, in stack order)
but is never merged: ``split`` separates it from the weight patches before materialization and
``install`` registers a forward hook on each adapted Linear / Conv of the freshly materialized
(precision-applied) module, which is private to that use (``store.materialize`` builds a new
module every call), so nothing shared is touched.

h per adapter kind:
  LoRA / LoCon: ``up(down(x))`` (Tucker: ``up(mid(down(x)))``), the conv's stride / padding /
    dilation / groups on the down (or mid) conv, up as a 1×1 conv; times strength·alpha/rank.
  LoHa / LoKr: the layer's op with the adapter's ΔW (strength·scale·ΔW) and no bias.
DoRA modules (``dora_scale``) are refused (NotImplementedError naming the module): their
magnitude rescaling needs the merged weight's norms; use LoraLoader, which merges them.
Full differences (``diff`` / ``diff_b``) are merged as weight patches, as ComfyUI applies its
non-adapter patches by regular patching. A sliced weight (``lora.SlicedAdapter``: diffusers' q, k,
v onto a fused qkv) adds each piece's h into its output columns (halves swapped where the piece
says so); only Linear layers have such pieces. h runs in the layer output's dtype with the adapter
weights cast to it (ComfyUI casts them to the layer weight's dtype).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.weights.cast import Int8Linear
from mixgraph.nodes.adapters.lora import LoraAdapter, LoraFile, LoraPatch, SlicedAdapter, is_diff

__all__ = ["BypassPatch", "bypass_patches", "split", "install"]


@dataclass(frozen=True)
class BypassPatch:
    """One LoRA applied in bypass mode to one model part (hashable, like ``LoraPatch``)."""

    lora: LoraFile
    strength: float
    target: str  # "unet" or a text encoder's name ("clip_l", ...)
    bypass: bool = True  # marks it for ``lora.apply_patches``, which refuses to merge it


def _only(lora: LoraFile, diff: bool, tag: str) -> LoraFile:
    adapters = {t: {k: a for k, a in per.items() if is_diff(a) == diff}
                for t, per in lora.adapters.items()}
    return dataclasses.replace(lora, identity=f"{lora.identity}#{tag}", adapters=adapters)


def bypass_patches(lora: LoraFile, strength_model: float, strength_clip: float,
                   with_clip: bool) -> tuple[tuple, tuple]:
    """(unet patches, clip patches) of LoraLoaderBypass: the adapters as ``BypassPatch``es, the
    full differences as merged ``LoraPatch``es; a zero strength or absent part gives ()."""
    for per in lora.adapters.values():
        for key, ad in per.items():
            parts = [p.adapter for p in ad.pieces] if isinstance(ad, SlicedAdapter) else [ad]
            if any(getattr(a, "dora_scale", None) is not None for a in parts):
                raise NotImplementedError(
                    f"LoRA {lora.name!r}: {key} is a DoRA module (dora_scale); DoRA in bypass mode "
                    f"(LoraLoaderBypass) is not supported yet; load it with LoraLoader")
    hooked, merged = _only(lora, False, "bypass"), _only(lora, True, "diff")

    def part(targets, strength):
        out = []
        if not strength:
            return ()
        for t in targets:
            if merged.adapters.get(t):
                out.append(LoraPatch(merged, float(strength), t))
            if hooked.adapters.get(t):
                out.append(BypassPatch(hooked, float(strength), t))
        return tuple(out)

    clip_targets = tuple(t for t in lora.targets if t != "unet") if with_clip else ()
    return part(("unet",), strength_model), part(clip_targets, strength_clip)


def split(patches: tuple) -> tuple[tuple, tuple]:
    """(weight patches, bypass patches) of a handle's ``patches``, each in stack order."""
    return (tuple(p for p in patches if not getattr(p, "bypass", False)),
            tuple(p for p in patches if getattr(p, "bypass", False)))


def _conv_kw(m: nn.Module) -> dict:
    return dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups)


def _lora_path(ad: LoraAdapter, m: nn.Module, x: Tensor, dtype: torch.dtype) -> Tensor:
    up, down = ad.up.to(x.device, dtype), ad.down.to(x.device, dtype)
    if isinstance(m, nn.Conv2d):
        if ad.mid is None:
            h = F.conv2d(x, down, **_conv_kw(m))
        else:
            h = F.conv2d(x, down)
            h = F.conv2d(h, ad.mid.to(x.device, dtype), **_conv_kw(m))
        return F.conv2d(h, up.reshape(up.shape[0], up.shape[1], 1, 1))
    if isinstance(m, nn.Conv1d):
        h = F.conv1d(x, down.reshape(down.shape[0], down.shape[1], -1), **_conv_kw(m))
        return F.conv1d(h, up.reshape(up.shape[0], up.shape[1], 1))
    return F.linear(F.linear(x, down.flatten(1)), up.flatten(1))


def _delta_path(ad, m: nn.Module, x: Tensor, dtype: torch.dtype) -> Tensor:
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        delta = ad.raw(m.weight.shape).to(x.device, dtype)
    else:  # a Linear (an int8 one stores its weight transposed)
        delta = ad.raw(torch.Size(ad.flat_shape())).to(x.device, dtype)
    if isinstance(m, nn.Conv2d):
        return F.conv2d(x, delta, **_conv_kw(m))
    if isinstance(m, nn.Conv1d):
        return F.conv1d(x, delta, **_conv_kw(m))
    return F.linear(x, delta)


def _piece_path(ad: SlicedAdapter, m: nn.Module, x: Tensor, dtype: torch.dtype, strength: float) -> Tensor:
    """Each piece's h placed in its output columns of a Linear (zeros elsewhere)."""
    if not isinstance(m, (nn.Linear, Int8Linear)):
        raise ValueError(f"LoRA pieces of a fused weight (bypass) adapt Linear layers only, not {type(m).__name__}")
    width = m.out_features
    total = None
    for piece in ad.pieces:
        a = piece.adapter
        path = _lora_path if isinstance(a, LoraAdapter) else _delta_path
        h = (strength * a.scale) * path(a, m, x, dtype)  # [..., size]
        if piece.swap_halves:
            first, second = h.chunk(2, dim=-1)
            h = torch.cat([second, first], dim=-1)
        start = 0 if piece.rows is None else piece.rows[0]
        h = F.pad(h, (start, width - start - h.shape[-1]))  # [..., out]
        total = h if total is None else total + h
    return total


def _hook(items: list[tuple[LoraAdapter, float]]):
    def forward_hook(m: nn.Module, args, out: Tensor) -> Tensor:
        x = args[0].to(out.dtype)
        for ad, strength in items:
            if isinstance(ad, SlicedAdapter):
                out = out + _piece_path(ad, m, x, out.dtype, strength)
                continue
            path = _lora_path if isinstance(ad, LoraAdapter) else _delta_path
            out = out + (strength * ad.scale) * path(ad, m, x, out.dtype)
        return out

    return forward_hook


def install(module: nn.Module, patches: tuple, target: str, what: str = "model") -> nn.Module:
    """Register the bypass hooks of ``patches`` (those for ``target``) on ``module``; returns it.
    A key naming no Linear/Conv of the module raises ValueError naming the LoRA."""
    per_layer: dict[str, list] = {}
    for p in patches:
        if p.target != target or p.strength == 0.0:
            continue
        for key, ad in p.lora.adapters.get(target, {}).items():
            if not key.endswith(".weight"):
                continue
            per_layer.setdefault(key[: -len(".weight")], []).append((ad, p.strength))
    for name, items in per_layer.items():
        try:
            layer = module.get_submodule(name)
        except AttributeError:
            layer = None
        if not isinstance(layer, (nn.Linear, Int8Linear, nn.Conv1d, nn.Conv2d)):
            lora = next(p.lora.name for p in patches if p.target == target)
            raise ValueError(f"LoRA {lora!r} (bypass, {what}): {name} is not a Linear or Conv layer of "
                             f"this model; bypass mode adapts only those")
        layer.register_forward_hook(_hook(items))
    return module
