"""`mixgraph serve` start-up: seconds from starting the process to an accepted WebSocket (the
window ComfyUI's test suite gives a server is 20 s), repeated, median and minimum.

    python benchmarks/bench_startup.py [--runs 5] [--json]

Each run starts `python -m mixgraph.ui.cli serve` on a free port in a fresh temporary working
folder (empty models, no custom node packs), connects to `/ws` every 20 ms until the server
answers with its `status` message, then stops it. Where the time goes: `python -X importtime -m
mixgraph.ui.cli serve ...` (stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _until_accepted(port: int, proc: subprocess.Popen, t0: float) -> float:
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mixgraph serve exited with {proc.returncode} before accepting")
            try:
                async with session.ws_connect(f"http://127.0.0.1:{port}/ws?clientId=bench") as ws:
                    await ws.receive(timeout=10)
                    return time.perf_counter() - t0
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.02)


def one_run(workdir: Path) -> float:
    port = _free_port()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mixgraph.ui.cli", "serve", "--port", str(port),
                             "--disable-all-custom-nodes"], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return asyncio.run(_until_accepted(port, proc, t0))
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mixgraph-startup-") as tmp:
        times = [one_run(Path(tmp)) for _ in range(args.runs)]
    load = os.getloadavg()[0]
    result = {"runs_s": [round(t, 3) for t in times], "median_s": round(statistics.median(times), 3),
              "min_s": round(min(times), 3), "load_1min": round(load, 2), "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"serve start-up to an accepted WebSocket: median {result['median_s']:.2f} s, "
              f"min {result['min_s']:.2f} s over {args.runs} runs "
              f"({', '.join(f'{t:.2f}' for t in times)}; load {load:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
