"""`mixgraph bench precision WF.json [--precisions LIST] [--json]`, and the measuring tools the
benchmark scripts in benchmarks/ share (peak memory, child processes, PSNR/SSIM, tables).

Each precision runs in its own child process (`python -m mixgraph.ui.bench.bench_precision child ...`), so the peak
memory reported for it is its own: a process's peak RSS never goes down, and the weight cache
would otherwise carry one precision's tensors into the next run. The f32 run is the reference
for PSNR/SSIM; it always runs, first. The workflow's own precision section (default and regions)
is replaced by the SPEC under test so every run is what its row names; the name `workflow` runs
the file's own settings. Precision-cast nodes in the graph still win (they are part of it).

LIST is comma-separated SPECs (DESIGN §4); a `TYPE=SPEC` item belongs to the run before it, as in
`--precision`: `f32,bf16:f32,f32,MODEL=bf16` is three runs, the last with a bf16 UNet and
everything else f32. `;` may separate runs explicitly: `MODEL=bf16,VAE=f32;bf16`.

Per run: `seconds` (the executor's run time, loading included), `s_per_step` (sampler steps after
the first, so weight loading is excluded; the whole sampler node time when a sampler ran one step),
`frames` (the frames reaching output nodes: a video workflow's decoded frame count, VIDEO values'
frames included; an image workflow's image count) and `s_per_frame` (`seconds` / `frames`, loading
included), `peak_rss_bytes` (the child's peak resident set: weights, activations, interpreter),
`psnr_db` and `ssim` of the images (all frames of a video) reaching output nodes against the f32
run (PSNR is `inf` for identical images), and `nan_fallbacks` (nodes the NaN guard re-ran in f32).

SSIM is written here (Wang et al., "Image quality assessment: from error visibility to
structural similarity", IEEE TIP 2004: 11x11 Gaussian window, sigma 1.5, K1 = 0.01, K2 = 0.03),
because the libraries that have it (scikit-image, torchmetrics) are not dependencies.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["parse_precision_list", "rss_bytes", "peak_rss_bytes", "run_child", "emit_child_result",
           "psnr", "ssim", "format_table", "output_images", "frame_count", "run_measured", "bench_precision",
           "cli_main"]

_MARK = "@@mixgraph-bench@@"
DEFAULT_PRECISIONS = "f32,bf16:f32,bf16"

# --------------------------------------------------------------------------------------------
# memory and child processes


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    """Resident set size now (Linux; elsewhere the peak)."""
    kb = _status_kb("VmRSS")
    return kb * 1024 if kb is not None else peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process. VmHWM on Linux: unlike ru_maxrss it belongs to
    this program's address space only (ru_maxrss can carry a forking parent's peak over exec)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def emit_child_result(obj: Any) -> None:
    """What a child prints last: one marked JSON line for `run_child`."""
    sys.stdout.write(_MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_child(argv: Sequence[str], timeout: float | None = None) -> dict:
    """Run `python *argv` and return the JSON it passed to `emit_child_result`. A child that
    fails raises RuntimeError with the end of its stderr."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    tail = (proc.stderr or proc.stdout)[-3000:]
    raise RuntimeError(f"benchmark child {' '.join(argv[:3])} exited {proc.returncode}:\n{tail}")


# --------------------------------------------------------------------------------------------
# image comparison


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB of images in 0..1 (inf when identical)."""
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)


def _gaussian(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Mean SSIM of IMAGE tensors [B,H,W,C] (or [H,W,C]) in 0..1, per channel, valid windows only
    (Wang et al. 2004). The window shrinks to the image for images smaller than 11 px."""
    if a.shape != b.shape:
        raise ValueError(f"ssim: shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.ndim == 3:
        a, b = a[None], b[None]
    # [B, H, W, C] -> [B*C, 1, H, W]
    x = a.double().permute(0, 3, 1, 2).reshape(-1, 1, *a.shape[1:3])
    y = b.double().permute(0, 3, 1, 2).reshape(-1, 1, *b.shape[1:3])
    size = min(window, *x.shape[-2:])
    size -= 1 - size % 2  # odd
    g = _gaussian(size, sigma)
    kernel = (g[:, None] * g[None, :])[None, None]  # [1, 1, k, k]

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, kernel)

    c1, c2 = 0.01**2, 0.03**2
    mx, my = blur(x), blur(y)
    vx, vy = blur(x * x) - mx * mx, blur(y * y) - my * my
    cov = blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return s.mean().item()


# --------------------------------------------------------------------------------------------
# tables


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, Callable[[Any], str]]]) -> str:
    """A plain-text table: columns are (key, header, formatter); missing values print as '-'."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([("-" if row.get(k) is None else fmt(row[k])) for k, _, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def fmt_s(x: float) -> str:
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


# --------------------------------------------------------------------------------------------
# running one workflow, measured


def parse_precision_list(text: str | None) -> list[str]:
    """`f32,bf16,f32,MODEL=bf16` -> ["f32", "bf16", "f32,MODEL=bf16"] (see the module docstring)."""
    text = text or DEFAULT_PRECISIONS
    if ";" in text:
        return [p.strip() for p in text.split(";") if p.strip()]
    runs: list[str] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        if "=" in item and runs:
            runs[-1] += "," + item
        else:
            runs.append(item)
    return runs


def _frames_of(value: Any, socket_type: str) -> torch.Tensor | None:
    """The frames an output node's input carries: an IMAGE tensor [N, H, W, 3] as it is, a VIDEO
    value's frames (its `components().images`, [N, H, W, 3]); None for anything else."""
    if socket_type == "IMAGE" and isinstance(value, torch.Tensor):
        return value
    if socket_type == "VIDEO" and hasattr(value, "components"):
        images = value.components().images
        return images if isinstance(images, torch.Tensor) else None
    return None


def output_images(workflow: Any, values: dict, registry: Any) -> list[torch.Tensor]:
    """The IMAGE tensors (and VIDEO frames, [N, H, W, 3]) fed to the workflow's output nodes, in
    node order."""
    from mixgraph.graph.prompt import Link

    images = []
    for node_id, call in workflow.prompt.items():
        spec = registry.get(call.class_type)
        if spec is None or not spec.output_node:
            continue
        types = spec.input_map
        for name, value in call.inputs.items():
            if isinstance(value, Link) and name in types and types[name].type in ("IMAGE", "VIDEO"):
                out = values.get(value.node_id)
                if out is not None and value.slot < len(out):
                    frames = _frames_of(out[value.slot], types[name].type)
                    if frames is not None:
                        images.append(frames)
    return images


def frame_count(images: Sequence[torch.Tensor]) -> int:
    """Frames the output nodes received: the sum of N over IMAGE [N, H, W, 3] batches and VIDEO
    frames (a video workflow's decoded frame count; an image workflow's image count)."""
    return sum(int(i.shape[0]) for i in images if i.ndim == 4)


def run_measured(workflow: Any, spec: str | None, *, executor: Any = None, env_kw: dict | None = None,
                 set: dict | None = None) -> dict:
    """Run a workflow once through `graph.api.run` and measure it. `spec` replaces the file's
    precision section (None or "workflow": keep it). Returns seconds, s_per_step, steps,
    executed/cached node ids, nan_fallbacks, warnings and `images` (tensors, not JSON)."""
    from mixgraph.ui import api
    from mixgraph.graph import events as ev
    from mixgraph.graph.prompt import PrecisionConfig

    ex = executor or api.default_executor()
    wf = api.load(workflow, ex.registry)
    if set:
        wf = api.set_inputs(wf, set)
    if spec not in (None, "workflow"):
        wf = replace(wf, precision=PrecisionConfig())
    ticks: dict[str, list[tuple[float, int]]] = {}
    node_start: dict[str, float] = {}

    def on_event(e: Any) -> None:
        now = time.perf_counter()
        if isinstance(e, ev.Progress):
            ticks.setdefault(e.node, []).append((now, e.value))
        elif isinstance(e, ev.Executing) and e.node is not None:
            node_start[e.node] = now

    t0 = time.perf_counter()
    result = api.run(wf, precision=None if spec in (None, "workflow") else spec, executor=ex,
                     on_event=on_event, **(env_kw or {}))
    seconds = time.perf_counter() - t0
    report = result.report
    step_s, steps = 0.0, 0
    for node_id, marks in ticks.items():
        if report.nodes.get(node_id) is None or len(marks) < 1:
            continue
        if len(marks) >= 2:  # steady state: from the end of the first step to the end of the last
            step_s += marks[-1][0] - marks[0][0]
            steps += marks[-1][1] - marks[0][1]
        else:
            step_s += marks[0][0] - node_start.get(node_id, marks[0][0])
            steps += marks[0][1]
    images = output_images(wf, report.values, ex.registry)
    frames = frame_count(images)
    return {
        "seconds": seconds,
        "s_per_step": step_s / steps if steps else None,
        "frames": frames,
        "s_per_frame": seconds / frames if frames else None,
        "steps": sum(m[-1][1] for m in ticks.values()),
        "executed": report.executed,
        "cached": report.cached,
        "node_seconds": {k: v.seconds for k, v in report.nodes.items() if v.status == "executed"},
        "nan_fallbacks": [k for k, v in report.nodes.items() if v.nan_fallback],
        "warnings": list(report.warnings),
        "images": images,
    }


def _env_kw(models: str | None, input: str | None, output: str | None, device: str | None) -> dict:
    return {k: v for k, v in dict(models=models, input=input, output=output, device=device).items() if v}


def _child_precision(argv: Sequence[str]) -> None:
    """Child: run the workflow under one precision; save its images; report."""
    cfg = json.loads(argv[0])
    base = rss_bytes()
    m = run_measured(cfg["workflow"], cfg["spec"],
                     env_kw=_env_kw(cfg["models"], cfg["input"], cfg["output"], cfg["device"]))
    images = m.pop("images")
    torch.save([i.float().cpu() for i in images], cfg["images"])
    emit_child_result({**m, "peak_rss_bytes": peak_rss_bytes(), "base_rss_bytes": base})


# --------------------------------------------------------------------------------------------
# `mixgraph bench precision`


def bench_precision(workflow: str, precisions: Sequence[str], *, models: str | None = None,
                    input: str | None = None, output: str | None = None,
                    device: str | None = None) -> dict:
    """Each precision in a child process (f32 first, as the reference); see the module docstring."""
    runs = list(precisions)
    if "f32" not in runs:
        runs.insert(0, "f32")
    else:
        runs.insert(0, runs.pop(runs.index("f32")))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mixgraph-bench-") as tmp:
        out_dir = output or os.path.join(tmp, "output")
        reference: list[torch.Tensor] | None = None
        for i, spec in enumerate(runs):
            images_path = os.path.join(tmp, f"images_{i}.pt")
            cfg = {"workflow": os.path.abspath(workflow), "spec": spec, "models": models,
                   "input": input, "output": out_dir, "device": device, "images": images_path}
            row: dict[str, Any] = {"precision": spec}
            print(f"bench precision [{i + 1}/{len(runs)}] {spec}{' (reference)' if i == 0 else ''}: "
                  "running in a fresh process...", file=sys.stderr, flush=True)
            try:
                res = run_child(["-m", "mixgraph.ui.bench.bench_precision", "child", json.dumps(cfg)])
            except RuntimeError as e:
                print(f"bench precision [{i + 1}/{len(runs)}] {spec}: failed", file=sys.stderr, flush=True)
                row.update(status="error", error=str(e).splitlines()[-1] if str(e) else "failed")
                rows.append(row)
                if i == 0:
                    raise
                continue
            images = torch.load(images_path)
            per_step = f", {res['s_per_step']:.3f} s/step" if res["s_per_step"] else ""
            print(f"bench precision [{i + 1}/{len(runs)}] {spec}: {res['seconds']:.2f} s{per_step}",
                  file=sys.stderr, flush=True)
            if reference is None:
                reference = images
            row.update(status="ok", seconds=res["seconds"], s_per_step=res["s_per_step"],
                       frames=res["frames"], s_per_frame=res["s_per_frame"],
                       steps=res["steps"], peak_rss_bytes=res["peak_rss_bytes"],
                       nan_fallbacks=res["nan_fallbacks"], warnings=res["warnings"])
            if images and len(images) == len(reference) and all(a.shape == b.shape for a, b in zip(images, reference)):
                row["psnr_db"] = min(psnr(a, b) for a, b in zip(images, reference))
                row["ssim"] = min(ssim(a, b) for a, b in zip(images, reference))
            rows.append(row)
    from mixgraph.graph.precision import hardware_section
    return {"workflow": workflow, "device": device or "cpu", "reference": "f32",
            "threads": torch.get_num_threads(), "hardware": hardware_section(device or "cpu"),
            "runs": rows}


COLUMNS = [
    ("precision", "precision", str),
    ("seconds", "time", fmt_s),
    ("s_per_step", "s/step", lambda x: f"{x:.3f}"),
    ("frames", "frames", str),
    ("s_per_frame", "s/frame", lambda x: f"{x:.3f}"),
    ("peak_rss_bytes", "peak RSS", fmt_bytes),
    ("psnr_db", "PSNR vs f32", lambda x: "identical" if math.isinf(x) else f"{x:.1f} dB"),
    ("ssim", "SSIM", lambda x: f"{x:.4f}"),
    ("nan_fallbacks", "NaN fallbacks", lambda x: ",".join(x) if x else "0"),
]


def _invalid(args: Any) -> str | None:
    """What `mixgraph validate` would say about the workflow (None: valid), and an unusable
    --output: checked here, so a bad workflow is exit 2 with its problems, not a failed child."""
    from mixgraph.graph.env import Env, folder_problem
    from mixgraph.graph.formats.workflow import WorkflowError
    from mixgraph.graph.validate import format_problems
    from mixgraph.ui.api import default_registry, validate_file

    env = Env.from_args(models=args.models, input=args.input, output=args.output,
                        device=args.device)
    if args.output and folder_problem(env.output):
        return f"error: {folder_problem(env.output)}"
    try:
        _, v = validate_file(args.workflow, default_registry(), env)
    except (WorkflowError, OSError) as e:
        return f"error: {e}"
    if v.clean:
        return None
    return f"invalid workflow {args.workflow}:\n{format_problems(v)}"


def cli_main(args: Any) -> int:
    """`mixgraph bench precision WF.json [--precisions LIST] [--json]` (ui/cli.py parses). The
    workflow is loaded here first, by the loader `validate` and `run` use, so a file they reject
    (a bad precision SPEC included) is rejected before any child runs."""
    from mixgraph.graph.precision import PrecisionError, parse_precision_arg

    if args.bench != "precision":
        print(f"mixgraph bench {args.bench}: unknown benchmark", file=sys.stderr)
        return 2
    problem = _invalid(args)   # the loader `validate` and `run` use: a bad precision SPEC too
    if problem:
        print(problem, file=sys.stderr)
        return 2
    runs = parse_precision_list(args.precisions)
    try:
        for spec in runs:
            if spec != "workflow":
                parse_precision_arg(spec, args.device or "cpu")
    except PrecisionError as e:
        print(f"error: --precisions: {e}", file=sys.stderr)
        return 2
    try:
        result = bench_precision(args.workflow, runs, models=args.models, input=args.input,
                                 output=args.output, device=args.device)
    except RuntimeError as e:
        print(f"error: the f32 reference run failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        hw = result["hardware"]
        print(f"{args.workflow} on {result['device']} ({result['threads']} threads); "
              f"PSNR/SSIM against the f32 run")
        print(f"native: bf16 {hw['native_bf16']}, f16 {hw['native_f16']}, int8 "
              f"{hw['native_int8']} ({hw['why']}); presets picking int8: {', '.join(hw.get('int8_presets', ())) or 'none'}"
              f" ({hw.get('int8_why', '')}); auto: "
              + ", ".join(f"{k}={v}" for k, v in hw["auto"].items()))
        print(format_table(result["runs"], COLUMNS))
        for row in result["runs"]:
            if row["status"] != "ok":
                print(f"{row['precision']}: {row['error']}")
    return 0 if all(r["status"] == "ok" for r in result["runs"]) else 1


if __name__ == "__main__":  # the child side of run_child
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        _child_precision(sys.argv[2:])
    else:
        sys.exit("usage: python -m mixgraph.ui.bench.bench_precision child CONFIG_JSON (internal; use `mixgraph bench precision`)")
