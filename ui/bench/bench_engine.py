"""Engine benchmark: per-node overhead of validation, planning and execution (DESIGN §2).

    python -m mixgraph.ui.bench.bench_engine [--json]          (also `mixgraph bench engine [--json]`)

Graphs of trivial integer nodes (declared here, registered into a private Registry, so nothing in
the node library is involved): a 1,000-node chain and a 1,000-node fan-out, each timed for
loading, validation (which also orders the graph), planning (per-node plans + cache keys), a
cold run (empty cache, validation included) and a fully cached re-run (validation included). Times are the best of `repeat` runs. A
100,000-node chain is then validated and run once to show that nothing is recursive or quadratic.
JSON keys `cold_us_per_node` and `cached_us_per_node` are the worst shape's numbers.
`--sizes 1000,10000,100000` adds the same table per size (`scaling` in the JSON): per-node cost
must stay flat; what growth remains at 100,000 nodes is CPU caches, not algorithm.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any, Callable

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Int, Result, Socket, node
from mixgraph.graph.precision import Resolver
from mixgraph.graph.registry import Registry
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow

__all__ = ["bench_registry", "chain_prompt", "fanout_prompt", "run_bench", "cli_main"]


@node(outputs=["INT"], category="bench", register=False)
def BenchConst(value=Int(0, min=-2**62, max=2**62)):
    return value


@node(outputs=["INT"], category="bench", register=False)
def BenchAddOne(x=Socket("INT")):
    return x + 1


@node(category="bench", output_node=True, register=False)
def BenchSink(x=Socket("INT")):
    return Result((), {"value": [x]})


def bench_registry() -> Registry:
    reg = Registry()
    for fn in (BenchConst, BenchAddOne, BenchSink):
        reg.add(fn.spec)
    return reg


def chain_prompt(n: int) -> dict:
    """Const -> AddOne x (n-2) -> Sink: n nodes, depth n."""
    p: dict[str, Any] = {"0": {"class_type": "BenchConst", "inputs": {"value": 1}}}
    for i in range(1, n - 1):
        p[str(i)] = {"class_type": "BenchAddOne", "inputs": {"x": [str(i - 1), 0]}}
    p[str(n - 1)] = {"class_type": "BenchSink", "inputs": {"x": [str(n - 2), 0]}}
    return p


def fanout_prompt(n: int) -> dict:
    """One Const feeding (n-1)//2 AddOne nodes, each feeding its own Sink (n nodes, width n/2)."""
    p: dict[str, Any] = {"0": {"class_type": "BenchConst", "inputs": {"value": 1}}}
    k = 1
    while k + 1 < n:
        p[str(k)] = {"class_type": "BenchAddOne", "inputs": {"x": ["0", 0]}}
        p[str(k + 1)] = {"class_type": "BenchSink", "inputs": {"x": [str(k), 0]}}
        k += 2
    if k < n:
        p[str(k)] = {"class_type": "BenchSink", "inputs": {"x": ["0", 0]}}
    return p


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
        del result  # freeing what a run returns (or the executor it made) is not part of it
    return best


def _shape(name: str, prompt: dict, reg: Registry, repeat: int) -> dict[str, Any]:
    n = len(prompt)
    env = Env()
    wf = load_workflow(prompt, reg)
    t_load = _best(lambda: load_workflow(prompt, reg), repeat)
    t_validate = _best(lambda: validate(wf.prompt, reg, env), repeat)
    v = validate(wf.prompt, reg, env)
    assert v.ok and not v.errors, v.errors

    ex = Executor(reg, env, OutputCache(2**30))

    def plan():
        order = v.order
        plans = {nid: ex._plan_for(wf.prompt[nid].class_type) for nid in order}
        return ex._keys(order, v.inputs, plans, Resolver(wf.precision, device=env.device), env, None)

    t_plan = _best(plan, repeat)

    def cold():
        cold_ex = Executor(reg, env, OutputCache(2**30))
        report = cold_ex.run(wf)
        assert len(report.executed) == n, (len(report.executed), n)
        return cold_ex, report

    t_cold = _best(cold, repeat)
    warm = Executor(reg, env, OutputCache(2**30))
    warm.run(wf)

    def cached():
        report = warm.run(wf)
        assert not report.executed
        return report

    t_cached = _best(cached, repeat)
    us = 1e6 / n
    return {"shape": name, "nodes": n, "load_us_per_node": round(t_load * us, 2),
            "validate_us_per_node": round(t_validate * us, 2),
            "plan_us_per_node": round(t_plan * us, 2),
            "cold_us_per_node": round(t_cold * us, 2),
            "cached_us_per_node": round(t_cached * us, 2)}


def _big_chain(n: int, reg: Registry) -> dict[str, Any]:
    prompt = chain_prompt(n)
    t0 = time.perf_counter()
    wf = load_workflow(prompt, reg)
    t1 = time.perf_counter()
    report = Executor(reg, Env(), OutputCache(2**30)).run(wf)
    t2 = time.perf_counter()
    last = report.ui.get(str(n - 1), {}).get("value", [None])[0]
    return {"nodes": n, "ok": report.status == "success" and last == n - 1,
            "load_seconds": round(t1 - t0, 3), "run_seconds": round(t2 - t1, 3),
            "run_us_per_node": round((t2 - t1) * 1e6 / n, 2)}


def run_bench(nodes: int = 1000, big: int = 100_000, repeat: int = 5,
              sizes: list[int] | None = None) -> dict[str, Any]:
    reg = bench_registry()
    shapes = [_shape("chain", chain_prompt(nodes), reg, repeat),
              _shape("fanout", fanout_prompt(nodes), reg, repeat)]
    out: dict[str, Any] = {
        "cold_us_per_node": max(s["cold_us_per_node"] for s in shapes),
        "cached_us_per_node": max(s["cached_us_per_node"] for s in shapes),
        "nodes": nodes,
        "shapes": {s["shape"]: s for s in shapes},
        "python": sys.version.split()[0],
    }
    if sizes:
        out["scaling"] = {str(n): {"chain": _shape("chain", chain_prompt(n), reg, repeat),
                                   "fanout": _shape("fanout", fanout_prompt(n), reg, repeat)}
                          for n in sizes}
    if big:
        out["chain_big"] = _big_chain(big, reg)
    return out


def cli_main(args: argparse.Namespace) -> int:
    sizes = getattr(args, "sizes", None)
    result = run_bench(args.nodes, args.big, args.repeat, sizes)
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    print(f"engine overhead, {result['nodes']}-node graphs of trivial nodes (best of {args.repeat}):")
    print(f"  {'shape':14} {'load':>8} {'validate':>9} {'plan':>8} {'cold':>8} {'cached':>8}  µs/node")
    for s in result["shapes"].values():
        print(f"  {s['shape']:14} {s['load_us_per_node']:8.2f} {s['validate_us_per_node']:9.2f} "
              f"{s['plan_us_per_node']:8.2f} {s['cold_us_per_node']:8.2f} {s['cached_us_per_node']:8.2f}")
    for n, by_shape in result.get("scaling", {}).items():
        for s in by_shape.values():
            print(f"  {s['shape'] + '@' + n:14} {s['load_us_per_node']:8.2f} "
                  f"{s['validate_us_per_node']:9.2f} {s['plan_us_per_node']:8.2f} "
                  f"{s['cold_us_per_node']:8.2f} {s['cached_us_per_node']:8.2f}")
    print(f"  worst: cold {result['cold_us_per_node']:.2f} µs/node, cached "
          f"{result['cached_us_per_node']:.2f} µs/node (runs include validation)")
    if "chain_big" in result:
        b = result["chain_big"]
        print(f"  {b['nodes']}-node chain: load {b['load_seconds']} s, validate+run "
              f"{b['run_seconds']} s ({b['run_us_per_node']} µs/node), "
              f"{'ok' if b['ok'] else 'FAILED'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mixgraph.ui.bench.bench_engine", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--big", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",") if x],
                   help="also time these graph sizes, e.g. 1000,10000,100000")
    return cli_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
