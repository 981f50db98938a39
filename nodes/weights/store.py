"""The process-wide weight store: load each model's weights once, share them, bound the memory.

``materialize(kind, source, config, storage_dtype, patches, build)`` returns an ``nn.Module``
whose parameters are the cached tensors for ``(source, storage dtype, patches)``:

- The cache holds **state dicts** (tensors), in an LRU bounded by a byte budget (default the CPU
  memory budget, ``memory_budget.budget("cpu")``, followed as it changes; ``configure(budget_bytes=...)``
  or env ``MIXGRAPH_WEIGHT_CACHE_BYTES``). Each call
  builds a fresh module on the ``meta`` device and assigns the cached tensors to it (cheap: no
  allocation, no random init), so callers may wrap or re-cast the module (``apply_precision``)
  without touching what others share. Cached tensors must never be modified in place.
- Tensors are read from disk one at a time straight into the storage dtype (``safetensors_io``),
  never via an f32 copy of the whole model.
- A second dtype of a source already cached is **derived in memory** when the cached copy holds
  the file's values exactly (the cached dtype can represent every stored dtype: an f32 copy of an
  f16 file → bf16, or a bf16 copy of a bf16 file → f32); otherwise the file is read again
  (memory-mapped). So a bf16 and an f32 use of one file read it from disk at most once per dtype,
  and only once when the first use is at least as wide as the file.
- Patches (LoRA) are merged into a copy of the unpatched entry by ``nodes.adapters.lora.apply_patches``
  (float32 merge, one cast back to the storage dtype, as ComfyUI); two workflows with the same
  LoRA stack share the merged entry. A ``MergePatch`` (model merging) materializes the other
  model it names through this same store first, in the same storage dtype.
- Parameters of modules named in the model class's ``keep_f32`` patterns are stored in float32
  whatever the storage dtype (they are tiny and must stay exact).
- ComfyUI's quantised files (scaled fp8, mixed precision: ``quantized.py``) are read for any model:
  under an fp8 storage dtype a quantised Linear / Conv layer keeps the file's fp8 weight and its
  scale (attached to the layer as ``weight_scale``, applied by the cast layers), otherwise it is
  dequantised once at read time. Their entries are never derived to another dtype (each dtype is
  read from the file); a LoRA merge dequantises a patched fp8 weight, adds, and re-quantises it
  with its scale (``apply_patches(scales=)``); a model merge sees the other model dequantised.
- GGUF files (``gguf_file.py``): their quantised weights are held as the file's bytes
  (``gguf_tensor.QuantizedTensor``) whatever the storage dtype, and counted by those bytes; the
  cast layers dequantise them per forward. A LoRA or merge patch on such a weight works on its
  dequantised float32 values, as ComfyUI-GGUF applies patches to the dequantised weight, and the
  patched weight is held dense in its storage dtype. Their entries are never derived to another dtype.
- A model whose weights do not fit in the memory budget is materialized **streamed**
  (``streaming.py``): the store holds the rest of the model and the blocks that fit (one entry,
  its key's patches ending in ``_Partial``), and the other blocks are read through this same path
  (``_read_part``: rename, dtype rule, quantised handling, layout step, LoRA merge for their keys)
  each time they run, and dropped after. ``materialize(stream=False)`` never streams (saving).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mixgraph.nodes.models import memory_budget
from mixgraph.nodes.weights import streaming
from mixgraph.nodes.weights.gguf_file import is_gguf
from mixgraph.nodes.weights.gguf_tensor import is_quantized, storage_nbytes
from mixgraph.nodes.weights.layouts import reader_for_source
from mixgraph.nodes.adapters.lora import apply_patches
from mixgraph.nodes.weights.merge import MergePatch
from mixgraph.nodes.weights.quantized import attach_scales, dequantized, keep_scaled_rule, scales_of
from mixgraph.nodes.weights.safetensors_io import (PICKLE_SUFFIXES, WeightSource, byte_ranges, held_quantised,
                                                   inspect_file, quantization, read_source, source_dtypes,
                                                   will_need)

__all__ = ["StoreStats", "WeightStore", "STORE", "materialize", "clear", "configure", "stats", "dtype_rule",
           "held"]

log = logging.getLogger(__name__)

# dtype -> dtypes it represents exactly (every value of each is a value of the key)
_EXACT: dict[torch.dtype, set[torch.dtype]] = {
    torch.float64: {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2},
    torch.float32: {torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2},
    torch.float16: {torch.float16, torch.float8_e4m3fn, torch.float8_e5m2},
    torch.bfloat16: {torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2},
    torch.float8_e4m3fn: {torch.float8_e4m3fn},
    torch.float8_e5m2: {torch.float8_e5m2},
}


CACHE_ENV = "MIXGRAPH_WEIGHT_CACHE_BYTES"


def _default_budget() -> int:
    """The LRU's bound when none was configured: env ``MIXGRAPH_WEIGHT_CACHE_BYTES`` (tests),
    else the CPU memory budget in force (``memory_budget.budget``), read at each eviction so a
    budget set later (``--memory-budget``) applies."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return int(env)
    return memory_budget.budget("cpu").nbytes


@dataclass(frozen=True)
class _Partial:
    """The last element of a cache key's patches for the resident part of a streamed model:
    the units it leaves out (``streaming.py``)."""
    streamed: tuple[str, ...]


@dataclass
class StoreStats:
    hits: int = 0  # materializations served from the cache
    loads: int = 0  # state dicts read from disk (or from an in-memory test source)
    derived: int = 0  # state dicts converted from a cached copy of another dtype
    patched: int = 0  # patch merges performed
    evictions: int = 0
    bytes: int = 0  # bytes held now
    bytes_read: int = 0  # bytes produced by disk reads, in storage dtype
    reads_by_source: dict = field(default_factory=dict)  # source.identity -> number of disk reads


@dataclass
class _Entry:
    tensors: dict[str, torch.Tensor]
    nbytes: int
    exact: bool  # holds the source's stored values exactly (usable to derive other dtypes)


def nbytes(sd: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the distinct tensors (a tensor tied under two names counts once; distinct views
    of one buffer, as OpenCLIP's fused q/k/v split into three, count each)."""
    seen, total = set(), 0
    for t in sd.values():
        key = (t.raw.data_ptr(), "gguf", tuple(t.shape)) if is_quantized(t) else (
            t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            total += storage_nbytes(t)  # a GGUF weight: its quantised bytes
    return total


def _matcher(module: nn.Module, attr: str) -> Callable[[str], bool]:
    """Predicate on state-dict keys: does the key belong to a module named by the class attribute
    ``attr`` (``keep_f32`` or ``keep_stored``) of the module or one of its submodules?

    A pattern matches a dotted module path as a prefix on a dot boundary ("time_embed" matches
    "time_embed.0.weight") or as an fnmatch glob ("*.norm*")."""
    patterns = tuple(
        f"{owner}.{p}" if owner else p for owner, m in module.named_modules() for p in getattr(type(m), attr, ())
    )
    if not patterns:
        return lambda key: False

    def match(key: str) -> bool:
        for p in patterns:
            if key == p or key.startswith(p + ".") or fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(key, p + ".*"):
                return True
        return False

    return match


def dtype_rule(module: nn.Module) -> Callable[[str, torch.dtype], torch.dtype | None]:
    """key, requested storage dtype -> the dtype to hold that tensor in (None: as the file has
    it). ``keep_stored`` modules (embedding tables: only looked-up rows are ever read) stay as
    stored, so an f32 file's table remains a lazily paged view of the file; ``keep_f32`` modules
    are f32; everything else takes the requested dtype."""
    keep, stored = _matcher(module, "keep_f32"), _matcher(module, "keep_stored")

    def rule(key: str, dtype: torch.dtype) -> torch.dtype | None:
        if stored(key):
            return None
        return torch.float32 if keep(key) else dtype

    return rule


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def _build_meta(build: Callable[[Any], nn.Module], config: Any) -> nn.Module:
    with torch.device("meta"):
        return build(config)


def _assign(module: nn.Module, sd: Mapping[str, torch.Tensor], build, config, what: str,
            streamed: Mapping[str, torch.dtype] | None = None) -> nn.Module:
    """Load ``sd`` into a meta-built module by assignment (no copy); the scales of kept fp8
    weights are attached to their layers (``quantized.attach_scales``). ``streamed``: keys left
    out of ``sd`` (units that stream), each made a meta placeholder of the dtype it will have."""
    streamed = streamed or {}
    sd = attach_scales(module, sd)
    expected = {k: v for k, v in module.state_dict().items() if k not in streamed}
    missing = [k for k in expected if k not in sd]
    if missing:
        raise ValueError(
            f"{what}: {len(missing)} weights missing from the file for this architecture, e.g. "
            f"{missing[:5]} (the file is incomplete or of another model type)"
        )
    bad = []
    for k, v in expected.items():
        got = tuple(sd[k].shape)
        if got == tuple(v.shape):
            continue
        if _squeeze(got) == _squeeze(tuple(v.shape)):  # [C, C] Linear stored for a [C, C, 1, 1] conv
            sd[k] = sd[k].reshape(v.shape)
        else:
            bad.append(f"{k} {list(got)} (model expects {list(v.shape)})")
    if bad:
        raise ValueError(f"{what}: weights with unexpected shapes: {bad[:5]}")
    extra = [k for k in sd if k not in expected and not k.endswith(("position_ids", "spiece_model"))]
    if extra:
        log.warning("%s: %d keys not used by the model, e.g. %s", what, len(extra), extra[:5])
    module.load_state_dict({k: sd[k] for k in expected}, strict=not streamed, assign=True)
    for key, dtype in streamed.items():
        owner_name, _, attr = key.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        slots = owner._parameters if attr in owner._parameters else owner._buffers
        ph = torch.empty(slots[attr].shape, dtype=dtype, device="meta")
        slots[attr] = nn.Parameter(ph, requires_grad=False) if slots is owner._parameters else ph
    leftover = [n for n, t in list(module.named_parameters()) + list(module.named_buffers())
                if t.is_meta and n not in streamed]
    if leftover:
        # non-persistent buffers (computed in __init__, not saved): take them from a real build
        real = build(config)
        real_bufs = dict(real.named_buffers())
        for name in leftover:
            if name not in real_bufs:
                raise ValueError(f"{what}: parameter {name} has no value in the file")
            owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            owner._buffers[name.rpartition(".")[2]] = real_bufs[name]
    return module.eval().requires_grad_(False)


def _patched_gguf_in_storage(base, tensors, rule, storage_dtype):
    """A patched GGUF weight (merged on its dequantised f32 values) held in the storage dtype its
    key takes, as a patched plain weight is, rather than in f32."""
    if not any(is_quantized(t) for t in base.values()):
        return tensors
    out = dict(tensors)
    for k, t in tensors.items():
        if is_quantized(base.get(k)) and not is_quantized(t):
            target = rule(k, storage_dtype)
            if target is not None and t.dtype != target:
                out[k] = t.to(target)
    return out


class WeightStore:
    """An LRU of state dicts keyed by (kind, source identity, storage dtype, patches)."""

    def __init__(self, budget_bytes: int | None = None):
        self._budget = None if budget_bytes is None else int(budget_bytes)
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self.stats = StoreStats()

    @property
    def budget_bytes(self) -> int:
        """The LRU's bound: the configured one, else env / the memory budget (``_default_budget``)."""
        return _default_budget() if self._budget is None else self._budget

    def budget_for(self, memory_bytes: int) -> int:
        """The LRU's bound were the memory budget ``memory_bytes`` (the estimate's trial budgets):
        the configured bound or env ``MIXGRAPH_WEIGHT_CACHE_BYTES`` when set, else that budget."""
        if self._budget is not None:
            return self._budget
        env = os.environ.get(CACHE_ENV)
        return int(env) if env else int(memory_bytes)

    # -- public ------------------------------------------------------------------------------

    def materialize(
        self,
        kind: str,
        source: WeightSource,
        config: Hashable,
        storage_dtype: torch.dtype,
        patches: tuple = (),
        build: Callable[[Any], nn.Module] | None = None,
        rename: Callable[[str], str | None] | None = None,
        stream: bool | None = None,
    ) -> nn.Module:
        """A module of ``build(config)`` holding ``source``'s weights in ``storage_dtype`` with
        ``patches`` merged. ``rename`` maps stored keys to module keys (default: the loader's
        converter for ``source.layout``). ``stream``: None streams the model's blocks when it
        does not fit in the memory budget (``streaming.py``), True streams every block, False
        never (callers that read the weights rather than run the module: saving)."""
        if build is None:
            raise TypeError("materialize: build(config) -> nn.Module is required")
        module = _build_meta(build, config)
        patches = tuple(patches)
        rule, keep_scaled = dtype_rule(module), keep_scaled_rule(module)
        what = f"{kind} weights from {source.name}"
        if stream is not False:
            streamed = self._stream_plan(kind, source, config, storage_dtype, patches, module, rule, rename, stream)
            if streamed:
                return self._materialize_streamed(kind, source, config, storage_dtype, patches, build, module,
                                                  rule, rename, keep_scaled, streamed, what)
        sd = self.state_dict(kind, source, config, storage_dtype, patches, rule, rename, keep_scaled)
        return _assign(module, sd, build, config, what)

    def state_dict(
        self,
        kind: str,
        source: WeightSource,
        config: Hashable,
        storage_dtype: torch.dtype,
        patches: tuple = (),
        rule: Callable[[str, torch.dtype], torch.dtype | None] = lambda k, dtype: dtype,
        rename: Callable[[str], str | None] | None = None,
        keep_scaled: Callable[[str], bool] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The cached state dict (see ``materialize``); ``keep_scaled(key)``: may a quantised
        weight stay fp8 with its scale (``<key>_scale`` beside it; default: never)."""
        key = (kind, source.identity, config, storage_dtype, patches)
        with self._lock:
            entry = self._get(key)
            if entry is not None:
                self.stats.hits += 1
                return entry.tensors
            if patches:
                base = self.state_dict(kind, source, config, storage_dtype, (), rule, rename, keep_scaled)
                others = {  # merges: the other model, materialized (and cached) in the same dtype,
                    # read as materialize reads it (one cache entry per key), seen dequantised
                    p: dequantized(self.state_dict(p.kind or kind, p.source, p.config, storage_dtype,
                                                   tuple(p.patches), *self._rules(p, rule, keep_scaled)))
                    for p in patches if isinstance(p, MergePatch) and p.target == kind
                }
                scales = scales_of(base)
                if scales:
                    tensors = apply_patches(base, patches, target=kind, others=others, scales=scales)
                else:
                    tensors = apply_patches(base, patches, target=kind, others=others)
                tensors = _patched_gguf_in_storage(base, tensors, rule, storage_dtype)
                self.stats.patched += 1
                self._put(key, _Entry(tensors, nbytes(tensors), exact=False))
                return tensors
            tensors, exact = self._derive(kind, source, config, storage_dtype, rule)
            if tensors is None:
                tensors, exact = self._read(source, storage_dtype, rule, rename, keep_scaled)
            self._put(key, _Entry(tensors, nbytes(tensors), exact))
            return tensors

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats = StoreStats()

    def held(self) -> list[tuple[str, torch.dtype]]:
        """(file path, storage dtype) of every file-backed entry held now, most recently used
        last; what a Ray worker reports for model affinity (ui/ray/ray_pool.py)."""
        with self._lock:
            return list(dict.fromkeys((ident[1], dtype) for (_kind, ident, _cfg, dtype, _p)
                                      in self._entries if ident[0] == "file"))

    def configure(self, budget_bytes: int | None) -> None:
        """Bound the LRU by ``budget_bytes`` (None: follow the memory budget again)."""
        with self._lock:
            self._budget = None if budget_bytes is None else int(budget_bytes)
            self._evict()

    # -- streaming (``streaming.py``) ---------------------------------------------------------

    def _stream_plan(self, kind, source, config, dtype, patches, module, rule, rename, stream) -> frozenset[str]:
        """The units of ``module`` to stream (empty: materialize it resident)."""
        with self._lock:
            if stream is None and (kind, source.identity, config, dtype, patches) in self._entries:
                return frozenset()  # already held whole: streaming it would only add reads
        units, fixed = streaming.units_of(module, rule, dtype, _quantised_sizes(source, rename))
        budget = memory_budget.budget("cpu")
        mode = "none" if stream else budget.mode
        return streaming.choose(units, fixed, streaming.weights_allowance(budget), mode)

    def _materialize_streamed(self, kind, source, config, dtype, patches, build, module, rule, rename,
                              keep_scaled, streamed, what) -> nn.Module:
        if any(isinstance(p, MergePatch) and p.target == kind for p in patches):
            raise NotImplementedError(
                f"{what}: the model does not fit in the memory budget and carries a model merge; "
                f"streaming a merged model is not supported yet (raise --memory-budget)")
        prefixes = tuple(sorted(u + "." for u in streamed))
        key = (kind, source.identity, config, dtype, patches + (_Partial(prefixes),))
        with self._lock:
            entry = self._get(key)
            if entry is not None:
                self.stats.hits += 1
                sd = entry.tensors
            else:
                sd = self._read_part(kind, source, dtype, patches, rule, rename, keep_scaled,
                                     lambda k: not k.startswith(prefixes))
                self._put(key, _Entry(sd, nbytes(sd), exact=False))
        placeholders = {k: rule(k, dtype) for k in module.state_dict() if k.startswith(prefixes)}
        module = _assign(module, sd, build, config, what, placeholders)

        def read(prefix: str) -> dict[str, torch.Tensor]:
            return self._read_part(kind, source, dtype, patches, rule, rename, keep_scaled,
                                   lambda k: k.startswith(prefix), count=False)

        ranges: dict[str, tuple[tuple[int, int], ...]] = {}

        def warm(prefix: str) -> None:
            if prefix not in ranges:
                ranges[prefix] = _unit_ranges(source, rename, prefix)
            if ranges[prefix]:
                will_need(source.path, ranges[prefix])

        return streaming.attach(module, streamed, read, nbytes(sd), what, warm)

    def _read_part(self, kind, source, dtype, patches, rule, rename, keep_scaled, want, count=True):
        """The store's tensors of the module keys ``want`` accepts, read from ``source`` as
        ``_read`` reads the whole (same rename, dtype rule, quantised handling, layout step) with
        ``patches`` merged as ``state_dict`` merges them; what streaming reads a unit with."""
        post = None
        if rename is None:
            rename, post = reader_for_source(source)
        if post is not None:
            keep_scaled = None

        def wanted(k: str) -> str | None:
            new = rename(k) if rename is not None else k
            return new if new is not None and want(new) else None

        tensors = read_source(source, lambda k: rule(k, dtype), wanted, keep_scaled)
        if post is not None:
            tensors = {k: v for k, v in post(tensors).items() if want(k)}
        if count:
            self.stats.loads += 1
            self.stats.bytes_read += nbytes(tensors)
            ident = source.identity
            self.stats.reads_by_source[ident] = self.stats.reads_by_source.get(ident, 0) + 1
        if patches:
            scales = scales_of(tensors)
            merged = apply_patches(tensors, patches, target=kind, scales=scales or None, only=want)
            tensors = _patched_gguf_in_storage(tensors, merged, rule, dtype)
        return tensors

    # -- internals -----------------------------------------------------------------------------

    def _get(self, key: tuple) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: tuple, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._evict(keep=key)

    def _evict(self, keep: tuple | None = None) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        bound = self.budget_bytes
        for k in list(self._entries):
            if total <= bound:
                break
            if k == keep:
                continue
            total -= self._entries.pop(k).nbytes
            self.stats.evictions += 1
        self.stats.bytes = total

    @staticmethod
    def _rules(p: MergePatch, rule, keep_scaled) -> tuple:
        """(rule, None, keep_scaled) for a merge's other model: its own class's when it names
        one, else the patched model's."""
        if p.build is None:
            return rule, None, keep_scaled
        meta = _build_meta(p.build, p.config)
        return dtype_rule(meta), None, keep_scaled_rule(meta)

    def _derive(self, kind, source, config, dtype, rule):
        """Convert an exact cached copy of the same source (another dtype) without disk I/O."""
        stored = None
        for (k_kind, k_ident, k_cfg, k_dtype, k_patches), entry in reversed(self._entries.items()):
            if k_patches or k_ident != source.identity or k_kind != kind or k_cfg != config or not entry.exact:
                continue
            if stored is None:
                stored = source_dtypes(source)
            if not stored <= _EXACT.get(k_dtype, {k_dtype}):
                continue
            out = {}
            for name, t in entry.tensors.items():
                target = rule(name, dtype)
                out[name] = t.to(target) if t.is_floating_point() and target is not None else t
            self.stats.derived += 1
            return out, stored <= _EXACT.get(dtype, {dtype})
        return None, False

    def _read(self, source, dtype, rule, rename, keep_scaled=None):
        post = None
        if rename is None:
            rename, post = reader_for_source(source)
        if post is not None:  # a conversion beyond renaming (fused q/k/v, ...) sees plain weights
            keep_scaled = None
        tensors = read_source(source, lambda k: rule(k, dtype), rename, keep_scaled)
        if post is not None:
            tensors = post(tensors)
        stored = source_dtypes(source)
        self.stats.loads += 1
        self.stats.bytes_read += nbytes(tensors)
        ident = source.identity
        self.stats.reads_by_source[ident] = self.stats.reads_by_source.get(ident, 0) + 1
        # dequantised values are no file values; a GGUF entry holds quantised weights (never derived)
        quantised = quantization(source) is not None or (source.path is not None and is_gguf(source.path))
        return tensors, not quantised and stored <= _EXACT.get(dtype, {dtype})


def _unit_ranges(source: WeightSource, rename, prefix: str) -> tuple[tuple[int, int], ...]:
    """The file byte ranges holding the unit ``prefix``'s tensors (the stored keys whose module
    key starts with it, and the other tensors of their layers: a scaled fp8 weight's scales);
    empty where the source is no safetensors file (``safetensors_io.byte_ranges``)."""
    if source.path is None or source.path.lower().endswith(PICKLE_SUFFIXES) or is_gguf(source.path):
        return ()
    if rename is None:
        rename, _post = reader_for_source(source)
    stored = [k[len(source.prefix):] for k in inspect_file(source.path) if k.startswith(source.prefix)]
    mine = {k for k in stored if (new := rename(k) if rename is not None else k) is not None
            and new.startswith(prefix)}
    layers = {k.rpartition(".")[0] for k in mine}
    return byte_ranges(source, lambda k: k in mine or k.rpartition(".")[0] in layers)


def _quantised_sizes(source: WeightSource, rename) -> dict[str, int] | None:
    """Module key -> bytes held, for the weights a source keeps quantised (a GGUF file's blocks,
    an int8 file's layers: ``safetensors_io.held_quantised``); None where it has none."""
    held = held_quantised(source)
    if not held:
        return None
    if rename is None:
        rename, _post = reader_for_source(source)
    out = {}
    for k, (held_bytes, _n) in held.items():
        new = rename(k) if rename is not None else k
        if new is not None:
            out[new] = held_bytes
    return out


STORE = WeightStore()


def materialize(kind, source, config, storage_dtype, patches=(), build=None, rename=None,
                stream: bool | None = None) -> nn.Module:
    """``STORE.materialize``: see the module docstring."""
    return STORE.materialize(kind, source, config, storage_dtype, patches, build, rename, stream)


def clear() -> None:
    STORE.clear()


def configure(budget_bytes: int | None) -> None:
    STORE.configure(budget_bytes)


def stats() -> StoreStats:
    return STORE.stats


def held() -> list[tuple[str, torch.dtype]]:
    return STORE.held()
