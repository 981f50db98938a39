"""Pipeline benchmark: whole workflows on a full-size SD 1.5-architecture checkpoint.

Workflow A is workflows/txt2img_sd15.json at 256x256 with 4 steps; workflow B is
workflows/img2img_sd15.json (4 steps, on a 256x256 input image written here), which shares A's
checkpoint. The checkpoint is the seeded random one of bench_runtime.py, hard-linked into a
models folder under $MIXGRAPH_BENCH_DIR; its content hash is computed once beforehand (as it is
remembered across runs in normal use), and the file is read once so it is in the page cache.

Each precision runs in its own child process (peak RSS is per precision), through `graph.api.run`
with the precision as the run default (the files carry no precision section):

1. cold: A from a fresh process — total time, s/step, peak RSS (VmHWM right after the run; "RSS+"
   subtracts the RSS of the process before the run: interpreter, torch, node library);
2. seed re-run: A again with only the KSampler seed changed — time, which nodes executed, and the
   weight store's disk reads and text encodings during it (goal: none);
3. alternation: B, A, B, A, each with a new seed so the sampler really runs — time of the first
   switch to B, mean time of the rest, and weight-store disk reads during all of them (goal: none;
   B's VAE encoder is part of the same checkpoint entry). "loads" counts the weight store's
   disk reads plus conversions of a cached copy to another dtype.

    python benchmarks/bench_pipeline.py [--precisions "f32;bf16:f32;f32,MODEL=bf16"] [--json]

The default precisions are f32, bf16:f32 (every model stored bf16, computing f32) and
`f32,MODEL=bf16` (the UNet stored and computing in bf16, text encoder and VAE f32).
Prints tables and the goals; with --json one JSON document instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runtime import BENCH_DIR, full_checkpoint, warm_page_cache  # noqa: E402
from mixgraph.ui.bench.bench_precision import (emit_child_result, fmt_bytes, fmt_s,  # noqa: E402
                                               format_table, parse_precision_list, peak_rss_bytes, rss_bytes,
                                               run_child, run_measured)

ROOT = Path(__file__).resolve().parents[1]
WF_A = ROOT / "workflows" / "txt2img_sd15.json"
WF_B = ROOT / "workflows" / "img2img_sd15.json"
SET_A = {"5.width": 256, "5.height": 256, "3.steps": 4}
SET_B = {"3.steps": 4}
DEFAULT_PRECISIONS = "f32;bf16:f32;f32,MODEL=bf16"
TEXT_NODES = ("CLIPTextEncode",)


def prepare(tmp: Path, checkpoint: Path | None = None) -> dict:
    """models/checkpoints/sd15.safetensors (a hard link to the cached checkpoint), an input image
    for B, and an output folder."""
    import numpy as np
    from PIL import Image

    from mixgraph.graph.fingerprint import fingerprint_file

    ckpt = checkpoint or full_checkpoint()
    models = BENCH_DIR / "models" if checkpoint is None else tmp / "models"
    link = models / "checkpoints" / "sd15.safetensors"
    if not link.exists() or os.stat(link).st_ino != os.stat(ckpt).st_ino:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        os.link(ckpt, link)  # a symlink would leave the models folder, which the loader refuses
    fingerprint_file(link)
    warm_page_cache(link)
    inputs = tmp / "input"
    inputs.mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:256, 0:256]
    img = np.stack([x, y, (x + y) // 2], axis=-1).astype(np.uint8)  # a gradient
    Image.fromarray(img).save(inputs / "example.png")
    return {"models": str(models), "input": str(inputs), "output": str(tmp / "output")}


def _text_encodes(m: dict, wf_nodes: dict) -> list[str]:
    return [n for n in m["executed"] if wf_nodes.get(n) in TEXT_NODES]


def child(spec: str, env_kw: dict) -> dict:
    """One precision: cold run, seed-only re-run, alternation (see the module docstring)."""
    from mixgraph.ui import api
    from mixgraph.nodes.weights import store

    ex = api.default_executor()
    classes = {k: c.class_type for wf in (WF_A, WF_B) for k, c in api.load(str(wf), ex.registry).prompt.items()}
    base = rss_bytes()

    def materializations() -> int:  # disk reads + conversions of a cached copy to another dtype
        return store.stats().loads + store.stats().derived

    def run(wf: Path, sets: dict) -> dict:
        before = materializations()
        m = run_measured(str(wf), spec, executor=ex, env_kw=env_kw, set=sets)
        m.pop("images")
        m["weight_loads"] = materializations() - before
        m["text_encodes"] = _text_encodes(m, classes)
        return m

    cold = run(WF_A, {**SET_A, "3.seed": 42})
    cold_peak = peak_rss_bytes()
    rerun = run(WF_A, {**SET_A, "3.seed": 43})
    alternation = [run(WF_B, {**SET_B, "3.seed": 1}), run(WF_A, {**SET_A, "3.seed": 44}),
                   run(WF_B, {**SET_B, "3.seed": 2}), run(WF_A, {**SET_A, "3.seed": 45})]
    return {
        "precision": spec,
        "cold_s": cold["seconds"], "s_per_step": cold["s_per_step"], "cold_weight_loads": cold["weight_loads"],
        "peak_rss_bytes": cold_peak, "rss_growth_bytes": cold_peak - base,
        "nan_fallbacks": cold["nan_fallbacks"],
        "cold_node_seconds": cold["node_seconds"],
        "rerun_s": rerun["seconds"], "rerun_executed": rerun["executed"], "rerun_node_seconds": rerun["node_seconds"],
        "rerun_weight_loads": rerun["weight_loads"], "rerun_text_encodes": rerun["text_encodes"],
        "switch_s": alternation[0]["seconds"],
        "alternate_s": statistics.mean(m["seconds"] for m in alternation[1:]),
        "alternate_weight_loads": sum(m["weight_loads"] for m in alternation),
        "alternate_executed": [m["executed"] for m in alternation],
        "final_peak_rss_bytes": peak_rss_bytes(),
    }


COLUMNS = [
    ("precision", "precision", str), ("cold_s", "cold A", fmt_s), ("s_per_step", "s/step", lambda x: f"{x:.3f}"),
    ("peak_rss_bytes", "peak RSS", fmt_bytes), ("vs_f32_peak", "vs f32", lambda x: f"{x:+.0%}"),
    ("rss_growth_bytes", "RSS+", fmt_bytes), ("vs_f32_growth", "vs f32", lambda x: f"{x:+.0%}"),
    ("rerun_s", "seed re-run", fmt_s), ("rerun_weight_loads", "loads", str),
    ("rerun_text_encodes", "text enc.", lambda x: str(len(x))), ("switch_s", "A→B", fmt_s),
    ("alternate_s", "B↔A mean", fmt_s), ("alternate_weight_loads", "loads", str),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default=DEFAULT_PRECISIONS,
                    help="runs, as for `mixgraph bench precision --precisions`")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--checkpoint", type=Path, help="an SD1.5 checkpoint to use instead (e.g. a tiny one)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--env", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit_child_result(child(args.child, json.loads(args.env)))
        return
    runs = parse_precision_list(args.precisions)
    with tempfile.TemporaryDirectory(prefix="mixgraph-bench-") as tmp:
        env_kw = prepare(Path(tmp), args.checkpoint)
        rows = []
        for spec in runs:
            warm_page_cache(Path(env_kw["models"]) / "checkpoints" / "sd15.safetensors")
            rows.append(run_child([__file__, "--child", spec, "--env", json.dumps(env_kw)]))
    f32 = next((r for r in rows if r["precision"] == "f32"), None)
    for r in rows:
        if f32 is not None:
            r["vs_f32_peak"] = r["peak_rss_bytes"] / f32["peak_rss_bytes"] - 1
            r["vs_f32_growth"] = r["rss_growth_bytes"] / f32["rss_growth_bytes"] - 1
    goals = {
        "seed_rerun_no_loading_or_text_encoding": all(
            r["rerun_weight_loads"] == 0 and not r["rerun_text_encodes"] for r in rows),
        "alternation_never_reloads": all(r["alternate_weight_loads"] == 0 for r in rows),
        "bf16_storage_peak_rss_cut": {r["precision"]: -r["vs_f32_peak"] for r in rows
                                      if "vs_f32_peak" in r and r["precision"] != "f32"},
    }
    out = {"workflows": [str(WF_A.relative_to(ROOT)), str(WF_B.relative_to(ROOT))], "a_inputs": SET_A,
           "b_inputs": SET_B, "runs": rows, "goals": goals}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print("A = txt2img 256x256, 4 steps; B = img2img 256x256, 4 steps; same checkpoint; CPU")
    print(format_table(rows, COLUMNS))
    print(f"seed-only re-run does no loading or text encoding: {goals['seed_rerun_no_loading_or_text_encoding']}")
    print(f"alternating A/B never reloads: {goals['alternation_never_reloads']}")
    for spec, cut in goals["bf16_storage_peak_rss_cut"].items():
        print(f"peak RSS cut vs f32, {spec}: {cut:.0%} (goal for bf16 storage: at least 40%)")


if __name__ == "__main__":
    main()
