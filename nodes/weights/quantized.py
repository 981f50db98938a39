"""ComfyUI's quantised weight files: fp8 layers with a scale, read for any model.

Two layouts people have (ComfyUI ``comfy/utils.py: convert_old_quants``, ``comfy/ops.py``):

- "scaled fp8" (the older one, e.g. ``flux1-dev-fp8_scaled``, ``t5xxl_fp8_e4m3fn_scaled``): a
  marker tensor ``scaled_fp8`` (under the model's key prefix; its dtype names the fp8 type, a
  float32 marker meaning e4m3fn; two elements mean "no fp8 matrix multiply") and, per quantised
  layer, ``<layer>.weight`` in fp8 with ``<layer>.scale_weight`` (float32, per tensor) and
  optionally ``<layer>.scale_input``.
- "mixed precision" (the newer one): per quantised layer a ``<layer>.comfy_quant`` uint8 tensor
  holding UTF-8 JSON (``{"format": "float8_e4m3fn", "full_precision_matrix_mult": true}``), or
  the same per-layer configs in the header metadata ``_quantization_metadata``
  (``{"layers": {<layer>: {...}}}``), with ``<layer>.weight_scale`` and optionally
  ``<layer>.input_scale`` (and ``<layer>.weight_scale_2`` for nvfp4).

Semantics (both): the layer's weight is ``fp8.to(float) * weight_scale``. ComfyUI computes a
quantised layer one of two ways: where the GPU has fp8 matrix units and the file allows it, the
input is divided by its ``input_scale`` (or scaled dynamically), cast to fp8 and multiplied with
``torch._scaled_mm(scale_a=input_scale, scale_b=weight_scale)``; everywhere else (CPU, older
GPUs, ``full_precision_matrix_mult``) the weight is dequantised to the compute dtype and an
ordinary ``linear`` runs, the input scale unused. mixgraph computes in f32 / f16 / bf16 only
(``cast.COMPUTE_DTYPES``), so it always takes the second way: the input scale is read past (its
keys are not module parameters) and never applied; the weight scale always is.

Where the weights live (``read_quantized``): a layer whose policy stores fp8, and whose module is
a plain Linear / Conv layer (``SCALED_LAYER_TYPES``: the cast layers of ``cast.py``), keeps the
file's fp8 tensor as is (in the file's fp8 type, whatever fp8 type the policy names, as ComfyUI
keeps such layers in theirs) with its scale beside it (``<key>_scale``, e.g.
``layer.weight_scale``); the weight store attaches that scale to the layer (``attach_scales``,
a non-persistent buffer ``weight_scale``) and the cast layer multiplies the weight it casts by it
on every forward. Every other layer (another storage dtype, keep-f32 modules, other module
types) is dequantised once at read time, in f32, then cast to its storage dtype.

Only fp8 formats are read; other ``comfy_quant`` formats (nvfp4, mxfp8, int8, ...) are refused by
name. Nothing here names a model family.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["QuantLayer", "QuantScheme", "quant_scheme", "FP8_FORMATS", "SCALED_LAYER_TYPES", "scale_key",
           "dequantize", "read_quantized", "attach_scales", "keep_scaled_rule", "dequantized",
           "module_state_dict", "plain_state_dict", "scales_of", "layer_format", "QUANT_METADATA"]

SCALED_FP8 = "scaled_fp8"
QUANT_METADATA = "_quantization_metadata"
FP8_FORMATS: dict[str, torch.dtype] = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
_FP8_DTYPES = tuple(FP8_FORMATS.values())
#: module types whose weight may stay fp8 with a scale: those ``cast.apply_precision`` swaps for
#: cast layers that apply ``weight_scale`` (exact types, as there)
SCALED_LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d)
_SCALE_ATTR = "weight_scale"


@dataclass(frozen=True)
class QuantLayer:
    """One quantised layer: stored keys (source prefix stripped) of its weight and scales."""

    weight: str
    scale: str
    input_scale: str | None = None
    format: str | None = None  # None: its ``comfy_quant`` tensor says (read with the weights)
    marker: str | None = None  # the ``comfy_quant`` key, where the file has one


@dataclass(frozen=True)
class QuantScheme:
    """What a quantised source holds: ``kind`` "scaled_fp8" | "mixed"; ``layers`` by weight key;
    ``aux`` the stored keys that are no module parameters (markers, scales)."""

    kind: str
    layers: Mapping[str, QuantLayer]
    aux: frozenset[str]


def scale_key(weight_key: str) -> str:
    """The key a kept fp8 weight's scale travels under in the store's state dicts."""
    return weight_key + "_scale"


def quant_scheme(keys: Iterable[str], metadata: Mapping[str, str] | None = None,
                 prefix: str = "") -> QuantScheme | None:
    """The quantisation of a source from its key names (prefix stripped) and header metadata, or
    None for an ordinary file. ``prefix``: the source's prefix, stripped from the metadata's layer
    names where they carry it."""
    keys = set(keys)
    if SCALED_FP8 in keys:
        layers, aux = {}, {SCALED_FP8}
        for k in keys:
            if k.endswith(".scale_weight"):
                base = k[: -len(".scale_weight")]
                inp = base + ".scale_input"
                layers[base + ".weight"] = QuantLayer(base + ".weight", k, inp if inp in keys else None,
                                                      "float8_e4m3fn")
                aux.add(k)
            elif k.endswith(".scale_input"):
                aux.add(k)
        return QuantScheme("scaled_fp8", layers, frozenset(aux))
    configs: dict[str, dict | None] = {k[: -len(".comfy_quant")]: None for k in keys if k.endswith(".comfy_quant")}
    raw = (metadata or {}).get(QUANT_METADATA)
    if raw:
        try:
            listed = json.loads(raw).get("layers", {})
        except (ValueError, AttributeError) as e:
            raise ValueError(f"corrupt {QUANT_METADATA} in the file header: {e}") from e
        for name, conf in listed.items():
            name = name[len(prefix):] if prefix and name.startswith(prefix) else name
            if name + ".weight" in keys:
                configs[name] = conf if isinstance(conf, dict) else {"format": conf}
    if not configs:
        return None
    layers, aux = {}, set()
    for base, conf in configs.items():
        marker = base + ".comfy_quant"
        fmt = None if conf is None else conf.get("format")
        inp = base + ".input_scale"
        layers[base + ".weight"] = QuantLayer(base + ".weight", base + ".weight_scale",
                                              inp if inp in keys else None, fmt,
                                              marker if marker in keys else None)
        aux.update(k for k in (marker, base + ".weight_scale", inp, base + ".weight_scale_2") if k in keys)
    return QuantScheme("mixed", layers, frozenset(aux))


def layer_format(layer: QuantLayer, read: Callable[[str], Tensor]) -> str:
    """The layer's format name: from the metadata, else from its ``comfy_quant`` JSON tensor."""
    if layer.format is not None:
        return layer.format
    if layer.marker is None:
        raise ValueError(f"quantised layer {layer.weight}: no format given")
    raw = read(layer.marker)
    try:
        conf = json.loads(bytes(raw.to(torch.uint8).reshape(-1).tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{layer.marker}: not a comfy_quant JSON config ({e})") from e
    fmt = conf.get("format") if isinstance(conf, dict) else None
    if fmt is None:
        raise ValueError(f"{layer.marker}: comfy_quant config without a format: {conf!r}")
    return fmt


def _check(layer: QuantLayer, fmt: str, w: Tensor, scale: Tensor) -> Tensor:
    """The scale, shaped to broadcast over ``w`` (per tensor: a 0-dim tensor; per output row: [out, 1, ...])."""
    if fmt not in FP8_FORMATS:
        raise NotImplementedError(
            f"{layer.weight}: {fmt!r} quantised layers are not supported yet (mixgraph reads ComfyUI's "
            f"per-tensor scaled fp8 layers: {', '.join(FP8_FORMATS)})")
    scale = scale.to(torch.float32)
    if scale.numel() == 1:
        return scale.reshape(())
    if w.ndim >= 1 and scale.numel() == w.shape[0]:
        return scale.reshape(w.shape[0], *([1] * (w.ndim - 1)))  # [out] -> [out, 1, ...]
    raise ValueError(f"{layer.scale}: a scale of shape {list(scale.shape)} for a weight of shape "
                     f"{list(w.shape)} (expected one per tensor or per output row)")


def dequantize(w: Tensor, scale: Tensor) -> Tensor:
    """``w * scale`` in float32: what ComfyUI's dequantisation gives in an f32 compute dtype."""
    return w.to(torch.float32) * scale.to(torch.float32)


def read_quantized(
    scheme: QuantScheme,
    items: Mapping[str, Callable[[], Tensor]],
    dtype_for: Callable[[str], torch.dtype | None],
    rename: Callable[[str], str | None] | None,
    keep_scaled: Callable[[str], bool],
    convert: Callable[[Tensor, torch.dtype | None], Tensor],
    release: Callable[[Tensor], None] = lambda t: None,
) -> dict[str, Tensor]:
    """A quantised source's tensors as module keys (see the module docstring): ``items`` maps a
    stored key (prefix stripped) to a reader; scale and marker keys are consumed, not returned; a
    quantised weight comes back fp8 with ``scale_key(key)`` beside it where ``dtype_for`` gives an
    fp8 dtype and ``keep_scaled(key)`` allows it, else dequantised (f32) and cast to that dtype.
    Other tensors go through ``convert(tensor, dtype)``; ``release(t)`` is called on a stored fp8
    tensor once it has been dequantised (its file pages can go)."""

    def read(key: str) -> Tensor:
        if key not in items:
            raise ValueError(f"quantised weights: {key} is missing from the file")
        return items[key]()

    out: dict[str, Tensor] = {}
    for key, get in items.items():
        if key in scheme.aux:
            continue
        new = rename(key) if rename is not None else key
        if new is None:
            continue
        layer = scheme.layers.get(key)
        if layer is None:
            out[new] = convert(get(), dtype_for(new))
            continue
        w = get()
        scale = _check(layer, layer_format(layer, read), w, read(layer.scale))
        target = dtype_for(new)
        if target in _FP8_DTYPES and w.dtype in _FP8_DTYPES and keep_scaled(new):
            out[new], out[scale_key(new)] = w, scale
            continue
        out[new] = dequantize(w, scale).to(torch.float32 if target is None else target)
        release(w)
    return out


def keep_scaled_rule(module: nn.Module) -> Callable[[str], bool]:
    """Predicate on module keys: may this weight stay fp8 with a scale? Only ``<layer>.weight`` of
    a layer of exactly a ``SCALED_LAYER_TYPES`` type that has no ``weight_scale`` of its own."""
    names = {f"{name}.weight" if name else "weight" for name, m in module.named_modules()
             if type(m) in SCALED_LAYER_TYPES and not hasattr(m, _SCALE_ATTR)}
    return names.__contains__


def attach_scales(module: nn.Module, sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``sd`` without its kept-weight scales, each attached to its layer as the non-persistent
    buffer ``weight_scale`` (what the cast layers apply); ``sd`` itself when it has none."""
    scales = _kept_scales(sd)
    if not scales:
        return dict(sd)
    drop = set(scales)
    rest = {k: v for k, v in sd.items() if k not in drop}
    for k in scales:
        owner = k[: -len(".weight_scale")]
        layer = module.get_submodule(owner) if owner else module
        layer.register_buffer(_SCALE_ATTR, sd[k], persistent=False)
    return rest


def dequantized(sd: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    """A store state dict with every kept fp8 weight dequantised to f32 and the scales dropped
    (for code that reads weights as plain tensors: model merges); ``sd`` itself when it has none."""
    scales = _kept_scales(sd)
    if not scales:
        return sd
    drop = set(scales)
    out = {k: v for k, v in sd.items() if k not in drop}
    for k in scales:
        out[k[: -len("_scale")]] = dequantize(sd[k[: -len("_scale")]], sd[k])
    return out


def scales_of(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """weight key -> its scale, for the kept fp8 weights of a store state dict."""
    return {k[: -len("_scale")]: sd[k] for k in _kept_scales(sd)}


def _kept_scales(sd: Mapping[str, Tensor]) -> list[str]:
    """The scale keys of a store state dict: ``X.weight_scale`` beside an fp8 ``X.weight``."""
    return [k for k in sd if k.endswith(".weight_scale") and k[: -len("_scale")] in sd
            and sd[k[: -len("_scale")]].dtype in _FP8_DTYPES]


def plain_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` with each fp8 weight that has a scale dequantised to f32 (for code
    that reads a materialized module's weights as plain tensors)."""
    sd = module.state_dict()
    for name, m in module.named_modules():
        scale = m._buffers.get(_SCALE_ATTR) if type(m) in SCALED_LAYER_TYPES else None
        if scale is not None:
            key = f"{name}.weight" if name else "weight"
            sd[key] = dequantize(sd[key], scale)
    return sd


def module_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` where a layer holding an fp8 weight with a scale is written in
    ComfyUI's mixed-precision layout (``weight`` fp8, ``weight_scale``, ``comfy_quant``), so a
    saved file keeps its meaning for ComfyUI and for mixgraph."""
    sd = module.state_dict()
    for name, m in module.named_modules():
        scale = m._buffers.get(_SCALE_ATTR) if type(m) in SCALED_LAYER_TYPES else None
        if scale is None:
            continue
        pre = f"{name}." if name else ""
        fmt = next(n for n, d in FP8_FORMATS.items() if d == m.weight.dtype)
        sd[pre + "weight_scale"] = scale
        sd[pre + "comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt}).encode("utf-8")), dtype=torch.uint8)
    return sd
