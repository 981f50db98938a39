"""File fingerprints: the external state a node's cache key depends on (DESIGN §5).

A fingerprint is (path, size, mtime_ns, content hash). The hash is computed once per
(path, size, mtime_ns, inode) and remembered in-process, and for big files also in a small JSON
file under the user cache directory, so a 7 GB checkpoint is read once, not on every prompt.
Replacing a file under the same name changes its size, mtime or inode, hence its fingerprint,
hence the keys of everything that depends on it.

The hash is SHA-256 of the whole file (hashlib, streamed by `hashlib.file_digest`): any content
change shows, and it is the hash model hubs publish for their files. Measured on a 2 GB file (one
shared CPU core): SHA-256 ~0.9-1.1 GB/s (CPU SHA extensions), BLAKE2b ~0.4 GB/s, so a full hash of
a 7 GB checkpoint is seconds, once per file version thanks to the memo. A sampled hash (header and
a few slices) would be instant but would miss a fine-tune that changes bytes between the samples,
and the digest decides cache hits (DESIGN §5) and worker affinity (ui/ray/ray_pool.py), so it is the
whole file. It never decides anything security-related.

`content_only(fingerprint)` keeps what a fingerprint says about the bytes (size and hash, as
`FileContent`): the persisted cache keys use it (graph/cache.py), so a copy of a file in another
folder or on another machine gives the same key.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FileFingerprint", "FileContent", "Fingerprinter", "FINGERPRINTS", "fingerprint_file",
           "default_cache_file", "content_only"]

#: Files at least this big get their hash remembered on disk as well.
DISK_CACHE_MIN_BYTES = 16 * 2**20
_DISK_CACHE_MAX_ENTRIES = 4096


@dataclass(frozen=True)
class FileFingerprint:
    path: str
    size: int
    mtime_ns: int
    digest: str


@dataclass(frozen=True)
class FileContent:
    """What a FileFingerprint says about the bytes alone (no path, no time): the part of a
    fingerprint that a persisted cache key holds, so a copy of the file elsewhere matches."""

    size: int
    digest: str


def content_only(value: Any) -> Any:
    """`value` (a node's fingerprint: a FileFingerprint, or tuples, lists and dicts holding
    some) with each FileFingerprint replaced by its FileContent; `value` itself, the same
    object, when it holds none."""
    t = type(value)
    if t is FileFingerprint:
        return FileContent(value.size, value.digest)
    if t is tuple or t is list:
        items = [content_only(v) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return t(items)
    if t is dict:
        items = {k: content_only(v) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        return items
    return value


def default_cache_file() -> Path | None:
    """`$MIXGRAPH_CACHE_DIR` or `$XDG_CACHE_HOME/mixgraph` or `~/.cache/mixgraph`; None if disabled."""
    if os.environ.get("MIXGRAPH_HASH_CACHE", "1") in ("0", "false", "no", "off"):
        return None
    root = os.environ.get("MIXGRAPH_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "mixgraph")
    return Path(root) / "file_hashes.sha256.json"     # (file_hashes.json held BLAKE2b digests)


def _hash_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Fingerprinter:
    """Remembers content hashes by (path, size, mtime_ns, inode). Thread-safe."""

    def __init__(self, cache_file: Path | str | None = None, disk_min_bytes: int = DISK_CACHE_MIN_BYTES):
        self.cache_file = Path(cache_file) if cache_file else None
        self.disk_min_bytes = disk_min_bytes
        self._memo: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._disk: dict[str, list] | None = None
        self.hashed = 0        # files actually read (tests and stats)
        self.bytes_hashed = 0

    def __call__(self, path: str | os.PathLike) -> FileFingerprint:
        return self.fingerprint(path)

    def fingerprint(self, path: str | os.PathLike) -> FileFingerprint:
        """Fingerprint `path` (symlinks followed). Raises FileNotFoundError for a missing file."""
        real = os.path.realpath(path)
        st = os.stat(real)
        key = (real, st.st_size, st.st_mtime_ns, st.st_ino)
        digest = self._memo.get(key)
        if digest is None:
            with self._lock:
                digest = self._memo.get(key) or self._from_disk(key)
                if digest is None:
                    digest = _hash_file(real)
                    self.hashed += 1
                    self.bytes_hashed += st.st_size
                    self._to_disk(key, digest)
                self._memo[key] = digest
        return FileFingerprint(real, st.st_size, st.st_mtime_ns, digest)

    # --- the on-disk memo (best effort: an unreadable or unwritable cache is ignored) ---------

    def _load_disk(self) -> dict[str, list]:
        if self._disk is None:
            self._disk = {}
            if self.cache_file is not None:
                try:
                    data = json.loads(self.cache_file.read_text())
                    if isinstance(data, dict):
                        self._disk = data
                except (OSError, ValueError):
                    pass
        return self._disk

    def _from_disk(self, key: tuple) -> str | None:
        if self.cache_file is None or key[1] < self.disk_min_bytes:
            return None
        entry = self._load_disk().get(key[0])
        if isinstance(entry, list) and len(entry) == 4 and tuple(entry[:3]) == key[1:]:
            return str(entry[3])
        return None

    def _to_disk(self, key: tuple, digest: str) -> None:
        if self.cache_file is None or key[1] < self.disk_min_bytes:
            return
        disk = self._load_disk()
        disk[key[0]] = [key[1], key[2], key[3], digest]
        while len(disk) > _DISK_CACHE_MAX_ENTRIES:
            disk.pop(next(iter(disk)))
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(disk))
            os.replace(tmp, self.cache_file)
        except OSError:
            pass


#: The process-wide fingerprinter that nodes' `fingerprint` functions use.
FINGERPRINTS = Fingerprinter(default_cache_file())


def fingerprint_file(path: str | os.PathLike) -> FileFingerprint:
    return FINGERPRINTS.fingerprint(path)
