"""ComfyUI's `comfy.utils` for custom node packs: `ProgressBar` (the running node's progress
events, interrupts included), `common_upscale` (mixgraph's resize, ComfyUI's methods), tensor
file I/O (safetensors; pickles only with `weights_only`), batch helpers."""

from __future__ import annotations

import logging
from typing import Any, Callable

import safetensors.torch
import torch

import mixgraph.nodes.models.resize as _resize
import mixgraph.ui.comfy.comfy_runtime as _rt

log = logging.getLogger("mixgraph.custom_nodes")

PROGRESS_BAR_ENABLED = True
PROGRESS_BAR_HOOK: Callable | None = None


def set_progress_bar_enabled(enabled: bool) -> None:
    global PROGRESS_BAR_ENABLED
    PROGRESS_BAR_ENABLED = enabled


def set_progress_bar_global_hook(function: Callable | None) -> None:
    global PROGRESS_BAR_HOOK
    PROGRESS_BAR_HOOK = function


class ProgressBar:
    """Progress of the running node: `update(n)` adds n steps, `update_absolute(value, total,
    preview)` sets them; each reaches clients as a `progress` event and checks for an interrupt."""

    def __init__(self, total: int, node_id: str | None = None):
        self.total = int(total)
        self.current = 0
        self._running = _rt.running()
        self.node_id = node_id if node_id is not None else \
            (self._running.node_id if self._running else None)

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        if total is not None:
            self.total = int(total)
        self.current = min(int(value), self.total) if self.total else int(value)
        if PROGRESS_BAR_HOOK is not None:
            PROGRESS_BAR_HOOK(self.current, self.total, preview, node_id=self.node_id)
        if self._running is not None:
            self._running.ctx.progress(self.current, self.total)

    def update(self, value: int) -> None:
        self.update_absolute(self.current + int(value))


def common_upscale(samples: torch.Tensor, width: int, height: int, upscale_method: str,
                   crop: str) -> torch.Tensor:
    """Resize [B, C, H, W] (ComfyUI's methods: nearest-exact, bilinear, area, bicubic, lanczos;
    crop "disabled" or "center")."""
    return _resize.upscale(samples, int(width), int(height), upscale_method, crop)


def load_torch_file(ckpt: str, safe_load: bool = False, device: Any = None,
                    return_metadata: bool = False):
    """A state dict from a .safetensors file, or a pickle loaded with `weights_only` (nothing in
    a file runs code)."""
    device = device or torch.device("cpu")
    metadata = None
    if str(ckpt).lower().endswith((".safetensors", ".sft")):
        with safetensors.safe_open(ckpt, framework="pt", device=str(device)) as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}
            metadata = f.metadata()
    else:
        log.warning("%s: loading a pickle file with weights_only=True", ckpt)
        sd = torch.load(ckpt, map_location=device, weights_only=True)
        if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
            sd = sd["state_dict"]
    return (sd, metadata) if return_metadata else sd


def save_torch_file(sd: dict, ckpt: str, metadata: dict | None = None) -> None:
    safetensors.torch.save_file(sd, ckpt, metadata=metadata)


def repeat_to_batch_size(tensor: torch.Tensor, batch_size: int, dim: int = 0) -> torch.Tensor:
    n = tensor.shape[dim]
    if n > batch_size:
        return tensor.narrow(dim, 0, batch_size)
    if n < batch_size:
        reps = [1] * tensor.ndim
        reps[dim] = -(-batch_size // n)
        return tensor.repeat(reps).narrow(dim, 0, batch_size)
    return tensor


def resize_to_batch_size(tensor: torch.Tensor, batch_size: int) -> torch.Tensor:
    n = tensor.shape[0]
    if n == batch_size:
        return tensor
    if batch_size <= 1:
        return tensor[:batch_size]
    idx = torch.linspace(0, n - 1, batch_size).round().long()
    return tensor[idx]


def state_dict_prefix_replace(state_dict: dict, replace_prefix: dict, filter_keys: bool = False) -> dict:
    out = {} if filter_keys else state_dict
    for old, new in replace_prefix.items():
        for k in [k for k in state_dict if k.startswith(old)]:
            out[new + k[len(old):]] = state_dict.pop(k) if not filter_keys else state_dict[k]
    return out


def calculate_parameters(sd: dict, prefix: str = "") -> int:
    return sum(v.nelement() for k, v in sd.items() if k.startswith(prefix))


def get_attr(obj: Any, attr: str) -> Any:
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def set_attr(obj: Any, attr: str, value: Any) -> Any:
    *path, last = attr.split(".")
    for name in path:
        obj = getattr(obj, name)
    prev = getattr(obj, last)
    setattr(obj, last, value)
    return prev


def tiled_scale(*args: Any, **kwargs: Any):
    raise _rt.missing("comfy.utils.tiled_scale")


def bislerp(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    raise _rt.missing("comfy.utils.bislerp")
