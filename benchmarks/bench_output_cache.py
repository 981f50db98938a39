"""Persistent output cache benchmark: a cold txt2img run vs the same prompt after a
restart, on a seeded random SD 1.5-architecture checkpoint (tiny by default; `--size full` for
the real architecture, a 4.3 GB file written to a temporary folder; slow on a CPU).

Every run is a fresh child process (a real restart: empty in-memory caches, no weights loaded),
on workflows/txt2img_sd15.json at `--width` px and `--steps` steps:

1. no_cache: without `--output-cache` (the baseline; what every restart cost before);
2. cold: with an empty output cache directory (the same work, plus writing the results);
3. restart: a new process on the same directory.

Per run: `seconds` (the executor's run time, weights loading included; minimum over repeats),
`process_seconds` (the whole child: interpreter, torch and node library import, run), nodes
executed and cached, checkpoint loads (the weight store's disk reads), and for the cached runs the
directory's entries and bytes, the blobs read/written and the seconds spent on them (encode,
write, index; read, check, decode). `hit_rate` of the restart: the share of the cold run's node
executions the restart did not need (served from the cache or not needed because what consumes
them was). Prints a table; with --json one JSON document.

    python benchmarks/bench_output_cache.py [--size tiny|full] [--width 64] [--steps 8]
                                            [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKFLOW = ROOT / "workflows" / "txt2img_sd15.json"


def child(args: argparse.Namespace) -> None:
    """One run in this (fresh) process; prints one JSON line."""
    from mixgraph.graph.cache import OutputCache
    from mixgraph.graph.env import Env
    from mixgraph.graph.executor import Executor
    from mixgraph.graph.persist import DiskCache, TieredCache
    from mixgraph.nodes.weights import store
    from mixgraph.ui import api

    root = Path(args.root)
    env = Env.from_args(models=root / "models", output=root / "output", input=root / "input")
    cache = OutputCache()
    if args.cache_dir:
        cache = TieredCache(cache, DiskCache(args.cache_dir))
    ex = Executor(api.default_registry(), env, cache)
    sets = {"5.width": args.width, "5.height": args.width, "3.steps": args.steps}
    t0 = time.perf_counter()
    result = api.run(WORKFLOW, set=sets, executor=ex)
    wall = time.perf_counter() - t0
    report = result.report
    out = {"seconds": report.seconds, "wall_seconds": wall, "executed": sorted(report.executed),
           "cached": sorted(report.cached), "checkpoint_loads": store.stats().loads}
    if args.cache_dir:
        d = cache.disk.stats()
        out.update(entries=d["entries"], bytes_stored=d["bytes"], blobs_read=d["hits"],
                   bytes_read=d["bytes_read"], read_seconds=d["read_seconds"],
                   blobs_written=d["writes"], bytes_written=d["bytes_written"],
                   write_seconds=d["write_seconds"])
    print("RESULT " + json.dumps(out))


def run_child(root: Path, cache_dir: Path | None, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--root", str(root), "--width", str(args.width),
           "--steps", str(args.steps)]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(line[len("RESULT "):]), "process_seconds": elapsed}


def best(runs: list[dict]) -> dict:
    """The run with the smallest executor time (shared machines: minima), process time min too."""
    out = dict(min(runs, key=lambda r: r["seconds"]))
    out["process_seconds"] = min(r["process_seconds"] for r in runs)
    out["repeats"] = len(runs)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "full"), default="tiny")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return

    from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint

    with tempfile.TemporaryDirectory(prefix="mixgraph-pcache-") as tmp:
        root = Path(tmp)
        ckpt = root / "models" / "checkpoints" / "sd15.safetensors"
        ckpt.parent.mkdir(parents=True)
        write_sd15_checkpoint(ckpt, size=args.size, seed=0)
        runs: dict[str, list[dict]] = {"no_cache": [], "cold": [], "restart": []}
        for r in range(args.repeats):      # interleaved, in turns, so machine load hits all alike
            cache_dir = root / f"cache{r}"
            if r % 2 == 0:
                runs["no_cache"].append(run_child(root, None, args))
            runs["cold"].append(run_child(root, cache_dir, args))
            runs["restart"].append(run_child(root, cache_dir, args))
            if r % 2 == 1:
                runs["no_cache"].append(run_child(root, None, args))
        result = {k: best(v) for k, v in runs.items()}
        cold, restart = result["cold"], result["restart"]
        result["hit_rate"] = 1 - len(restart["executed"]) / len(cold["executed"])
        result["speedup_restart_vs_no_cache"] = result["no_cache"]["seconds"] / restart["seconds"]
        result["config"] = {"size": args.size, "width": args.width, "steps": args.steps,
                            "checkpoint_bytes": ckpt.stat().st_size}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"txt2img SD1.5 ({args.size}, {args.width}px, {args.steps} steps), best of "
          f"{args.repeats} fresh processes each")
    print(f"{'run':<10}{'run s':>9}{'process s':>11}{'executed':>10}{'cached':>8}"
          f"{'ckpt loads':>12}{'stored':>14}")
    for name in ("no_cache", "cold", "restart"):
        r = result[name]
        stored = f"{r['entries']} / {r['bytes_stored']:,} B" if "entries" in r else "-"
        print(f"{name:<10}{r['seconds']:>9.3f}{r['process_seconds']:>11.2f}"
              f"{len(r['executed']):>10}{len(r['cached']):>8}{r['checkpoint_loads']:>12}"
              f"{stored:>14}")
    print(f"restart executed {restart['executed']}, cached {restart['cached']}; hit rate "
          f"{result['hit_rate']:.0%}; restart {result['speedup_restart_vs_no_cache']:.1f}x faster "
          f"than no cache")
    print(f"cold run: {cold['blobs_written']} blob(s) written in {cold['write_seconds'] * 1000:.1f} ms; "
          f"restart: {restart['blobs_read']} read in {restart['read_seconds'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
