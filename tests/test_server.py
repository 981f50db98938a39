"""The HTTP/WebSocket server on tiny toy nodes: ComfyUI's routes, shapes and WS messages, the queue,
interrupt, uploads and the safety rules. No models, no network beyond the loopback test server."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import threading
import time

import pytest
import torch
from aiohttp import FormData, WSMsgType, WSServerHandshakeError
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Int, Socket, node
from tests import toy_nodes as toy
from tests.toy_nodes import call, link
from mixgraph.ui.server.frontend import frontend_root
from mixgraph.ui.server.security import SecurityError, safe_path
from mixgraph.ui.server.server import create_app, serve

SPIN_STARTED = threading.Event()


@node(outputs=["INT"], register=False)
def Spin(x=Socket("INT"), limit=Int(1000, min=1, max=10**6), ctx=None):
    """Steps until interrupted (like a sampler that checks the interrupt every step)."""
    SPIN_STARTED.set()
    for i in range(limit):
        ctx.progress(i + 1, limit)
        time.sleep(0.005)
    return x


@node(outputs=["INT"], register=False)
def Preview(x=Socket("INT"), ctx=None):
    """Reports one step with a preview image, as a sampler with a previewer does."""
    ctx.progress(1, 1, preview=torch.full((1, 8, 8, 3), 0.5))
    return x


REG = toy.registry()
REG.add(Spin.spec)
REG.add(Preview.spec)


def diamond(factor=5):
    return {"1": call("Const", value=2), "2": call("Mul", a=link(1), factor=3),
            "3": call("Mul", a=link(1), factor=factor), "4": call("Add", a=link(2), b=link(3)),
            "5": call("Show", value=link(4))}


def spin_prompt(limit=1000):
    return {"1": call("Const", value=1), "2": call("Spin", x=link(1), limit=limit),
            "3": call("Show", value=link(2))}


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp", "models/checkpoints", "models/embeddings"):
        (tmp_path / d).mkdir(parents=True)
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


#: create_app keywords every test's app gets; tests/test_server_ray.py sets `ray` here to run
#: these tests with prompts on Ray workers.
SERVER_KW: dict = {}


def registry():
    """The toy registry (a Ray worker builds its executor from it)."""
    return REG


@contextlib.asynccontextmanager
async def client(env, **kw):
    for key, value in SERVER_KW.items():
        kw.setdefault(key, value)
    kw.setdefault("executor", Executor(REG, env, OutputCache(2**24)))
    kw.setdefault("user_dir", env.output.parent / "user")
    app = create_app(env, registry=REG, **kw)
    async with TestServer(app) as server, TestClient(server) as c:
        yield c


def run(coro_fn, env, **kw):
    async def main():
        async with client(env, **kw) as c:
            await coro_fn(c)
    asyncio.run(main())


async def post_prompt(c, prompt, **body):
    r = await c.post("/prompt", json={"prompt": prompt, **body})
    return r.status, await r.json()


async def wait_history(c, prompt_id, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = await c.get(f"/history/{prompt_id}")
        body = await r.json()
        if body:
            return body[prompt_id]
        await asyncio.sleep(0.01)
    raise AssertionError(f"prompt {prompt_id} did not finish")


async def wait_running(c, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = SPIN_STARTED.is_set() or "ray" in SERVER_KW     # Ray: in the worker process
        if started and (await (await c.get("/queue")).json())["queue_running"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing started running")


def png_bytes(size=(4, 4), color=(255, 0, 0), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


def raw_upload(data: bytes, filename: str) -> tuple[bytes, dict]:
    """A multipart body written by hand, as a browser sends it (no escaping of the file name)."""
    b = "XyZzY"
    body = (f'--{b}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
            f'Content-Type: image/png\r\n\r\n').encode() + data + f"\r\n--{b}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={b}"}


def upload_form(data: bytes, name="a.png", **fields) -> FormData:
    form = FormData()
    form.add_field("image", data, filename=name, content_type="image/png")
    for k, v in fields.items():
        form.add_field(k, v)
    return form


# --- prompts, queue, history ------------------------------------------------------------------

def test_server_post_prompt_success_shape_and_history_entry(env):
    async def body(c):
        status, resp = await post_prompt(c, diamond(), client_id="me", extra_data={
            "extra_pnginfo": {"workflow": {"x": 1}}, "api_key_comfy_org": "secret"})
        assert status == 200 and set(resp) == {"prompt_id", "number", "node_errors"}
        assert resp["number"] == 0 and resp["node_errors"] == {}
        entry = await wait_history(c, resp["prompt_id"])
        assert set(entry) == {"prompt", "outputs", "meta", "status"}
        number, pid, prompt, extra, outputs = entry["prompt"]
        assert (number, pid, prompt, outputs) == (0, resp["prompt_id"], diamond(), ["5"])
        assert extra == {"extra_pnginfo": {"workflow": {"x": 1}}, "client_id": "me"}
        assert entry["outputs"] == {"5": {"text": ["16"]}}
        assert entry["meta"]["5"] == {"node_id": "5", "display_node": "5", "parent_node": None,
                                      "real_node_id": "5"}
        assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
        assert [m[0] for m in entry["status"]["messages"]] == [
            "execution_start", "execution_cached", "execution_success"]
        assert await (await c.get("/prompt")).json() == {"exec_info": {"queue_remaining": 0}}
        assert (await post_prompt(c, diamond()))[1]["number"] == 1
    run(body, env)


def test_server_post_prompt_validation_errors_are_comfyui_400(env):
    async def body(c):
        status, resp = await post_prompt(c, diamond(factor=1000))
        assert status == 400
        assert resp["error"]["type"] == "prompt_outputs_failed_validation"
        assert resp["error"]["message"] == "Prompt outputs failed validation"
        err = resp["node_errors"]["3"]
        assert err["class_type"] == "Mul" and err["dependent_outputs"] == ["5"]
        assert err["errors"][0]["type"] == "value_bigger_than_max"
        assert err["errors"][0]["extra_info"]["input_name"] == "factor"
        status, resp = await post_prompt(c, {"1": call("Nope")})
        assert status == 400 and resp["error"]["type"] == "invalid_prompt"
        r = await c.post("/prompt", json={"client_id": "x"})
        assert r.status == 400 and await r.json() == {
            "error": {"type": "no_prompt", "message": "No prompt provided",
                      "details": "No prompt provided", "extra_info": {}}, "node_errors": {}}
        r = await c.post("/prompt", data=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_prompt"
    run(body, env)


def test_server_failing_prompt_keeps_worker_alive(env):
    async def body(c):
        bad = {"1": call("Const", value=1), "2": call("Fail", x=link(1), message="kaboom"),
               "3": call("Show", value=link(2))}
        _, r1 = await post_prompt(c, bad)
        # An envelope prompt that passes validation and fails in a node. (A bad precision spec
        # no longer gets this far: POST /prompt rejects it, as `mixgraph validate` does.)
        status, rejected = await post_prompt(c, {"format": "mixgraph/1", "prompt": diamond(),
                                                 "precision": {"default": "f99"}})
        assert status == 400 and rejected["error"]["type"] == "invalid_precision"
        envelope = {"format": "mixgraph/1", "prompt": bad, "precision": {"default": "f32"}}
        _, r2 = await post_prompt(c, envelope)
        _, r3 = await post_prompt(c, diamond(factor=9))
        e1 = await wait_history(c, r1["prompt_id"])
        assert e1["status"]["status_str"] == "error" and e1["status"]["completed"] is False
        err = dict(e1["status"]["messages"])["execution_error"]
        assert err["node_id"] == "2" and err["node_type"] == "Fail"
        assert "kaboom" in err["exception_message"]
        e2 = await wait_history(c, r2["prompt_id"])
        assert e2["status"]["status_str"] == "error" and e2["prompt"][2] == bad  # API form
        assert "execution_error" in dict(e2["status"]["messages"])
        e3 = await wait_history(c, r3["prompt_id"])
        assert e3["status"]["status_str"] == "success" and e3["outputs"]["5"] == {"text": ["24"]}
    run(body, env)


def test_server_queue_front_delete_clear_and_interrupt(env):
    SPIN_STARTED.clear()

    async def body(c):
        _, spin = await post_prompt(c, spin_prompt(limit=10**6))
        await wait_running(c)
        ids = [(await post_prompt(c, diamond(f), **kw))[1] for f, kw in
               [(1, {}), (2, {}), (3, {"front": True})]]
        q = await (await c.get("/queue")).json()
        assert [item[1] for item in q["queue_running"]] == [spin["prompt_id"]]
        assert [item[1] for item in q["queue_pending"]] == [ids[2]["prompt_id"], ids[0]["prompt_id"],
                                                            ids[1]["prompt_id"]]
        assert ids[2]["number"] < 0 and len(q["queue_pending"][0]) == 5
        assert (await (await c.get("/prompt")).json())["exec_info"]["queue_remaining"] == 4
        assert (await c.post("/queue", json={"delete": [ids[0]["prompt_id"]]})).status == 200
        q = await (await c.get("/queue")).json()
        assert [item[1] for item in q["queue_pending"]] == [ids[2]["prompt_id"], ids[1]["prompt_id"]]
        await c.post("/queue", json={"clear": True})
        assert (await (await c.get("/queue")).json())["queue_pending"] == []
        # An interrupt naming another prompt does nothing; a bare one stops the running prompt.
        await c.post("/interrupt", json={"prompt_id": "someone-else"})
        await asyncio.sleep(0.05)
        assert (await (await c.get("/queue")).json())["queue_running"]
        assert (await c.post("/interrupt")).status == 200
        entry = await wait_history(c, spin["prompt_id"])      # else it would spin for hours
        assert entry["status"]["status_str"] == "error"
        interrupted = dict(entry["status"]["messages"])["execution_interrupted"]
        assert interrupted["node_id"] == "2" and interrupted["node_type"] == "Spin"
        _, after = await post_prompt(c, diamond(7))           # the queue keeps going
        assert (await wait_history(c, after["prompt_id"]))["status"]["status_str"] == "success"
    run(body, env)


def test_server_history_paging_delete_and_clear(env):
    async def body(c):
        ids = []
        for f in (1, 2, 3):
            ids.append((await post_prompt(c, diamond(f)))[1]["prompt_id"])
            await wait_history(c, ids[-1])
        assert list(await (await c.get("/history")).json()) == ids
        assert list(await (await c.get("/history?max_items=2")).json()) == ids[1:]
        assert list(await (await c.get("/history?max_items=1&offset=0")).json()) == ids[:1]
        assert await (await c.get("/history/unknown")).json() == {}
        await c.post("/history", json={"delete": [ids[0]]})
        assert list(await (await c.get("/history")).json()) == ids[1:]
        await c.post("/history", json={"clear": True})
        assert await (await c.get("/history")).json() == {}
    run(body, env)


def test_server_free_clears_cache_and_unloads(env):
    unloaded = []
    ex = Executor(REG, env, OutputCache(2**24))

    async def body(c):
        _, r = await post_prompt(c, diamond())
        await wait_history(c, r["prompt_id"])
        assert len(ex.cache) == 5
        assert (await c.post("/free", json={"unload_models": True})).status == 200
        for _ in range(500):
            if unloaded:
                break
            await asyncio.sleep(0.01)
        assert unloaded == [1] and len(ex.cache) == 5
        await c.post("/free", json={"free_memory": True})
        for _ in range(500):
            if len(ex.cache) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(ex.cache) == 0 and unloaded == [1, 1]
    run(body, env, executor=ex, unload_hooks=(lambda: unloaded.append(1),))


# --- WebSocket ----------------------------------------------------------------------------------

async def ws_until_done(ws, prompt_id, timeout=10.0):
    msgs = []
    while True:
        msg = await asyncio.wait_for(ws.receive_json(), timeout)
        msgs.append(msg)
        if msg["type"] == "executing" and msg["data"]["node"] is None \
                and msg["data"]["prompt_id"] == prompt_id:
            return msgs


def test_server_ws_message_sequence_for_a_run(env):
    async def body(c):
        ws = await c.ws_connect("/ws?clientId=abc")
        first = await ws.receive_json()
        assert first == {"type": "status",
                         "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "abc"}}
        _, r = await post_prompt(c, diamond(), client_id="abc")
        pid = r["prompt_id"]
        everything = await ws_until_done(ws, pid)
        msgs = [m for m in everything if m["type"] not in ("status", "progress_state")]
        kinds = [(m["type"], m["data"].get("node")) for m in msgs]
        assert kinds == [("execution_start", None), ("execution_cached", None),
                         ("executing", "1"), ("executing", "2"), ("executing", "3"),
                         ("executing", "4"), ("executing", "5"), ("executed", "5"),
                         ("execution_success", None), ("executing", None)]
        assert msgs[1]["data"]["nodes"] == [] and msgs[1]["data"]["prompt_id"] == pid
        assert msgs[7]["data"] == {"node": "5", "display_node": "5", "output": {"text": ["16"]},
                                   "prompt_id": pid}
        assert msgs[2]["data"] == {"node": "1", "display_node": "1", "prompt_id": pid}
        # today's editor's progress_state: each node running before its `executing`, finished
        # once the next starts (or after its `executed`), every started node in each message
        states = [(m["type"], m["data"].get("node")) if m["type"] != "progress_state" else
                  ("state", {n: s["state"] for n, s in m["data"]["nodes"].items()})
                  for m in everything if m["type"] != "status"]
        assert states[2:6] == [("state", {"1": "running"}), ("executing", "1"),
                               ("state", {"1": "finished", "2": "running"}), ("executing", "2")]
        assert states[-4:-1] == [("executed", "5"), ("state", {str(i): "finished" for i in range(1, 6)}),
                                 ("execution_success", None)]
        one = next(m for m in everything if m["type"] == "progress_state")["data"]
        assert one == {"prompt_id": pid, "nodes": {"1": {
            "value": 0.0, "max": 1.0, "state": "running", "node_id": "1", "prompt_id": pid,
            "display_node_id": "1", "parent_node_id": None, "real_node_id": "1"}}}
        # Run again: everything cached, the output node still reports its UI output.
        _, r = await post_prompt(c, diamond(), client_id="abc")
        msgs = [m for m in await ws_until_done(ws, r["prompt_id"]) if m["type"] != "status"]
        assert [m["type"] for m in msgs] == ["execution_start", "execution_cached", "executed",
                                             "progress_state", "execution_success", "executing"]
        assert msgs[3]["data"]["nodes"]["5"]["state"] == "finished"
        msgs = [m for m in msgs if m["type"] != "progress_state"]
        assert sorted(msgs[1]["data"]["nodes"]) == ["1", "2", "3", "4", "5"]
        # Feature flags are answered.
        await ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        reply = await ws.receive_json()
        while reply["type"] == "status":                 # the queue's broadcasts after the run
            reply = await ws.receive_json()
        assert reply["type"] == "feature_flags" and reply["data"]["supports_preview_metadata"] is True
        await ws.close()
    run(body, env)


def test_server_ws_progress_and_per_client_delivery(env):
    async def body(c):
        mine = await c.ws_connect("/ws?clientId=mine")
        other = await c.ws_connect("/ws?clientId=other")
        await mine.receive_json(), await other.receive_json()
        prompt = {"1": call("Const", value=3), "2": call("Slow", x=link(1), steps=3),
                  "3": call("Show", value=link(2))}
        _, r = await post_prompt(c, prompt, client_id="mine")
        msgs = await ws_until_done(mine, r["prompt_id"])
        progress = [m["data"] for m in msgs if m["type"] == "progress"]
        assert progress == [{"value": i, "max": 3, "prompt_id": r["prompt_id"], "node": "2"}
                            for i in (1, 2, 3)]
        await asyncio.sleep(0.05)
        seen = []
        while True:
            try:
                seen.append((await asyncio.wait_for(other.receive_json(), 0.05))["type"])
            except asyncio.TimeoutError:
                break
        assert seen and set(seen) == {"status"}       # only the broadcasts reach the other client
        await mine.close(), await other.close()
    run(body, env)


def test_server_ws_preview_frames_with_and_without_metadata(env):
    async def frames(ws, prompt_id):
        out = []
        while True:
            msg = await asyncio.wait_for(ws.receive(), 10)
            if msg.type == WSMsgType.BINARY:
                out.append(msg.data)
            elif msg.type == WSMsgType.TEXT:
                data = json.loads(msg.data)
                if data["type"] == "executing" and data["data"]["node"] is None:
                    return out

    async def body(c):
        rich = await c.ws_connect("/ws?clientId=rich")
        await rich.receive_json()
        await rich.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        assert (await rich.receive_json())["type"] == "feature_flags"
        prompt = {"1": call("Const", value=1), "2": call("Preview", x=link(1)),
                  "3": call("Show", value=link(2))}
        _, r = await post_prompt(c, prompt, client_id="rich")
        [frame] = await frames(rich, r["prompt_id"])
        assert int.from_bytes(frame[:4], "big") == 4
        n = int.from_bytes(frame[4:8], "big")
        meta = json.loads(frame[8:8 + n])
        assert meta == {"node_id": "2", "prompt_id": r["prompt_id"], "display_node_id": "2",
                        "parent_node_id": None, "real_node_id": "2", "image_type": "image/jpeg"}
        with Image.open(io.BytesIO(frame[8 + n:])) as im:
            assert im.format == "JPEG" and im.size == (8, 8)
        plain = await c.ws_connect("/ws?clientId=plain")
        await plain.receive_json()
        prompt["1"] = call("Const", value=2)          # not cached: the preview is sent again
        _, r = await post_prompt(c, prompt, client_id="plain")
        [frame] = await frames(plain, r["prompt_id"])
        assert frame[:8] == (1).to_bytes(4, "big") + (1).to_bytes(4, "big")   # PREVIEW_IMAGE, JPEG
        assert frame[8:11] == b"\xff\xd8\xff"
        await rich.close(), await plain.close()
    run(body, env)


# --- files --------------------------------------------------------------------------------------

def test_server_view_serves_files_and_refuses_escapes(env, tmp_path):
    (env.output / "sub").mkdir()
    (env.output / "sub" / "img.png").write_bytes(png_bytes())
    (env.output / "page.html").write_text("<script>alert(1)</script>")
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", env.output / "link.txt")

    async def body(c):
        r = await c.get("/view", params={"filename": "img.png", "subfolder": "sub", "type": "output"})
        assert r.status == 200 and r.headers["Content-Type"] == "image/png"
        assert await r.read() == png_bytes()
        r = await c.get("/view", params={"filename": "page.html"})
        assert r.status == 200 and r.headers["Content-Type"] == "application/octet-stream"
        r = await c.get("/view", params={"filename": "img.png", "subfolder": "sub", "channel": "rgb",
                                         "preview": "jpeg;80"})
        assert r.headers["Content-Type"] == "image/jpeg"
        for params in ({"filename": "../secret.txt"}, {"filename": "secret.txt", "subfolder": ".."},
                       {"filename": str(tmp_path / "secret.txt")}, {"filename": "link.txt"},
                       {"filename": "..\\secret.txt"}):
            r = await c.get("/view", params=params)
            assert r.status == 403, params
        assert (await c.get("/view", params={"filename": "nope.png"})).status == 404
        assert (await c.get("/view", params={"filename": "img.png", "type": "etc"})).status == 400
    run(body, env)


def test_server_upload_image_naming_and_refusals(env):
    async def body(c):
        r = await c.post("/upload/image", data=upload_form(png_bytes()))
        assert r.status == 200 and await r.json() == {"name": "a.png", "subfolder": "", "type": "input"}
        r = await c.post("/upload/image", data=upload_form(png_bytes()))
        assert (await r.json())["name"] == "a.png"                     # byte-identical: reused
        r = await c.post("/upload/image", data=upload_form(png_bytes(color=(0, 0, 255))))
        assert (await r.json())["name"] == "a (1).png"
        assert (env.input / "a (1).png").read_bytes() == png_bytes(color=(0, 0, 255))
        r = await c.post("/upload/image", data=upload_form(png_bytes(color=(0, 9, 0)),
                                                          overwrite="true", subfolder="s"))
        assert await r.json() == {"name": "a.png", "subfolder": "s", "type": "input"}
        r = await c.post("/upload/image", data=upload_form(b"not an image at all", "x.png"))
        assert r.status == 400 and not (env.input / "x.png").exists()
        for name in ("../evil.png", "/tmp/evil.png", "sub/../../evil.png"):
            data, headers = raw_upload(png_bytes(), name)
            r = await c.post("/upload/image", data=data, headers=headers)
            assert r.status == 403, name
        assert not (env.input.parent / "evil.png").exists()
        r = await c.post("/upload/image", data=upload_form(png_bytes(), subfolder="../../x"))
        assert r.status == 403
        big = png_bytes(size=(64, 64), mode="RGB")
        big = big + b"\0" * (5000 - len(big))          # trailing bytes keep it a PNG, > limit
        r = await c.post("/upload/image", data=upload_form(big, "big.png"))
        assert r.status == 413 and not (env.input / "big.png").exists()
    run(body, env, max_upload=4000)


def test_server_upload_mask_merges_alpha_into_original(env):
    Image.new("RGB", (4, 4), (10, 20, 30)).save(env.input / "orig.png")
    mask = Image.new("RGBA", (4, 4), (0, 0, 0, 255))
    mask.putpixel((1, 2), (0, 0, 0, 0))
    buf = io.BytesIO()
    mask.save(buf, format="PNG")

    async def body(c):
        ref = json.dumps({"filename": "orig.png", "subfolder": "", "type": "input"})
        r = await c.post("/upload/mask", data=upload_form(buf.getvalue(), "clipspace-mask.png",
                                                          original_ref=ref))
        assert r.status == 200
        out = await r.json()
        assert out == {"name": "clipspace-mask.png", "subfolder": "", "type": "input"}
        with Image.open(env.input / out["name"]) as im:
            assert im.mode == "RGBA"
            assert im.getpixel((0, 0)) == (10, 20, 30, 255) and im.getpixel((1, 2)) == (10, 20, 30, 0)
        bad = json.dumps({"filename": "../../etc/passwd", "type": "input"})
        r = await c.post("/upload/mask", data=upload_form(buf.getvalue(), "m.png", original_ref=bad))
        assert r.status == 403
    run(body, env)


def test_security_safe_path_rules(tmp_path):
    assert safe_path(tmp_path, "a.png", "x/y") == tmp_path / "x" / "y" / "a.png"
    for name, sub in (("../a", ""), ("a", "../b"), ("/etc/passwd", ""), ("C:\\x", ""), ("a\x00", ""),
                      ("", "")):
        with pytest.raises(SecurityError):
            safe_path(tmp_path, name, sub)


# --- catalogue and system -------------------------------------------------------------------------

def test_server_object_info_system_and_model_listings(env):
    (env.models[0] / "checkpoints" / "sub").mkdir()
    (env.models[0] / "checkpoints" / "sub" / "m.safetensors").write_bytes(b"")
    (env.models[0] / "embeddings" / "easyneg.safetensors").write_bytes(b"")
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(env.models[0] / "checkpoints" / "t.safetensors"),
              metadata={"ss_network_dim": "4"})

    async def body(c):
        info = await (await c.get("/object_info")).json()
        assert list(info) == REG.names()
        mul = await (await c.get("/object_info/Mul")).json()
        assert list(mul) == ["Mul"] and mul["Mul"]["input"]["required"]["factor"][0] == "INT"
        assert mul["Mul"]["output"] == ["INT"] and mul["Mul"]["output_node"] is False
        assert await (await c.get("/object_info/Nope")).json() == {}
        stats = await (await c.get("/system_stats")).json()
        assert {"os", "ram_total", "ram_free", "comfyui_version", "required_frontend_version",
                "installed_templates_version", "required_templates_version", "python_version",
                "pytorch_version", "embedded_python", "argv"} <= set(stats["system"])
        assert {"name", "type", "index", "vram_total", "vram_free", "torch_vram_total",
                "torch_vram_free"} <= set(stats["devices"][0])
        assert await (await c.get("/embeddings")).json() == ["easyneg"]
        folders = await (await c.get("/models")).json()
        assert "checkpoints" in folders and "loras" in folders
        assert await (await c.get("/models/checkpoints")).json() == [  # + the embedded model
            "mixgraph-shapes.safetensors", "sub/m.safetensors", "t.safetensors"]
        r = await c.get("/view_metadata/checkpoints", params={"filename": "t.safetensors"})
        assert await r.json() == {"ss_network_dim": "4"}
        r = await c.get("/view_metadata/checkpoints", params={"filename": "../../in/t.safetensors"})
        assert r.status == 404
        assert (await c.get("/models/bogus")).status == 404
        assert await (await c.get("/features")).json() == {"supports_preview_metadata": True,
                                                           "supports_progress_text_metadata": True,
                                                           "max_upload_size": 50 * 1024 * 1024}
        assert isinstance(await (await c.get("/extensions")).json(), list)
    run(body, env)


def test_server_every_route_also_under_api(env):
    async def body(c):
        for path in ("/prompt", "/queue", "/history", "/history/x", "/object_info",
                     "/object_info/Mul", "/system_stats", "/embeddings", "/models",
                     "/models/checkpoints", "/features", "/extensions", "/users", "/settings",
                     "/i18n", "/workflow_templates"):
            plain, api = await c.get(path), await c.get("/api" + path)
            assert plain.status == api.status == 200, path
            if path != "/system_stats":
                assert await plain.json() == await api.json(), path
        for path in ("/interrupt", "/free", "/queue", "/history"):
            assert (await c.post("/api" + path, json={})).status == 200
        status, _ = await post_prompt(c, {})                  # no output: 400 on both
        r = await c.post("/api/prompt", json={"prompt": {}})
        assert status == r.status == 400
        ws = await c.ws_connect("/api/ws?clientId=z")
        assert (await ws.receive_json())["data"]["sid"] == "z"
        await ws.close()
    run(body, env)


# --- safety -----------------------------------------------------------------------------------

def test_server_foreign_origin_cannot_change_state(env):
    async def body(c):
        port = c.server.port
        evil = {"Origin": "http://evil.example"}
        r = await c.post("/prompt", json={"prompt": diamond()}, headers=evil)
        assert r.status == 403 and await (await c.get("/queue")).json() == {
            "queue_running": [], "queue_pending": []}
        assert (await c.post("/interrupt", headers={"Origin": f"http://127.0.0.1:{port + 1}"})).status == 403
        assert (await c.post("/free", headers={"Origin": "null"})).status == 403
        assert (await c.get("/prompt", headers=evil)).status == 200      # reads are not state changes
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            assert (await c.post("/interrupt", headers={"Origin": origin})).status == 200
        with pytest.raises(WSServerHandshakeError):
            await c.ws_connect("/ws", headers=evil)
        # DNS rebinding: a foreign Host name on a loopback-bound server is refused.
        assert (await c.get("/prompt", headers={"Host": f"evil.example:{port}"})).status == 403
    run(body, env)


def test_server_non_loopback_bind_requires_token(env, capsys):
    with pytest.raises(SecurityError, match="--token"):
        create_app(env, registry=REG, host="0.0.0.0")
    create_app(env, registry=REG, host="0.0.0.0", token="t")
    create_app(env, registry=REG, host="192.168.1.5", insecure=True)
    assert serve(host="0.0.0.0", port=0) == 2
    from mixgraph.ui.cli import main
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--token" in capsys.readouterr().err


def test_server_token_enforced(env):
    async def body(c):
        assert (await c.get("/prompt")).status == 401
        assert (await c.get("/prompt", headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await c.get("/prompt", headers={"Authorization": "Bearer s3cret"})).status == 200
        r = await c.get("/", params={"token": "s3cret"})
        assert r.status == 200
        assert (await c.get("/prompt")).status == 200                  # the cookie from ?token=
        c.session.cookie_jar.clear()
        assert (await c.post("/interrupt")).status == 401
        with pytest.raises(WSServerHandshakeError):
            await c.ws_connect("/ws")
        ws = await c.ws_connect("/ws?clientId=q&token=s3cret")
        assert (await ws.receive_json())["type"] == "status"
        await ws.close()
    run(body, env, token="s3cret")


# --- the editor's startup endpoints -------------------------------------------------------------

def test_server_frontend_endpoints_and_user_data(env):
    async def body(c):
        r = await c.get("/")
        # the editor when comfyui-frontend-package is installed, else a page saying how to get it
        help_page = "pip install comfyui-frontend-package" in await r.text()
        assert r.status == 200 and help_page == (frontend_root() is None)
        assert "no-cache" in r.headers["Cache-Control"]
        assert await (await c.get("/api/users")).json() == {"storage": "server", "migrated": True}
        assert await (await c.get("/api/i18n")).json() == {}
        assert await (await c.get("/api/workflow_templates")).json() == {}
        assert (await c.post("/api/settings", json={"Comfy.A": 1, "Comfy.B": "x"})).status == 200
        assert (await c.post("/api/settings/Comfy.A", json=2)).status == 200
        assert await (await c.get("/api/settings")).json() == {"Comfy.A": 2, "Comfy.B": "x"}
        assert await (await c.get("/api/settings/Comfy.B")).json() == "x"
        assert await (await c.get("/api/settings/none")).json() is None
        r = await c.post("/api/userdata/workflows%2Fa.json", data=b'{"n": 1}')
        assert r.status == 200 and await r.json() == "workflows/a.json"
        r = await c.post("/api/userdata/workflows%2Fa.json?overwrite=false", data=b"{}")
        assert r.status == 409
        assert await (await c.get("/api/userdata?dir=workflows")).json() == ["a.json"]
        full = await (await c.get("/api/userdata?dir=workflows&full_info=true")).json()
        assert full[0]["path"] == "a.json" and full[0]["size"] == 8
        assert await (await c.get("/api/userdata/workflows%2Fa.json")).read() == b'{"n": 1}'
        r = await c.post("/api/userdata/workflows%2Fa.json/move/workflows%2Fb.json")
        assert await r.json() == "workflows/b.json"
        assert (await c.get("/api/userdata?dir=nothing")).status == 404
        assert (await c.get("/api/userdata/..%2F..%2Fin%2Fx")).status == 403
        assert (await c.post("/api/userdata/..%2Fescape.json", data=b"{}")).status == 403
        assert (await c.delete("/api/userdata/workflows%2Fb.json")).status == 204
        assert await (await c.get("/api/userdata?dir=workflows")).json() == []
    run(body, env)
