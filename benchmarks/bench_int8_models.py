"""Whole diffusion-model calls under int8 against f32 and bf16, and how close int8 runs to the
int8 GEMM limit of this CPU.

Models (seeded random weights: matrices N(0, 0.02), vectors as built; random weights time the
same as trained ones):
- `sd15`: the full-size SD 1.5 UNet, batch 2 (as under CFG), SIZE px (latent SIZE/8), 77 tokens;
- `flux`: a slice of Flux.1-dev at full width (hidden 3072, 24 heads, MLP 12288) with
  `--flux-depth D,S` double / single blocks (default 1,2: a twentieth of the 19 + 38), batch 1,
  SIZE px (SIZE^2/256 image tokens), 256 text tokens. Its Linears are what a whole Flux step
  spends its time in; the ratios carry over, the seconds scale with the block count.

Each model is converted once per SPEC with `apply_precision` (the runtime's path), then the
calls are interleaved: `--repeats` rounds calling every SPEC once (the first round is warm-up
and packs oneDNN's weights), so load from other processes hits all alike; the minimum is
reported. SNR of each output against the f32 output, in dB.

The limit (`--limit`): `torch._int_mm` on a 4096^3 int8 GEMM (oneDNN s8s8s32) gives this CPU's
int8 multiply-accumulate rate; the int8 kernels' share of one int8 call (torch profiler: oneDNN's
convolution and Linear ops) divided into the call's int8 MACs (counted from the layer shapes)
gives the rate the model's int8 layers reach, and their ratio says how far from the limit they
run.

    python benchmarks/bench_int8_models.py [--models sd15,flux] [--sizes 256,512]
        [--specs f32,bf16,int8,int8:bf16] [--repeats 3] [--limit] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixgraph.graph.precision import parse_spec  # noqa: E402
from mixgraph.nodes.weights.cast import Int8Conv2d, Int8Linear, apply_precision  # noqa: E402

INT8_OPS = ("onednn::qconv2d_pointwise", "quantized::linear_dynamic", "aten::_int_mm")


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def sd15(size: int, _args) -> tuple[nn.Module, tuple, dict]:
    from mixgraph.nodes.families.sd.unet import UNetModel
    from mixgraph.nodes.weights.synthetic import SD15_UNET

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, SD15_UNET.in_channels, size // 8, size // 8, generator=gen)
    ctx = torch.randn(2, 77, SD15_UNET.context_dim, generator=gen)
    return _randomize(UNetModel(SD15_UNET)), (x, torch.tensor([500.0, 500.0]), ctx), {}


def flux(size: int, args) -> tuple[nn.Module, tuple, dict]:
    from mixgraph.nodes.families.flux.family import FLUX
    from mixgraph.nodes.families.flux.model import FluxConfig

    depth, single = (int(v) for v in args.flux_depth.split(","))
    cfg = FluxConfig(depth=depth, depth_single_blocks=single)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, cfg.in_channels, size // 8, size // 8, generator=gen)
    ctx = torch.randn(1, 256, cfg.context_in_dim, generator=gen)
    kw = {"y": torch.randn(1, cfg.vec_in_dim, generator=gen), "guidance": torch.tensor([3.5])}
    return _randomize(FLUX.build(cfg)), (x, torch.tensor([0.5]), ctx), kw


MODELS = {"sd15": sd15, "flux": flux}


def int8_macs(model: nn.Module, args: tuple, kwargs: dict) -> int:
    """Multiply-accumulates of one call's int8 layers (from their input shapes)."""
    total = 0

    def count(m: nn.Module, inputs: tuple) -> None:
        nonlocal total
        x = inputs[0]
        if isinstance(m, Int8Linear):
            total += x.numel() // m.in_features * m.in_features * m.out_features
        else:  # Int8Conv2d: output pixels x C_out x C_in*kh*kw
            ho, wo = m._out_hw(x.shape[2], x.shape[3])
            total += x.shape[0] * ho * wo * m.out_channels * m.in_channels * m.kernel_size[0] * m.kernel_size[1]

    hooks = [m.register_forward_pre_hook(count) for m in model.modules() if isinstance(m, (Int8Linear, Int8Conv2d))]
    try:
        with torch.inference_mode():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return total


def int8_kernel_seconds(model: nn.Module, args: tuple, kwargs: dict) -> tuple[float, float]:
    """(seconds in the int8 kernels, seconds of the whole call) from one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        model(*args, **kwargs)
        wall = time.perf_counter() - t0
    kernels = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in INT8_OPS) / 1e6
    return kernels, wall


def gemm_limit(n: int = 4096, repeats: int = 3) -> float:
    """int8 multiply-accumulates per second of `torch._int_mm` on an n^3 GEMM (best of repeats)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (n, n), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (n, n), dtype=torch.int8, generator=gen)
    torch._int_mm(a, b)
    best = min(_timed(lambda: torch._int_mm(a, b)) for _ in range(repeats))
    return n ** 3 / best


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def snr_db(y: torch.Tensor, ref: torch.Tensor) -> float:
    err = (y.double() - ref.double()).pow(2).mean()
    return float("inf") if err == 0 else float(10 * torch.log10(ref.double().pow(2).mean() / err))


def bench_model(name: str, size: int, specs: list[str], repeats: int, args) -> dict:
    model, inputs, kwargs = MODELS[name](size, args)
    converted = {s: apply_precision(model, parse_spec(s)) for s in specs}
    del model
    times: dict[str, list[float]] = {s: [] for s in specs}
    outs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for r in range(repeats + 1):
            for s, m in converted.items():
                t0 = time.perf_counter()
                y = m(*inputs, **kwargs)
                if r:
                    times[s].append(time.perf_counter() - t0)
                outs[s] = y.float()
    ref = outs.get("f32")
    rows = {}
    for s in specs:
        row = {"s_per_call": min(times[s]), "all": [round(t, 3) for t in times[s]]}
        if ref is not None and s != "f32":
            row["snr_db"] = round(snr_db(outs[s], ref), 2)
        rows[s] = row
    for s in specs:
        for base in ("f32", "bf16"):
            if base in rows and s != base:
                rows[s][f"x_vs_{base}"] = round(rows[base]["s_per_call"] / rows[s]["s_per_call"], 3)
    out = {"model": name, "size": size, "rows": rows}
    int8_spec = next((s for s in specs if parse_spec(s).int8), None)
    if args.limit and int8_spec is not None:
        m = converted[int8_spec]
        macs = int8_macs(m, inputs, kwargs)
        kernel_s, wall = int8_kernel_seconds(m, inputs, kwargs)
        out["int8_layers"] = {"spec": int8_spec, "macs": macs, "kernel_s": round(kernel_s, 4),
                              "call_s": round(wall, 4), "kernel_share": round(kernel_s / wall, 3),
                              "gmacs_per_s": round(macs / kernel_s / 1e9, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="sd15,flux")
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--specs", default="f32,bf16,int8,int8:bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flux-depth", default="1,2", help="double,single blocks of the Flux slice")
    ap.add_argument("--limit", action="store_true", help="measure the int8 GEMM limit and the int8 layers' rate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    specs = [s.strip() for s in args.specs.split(",") if s.strip()]
    for s in specs:
        parse_spec(s)  # a bad SPEC fails before anything runs
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    result: dict = {"threads": torch.get_num_threads(), "runs": []}
    if args.limit:
        result["int8_gemm_limit_gmacs_per_s"] = round(gemm_limit() / 1e9, 1)
    for name in args.models.split(","):
        for size in (int(v) for v in args.sizes.split(",")):
            run = bench_model(name, size, specs, args.repeats, args)
            result["runs"].append(run)
            if not args.json:
                print(f"{name} {size} px:")
                for s, row in run["rows"].items():
                    extra = "  ".join(f"{k} {v}" for k, v in row.items() if k not in ("s_per_call", "all"))
                    print(f"  {s:10s} {row['s_per_call']:.3f} s/call  {extra}")
                if "int8_layers" in run:
                    il = run["int8_layers"]
                    limit = result["int8_gemm_limit_gmacs_per_s"]
                    print(f"  int8 layers: {il['gmacs_per_s']} GMAC/s ({il['gmacs_per_s'] / limit:.2f} of the "
                          f"_int_mm limit {limit}), {il['kernel_share']:.0%} of the {il['spec']} call")
            sys.stdout.flush()
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
