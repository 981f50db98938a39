"""Structural keys, the byte-bounded LRU and file fingerprints (DESIGN §5)."""

import os
from dataclasses import dataclass

import torch

from mixgraph.graph.cache import OutputCache, estimate_nbytes, structural_key, walk_tensors
from mixgraph.graph.fingerprint import Fingerprinter


def test_structural_key_canonical_literals():
    k = structural_key("A", 1, {"x": 1, "y": "s"}, [])
    assert k == structural_key("A", 1, {"y": "s", "x": 1}, [])     # order-free
    assert len(k) == 16
    assert k != structural_key("A", 1, {"x": 1.0, "y": "s"}, [])   # 1 vs 1.0
    assert k != structural_key("A", 1, {"x": True, "y": "s"}, [])  # 1 vs True
    assert k != structural_key("A", 2, {"x": 1, "y": "s"}, [])     # node version
    assert k != structural_key("B", 1, {"x": 1, "y": "s"}, [])
    assert k != structural_key("A", 1, {"x": 1, "y": "s"}, [], precision="MODEL=bf16")
    assert k != structural_key("A", 1, {"x": 1, "y": "s"}, [], external=("f", 3, 4, "h"))
    assert structural_key("A", 1, {"x": 0.1 + 0.2}, []) != structural_key("A", 1, {"x": 0.3}, [])


def test_structural_key_links_by_upstream_key_and_slot():
    up = structural_key("U", 1, {}, [])
    k = structural_key("A", 1, {}, [("a", up, 0), ("b", up, 1)])
    assert k == structural_key("A", 1, {}, [("b", up, 1), ("a", up, 0)])
    assert k != structural_key("A", 1, {}, [("a", up, 1), ("b", up, 0)])


def test_structural_key_never_hashes_tensors():
    assert structural_key("A", 1, {"t": torch.zeros(2)}, []) is None
    assert structural_key("A", 1, {"o": object()}, []) is None


@dataclass(frozen=True)
class Handle:
    weight: torch.Tensor
    name: str


def test_estimate_nbytes_walks_containers_and_dedups_storage():
    t = torch.zeros(10, dtype=torch.float32)      # 40 bytes
    v = t[2:5]                                      # a view: same storage
    assert estimate_nbytes((t, [v], {"h": Handle(torch.zeros(4, dtype=torch.float16), "x")})) == 48
    assert estimate_nbytes(5) == 0

    class Sized:
        def __mixgraph_nbytes__(self):
            return 1234
    assert estimate_nbytes([Sized()]) == 1234
    assert len(list(walk_tensors(torch.nn.Linear(2, 3)))) == 2


def test_output_cache_lru_by_bytes():
    entry = 256 + 400                              # overhead + 100 float32
    cache = OutputCache(max_bytes=2 * entry)
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    cache.put(a, (torch.zeros(100),))
    cache.put(b, (torch.zeros(100),))
    assert cache.get(a) is not None                # a becomes most recent
    cache.put(c, (torch.zeros(100),))              # evicts b, the least recent
    assert a in cache and c in cache and b not in cache
    assert cache.stats()["evictions"] == 1 and cache.nbytes == 2 * entry


def test_output_cache_does_not_keep_entry_bigger_than_budget():
    cache = OutputCache(max_bytes=1000)
    cache.put(b"s" * 16, (1,))
    assert cache.put(b"x" * 16, (torch.zeros(1000),)) is False
    assert len(cache) == 1 and cache.stats()["rejected"] == 1


def test_fingerprint_hashes_once_and_sees_replacement(tmp_path):
    fp = Fingerprinter(cache_file=None)
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    first = fp(f)
    assert fp(f) == first and fp.hashed == 1       # remembered, not re-read
    f2 = tmp_path / "new.bin"
    f2.write_bytes(b"b" * 1000)                    # same size, other content
    os.replace(f2, f)                              # replaced under the same name
    second = fp(f)
    assert second.digest != first.digest and fp.hashed == 2


def test_fingerprint_disk_cache_survives_a_new_process_state(tmp_path):
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(4096))
    cache_file = tmp_path / "cache" / "hashes.json"
    one = Fingerprinter(cache_file, disk_min_bytes=1024)
    d = one(f).digest
    two = Fingerprinter(cache_file, disk_min_bytes=1024)
    assert two(f).digest == d and two.hashed == 0


def test_node_key_is_structural_key_with_the_header_made_once():
    import json

    from mixgraph.graph.cache import canonical_dumps, key_header, node_key
    up = structural_key("U", 1, {}, [])
    for lits, links, prec, ext in [({}, [], "", None), ({}, [("a", up, 0)], "", None),
                                   ({"x": [1.5, None, True], "é": "ü\x01"}, [("b", up, 2), ("a", up, 70)],
                                    "MODEL=bf16", ("f", 3))]:
        assert node_key(key_header("A", 1), lits, links, prec, ext) == structural_key("A", 1, lits, links, prec, ext)
    assert structural_key("A", 1, {}, [("a", up, 64)]) != structural_key("A", 1, {}, [("a", up, 0)])
    lit = {"b": {"z": 1, "a": [0.1, 2]}, "a": "x\u00e9\n", "c": float("inf")}
    assert canonical_dumps(lit) == json.dumps(lit, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert structural_key("A", 1, {"b": 1, 2: "a"}, []) is None                     # unsortable keys


def test_output_cache_get_many_counts_and_refreshes_lru():
    entry = 256 + 400
    cache = OutputCache(max_bytes=2 * entry)
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    cache.put(a, (torch.zeros(100),))
    cache.put(b, (torch.zeros(100),))
    found = cache.get_many({"1": a, "2": None, "3": c})
    assert list(found) == ["1"] and found["1"] is cache.peek(a)
    assert (cache.hits, cache.misses) == (1, 1)
    cache.put(c, (torch.zeros(100),))                    # evicts b, not the refreshed a
    assert a in cache and b not in cache and c in cache
