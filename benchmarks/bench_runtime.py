"""UNet runtime benchmark: load time, peak RSS and seconds per UNet step, against
diffusers' UNet2DConditionModel on the same weights.

The checkpoint is a full-size SD 1.5-architecture single file (UNet ~860 M parameters, plus VAE and
text encoder) made from seeded random weights (`nodes.weights.synthetic`), written once to
$MIXGRAPH_BENCH_DIR (default /tmp/mixgraph-bench) and reused. Random weights time the same as
trained ones. The file is read once before measuring, so every number is from the page cache.

Two parts:

steps   One process holds four UNets on the same weights: ours in f32 and with bf16 storage /
        f32 compute (`bf16:f32`, through the handle → weight store → apply_precision path that
        workflows use), and diffusers' in f32 and with `enable_layerwise_casting(bf16, f32)`.
        At each size, batch 2 (CFG), one warm-up call each, then `--repeats` rounds calling each
        model once per round (interleaved, so load from other processes hits all alike); the
        minimum is reported and the ratio ours / diffusers is taken from those minima.
load    Each variant in its own child process, so peak RSS is its own: time from opening the
        file to the end of the first UNet step, and the child's peak RSS (VmHWM), for ours f32,
        ours bf16:f32 (from the f32 file, and from a bf16 copy of it), and the plain baseline:
        `safetensors.torch.load_file` of the file, `UNetModel(cfg)` built the ordinary way,
        `load_state_dict`, (for bf16:f32 then `apply_precision`), first step. Variants run in
        rounds (`--load-repeats`), alternating; the minimum time is reported. "RSS+" columns
        subtract the child's RSS before loading (interpreter + torch + diffusers).
        "RSS+ load" is the peak growth up to the end of loading (the weights' footprint), "RSS+
        1st step" up to the end of the first step (plus activations and per-layer casts).

    python benchmarks/bench_runtime.py [--sizes 256,512] [--repeats 2] [--load-repeats 2]
                                       [--part steps|load|all] [--json]

Prints tables; with --json one JSON document instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixgraph.graph.precision import parse_spec  # noqa: E402
from mixgraph.ui.bench.bench_precision import (emit_child_result, fmt_bytes, fmt_s,  # noqa: E402
                                               format_table, peak_rss_bytes, rss_bytes, run_child)
from mixgraph.nodes.weights.cast import apply_precision, weight_bytes  # noqa: E402

UNET_PREFIX = "model.diffusion_model."
BENCH_DIR = Path(os.environ.get("MIXGRAPH_BENCH_DIR", "/tmp/mixgraph-bench"))


def full_checkpoint(dtype: str = "f32", seed: int = 0) -> Path:
    """The cached full-size SD 1.5-architecture checkpoint (written on first use, atomically)."""
    from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint

    path = BENCH_DIR / f"sd15-full-{dtype}-seed{seed}.safetensors"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        t0 = time.perf_counter()
        write_sd15_checkpoint(tmp, size="full", seed=seed, dtype=parse_spec(dtype).storage)
        tmp.replace(path)
        print(f"wrote {path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def step_inputs(size: int, batch: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B,4,size/8,size/8], timesteps [B], context [B,77,768]: one CFG batch."""
    g = torch.Generator().manual_seed(seed)
    lat = size // 8
    return (torch.randn(batch, 4, lat, lat, generator=g), torch.full((batch,), 500.0),
            torch.randn(batch, 77, 768, generator=g))


def diffusers_unet(ldm_state: dict[str, torch.Tensor], layerwise: torch.dtype | None = None):
    """diffusers' SD1.5 UNet2DConditionModel holding the same tensors (assigned, not copied);
    `layerwise`: enable_layerwise_casting(storage=layerwise, compute=f32)."""
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    with torch.device("meta"):
        ref = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
    sd = convert_ldm_unet_checkpoint({UNET_PREFIX + k: v for k, v in ldm_state.items()}, dict(ref.config))
    ref.load_state_dict(sd, strict=True, assign=True)
    ref.eval().requires_grad_(False)
    if layerwise is not None:
        ref.enable_layerwise_casting(storage_dtype=layerwise, compute_dtype=torch.float32)
    return ref


def ours(path: Path, spec: str):
    """Our UNet as a workflow gets it: checkpoint detection, weight store, apply_precision."""
    from mixgraph.nodes.models.loader import load_checkpoint

    model, _, _ = load_checkpoint(path)
    return model.runner(parse_spec(spec))


# --------------------------------------------------------------------------------------------
# part 1: seconds per step, interleaved in one process


def bench_steps(path: Path, sizes: list[int], repeats: int) -> dict:
    from mixgraph.nodes.weights import store

    f32 = ours(path, "f32")
    bf16 = ours(path, "bf16:f32")
    state = store.STORE.state_dict("unet", f32.handle.source, f32.handle.config, torch.float32)
    models = {
        "mixgraph f32": lambda x, t, c: f32.unet(x, t, c),
        "diffusers f32": (lambda m: lambda x, t, c: m(x, t, c).sample)(diffusers_unet(state)),
        "mixgraph bf16:f32": lambda x, t, c: bf16.unet(x, t, c),
        "diffusers bf16:f32": (lambda m: lambda x, t, c: m(x, t, c).sample)(diffusers_unet(state, torch.bfloat16)),
    }
    rows = []
    with torch.inference_mode():
        for size in sizes:
            x, t, c = step_inputs(size)
            outs = {name: fn(x, t, c) for name, fn in models.items()}  # warm-up, and outputs agree?
            times: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(repeats):
                for name, fn in models.items():
                    t0 = time.perf_counter()
                    fn(x, t, c)
                    times[name].append(time.perf_counter() - t0)
            ref = outs["diffusers f32"]
            for name in models:
                pair = "diffusers " + name.split(" ", 1)[1]
                best = min(times[name])
                rows.append({
                    "size": size, "model": name, "s_per_step": best,
                    "median_s": statistics.median(times[name]),
                    "vs_diffusers": best / min(times[pair]) if name.startswith("mixgraph") else None,
                    "rel_err_vs_diffusers_f32": ((outs[name] - ref).norm() / ref.norm()).item(),
                })
    return {"batch": 2, "repeats": repeats, "rows": rows,
            "weight_bytes": {"f32": weight_bytes(f32.model), "bf16:f32": weight_bytes(bf16.model)}}


# --------------------------------------------------------------------------------------------
# part 2: open → first step, peak RSS, one child process per variant


def load_child(variant: str, path: str, size: int) -> dict:
    """In a child: open the file, build the UNet, run one step; time and peak RSS."""
    import diffusers  # noqa: F401 - imported in every variant so the start RSS is comparable
    from safetensors.torch import load_file

    from mixgraph.nodes.models.loader import load_checkpoint
    from mixgraph.nodes.families.sd.unet import UNetModel

    x, t, c = step_inputs(size)
    base = rss_bytes()
    t0 = time.perf_counter()
    spec = LOAD_VARIANTS[variant][0]
    if variant.startswith("baseline"):
        sd = load_file(path)
        cfg = load_checkpoint(path)[0].config
        model = UNetModel(cfg).eval().requires_grad_(False)
        model.load_state_dict({k[len(UNET_PREFIX):]: v for k, v in sd.items() if k.startswith(UNET_PREFIX)})
        del sd
        if spec != "f32":
            model = apply_precision(model, parse_spec(spec))
        step = model
    else:
        runner = ours(Path(path), spec)
        model = runner.model
        step = runner.unet
    t_load = time.perf_counter() - t0
    peak_load = peak_rss_bytes()
    with torch.inference_mode():
        step(x, t, c)
    total = time.perf_counter() - t0
    return {"variant": variant, "size": size, "load_s": t_load, "first_step_total_s": total,
            "peak_rss_bytes": peak_rss_bytes(), "load_peak_rss_bytes": peak_load, "base_rss_bytes": base,
            "weight_bytes": weight_bytes(model)}


# variant -> (SPEC, dtype of the file read). The bf16 baseline is the plain f32 load followed by
# apply_precision (the plain way to a bf16-storage model).
LOAD_VARIANTS = {
    "mixgraph f32": ("f32", "f32"),
    "baseline f32": ("f32", "f32"),
    "mixgraph bf16:f32": ("bf16:f32", "f32"),
    "baseline bf16:f32": ("bf16:f32", "f32"),
    "mixgraph bf16:f32, bf16 file": ("bf16:f32", "bf16"),
}


def bench_load(path: Path, sizes: list[int], repeats: int, bf16_path: Path | None) -> dict:
    files = {"f32": path, "bf16": bf16_path}
    variants = [v for v, (_, dtype) in LOAD_VARIANTS.items() if files[dtype] is not None]
    results: dict[tuple[int, str], list[dict]] = {}
    for size in sizes:
        for _ in range(repeats):
            for v in variants:
                file = files[LOAD_VARIANTS[v][1]]
                warm_page_cache(file)  # this VM reclaims idle page cache; time CPU work, not the disk
                r = run_child([__file__, "--child", v, "--size", str(size), "--checkpoint", str(file)])
                results.setdefault((size, v), []).append(r)
    rows = []
    for (size, v), rs in results.items():
        best = min(rs, key=lambda r: r["first_step_total_s"])
        peak = max(r["peak_rss_bytes"] for r in rs)
        growth = max(r["peak_rss_bytes"] - r["base_rss_bytes"] for r in rs)
        load_growth = max(r["load_peak_rss_bytes"] - r["base_rss_bytes"] for r in rs)
        baseline = "baseline " + LOAD_VARIANTS[v][0]
        base_total = min(r["first_step_total_s"] for r in results[(size, baseline)])
        rows.append({"size": size, "variant": v, "load_s": best["load_s"], "first_step_total_s": best["first_step_total_s"],
                     "vs_baseline": best["first_step_total_s"] / base_total, "vs_baseline_f32":
                     best["first_step_total_s"] / min(r["first_step_total_s"] for r in results[(size, "baseline f32")]),
                     "peak_rss_bytes": peak, "load_growth_bytes": load_growth, "rss_growth_bytes": growth,
                     "weight_bytes": best["weight_bytes"], "load_over_weights": load_growth / best["weight_bytes"],
                     "growth_over_weights": growth / best["weight_bytes"]})
    return {"batch": 2, "repeats": repeats, "rows": rows}


STEP_COLUMNS = [("size", "size", str), ("model", "UNet", str), ("s_per_step", "s/step (min)", lambda x: f"{x:.3f}"),
                ("median_s", "median", lambda x: f"{x:.3f}"), ("vs_diffusers", "vs diffusers", lambda x: f"{x:.2f}x"),
                ("rel_err_vs_diffusers_f32", "rel. err vs diffusers f32", lambda x: f"{x:.1e}")]
LOAD_COLUMNS = [("size", "size", str), ("variant", "variant", str), ("load_s", "load", fmt_s),
                ("first_step_total_s", "open→1st step", fmt_s), ("vs_baseline", "vs baseline", lambda x: f"{x:.2f}x"),
                ("vs_baseline_f32", "vs baseline f32", lambda x: f"{x:.2f}x"),
                ("weight_bytes", "UNet weights", fmt_bytes), ("peak_rss_bytes", "peak RSS", fmt_bytes),
                ("load_growth_bytes", "RSS+ load", fmt_bytes), ("load_over_weights", "/weights", lambda x: f"{x:.2f}"),
                ("rss_growth_bytes", "RSS+ 1st step", fmt_bytes), ("growth_over_weights", "/weights", lambda x: f"{x:.2f}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256,512", help="image sizes in pixels (latent = size/8)")
    ap.add_argument("--repeats", type=int, default=2, help="timed rounds per size in the step part")
    ap.add_argument("--load-repeats", type=int, default=2, help="child processes per variant and size")
    ap.add_argument("--part", choices=("steps", "load", "all"), default="all")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--checkpoint", help="use this SD1.5 checkpoint instead of the generated one")
    ap.add_argument("--no-bf16-file", action="store_true", help="skip the variant reading a bf16 file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit_child_result(load_child(args.child, args.checkpoint, args.size))
        return
    path = Path(args.checkpoint) if args.checkpoint else full_checkpoint()
    sizes = [int(s) for s in args.sizes.split(",")]
    bf16_path = None if args.checkpoint or args.no_bf16_file else full_checkpoint("bf16")
    warm_page_cache(path)
    out: dict = {"checkpoint": str(path), "threads": torch.get_num_threads(), "torch": torch.__version__}
    if args.part in ("load", "all"):
        out["load"] = bench_load(path, sizes, args.load_repeats, bf16_path)
    if args.part in ("steps", "all"):
        out["steps"] = bench_steps(path, sizes, args.repeats)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{path} — CPU, {out['threads']} threads, batch 2 (CFG)")
    if "load" in out:
        print(f"\nopen file → end of first UNet step, one child process each (min of {args.load_repeats})")
        print(format_table(out["load"]["rows"], LOAD_COLUMNS))
    if "steps" in out:
        print(f"\nseconds per UNet step, one process, interleaved (min of {args.repeats})")
        print(format_table(out["steps"]["rows"], STEP_COLUMNS))


if __name__ == "__main__":
    main()
