"""Weight streaming: run a model whose weights do not fit in the memory budget.

A model is cut into *units*: the children of its outermost ``nn.ModuleList`` s (an SD UNet's
input / output blocks and the parts of its middle block, a DiT's double / single blocks, a text
encoder's layers, a VAE's up / down levels). One generic rule, no per-family code: the repeated
blocks are where the weights are, and each is called as a whole. When the model does not fit
(``choose``), the weight store (``store.materialize``) holds the rest of the model and as many
units as the budget allows (the largest first, so the fewest bytes move per pass), and leaves the
other units' parameters as ``meta`` placeholders of the dtype they will have. A forward pre-hook
on such a unit brings its tensors in through the weight store's own read path (memory-mapped file,
the same storage-dtype rule, the same quantised-weight handling, the same LoRA merge for that
unit's keys: ``lora.apply_patches(only=)``) and a forward post-hook puts the placeholders back, so
the bytes go as soon as the unit has run. The image is the resident run's, bit for bit: every
tensor goes through the same conversions in the same order (``_fit`` repeats what
``cast.apply_precision`` did to the placeholder: its dtype, a kept fp8 weight as it is, a GGUF
weight quantised, channels-last for half-precision convolutions on a CPU).

Code that calls a unit's layers without calling the unit (a VAE level whose blocks are called
one by one) is covered too: every layer of a unit that holds weights has a pre-hook that brings
its unit in if it is not; at most ``inflight`` units are held at once (the oldest is released
when another comes in), so the peak stays ``resident + inflight x largest unit``.

CPU prefetch (``StreamSource.warm_next``): when a unit comes in, a background thread brings the
file bytes of the unit that follows it (the order recorded on the last pass, else module order)
into the page cache (``safetensors_io.will_need``: ``posix_fadvise(WILLNEED)``), so that unit's
memory-mapped views (an fp8 file read as fp8, a bf16 / f32 file at its own dtype) no longer fault
their pages in from disk while its layers compute. It holds no tensors, so the peak held is
unchanged; env ``MIXGRAPH_STREAM_PREFETCH=0`` turns it off.

CUDA (``place``): the streamed units are read once into pinned host memory, copied to the device
with ``non_blocking`` copies on a side stream, and the next unit is prefetched while the current
one computes (``inflight`` 2). That path is written to the same rules but has not run on a GPU
yet; mixgraph's models run on the CPU today.

What it cost is counted in ``STATS`` (bytes streamed, seconds loading, units loaded, passes: the
times a model's units start over, i.e. forward passes; the peak of weights held by
streamed models); ``snapshot()`` before and after a run gives the run's share (``mixgraph run``
prints it and writes it in the report; the server puts ``memory_section`` in a prompt's history
entry).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from mixgraph.nodes.models import memory_budget
from mixgraph.nodes.weights.cast import CastConv2d
from mixgraph.nodes.weights.gguf_tensor import is_quantized, storage_nbytes

__all__ = ["Unit", "StreamStats", "STATS", "snapshot", "since", "memory_section", "stream_units", "units_of", "choose",
           "footprint", "smallest_footprint", "weights_allowance", "attach", "is_streamed", "place",
           "WORK_SHARE", "WORK_CAP", "PREFETCH_ENV"]

log = logging.getLogger(__name__)

#: the share of the budget not given to one model's weights: activations, the other models a
#: prompt holds at the same time (the VAE, a text encoder); at most WORK_CAP. The output cache's
#: share, where it has one (``memory_budget.output_share``), is left out besides
WORK_SHARE = 0.25
WORK_CAP = 2 * memory_budget.GIB
#: "0" turns the CPU prefetch off (``StreamSource.warm_next``), for measuring what it saves
PREFETCH_ENV = "MIXGRAPH_STREAM_PREFETCH"
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def weights_allowance(budget: memory_budget.Budget) -> int:
    """The bytes one model's weights may hold under ``budget``: the rest is the working share and
    what the in-memory output cache may hold of it (its default bound is a share of the budget)."""
    work = min(int(budget.nbytes * WORK_SHARE), WORK_CAP)
    return max(0, budget.nbytes - work - memory_budget.output_share(budget))


# ---------------------------------------------------------------------------------------------
# the plan: which units, how big, which of them stream


@dataclass(frozen=True)
class Unit:
    """One block that can stream: its module name, its state-dict keys and the bytes it holds."""

    name: str
    keys: tuple[str, ...]
    nbytes: int


def stream_units(module: nn.Module) -> list[str]:
    """The module names of the children of ``module``'s outermost ModuleLists, in order."""
    lists: list[str] = []
    for name, m in module.named_modules():
        if name and isinstance(m, nn.ModuleList) and not any(name.startswith(o + ".") for o in lists):
            lists.append(name)
    return [f"{o}.{c}" for o in lists for c, child in module.get_submodule(o)._modules.items() if child is not None]


def units_of(module: nn.Module, rule: Callable[[str, torch.dtype], torch.dtype | None],
             storage: torch.dtype, sizes: Mapping[str, int] | None = None) -> tuple[list[Unit], int]:
    """(units that can stream, bytes of everything else) of a meta-built ``module`` whose weights
    the store would hold in ``storage`` (``rule``: ``store.dtype_rule``); ``sizes`` overrides a
    key's bytes (a GGUF file's quantised tensors). A unit whose tensors are not all floating, kept
    as stored (``keep_stored``) or shared with another part of the model stays resident."""
    sd = module.state_dict(keep_vars=True)
    owners: dict[int, set[str]] = {}
    for k, t in sd.items():
        owners.setdefault(id(t), set()).add(k)

    def nbytes(k: str, t: Tensor) -> int:
        if sizes is not None and k in sizes:
            return sizes[k]
        target = rule(k, storage) if t.is_floating_point() else None
        return t.numel() * (t.element_size() if target is None else torch.empty((), dtype=target).element_size())

    total = sum(nbytes(k, t) for k, t in {id(t): (k, t) for k, t in sd.items()}.values())
    units = []
    for name in stream_units(module):
        keys = tuple(k for k in sd if k.startswith(name + "."))
        if not keys:
            continue
        ok = all(sd[k].is_floating_point() and rule(k, storage) is not None
                 and all(o.startswith(name + ".") for o in owners[id(sd[k])]) for k in keys)
        if ok:
            units.append(Unit(name, keys, sum(nbytes(k, sd[k]) for k in keys)))
    return units, total - sum(u.nbytes for u in units)


def choose(units: Iterable[Unit], fixed: int, allowance: int, mode: str = "normal",
           inflight: int = 1) -> frozenset[str]:
    """The names of the units to stream (empty: the model stays resident). ``mode`` is the
    budget's (``memory_budget.MODES``): "high" / "gpu_only" keep everything resident, "none"
    streams every unit, otherwise the model streams only when ``fixed`` + its units exceed
    ``allowance``, and then keeps resident as many units, the largest first, as leave room for
    ``inflight`` of the streamed ones."""
    units = list(units)
    if mode in ("high", "gpu_only") or not units:
        return frozenset()
    if mode == "none":
        return frozenset(u.name for u in units)
    if fixed + sum(u.nbytes for u in units) <= allowance:
        return frozenset()
    streamed = {u.name: u for u in units}
    held = fixed
    for u in sorted(units, key=lambda u: -u.nbytes):
        rest = max((v.nbytes for n, v in streamed.items() if n != u.name), default=0)
        if held + u.nbytes + inflight * rest <= allowance:
            held += u.nbytes
            del streamed[u.name]
    return frozenset(streamed)


def footprint(units: Iterable[Unit], fixed: int, streamed: frozenset[str], inflight: int = 1) -> int:
    """The most weight bytes the model holds at once when ``streamed`` units stream."""
    units = list(units)
    moving = [u.nbytes for u in units if u.name in streamed]
    return fixed + sum(u.nbytes for u in units if u.name not in streamed) + inflight * max(moving, default=0)


def smallest_footprint(units: Iterable[Unit], fixed: int, inflight: int = 1) -> int:
    """The footprint with every unit streamed: the least this model can run in."""
    units = list(units)
    return footprint(units, fixed, frozenset(u.name for u in units), inflight)


# ---------------------------------------------------------------------------------------------
# what it cost


@dataclass
class StreamStats:
    bytes_streamed: int = 0   # bytes brought in by unit loads (storage dtype, quantised bytes for GGUF)
    load_seconds: float = 0.0  # time spent reading, converting and placing them
    loads: int = 0            # unit loads
    passes: int = 0           # times a streamed model's first streamed unit came in (forward passes)
    models: int = 0           # models materialized streamed
    peak_bytes: int = 0       # most weight bytes one streamed model held at once (resident + loaded)
    # per model ("unet weights from x.safetensors"): [bytes streamed, load seconds, passes]
    by_model: dict = field(default_factory=dict)


STATS = StreamStats()
_STATS_LOCK = threading.Lock()


def _copy(stats: StreamStats) -> StreamStats:
    out = StreamStats(**asdict(stats))
    out.by_model = {k: list(v) for k, v in stats.by_model.items()}
    return out


def snapshot() -> StreamStats:
    """A copy of ``STATS`` (the peak reset for what follows, so ``since`` gives a run's own)."""
    with _STATS_LOCK:
        out = _copy(STATS)
        STATS.peak_bytes = 0
        return out


def since(before: StreamStats) -> dict:
    """What streaming cost since ``before`` (``snapshot()``), as the run report's ``streaming``
    section; per pass = per forward of a streamed model (one per sampling step and batch of conds),
    also per model (``models``: bytes, seconds, passes)."""
    with _STATS_LOCK:
        now = _copy(STATS)
    passes = now.passes - before.passes
    out = {"models": now.models - before.models, "bytes_streamed": now.bytes_streamed - before.bytes_streamed,
           "load_seconds": round(now.load_seconds - before.load_seconds, 4), "loads": now.loads - before.loads,
           "passes": passes, "peak_weight_bytes": now.peak_bytes}
    if passes:
        out["bytes_per_pass"] = out["bytes_streamed"] // passes
        out["seconds_per_pass"] = round(out["load_seconds"] / passes, 4)
    per_model = {}
    for name, (nbytes, seconds, n) in now.by_model.items():
        b0, s0, n0 = before.by_model.get(name, (0, 0.0, 0))
        if nbytes - b0:
            per_model[name] = {"bytes_streamed": nbytes - b0, "load_seconds": round(seconds - s0, 4),
                               "passes": n - n0}
    if per_model:
        out["by_model"] = per_model
    return out


def memory_section(device: str, streamed: dict) -> dict:
    """A run's ``memory`` section (``mixgraph run --report``, a history entry's
    ``status["mixgraph"]``): the budget in force on ``device`` and what streaming cost
    (``since``)."""
    b = memory_budget.budget(device)
    return {"budget_bytes": b.nbytes, "budget_origin": b.origin, "mode": b.mode, "streaming": streamed}


# ---------------------------------------------------------------------------------------------
# the runtime: hooks that bring a unit in and put it back


class StreamSource:
    """Where one streamed model's units come from, shared by every copy of the module
    (``apply_precision`` deep-copies it; this object is not copied)."""

    def __init__(self, name: str, read: Callable[[str], dict[str, Tensor]], resident_bytes: int,
                 warm: Callable[[str], None] | None = None):
        self.name = name
        self.read = read            # unit prefix "blocks.3." -> the store's tensors of that unit
        self.warm = warm            # unit prefix -> ask for its file bytes ahead (CPU prefetch)
        self.after: dict[str, str] = {}   # unit prefix -> the one loaded after it last time
        self.previous: str | None = None  # the unit loaded last
        self.first: str | None = None     # the first unit in module order
        self.seen: set[int] = set()  # units loaded in this pass: loading one again starts the next
        self.lock = threading.RLock()
        self.loaded: list[_Unit] = []
        self.resident_bytes = resident_bytes
        self.held = resident_bytes
        self.device = torch.device("cpu")
        self.inflight = 1
        self.host: dict[str, dict[str, Tensor]] = {}   # CUDA: pinned host copies by unit prefix
        self.stream = None                              # CUDA: the side stream of the copies
        self.pending: dict[str, dict[str, Tensor]] = {}  # CUDA: prefetched device copies

    def __deepcopy__(self, memo):
        return self

    def tensors(self, prefix: str) -> dict[str, Tensor]:
        """The unit's tensors on the device (CPU: read now; CUDA: from pinned host memory)."""
        if self.device.type != "cuda":
            return self.read(prefix)
        ready = self.pending.pop(prefix, None)
        if ready is None:
            ready = self._copy(prefix)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for t in ready.values():  # made on the side stream, used (and freed) on this one
            (t.raw if is_quantized(t) else t).record_stream(current)
        return ready

    def warm_next(self, prefix: str, next_prefix: str | None) -> None:
        """CPU: ``prefix`` is coming in; ask for the bytes of the unit that follows it (the one
        that followed it last time, else the next in module order, the first after the last)
        in the background (``warm``: the store's ``safetensors_io.will_need``), so the file is
        read into the page cache while ``prefix``'s layers compute and that unit's read finds
        its bytes there. Only the kernel's page cache fills: the tensors are still made by the
        unit's own read when it comes in, so the peak held and the bytes counted are those of
        a run without, and the output is the same bit for bit. Off with env
        ``MIXGRAPH_STREAM_PREFETCH=0``."""
        if self.previous is not None and self.previous != prefix:
            self.after[self.previous] = prefix
        self.previous = prefix
        target = self.after.get(prefix, next_prefix or self.first)
        if (self.warm is None or self.device.type == "cuda" or target is None or target == prefix
                or os.environ.get(PREFETCH_ENV, "1") == "0"):
            return
        threading.Thread(target=self._warm, args=(target,), name="mixgraph-stream-prefetch", daemon=True).start()

    def _warm(self, prefix: str) -> None:
        try:
            self.warm(prefix)
        except Exception:  # a hint only: the unit is read as usual when it comes in
            log.debug("%s: prefetching %s failed", self.name, prefix, exc_info=True)

    def prefetch(self, prefix: str | None) -> None:
        if self.device.type == "cuda" and prefix is not None and prefix not in self.pending:
            self.pending[prefix] = self._copy(prefix)

    def _copy(self, prefix: str) -> dict[str, Tensor]:
        host = self.host.get(prefix)
        if host is None:
            host = self.host[prefix] = {k: v if is_quantized(v) else v.pin_memory()
                                        for k, v in self.read(prefix).items()}
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self.stream):
            return {k: v.to(self.device, non_blocking=True) for k, v in host.items()}


def _fit(owner: nn.Module, attr: str, t: Tensor, placeholder: Tensor, scaled: bool, what: str) -> Tensor:
    """``t`` (the store's tensor) as the resident path would hold it in ``placeholder``'s place:
    the placeholder's shape and dtype (what ``apply_precision`` made of it), except a GGUF weight
    (kept quantised) and a kept fp8 weight with a scale (kept as read); channels-last as
    ``apply_precision`` stores half-precision convolution weights on a CPU."""
    if tuple(t.shape) != tuple(placeholder.shape):
        if _squeeze(tuple(t.shape)) != _squeeze(tuple(placeholder.shape)):
            raise ValueError(f"{what}: weight with an unexpected shape: {list(t.shape)} "
                             f"(model expects {list(placeholder.shape)})")
        t = t.reshape(placeholder.shape)  # [C, C] Linear stored for a [C, C, 1, 1] conv
    if is_quantized(t):
        return t
    if not scaled:
        t = t.to(placeholder.dtype)
    if (attr == "weight" and isinstance(owner, CastConv2d) and owner.channels_last
            and t.device.type == "cpu"):
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


class _Unit:
    """The forward pre-hook of one streamed unit (and the state of its load)."""

    def __init__(self, source: StreamSource, module: nn.Module, prefix: str, next_prefix: str | None,
                 index: int):
        self.source = source
        self.index = index
        self.module = module
        self.prefix = prefix
        self.next_prefix = next_prefix
        self.state: list | None = None   # while loaded: (owner, attr, is_param, placeholder), ...
        self.scaled: list[nn.Module] = []
        self.nbytes = 0

    def __call__(self, _module, _args) -> None:
        if self.state is None:
            self.load()

    def load(self) -> None:
        src = self.source
        with src.lock:
            if self.state is not None:
                return
            while len(src.loaded) >= src.inflight:
                src.loaded[0].release()
            start = time.perf_counter()
            src.warm_next(self.prefix, self.next_prefix)
            tensors = src.tensors(self.prefix)
            src.prefetch(self.next_prefix)
            scales = {k[: -len("_scale")]: v for k, v in tensors.items() if k.endswith(".weight_scale")
                      and k[: -len("_scale")] in tensors and tensors[k[: -len("_scale")]].dtype in _FP8}
            state = []
            for name, owner in self.module.named_modules():
                for store_, is_param in ((owner._parameters, True), (owner._buffers, False)):
                    for attr, ph in list(store_.items()):
                        if ph is None or not ph.is_meta:
                            continue
                        key = f"{self.prefix}{name}.{attr}" if name else f"{self.prefix}{attr}"
                        t = tensors.get(key)
                        if t is None:
                            raise ValueError(f"{src.name}: weight {key} missing from the file for this "
                                             f"architecture (the file is incomplete or of another model type)")
                        t = _fit(owner, attr, t, ph, key in scales, f"{src.name} {key}")
                        store_[attr] = nn.Parameter(t, requires_grad=False) if is_param else t
                        state.append((store_, attr, ph))
                        if key in scales:
                            owner.register_buffer("weight_scale", scales[key], persistent=False)
                            self.scaled.append(owner)
            self.state = state
            self.nbytes = sum(storage_nbytes(t) for t in tensors.values())
            src.loaded.append(self)
            src.held += self.nbytes
            seconds, first = time.perf_counter() - start, not src.seen or self.index in src.seen
            if first:
                src.seen = set()
            src.seen.add(self.index)
            with _STATS_LOCK:
                STATS.bytes_streamed += self.nbytes
                STATS.loads += 1
                STATS.load_seconds += seconds
                STATS.passes += first
                STATS.peak_bytes = max(STATS.peak_bytes, src.held)
                mine = STATS.by_model.setdefault(src.name, [0, 0.0, 0])
                mine[0] += self.nbytes
                mine[1] += seconds
                mine[2] += first

    def release(self) -> None:
        src = self.source
        with src.lock:
            if self.state is None:
                return
            for store_, attr, ph in self.state:
                store_[attr] = ph
            for owner in self.scaled:
                del owner._buffers["weight_scale"]
            self.state, self.scaled = None, []
            src.loaded.remove(self)
            src.held -= self.nbytes


class _Release:
    """The forward post-hook of a streamed unit: its tensors go once it has run."""

    def __init__(self, unit: _Unit):
        self.unit = unit

    def __call__(self, _module, _args, _output) -> None:
        self.unit.release()


def attach(module: nn.Module, streamed: Iterable[str], read: Callable[[str], dict[str, Tensor]],
           resident_bytes: int, name: str, warm: Callable[[str], None] | None = None) -> nn.Module:
    """Install the hooks on ``module``'s ``streamed`` units (module names, whose parameters are
    meta placeholders); ``read(prefix)`` gives a unit's tensors as the weight store holds them,
    ``warm(prefix)`` asks for its file bytes ahead of the read (CPU prefetch; None: none)."""
    streamed = set(streamed)
    order = [u for u in stream_units(module) if u in streamed]
    source = StreamSource(name, read, resident_bytes, warm)
    source.first = order[0] + "." if order else None
    for i, unit_name in enumerate(order):
        unit_module = module.get_submodule(unit_name)
        nxt = order[i + 1] + "." if i + 1 < len(order) else None
        unit = _Unit(source, unit_module, unit_name + ".", nxt, i)
        unit_module.register_forward_pre_hook(unit)
        unit_module.register_forward_hook(_Release(unit))
        for _sub_name, sub in unit_module.named_modules():
            if sub is not unit_module and (sub._parameters or sub._buffers):
                sub.register_forward_pre_hook(unit)  # its layers called without the unit: still in
    module._mixgraph_stream = source
    with _STATS_LOCK:
        STATS.models += 1
        STATS.peak_bytes = max(STATS.peak_bytes, resident_bytes)
    return module


def is_streamed(module: nn.Module) -> bool:
    return getattr(module, "_mixgraph_stream", None) is not None


def place(module: nn.Module, device: str | torch.device) -> nn.Module:
    """Move a streamed module to ``device``: its resident tensors now, its units per use (CUDA:
    from pinned host memory, two in flight, the next prefetched on a side stream). Untested on a
    GPU (see the module docstring)."""
    device = torch.device(device)
    source = getattr(module, "_mixgraph_stream", None)
    if source is None:
        return module.to(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"streaming to {device}: CUDA is not available")
    for m in module.modules():
        for store_ in (m._parameters, m._buffers):
            for attr, t in list(store_.items()):
                if t is not None and not t.is_meta:
                    moved = t.to(device)
                    store_[attr] = nn.Parameter(moved, requires_grad=False) if isinstance(t, nn.Parameter) else moved
    source.device = device
    source.inflight = 2 if device.type == "cuda" else 1
    return module
