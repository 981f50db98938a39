"""Hypernetworks (A1111's format; ComfyUI ``comfy_extras/nodes_hypernetwork.py``): small MLPs
that, per attention width, add a learned residual to the tokens the keys and the values are
projected from, in every self- and cross-attention of the UNet: k += strength·mlp_k(k),
v += strength·mlp_v(v) (before ``to_k``/``to_v``).

File: a pickle (``.pt``), loaded with ``torch.load(weights_only=True)`` and a warning (DESIGN
§7): ``{width: [mlp_k_state, mlp_v_state], "activation_func", "is_layer_norm", "use_dropout",
"activate_output", "last_layer_dropout", ...}``. Each MLP is its Linear layers in key order, an
activation after every Linear but the last (after the last too with ``activate_output``;
"linear" = none), a LayerNorm after each Linear when ``is_layer_norm`` (the next key pair).
Dropout is inactive at inference. A safetensors file with the same entries flattened as
``<width>.<0|1>.<layer>.<weight|bias>`` plus the options in its metadata is read too.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

__all__ = ["load_hypernetwork", "HypernetworkPatch", "ACTIVATIONS"]

ACTIVATIONS = {
    "linear": None, "relu": nn.ReLU, "leakyrelu": nn.LeakyReLU, "elu": nn.ELU, "swish": nn.Hardswish,
    "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softsign": nn.Softsign, "mish": nn.Mish,
}


def _mlp(weights: dict, activation: str, layer_norm: bool, activate_output: bool) -> nn.Sequential:
    names = [k[:-len(".weight")] for k in weights if k.endswith(".weight")]
    layers: list[nn.Module] = []
    i = 0
    while i < len(names):
        w, b = weights[f"{names[i]}.weight"], weights[f"{names[i]}.bias"]
        lin = nn.Linear(w.shape[1], w.shape[0])
        lin.load_state_dict({"weight": w.float(), "bias": b.float()})
        layers.append(lin)
        last = i == len(names) - 1
        if ACTIVATIONS[activation] is not None and (not last or activate_output):
            layers.append(ACTIVATIONS[activation]())
        if layer_norm:
            i += 1
            if i >= len(names):
                raise ValueError(f"hypernetwork: layer {names[i - 1]} has no LayerNorm after it")
            lw, lb = weights[f"{names[i]}.weight"], weights[f"{names[i]}.bias"]
            ln = nn.LayerNorm(lw.shape[0])
            ln.load_state_dict({"weight": lw.float(), "bias": lb.float()})
            layers.append(ln)
        i += 1
    return nn.Sequential(*layers).eval().requires_grad_(False)


@dataclass(frozen=True, eq=False)
class HypernetworkPatch:
    """A UNet patch (``unet_patches.py``): ``wrap_attn1`` and ``wrap_attn2`` add the residuals
    of the MLP pair for the keys' width, if the file has one."""

    mlps: dict = field(repr=False)  # width -> (mlp_k, mlp_v)
    strength: float
    name: str = ""

    def _kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        pair = self.mlps.get(int(k.shape[-1]))
        if pair is None:
            return k, v
        mk, mv = (m.to(k.device) for m in pair)
        k = (k.float() + mk(k.float()) * self.strength).to(k.dtype)
        v = (v.float() + mv(v.float()) * self.strength).to(v.dtype)
        return k, v

    def wrap_attn1(self, n: Tensor, k: Tensor, v: Tensor):
        k, v = self._kv(k, v)
        return n, k, v, _same

    def wrap_attn2(self, n: Tensor, k: Tensor, v: Tensor):
        k, v = self._kv(k, v)
        return n, k, v, _same

    def with_strength(self, strength: float) -> "HypernetworkPatch":
        return dataclasses.replace(self, strength=float(strength))


def _same(out: Tensor) -> Tensor:
    return out


def _read(path: str) -> dict:
    if path.lower().endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            flat = {k: f.get_tensor(k) for k in f.keys()}
        sd: dict = {k: (v == "true" if v in ("true", "false") else v) for k, v in meta.items()}
        for key, t in flat.items():
            width, index, rest = key.split(".", 2)
            pair = sd.setdefault(int(width), [{}, {}])
            pair[int(index)][rest] = t
        return sd
    warnings.warn(f"{os.path.basename(path)}: pickle-format hypernetwork; loading with "
                  f"torch.load(weights_only=True)", stacklevel=3)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise ValueError(f"{os.path.basename(path)}: cannot load the hypernetwork with weights_only=True "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{os.path.basename(path)}: not a hypernetwork (a {type(obj).__name__}, not a dict)")
    return obj


def load_hypernetwork(path: str | os.PathLike, strength: float) -> HypernetworkPatch:
    """HypernetworkLoader's patch; an unknown activation is a clear error (ComfyUI logs it and
    returns the model unpatched)."""
    path = os.fspath(path)
    name = os.path.basename(path)
    sd = _read(path)
    activation = sd.get("activation_func", "linear")
    if activation not in ACTIVATIONS:
        raise NotImplementedError(f"{name}: hypernetwork activation {activation!r}: not supported yet "
                                  f"(known: {', '.join(ACTIVATIONS)})")
    mlps = {}
    for key, pair in sd.items():
        try:
            width = int(key)
        except (TypeError, ValueError):
            continue
        if not isinstance(pair, (list, tuple)) or len(pair) < 2:
            raise ValueError(f"{name}: hypernetwork entry {width} is not a pair of layer dicts")
        mlps[width] = tuple(_mlp(dict(pair[i]), activation, bool(sd.get("is_layer_norm", False)),
                                 bool(sd.get("activate_output", False))) for i in (0, 1))
    if not mlps:
        raise ValueError(f"{name}: not a hypernetwork (no per-width layer pairs)")
    return HypernetworkPatch(mlps, float(strength), name)
