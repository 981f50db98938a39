"""Videos through the server: `/upload/image` stores a video in input/ (and refuses a file that only
claims to be one), LoadVideo's options list it, a prompt's `executed` message carries SaveVideo's ui
payload, and `/view` serves each saved kind with its content type."""

from __future__ import annotations

import asyncio
import contextlib
import io

import av
import torch
from aiohttp import FormData
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.env import Env
from mixgraph.nodes.helpers.video import files as video_files
from mixgraph.ui.server.server import create_app


@contextlib.asynccontextmanager
async def client(env: Env):
    app = create_app(env, user_dir=env.output.parent / "user")
    async with TestServer(app) as server, TestClient(server) as c:
        yield c


def make_env(tmp_path) -> Env:
    for d in ("in", "out", "temp", "models"):
        (tmp_path / d).mkdir()
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "temp")


def mp4_bytes(tmp_path, frames=5) -> bytes:
    images = torch.linspace(0, 1, frames).view(frames, 1, 1, 1).expand(frames, 16, 24, 3).contiguous()
    path = tmp_path / "src.mp4"
    video_files.create_video(images, 8.0, None).save_to(path)
    return path.read_bytes()


def form(data: bytes, name: str, content_type: str = "video/mp4") -> FormData:
    f = FormData()
    f.add_field("image", data, filename=name, content_type=content_type)
    return f


async def run_prompt(c, prompt: dict) -> tuple[str, list[dict]]:
    ws = await c.ws_connect("/ws?clientId=video")
    r = await c.post("/prompt", json={"prompt": prompt, "client_id": "video"})
    body = await r.json()
    assert r.status == 200, body
    pid, msgs = body["prompt_id"], []
    while True:
        msg = await asyncio.wait_for(ws.receive_json(), 120)
        msgs.append(msg)
        if msg["type"] == "execution_error":
            raise AssertionError(msg["data"])
        if msg["type"] == "executing" and msg["data"]["node"] is None and msg["data"]["prompt_id"] == pid:
            await ws.close()
            return pid, msgs


def test_video_server_upload_list_run_view(tmp_path):
    env = make_env(tmp_path)
    data = mp4_bytes(tmp_path)

    async def body(c):
        r = await c.post("/upload/image", data=form(data, "clip.mp4"))
        assert r.status == 200 and await r.json() == {"name": "clip.mp4", "subfolder": "", "type": "input"}
        assert (env.input / "clip.mp4").read_bytes() == data
        r = await c.post("/upload/image", data=form(b"GIF89a not really", "fake.mp4"))
        assert r.status == 400 and "not a readable video" in await r.text()
        assert not (env.input / "fake.mp4").exists()
        info = await (await c.get("/object_info/LoadVideo")).json()
        options, extra = info["LoadVideo"]["input"]["required"]["file"]
        assert options == ["clip.mp4"] and extra["video_upload"] is True

        prompt = {
            "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
            "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
            "3": {"class_type": "CreateVideo", "inputs": {"images": ["2", 0], "fps": ["2", 2]}},
            "4": {"class_type": "SaveVideo", "inputs": {"video": ["3", 0], "filename_prefix": "video/out",
                                                        "format": "auto", "codec": "auto"}},
            "5": {"class_type": "SaveWEBM", "inputs": {"images": ["2", 0], "filename_prefix": "w", "codec": "vp9",
                                                       "fps": 8.0, "crf": 32.0}},
            "6": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["2", 0], "filename_prefix": "a",
                                                               "fps": 8.0, "lossless": False, "quality": 80,
                                                               "method": "default"}},
            "7": {"class_type": "SaveAnimatedPNG", "inputs": {"images": ["2", 0], "filename_prefix": "p",
                                                              "fps": 8.0, "compress_level": 4}},
            "8": {"class_type": "SaveVideo", "inputs": {"video": ["1", 0], "filename_prefix": "copy",
                                                        "format": "auto", "codec": "auto"}},
        }
        pid, msgs = await run_prompt(c, prompt)
        executed = {m["data"]["node"]: m["data"] for m in msgs if m["type"] == "executed"}
        assert executed["4"] == {"node": "4", "display_node": "4", "prompt_id": pid, "output": {
            "images": [{"filename": "out_00001_.mp4", "subfolder": "video", "type": "output"}],
            "animated": [True]}}
        assert executed["5"]["output"]["images"][0]["filename"] == "w_00001_.webm"
        history = (await (await c.get(f"/history/{pid}")).json())[pid]
        assert history["outputs"]["4"] == executed["4"]["output"]

        for entry, ctype in ((executed["4"]["output"]["images"][0], "video/mp4"),
                             (executed["5"]["output"]["images"][0], "video/webm"),
                             (executed["6"]["output"]["images"][0], "image/webp"),
                             (executed["7"]["output"]["images"][0], "image/png"),
                             (executed["8"]["output"]["images"][0], "video/mp4")):
            r = await c.get("/view", params=entry)
            assert r.status == 200 and r.content_type == ctype, (entry, r.content_type)
            body = await r.read()
            assert body == (env.output / entry["subfolder"] / entry["filename"]).read_bytes()
        with av.open(io.BytesIO(body)) as copy:  # the packet copy of the upload
            assert copy.streams.video[0].average_rate == 8
            assert sum(1 for _ in copy.decode(video=0)) == 5
        r = await c.get("/view", params={"filename": "clip.mp4", "type": "input"})
        assert r.status == 200 and r.content_type == "video/mp4" and await r.read() == data

    async def main():
        async with client(env) as c:
            await body(c)
    asyncio.run(main())
