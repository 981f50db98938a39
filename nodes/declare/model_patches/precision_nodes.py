"""Our precision nodes: pin the precision of one model handle (wins over regions and defaults);
and ComfyUI's ModelComputeDtype, which pins only the compute dtype."""

from __future__ import annotations

import torch

from mixgraph.graph.node import Boolean, Combo, Socket, node
from mixgraph.graph.precision import parse_spec, resolve

STORAGE = ("f32", "bf16", "f16", "fp8_e4m3fn", "fp8_e5m2", "int8", "int8:bf16")
COMPUTE = ("f32", "bf16", "f16")


def policy_from(storage: str, compute: str, upcast_attention: bool, f32_norms: bool):
    """The Policy these widget values name, through the one SPEC grammar. `int8` (the rest in f32)
    and `int8:bf16` (the rest in bf16) are whole SPECs (no compute dtype, no flags), so the other
    widgets do not apply to them: a saved workflow's `int8` with the default compute `bf16` keeps
    meaning f32 for the rest."""
    if storage.startswith("int8"):
        return parse_spec(storage)
    flags = ("+upcast_attention" if upcast_attention else "") + ("+f32_norms" if f32_norms else "")
    return parse_spec(f"{storage}:{compute}{flags}")


def _pin(handle, storage, compute, upcast_attention, f32_norms):
    return (handle.with_precision(policy_from(storage, compute, upcast_attention, f32_norms)),)


_CATEGORY = "advanced/precision"


@node(category=_CATEGORY, outputs=("MODEL",))
def SetModelPrecision(model=Socket("MODEL"), storage=Combo(STORAGE, "bf16"),
                      compute=Combo(COMPUTE, "bf16"), upcast_attention=Boolean(False),
                      f32_norms=Boolean(False)):
    """Pins the storage and compute dtype of a diffusion model (wins over regions)."""
    return _pin(model, storage, compute, upcast_attention, f32_norms)


@node(category=_CATEGORY, outputs=("CLIP",))
def SetClipPrecision(clip=Socket("CLIP"), storage=Combo(STORAGE, "bf16"),
                     compute=Combo(COMPUTE, "bf16"), upcast_attention=Boolean(False),
                     f32_norms=Boolean(False)):
    """Pins the precision of a text encoder."""
    return _pin(clip, storage, compute, upcast_attention, f32_norms)


@node(category=_CATEGORY, outputs=("VAE",))
def SetVaePrecision(vae=Socket("VAE"), storage=Combo(STORAGE, "bf16"),
                    compute=Combo(COMPUTE, "bf16"), upcast_attention=Boolean(False),
                    f32_norms=Boolean(False)):
    """Pins the precision of a VAE."""
    return _pin(vae, storage, compute, upcast_attention, f32_norms)


@node(category=_CATEGORY, outputs=("CONTROL_NET",))
def SetControlNetPrecision(control_net=Socket("CONTROL_NET"), storage=Combo(STORAGE, "bf16"),
                           compute=Combo(COMPUTE, "bf16"), upcast_attention=Boolean(False),
                           f32_norms=Boolean(False)):
    """Pins the precision of a ControlNet."""
    return _pin(control_net, storage, compute, upcast_attention, f32_norms)


_COMPUTE_DTYPES = {"default": None, "fp32": torch.float32, "fp16": torch.float16,
                   "bf16": torch.bfloat16}


@node(category="advanced/debug/model", outputs=("MODEL",))
def ModelComputeDtype(model=Socket("MODEL"), dtype=Combo(tuple(_COMPUTE_DTYPES))):
    """ComfyUI's ModelComputeDtype: pins only the compute dtype of a diffusion model; its storage
    and flags stay as resolved (region, default, UNETLoader's weight_dtype). `default` removes
    the pin. A later SetModelPrecision replaces it, and it applies over an earlier one."""
    pin = _COMPUTE_DTYPES[dtype]
    if model.precision is not None and pin is not None:
        return (model.with_precision(resolve(model.precision, compute=pin)),)
    return (model.with_compute_dtype(pin),)
