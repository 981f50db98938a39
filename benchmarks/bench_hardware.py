"""Hardware benchmark: what this machine computes natively, each precision and preset
on the full-size SD 1.5 or SDXL architecture, and the memory estimate against the measured peak.

For each size (default 256 and 512) and each run (default: f32, bf16, `f32,MODEL=bf16`, int8 and
the presets quality/balanced/memory/fast), one child process runs workflows/txt2img_sd15.json
(euler, STEPS steps, batch 1, CFG 7) on the seeded random full-size checkpoint of
bench_runtime.py, and reports s/step (sampler steps after the first), peak RSS (VmHWM) and its
images; PSNR and SSIM are against the f32 run of the same size. Presets that resolve to the same
per-model SPECs as a run already measured on this machine are not run again (the table says
which). The parent also prints `mixgraph estimate`'s prediction for every run, and its error
against the measured peak.

`--arch sdxl` runs the same graph (ComfyUI's default txt2img, which is also SDXL base's) on a
seeded random full-size SDXL base checkpoint (`nodes.weights.synthetic.write_sdxl_checkpoint`,
13.9 GB in f32, streamed to $MIXGRAPH_BENCH_DIR on first use); its default runs are f32 and the
`memory` preset.

ComfyUI itself is not installed here (nothing is downloaded), so the side-by-side with ComfyUI's
CPU default is not measured; its stand-in is our f32 run (`--precision f32` / `quality`), which
keeps ComfyUI parity (benchmarks/PARITY.md). Ratios are within this process tree, same machine.

    python benchmarks/bench_hardware.py [--arch sd15|sdxl] [--sizes 256,512] [--steps 3]
        [--runs "f32;bf16"] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runtime import BENCH_DIR, full_checkpoint, warm_page_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WF = ROOT / "workflows" / "txt2img_sd15.json"
DEFAULT_RUNS = {"sd15": "f32;bf16;f32,MODEL=bf16;int8;quality;balanced;memory;fast",
                "sdxl": "f32;memory"}
CKPT_NAME = {"sd15": "sd15.safetensors", "sdxl": "sdxl_base.safetensors"}


def sdxl_full_checkpoint(dtype: str = "f32", seed: int = 0) -> Path:
    """The cached full-size SDXL base checkpoint (streamed to disk on first use)."""
    from mixgraph.graph.precision import parse_spec
    from mixgraph.nodes.weights.synthetic import write_sdxl_checkpoint

    path = BENCH_DIR / f"sdxl-full-{dtype}-seed{seed}.safetensors"
    if not path.exists():
        t0 = time.perf_counter()
        write_sdxl_checkpoint(path, size="full", seed=seed, dtype=parse_spec(dtype).storage)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.1f} GB) in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def _models(arch: str) -> Path:
    ckpt = full_checkpoint() if arch == "sd15" else sdxl_full_checkpoint()
    link = BENCH_DIR / "models" / "checkpoints" / CKPT_NAME[arch]
    if not link.exists() or os.stat(link).st_ino != os.stat(ckpt).st_ino:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        os.link(ckpt, link)
    warm_page_cache(link)
    return link.parents[1]


def _sets(arch: str, size: int, steps: int) -> dict:
    return {"4.ckpt_name": CKPT_NAME[arch], "5.width": size, "5.height": size, "3.steps": steps}


def child(cfg: dict) -> None:
    import torch

    from mixgraph.ui.bench.bench_precision import emit_child_result, peak_rss_bytes, rss_bytes, run_measured

    base = rss_bytes()
    m = run_measured(str(WF), cfg["spec"], env_kw={"models": cfg["models"], "output": cfg["output"]},
                     set=_sets(cfg["arch"], cfg["size"], cfg["steps"]))
    torch.save([i.float() for i in m.pop("images")], cfg["images"])
    emit_child_result({"s_per_step": m["s_per_step"], "seconds": m["seconds"],
                       "node_seconds": m["node_seconds"], "nan_fallbacks": m["nan_fallbacks"],
                       "warnings": m["warnings"], "peak_rss_bytes": peak_rss_bytes(),
                       "base_rss_bytes": base})


def resolved(spec: str) -> tuple:
    from mixgraph.graph.precision import Resolver, parse_precision_arg

    default, types = parse_precision_arg(spec)
    r = Resolver(None, types, default)
    return tuple(r.policy("x", s).spec for s in ("MODEL", "CLIP", "VAE"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(DEFAULT_RUNS), default="sd15")
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--runs", default=None, help="';'-separated --precision arguments "
                    "(default: per --arch, " + "; ".join(f"{a}: {r}" for a, r in DEFAULT_RUNS.items()) + ")")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from mixgraph.graph.env import Env
    from mixgraph.graph.precision import hardware_section
    from mixgraph.ui import api
    from mixgraph.ui.bench.bench_precision import fmt_bytes, format_table, psnr, run_child, ssim
    from mixgraph.ui.estimate import estimate

    models = _models(args.arch)
    ckpt = models / "checkpoints" / CKPT_NAME[args.arch]
    hw = hardware_section("cpu")
    reg = api.default_registry()
    env = Env.from_args(models=str(models))
    runs = [r.strip() for r in (args.runs or DEFAULT_RUNS[args.arch]).split(";") if r.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mixgraph-hw-") as tmp:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            wf = api.set_inputs(api.load(str(WF), reg), _sets(args.arch, size, args.steps))
            ref, seen = None, {}
            for i, spec in enumerate(runs):
                key = resolved(spec)
                row = {"size": size, "precision": spec, "resolved": "/".join(key)}
                est = estimate(wf, reg, env, spec)
                row["estimate_bytes"] = est["peak_bytes"]
                if key in seen:
                    row.update(seen[key], same_as=seen[key]["precision"])
                    row["precision"] = spec
                    rows.append(row)
                    continue
                images = f"{tmp}/img_{size}_{i}.pt"
                warm_page_cache(ckpt)
                res = run_child([__file__, "child", json.dumps(
                    {"spec": spec, "arch": args.arch, "size": size, "steps": args.steps,
                     "models": str(models),
                     "output": f"{tmp}/out", "images": images})])
                imgs = torch.load(images)
                ref = ref if ref is not None else imgs
                row.update(s_per_step=res["s_per_step"], peak_rss_bytes=res["peak_rss_bytes"],
                           nan_fallbacks=res["nan_fallbacks"], warnings=res["warnings"],
                           psnr_db=min(psnr(a, b) for a, b in zip(imgs, ref)),
                           ssim=min(ssim(a, b) for a, b in zip(imgs, ref)))
                row["estimate_error"] = row["estimate_bytes"] / row["peak_rss_bytes"] - 1
                seen[key] = {k: v for k, v in row.items() if k not in ("precision", "estimate_bytes")}
                seen[key]["precision"] = spec
                rows.append(row)
                per_step = row["s_per_step"] or float("nan")
                print(f"{args.arch} {size} {spec}: {per_step:.2f} s/step, "
                      f"{fmt_bytes(row['peak_rss_bytes'])}, estimate {fmt_bytes(row['estimate_bytes'])} "
                      f"({100 * row['estimate_error']:+.0f}%)", file=sys.stderr)
        for size in {r["size"] for r in rows}:
            f32 = next((r for r in rows if r["size"] == size and r["precision"] == "f32"), None)
            for r in rows:
                if f32 is not None and r["size"] == size and r.get("s_per_step"):
                    r["vs_f32"] = r["s_per_step"] / f32["s_per_step"]
    result = {"arch": args.arch, "hardware": hw, "threads": torch.get_num_threads(), "steps": args.steps,
              "comfyui": "not measured: ComfyUI is not installed here; f32 (ComfyUI parity) is "
                         "the reference", "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return
    print(f"{args.arch}; CPU: {hw['name']}; native bf16 {hw['native_bf16']}, f16 {hw['native_f16']}, "
          f"int8 {hw['native_int8']} ({hw['why']}); auto = {hw['auto']}")
    print(format_table(rows, [
        ("size", "size", str), ("precision", "precision", str), ("resolved", "MODEL/CLIP/VAE", str),
        ("s_per_step", "s/step", lambda x: f"{x:.2f}"), ("vs_f32", "vs f32", lambda x: f"{x:.2f}x"),
        ("peak_rss_bytes", "peak RSS", fmt_bytes), ("estimate_bytes", "estimate", fmt_bytes),
        ("estimate_error", "est. err", lambda x: f"{100 * x:+.0f}%"),
        ("psnr_db", "PSNR", lambda x: "identical" if math.isinf(x) else f"{x:.1f} dB"),
        ("ssim", "SSIM", lambda x: f"{x:.4f}"), ("same_as", "same as", str)]))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
    else:
        main()
