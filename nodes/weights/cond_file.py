"""ComfyUI's conditioning files (comfy_extras/nodes_cond.py SaveConditioning / ConditioningLoader).

One safetensors file holds one conditioning entry: the tensor ``conditioning`` (the cross-attention
tokens, [N, T, D]), every tensor-valued option under its ComfyUI key (``pooled_output``, ``mask``,
``concat_latent_image``, ...), a list of tensors as ``<key>.<i>``, and the plain options (bool, int,
float, str) as JSON in the metadata entry ``conditioning_options``. SaveConditioning writes it to
the output folder; ConditioningLoader reads it from the embeddings folder.

The option keys are ComfyUI's names for ``Cond``'s fields (``ui/comfy/comfy_payloads.py`` uses the same
names for custom nodes). Options that are objects (a ControlNet, an area, unCLIP or GLIGEN entries)
cannot be saved, as in ComfyUI: saving them is an error naming the option. A file's options that
mixgraph's conds do not hold (other model families' keys, lists) are reported back so the node can
warn about them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from mixgraph.nodes.weights.save import write_safetensors
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond

__all__ = ["TENSOR_KEY", "OPTIONS_KEY", "CondFileError", "save_conditioning", "load_conditioning",
           "cond_options", "cond_from_options"]

TENSOR_KEY = "conditioning"
OPTIONS_KEY = "conditioning_options"

# Cond field -> ComfyUI option key, for the fields that are tensors
_TENSORS = {"pooled": "pooled_output", "mask": "mask", "concat_latent": "concat_latent_image",
            "concat_mask": "concat_mask", "concat_image": "concat_image",
            "controlnet_cross_attn": "cross_attn_controlnet", "controlnet_pooled": "pooled_output_controlnet"}
_SIZE_KEYS = tuple(f.name for f in dataclasses.fields(SizeCond))
_DEFAULT = Cond(cross_attn=torch.zeros(1, 1, 1))


class CondFileError(ValueError):
    """A conditioning that cannot be saved, or a file that is not a saved conditioning."""


def cond_options(c: Cond) -> dict[str, Any]:
    """``c``'s options as ComfyUI names them: tensors and plain values; fields left at their
    defaults are omitted. An option with no file form raises CondFileError naming it."""
    for field, comfy, kind in (("control", "control", "ControlNet"), ("area", "area", "tuple"),
                               ("area_fraction", "area", "tuple"), ("unclip", "unclip_conditioning", "list"),
                               ("gligen", "gligen", "tuple")):
        if getattr(c, field):
            raise CondFileError(f"Conditioning option '{comfy}' ({kind}) can't be saved.")
    out: dict[str, Any] = {}
    for field, key in _TENSORS.items():
        value = getattr(c, field)
        if value is not None:
            out[key] = value
    if c.strength != _DEFAULT.strength:
        out["strength"] = float(c.strength)
    if c.mask is not None:
        out["mask_strength"] = float(c.mask_strength)
        out["set_area_to_bounds"] = bool(c.set_area_to_bounds)
    if c.timestep_range != _DEFAULT.timestep_range:
        out["start_percent"], out["end_percent"] = (float(v) for v in c.timestep_range)
    if c.size is not None:
        out.update({k: getattr(c.size, k) for k in _SIZE_KEYS if getattr(c.size, k) is not None})
    if c.concat_image is not None or c.noise_augmentation != _DEFAULT.noise_augmentation:
        out["noise_augmentation"] = float(c.noise_augmentation)
    return out


def cond_from_options(cross_attn: Tensor, options: Mapping[str, Any]) -> tuple[Cond, list[str]]:
    """The Cond for ComfyUI options, and the option keys it has no field for (sorted)."""
    kw: dict[str, Any] = {field: options[key].float() for field, key in _TENSORS.items()
                          if isinstance(options.get(key), Tensor)}
    used = set(_TENSORS.values())
    for key in ("strength", "mask_strength", "noise_augmentation"):
        if key in options:
            kw[key] = float(options[key])
            used.add(key)
    if "set_area_to_bounds" in options:
        kw["set_area_to_bounds"] = bool(options["set_area_to_bounds"])
        used.add("set_area_to_bounds")
    if "start_percent" in options or "end_percent" in options:
        kw["timestep_range"] = (float(options.get("start_percent", 0.0)), float(options.get("end_percent", 1.0)))
        used.update(("start_percent", "end_percent"))
    size = {k: options[k] for k in _SIZE_KEYS if k in options}
    if size:
        kw["size"] = SizeCond(**size)
        used.update(size)
    return Cond(cross_attn=cross_attn.float(), **kw), sorted(set(options) - used)


def save_conditioning(path: str | os.PathLike, conds: tuple[Cond, ...]) -> None:
    """Write one conditioning entry in ComfyUI's format (atomically)."""
    if len(conds) != 1:
        raise CondFileError("Save Conditioning supports a single conditioning entry, save it before combining.")
    (c,) = conds
    tensors = {TENSOR_KEY: c.cross_attn}
    values = {}
    for key, value in cond_options(c).items():
        if isinstance(value, Tensor):
            tensors[key] = value
        else:
            values[key] = value
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    write_safetensors(path, tensors, {OPTIONS_KEY: json.dumps(values)})


def load_conditioning(path: str | os.PathLike) -> tuple[tuple[Cond, ...], list[str]]:
    """A saved conditioning (any safetensors file with a ``conditioning`` tensor) as a
    one-entry CONDITIONING, and the option keys mixgraph's conds do not hold."""
    name = os.fspath(path)
    if not name.lower().endswith((".safetensors", ".sft")):
        raise CondFileError(f"{name}: a conditioning file must be safetensors (ComfyUI's Save Conditioning "
                            f"format); other formats are not supported")
    try:
        with safe_open(name, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CondFileError(f"{name}: not a readable safetensors file: {e}") from None
    if TENSOR_KEY not in tensors:
        raise CondFileError(f"{name}: no '{TENSOR_KEY}' tensor, so it is not a saved conditioning "
                            f"(keys: {sorted(tensors)[:5]}); a textual-inversion embedding is used as "
                            f"embedding:NAME in a prompt instead")
    cross_attn = tensors.pop(TENSOR_KEY)
    if cross_attn.ndim != 3:
        raise CondFileError(f"{name}: '{TENSOR_KEY}' has shape {tuple(cross_attn.shape)}; a conditioning is "
                            f"[batch, tokens, width]")
    try:
        options = json.loads(metadata.get(OPTIONS_KEY, "{}"))
    except json.JSONDecodeError as e:
        raise CondFileError(f"{name}: metadata '{OPTIONS_KEY}' is not JSON: {e}") from None
    if not isinstance(options, dict):
        raise CondFileError(f"{name}: metadata '{OPTIONS_KEY}' is not a JSON object")
    lists: dict[str, dict[int, Tensor]] = {}
    for key, value in tensors.items():
        stem, _, index = key.rpartition(".")
        if stem and index.isdigit():
            lists.setdefault(stem, {})[int(index)] = value
        else:
            options[key] = value
    options.update({k: [v[i] for i in sorted(v)] for k, v in lists.items()})
    try:
        cond, ignored = cond_from_options(cross_attn, options)
    except (TypeError, ValueError) as e:
        raise CondFileError(f"{name}: bad conditioning option: {e}") from None
    return (cond,), ignored
