"""The memory budget per device: how many bytes one run may hold at once.

Everything a prompt holds counts against it (text encoders, the diffusion model, the VAE, cached
outputs, activations). It is set once per process (`mixgraph run|serve --memory-budget GIB`, the
Python API, ComfyUI's VRAM flags on CUDA) and read by whatever must stay within it: the weight
store, weight streaming, the memory estimate, the guards on image / video / latent sizes.

Default: on a CPU the machine's RAM (or the container's limit) less a reserve for the operating
system and the process itself; on CUDA the free VRAM when first asked, less ComfyUI's
`--reserve-vram` (default the same reserve rule). The default is computed when first asked, so a
process that never sets one still gets a budget that fits the machine.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Budget", "GIB", "budget", "set_budget", "reset", "default_budget", "machine_bytes",
           "default_reserve", "BUDGET_ENV", "set_output_share", "output_share"]

GIB = 1 << 30
#: env override of the default budget, in GiB (tests and benchmarks; the CLI flag wins)
BUDGET_ENV = "MIXGRAPH_MEMORY_BUDGET_GIB"

#: ComfyUI's VRAM states, which a CUDA budget carries (CPU budgets are always "normal")
MODES = ("normal", "low", "none", "high", "gpu_only")


@dataclass(frozen=True)
class Budget:
    """`nbytes` one run may hold on `device`; `origin` says where the number comes from (shown in
    refusals and `nodes --system`); `mode` is ComfyUI's VRAM state on CUDA."""
    device: str
    nbytes: int
    origin: str
    mode: str = "normal"

    @property
    def gib(self) -> float:
        return self.nbytes / GIB


def _device_key(device: str | torch.device) -> str:
    d = torch.device(device)
    return "cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}"


def _cgroup_limit() -> int | None:
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return None
    return None if raw == "max" else int(raw)


def machine_bytes(device: str | torch.device = "cpu") -> int | None:
    """Total memory the device offers this process: RAM capped by the container's limit on a CPU,
    free VRAM on CUDA. None when it cannot be read."""
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.mem_get_info(d.index or 0)[0])
    try:
        total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
    try:
        limit = _cgroup_limit()
    except ValueError:
        limit = None
    return total if limit is None else min(total, limit)


def default_reserve(total: int) -> int:
    """What the default keeps free for the system and the process: a tenth of the memory, at
    least 1 GiB and at most 4 GiB."""
    return max(GIB, min(4 * GIB, total // 10))


def default_budget(device: str | torch.device = "cpu", reserve_bytes: int | None = None) -> Budget:
    """The budget when none is set: env `MIXGRAPH_MEMORY_BUDGET_GIB`, else the machine's memory
    less the reserve (8 GiB when the machine's memory cannot be read)."""
    key = _device_key(device)
    env = os.environ.get(BUDGET_ENV)
    if env:
        return Budget(key, int(float(env) * GIB), f"env {BUDGET_ENV}={env}")
    total = machine_bytes(device)
    if total is None:
        return Budget(key, 8 * GIB, "default 8 GiB (the machine's memory could not be read)")
    reserve = default_reserve(total) if reserve_bytes is None else reserve_bytes
    what = "free VRAM" if key.startswith("cuda") else "RAM"
    return Budget(key, max(0, total - reserve),
                  f"{what} {total / GIB:.1f} GiB less a {reserve / GIB:.1f} GiB reserve")


_lock = threading.Lock()
_budgets: dict[str, Budget] = {}
_output_shares: dict[str, tuple[Budget, int]] = {}  # device -> (the budget, bytes the output cache may hold of it)


def budget(device: str | torch.device = "cpu") -> Budget:
    """The budget in force for `device` (the default, computed once, until one is set)."""
    key = _device_key(device)
    with _lock:
        b = _budgets.get(key)
        if b is None:
            b = _budgets[key] = default_budget(key)
        return b


def set_budget(device: str | torch.device = "cpu", gib: float | None = None, *,
               reserve_gib: float | None = None, mode: str = "normal", origin: str | None = None) -> Budget:
    """Set the budget of `device`: `gib` GiB, or the default with `reserve_gib` kept free when
    `gib` is None. Returns the budget now in force."""
    if mode not in MODES:
        raise ValueError(f"memory mode {mode!r}: expected one of {', '.join(MODES)}")
    if gib is not None and not (gib > 0):
        raise ValueError(f"--memory-budget must be a positive number of GiB, got {gib}")
    if reserve_gib is not None and reserve_gib < 0:
        raise ValueError(f"--reserve-vram must be >= 0 GiB, got {reserve_gib}")
    key = _device_key(device)
    if gib is not None:
        b = Budget(key, int(gib * GIB), origin or f"--memory-budget {gib:g}", mode)
    else:
        d = default_budget(key, None if reserve_gib is None else int(reserve_gib * GIB))
        b = Budget(key, d.nbytes, origin or d.origin, mode)
    with _lock:
        _budgets[key] = b
    return b


def set_output_share(b: Budget, nbytes: int) -> None:
    """Record that the in-memory output cache may hold `nbytes` of budget `b` (its default bound
    is a share of the budget: ui/ calls this when it makes the cache; 0: none of it). Weight
    streaming leaves that share out of a model's weights allowance. It belongs to `b` itself: a
    budget set afterwards starts without one (its cache is made again after it)."""
    with _lock:
        _output_shares[b.device] = (b, max(0, int(nbytes)))


def output_share(b: Budget) -> int:
    """The bytes of budget `b` the output cache may hold (`set_output_share`), 0 if none recorded."""
    with _lock:
        entry = _output_shares.get(b.device)
    return entry[1] if entry is not None and entry[0] is b else 0


def reset() -> None:
    """Forget every budget set (tests): the next `budget()` computes the default again."""
    with _lock:
        _budgets.clear()
        _output_shares.clear()
