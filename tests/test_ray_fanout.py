"""Fan-out of list prompts (ComfyUI's OUTPUT_IS_LIST: several seeds into a KSampler, several
prompt strings into a CLIPTextEncode) over Ray workers, `ui/ray/ray_fanout.py`: the split itself in
one process (parts merge to the whole run: pixels, file names and counters, PNG chunks), the
prompts that must run whole and why, and end to end on the local Ray cluster of two workers
(tests/conftest.py's `ray_cluster`, one cluster for the session; one app per test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
from mixgraph.ui.ray import ray_fanout
from tests import list_nodes
from tests.test_editor_browser import txt2img
from tests.test_server import post_prompt, wait_history


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp"):
        (tmp_path / d).mkdir()
    write_sd15_checkpoint(tmp_path / "models" / "checkpoints" / "a.safetensors", "tiny", seed=0)
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


# RebatchLatents' V3 widgets (required in ComfyUI's schema, so an API prompt names them)
REBATCH = {"dimension": "b", "overlap": 0, "merge_overlap_mode": "truncate start"}


def seed_list(seeds: str, steps: int = 2) -> dict:
    """txt2img with KSampler's seed from a SeedList (node 10): one image per seed."""
    p = txt2img("a.safetensors")
    p["10"] = {"class_type": "SeedList", "inputs": {"seeds": seeds}}
    p["3"]["inputs"].update(seed=["10", 0], steps=steps)
    return p


def prompt_list(texts: list[str]) -> dict:
    """txt2img with the positive prompt from a PromptList (node 10): one image per line."""
    p = txt2img("a.safetensors")
    p["10"] = {"class_type": "PromptList", "inputs": {"texts": "\n".join(texts)}}
    p["6"]["inputs"]["text"] = ["10", 0]
    return p


def pixels(env, images: list[dict]) -> list[np.ndarray]:
    out = []
    for im in images:
        with Image.open(env.output / im["subfolder"] / im["filename"]) as f:
            out.append(np.asarray(f.convert("RGB"), dtype=np.int16))
    return out


def png_prompt(env, image: dict) -> str:
    with Image.open(env.output / image["subfolder"] / image["filename"]) as f:
        return f.text["prompt"]


def assert_same_images(env, ref: list[dict], got: list[dict], tol: int = 0) -> None:
    a, b = pixels(env, ref), pixels(env, got)
    assert len(a) == len(b) >= 2
    for x, y in zip(a, b):
        assert abs(x - y).max() <= tol
    assert any(abs(a[0] - x).max() > 10 for x in a[1:])       # the items differ from each other


# --- the split, in one process -----------------------------------------------------------------

def test_fanout_list_parts_merge_to_the_whole_run(env):
    reg = list_nodes.registry()
    ray_fanout.add_nodes(reg)
    ex = Executor(reg, env)
    for prompt, parts in ((seed_list("11,12,13,14,15"), 3), (prompt_list(["a fox", "a cat"]), 3)):
        wf = load_workflow(prompt, reg)
        whole = ex.run(wf, prompt_id="whole").ui["9"]["images"]
        split, why = ray_fanout.plan(wf, ["9"], parts, reg, "p-1")
        assert isinstance(split, ray_fanout.ListSplit) and why == "" and split.count == parts
        uis = [ex.run(split.part(j), targets=["9"], prompt_id="p-1").ui for j in range(parts)]
        ui, notes, problem = split.gather(uis, env, ["w0", "w1", "w2"])
        n = len(whole)
        assert problem == "" and list(ui) == ["9"]
        # contiguous items in list order; a part beyond the list's length runs nothing
        sizes = [n // parts + (j < n % parts) for j in range(parts)]
        starts = [sum(sizes[:j]) for j in range(parts)]
        assert notes == [{"worker": f"w{j}", "items": [a, a + s], "of": n}
                         for j, (a, s) in enumerate(zip(starts, sizes))]
        got = ui["9"]["images"]
        assert_same_images(env, whole, got)
        # the names and counters one machine gives the next run, and the prompt as submitted
        first = int(whole[-1]["filename"].split("_")[1]) + 1
        assert [im["filename"] for im in got] == [f"editor_{first + i:05}_.png" for i in range(n)]
        assert {png_prompt(env, im) for im in got} == {png_prompt(env, whole[0])}
    assert not [f for f in os.listdir(env.output) if "mgfan" in f]


def _why(prompt: dict, outputs=("9",), parts: int = 2) -> str:
    reg = list_nodes.registry()
    split, why = ray_fanout.plan(load_workflow(prompt, reg), list(outputs), parts, reg, "p")
    assert split is None
    return why


def test_fanout_list_prompts_that_cannot_split_say_why():
    rebatch = seed_list("1,2,3")
    rebatch["11"] = {"class_type": "RebatchLatents", "inputs": {"latents": ["3", 0],
                                                                "batch_size": 3, **REBATCH}}
    rebatch["8"]["inputs"]["samples"] = ["11", 0]
    assert _why(rebatch) == "node 11 (RebatchLatents) takes the whole list at once (INPUT_IS_LIST)"
    two = seed_list("1,2")
    two["12"] = {"class_type": "PromptList", "inputs": {"texts": "a\nb"}}
    two["6"]["inputs"]["text"] = ["12", 0]
    assert _why(two).startswith("several lists (node 10 (SeedList), node 12 (PromptList)")
    other = seed_list("1,2")
    other["13"] = {"class_type": "SaveImage", "inputs": {"filename_prefix": "x",
                                                         "images": ["14", 0]}}
    other["14"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["4", 2]}}
    assert _why(other, ("9", "13")) == "output node 13 (SaveImage) does not depend on the list"
    latent = seed_list("1,2")
    latent["9"] = {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0],
                                                          "filename_prefix": "l"}}
    assert "output node 9 (SaveLatent) is not one whose results" in _why(latent)
    noisy = prompt_list(["a", "b"])
    noisy["15"] = {"class_type": "RandomSeed", "inputs": {}}
    noisy["3"]["inputs"]["seed"] = ["15", 0]
    assert _why(noisy) == ("node 15 (RandomSeed) is not deterministic: each worker would compute "
                           "its own value")
    assert _why(seed_list("1,2"), parts=1) == "1 free worker(s): nothing to split over"
    plain = txt2img("a.safetensors")
    reg = list_nodes.registry()
    assert ray_fanout.split_list(load_workflow(plain, reg), ["9"], 2, reg, "p") == (None, "")


# --- on Ray ---------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def ray_client(env):
    from mixgraph.ui.ray.ray_pool import RayConfig
    from mixgraph.ui.server.server import create_app
    app = create_app(env, registry=list_nodes.registry(), user_dir=env.output.parent / "user",
                     ray=RayConfig(workers=2, registry=list_nodes.registry))
    async with TestServer(app) as server, TestClient(server) as c:
        # A prompt splits only over the workers ready when it starts: on a loaded machine the
        # second worker may still be starting, so wait for both (generous deadline).
        deadline = time.monotonic() + 300
        while True:
            ws = (await (await c.get("/system_stats")).json())["mixgraph_workers"]
            if len(ws) == 2 and all(w["state"] == "ready" and w["running"] is None for w in ws):
                break
            assert time.monotonic() < deadline, f"the two Ray workers did not start: {ws}"
            await asyncio.sleep(0.1)
        yield c


async def run_listening(c, ws, prompt: dict, **extra) -> tuple[dict, list[dict]]:
    """Post a prompt, collect its WebSocket messages until it ends; its history entry."""
    _, r = await post_prompt(c, prompt, client_id="me", extra_data=extra)
    pid, msgs = r["prompt_id"], []
    while not (msgs and msgs[-1]["type"] == "executing" and msgs[-1]["data"]["node"] is None):
        m = await asyncio.wait_for(ws.receive_json(), 240)
        if m["data"].get("prompt_id") == pid:
            msgs.append(m)
    return await wait_history(c, pid, timeout=60), msgs


def test_ray_fan_out_seed_and_prompt_lists_over_2_workers_equal_one_worker(env, ray_cluster):
    seeds = seed_list("21,22,23,24,25,26,27,28")
    texts = prompt_list(["a red fox", "a blue bird", "a green cat"])
    rebatch = seed_list("21,22,23,24")
    rebatch["11"] = {"class_type": "RebatchLatents", "inputs": {"latents": ["3", 0],
                                                                "batch_size": 4, **REBATCH}}
    rebatch["8"]["inputs"]["samples"] = ["11", 0]

    async def main():
        async with ray_client(env) as c:
            ws = await c.ws_connect("/ws?clientId=me")
            out = {}
            for name, p in (("seeds", seeds), ("texts", texts)):
                out[name] = (await run_listening(c, ws, p),
                             await run_listening(c, ws, p, mixgraph_fan_out=True))
            out["rebatch"] = await run_listening(c, ws, rebatch, mixgraph_fan_out=True)
            await ws.close()
        return out

    out = asyncio.run(main())
    for name, n, sizes in (("seeds", 8, [[0, 4], [4, 8]]), ("texts", 3, [[0, 2], [2, 3]])):
        (whole, whole_msgs), (split, msgs) = out[name]
        assert whole["status"]["status_str"] == split["status"]["status_str"] == "success"
        parts = split["status"]["mixgraph"]["fan_out"]
        assert [x["items"] for x in parts] == sizes and {x["of"] for x in parts} == {n}
        assert len({x["worker"] for x in parts}) == 2
        assert parts[0]["held_weights"] is True        # the first part went to a holder
        ref, got = whole["outputs"]["9"]["images"], split["outputs"]["9"]["images"]
        assert_same_images(env, ref, got)
        first = int(ref[-1]["filename"].split("_")[1]) + 1       # as the next run on one machine
        assert [im["filename"] for im in got] == [f"editor_{first + i:05}_.png" for i in range(n)]
        # one story, shaped as the one-worker run's: one start, each node announced once,
        # one `executed` for the SaveImage holding every image, one success
        kinds = [m["type"] for m in msgs if m["type"] not in ("progress", "progress_state")]
        whole_kinds = [m["type"] for m in whole_msgs
                       if m["type"] not in ("progress", "progress_state")]
        assert sorted(kinds) == sorted(whole_kinds)
        executed = [m["data"] for m in msgs if m["type"] == "executed"]
        assert [e["node"] for e in executed] == ["9"] and executed[0]["output"]["images"] == got
        announced = [m["data"]["node"] for m in msgs if m["type"] == "executing"]
        assert sorted(announced[:-1], key=str) == sorted(
            [m["data"]["node"] for m in whole_msgs if m["type"] == "executing"][:-1], key=str)
        assert [m[0] for m in split["status"]["messages"]] == [
            m[0] for m in whole["status"]["messages"]]
    # a list the graph takes whole (RebatchLatents) runs on one worker, says why, and is right
    entry, msgs = out["rebatch"]
    assert entry["status"]["status_str"] == "success"
    assert "fan_out" not in entry["status"]["mixgraph"]
    warnings = [m["data"]["message"] for m in msgs if m["type"] == "mixgraph.warning"]
    assert warnings == ["not split over workers: node 11 (RebatchLatents) takes the whole list "
                        "at once (INPUT_IS_LIST)"]
    assert_same_images(env, out["seeds"][0][0]["outputs"]["9"]["images"][:4],
                       entry["outputs"]["9"]["images"], tol=2)       # batch-size rounding


def test_ray_fan_out_list_share_of_a_killed_worker_reruns_on_the_other(env, ray_cluster):
    p = seed_list("31,32,33,34", steps=20)

    async def workers(c) -> list[dict]:
        return (await (await c.get("/system_stats")).json())["mixgraph_workers"]

    async def main():
        async with ray_client(env) as c:
            ws = await c.ws_connect("/ws?clientId=me")
            whole = await run_listening(c, ws, p)
            run = asyncio.create_task(run_listening(c, ws, p, mixgraph_fan_out=True))
            deadline = time.monotonic() + 120
            while True:                          # a share is sampling: kill its worker
                busy = [w for w in await workers(c) if w["running"] and w["node"] == "3"]
                if busy:
                    break
                assert time.monotonic() < deadline, "no share started sampling"
                await asyncio.sleep(0.02)
            victim = busy[0]
            os.kill(victim["pid"], signal.SIGKILL)
            split = await run
            deadline = time.monotonic() + 120
            while not all(w["state"] == "ready" for w in await workers(c)):
                assert time.monotonic() < deadline, "the dead worker was not replaced"
                await asyncio.sleep(0.1)
            await ws.close()
        return whole, split, victim

    (whole, _), (split, msgs), victim = asyncio.run(main())
    assert split["status"]["status_str"] == "success"
    kinds = [m["type"] for m in msgs]
    assert kinds.count("execution_start") == 1 and kinds.count("execution_success") == 1
    assert "execution_error" not in kinds
    notes = [m["data"]["message"] for m in msgs if m["type"] == "mixgraph.warning"]
    assert len(notes) == 1 and f"worker {victim['name']} died while running part" in notes[0]
    placed = split["status"]["mixgraph"]
    assert [r["worker"] for r in placed["retries"]] == [victim["name"]]
    parts = placed["fan_out"]
    assert [x["items"] for x in parts] == [[0, 2], [2, 4]]
    assert len({x["worker"] for x in parts}) == 1 and victim["name"] not in parts[0]["worker"]
    assert_same_images(env, whole["outputs"]["9"]["images"], split["outputs"]["9"]["images"])
    assert [im["filename"] for im in split["outputs"]["9"]["images"]] == [
        f"editor_{i:05}_.png" for i in range(5, 9)]
    assert sorted(os.listdir(env.output)) == [f"editor_{i:05}_.png" for i in range(1, 9)]
