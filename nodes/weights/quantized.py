"""ComfyUI's quantised weight files: fp8 and int8 layers with a scale, read for any model.

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

The formats read (``FORMATS``; the names and layouts are those of ComfyUI and of the converter
people make these files with, silveroxides/convert_to_quant): the layer's weight ``w`` is
``q.to(float) * s`` for its stored ``q`` and dequantisation scale ``s`` (float32), with

- ``float8_e4m3fn`` / ``float8_e5m2``: ``s`` per tensor (a scalar) or per output row ([M]);
- ``float8_e4m3fn_rowwise``: fp8 ``q``, ``s`` per output row ([M] or [M, 1]);
- ``int8_tensorwise``: int8 ``q``, ``s`` per tensor or per output row;
- ``int8_blockwise`` / ``float8_e4m3fn_blockwise``: a 2-D ``q`` [M, N] in B x B tiles,
  ``s`` [M/B, N/B] (or flat, read row-major), tile (i, j) scaled by ``s[i, j]``;
  B is the config's ``group_size`` (default 128 for int8, 64 for fp8, the converter's).

Configs with ``"convrot": true`` (a rotation applied to the weight that the input would need
too), nvfp4, mxfp8 and any other format are refused by name; a scale of another shape than its
format's, or a ``group_size`` that does not tile the weight, is a ValueError naming the key.

ComfyUI computes a quantised layer one of two ways: where the GPU has fp8 (int8) matrix units
and the file allows it, the input is quantised too and multiplied with a scaled matmul;
everywhere else (CPU, older GPUs, ``full_precision_matrix_mult``) the weight is dequantised to
the compute dtype and an ordinary ``linear`` runs, the input scale unused. mixgraph computes in
f32 / f16 / bf16 only (``cast.COMPUTE_DTYPES``), so it always takes the second way: the input
scale is read past (its keys are not module parameters) and never applied; the weight scale
always is.

Where the weights live (``read_quantized``): a layer of a format that may stay fp8 (per-tensor
or per-row fp8: ``KEPT_FORMATS``) whose policy stores fp8, and whose module is a plain Linear /
Conv layer (``SCALED_LAYER_TYPES``: the cast layers of ``cast.py``), keeps the file's fp8 tensor
as is (in the file's fp8 type, whatever fp8 type the policy names, as ComfyUI keeps such layers
in theirs) with its scale beside it (``<key>_scale``, e.g. ``layer.weight_scale``); the weight
store attaches that scale to the layer (``attach_scales``, a non-persistent buffer
``weight_scale``) and the cast layer multiplies the weight it casts by it on every forward. Every
other fp8 layer (block-wise layers, another storage dtype, keep-f32 modules, other module types)
is dequantised once at read time, in f32, then cast to its storage dtype.

An int8 layer (``int8_tensorwise``, ``int8_blockwise``) of a plain Linear / Conv layer stays int8
in memory whatever the storage dtype, as a GGUF weight does: a ``gguf_tensor.QuantizedTensor`` in
the block format ``int8_format(B)`` (per block of B consecutive values of a row: its float32
scale, then its B int8 values; B = the row for per-tensor / per-row scales, the group size for
block scales, whose [M/B, N/B] grid is repeated over the B rows of each tile), built once at read
time (``keep_int8``). The cast layers dequantise it on every forward to the same float32 values
``dequantize`` gives (``q * scale``), then cast them; so an int8 file is held at about a quarter
of its f32 size (``int8_kept_bytes``), and a model that fits only so stays resident. Other int8
layers (other module types, a reader that fuses tensors) are dequantised at read time.

Nothing here names a model family.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights.gguf_quants import BlockFormat
from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor

__all__ = ["QuantLayer", "QuantScheme", "QuantFormat", "quant_scheme", "FP8_FORMATS", "FORMATS", "KEPT_FORMATS",
           "SCALED_LAYER_TYPES", "scale_key", "dequantize", "read_quantized", "attach_scales", "keep_scaled_rule",
           "dequantized", "module_state_dict", "plain_state_dict", "scales_of", "layer_format", "layer_config",
           "QUANT_METADATA", "int8_format", "keep_int8", "int8_kept_bytes", "kept_int8_layers"]

SCALED_FP8 = "scaled_fp8"
QUANT_METADATA = "_quantization_metadata"
FP8_FORMATS: dict[str, torch.dtype] = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
_FP8_DTYPES = tuple(FP8_FORMATS.values())
#: module types whose weight may stay fp8 with a scale: those ``cast.apply_precision`` swaps for
#: cast layers that apply ``weight_scale`` (exact types, as there)
SCALED_LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d)
_SCALE_ATTR = "weight_scale"


@dataclass(frozen=True)
class QuantFormat:
    """A ``comfy_quant`` format that is read: the weight dtypes it stores (empty: any, as the
    scaled-fp8 layouts never said), its scale's layout ("tensor_or_row" | "row" | "block"), the
    block side when the config gives no ``group_size``, and whether its weight may stay fp8 with
    its scale (``kept``; else it is dequantised at read time)."""

    stored: tuple[torch.dtype, ...]
    scale: str
    group_size: int | None = None
    kept: bool = False


#: the formats read, by their ``comfy_quant`` name (defaults as silveroxides/convert_to_quant writes)
FORMATS: dict[str, QuantFormat] = {
    "float8_e4m3fn": QuantFormat((), "tensor_or_row", kept=True),
    "float8_e5m2": QuantFormat((), "tensor_or_row", kept=True),
    "float8_e4m3fn_rowwise": QuantFormat((torch.float8_e4m3fn,), "row", kept=True),
    "float8_e4m3fn_blockwise": QuantFormat((torch.float8_e4m3fn,), "block", 64),
    "int8_tensorwise": QuantFormat((torch.int8,), "tensor_or_row"),
    "int8_blockwise": QuantFormat((torch.int8,), "block", 128),
}
#: the formats whose weights may stay fp8 with their (per-tensor or per-row) scale
KEPT_FORMATS = frozenset(name for name, f in FORMATS.items() if f.kept)


@dataclass(frozen=True)
class QuantLayer:
    """One quantised layer: stored keys (source prefix stripped) of its weight and scales."""

    weight: str
    scale: str
    input_scale: str | None = None
    format: str | None = None  # None: its ``comfy_quant`` tensor says (read with the weights)
    marker: str | None = None  # the ``comfy_quant`` key, where the file has one
    #: the whole config where the header metadata gives it (``group_size``, ``convrot``, ...)
    config: Mapping[str, Any] | None = field(default=None, compare=False)


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
                                              marker if marker in keys else None,
                                              conf if fmt is not None else None)
        aux.update(k for k in (marker, base + ".weight_scale", inp, base + ".weight_scale_2") if k in keys)
    return QuantScheme("mixed", layers, frozenset(aux))


def layer_config(layer: QuantLayer, read: Callable[[str], Tensor]) -> Mapping[str, Any]:
    """The layer's config (at least ``format``): from the metadata, else from its ``comfy_quant``
    JSON tensor."""
    if layer.format is not None:
        return layer.config if layer.config is not None else {"format": layer.format}
    if layer.marker is None:
        raise ValueError(f"quantised layer {layer.weight}: no format given")
    raw = read(layer.marker)
    try:
        conf = json.loads(bytes(raw.to(torch.uint8).reshape(-1).tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{layer.marker}: not a comfy_quant JSON config ({e})") from e
    if not isinstance(conf, dict) or conf.get("format") is None:
        raise ValueError(f"{layer.marker}: comfy_quant config without a format: {conf!r}")
    return conf


def layer_format(layer: QuantLayer, read: Callable[[str], Tensor]) -> str:
    """The layer's format name: from the metadata, else from its ``comfy_quant`` JSON tensor."""
    return layer_config(layer, read)["format"]


def _group_size(layer: QuantLayer, conf: Mapping[str, Any], fmt: QuantFormat) -> int:
    """A block format's tile side: the config's ``group_size`` (older converter versions nested it
    under ``params``), else the format's default."""
    params = conf.get("params")
    size = conf.get("group_size", params.get("group_size") if isinstance(params, dict) else None)
    size = fmt.group_size if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"{layer.marker or layer.weight}: group_size {size!r} is no positive integer")
    return size


def _check(layer: QuantLayer, conf: Mapping[str, Any], w: Tensor, scale: Tensor) -> tuple[Tensor, int | None]:
    """(scale, block) for ``dequantize``: without a block the scale shaped to broadcast over ``w``
    (per tensor: a 0-dim tensor; per output row: [out, 1, ...]); for a block format [M/B, N/B]
    with the block side B. Refuses what is not read (see the module docstring) by name."""
    name = conf["format"]
    if conf.get("convrot"):
        raise NotImplementedError(
            f"{layer.weight}: {name!r} layers with \"convrot\": true (a rotated weight whose input needs "
            f"the same rotation) are not supported yet")
    fmt = FORMATS.get(name)
    if fmt is None:
        raise NotImplementedError(
            f"{layer.weight}: {name!r} quantised layers are not supported yet (mixgraph reads ComfyUI's "
            f"fp8 and int8 layers: {', '.join(FORMATS)})")
    if fmt.stored and w.dtype not in fmt.stored:
        raise ValueError(f"{layer.weight}: a {w.dtype} weight in a {name!r} layer (expected "
                         f"{', '.join(map(str, fmt.stored))})")
    scale = scale.to(torch.float32)
    if fmt.scale == "block":
        size = _group_size(layer, conf, fmt)
        if w.ndim != 2 or w.shape[0] % size or w.shape[1] % size:
            raise ValueError(f"{layer.weight}: a {name!r} weight of shape {list(w.shape)} is not tiled by "
                             f"group_size {size} (expected a 2-D weight whose sides it divides)")
        grid = (w.shape[0] // size, w.shape[1] // size)
        if not _is_grid(scale, grid):
            raise ValueError(f"{layer.scale}: a scale of shape {list(scale.shape)} for a weight of shape "
                             f"{list(w.shape)} (expected {list(grid)}: one per {size}x{size} block)")
        return scale.reshape(grid), size
    if fmt.scale == "tensor_or_row" and scale.numel() == 1:
        return scale.reshape(()), None
    if w.ndim >= 1 and scale.numel() == w.shape[0]:
        return scale.reshape(w.shape[0], *([1] * (w.ndim - 1))), None  # [out] -> [out, 1, ...]
    expected = "one per output row" if fmt.scale == "row" else "one per tensor or per output row"
    raise ValueError(f"{layer.scale}: a scale of shape {list(scale.shape)} for a weight of shape "
                     f"{list(w.shape)} (expected {expected})")


def _is_grid(scale: Tensor, grid: tuple[int, int]) -> bool:
    """Is ``scale`` one value per block of the [M/B, N/B] ``grid``: that shape up to dims of size
    1, or flat (read row-major)? A transposed grid of the same count is not."""
    if scale.numel() != grid[0] * grid[1]:
        return False
    return scale.ndim <= 1 or [d for d in scale.shape if d != 1] == [d for d in grid if d != 1]


def dequantize(w: Tensor, scale: Tensor, block: int | None = None) -> Tensor:
    """``w * scale`` in float32: what ComfyUI's dequantisation gives in an f32 compute dtype. With
    ``block``: ``w`` [M, N] in ``block`` x ``block`` tiles, tile (i, j) times ``scale[i, j]``."""
    if block is None:
        return w.to(torch.float32) * scale.to(torch.float32)
    m, n = w.shape
    tiles = w.to(torch.float32).reshape(m // block, block, n // block, block)  # [M/B, B, N/B, B]
    per_tile = scale.to(torch.float32).reshape(m // block, 1, n // block, 1)  # [M/B, 1, N/B, 1]
    return (tiles * per_tile).reshape(m, n)


@functools.lru_cache(maxsize=64)
def int8_format(block: int) -> BlockFormat:
    """The in-memory block format of a kept int8 weight: per block of ``block`` values, a float32
    scale (4 bytes, native order) then the int8 values."""
    return BlockFormat(f"int8x{block}", -1, block, 4 + block, _int8_blocks)


def _int8_blocks(blocks: Tensor) -> Tensor:
    """[n, 4 + B] bytes -> [n, B] float32: each block's int8 values times its scale."""
    scale = blocks[:, :4].contiguous().view(torch.float32)  # [n, 4] uint8 -> [n, 1]
    return blocks[:, 4:].contiguous().view(torch.int8).to(torch.float32) * scale


def keep_int8(w: Tensor, scale: Tensor, block: int | None) -> QuantizedTensor:
    """An int8 weight and its scale (as ``_check`` shapes it) as a ``QuantizedTensor`` in
    ``int8_format``: one block per output row (per-tensor / per-row scales), or per ``block``
    columns of a row (block scales, tile (i, j)'s scale on each of its rows)."""
    m = w.shape[0]
    scale = scale.to(torch.float32)
    if block is None:
        per = w.numel() // m
        s = scale.expand(m) if scale.ndim == 0 else scale.reshape(m)  # [M]: one scale per row
        s, q = s.reshape(m, 1), w.reshape(m, 1, per)  # [M, 1] scales, [M, 1, per] values
    else:
        per = block
        s = scale.repeat_interleave(block, dim=0)  # [M/B, N/B] -> [M, N/B]
        q = w.reshape(m, w.shape[1] // block, block)  # [M, N] -> [M, N/B, B]
    sbytes = s.contiguous().reshape(-1, 1).view(torch.uint8).reshape(m, -1, 4)  # [M, k, 4]
    raw = torch.cat([sbytes, q.contiguous().view(torch.uint8)], dim=2)  # [M, k, 4 + B]
    return QuantizedTensor(raw.reshape(-1), int8_format(per), tuple(w.shape))


def kept_int8_layers(scheme: QuantScheme, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                     read: Callable[[str], Tensor]) -> dict[str, tuple[int, int]]:
    """stored weight key -> (bytes ``keep_int8`` holds, values), for the int8 layers of a source
    whose stored keys have ``shapes`` ((shape, dtype), from the header); ``read`` reads a marker
    tensor where a layer's config is there. What estimates made from shapes use (they would count
    the weights dense)."""
    out = {}
    for key, layer in scheme.layers.items():
        shape, dtype = shapes.get(key, ((), None))
        if dtype != torch.int8 or not shape:
            continue
        conf = layer_config(layer, read)
        fmt = FORMATS.get(conf["format"])
        if fmt is None:
            continue  # refused by name when read
        block = _group_size(layer, conf, fmt) if fmt.scale == "block" else None
        out[key] = (int8_kept_bytes(shape, block), math.prod(shape))
    return out


def int8_kept_bytes(shape: tuple[int, ...], block: int | None) -> int:
    """Bytes ``keep_int8`` holds for a weight of ``shape`` (``block`` None: one block per row)."""
    numel = math.prod(shape)
    per = numel // shape[0] if block is None else block
    return numel + 4 * (numel // per)


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
    quantised weight of a ``KEPT_FORMATS`` format comes back fp8 with ``scale_key(key)`` beside it
    where ``dtype_for`` gives an fp8 dtype and ``keep_scaled(key)`` allows it, else (and for
    every int8 or block-wise layer) dequantised (f32) and cast to that dtype. Other tensors go
    through ``convert(tensor, dtype)``; ``release(t)`` is called on a stored quantised tensor once
    it has been dequantised (its file pages can go)."""

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
        conf = layer_config(layer, read)
        scale, block = _check(layer, conf, w, read(layer.scale))
        target = dtype_for(new)
        if (conf["format"] in KEPT_FORMATS and target in _FP8_DTYPES and w.dtype in _FP8_DTYPES
                and keep_scaled(new)):
            out[new], out[scale_key(new)] = w, scale
            continue
        if w.dtype == torch.int8 and keep_scaled(new):
            out[new] = keep_int8(w, scale, block)
            release(w)
            continue
        out[new] = dequantize(w, scale, block).to(torch.float32 if target is None else target)
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
