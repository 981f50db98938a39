"""What one request may ask of the server (issue 26, "Bad input and load"): bounded numeric query
parameters, request bodies that must arrive, typed request fields, bounded prompts, and an API
that answers while the worker is busy. The server runs on the loopback test server as in
test_server.py; waits are on conditions with generous deadlines, never fixed sleeps."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Int, Socket, node
from mixgraph.ui.server.limits import Limits
from mixgraph.ui.server.server import SERVER_KEY, create_app, limits_from_args
from tests import toy_nodes as toy
from tests.test_server import SPIN_STARTED, Spin, env, png_bytes, spin_prompt  # noqa: F401 (fixture)
from tests.toy_nodes import call, link

DEADLINE = 60.0        # seconds; generous for a loaded machine


@node(outputs=["INT"], register=False)
def Canvas(width=Int(8, min=1, max=16384), height=Int(8, min=1, max=16384),
           batch_size=Int(1, min=1, max=4096)):
    return width * height * batch_size


REG = toy.registry()
REG.add(Spin.spec)
REG.add(Canvas.spec)


@contextlib.asynccontextmanager
async def client(env, limits=None):
    app = create_app(env, registry=REG, executor=Executor(REG, env, OutputCache(2**24)),
                     user_dir=env.output.parent / "user", limits=limits)
    async with TestServer(app) as server, TestClient(server) as c:
        yield c


def run(coro_fn, env, limits=None):
    async def go():
        async with client(env, limits) as c:
            await coro_fn(c)
    asyncio.run(go())


def show(value_node: dict) -> dict:
    return {"1": value_node, "2": call("Show", value=link(1))}


# --- 1. numeric query parameters -------------------------------------------------------------------

def test_numeric_query_parameters_are_bounded_and_named(env):
    (env.output / "a.png").write_bytes(png_bytes())

    async def body(c):
        for url, name in (("/history?max_items=" + "9" * 20, "max_items"),
                          ("/history?max_items=-1", "max_items"),
                          ("/history?max_items=1e3", "max_items"),
                          ("/history?offset=" + "9" * 20, "offset"),
                          ("/history?offset=-2", "offset"),
                          ("/api/history?offset=x", "offset"),
                          ("/jobs?limit=" + "9" * 20, "limit"),
                          ("/jobs?offset=-1", "offset"),
                          ("/view?filename=a.png&preview=webp;" + "9" * 20, "preview"),
                          ("/view?filename=a.png&preview=jpeg;101", "preview")):
            r = await c.get(url)
            assert r.status == 400, (url, r.status)
            assert f"query parameter {name} must be" in await r.text(), url
        for url in ("/history?max_items=1000000000", "/history?max_items=0&offset=-1",
                    "/jobs?limit=5&offset=3", "/view?filename=a.png&preview=webp;90"):
            assert (await c.get(url)).status == 200, url
    run(body, env)


# --- 2. request bodies that do not arrive ------------------------------------------------------------

async def raw_request(c, head: str, body: bytes) -> tuple[bytes, float]:
    """Send a request by hand on a fresh 127.0.0.1 connection, keep it open, and return what
    comes back before the server closes it (and the seconds that took)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", c.server.port)
    start = time.monotonic()
    writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(), DEADLINE)     # until the server closes
    finally:
        writer.close()
    return answer, time.monotonic() - start


def test_short_or_stalled_bodies_time_out_with_408_and_the_server_answers_meanwhile(env):
    async def body(c):
        host = f"Host: 127.0.0.1:{c.server.port}\n"
        short = asyncio.create_task(raw_request(
            c, f"POST /prompt HTTP/1.1\n{host}Content-Type: application/json\n"
               f"Content-Length: 100\n", b'{"prompt": {'))
        # the server answers others while that body is outstanding
        r = await c.get("/queue")
        assert r.status == 200
        answer, took = await short
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 0.5 s" in answer and b"--body-timeout" in answer
        assert took < DEADLINE
        # a GET that announces a body and sends less, and a multipart upload that stalls
        answer, _ = await raw_request(c, f"GET /history HTTP/1.1\n{host}Content-Length: 10\n", b"{")
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        b = "XyZ"
        part = (f'--{b}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
                f'Content-Type: image/png\r\n\r\n').encode() + png_bytes()[:20]
        answer, _ = await raw_request(
            c, f"POST /upload/image HTTP/1.1\n{host}Content-Type: multipart/form-data; "
               f"boundary={b}\nContent-Length: 5000\n", part)
        assert answer.startswith(b"HTTP/1.1 408") and b"upload stalled" in answer, answer[:200]
        # and the server is still fine
        r = await c.post("/prompt", json={"prompt": show(call("Const", value=3))})
        assert r.status == 200
    run(body, env, Limits(body_timeout=0.5))


def test_a_body_over_the_size_limit_is_413_naming_the_limit(env):
    async def body(c):
        r = await c.post("/prompt", json={"prompt": show(call("Const", value=3)), "pad": "x" * 5000})
        assert r.status == 413
        text = await r.text()
        assert "at most 4096" in text and "--max-request-mb" in text
    run(body, env, Limits(max_body=4096))


# --- 3. request fields of the wrong type ----------------------------------------------------------------

@pytest.mark.parametrize("extra, field", [
    ({"extra_data": [1, 2]}, "extra_data"),
    ({"client_id": {"a": 1}}, "client_id"),
    ({"front": "yes"}, "front"),
    ({"prompt_id": 7}, "prompt_id"),
    ({"partial_execution_targets": "2"}, "partial_execution_targets"),
    ({"partial_execution_targets": [2]}, "partial_execution_targets"),
    ({"number": True}, "number"),
])
def test_prompt_fields_of_the_wrong_type_are_400_naming_the_field(env, extra, field):
    async def body(c):
        r = await c.post("/prompt", json={"prompt": show(call("Const", value=3)), **extra})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["type"] == "invalid_prompt" and f"'{field}'" in err["message"]
        assert err["details"] == field
        assert (await (await c.get("/queue")).json())["queue_pending"] == []
    run(body, env)


def test_queue_history_free_interrupt_fields_are_typed(env):
    async def body(c):
        for route, sent, field in (("/queue", {"delete": "x"}, "delete"),
                                   ("/queue", {"delete": [1]}, "delete"),
                                   ("/queue", {"clear": "yes"}, "clear"),
                                   ("/history", {"delete": "x"}, "delete"),
                                   ("/history", {"clear": 1}, "clear"),
                                   ("/free", {"unload_models": "yes"}, "unload_models"),
                                   ("/interrupt", {"prompt_id": {}}, "prompt_id"),
                                   ("/api/queue", [1, 2], "JSON object")):
            r = await c.post(route, json=sent)
            assert r.status == 400, (route, sent)
            assert field in await r.text(), (route, sent)
        for route, sent in (("/queue", {"delete": ["x"], "clear": False}), ("/history", {"clear": True}),
                            ("/free", {"unload_models": True}), ("/interrupt", {"prompt_id": "p"}),
                            ("/interrupt", None)):
            assert (await c.post(route, json=sent)).status == 200, (route, sent)
        ok = await c.post("/prompt", json={"prompt": show(call("Const", value=3)), "front": True,
                                           "client_id": "me", "extra_data": {},
                                           "partial_execution_targets": ["2"]})
        assert ok.status == 200
    run(body, env)


@pytest.mark.parametrize("name", ["ｖａｌｕｅ", "value\x00", "val\u200bue"])
def test_look_alike_input_names_are_400_naming_node_and_input(env, name):
    async def body(c):
        r = await c.post("/prompt", json={"prompt": show({"class_type": "Const",
                                                          "inputs": {"value": 1, name: 2}})})
        assert r.status == 400
        out = await r.json()
        (err,) = out["node_errors"]["1"]["errors"]
        assert err["type"] == "invalid_input_name" and err["extra_info"]["input_name"] == name
        assert out["error"]["type"] == "invalid_prompt" and repr(name) in out["error"]["message"]
        # an undeclared plain name is ignored, as ComfyUI does
        r = await c.post("/prompt", json={"prompt": show({"class_type": "Const",
                                                          "inputs": {"value": 1, "note": 2}})})
        assert r.status == 200
    run(body, env)


# --- 4. what one prompt may ask for ------------------------------------------------------------------------

def test_a_20_mb_text_is_refused_at_once_naming_node_input_and_limit(env):
    async def body(c):
        prompt = {"1": call("ReadText", path="x" * 20_000_000), "2": call("ShowText", text=link(1))}
        start = time.monotonic()
        r = await c.post("/prompt", json={"prompt": prompt})
        took = time.monotonic() - start
        assert r.status == 400
        out = await r.json()
        (err,) = out["node_errors"]["1"]["errors"]
        assert err["type"] == "value_too_long" and err["extra_info"]["input_name"] == "path"
        assert "20000000 characters; at most 100000" in err["message"]
        assert "--max-text-length" in out["error"]["message"]
        assert took < DEADLINE
        assert (await (await c.get("/queue")).json())["queue_pending"] == []
    run(body, env)


def test_node_count_list_length_and_batch_pixels_are_bounded(env):
    async def body(c):
        many = {str(i): call("Const", value=i) for i in range(1, 8)}
        many["99"] = call("Show", value=link(1))
        r = await c.post("/prompt", json={"prompt": many})
        assert r.status == 400
        out = await r.json()
        assert out["error"]["type"] == "prompt_too_large"
        assert "8 nodes; at most 6" in out["error"]["message"] and "--max-nodes" in out["error"]["message"]
        ui = {"nodes": [{"id": i, "type": "Const", "widgets_values": [i]} for i in range(9)],
              "links": []}                                        # counted before it is parsed
        r = await c.post("/prompt", json={"prompt": ui})
        assert r.status == 400 and "9 nodes; at most 6" in (await r.json())["error"]["message"]

        r = await c.post("/prompt", json={"prompt": show(call("Const", value={"__value__": list(range(50))}))})
        (err,) = (await r.json())["node_errors"]["1"]["errors"]
        assert r.status == 400 and "list of 50 items; at most 20" in err["message"]

        r = await c.post("/prompt", json={"prompt": show(call("Canvas", width=64, height=64, batch_size=2))})
        assert r.status == 400
        (err,) = (await r.json())["node_errors"]["1"]["errors"]
        assert err["extra_info"]["input_name"] == "batch_size"
        assert "2 x 64 x 64 = 8192 pixels" in err["message"] and "--max-batch-pixels" in err["message"]
        r = await c.post("/prompt", json={"prompt": show(call("Canvas", width=64, height=64, batch_size=1))})
        assert r.status == 200, await r.text()                   # batch 1 fits
        r = await c.post("/mixgraph/estimate", json={"prompt": show(call("Canvas", width=4096, height=8,
                                                                                batch_size=1))})
        assert r.status == 400 and "pixels" in await r.text()    # the estimate route too
    run(body, env, Limits(max_nodes=6, max_list=20, max_batch_pixels=4096))


def test_limits_from_serve_flags():
    args = argparse.Namespace(max_request_mb=2.0, max_text_length=10, max_nodes=None,
                              max_batch_pixels=None, body_timeout=5.0)
    limits = limits_from_args(args)
    assert (limits.max_body, limits.max_text, limits.body_timeout) == (2 << 20, 10, 5.0)
    assert limits.max_nodes == Limits().max_nodes
    with pytest.raises(ValueError, match="--body-timeout"):
        limits_from_args(argparse.Namespace(body_timeout=-1.0))
    with pytest.raises(ValueError, match="--max-request-mb"):
        limits_from_args(argparse.Namespace(max_request_mb=float("nan")))
    with pytest.raises(ValueError, match="max_text"):
        Limits(max_text=0)


def test_serve_help_lists_the_limit_flags(capsys):
    from mixgraph.ui.cli import main
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--max-request-mb", "--max-text-length", "--max-nodes", "--max-batch-pixels",
                 "--body-timeout"):
        assert flag in out


# --- the API answers while the worker is busy ------------------------------------------------------------

def test_queue_history_and_system_stats_answer_while_a_prompt_runs(env):
    SPIN_STARTED.clear()

    async def body(c):
        r = await c.post("/prompt", json={"prompt": spin_prompt(limit=10**6)})
        spin = (await r.json())["prompt_id"]
        deadline = time.monotonic() + DEADLINE
        while not SPIN_STARTED.is_set():
            assert time.monotonic() < deadline, "the prompt never started"
            await asyncio.sleep(0.01)
        for url in ("/queue", "/history", "/system_stats", f"/history/{spin}", "/jobs",
                    f"/jobs/{spin}", "/prompt"):
            start = time.monotonic()
            r = await c.get(url)
            assert r.status == 200, url
            assert time.monotonic() - start < 10.0, url       # milliseconds when idle
        assert (await c.post("/interrupt")).status == 200
    run(body, env)


def test_a_stuck_store_read_does_not_block_the_event_loop(env):
    """A handler that waits on the job store or the queue's lock (held by the worker while it
    records a result, say) must wait in a thread: other requests answer meanwhile."""
    release = threading.Event()

    async def body(c):
        queue = c.server.app[SERVER_KEY].queue
        real_snapshot, real_history = queue.snapshot, queue.history

        def stuck_snapshot():
            release.wait(DEADLINE)
            return real_snapshot()

        def stuck_history(*args):
            release.wait(DEADLINE)
            return real_history(*args)
        queue.snapshot, queue.history = stuck_snapshot, stuck_history
        try:
            waiting = [asyncio.create_task(c.get(u)) for u in ("/queue", "/history")]
            start = time.monotonic()
            r = await c.get("/system_stats")                   # answered while both wait
            assert r.status == 200 and not release.is_set()
            assert (await c.get("/prompt")).status == 200
            assert time.monotonic() - start < DEADLINE / 2
            assert not any(t.done() for t in waiting)
            release.set()
            for t in waiting:
                assert (await t).status == 200
        finally:
            release.set()
            queue.snapshot, queue.history = real_snapshot, real_history
    run(body, env)
