"""The persistent output cache (graph.codec, graph.persist; DESIGN §5 last bullet):
payload round trips, LRU under a byte budget, two processes on one directory, damaged blobs,
and restarts of the executor on a tiny SD1.5 checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import queue
import sqlite3
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from mixgraph.graph import events as ev
from mixgraph.graph.cache import NoCache, OutputCache, structural_key
from mixgraph.graph.codec import TreeCodec, Unencodable
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Int, Socket, node
from mixgraph.graph.persist import DiskCache, TieredCache
from mixgraph.graph.registry import Registry
from mixgraph.nodes.helpers import persistable
from mixgraph.nodes.weights import store
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.ui import api
from mixgraph.ui.cli import main
from mixgraph.ui.server.server import create_app
from tests import toy_nodes as toy
from tests.fixtures.checkpoints import write_sd15

WORKFLOW = Path(__file__).resolve().parent.parent / "workflows" / "txt2img_sd15.json"
SMALL = {"5.width": 32, "5.height": 32, "3.steps": 2}


def codec() -> TreeCodec:
    c = TreeCodec()
    persistable.declare(c)
    return c


def same(a, b) -> bool:
    """Equal values, structure and types (tensors: dtype, shape and every element)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def key(n: int) -> bytes:
    return structural_key("T", 1, {"n": n}, [])


def payloads() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cond = Cond(r(1, 77, 32), pooled=r(1, 16), area=(8, 8, 0, 4), strength=0.5,
                mask=torch.rand(1, 16, 16, generator=g), size=SizeCond(64, 64, 0, 0, 64, 64, 6.0),
                timestep_range=(0.1, 0.9), concat_latent=r(1, 4, 8, 8))
    shared = r(1, 77, 32)      # one tensor in two conds: stored once, both get it back
    return {
        "LATENT": (Latent(r(2, 4, 8, 8), noise_mask=torch.rand(2, 1, 8, 8, generator=g),
                          batch_index=(3, 4)),),
        "CONDITIONING": ((cond, Cond(shared), Cond(shared, strength=2.0)),),
        "IMAGE": (torch.rand(2, 16, 16, 3, generator=g),),
        "MASK": (torch.rand(1, 16, 16, generator=g), Latent(r(1, 4, 2, 2))),
        "list": ([Latent(r(1, 4, 2, 2)), Latent(r(1, 4, 2, 2))],),
        "plain": ({"a": [1, 2.5, float("nan"), float("-inf")], 7: (None, True, "s")}, 3,
                  torch.arange(6, dtype=torch.int64)[2:5], torch.zeros(0, 3),
                  torch.ones(2, dtype=torch.bfloat16)),
    }


# --- the codec ----------------------------------------------------------------------------------

def test_codec_round_trips_each_payload_type():
    c = codec()
    for name, value in payloads().items():
        tensors, tree = c.encode(value)
        back = c.decode(tensors, tree)
        assert same(back, value), name
    tensors, _ = c.encode(payloads()["CONDITIONING"])
    assert len(tensors) == 1 + 1 + 1 + 1 + 1   # cond's 4 tensors + the shared one, once


def test_codec_refuses_what_it_cannot_rebuild():
    c = codec()

    @dataclasses.dataclass(frozen=True)
    class Chain:                         # e.g. a ControlNet chain: holds a model, not registered
        weight: torch.Tensor

    with pytest.raises(Unencodable):
        c.encode((Cond(torch.zeros(1, 2, 3), control=Chain(torch.zeros(2))),))
    with pytest.raises(Unencodable):
        c.encode((object(),))
    with pytest.raises(Unencodable):
        c.encode(({(1, 2): 3},))         # a non-scalar dict key
    assert c.storable(["LATENT"]) and c.storable(["IMAGE", "MASK"]) and c.storable(["IMAGE", "INT"])
    assert not c.storable(["MODEL"]) and not c.storable(["MODEL", "CLIP", "VAE"])
    assert not c.storable(["LATENT", "MODEL"]) and not c.storable(["INT"]) and not c.storable([])


# --- the disk level ------------------------------------------------------------------------------

def test_disk_cache_round_trips_payloads_through_files(tmp_path):
    disk = DiskCache(tmp_path / "c", codec=codec())
    values = payloads()
    for i, name in enumerate(("LATENT", "CONDITIONING", "IMAGE")):
        assert disk.put(key(i), values[name], {"precision": "f32", "list": False}, [name])
    assert disk.put(key(3), values["MASK"], {}, ["MASK", "LATENT"])
    assert disk.put(key(4), values["list"], {"list": True}, ["LATENT"])
    assert disk.put(key(5), values["plain"][1:], {}, ["INT", "IMAGE", "MASK", "IMAGE"])
    again = DiskCache(tmp_path / "c", codec=codec())      # another process would see the same
    for i, name in enumerate(("LATENT", "CONDITIONING", "IMAGE", "MASK", "list")):
        entry = again.get(key(i))
        assert entry is not None and same(entry.outputs, values[name]), name
    assert same(again.get(key(5)).outputs, values["plain"][1:])
    assert again.get(key(4)).meta["list"] is True and again.get(key(0)).meta["precision"] == "f32"
    assert again.get(key(99)) is None
    assert again.stats()["entries"] == 6


def test_disk_cache_never_stores_models_or_unencodable_values(tmp_path):
    disk = DiskCache(tmp_path / "c", codec=codec())
    assert not disk.put(key(1), (torch.zeros(3),), {}, ["MODEL"])
    assert not disk.put(key(2), (Cond(torch.zeros(1, 2), control=object()),), {}, ["CONDITIONING"])
    assert disk.stats()["entries"] == 0 and disk.counts["refused"] == 1
    assert list((tmp_path / "c" / "blobs").rglob("*.safetensors")) == []


def test_disk_cache_lru_eviction_under_a_byte_budget(tmp_path):
    probe = DiskCache(tmp_path / "probe", codec=codec())
    probe.put(key(0), (torch.zeros(100),), {}, ["IMAGE"])
    size = probe.totals()[0]                     # every entry below has this size
    disk = DiskCache(tmp_path / "c", max_bytes=3 * size + size // 2, codec=codec())
    for i in (1, 2, 3):
        assert disk.put(key(i), (torch.full((100,), float(i)),), {}, ["IMAGE"])
    assert disk.get(key(1)) is not None           # 1 is now the most recently used
    assert disk.put(key(4), (torch.full((100,), 4.0),), {}, ["IMAGE"])
    assert disk.get(key(2)) is None               # the least recently used went
    assert all(disk.get(key(i)) is not None for i in (1, 3, 4))
    nbytes, entries = disk.totals()
    assert entries == 3 and nbytes == 3 * size <= disk.max_bytes
    assert len(list((tmp_path / "c" / "blobs").rglob("*.safetensors"))) == 3
    assert not disk.put(key(5), (torch.zeros(10_000),), {}, ["IMAGE"])   # bigger than the budget
    assert disk.counts["too_big"] == 1 and disk.totals()[1] == 3


def test_disk_cache_damaged_or_missing_blob_is_a_miss(tmp_path):
    disk = DiskCache(tmp_path / "c", codec=codec())
    for i in range(3):
        disk.put(key(i), (torch.full((64,), float(i)),), {}, ["IMAGE"])
    files = {i: next((tmp_path / "c" / "blobs").rglob(f"{key(i).hex()}.*")) for i in range(3)}
    data = bytearray(files[0].read_bytes())
    data[-5] ^= 0xFF                               # a flipped bit in the tensor data
    files[0].write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[:40])   # truncated
    files[2].unlink()                              # gone
    assert [disk.get(key(i)) for i in range(3)] == [None, None, None]
    assert disk.counts["corrupt"] == 2 and disk.totals() == (0, 0)   # rows dropped
    assert disk.put(key(0), (torch.ones(64),), {}, ["IMAGE"])         # and written again
    assert torch.equal(disk.get(key(0)).outputs[0], torch.ones(64))


def test_disk_cache_sweeps_orphaned_files(tmp_path):
    disk = DiskCache(tmp_path / "c", codec=codec())
    disk.put(key(0), (torch.ones(4),), {}, ["IMAGE"])
    orphan = tmp_path / "c" / "blobs" / "ab" / "abab.dead.safetensors"
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"half")
    tmp = tmp_path / "c" / "tmp" / "abab.123.x"
    tmp.write_bytes(b"half")
    old = os.stat(orphan).st_mtime - 7200
    os.utime(orphan, (old, old))
    os.utime(tmp, (old, old))
    assert DiskCache(tmp_path / "c", codec=codec()).get(key(0)) is not None   # opening sweeps
    assert not orphan.exists() and not tmp.exists()


BARRIER_SECONDS = 600      # a slow, busy machine: generous; a dead peer aborts it at once


def _worker(directory: str, wid: int, barrier, results) -> None:
    """One of two processes on one cache directory; puts (wid, hits, wrong) or, when anything
    fails, (wid, "error", traceback) after breaking the barrier so the other stops waiting."""
    try:
        results.put(_share(directory, wid, barrier))
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        barrier.abort()
        results.put((wid, "error", traceback.format_exc()))


def _share(directory: str, wid: int, barrier) -> tuple:
    c = codec()
    disk = DiskCache(directory, codec=c)
    value = lambda n: (torch.full((256,), float(n)), Latent(torch.full((1, 4, 4, 4), -float(n))))  # noqa: E731
    mine = [wid * 1000 + i for i in range(12)] + list(range(500, 505))   # 5 keys both write
    for n in mine:
        disk.put(key(n), value(n), {}, ["IMAGE", "LATENT"])
    barrier.wait(BARRIER_SECONDS)
    other = [(1 - wid) * 1000 + i for i in range(12)] + list(range(500, 505))
    found = [disk.get(key(n)) for n in other]
    hits = sum(e is not None for e in found)
    wrong = sum(e is not None and not same(e.outputs, value(n)) for n, e in zip(other, found))
    barrier.wait(BARRIER_SECONDS)    # both have read before either evicts (the small budget below)
    # both write and read under a budget of ~8 entries at once: evictions race with reads
    small = DiskCache(directory, max_bytes=8 * disk.totals()[0] // disk.totals()[1], codec=c)
    for i in range(30):
        n = 2000 + wid * 100 + i
        small.put(key(n), value(n), {}, ["IMAGE", "LATENT"])
        for m in (n - 3, 2000 + (1 - wid) * 100 + i - 1):
            e = small.get(key(m))
            wrong += e is not None and not same(e.outputs, value(m))
    return wid, hits, wrong


def test_disk_cache_two_processes_share_one_directory(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "c"), w, barrier, results),
                         daemon=True) for w in (0, 1)]
    try:
        for p in procs:
            p.start()
        got: list[tuple] = []
        deadline = time.monotonic() + 2 * BARRIER_SECONDS
        while len(got) < len(procs):
            try:
                got.append(results.get(timeout=5))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a worker died before reporting (exit codes {dead})"
                assert time.monotonic() < deadline, "the workers did not finish in time"
        failed = [g[2] for g in got if g[1] == "error"]
        assert not failed, failed[0]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in procs:      # never leave a process behind (pytest's exit would wait for it)
            if p.is_alive():
                p.kill()
                p.join(60)
    assert sorted(got) == [(0, 17, 0), (1, 17, 0)]   # every result of the other seen, none wrong
    disk = DiskCache(tmp_path / "c", codec=codec(), sweep=False)
    db = sqlite3.connect(tmp_path / "c" / "index.sqlite3")
    rows = db.execute("SELECT file, nbytes FROM entries").fetchall()
    assert disk.totals() == (sum(n for _, n in rows), len(rows))   # the running total is exact
    assert disk.totals()[0] <= disk.max_bytes and 0 < len(rows) <= 9
    blobs = {p.relative_to(tmp_path / "c" / "blobs").as_posix()
             for p in (tmp_path / "c" / "blobs").rglob("*.safetensors")}
    assert blobs == {f for f, _ in rows}          # no orphan, no row without its blob
    assert list((tmp_path / "c" / "tmp").iterdir()) == []


# --- the executor with both levels ----------------------------------------------------------------

@node(outputs=["IMAGE"], deterministic=False, register=False)
def NoisyImage(seed=Int(0, min=0, max=100)):
    return torch.rand(1, 4, 4, 3)


@node(outputs=["IMAGE"], register=False)
def StillImage(value=Int(0, min=0, max=100)):
    return torch.full((1, 4, 4, 3), value / 100)


@node(outputs=["IMAGE"], register=False)
def Blend(a=Socket("IMAGE"), b=Socket("IMAGE")):
    return (a + b) / 2


@node(outputs=[], output_node=True, register=False)
def Sink(image=Socket("IMAGE")):
    return None


def test_tiered_cache_never_stores_non_deterministic_nodes(tmp_path):
    reg = Registry()
    for fn in (NoisyImage, StillImage, Blend, Sink):
        reg.add(fn.spec)
    c = TreeCodec()
    c.declare("IMAGE")
    env = Env(models=(tmp_path,), input=tmp_path, output=tmp_path, temp=tmp_path)
    prompt = {"1": {"class_type": "NoisyImage", "inputs": {"seed": 1}},
              "2": {"class_type": "StillImage", "inputs": {"value": 50}},
              "3": {"class_type": "Blend", "inputs": {"a": ["1", 0], "b": ["2", 0]}},
              "4": {"class_type": "Sink", "inputs": {"image": ["3", 0]}},
              "5": {"class_type": "Sink", "inputs": {"image": ["2", 0]}}}
    disk = DiskCache(tmp_path / "c", codec=c)
    Executor(reg, env, TieredCache(NoCache(), disk)).run(prompt)
    assert disk.totals()[1] == 1          # StillImage only: Blend depends on a non-deterministic node
    again = Executor(reg, env, TieredCache(NoCache(), DiskCache(tmp_path / "c", codec=c)))
    r = again.run(prompt)
    assert r.nodes["2"].status == "cached"
    assert sorted(r.executed) == ["1", "3", "4", "5"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pcache")
    write_sd15(root / "models" / "checkpoints" / "sd15.safetensors", seed=1)
    return root


def executor(root: Path, cache_dir: Path, models_dir: Path | None = None) -> Executor:
    env = Env.from_args(models=models_dir or root / "models", input=root / "input",
                        output=root / "output")
    return Executor(api.default_registry(), env,
                    TieredCache(OutputCache(2**30), DiskCache(cache_dir)))


def run(ex: Executor, sets: dict | None = None, precision: str | None = None):
    events: list = []
    result = api.run(WORKFLOW, set={**SMALL, **(sets or {})}, executor=ex, precision=precision,
                     on_event=events.append)
    start = next(e for e in events if isinstance(e, ev.ExecutionStart))
    cached = next(e for e in events if isinstance(e, ev.ExecutionCached))
    return result, sorted(start.planned), sorted(cached.nodes)


def test_restart_executes_only_output_nodes_and_loads_no_checkpoint(models, tmp_path):
    first, planned, _ = run(executor(models, tmp_path / "c"))
    assert planned == ["3", "4", "5", "6", "7", "8", "9"]
    store.clear()
    loads = store.stats().loads
    again, planned, cached = run(executor(models, tmp_path / "c"))      # a new process, in effect
    assert planned == ["9"] and cached == ["8"]                          # execution_start/_cached
    assert again.report.executed == ["9"] and again.report.nodes["8"].status == "cached"
    assert "4" not in again.report.nodes and "3" not in again.report.nodes
    assert store.stats().loads == loads                                  # no weights read
    assert torch.equal(again["8"][0], first["8"][0])
    a, b = (np.asarray(Image.open(r.files[0])) for r in (first, again))
    assert np.array_equal(a, b)


def test_restart_misses_after_a_literal_or_precision_change(models, tmp_path):
    run(executor(models, tmp_path / "c"))
    r, planned, cached = run(executor(models, tmp_path / "c"), {"6.text": "a red cube"})
    assert planned == ["3", "4", "6", "8", "9"]    # the negative (7) and the latent (5) are reused
    assert cached == ["5", "7"]
    r, planned, _ = run(executor(models, tmp_path / "c"), precision="bf16")
    assert {"3", "6", "7", "8"} <= set(planned)    # every node using a model misses
    r, planned, _ = run(executor(models, tmp_path / "c"), precision="bf16")
    assert planned == ["9"]


def test_restart_misses_when_the_checkpoint_is_replaced(models, tmp_path):
    own = tmp_path / "models"
    write_sd15(own / "checkpoints" / "sd15.safetensors", seed=1)
    run(executor(models, tmp_path / "c", own))
    write_sd15(own / "checkpoints" / "sd15.safetensors", seed=7)     # same name, other weights
    _, planned, cached = run(executor(models, tmp_path / "c", own))
    assert planned == ["3", "4", "6", "7", "8", "9"] and cached == ["5"]


def test_restart_recomputes_a_damaged_blob(models, tmp_path):
    first, _, _ = run(executor(models, tmp_path / "c"))
    ex = executor(models, tmp_path / "c")
    decode_key = None
    with sqlite3.connect(tmp_path / "c" / "index.sqlite3") as db:
        rows = db.execute("SELECT key, file, meta FROM entries").fetchall()
    for k, f, meta in rows:        # the VAEDecode result is the only IMAGE entry
        if json.loads(meta)["types"] == ["IMAGE"]:
            decode_key = k
            (tmp_path / "c" / "blobs" / f).write_bytes(b"\0" * 100)
    assert decode_key is not None
    store.clear()
    loads = store.stats().reads_by_source.copy()
    again, planned, cached = run(ex)
    assert planned == ["4", "8", "9"] and cached == ["3"]   # VAEDecode again, from the stored latent
    read = {k: v - loads.get(k, 0) for k, v in store.stats().reads_by_source.items()}
    assert sum(read.values()) == 1                           # the VAE's weights only
    assert torch.equal(again["8"][0], first["8"][0])
    assert ex.cache.disk.counts["corrupt"] == 1


def test_cli_run_output_cache_flag_reuses_results_across_runs(models, tmp_path):
    wf = tmp_path / "wf.json"
    prompt = json.loads(WORKFLOW.read_text())
    for target, value in SMALL.items():
        nid, name = target.split(".")
        prompt[nid]["inputs"][name] = value
    wf.write_text(json.dumps(prompt))
    args = ["run", str(wf), "--models", str(models / "models"), "--output", str(tmp_path / "out"),
            "--quiet", "--output-cache", str(tmp_path / "c"), "--output-cache-gb", "0.5"]
    assert main([*args, "--report", str(tmp_path / "r1.json")]) == 0
    assert main([*args, "--report", str(tmp_path / "r2.json")]) == 0
    nodes = json.loads((tmp_path / "r2.json").read_text())["nodes"]
    assert {n: v["status"] for n, v in nodes.items()} == {"8": "cached", "9": "executed"}
    assert main(["run", str(wf), "--output-cache-gb", "1", "--quiet"]) == 2
    (tmp_path / "file").write_text("x")
    assert main(["run", str(wf), "--output-cache", str(tmp_path / "file"), "--quiet"]) == 2


def test_api_enable_output_cache_keeps_the_memory_level(models, tmp_path):
    ex = executor(models, tmp_path / "a")
    memory = ex.cache.memory
    cache = api.enable_output_cache(tmp_path / "b", gb=0.25, executor=ex)
    assert ex.cache is cache and cache.memory is memory
    assert cache.disk.directory == tmp_path / "b" and cache.disk.max_bytes == 2**28


def test_server_restart_reports_stored_nodes_as_cached(models, tmp_path):
    prompt = json.loads(WORKFLOW.read_text())
    for target, value in SMALL.items():
        nid, name = target.split(".")
        prompt[nid]["inputs"][name] = value
    env = Env.from_args(models=models / "models", input=tmp_path / "in", output=tmp_path / "out",
                        temp=tmp_path / "temp")

    async def serve_once(user: str) -> dict:
        cache = TieredCache(OutputCache(2**30), DiskCache(tmp_path / "c"))
        app = create_app(env, cache=cache, user_dir=tmp_path / user / "default")
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/prompt", json={"prompt": prompt})
            pid = (await r.json())["prompt_id"]
            for _ in range(6000):
                body = await (await c.get(f"/history/{pid}")).json()
                if body:
                    return body[pid]
                await asyncio.sleep(0.02)
        raise AssertionError("the prompt did not finish")

    first = asyncio.run(serve_once("u1"))
    second = asyncio.run(serve_once("u2"))       # a restarted server on the same cache directory
    for entry in (first, second):
        assert entry["status"]["status_str"] == "success" and entry["outputs"]["9"]["images"]
    messages = {name: body for name, body in second["status"]["messages"]}
    assert messages["execution_cached"]["nodes"] == ["8"]


def test_tiered_cache_serves_expanded_nodes_after_a_restart(tmp_path):
    reg = toy.registry()
    c = TreeCodec()
    c.declare("INT")                       # toy nodes pass INTs: a payload for this test
    env = Env(models=(tmp_path,), input=tmp_path, output=tmp_path, temp=tmp_path)

    def wf(label):
        return {"1": toy.call("Const", value=1),
                "2": toy.call("NestedLoops", value=toy.link(1), outer=2, inner=3, label=label),
                "3": toy.call("Show", value=toy.link(2))}

    def fresh() -> Executor:               # a restart: nothing in memory, one directory
        return Executor(reg, env, TieredCache(NoCache(), DiskCache(tmp_path / "c", codec=c)))

    fresh().run(wf("a"))
    toy.CALLS.clear()
    r = fresh().run(wf("a"))
    assert r.executed == ["3"] and r.nodes["2"].status == "cached" and toy.CALLS == {"Show": 1}
    toy.CALLS.clear()
    r = fresh().run(wf("b"))               # a new parent key: its expanded nodes come from disk
    assert r.values["2"] == (7,) and r.nodes["2.0.loop1"].status == "cached"
    assert toy.CALLS["NestedLoops"] == 1 and toy.CALLS["CountLoop"] == 0
