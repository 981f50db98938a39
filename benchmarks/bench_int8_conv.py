"""Per-convolution timing of int8 against f32 on the full-size SD 1.5 UNet.

Every distinct (conv, input shape) of one UNet call (SIZE px, batch 2 as under CFG; shapes taken
from a forward on the meta device, so nothing full-size is allocated) is timed once as
nn.Conv2d in f32 and once as `Int8Conv2d` (after one warm-up call each) on seeded random
weights and inputs, and the times are summed over the UNet's conv calls. One torch thread. Prints
one line per conv shape, then the totals (or one JSON object with --json).

    python benchmarks/bench_int8_conv.py [--size 256] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixgraph.nodes.weights.cast import Int8Conv2d  # noqa: E402
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows, total = [], {"f32": 0.0, "int8": 0.0}
    for (cin, cout, k, s, p, shape), n in sorted(conv_calls(args.size).items()):
        conv = nn.Conv2d(cin, cout, k, s, p)
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * (cin * k[0] * k[1]) ** -0.5)
        x = torch.randn(shape, generator=gen)
        row = {"conv": f"{cin}->{cout} k{k[0]}x{k[1]} s{s[0]}", "input": list(shape), "calls": n}
        with torch.no_grad():
            for name, f in (("f32", conv), ("int8", Int8Conv2d(conv, torch.float32))):
                f(x)
                t = time.perf_counter()
                f(x)
                row[f"{name}_s"] = time.perf_counter() - t
                total[name] += n * row[f"{name}_s"]
        rows.append(row)
        if not args.json:
            print(f"{row['conv']} {shape} x{n}: f32 {row['f32_s'] * 1e3:.0f} ms, int8 {row['int8_s'] * 1e3:.0f} ms",
                  flush=True)
    calls = sum(r["calls"] for r in rows)
    if args.json:
        print(json.dumps({"size": args.size, "conv_calls": calls, "f32_s": total["f32"], "int8_s": total["int8"],
                          "convs": rows}))
    else:
        print(f"convs of one UNet call ({calls} calls): f32 {total['f32']:.1f} s, int8 {total['int8']:.1f} s "
              f"({total['int8'] / total['f32']:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
