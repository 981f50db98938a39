"""Structural cache keys and the output cache (DESIGN §5).

A node's key is a BLAKE2b digest of: class type, node version, its literal inputs in canonical
JSON (floats by repr; tensors are never hashed), for each linked input the upstream node's key and
output slot, its resolved precision, and its fingerprint of external state (files). Node ids are
not part of it, so an identical subgraph under other ids hits the cache. A node with no key (non
deterministic, or a literal that has no canonical form) is never cached, and neither is anything
downstream of it. Keys are fixed-size digests, so computing one is O(inputs), never O(ancestors).

Two keys in one. A file fingerprint (`graph.fingerprint.FileFingerprint`) names where the file
is (path, mtime) and what it holds (size, content hash). The in-memory cache keeps results that
point at the file (a model handle reads its path later), so its key holds all of it; a result
written to the persistent cache (`graph.persist`) is plain data and must be found again from a
copy of the file in another models folder or on another machine, so its key holds only the
content. A node whose fingerprint holds files, or with an upstream key that is two-part, has a
32-byte key: the in-memory key (16 bytes, over everything) followed by the content key (16
bytes, over the content-only fingerprint and the upstream content keys); every other key is 16
bytes and is both. `persisted_key(key)` is the content part: the last 16 bytes.

`OutputCache` is an LRU over prompts bounded by bytes: its size estimate walks outputs for
tensors (through dataclasses, tuples, lists, dicts, nn.Modules), and objects may say their own size
with `__mixgraph_nbytes__()`. ComfyUI's caches count entries, not bytes, and its default mode
drops everything the current prompt does not use; this one keeps what fits.

ComfyUI's other cache modes are subclasses with the same interface, chosen by `make_cache` (the
`--cache-lru N`, `--cache-none` and `--cache-ram GB` flags): `LruCountCache` keeps at most N node
results, `NoCache` keeps nothing between prompts, `RamPressureCache` keeps what it can while the
machine has GB of RAM available. Keys are the same in every mode, so results are too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch

from mixgraph.graph.fingerprint import content_only
from mixgraph.graph.plan import walk

__all__ = ["structural_key", "key_header", "node_key", "persisted_key", "canonical_literals", "walk_tensors",
           "estimate_nbytes", "CacheEntry", "OutputCache", "LruCountCache", "NoCache",
           "RamPressureCache", "make_cache", "available_ram", "default_budget", "BUDGET_SHARE"]

_blake2b = hashlib.blake2b
_SCALARS = (int, float, str, bool, type(None), bytes)
ENTRY_OVERHEAD = 256  # bytes charged per entry for the Python objects around the tensors


class NotCanonical(TypeError):
    """A literal with no canonical form: the node is not cached."""


def _canon_default(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        raise NotCanonical("tensors are never hashed into cache keys")
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=repr)
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {"__type__": type(o).__qualname__,
                **{f.name: getattr(o, f.name) for f in dataclasses.fields(o)}}
    raise NotCanonical(f"no canonical form for {type(o).__qualname__}")


_json_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_canon_default,
                                ensure_ascii=False, check_circular=False).encode


def _make_dumps():
    """`_json_encode`, with the C encoder built once instead of on every call (half the cost of
    a small dict); the same text (floats by repr, sorted keys, no ASCII escaping)."""
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    c_basestring = getattr(json.encoder, "c_encode_basestring", None)
    if c_make_encoder is None or c_basestring is None:
        return _json_encode
    encoder = c_make_encoder(None, _canon_default, c_basestring, None, ":", ",", True, False, True)
    join = "".join

    def dumps(o: Any) -> str:
        return join(encoder(o, 0))

    return dumps


canonical_dumps = _make_dumps()


def canonical_literals(literals: dict[str, Any]) -> str:
    """Canonical JSON of literal inputs (sorted keys; floats by repr; 1, 1.0 and True differ)."""
    return canonical_dumps(literals)


def structural_key(class_type: str, version: Any, literals: dict[str, Any],
                   links: list[tuple[str, bytes, int]], precision: str = "",
                   external: Any = None) -> bytes | None:
    """The 16-byte key of one node call, or None when it cannot be cached.

    `links` are (input name, upstream key, output slot) in any order.
    """
    return node_key(key_header(class_type, version), literals, links, precision, external)


def key_header(class_type: str, version: Any) -> str:
    """The part of a key that depends on the node type only (the executor keeps one per type)."""
    return f"{class_type}\x1f{version}\x1f"


def node_key(header: str, literals: dict[str, Any] | None,
             links: list[tuple[str, bytes, int]] | None, precision: str = "",
             external: Any = None) -> bytes | None:
    """`structural_key` with the type's `key_header` already made: the executor's hot path."""
    portable = external
    if external is not None:
        portable = content_only(external)
        if portable is not external:
            return _two_part_key(header, literals, links, precision, external, portable)
    if links:
        for link in links:
            if len(link[1]) > 16:
                return _two_part_key(header, literals, links, precision, external, portable)
    return _one_key(header, literals, links, precision, external)


def _one_key(header: str, literals: dict[str, Any] | None,
             links: list[tuple[str, bytes, int]] | None, precision: str,
             external: Any) -> bytes | None:
    """One 16-byte digest of a node call (upstream keys as given)."""
    if literals:
        try:
            lit = canonical_dumps(literals)
        except (TypeError, ValueError):  # NotCanonical, unsortable keys
            return None
        head = f"{header}{lit}\x1f{precision}\x1f{external!r}".encode()
    elif precision or external is not None:
        head = f"{header}{{}}\x1f{precision}\x1f{external!r}".encode()
    else:  # links only (most nodes of a big graph): the same bytes, made once per type
        head = _bare_heads.get(header)
        if head is None:
            head = f"{header}{{}}\x1f\x1fNone".encode()
            if len(_bare_heads) < 4096:
                _bare_heads[header] = head
    if not links:
        return _blake2b(head, digest_size=16).digest()
    if len(links) > 1:
        links = sorted(links)
    parts = [head]
    for name, key, slot in links:
        parts += (_link_prefix(name), key,
                  _SLOTS[slot] if 0 <= slot < 64 else slot.to_bytes(4, "little"))
    return _blake2b(b"".join(parts), digest_size=16).digest()


def _two_part_key(header: str, literals: dict[str, Any] | None,
                  links: list[tuple[str, bytes, int]] | None, precision: str, external: Any,
                  portable: Any) -> bytes | None:
    """The in-memory key (upstream keys whole, the full fingerprint) + the content key
    (upstream content keys, the content-only fingerprint): see the module docstring."""
    links = links or []
    memory = _one_key(header, literals, links, precision, external)
    if memory is None:
        return None
    content = _one_key(header, literals, [(n, k[-16:], slot) for n, k, slot in links],
                       precision, portable)
    return memory + content


def persisted_key(key: bytes) -> bytes:
    """The part of a key that names content only (a 16-byte key is its own): what the
    persistent output cache stores results under."""
    return key[-16:]


_bare_heads: dict[str, bytes] = {}
_SLOTS = tuple(i.to_bytes(4, "little") for i in range(64))
_prefixes: dict[str, bytes] = {}


def _link_prefix(name: str) -> bytes:
    p = _prefixes.get(name)
    if p is None:
        p = b"\x1e" + name.encode() + b"\x1f"
        if len(_prefixes) < 4096:   # input names are few; never let odd ones grow it unbounded
            _prefixes[name] = p
    return p


# --- walking outputs ----------------------------------------------------------------------------

_fields_of: dict[type, tuple[str, ...]] = {}


def _children(o: Any) -> Any:
    t = type(o)
    if t is tuple or t is list or isinstance(o, (tuple, list)):
        return o
    if isinstance(o, dict):
        return o.values()
    if isinstance(o, torch.nn.Module):
        return [*o.parameters(), *o.buffers()]
    names = _fields_of.get(t)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(o)) if dataclasses.is_dataclass(o) else ()
        _fields_of[t] = names
    return [getattr(o, n, None) for n in names]


def walk_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor reachable through tuples, lists, dicts, dataclasses and modules (iterative)."""
    stack = [obj]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        if isinstance(o, _SCALARS):
            continue
        if isinstance(o, torch.Tensor):
            yield o
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        stack.extend(_children(o))


def estimate_nbytes(obj: Any) -> int:
    """Bytes held by the tensors in `obj` (shared storages counted once)."""
    if isinstance(obj, _SCALARS) or (type(obj) is tuple and all(isinstance(x, _SCALARS) for x in obj)):
        return 0
    total = 0
    storages: set[int] = set()
    stack = [obj]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        if isinstance(o, _SCALARS):
            continue
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                ptr = st.data_ptr()
                if ptr not in storages:
                    storages.add(ptr)
                    total += st.nbytes()
            except (RuntimeError, NotImplementedError):  # meta / exotic tensors
                total += o.numel() * o.element_size()
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        own = getattr(o, "__mixgraph_nbytes__", None)
        if own is not None and not isinstance(o, type):
            total += int(own())
            continue
        stack.extend(_children(o))
    return total


# --- the cache ----------------------------------------------------------------------------------

#: the share of the memory budget the default output cache may hold (the rest: weights, activations)
BUDGET_SHARE = 0.25


def default_budget(fraction: float = BUDGET_SHARE, memory_bytes: int | None = None) -> int:
    """The default output cache's byte bound: `$MIXGRAPH_CACHE_BYTES` when set, else `fraction`
    of `memory_bytes` (the process's memory budget, which the cache counts against: ui/ passes
    it in, graph/ does not know the budget), else of physical RAM."""
    env = os.environ.get("MIXGRAPH_CACHE_BYTES")
    if env:
        return int(float(env))
    if memory_bytes is not None:
        return int(memory_bytes * fraction)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 8 * 2**30
    return int(ram * fraction)


@dataclass
class CacheEntry:
    outputs: tuple
    ui: dict | None = None
    meta: dict[str, Any] = field(default_factory=dict)   # precision, nan_fallback, class_type
    nbytes: int = 0


class OutputCache:
    """LRU of node outputs across prompts, bounded by an estimated byte budget. Thread-safe."""

    #: True when `max_bytes` is `BUDGET_SHARE` of the memory budget `make_cache` was given: that
    #: share of the budget is then this cache's, and ui/ tells the budget's other users so
    budget_share: bool = False

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = default_budget() if max_bytes is None else int(max_bytes)
        self._entries: OrderedDict[bytes, CacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.misses = self.evictions = self.rejected = 0

    def get(self, key: bytes | None) -> CacheEntry | None:
        """The entry for `key` (marked most recently used), or None."""
        if key is None:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def get_many(self, keys: dict[Any, bytes | None]) -> dict[Any, CacheEntry]:
        """`{name: entry}` for the names whose key is cached (each marked most recently used),
        under one lock: the executor looks up a whole prompt at once."""
        found: dict[Any, CacheEntry] = {}
        entries = self._entries
        with self._lock:
            get, touch = entries.get, entries.move_to_end
            for name, key in keys.items():
                if key is None:
                    continue
                entry = get(key)
                if entry is not None:
                    touch(key)
                    found[name] = entry
            self.hits += len(found)
            self.misses += sum(1 for k in keys.values() if k is not None) - len(found)
        return found

    def lookup(self, keys: dict[Any, bytes | None], roots: Iterable[str],
               upstream: Callable[[str], Iterable[str]]) -> tuple[dict, dict]:
        """The hits among `keys` ({name: entry}) and the nodes `roots` need: walked back along
        `upstream`, stopping at hits. A second level (`graph.persist.TieredCache`) overrides
        it to load only the stored results the run reaches."""
        hits = self.get_many(keys)
        return hits, walk(roots, upstream, hits)

    def peek(self, key: bytes | None) -> CacheEntry | None:
        return None if key is None else self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: bytes, outputs: tuple, ui: dict | None = None,
            meta: dict[str, Any] | None = None) -> bool:
        """Store outputs; False when the entry alone is bigger than the budget (not kept)."""
        nbytes = estimate_nbytes(outputs) + ENTRY_OVERHEAD
        entry = CacheEntry(outputs, ui, meta or {}, nbytes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            if nbytes > self.max_bytes:
                self.rejected += 1
                return False
            self._entries[key] = entry
            self.nbytes += nbytes
            while self._entries and self._over():
                _, victim = self._entries.popitem(last=False)
                self.nbytes -= victim.nbytes
                self.evictions += 1
        return True

    def _over(self) -> bool:
        """Whether to evict the least recently used entry (called under the lock)."""
        return self.nbytes > self.max_bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "rejected": self.rejected}


class LruCountCache(OutputCache):
    """`--cache-lru N`: at most `max_entries` node results, least recently used out first
    (ComfyUI counts results, not bytes; `max_bytes` still bounds it when given)."""

    def __init__(self, max_entries: int, max_bytes: int | None = None):
        if int(max_entries) < 0:
            raise ValueError(f"--cache-lru needs a count of 0 or more, not {max_entries}")
        super().__init__(2**62 if max_bytes is None else max_bytes)
        self.max_entries = int(max_entries)

    def _over(self) -> bool:
        return len(self._entries) > self.max_entries or self.nbytes > self.max_bytes

    def stats(self) -> dict[str, int]:
        return {**super().stats(), "max_entries": self.max_entries}


class NoCache(OutputCache):
    """`--cache-none`: nothing is kept between prompts (a run still holds its own values)."""

    def __init__(self) -> None:
        super().__init__(0)

    def put(self, key: bytes, outputs: tuple, ui: dict | None = None,
            meta: dict[str, Any] | None = None) -> bool:
        return False


def available_ram() -> int:
    """Bytes of RAM available to new allocations (Linux MemAvailable; else free pages)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**62


class RamPressureCache(OutputCache):
    """`--cache-ram GB`: keeps results while the machine has more than `headroom` bytes of RAM
    available; below it, evicts least recently used results until it is back above (or empty).
    `available` (bytes available now) is `available_ram` unless given; it is asked at most every
    `poll_seconds`, and always after storing a result of 16 MiB or more."""

    def __init__(self, headroom: int, available: Any = None, poll_seconds: float = 0.1,
                 max_bytes: int | None = None):
        super().__init__(2**62 if max_bytes is None else max_bytes)
        self.headroom = int(headroom)
        self.available = available or available_ram
        self.poll_seconds = poll_seconds
        self._polled = float("-inf")
        self._ask = False

    def put(self, key: bytes, outputs: tuple, ui: dict | None = None,
            meta: dict[str, Any] | None = None) -> bool:
        now = time.monotonic()
        if self.poll_seconds <= 0 or now - self._polled >= self.poll_seconds or \
                estimate_nbytes(outputs) >= 16 * 2**20:
            self._polled = now
            self._ask = True      # ask again after each eviction, under the lock
        return super().put(key, outputs, ui, meta)

    def _over(self) -> bool:
        if self.nbytes > self.max_bytes:
            return True
        if not self._ask:
            return False
        if self.available() < self.headroom:
            return True
        self._ask = False
        return False

    def stats(self) -> dict[str, int]:
        return {**super().stats(), "headroom": self.headroom}


def make_cache(*, lru: int | None = None, none: bool = False, ram: float | None = None,
               max_bytes: int | None = None, memory_bytes: int | None = None) -> OutputCache:
    """The cache for ComfyUI's flags: `--cache-lru N`, `--cache-none`, `--cache-ram GB`; none of
    them gives the default (`OutputCache`, an LRU by bytes kept across prompts). At most one.
    `--cache-lru 0` is ComfyUI's default value of the flag ("LRU off"): the default cache.
    `memory_bytes`: the memory budget the default cache's bound is a share of
    (`default_budget`); `max_bytes` or `$MIXGRAPH_CACHE_BYTES` win over it, and the other modes
    keep their own bounds."""
    if lru is not None and int(lru) == 0:
        lru = None
    chosen = [name for name, on in (("--cache-lru", lru is not None), ("--cache-none", none),
                                    ("--cache-ram", ram is not None)) if on]
    if len(chosen) > 1:
        raise ValueError(f"choose one cache mode, not {' and '.join(chosen)}")
    if lru is not None:
        return LruCountCache(lru, max_bytes)
    if none:
        return NoCache()
    if ram is not None:
        if not ram >= 0:
            raise ValueError(f"--cache-ram needs a number of GB of 0 or more, not {ram}")
        return RamPressureCache(int(ram * 2**30), max_bytes=max_bytes)
    if max_bytes is None and memory_bytes is not None:
        cache = OutputCache(default_budget(memory_bytes=memory_bytes))
        cache.budget_share = not os.environ.get("MIXGRAPH_CACHE_BYTES")
        return cache
    return OutputCache(max_bytes)
