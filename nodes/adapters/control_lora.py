"""Stability's ControlLoRA files (SDXL ``control-lora-canny/depth/recolor/sketch`` rank 128/256).

Detection (ComfyUI ``comfy/controlnet.py``: ``load_controlnet_state_dict``, ``ControlLora``,
``ControlLoraOps``): the file holds a ``lora_controlnet`` marker key. It is no full ControlNet: the net
is a copy of the *sampled* model's UNet encoder, built when sampling starts (ComfyUI
``ControlLora.pre_run``), whose weights are

* the base UNet's weight for every key the ControlNet shares with it (input blocks, middle block,
  time/label embeddings), replaced by the file's own tensor where the file has one
  (``input_hint_block``, ``zero_convs``, ``middle_block_out``, norms, biases, ...);
* plus, for a layer with ``<layer>.up`` / ``<layer>.down`` in the file, the LoRA product
  ``(up.flatten(1) @ down.flatten(1)).reshape(weight.shape)`` at scale 1 (ComfyUI's
  ``ControlLoraOps`` Linear/Conv2d add it in forward; folding it into the weight is the same sum).

Here ``ControlLoraHandle.runner(policy)`` (what ControlNetApply puts into the chain) is a
``ControlLoraRunner`` that cannot run until ``bind_model`` gives it the sampling MODEL; the
sampler's cond resolver (``sampling/parameterization.py``) binds every ControlLoRA link of a chain
before the first step (``bind_chain``). Materialized nets are cached per (file, base model recipe,
precision), so two base models get two nets. The base weights are the model's patched weights
(merged LoRAs included, as ComfyUI's ``diffusion_model.state_dict()`` of the loaded model), read
in float32; the net then runs under the ControlNet's precision policy like any ControlNet.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mixgraph.nodes.adapters import lora_bypass
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.quantized import plain_state_dict
from mixgraph.nodes.adapters.controlnet import ControlNetModel, controlnet_config_from_state_dict
from mixgraph.nodes.families.sd.unet import UNetModel

__all__ = ["MARKER", "is_control_lora", "ControlLoraHandle", "ControlLoraRunner", "build_control_lora_state_dict",
           "bind_chain"]

MARKER = "lora_controlnet"


def is_control_lora(keys) -> bool:
    return MARKER in keys


def build_control_lora_state_dict(file_sd: dict[str, Tensor], base_sd: dict[str, Tensor],
                                  wanted: set[str] | None = None) -> dict[str, Tensor]:
    """The ControlNet's float32 weights from the file's tensors and the base UNet's (both
    unprefixed LDM names). ``wanted``: the ControlNet's keys (base keys outside it are dropped);
    None keeps every base key of the encoder half."""
    out: dict[str, Tensor] = {}
    for k, v in base_sd.items():
        if (wanted is None and k.startswith(("input_blocks.", "middle_block.", "time_embed.", "label_emb."))) \
                or (wanted is not None and k in wanted):
            out[k] = v.float().clone()
    for k, v in file_sd.items():
        if k == MARKER or k.endswith((".up", ".down")):
            continue
        out[k] = v.float().clone()
    for k, up in file_sd.items():
        if not k.endswith(".up"):
            continue
        layer = k[: -len(".up")]
        down = file_sd.get(layer + ".down")
        if down is None:
            raise ValueError(f"ControlLoRA: {k} has no matching {layer}.down")
        w = out.get(layer + ".weight")
        if w is None:
            raise ValueError(f"ControlLoRA: {layer}.up/.down but the base model has no {layer}.weight")
        w += (up.float().flatten(1) @ down.float().flatten(1)).reshape(w.shape)
    return out


_CACHE: "OrderedDict[tuple, torch.nn.Module]" = OrderedDict()
_CACHE_SIZE = 2
_LOCK = threading.Lock()


def _read_file(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _base_state_dict(model) -> dict[str, Tensor]:
    """The sampling model's (UNetRunner's) patched UNet weights in float32, unwrapped names."""
    handle = model.handle
    policy = getattr(model, "policy", None)
    storage = policy.storage if policy is not None else torch.float32
    merged, _ = lora_bypass.split(handle.patches)  # bypass LoRAs are forward hooks, not weights
    module = store.materialize("unet", handle.source, handle.config, storage, merged, UNetModel, stream=False)
    return {k: v.detach() for k, v in plain_state_dict(module).items()
            if k.startswith(("input_blocks.", "middle_block.", "time_embed.", "label_emb."))}


@dataclass(frozen=True)
class ControlLoraHandle:
    """CONTROL_NET for a ControlLoRA file: the file only; the net is built per base model."""

    path: Path
    precision: object = None
    control_type: tuple[int, ...] = ()

    def with_precision(self, policy) -> "ControlLoraHandle":
        return dataclasses.replace(self, precision=policy)

    def runner(self, policy) -> "ControlLoraRunner":
        return ControlLoraRunner(self, policy)


class ControlLoraRunner:
    """A ControlLoRA link's runner before the sampling model is known; ``bind_model`` gives the
    runnable net (precision-applied ``ControlNetModel``)."""

    def __init__(self, handle: ControlLoraHandle, policy):
        self.handle = handle
        self.policy = policy

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"ControlLoRA {self.handle.path.name}: not bound to a model; it is built from the "
                           f"sampled MODEL's UNet when sampling starts (KSampler / SamplerCustom)")

    def bind_model(self, model) -> torch.nn.Module:
        h = model.handle
        p = self.handle.path
        st = os.stat(p)
        key = (str(p), st.st_mtime_ns, st.st_size, h.source, h.config, tuple(map(repr, h.patches)),
               repr(self.policy))
        with _LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
        file_sd = _read_file(p)
        sd = build_control_lora_state_dict(file_sd, _base_state_dict(model))
        try:
            cfg = controlnet_config_from_state_dict(sd)
        except (ValueError, KeyError) as e:
            raise ValueError(f"ControlLoRA {p.name}: cannot build a ControlNet on this model: {e}") from e
        net = ControlNetModel(cfg)
        wanted = set(net.state_dict())
        sd = {k: v for k, v in sd.items() if k in wanted}
        missing = sorted(wanted - set(sd))
        if missing:
            raise ValueError(f"ControlLoRA {p.name}: neither the file nor the base model has {missing[:4]} "
                             f"(a ControlLoRA for another model family?)")
        try:
            net.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            raise ValueError(f"ControlLoRA {p.name}: its tensors do not fit this model's UNet: {e}") from e
        net.eval().requires_grad_(False)
        module = apply_precision(net, self.policy) if self.policy is not None else net
        with _LOCK:
            _CACHE[key] = module
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
        return module


def bind_chain(chain, model, memo: dict):
    """``chain`` with every ControlLoRA link's runner (and any other runner with ``bind_model``, e.g.
    ``sd35_controlnet.SD35Runner``) bound to ``model`` (new links where one changes; shared links
    stay shared through ``memo``)."""
    if chain is None or not dataclasses.is_dataclass(chain) or not hasattr(chain, "previous"):
        return chain
    if id(chain) in memo:
        return memo[id(chain)]
    prev = bind_chain(chain.previous, model, memo)
    runner = getattr(chain, "runner", None)
    changes = {}
    if prev is not chain.previous:
        changes["previous"] = prev
    if isinstance(runner, ControlLoraRunner) or callable(getattr(runner, "bind_model", None)):
        changes["runner"] = runner.bind_model(model)  # ControlLoRA; DiT nets borrowing the model's parts
    out = dataclasses.replace(chain, **changes) if changes else chain
    memo[id(chain)] = out
    return out

