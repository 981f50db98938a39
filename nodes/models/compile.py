"""torch.compile for the UNet (ComfyUI's ``comfy_extras/nodes_torch_compile.py``, TorchCompileModel;
comfyanonymous/ComfyUI file commit 0793668): a MODEL handle names a backend and each materialised
UNet runs through ``torch.compile(module, backend=...)``.

The wrapper goes around the runner's precision-applied module (a copy made per runner by
``cast.apply_precision``); the weight store's shared module is never changed, so an uncompiled
handle of the same weights keeps running eagerly. A wrapper is remembered per module object while
it lives. Compilation happens on the first call (minutes on a full-size UNet).
"cudagraphs" records CUDA graphs and needs a CUDA device.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["BACKENDS", "check_backend", "compiled"]

BACKENDS = ("inductor", "cudagraphs")

_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def check_backend(backend: str, device=None) -> str:
    """``backend`` when it can run here (on ``device``, else anywhere CUDA is present)."""
    if backend not in BACKENDS:
        raise ValueError(f"TorchCompileModel backend {backend!r}: not one of {', '.join(BACKENDS)}")
    if backend == "cudagraphs":
        on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
        if not on_cuda:
            raise ValueError("TorchCompileModel backend 'cudagraphs' needs CUDA (it records CUDA graphs); "
                             "this model runs on the CPU: use 'inductor' or run on a CUDA device")
    return backend


def _device_of(module: torch.nn.Module):
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def compiled(module: torch.nn.Module, backend: str) -> torch.nn.Module:
    """``module`` wrapped by ``torch.compile`` with ``backend`` (made once per module)."""
    if any(p.is_meta for p in module.parameters()):
        raise NotImplementedError(
            "TorchCompileModel on a model whose blocks stream (it does not fit in the memory budget) is "
            "not supported yet; raise --memory-budget or leave TorchCompileModel out")
    check_backend(backend, _device_of(module))
    per_module = _COMPILED.setdefault(module, {})
    if backend not in per_module:
        per_module[backend] = torch.compile(module, backend=backend)
    return per_module[backend]
