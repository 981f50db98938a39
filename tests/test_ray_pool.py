"""`mixgraph serve --ray` with real (tiny, generated) SD1.5 checkpoints on a local Ray cluster of
two workers: model-affinity placement, failover when a worker process is killed mid-prompt,
fan-out of a batch, /free, the flags. Skipped without the ray package. (tests/test_server_ray.py
runs the API suite in Ray mode.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.env import Env
from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
from mixgraph.ui.ray.ray_pool import RayConfig
from mixgraph.ui.server.server import create_app
from tests.test_editor_browser import txt2img
from tests.test_server import post_prompt, wait_history


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp"):
        (tmp_path / d).mkdir()
    for i, name in enumerate(("a.safetensors", "b.safetensors")):
        write_sd15_checkpoint(tmp_path / "models" / "checkpoints" / name, "tiny", seed=i)
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


@contextlib.asynccontextmanager
async def ray_client(env, workers=2, config=None):
    app = create_app(env, user_dir=env.output.parent / "user", ray=config or RayConfig(workers=workers))
    async with TestServer(app) as server, TestClient(server) as c:
        yield c


def prompt(ckpt: str, seed: int, steps: int = 2) -> dict:
    p = txt2img(ckpt)
    p["3"]["inputs"].update(seed=seed, steps=steps)
    return p


async def listen(ws, prompt_id: str, into: list) -> None:
    """Collect `prompt_id`'s WebSocket messages until it ends; reading all along answers the
    server's heartbeat while the test waits elsewhere."""
    while not (into and into[-1]["type"] == "executing" and into[-1]["data"]["node"] is None):
        m = await ws.receive_json()
        if m["data"].get("prompt_id") == prompt_id:
            into.append(m)


async def workers(c) -> list[dict]:
    return (await (await c.get("/system_stats")).json())["mixgraph_workers"]


def test_ray_affinity_two_checkpoints_alternating_load_each_once(env, ray_cluster):
    async def main():
        async with ray_client(env) as c:
            ids = []
            for i in range(8):
                status, r = await post_prompt(c, prompt("ab"[i % 2] + ".safetensors", seed=i))
                assert status == 200
                ids.append(r["prompt_id"])
            entries = [await wait_history(c, pid, timeout=240) for pid in ids]
            ws = await workers(c)
            queue = await (await c.get("/queue")).json()
        assert all(e["status"]["status_str"] == "success" for e in entries)
        placed = [e["status"]["mixgraph"] for e in entries]
        # one worker per checkpoint, and each file read from disk once over the whole cluster
        assert len({p["worker"] for p in placed[0::2]}) == 1
        assert len({p["worker"] for p in placed[1::2]}) == 1
        assert placed[0]["worker"] != placed[1]["worker"]
        for name in ("a.safetensors", "b.safetensors"):
            assert sum(w["weight_reads"].get(name, 0) for w in ws) == 1, ws
        assert "least loaded" in placed[0]["reason"] and "least loaded" in placed[1]["reason"]
        for p, name in zip(placed[2:], "abababab"[2:]):
            assert f"holds {name}.safetensors (float32)" in p["reason"], p
        assert all(p["retries"] == [] for p in placed)
        # what each worker holds: the file's fingerprint and storage precision
        by_name = {w["name"]: w for w in queue["mixgraph_workers"]}
        for i, name in ((0, "a.safetensors"), (1, "b.safetensors")):
            held = by_name[placed[i]["worker"]]["held"]
            digest = fingerprint_file(env.models[0] / "checkpoints" / name).digest
            assert held == [{"file": name, "fingerprint": digest, "precision": "float32"}]
        assert all(w["state"] == "ready" and w["running"] is None for w in ws)
    asyncio.run(main())


def test_ray_failover_killed_worker_prompt_completes_elsewhere(env, ray_cluster):
    async def main():
        async with ray_client(env) as c:
            ws = await c.ws_connect("/ws?clientId=me")
            _, slow = await post_prompt(c, prompt("a.safetensors", 1, steps=120), client_id="me")
            slow_id = slow["prompt_id"]
            msgs: list = []
            listening = asyncio.create_task(listen(ws, slow_id, msgs))
            deadline = time.monotonic() + 120
            while True:                     # the slow prompt is sampling on some worker
                running = [w for w in await workers(c)
                           if w["running"] == slow_id and w["node"] == "3"]
                if running:
                    break
                assert time.monotonic() < deadline, "the slow prompt never started sampling"
                await asyncio.sleep(0.05)
            victim = running[0]
            after = [(await post_prompt(c, prompt("b.safetensors", s)))[1]["prompt_id"]
                     for s in (2, 3)]
            os.kill(victim["pid"], signal.SIGKILL)
            entry = await wait_history(c, slow_id, timeout=240)
            await asyncio.wait_for(listening, 60)
            others = [await wait_history(c, pid, timeout=240) for pid in after]
            deadline = time.monotonic() + 120
            while not all(w["state"] == "ready" for w in await workers(c)):
                assert time.monotonic() < deadline, "the dead worker was not replaced"
                await asyncio.sleep(0.1)
            final = {w["name"]: w for w in await workers(c)}
            history = await (await c.get("/history")).json()
            await ws.close()
        # one story for the client: one start, a note of the retry, success at the end
        kinds = [m["type"] for m in msgs]
        assert kinds.count("execution_start") == 1 and kinds[0] == "execution_start"
        assert "execution_success" in kinds and "execution_error" not in kinds
        notes = [m["data"]["message"] for m in msgs if m["type"] == "mixgraph.warning"]
        assert len(notes) == 1 and f"worker {victim['name']} died" in notes[0]
        assert entry["status"]["status_str"] == "success"
        assert [m[0] for m in entry["status"]["messages"]].count("execution_start") == 1
        assert entry["outputs"]["9"]["images"]
        placed = entry["status"]["mixgraph"]
        assert [r["worker"] for r in placed["retries"]] == [victim["name"]]
        assert placed["retries"][0]["at_node"] == "3" and "retry 1" in placed["reason"]
        # the queue went on, and the history holds everything
        assert all(o["status"]["status_str"] == "success" for o in others)
        assert set(history) == {slow_id, *after}
        assert final[victim["name"]]["restarts"] == 1
        assert final[victim["name"]]["pid"] != victim["pid"]
    asyncio.run(main())


def _pixels(env, images: list[dict]) -> list:
    import numpy as np
    from PIL import Image
    out = []
    for im in images:
        with Image.open(env.output / im["subfolder"] / im["filename"]) as f:
            out.append(np.asarray(f.convert("RGB"), dtype=np.int16))
    return out


def test_ray_fan_out_batch_of_8_over_2_workers_equals_one_worker(env, ray_cluster):
    p = prompt("a.safetensors", 5)
    p["5"]["inputs"]["batch_size"] = 8

    async def main():
        async with ray_client(env) as c:
            _, whole = await post_prompt(c, p, client_id="me")
            whole_entry = await wait_history(c, whole["prompt_id"], timeout=240)
            ws = await c.ws_connect("/ws?clientId=me")
            _, split = await post_prompt(c, p, client_id="me",
                                         extra_data={"mixgraph_fan_out": True})
            msgs: list = []
            listening = asyncio.create_task(listen(ws, split["prompt_id"], msgs))
            split_entry = await wait_history(c, split["prompt_id"], timeout=240)
            await asyncio.wait_for(listening, 60)
            _, plain = await post_prompt(c, prompt("a.safetensors", 6, steps=2), client_id="me",
                                         extra_data={"mixgraph_fan_out": True})
            plain_entry = await wait_history(c, plain["prompt_id"], timeout=240)
            await ws.close()
        assert split_entry["status"]["status_str"] == "success"
        parts = split_entry["status"]["mixgraph"]["fan_out"]
        assert [x["images"] for x in parts] == [[0, 4], [4, 8]]
        assert len({x["worker"] for x in parts}) == 2
        images = split_entry["outputs"]["9"]["images"]
        assert len(images) == 8
        assert [im["filename"].split("_part")[1][0] for im in images] == list("11112222")
        ref = _pixels(env, whole_entry["outputs"]["9"]["images"])
        got = _pixels(env, images)
        assert len(ref) == 8
        for a, b in zip(ref, got):             # same images, same order (batch-size rounding)
            assert abs(a - b).max() <= 2
        assert any(abs(ref[0] - r).max() > 10 for r in ref[1:])   # and they differ from each other
        # one story: one start, one merged `executed` for the output, one success
        kinds = [m["type"] for m in msgs]
        assert kinds.count("execution_start") == 1 and kinds.count("execution_success") == 1
        executed = [m["data"] for m in msgs if m["type"] == "executed"]
        assert [e["node"] for e in executed] == ["9"] and executed[0]["output"]["images"] == images
        assert [m[0] for m in split_entry["status"]["messages"]] == [
            "execution_start", "execution_cached", "execution_success"]
        # a batch of 1 does not split, and says why
        assert plain_entry["status"]["status_str"] == "success"
        assert "fan_out" not in plain_entry["status"]["mixgraph"]
    asyncio.run(main())


def test_ray_serve_flags_map_to_the_config(capsys):
    from mixgraph.ui.cli import build_parser
    from mixgraph.ui.ray.ray_pool import config_from_args
    args = build_parser().parse_args(["serve", "--ray", "--workers", "3", "--fan-out",
                                      "--cache-lru", "7", "--disable-all-custom-nodes"])
    config = config_from_args(args)
    assert (config.address, config.workers, config.fan_out) == (None, 3, True)
    assert config.cache == {"lru": 7, "none": False, "ram": None}
    assert config.custom_nodes["disable_all_custom_nodes"] is True
    assert config_from_args(build_parser().parse_args(
        ["serve", "--ray", "ray://head:10001"])).address == "ray://head:10001"
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--ray", "--workers", "0"])
    assert exit_.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_ray_free_unloads_the_workers_weights(env, ray_cluster):
    async def main():
        async with ray_client(env, workers=1) as c:
            await wait_history(c, (await post_prompt(c, prompt("a.safetensors", 1)))[1]
                               ["prompt_id"], timeout=240)
            [w] = await workers(c)
            assert [h["file"] for h in w["held"]] == ["a.safetensors"]
            assert (await c.post("/free", json={"unload_models": True})).status == 200
            deadline = time.monotonic() + 60
            while (await workers(c))[0]["held"]:
                assert time.monotonic() < deadline, "the worker kept its weights"
                await asyncio.sleep(0.05)
            await wait_history(c, (await post_prompt(c, prompt("a.safetensors", 2)))[1]
                               ["prompt_id"], timeout=240)
            [w] = await workers(c)
        assert w["weight_reads"] == {"a.safetensors": 1}    # loaded again after the free
        assert [h["file"] for h in w["held"]] == ["a.safetensors"]
    asyncio.run(main())


def test_ray_workers_share_the_persistent_output_cache(env, ray_cluster, tmp_path):
    """`--output-cache DIR` reaches every worker: the same prompt, run again by a restarted
    server's new worker processes, executes only its output node, served from what the first
    server's worker stored, and reads no checkpoint."""
    config = RayConfig(workers=2, output_cache=(str(tmp_path / "output-cache"), 1.0))

    async def once() -> tuple[dict, list[dict]]:
        async with ray_client(env, config=config) as c:
            _, r = await post_prompt(c, prompt("a.safetensors", seed=11))
            entry = await wait_history(c, r["prompt_id"], timeout=240)
            return entry, await workers(c)

    first, _ = asyncio.run(once())
    second, ws = asyncio.run(once())       # new server, new worker processes, same directory
    for entry in (first, second):
        assert entry["status"]["status_str"] == "success" and entry["outputs"]["9"]["images"]
    messages = {name: body for name, body in second["status"]["messages"]}
    assert messages["execution_cached"]["nodes"] == ["8"]
    assert sum(w["weight_reads"].get("a.safetensors", 0) for w in ws) == 0, ws


def test_ray_workers_get_the_front_servers_memory_budget(env, ray_cluster, monkeypatch):
    """The front server's memory budget (bytes, origin, mode) is set in each worker process (its
    row in /system_stats says so, the output cache's bound a share of it), the worker's models
    stream within it, and the prompt's history entry has the run's memory section, as a local
    run's; `RayConfig.memory` carries the budget to the workers."""
    from mixgraph.graph.cache import BUDGET_SHARE
    from mixgraph.nodes.models import memory_budget
    monkeypatch.setenv("MIXGRAPH_MEMORY_CHECK", "0")   # a budget under the VAE's activations: run anyway
    monkeypatch.delenv("MIXGRAPH_CACHE_BYTES", raising=False)
    budget = memory_budget.set_budget("cpu", 0.002, mode="low")
    assert RayConfig().worker_options(env).memory == (("cpu", budget.nbytes, budget.origin, "low"),)

    async def main():
        async with ray_client(env, workers=1) as c:
            _, r = await post_prompt(c, prompt("a.safetensors", 5))
            return await wait_history(c, r["prompt_id"], timeout=240), await workers(c)
    try:
        entry, [w] = asyncio.run(main())
    finally:
        memory_budget.reset()
    assert w["memory_budget"] == {"device": "cpu", "bytes": budget.nbytes, "mode": "low",
                                  "origin": "--memory-budget 0.002",
                                  "output_cache_bytes": int(budget.nbytes * BUDGET_SHARE)}
    assert entry["status"]["status_str"] == "success", entry["status"]
    memory = entry["status"]["mixgraph"]["memory"]
    assert (memory["budget_bytes"], memory["budget_origin"], memory["mode"]) == \
        (budget.nbytes, "--memory-budget 0.002", "low")
    cost = memory["streaming"]                      # counted in the worker's process
    assert cost["bytes_streamed"] > 0 and cost["passes"] >= 2
    assert any(name == "unet weights from a.safetensors" for name in cost["by_model"]), cost
    assert entry["status"]["mixgraph"]["worker"] == w["name"]
