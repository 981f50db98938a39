"""Ray scale-out benchmark: `mixgraph serve --ray` against the plain server.

Two tiny generated SD1.5 checkpoints (`nodes.weights.synthetic`, ~21 MB each), a 64x64 2-step
txt2img prompt (euler), servers in this process (aiohttp test servers, as the tests run them), a
local Ray instance with one CPU per worker. Parts:

throughput  16 prompts alternating the two checkpoints, all queued at once: prompts per minute
            and weight loads (reads of a checkpoint from disk, summed over workers), for the plain
            server, Ray with 1 worker and Ray with 2 workers. `--budget tight` (default) gives each
            process's weight store room for one checkpoint (a GPU's memory, scaled down), so
            alternating costs a load per prompt unless affinity keeps each checkpoint on its own
            worker (each prompt has its own seed and text, so it needs the whole checkpoint);
            `--budget roomy` keeps the default budget (half the RAM).
latency     the same prompt 10 times in a row, fully cached after the first: what the queue,
            dispatch and event path add per prompt (median ms, plain vs Ray 1 worker).
fan-out     one prompt with a batch of 8 (8 steps): whole on one worker, then split over two.
list        one prompt whose KSampler takes a list of 8 seeds (8 steps; the SeedList node of
            tests/list_nodes.py, as a custom node pack would give it): whole on one worker, then
            its list split over two (both workers warm, holding the checkpoint).
failover    a 200-step prompt on 2 workers; the worker process running it is SIGKILLed mid-
            sampling: time from the kill until the prompt runs again elsewhere (its retry
            warning), until it finishes, and until the replacement worker is ready.

    nice -n 19 python benchmarks/bench_ray.py [--budget tight|roomy] [--only PART,...] [--json]

PART: throughput, latency, fan_out, list, failover (default: all).

Prints a table, then one JSON line (or only the JSON with --json). Timings on a shared machine
vary; run it when the machine is otherwise idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _prompt(ckpt: str, seed: int, steps: int = 2) -> dict:
    """Seed and text vary with `seed`, so each prompt needs the whole checkpoint (text encoder
    included) and nothing but the loader is a cache hit."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": f"a red fox, take {seed}",
                                                         "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
                                                           "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "seed": seed, "steps": steps, "cfg": 5.0, "sampler_name": "euler",
            "scheduler": "normal", "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0],
            "negative": ["7", 0], "latent_image": ["5", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "bench",
                                                    "images": ["8", 0]}},
    }


class Bench:
    def __init__(self, root: Path):
        from mixgraph.graph.env import Env
        from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
        for i, name in enumerate(("a.safetensors", "b.safetensors")):
            write_sd15_checkpoint(root / "models" / "checkpoints" / name, "tiny", seed=i)
        for d in ("in", "out", "temp"):
            (root / d).mkdir(exist_ok=True)
        self.root = root
        self.env = Env(models=(root / "models",), input=root / "in", output=root / "out",
                       temp=root / "temp")
        self.runs = 0

    def app(self, workers: int | None, registry=None):
        from mixgraph.ui.ray.ray_pool import RayConfig
        from mixgraph.ui.server.server import create_app
        self.runs += 1
        ray = RayConfig(workers=workers, registry=registry) if workers else None
        return create_app(self.env, user_dir=self.root / f"user{self.runs}", ray=ray,
                          registry=registry() if registry else None)

    async def client(self, workers: int | None, registry=None):
        from aiohttp.test_utils import TestClient, TestServer
        server = TestServer(self.app(workers, registry))
        c = TestClient(server)
        await c.start_server()
        return c

    @staticmethod
    async def post(c, prompt: dict) -> str:
        r = await c.post("/prompt", json={"prompt": prompt, "client_id": "bench"})
        body = await r.json()
        assert r.status == 200, body
        return body["prompt_id"]

    @staticmethod
    async def wait(c, pid: str, timeout: float = 600.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = await (await c.get(f"/history/{pid}")).json()
            if body:
                return body[pid]
            await asyncio.sleep(0.01)
        raise TimeoutError(pid)

    async def loads(self, c, workers: int | None) -> int:
        if workers:
            ws = (await (await c.get("/system_stats")).json())["mixgraph_workers"]
            return sum(sum(w["weight_reads"].values()) for w in ws)
        from mixgraph.nodes.weights import store
        reads: dict[str, int] = {}
        for ident, n in store.stats().reads_by_source.items():
            reads[ident[1]] = max(reads.get(ident[1], 0), n)
        return sum(reads.values())

    async def throughput(self, workers: int | None, n: int = 16) -> dict:
        from mixgraph.nodes.weights import store
        store.clear()
        c = await self.client(workers)
        try:
            await self.wait(c, await self.post(c, _prompt("a.safetensors", 10_000)))  # warm-up
            before = await self.loads(c, workers)
            t0 = time.perf_counter()
            ids = [await self.post(c, _prompt("ab"[i % 2] + ".safetensors", i)) for i in range(n)]
            entries = [await self.wait(c, pid) for pid in ids]
            seconds = time.perf_counter() - t0
            assert all(e["status"]["status_str"] == "success" for e in entries)
            loads = await self.loads(c, workers) - before
        finally:
            await c.close()
        return {"prompts": n, "seconds": round(seconds, 2),
                "prompts_per_min": round(60 * n / seconds, 1), "weight_loads": loads}

    async def latency(self, workers: int | None, n: int = 10) -> dict:
        c = await self.client(workers)
        try:
            prompt = _prompt("a.safetensors", 1)
            await self.wait(c, await self.post(c, prompt))
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                await self.wait(c, await self.post(c, prompt))
                times.append(time.perf_counter() - t0)
        finally:
            await c.close()
        return {"median_ms": round(1000 * statistics.median(times), 1),
                "min_ms": round(1000 * min(times), 1)}

    async def fan_out(self, batch: int = 8, steps: int = 8) -> dict:
        """One prompt with a batch of `batch`: whole on one worker vs split over two."""
        c = await self.client(2)
        try:
            out = {}
            for label, extra in (("whole_s", {}), ("split_over_2_s", {"mixgraph_fan_out": True})):
                p = _prompt("a.safetensors", 50 + len(out), steps=steps)
                p["5"]["inputs"]["batch_size"] = batch
                await self.wait(c, await self.post(c, _prompt("a.safetensors", 0)))   # warm
                t0 = time.perf_counter()
                r = await c.post("/prompt", json={"prompt": p, "extra_data": extra})
                entry = await self.wait(c, (await r.json())["prompt_id"])
                out[label] = round(time.perf_counter() - t0, 2)
                assert len(entry["outputs"]["9"]["images"]) == batch
        finally:
            await c.close()
        return {"batch": batch, "steps": steps, **out}

    async def list_fan_out(self, seeds: int = 8, steps: int = 8) -> dict:
        """One prompt over a list of `seeds` seeds: whole on one worker vs split over two."""
        from tests.list_nodes import registry

        def listed(first: int) -> dict:
            p = _prompt("a.safetensors", 0, steps=steps)
            p["10"] = {"class_type": "SeedList", "inputs": {
                "seeds": ",".join(str(first + i) for i in range(seeds))}}
            p["3"]["inputs"]["seed"] = ["10", 0]
            return p

        c = await self.client(2, registry)
        try:
            warm = listed(1000)
            warm["10"]["inputs"]["seeds"] = "1,2"
            warm["3"]["inputs"]["steps"] = 1
            r = await c.post("/prompt", json={"prompt": warm,
                                              "extra_data": {"mixgraph_fan_out": True}})
            entry = await self.wait(c, (await r.json())["prompt_id"])
            assert len(entry["status"]["mixgraph"]["fan_out"]) == 2, entry["status"]
            out = {}
            for label, extra in (("one_worker_s", {}), ("two_workers_s",
                                                        {"mixgraph_fan_out": True})):
                t0 = time.perf_counter()
                r = await c.post("/prompt", json={"prompt": listed(100 * (len(out) + 1)),
                                                  "extra_data": extra})
                entry = await self.wait(c, (await r.json())["prompt_id"])
                out[label] = round(time.perf_counter() - t0, 2)
                assert entry["status"]["status_str"] == "success"
                assert len(entry["outputs"]["9"]["images"]) == seeds
        finally:
            await c.close()
        return {"seeds": seeds, "steps": steps, **out,
                "speedup": round(out["one_worker_s"] / out["two_workers_s"], 2),
                "images_per_min": {k: round(60 * seeds / out[k], 1)
                                   for k in ("one_worker_s", "two_workers_s")}}

    async def failover(self) -> dict:
        c = await self.client(2)
        try:
            ws = await c.ws_connect("/ws?clientId=bench")
            for ckpt in ("a.safetensors", "b.safetensors"):      # both workers warm
                await self.wait(c, await self.post(c, _prompt(ckpt, 1)))
            t_start = time.perf_counter()
            pid = await self.post(c, _prompt("a.safetensors", 2, steps=200))
            while True:
                stats = (await (await c.get("/system_stats")).json())["mixgraph_workers"]
                running = [w for w in stats if w["running"] == pid and w["node"] == "3"]
                if running:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)         # some steps in
            victim = running[0]
            t_kill = time.perf_counter()
            os.kill(victim["pid"], signal.SIGKILL)

            async def retried() -> float:
                while True:
                    m = await asyncio.wait_for(ws.receive_json(), 120)
                    if m["type"] == "mixgraph.warning" and m["data"].get("prompt_id") == pid:
                        return time.perf_counter()

            async def replaced() -> float:
                while True:
                    stats = (await (await c.get("/system_stats")).json())["mixgraph_workers"]
                    if any(w["name"] == victim["name"] and w["restarts"] and w["state"] == "ready"
                           for w in stats):
                        return time.perf_counter()
                    await asyncio.sleep(0.02)

            async def done() -> tuple[float, dict]:
                entry = await self.wait(c, pid)
                return time.perf_counter(), entry

            t_retry, t_ready, (t_done, entry) = await asyncio.gather(retried(), replaced(),
                                                                     done())
            assert entry["status"]["status_str"] == "success"
            await ws.close()
        finally:
            await c.close()
        return {"kill_to_retry_s": round(t_retry - t_kill, 2),
                "kill_to_done_s": round(t_done - t_kill, 2),
                "kill_to_replacement_ready_s": round(t_ready - t_kill, 2),
                "sampling_before_kill_s": round(t_kill - t_start, 2)}


def _one_checkpoint_bytes(root: Path) -> int:
    """Bytes the weight store holds after one prompt on one checkpoint (this process)."""
    from mixgraph.graph.executor import Executor
    from mixgraph.nodes.weights import store
    from mixgraph.ui.api import default_registry
    b = Bench(root)
    Executor(default_registry(), b.env).run(_prompt("a.safetensors", 0))
    held = store.stats().bytes
    store.clear()
    return held


async def main_async(args: argparse.Namespace) -> dict:
    import ray
    out: dict = {"budget": args.budget}
    only = set(args.only.split(",")) if args.only else set(PARTS)
    if args.budget == "tight":      # room for one checkpoint, here and in the workers
        with tempfile.TemporaryDirectory(prefix="mixgraph-bench-ray-") as tmp:
            held = _one_checkpoint_bytes(Path(tmp))
        budget = int(held * 1.5)
        os.environ["MIXGRAPH_WEIGHT_CACHE_BYTES"] = str(budget)
        from mixgraph.nodes.weights import store
        store.configure(budget)
        out["weight_budget_bytes"] = budget
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="mixgraph-bench-ray-") as tmp:
            b = Bench(Path(tmp))
            if "throughput" in only:
                out["throughput"] = {label: await b.throughput(workers) for label, workers in (
                    ("plain", None), ("ray_1_worker", 1), ("ray_2_workers", 2))}
            if "latency" in only:
                lat = out["latency"] = {label: await b.latency(workers) for label, workers in (
                    ("plain", None), ("ray_1_worker", 1))}
                lat["added_ms"] = round(lat["ray_1_worker"]["median_ms"]
                                        - lat["plain"]["median_ms"], 1)
            if "fan_out" in only:
                out["fan_out"] = await b.fan_out()
            if "list" in only:
                out["list_fan_out"] = await b.list_fan_out()
            if "failover" in only:
                out["failover"] = await b.failover()
            return out
    finally:
        ray.shutdown()


PARTS = ("throughput", "latency", "fan_out", "list", "failover")


def _print(result: dict) -> None:
    print(f"weight budget: {result['budget']}")
    if "throughput" in result:
        print(f"{'throughput (16 prompts, 2 ckpts)':36} {'prompts/min':>12} {'loads':>6} "
              f"{'s':>7}")
        for label, r in result["throughput"].items():
            print(f"  {label:34} {r['prompts_per_min']:12} {r['weight_loads']:6} "
                  f"{r['seconds']:7}")
    if "latency" in result:
        lat = result["latency"]
        print(f"latency, cached prompt: plain {lat['plain']['median_ms']} ms, Ray 1 worker "
              f"{lat['ray_1_worker']['median_ms']} ms (+{lat['added_ms']} ms)")
    if "fan_out" in result:
        fo = result["fan_out"]
        print(f"fan-out, batch {fo['batch']} x {fo['steps']} steps: whole on 1 worker "
              f"{fo['whole_s']} s, split over 2 {fo['split_over_2_s']} s")
    if "list_fan_out" in result:
        li = result["list_fan_out"]
        print(f"fan-out, list of {li['seeds']} seeds x {li['steps']} steps: whole on 1 worker "
              f"{li['one_worker_s']} s, split over 2 {li['two_workers_s']} s "
              f"(x{li['speedup']})")
    if "failover" in result:
        f = result["failover"]
        print(f"failover: retry {f['kill_to_retry_s']} s after the kill, done after "
              f"{f['kill_to_done_s']} s, replacement ready after "
              f"{f['kill_to_replacement_ready_s']} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", choices=("tight", "roomy"), default="tight")
    p.add_argument("--only", metavar="PART,...",
                   help=f"run only these parts ({', '.join(PARTS)}); default all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    unknown = set(args.only.split(",")) - set(PARTS) if args.only else set()
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from "
                f"{', '.join(PARTS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
        "PYTHONPATH")])])
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(1)
    import logging
    logging.getLogger("mixgraph").setLevel(logging.ERROR)
    result = asyncio.run(main_async(args))
    if not args.json:
        _print(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
