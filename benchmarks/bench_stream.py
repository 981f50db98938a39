"""Weight streaming benchmark: the full-size SDXL UNet (random weights, 10.3 GB in f32) run
resident and within memory budgets of 3, 6 and 12 GiB (nodes/weights/streaming.py): peak RSS,
s/step, bytes streamed per step, and whether the output is identical to the resident run's.

The UNet is built from the real SDXL config on the meta device and a seeded random safetensors
file is written once from those shapes (`bench_dit.write_random_file`: tensor by tensor in row
chunks, never the whole model in memory) to a temporary folder (or `--models DIR` to keep it).
Each configuration is one child process (so its peak RSS, VmHWM, is its own): it sets the budget
(`memory_budget.set_budget`), materializes the UNet through the weight store in f32
(`store.materialize`, which streams what does not fit), and runs one sampling step at 256x256: one
UNet call on a batch of 2 (the cond and uncond of CFG), latent 32x32, 77 tokens of 2048, the
2816-wide vector. `s/step` is that call after the weights are placed; `load s` the materialization
(the resident part read from disk); `streamed` the bytes the step read again. The output tensor is
saved and compared with the resident run's (`torch.equal`). No timed assertions.

    python benchmarks/bench_stream.py [--budgets 3,6,12] [--arch sdxl|sd15] [--models DIR] [--json] [--tiny]

`--tiny` runs the same path on the tiny SDXL UNet with budgets of 30 %, 60 % and 90 % of its
weights (seconds; a check that the script works). The full-size run needs about 11 GB of disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

GIB = 1 << 30


def _config(tiny: bool, arch: str = "sdxl"):
    from mixgraph.nodes.weights.synthetic import SD15_UNET, SDXL_UNET, TINY_SDXL_UNET, TINY_UNET
    if arch == "sd15":
        return TINY_UNET if tiny else SD15_UNET
    return TINY_SDXL_UNET if tiny else SDXL_UNET


def _write(path: Path, tiny: bool, arch: str) -> int:
    """The random UNet file (written unless there); returns the model's f32 bytes."""
    from bench_dit import write_random_file
    from mixgraph.nodes.families.sd.unet import UNetModel
    from mixgraph.nodes.weights.synthetic import module_shapes
    shapes = module_shapes(lambda: UNetModel(_config(tiny, arch)))
    if not path.exists():
        write_random_file(path, shapes, lambda key, shape: torch.float32, seed=7)
    return sum(4 * int(torch.tensor(s).prod()) if s else 4 for s in shapes.values())


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def child(spec: dict) -> dict:
    """One configuration, in its own process (see the module docstring)."""
    from mixgraph.graph.precision import Policy
    from mixgraph.nodes.families.sd.unet import UNetModel
    from mixgraph.nodes.models import memory_budget
    from mixgraph.nodes.weights import store, streaming
    from mixgraph.nodes.weights.cast import apply_precision
    from mixgraph.nodes.weights.safetensors_io import WeightSource

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config = _config(spec["tiny"], spec["arch"])
    if spec["budget"] is not None:
        memory_budget.set_budget("cpu", spec["budget"])
    stream = None if spec["budget"] is not None else False
    policy = Policy(torch.float32, torch.float32, False, True, False)
    start = time.perf_counter()
    module = store.materialize("unet", WeightSource.from_file(spec["path"]), config, torch.float32, (),
                               UNetModel, stream=stream)
    model = apply_precision(module, policy)
    load = time.perf_counter() - start
    g = torch.Generator().manual_seed(0)
    side = spec["size"] // 8
    x = torch.randn(2, config.in_channels, side, side, generator=g)
    t = torch.tensor([999.0, 999.0])
    ctx = torch.randn(2, 77, config.context_dim, generator=g)
    y = torch.randn(2, config.adm_in_channels, generator=g) if config.adm_in_channels else None
    before = streaming.snapshot()
    start = time.perf_counter()
    with torch.no_grad():
        out = model(x, t, ctx, y)
    step = time.perf_counter() - start
    cost = streaming.since(before)
    torch.save(out, spec["out"])
    return {"budget_gib": spec["budget"], "streamed_model": streaming.is_streamed(module),
            "load_s": round(load, 3), "s_per_step": round(step, 3), "bytes_streamed": cost["bytes_streamed"],
            "stream_load_s": cost["load_seconds"], "peak_weight_bytes": cost["peak_weight_bytes"],
            "peak_rss": _peak_rss()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="3,6,12", help="budgets in GiB (default 3,6,12)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--models", metavar="DIR", help="keep the random UNet file here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--arch", choices=("sdxl", "sd15"), default="sdxl",
                    help="the UNet (default sdxl; sd15: 3.4 GB, a quicker full-size check)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    folder = Path(args.models) if args.models else Path(tempfile.mkdtemp(prefix="bench_stream_"))
    try:
        path = folder / f"{args.arch}_unet_{'tiny' if args.tiny else 'random'}.safetensors"
        total = _write(path, args.tiny, args.arch)
        budgets = ([round(f * total / 0.75 / GIB, 6) for f in (0.3, 0.6, 0.9)] if args.tiny
                   else [float(b) for b in args.budgets.split(",") if b])
        rows = []
        for budget in [None, *budgets]:
            out = folder / f"out_{budget}.pt"
            spec = {"path": str(path), "budget": budget, "tiny": args.tiny, "arch": args.arch, "size": args.size,
                    "out": str(out)}
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                  text=True, env=env)
            if proc.returncode:
                rows.append({"budget_gib": budget, "error": proc.stderr.strip().splitlines()[-1:]})
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["identical"] = bool(torch.equal(torch.load(out), torch.load(folder / "out_None.pt")))
            rows.append(row)
        result = {"arch": args.arch, "model_bytes_f32": total, "size": args.size, "tiny": args.tiny, "runs": rows}
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print(f"{args.arch.upper()} UNet{' (tiny)' if args.tiny else ''}, f32 {total / GIB:.2f} GiB, 1 step at "
                  f"{args.size}x{args.size} (batch 2)")
            print(f"{'budget':>10} {'streamed':>8} {'peak RSS':>10} {'load s':>8} {'s/step':>8} "
                  f"{'GiB/step':>9} {'identical':>9}")
            for r in rows:
                name = "resident" if r["budget_gib"] is None else f"{r['budget_gib']:g} GiB"
                if "error" in r:
                    print(f"{name:>10} error: {r['error']}")
                    continue
                print(f"{name:>10} {str(r['streamed_model']):>8} {r['peak_rss'] / GIB:>9.2f}G {r['load_s']:>8.2f} "
                      f"{r['s_per_step']:>8.2f} {r['bytes_streamed'] / GIB:>9.3f} {str(r['identical']):>9}")
    finally:
        if not args.models:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
