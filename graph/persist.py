"""The persistent output cache: node outputs on disk, shared by processes (DESIGN §5, §10).

    disk = DiskCache("/var/cache/mixgraph-outputs", max_bytes=20 * 2**30)
    executor = Executor(registry, env, TieredCache(make_cache(), disk))

Two levels. The in-memory cache (`graph.cache`, any mode) is the first; `DiskCache` is the
second: a memory miss that is on disk is loaded into memory, and every executed result is written
through. It survives restarts, and several processes (workers) may use one directory at once.

What is stored: results whose node has a structural key (non-deterministic nodes have none), whose
declared output types the codec calls storable (`graph.codec`: the node layer declares
CONDITIONING, LATENT, IMAGE, MASK), which the codec can encode exactly (no model handle, no
ControlNet chain, no blocker) and which carry no UI (output nodes re-run, so their files and
`executed` events are made again). The key is the content part of the structural key
(`graph.cache.persisted_key`): it holds the resolved precision and the size and content hash of
every file a node read, not where the file lies, so a copy of a checkpoint in another models
folder or on another machine finds the results made from the original.

Layout of the directory:

    index.sqlite3        WAL; entries(key, file, nbytes, digest, meta, created, used), totals
    blobs/ab/<key hex>.<unique>.safetensors   one blob per entry: tensors + the JSON tree
    tmp/                 blobs being written

Concurrency: a blob is written under tmp/, then renamed into blobs/ (atomic), then its row is
inserted in a transaction; a reader that sees the row sees the whole blob. Every write gets a
file name of its own, so an eviction or a replacement deletes exactly the file of the row it
removed, never a newer one. The row holds a BLAKE2b digest of the blob: a blob that is missing,
truncated, altered or of another format is a miss (its row is dropped), never an error. Eviction
is LRU by the `used` time (set on every hit, in memory or on disk) under the byte budget, inside
the write transaction; files are unlinked after it commits. Orphans (a process that died between
rename and insert) are swept when a `DiskCache` opens. Errors of the disk or the database are
logged and counted; a prompt never fails because of this cache.

Placement: SQLite's WAL needs every process on one machine, so workers share a directory on a
local disk; each machine of a cluster has its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from mixgraph.graph.cache import CacheEntry, OutputCache, persisted_key
from mixgraph.graph.codec import CODEC, FORMAT, TreeCodec, Undecodable, Unencodable
from mixgraph.graph.plan import walk

__all__ = ["DiskCache", "TieredCache", "DEFAULT_BYTES", "SCHEMA"]

log = logging.getLogger("mixgraph")

DEFAULT_BYTES = 10 * 2**30
SCHEMA = 1
#: A blob file or temp file this old with no row is an orphan (a writer died mid-put).
ORPHAN_SECONDS = 3600.0
_META_KEYS = ("precision", "nan_fallback", "list", "types")

_DDL = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY, file TEXT NOT NULL, nbytes INTEGER NOT NULL, digest TEXT NOT NULL,
    meta TEXT NOT NULL, created REAL NOT NULL, used REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_used ON entries(used);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL, entries INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0);
CREATE TRIGGER IF NOT EXISTS entries_add AFTER INSERT ON entries BEGIN
    UPDATE totals SET bytes = bytes + NEW.nbytes, entries = entries + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS entries_drop AFTER DELETE ON entries BEGIN
    UPDATE totals SET bytes = bytes - OLD.nbytes, entries = entries - 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS entries_size AFTER UPDATE OF nbytes ON entries BEGIN
    UPDATE totals SET bytes = bytes - OLD.nbytes + NEW.nbytes WHERE id = 0; END;
"""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _header(data: bytes) -> dict:
    """The safetensors header of a blob in memory (8-byte little-endian length, then JSON)."""
    if len(data) < 8:
        raise Undecodable("blob shorter than its header")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise Undecodable("blob truncated")
    try:
        return json.loads(data[8:8 + n])
    except ValueError:
        raise Undecodable("blob header is not JSON") from None


class DiskCache:
    """The second level: node outputs in a directory, bounded by `max_bytes` of blobs, LRU.

    Safe for several threads (one connection behind a lock) and several processes (SQLite
    transactions, atomic renames). `get` returns a `graph.cache.CacheEntry` or None; `put`
    returns whether the result was stored."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_BYTES,
                 codec: TreeCodec = CODEC, sweep: bool = True):
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        if self.max_bytes <= 0:
            raise ValueError(f"output cache {self.directory}: the byte budget must be above 0")
        self.codec = codec
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(("hits", "misses", "writes", "refused", "too_big", "corrupt",
                                     "evictions", "errors", "bytes_read", "bytes_written",
                                     "read_seconds", "write_seconds"), 0)
        self._warned: set[str] = set()
        try:
            (self.directory / "blobs").mkdir(parents=True, exist_ok=True)
            (self.directory / "tmp").mkdir(exist_ok=True)
            self._db = sqlite3.connect(self.directory / "index.sqlite3", timeout=60.0,
                                       isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA):
                raise ValueError(f"its index has schema {version}; this mixgraph reads {SCHEMA} "
                                 f"(use another directory or empty this one)")
            self._db.executescript(_DDL)     # idempotent statements: safe from two processes
            self._db.execute(f"PRAGMA user_version = {SCHEMA}")
        except (OSError, sqlite3.Error) as e:
            raise ValueError(f"output cache {self.directory}: cannot use it ({e})") from e
        if sweep:
            self.sweep()

    # --- reading ---------------------------------------------------------------------------

    def contains(self, keys: Iterable[bytes]) -> set[bytes]:
        """The keys that have a row (the blobs are not read)."""
        given = [k for k in dict.fromkeys(keys) if k is not None]
        keys = list(dict.fromkeys(persisted_key(k) for k in given))
        found: set[bytes] = set()
        try:
            with self._lock:
                for i in range(0, len(keys), 500):
                    chunk = keys[i:i + 500]
                    rows = self._db.execute(
                        f"SELECT key FROM entries WHERE key IN ({','.join('?' * len(chunk))})",
                        chunk).fetchall()
                    found.update(bytes(r[0]) for r in rows)
        except sqlite3.Error as e:
            self._error("lookup", e)
        return {k for k in given if persisted_key(k) in found}

    def get(self, key: bytes | None) -> CacheEntry | None:
        """The stored result for `key` (its row marked used now), or None: absent, or its blob
        missing or damaged (then the row is dropped)."""
        if key is None:
            return None
        key = persisted_key(key)
        t0 = time.perf_counter()
        try:
            return self._get(key)
        finally:
            self.counts["read_seconds"] += time.perf_counter() - t0

    def _get(self, key: bytes) -> CacheEntry | None:
        try:
            with self._lock:
                row = self._db.execute("SELECT file, digest, meta FROM entries WHERE key = ?",
                                       (key,)).fetchone()
        except sqlite3.Error as e:
            self._error("lookup", e)
            return None
        if row is None:
            self.counts["misses"] += 1
            return None
        file, digest, meta = row
        path = self.directory / "blobs" / file
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._drop(key, file, "missing")
            return None
        except OSError as e:
            self._error("read", e)
            return None
        try:
            if _digest(data) != digest:
                raise Undecodable("digest mismatch")
            info = _header(data).get("__metadata__") or {}
            if info.get("format") != FORMAT:
                raise Undecodable(f"format {info.get('format')!r}")
            outputs = self.codec.decode(st_load(data), info["tree"])
            meta = json.loads(meta)
        except Exception as e:  # noqa: BLE001 - whatever is wrong with a blob, it is a miss
            log.debug("output cache: blob %s unusable: %s", file, e)
            self._drop(key, file, "corrupt")
            return None
        if type(outputs) is not tuple:
            self._drop(key, file, "corrupt")
            return None
        self.counts["hits"] += 1
        self.counts["bytes_read"] += len(data)
        self.touch([key])
        return CacheEntry(outputs, None, meta if type(meta) is dict else {})

    def touch(self, keys: Iterable[bytes]) -> None:
        """Mark entries most recently used (hits served from memory count too)."""
        keys = [persisted_key(k) for k in keys if k is not None]
        if not keys:
            return
        now = time.time()
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany("UPDATE entries SET used = ? WHERE key = ?",
                                         [(now, k) for k in keys])
                finally:
                    self._db.execute("COMMIT")
        except sqlite3.Error as e:
            self._error("touch", e)

    # --- writing ---------------------------------------------------------------------------

    def put(self, key: bytes | None, outputs: tuple, meta: dict | None = None,
            types: Iterable[str] = ()) -> bool:
        """Store a node's outputs under its key when its output `types` are storable and the
        codec can encode them; evicts least recently used entries beyond the budget."""
        if key is None or not self.codec.storable(types):
            return False
        t0 = time.perf_counter()
        try:
            return self._put(persisted_key(key), outputs, meta)
        finally:
            self.counts["write_seconds"] += time.perf_counter() - t0

    def _put(self, key: bytes, outputs: tuple, meta: dict | None) -> bool:
        try:
            tensors, tree = self.codec.encode(tuple(outputs))
        except Unencodable as e:
            self.counts["refused"] += 1
            log.debug("output cache: not stored: %s", e)
            return False
        data = st_save(tensors, metadata={"format": FORMAT, "tree": tree})
        if len(data) > self.max_bytes:
            self.counts["too_big"] += 1
            return False
        hexkey = key.hex()
        file = f"{hexkey[:2]}/{hexkey}.{uuid.uuid4().hex[:12]}.safetensors"
        path = self.directory / "blobs" / file
        tmp = self.directory / "tmp" / f"{hexkey}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.write_bytes(data)
            path.parent.mkdir(exist_ok=True)
            os.replace(tmp, path)
        except OSError as e:
            self._error("write", e)
            _unlink(tmp)
            return False
        record = json.dumps({k: (list(v) if isinstance(v, tuple) else v)
                             for k, v in (meta or {}).items() if k in _META_KEYS})
        now = time.time()
        gone: list[str] = []
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    old = self._db.execute("SELECT file FROM entries WHERE key = ?",
                                           (key,)).fetchone()
                    self._db.execute(
                        "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO "
                        "UPDATE SET file = excluded.file, nbytes = excluded.nbytes, digest = "
                        "excluded.digest, meta = excluded.meta, used = excluded.used",
                        (key, file, len(data), _digest(data), record, now, now))
                    if old is not None and old[0] != file:
                        gone.append(old[0])
                    gone += self._evict(key)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except sqlite3.Error as e:
            self._error("index", e)
            _unlink(path)
            return False
        for f in gone:
            _unlink(self.directory / "blobs" / f)
        self.counts["writes"] += 1
        self.counts["bytes_written"] += len(data)
        return True

    def _evict(self, keep: bytes | None) -> list[str]:
        """Rows beyond the budget, least recently used first (inside a write transaction)."""
        gone: list[str] = []
        while True:
            total = self._db.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0]
            if total <= self.max_bytes:
                return gone
            rows = self._db.execute("SELECT key, file, nbytes FROM entries WHERE key != ? "
                                    "ORDER BY used LIMIT 64", (keep or b"",)).fetchall()
            if not rows:
                return gone
            for k, f, n in rows:
                self._db.execute("DELETE FROM entries WHERE key = ?", (k,))
                gone.append(f)
                self.counts["evictions"] += 1
                total -= n
                if total <= self.max_bytes:
                    return gone

    def _drop(self, key: bytes, file: str, why: str) -> None:
        """Forget a row whose blob is unusable (only if it still names that blob)."""
        self.counts["corrupt" if why == "corrupt" else "misses"] += 1
        try:
            with self._lock:
                cur = self._db.execute("DELETE FROM entries WHERE key = ? AND file = ?",
                                       (key, file))
            if cur.rowcount:
                _unlink(self.directory / "blobs" / file)
        except sqlite3.Error as e:
            self._error("index", e)

    # --- housekeeping ----------------------------------------------------------------------

    def sweep(self, older_than: float = ORPHAN_SECONDS) -> int:
        """Delete blob and temp files no row names, older than `older_than` seconds (a process
        that died mid-put). Returns how many."""
        cutoff = time.time() - older_than
        try:
            with self._lock:
                named = {r[0] for r in self._db.execute("SELECT file FROM entries")}
        except sqlite3.Error as e:
            self._error("sweep", e)
            return 0
        removed = 0
        blobs = self.directory / "blobs"
        candidates = [p for p in blobs.glob("*/*") if p.relative_to(blobs).as_posix() not in named]
        candidates += list((self.directory / "tmp").iterdir())
        for p in candidates:
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed += 1
            except OSError:
                pass
        return removed

    def clear(self) -> None:
        """Remove every entry (and its blob)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            files = [r[0] for r in self._db.execute("SELECT file FROM entries")]
            self._db.execute("DELETE FROM entries")
            self._db.execute("COMMIT")
        for f in files:
            _unlink(self.directory / "blobs" / f)

    def totals(self) -> tuple[int, int]:
        """(bytes, entries) stored now, by every process."""
        with self._lock:
            row = self._db.execute("SELECT bytes, entries FROM totals WHERE id = 0").fetchone()
        return int(row[0]), int(row[1])

    def stats(self) -> dict[str, Any]:
        try:
            nbytes, entries = self.totals()
        except sqlite3.Error:
            nbytes = entries = -1
        return {"directory": str(self.directory), "entries": entries, "bytes": nbytes,
                "max_bytes": self.max_bytes, **self.counts}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _error(self, what: str, e: Exception) -> None:
        self.counts["errors"] += 1
        if what not in self._warned:
            self._warned.add(what)
            log.warning("output cache %s: %s failed (%s); going on without it", self.directory,
                        what, e)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class TieredCache:
    """An in-memory cache (first level, any `graph.cache` mode) in front of a `DiskCache`.

    The executor uses it like any output cache. `lookup` checks the disk index for what memory
    lacks, plans with those hits, and loads only the disk hits the run reaches (the frontier of
    what it must execute); a blob that turns out unusable is a miss and the plan is made again.
    `put` writes through to disk (`meta["types"]` are the node's declared output types).
    `clear()` empties memory only (ComfyUI's /free); `disk.clear()` empties the directory."""

    def __init__(self, memory: OutputCache, disk: DiskCache):
        self.memory = memory
        self.disk = disk

    def lookup(self, keys: dict[Any, bytes | None], roots: Iterable[str],
               upstream: Callable[[str], Iterable[str]]) -> tuple[dict, dict]:
        roots = list(roots)
        hits = self.memory.get_many(keys)
        self.disk.touch({keys[n] for n in hits})
        rest = {n: k for n, k in keys.items() if k is not None and n not in hits}
        stored = self.disk.contains(rest.values())
        on_disk = {n for n, k in rest.items() if k in stored}
        loaded: dict[bytes, CacheEntry | None] = {}
        while True:
            needed = walk(roots, upstream, hits.keys() | on_disk)
            reached = [n for n in needed if n in on_disk]
            if not reached:
                return hits, needed
            failed = False
            for n in reached:
                on_disk.discard(n)
                key = keys[n]
                if key not in loaded:
                    loaded[key] = self._load(key)
                entry = loaded[key]
                if entry is None:
                    failed = True
                else:
                    hits[n] = entry
            if not failed:
                return hits, needed

    def _load(self, key: bytes) -> CacheEntry | None:
        entry = self.disk.get(key)
        if entry is not None:
            self.memory.put(key, entry.outputs, None, entry.meta)
        return entry

    def get(self, key: bytes | None) -> CacheEntry | None:
        entry = self.memory.get(key)
        return entry if entry is not None else (None if key is None else self._load(key))

    def get_many(self, keys: dict[Any, bytes | None]) -> dict[Any, CacheEntry]:
        found = self.memory.get_many(keys)
        self.disk.touch({keys[n] for n in found})
        rest = {n: k for n, k in keys.items() if k is not None and n not in found}
        stored = self.disk.contains(rest.values())
        loaded: dict[bytes, CacheEntry | None] = {}
        for n, k in rest.items():
            if k in stored:
                if k not in loaded:
                    loaded[k] = self._load(k)
                if loaded[k] is not None:
                    found[n] = loaded[k]
        return found

    def put(self, key: bytes, outputs: tuple, ui: dict | None = None,
            meta: dict[str, Any] | None = None) -> bool:
        kept = self.memory.put(key, outputs, ui, meta)
        if not ui:
            self.disk.put(key, outputs, meta, (meta or {}).get("types", ()))
        return kept

    def peek(self, key: bytes | None) -> CacheEntry | None:
        return self.memory.peek(key)

    def __contains__(self, key: object) -> bool:
        return key in self.memory

    def __len__(self) -> int:
        return len(self.memory)

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    @property
    def max_bytes(self) -> int:
        return self.memory.max_bytes

    def clear(self) -> None:
        self.memory.clear()

    def stats(self) -> dict[str, Any]:
        return {**self.memory.stats(), "disk": self.disk.stats()}
