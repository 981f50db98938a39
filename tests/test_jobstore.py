"""The job store (ui/server/jobstore.py) and the queue over it: bounded, paged history; queue rows that
survive reopening; recovery of a queue left by a stopped process; the re-queue route; clear
errors for a damaged or unwritable file. Toy nodes, no models (the real kill -9 test is
tests/test_jobs_crash.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.executor import Executor
from mixgraph.ui.server.jobstore import JobStore, JobStoreError
from mixgraph.ui.server.queue import STOPPED_MESSAGE, PromptQueue, QueueItem
from tests.test_server import REG, client, diamond, env, post_prompt, wait_history  # noqa: F401


def _entry(n: int) -> dict:
    return {"prompt": [n, f"p{n}", {}, {}, []], "outputs": {"5": {"text": [str(n)]}},
            "meta": {}, "status": {"status_str": "success", "completed": True,
                                   "messages": [["execution_success", {"prompt_id": f"p{n}"}]]}}


def _finish(store: JobStore, n: int) -> None:
    store.finish(f"p{n}", _entry(n), {"number": n, "prompt": {}}, 1000 + n, 2000 + n)


def test_jobstore_history_bound_drops_oldest_and_pages(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite3", max_history=5)
    for n in range(8):
        _finish(store, n)
    assert list(store.history()) == ["p3", "p4", "p5", "p6", "p7"]      # p0..p2 dropped
    assert store.history()["p7"] == _entry(7)
    assert list(store.history(max_items=2)) == ["p6", "p7"]              # the newest
    assert list(store.history(max_items=2, offset=0)) == ["p3", "p4"]
    assert list(store.history(max_items=2, offset=4)) == ["p7"]
    assert list(store.history(offset=3)) == ["p6", "p7"]
    assert store.history_item("p1") is None and store.history_item("p4") == _entry(4)
    _finish(store, 4)                               # finishing again moves it to the end
    assert list(store.history()) == ["p3", "p5", "p6", "p7", "p4"]
    store.delete_history(["p5", "nope"])
    store.close()

    reopened = JobStore(tmp_path / "jobs.sqlite3", max_history=2)       # a smaller bound trims
    assert list(reopened.history()) == ["p7", "p4"]
    assert reopened.created_times() == {"p7": 1007, "p4": 1004}
    assert reopened.history_request("p4") == {"number": 4, "prompt": {}}
    reopened.delete_history(None)
    assert reopened.history() == {} and reopened.max_number() is None
    with pytest.raises(JobStoreError, match="another mixgraph server is using it"):
        JobStore(tmp_path / "jobs.sqlite3").open()            # one server per store
    reopened.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "jobs.sqlite3")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_jobstore_queue_rows_survive_reopen_in_run_order(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite3")
    for pid, number in (("a", 3), ("b", -1), ("c", 3), ("d", 0), ("e", 7)):
        store.add(pid, number, {"number": number, "prompt": {"id": pid}}, 5)
    store.set_running("d", 99)
    assert store.remove_pending(["d", "e"]) == 1          # the running one stays
    store.close()

    store = JobStore(tmp_path / "jobs.sqlite3")
    running, pending = store.queued()
    assert [(r.prompt_id, r.started_ms) for r in running] == [("d", 99)]
    assert [r.prompt_id for r in pending] == ["b", "a", "c"]           # by number, then arrival
    assert pending[0].request == {"number": -1, "prompt": {"id": "b"}}
    assert store.max_number() == 3
    assert store.remove_pending(None) == 3
    assert [r.prompt_id for r in store.queued()[1]] == []
    store.close()


def test_jobstore_damaged_or_unwritable_file_is_a_clear_error(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "jobs.sqlite3"
    bad.write_bytes(b"this is not a database, just some bytes " * 200)
    with pytest.raises(JobStoreError, match="jobs.sqlite3.*damaged"):
        JobStore(bad).open()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JobStoreError, match=str(blocker / "mixgraph")):
        JobStore(blocker / "mixgraph" / "jobs.sqlite3").open()

    from mixgraph.ui.server.server import serve
    monkeypatch.chdir(tmp_path)              # `mixgraph serve` keeps it in ./user/mixgraph
    (tmp_path / "user" / "mixgraph").mkdir(parents=True)
    (tmp_path / "user" / "mixgraph" / "jobs.sqlite3").write_bytes(bad.read_bytes())
    assert serve(port=0) == 2
    err = capsys.readouterr().err
    assert f"error: job store {tmp_path / 'user' / 'mixgraph' / 'jobs.sqlite3'}" in err
    assert "Traceback" not in err


def test_prompt_queue_takes_over_a_stopped_process_queue(env, tmp_path):
    path = tmp_path / "jobs.sqlite3"
    first = PromptQueue(Executor(REG, env, OutputCache(2**20)), store=JobStore(path))
    first.open()
    numbers = [first.next_number() for _ in range(3)]
    first.put(QueueItem(numbers[0], "was-running", diamond(), {"client_id": "me"}, ["5"]))
    envelope = {"format": "mixgraph/1", "prompt": diamond(2), "precision": {"default": "f32"}}
    first.put(QueueItem(numbers[1], "envelope", diamond(2), {}, ["5"], source=envelope))
    first.put(QueueItem(numbers[2], "partial", diamond(3), {"api_key_comfy_org": "secret"}, ["5"],
                        targets=["5"]))
    first.put(QueueItem(first.next_number(), "deleted", diamond(4), {}, ["5"]))
    assert first.delete(["deleted"]) == 1                # POST /queue {"delete": [...]}
    first.store.set_running("was-running", 12345)        # as the worker does when it takes it
    first.store.close()                                  # ... and the process dies here

    second = PromptQueue(Executor(REG, env, OutputCache(2**20)), store=JobStore(path))
    second.start()
    try:
        assert second.wait_idle(10.0)
        cut = second.history_item("was-running")["was-running"]
        assert cut["status"]["status_str"] == "error" and cut["outputs"] == {}
        messages = dict(cut["status"]["messages"])
        assert messages["execution_start"]["timestamp"] == 12345
        assert messages["execution_error"]["exception_message"] == STOPPED_MESSAGE
        assert "execution_interrupted" in messages
        assert cut["prompt"] == [0, "was-running", diamond(), {"client_id": "me"}, ["5"]]
        ran = second.history()
        assert list(ran) == ["was-running", "envelope", "partial"]
        assert ran["envelope"]["outputs"] == {"5": {"text": ["10"]}}
        assert ran["partial"]["status"]["status_str"] == "success"
        assert ran["partial"]["prompt"][3] == {}                       # no secret on disk
        assert second.history_request("envelope")["source"] == envelope
        assert second.history_request("partial")["targets"] == ["5"]
        assert second.history_item("deleted") == {}
        assert second.next_number() == 3                               # numbers go on
    finally:
        second.stop()


def test_server_history_persists_and_requeue_route(env, tmp_path):
    db = tmp_path / "jobs.sqlite3"

    async def main():
        async with client(env, jobs_db=db) as c:
            ids = []
            for f in (1, 2, 3):
                ids.append((await post_prompt(c, diamond(f), client_id="me"))[1]["prompt_id"])
                await wait_history(c, ids[-1])
            await c.post("/history", json={"delete": [ids[0]]})
        async with client(env, jobs_db=db) as c:                # a restarted server
            assert list(await (await c.get("/history")).json()) == ids[1:]
            r = await c.post(f"/api/history/{ids[1]}/requeue", json={"prompt_id": "again"})
            assert r.status == 200
            assert await r.json() == {"prompt_id": "again", "number": 3, "node_errors": {}}
            entry = await wait_history(c, "again")
            assert entry["prompt"][2:] == [diamond(2), {"client_id": "me"}, ["5"]]
            assert entry["outputs"] == {"5": {"text": ["10"]}}
            assert (await c.post("/history/nope/requeue")).status == 404
            await c.post("/history", json={"clear": True})
        async with client(env, jobs_db=db) as c:
            assert await (await c.get("/history")).json() == {}
    asyncio.run(main())


def test_jobstore_schema_1_file_gains_the_mixgraph_column(tmp_path):
    """A job store written before schema 2 opens: its history stays, and an entry's
    status["mixgraph"] (where and why a prompt ran on Ray) is kept from then on."""
    path = tmp_path / "jobs.sqlite3"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE queue (seq INTEGER PRIMARY KEY AUTOINCREMENT, prompt_id TEXT NOT NULL UNIQUE,
            number REAL NOT NULL, state TEXT NOT NULL, request TEXT NOT NULL,
            created_ms INTEGER NOT NULL, started_ms INTEGER);
        CREATE TABLE history (seq INTEGER PRIMARY KEY AUTOINCREMENT,
            prompt_id TEXT NOT NULL UNIQUE, number REAL NOT NULL, item TEXT NOT NULL,
            outputs TEXT NOT NULL, meta TEXT NOT NULL, status_str TEXT NOT NULL,
            completed INTEGER NOT NULL, messages TEXT NOT NULL, request TEXT NOT NULL,
            created_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL);
        INSERT INTO history (prompt_id, number, item, outputs, meta, status_str, completed,
            messages, request, created_ms, finished_ms) VALUES ('p0', 0, '[0, "p0", {}, {}, []]',
            '{"5": {"text": ["0"]}}', '{}', 'success', 1,
            '[["execution_success", {"prompt_id": "p0"}]]', '{}', 1000, 2000);
        PRAGMA user_version=1;""")
    old.close()
    store = JobStore(path)
    store.open()
    assert store.history_item("p0") == _entry(0)
    placed = _entry(1)
    placed["status"]["mixgraph"] = {"worker": "w1", "reason": "free and holds a.safetensors",
                                    "retries": []}
    store.finish("p1", placed, {"number": 1, "prompt": {}}, 1001, 2001)
    assert store.history_item("p1") == placed
    store.close()
    again = JobStore(path)
    again.open()
    assert again.history()["p1"]["status"]["mixgraph"]["worker"] == "w1"
    assert again.history()["p0"] == _entry(0)
    again.close()


def test_prompt_queue_stores_history_before_the_closing_executing_event(env, tmp_path):
    """ComfyUI's clients read /history/{id} as soon as `executing {node: null}` arrives: the
    entry is stored before that event is sent (ComfyUI's own execution tests race on it)."""
    seen: list = []

    def emit(type_, data, client_id=None):
        if type_ == "executing" and data["node"] is None:
            seen.append(queue.history_item(data["prompt_id"]))

    queue = PromptQueue(Executor(REG, env, OutputCache(2**20)), emit=emit,
                        store=JobStore(tmp_path / "jobs.sqlite3"))
    queue.start()
    try:
        queue.put(QueueItem(queue.next_number(), "p", diamond(), {"client_id": "me"}, ["5"]))
        assert queue.wait_idle(10.0)
    finally:
        queue.stop()
    assert len(seen) == 1 and seen[0]["p"]["status"]["status_str"] == "success"
