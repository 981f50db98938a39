"""Per-convolution and per-Linear timing of int8 against f32 and bf16.

Convolutions: every distinct (conv, input shape) of one full-size SD 1.5 UNet call (SIZE px,
batch 2 as under CFG; shapes taken from a forward on the meta device, so nothing full-size is
allocated) is timed as nn.Conv2d in f32, in bf16 (channels_last, oneDNN: what `bf16` runs on
CPU) and as `Int8Conv2d` with each kernel ("onednn": oneDNN's int8 convolution, on CPUs with
native int8 dot products only; "gemm": im2col + `torch._int_mm`), after one warm-up call each, on
seeded random weights and post-SiLU inputs; times are summed over the UNet's conv calls, and
each int8 kernel's SNR against the f32 output is printed (worst over the shapes).

Linears (`--linears`): DiT shapes (3072x3072, 3072x12288 and 12288x3072 at 256-4096 tokens) as
F.linear in f32 and bf16, as `Int8Linear` (per-token `torch._int_mm`), and as oneDNN's
dynamic quantized Linear (`quantized::linear_dynamic`, per-tensor activations: for comparison).

One torch thread. Prints one line per shape, then the totals (or one JSON object with --json).

    python benchmarks/bench_int8_conv.py [--size 256] [--linears] [--tokens 256,1024,4096] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixgraph.nodes.weights.cast import Int8Conv2d, Int8Linear, onednn_int8_conv_available  # noqa: E402
from mixgraph.nodes.weights.synthetic import SD15_UNET  # noqa: E402
from mixgraph.nodes.families.sd.unet import UNetModel  # noqa: E402


def conv_calls(size: int) -> collections.Counter:
    """(in, out, kernel, stride, padding, input shape) -> calls in one UNet forward."""
    with torch.device("meta"):
        unet = UNetModel(SD15_UNET)
    calls: collections.Counter = collections.Counter()

    def hook(m: nn.Conv2d, args: tuple) -> None:
        calls[(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, tuple(args[0].shape))] += 1

    for m in unet.modules():
        if type(m) is nn.Conv2d:
            m.register_forward_pre_hook(hook)
    with torch.no_grad():
        unet(torch.empty(2, SD15_UNET.in_channels, size // 8, size // 8, device="meta"),
             torch.empty(2, device="meta"), torch.empty(2, 77, SD15_UNET.context_dim, device="meta"))
    return calls


def _time(f, x) -> float:
    f(x)
    t = time.perf_counter()
    f(x)
    return time.perf_counter() - t


def _snr_db(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.double().pow(2).mean() / (y.double() - ref.double()).pow(2).mean()))


def bench_convs(size: int, gen: torch.Generator, print_rows: bool) -> dict:
    kernels = ["onednn", "gemm"] if onednn_int8_conv_available(env={}) else ["gemm"]
    names = ["f32", "bf16", *(f"int8_{k}" for k in kernels)]
    rows, total, worst = [], dict.fromkeys(names, 0.0), dict.fromkeys(kernels, math.inf)
    for (cin, cout, k, s, p, shape), n in sorted(conv_calls(size).items()):
        conv = nn.Conv2d(cin, cout, k, s, p)
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * (cin * k[0] * k[1]) ** -0.5)
        x = F.silu(torch.randn(shape, generator=gen))  # a UNet conv's input: GroupNorm + SiLU
        half = nn.Conv2d(cin, cout, k, s, p).to(torch.bfloat16, memory_format=torch.channels_last)
        half.load_state_dict({key: v.bfloat16() for key, v in conv.state_dict().items()})
        row = {"conv": f"{cin}->{cout} k{k[0]}x{k[1]} s{s[0]}", "input": list(shape), "calls": n}
        with torch.no_grad():
            ref = conv(x)
            row["f32_s"] = _time(conv, x)
            row["bf16_s"] = _time(lambda t: half(t.to(torch.bfloat16, memory_format=torch.channels_last)), x)
            for kern in kernels:
                q = Int8Conv2d(conv, torch.float32)
                q.kernel = kern
                row[f"int8_{kern}_s"] = _time(q, x)
                row[f"int8_{kern}_snr_db"] = _snr_db(q(x), ref)
                worst[kern] = min(worst[kern], row[f"int8_{kern}_snr_db"])
        for name in names:
            total[name] += n * row[f"{name}_s"]
        rows.append(row)
        if print_rows:
            print(f"{row['conv']} {shape} x{n}: " + ", ".join(f"{name} {row[name + '_s'] * 1e3:.0f} ms"
                                                            for name in names), flush=True)
    return {"size": size, "conv_calls": sum(r["calls"] for r in rows), "total_s": total,
            "worst_snr_db": worst, "convs": rows}


LINEAR_SHAPES = ((3072, 3072), (3072, 12288), (12288, 3072))  # (in, out): DiT attention, MLP up, down


def bench_linears(tokens: list[int], gen: torch.Generator, print_rows: bool) -> list[dict]:
    rows = []
    for k, n in LINEAR_SHAPES:
        lin = nn.Linear(k, n)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=gen) * k ** -0.5)
        half = nn.Linear(k, n).to(torch.bfloat16)
        half.load_state_dict({key: v.bfloat16() for key, v in lin.state_dict().items()})
        q = Int8Linear(lin, torch.float32)
        packed = None
        if "onednn" in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = "onednn"
            w = lin.weight.detach()
            scale = (w.abs().amax(dim=1) / 127).double()
            packed = torch.ops.quantized.linear_prepack(torch.quantize_per_channel(
                w, scale, torch.zeros(n, dtype=torch.int64), 0, torch.qint8), lin.bias.detach())
        for m in tokens:
            x = torch.randn(m, k, generator=gen)
            row = {"linear": f"{k}x{n}", "tokens": m}
            with torch.no_grad():
                ref = lin(x)
                row["f32_s"] = _time(lin, x)
                row["bf16_s"] = _time(lambda t: half(t.to(torch.bfloat16)), x)
                row["int8_s"] = _time(q, x)
                row["int8_snr_db"] = _snr_db(q(x), ref)
                if packed is not None:
                    dyn = lambda t: torch.ops.quantized.linear_dynamic(t, packed)  # noqa: E731
                    row["dynamic_s"] = _time(dyn, x)
                    row["dynamic_snr_db"] = _snr_db(dyn(x), ref)
            rows.append(row)
            if print_rows:
                print(f"linear {k}x{n} x{m} tokens: f32 {row['f32_s'] * 1e3:.0f} ms, bf16 {row['bf16_s'] * 1e3:.0f}"
                      f" ms, int8 {row['int8_s'] * 1e3:.0f} ms ({row['int8_snr_db']:.1f} dB)"
                      + (f", linear_dynamic {row['dynamic_s'] * 1e3:.0f} ms ({row['dynamic_snr_db']:.1f} dB)"
                         if packed is not None else ""), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--no-convs", action="store_true", help="skip the UNet convolutions")
    ap.add_argument("--linears", action="store_true", help="time the DiT Linear shapes too")
    ap.add_argument("--tokens", default="256,1024,4096")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*quantize.*deprecated")
    gen = torch.Generator().manual_seed(0)
    out: dict = {}
    if not args.no_convs:
        out["convs"] = res = bench_convs(args.size, gen, not args.json)
        if not args.json:
            t = res["total_s"]
            print(f"convs of one UNet call at {args.size} px ({res['conv_calls']} calls): "
                  + ", ".join(f"{name} {v:.2f} s ({v / t['f32']:.2f}x f32)" for name, v in t.items())
                  + "; worst SNR vs f32: " + ", ".join(f"{k} {v:.1f} dB" for k, v in res["worst_snr_db"].items()))
    if args.linears:
        out["linears"] = bench_linears([int(t) for t in args.tokens.split(",") if t], gen, not args.json)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
