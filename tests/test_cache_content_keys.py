"""Persisted cache keys name file content, not file places (graph/cache.py two-part keys,
graph/fingerprint.py `content_only`): a copy of a checkpoint in another models folder (another
worker's machine, another install) finds the results made from the original in the persistent
output cache; a file with other bytes of the same size does not; the in-memory key still tells
the two places apart."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from mixgraph.graph.cache import persisted_key, structural_key
from mixgraph.graph.fingerprint import FileContent, FileFingerprint, Fingerprinter, content_only
from mixgraph.nodes.weights import store
from tests.fixtures.checkpoints import write_sd15
from tests.test_persist import executor, run


def test_content_only_replaces_fingerprints_and_keeps_other_values_as_is():
    fp = FileFingerprint("/a/m.safetensors", 10, 123, "d1")
    assert content_only(fp) == FileContent(10, "d1")
    assert content_only(("x", [fp], {"k": fp})) == ("x", [FileContent(10, "d1")],
                                                    {"k": FileContent(10, "d1")})
    plain = ("x", [1, 2.5], {"k": None})
    assert content_only(plain) is plain


def test_structural_key_two_parts_memory_by_place_persisted_by_content():
    a = FileFingerprint("/one/models/m.safetensors", 10, 111, "d1")
    b = FileFingerprint("/two/models/m.safetensors", 10, 222, "d1")     # a copy elsewhere
    c = FileFingerprint("/one/models/m.safetensors", 10, 333, "d2")     # other bytes
    ka, kb, kc = (structural_key("Load", 1, {"name": "m"}, [], external=f) for f in (a, b, c))
    assert len(ka) == 32 and ka != kb                    # memory: the place matters
    assert persisted_key(ka) == persisted_key(kb) != persisted_key(kc)
    # downstream keys carry both parts on
    da, db, dc = (structural_key("Enc", 1, {"t": "cat"}, [("clip", k, 1)]) for k in (ka, kb, kc))
    assert len(da) == 32 and da != db
    assert persisted_key(da) == persisted_key(db) != persisted_key(dc)
    # a key with no file anywhere above it is one 16-byte part, as before
    plain = structural_key("Enc", 1, {"t": "cat"}, [("x", structural_key("U", 1, {}, []), 0)])
    assert len(plain) == 16 and persisted_key(plain) == plain


def test_fingerprint_digest_is_the_files_sha256(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(os.urandom(5000))
    assert Fingerprinter(None)(f).digest == hashlib.sha256(f.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contentkeys")
    write_sd15(root / "models" / "checkpoints" / "sd15.safetensors", seed=1)
    return root


def copied(original: Path, where: Path) -> Path:
    """The checkpoint copied (a new path, a new mtime) into the models folder `where`."""
    (where / "checkpoints").mkdir(parents=True)
    shutil.copyfile(original / "models" / "checkpoints" / "sd15.safetensors",
                    where / "checkpoints" / "sd15.safetensors")
    return where


def test_persisted_cache_copy_in_another_models_folder_hits(original, tmp_path):
    first, planned, _ = run(executor(original, tmp_path / "c"))
    assert planned == ["3", "4", "5", "6", "7", "8", "9"]
    other = copied(original, tmp_path / "elsewhere")
    store.clear()
    loads = store.stats().loads
    again, planned, cached = run(executor(original, tmp_path / "c", other))
    assert planned == ["9"] and cached == ["8"]          # only the output node runs
    assert store.stats().loads == loads                  # the copy's weights were never read
    assert again.report.nodes["8"].status == "cached"


def test_persisted_cache_same_size_other_bytes_misses(original, tmp_path):
    run(executor(original, tmp_path / "c"))
    other = copied(original, tmp_path / "elsewhere")
    path = other / "checkpoints" / "sd15.safetensors"
    size = path.stat().st_size
    with open(path, "r+b") as f:                         # the last weights' bytes, in place
        f.seek(size - 8)
        tail = f.read(8)
        f.seek(size - 8)
        f.write(bytes(x ^ 0x55 for x in tail))
    # a write within one clock tick of the copy can keep its mtime: make it later, as time would
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert path.stat().st_size == size
    _, planned, cached = run(executor(original, tmp_path / "c", other))
    assert planned == ["3", "4", "6", "7", "8", "9"] and cached == ["5"]
