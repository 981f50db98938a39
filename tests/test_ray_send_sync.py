"""What custom node packs send with `PromptServer.instance.send_sync` (ui/comfy/client_messages.py):
framed as ComfyUI frames it (JSON to the prompt's client or to everyone, binary frames, encoded
preview images, progress text), from a pack running in the server process and from one running
on a Ray worker (tests/conftest.py's session cluster), where the messages reach the front's
clients in order with the prompt's own events."""

from __future__ import annotations

import asyncio
import io
import json
import struct

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from mixgraph.graph.env import Env
from mixgraph.ui.comfy import client_messages, custom_nodes
from mixgraph.ui.ray.ray_pool import RayConfig
from mixgraph.ui.server.server import create_app
from tests.test_custom_nodes import PACKS, fresh_registry
from tests.test_server import post_prompt

PROMPT = {"1": {"class_type": "MgAppendText", "inputs": {"text": "hi", "suffix": "!"}},
          "2": {"class_type": "MgSendMessages", "inputs": {"text": ["1", 0]}}}


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp", "models/checkpoints"):
        (tmp_path / d).mkdir(parents=True)
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


async def until_done(ws, prompt_id: str, timeout: float = 120.0) -> list:
    """Every message (text as dicts, binary as bytes) until `prompt_id`'s `executing null`."""
    out = []
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout)
        if msg.type == aiohttp.WSMsgType.BINARY:
            out.append(msg.data)
            continue
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        m = json.loads(msg.data)
        out.append(m)
        if m["type"] == "executing" and m["data"]["node"] is None \
                and m["data"]["prompt_id"] == prompt_id:
            return out


async def drain_text(ws, timeout: float = 0.5) -> list:
    """What else arrives at a bystander within `timeout` (text messages only)."""
    got = []
    try:
        while True:
            msg = await asyncio.wait_for(ws.receive(), timeout)
            if msg.type == aiohttp.WSMsgType.TEXT:
                got.append(json.loads(msg.data))
    except asyncio.TimeoutError:
        return got


def check_messages(msgs: list) -> None:
    """The pack's five messages, framed as ComfyUI frames them, between node 2's `executing` and
    its `executed`."""
    def where(pred):
        return next(i for i, m in enumerate(msgs) if pred(m))

    binary = [m for m in msgs if isinstance(m, bytes)]
    start = where(lambda m: isinstance(m, dict) and m["type"] == "executing"
                  and m["data"]["node"] == "2")
    done = where(lambda m: isinstance(m, dict) and m["type"] == "executed"
                 and m["data"]["node"] == "2")
    note = where(lambda m: isinstance(m, dict) and m["type"] == "mg.note")
    everyone = where(lambda m: isinstance(m, dict) and m["type"] == "mg.everyone")
    assert start < note < everyone < done
    assert msgs[note]["data"] == {"node": "2", "text": "hi!"}
    assert msgs[everyone]["data"] == {"text": "hi!"}
    assert len(binary) == 3
    assert all(start < msgs.index(b) < done for b in binary)
    own, preview, progress = binary
    assert own == struct.pack(">I", 77) + b"hi!"
    assert struct.unpack(">II", preview[:8]) == (client_messages.PREVIEW_IMAGE, 2)   # PNG
    with Image.open(io.BytesIO(preview[8:])) as im:
        assert im.format == "PNG" and im.size == (8, 4)      # 32x16 contained in max size 8
        assert im.convert("RGB").getpixel((3, 2)) == (255, 0, 0)
    assert progress == struct.pack(">II", client_messages.TEXT, 1) + b"2" + b"hi!"


async def submit_and_listen(c) -> tuple[list, list]:
    ws = await c.ws_connect("/ws?clientId=cn")
    other = await c.ws_connect("/ws?clientId=bystander")
    await ws.receive_json()
    await other.receive_json()
    status, r = await post_prompt(c, PROMPT, client_id="cn")
    assert status == 200, r
    msgs = await until_done(ws, r["prompt_id"])
    seen = await drain_text(other)
    await ws.close()
    await other.close()
    return msgs, seen


def test_client_messages_local_pack_frames_like_comfyui(env):
    reg = fresh_registry()
    report = custom_nodes.load_packs([PACKS], reg, env)

    async def main():
        app = create_app(env, registry=reg, user_dir=env.output.parent / "user",
                         custom_nodes=report)
        async with TestServer(app) as server, TestClient(server) as c:
            return await submit_and_listen(c)

    msgs, seen = asyncio.run(main())
    check_messages(msgs)
    # sid None is every client; the prompt's own events and sid'd messages are not theirs
    assert [m["data"] for m in seen if m["type"].startswith("mg.")] == [{"text": "hi!"}]
    assert not any(m["type"] in ("executing", "executed") for m in seen)


def test_client_messages_progress_text_carries_the_prompt_id_for_clients_that_ask(env):
    """Today's editor announces `supports_progress_text_metadata` and, when the server's flags
    say it too, reads the prompt id in front of the node id; other clients get the plain form."""
    reg = fresh_registry()
    report = custom_nodes.load_packs([PACKS], reg, env)

    async def main():
        app = create_app(env, registry=reg, user_dir=env.output.parent / "user",
                         custom_nodes=report)
        async with TestServer(app) as server, TestClient(server) as c:
            ws = await c.ws_connect("/ws?clientId=cn")
            await ws.receive_json()
            await ws.send_json({"type": "feature_flags", "data": {"supports_progress_text_metadata": True}})
            flags = await ws.receive_json()
            status, r = await post_prompt(c, PROMPT, client_id="cn")
            assert status == 200, r
            msgs = await until_done(ws, r["prompt_id"])
            await ws.close()
            return flags, r["prompt_id"], msgs

    flags, pid, msgs = asyncio.run(main())
    assert flags["type"] == "feature_flags" and flags["data"]["supports_progress_text_metadata"] is True
    text = [m for m in msgs if isinstance(m, bytes) and m[:4] == struct.pack(">I", client_messages.TEXT)]
    assert text == [struct.pack(">II", client_messages.TEXT, len(pid)) + pid.encode()
                    + struct.pack(">I", 1) + b"2" + b"hi!"]
    assert client_messages.progress_text("hi!", "2", pid) == text[0][4:]


def test_client_messages_normalize_is_idempotent_and_refuses_str_binary():
    image = Image.new("RGBA", (4, 4))
    once = client_messages.normalize(2, ("JPEG", image, None))
    assert once[0] == client_messages.PREVIEW_IMAGE and once[1][:4] == struct.pack(">I", 1)
    assert client_messages.normalize(*once) == once
    meta = client_messages.normalize(4, (("PNG", image, None), {"node_id": "5"}))
    size = struct.unpack(">I", meta[1][:4])[0]
    assert json.loads(meta[1][4:4 + size]) == {"node_id": "5", "image_type": "image/png"}
    assert client_messages.normalize("x", {"a": 1}) == ("x", {"a": 1})
    with pytest.raises(ValueError, match="int event type"):
        client_messages.normalize("x", b"raw")


def test_ray_send_sync_from_worker_reaches_websocket_in_order(env, tmp_path, ray_cluster):
    reg = fresh_registry()
    report = custom_nodes.load_packs([PACKS], reg, env)
    flags = {"custom_nodes": [str(PACKS)], "disable_all_custom_nodes": False,
             "base_directory": str(tmp_path), "extra_model_paths_config": None}

    async def main():
        app = create_app(env, registry=reg, user_dir=env.output.parent / "user",
                         custom_nodes=report, ray=RayConfig(workers=1, custom_nodes=flags))
        async with TestServer(app) as server, TestClient(server) as c:
            msgs, seen = await submit_and_listen(c)
            stats = await (await c.get("/system_stats")).json()
            return msgs, seen, stats

    msgs, seen, stats = asyncio.run(main())
    assert [w["prompts"] for w in stats["mixgraph_workers"]] == [1]    # it ran on the worker
    check_messages(msgs)
    assert [m["data"] for m in seen if m["type"].startswith("mg.")] == [{"text": "hi!"}]
