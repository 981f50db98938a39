"""Weight streaming benchmark, Flux: the full-size Flux.1-dev architecture (random weights, 11.9 B
parameters) in fp8 and in GGUF Q4_0, run through the real nodes at 256x256 within a memory budget
of 8 GiB (nodes/weights/streaming.py, issue 24): peak RSS, s/step, bytes streamed per step, and
(when `--resident-budget` is given) whether the latent equals a resident run's.

Files, written once into `--models DIR` (or a temporary folder, removed after):

- fp8: `bench_dit`'s Flux.1-dev file (matrices fp8 e4m3fn, vectors bf16, 11.9 GB), loaded with
  UNETLoader `weight_dtype=fp8_e4m3fn`.
- GGUF Q4_0: the same shapes in ComfyUI-GGUF's layout (`general.architecture` "flux", the model's
  state-dict keys, 2-D weights Q4_0, vectors F32; 6.7 GB), loaded with UnetLoaderGGUF.
  Quantising 12 B random floats would take long, so valid Q4_0 blocks are written directly
  (`write_random_gguf`): per 32 weights an f16 scale d and 16 bytes of seeded random nibbles,
  the value being (nibble - 8) * d; d = fan_in^-0.5 / 4.6 gives the N(0, 1/fan_in) spread of the
  safetensors files (uniform nibbles have a standard deviation of 4.6). Streamed to disk tensor
  by tensor in row chunks: the model is never in memory.
- Text: bench_dit's shallow CLIP-L / T5 stand-ins (full output width, two layers).

The workflow is bench_dit's Flux one (DualCLIPLoader, CLIPTextEncode x2, EmptyLatentImage,
KSampler euler / simple at CFG 1.0, SaveLatent), precision preset `balanced` (bf16 compute on a
CPU with native bf16), its loader swapped for UnetLoaderGGUF for the GGUF file. Each run is one
child process (its peak RSS, VmHWM, is its own) with `api.run(memory_budget=GIB)`; `s/step` is the
sampler steps after the first (`--steps 1`: the whole KSampler, loading included), `streamed /
step` the bytes the streamed units read (`streaming.since`) divided by the sampler's model calls
(one per step at CFG 1). No timed assertions.

    python benchmarks/bench_stream_flux.py [--formats fp8,gguf_q4_0] [--budget 8] [--resident-budget 20]
        [--steps 2] [--size 256] [--models DIR] [--json] [--tiny]

`--tiny` runs the same path on a tiny Flux config with a budget of a third of its diffusion
model (seconds; the test's smoke check, its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_dit  # noqa: E402

GIB = 1 << 30
FORMATS = ("fp8", "gguf_q4_0")
GGUF_FILE = "bench_flux1_dev_q4_0.gguf"
Q4_0_BLOCK, Q4_0_BYTES = 32, 18          # weights per block, bytes per block (f16 scale + 16 nibble bytes)
NIBBLE_STD = math.sqrt((16 ** 2 - 1) / 12)   # std of a uniform nibble, ~4.61
CHUNK_BLOCKS = 1 << 22                    # Q4_0 blocks drawn at a time: 75 MB


def _q4_0_rows(shape: tuple[int, ...], rng: np.random.Generator):
    """Random Q4_0 data of a 2-D weight, as uint8 row chunks [rows, in / 32 * 18]."""
    rows, width = shape
    d = np.float16(width ** -0.5 / NIBBLE_STD)
    per_row = width // Q4_0_BLOCK
    step = max(1, CHUNK_BLOCKS // per_row)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        blocks = np.frombuffer(rng.bytes(n * per_row * Q4_0_BYTES), np.uint8).reshape(n * per_row, Q4_0_BYTES).copy()
        blocks[:, :2] = np.full((n * per_row, 1), d, np.float16).view(np.uint8)   # the scale d of each block
        yield blocks.reshape(n, per_row * Q4_0_BYTES)


def write_random_gguf(path: Path, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> Path:
    """A ComfyUI-GGUF-style Flux file: 2-D weights (rows a multiple of 32) as random Q4_0 blocks,
    the rest F32 (bench_dit's random rule); tensor infos first, then each tensor streamed in
    chunks (peak memory: one chunk); written atomically (a `.partial` name, then renamed)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    def quantised(shape):
        return len(shape) == 2 and shape[1] % Q4_0_BLOCK == 0

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch="flux")
    for key in sorted(shapes):
        shape = shapes[key]
        if quantised(shape):
            byte_shape = (shape[0], shape[1] // Q4_0_BLOCK * Q4_0_BYTES)
            writer.add_tensor_info(key, byte_shape, np.dtype(np.uint8), math.prod(byte_shape), raw_dtype=T.Q4_0)
        else:
            writer.add_tensor_info(key, shape, np.dtype(np.float32), 4 * math.prod(shape))
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for key in sorted(shapes):
            shape = shapes[key]
            if quantised(shape):   # chunks straight to the file
                _write_chunked(writer, key, _q4_0_rows(shape, rng))
                continue
            data = torch.cat([c.reshape(-1) for c in bench_dit._chunks(key, shape, gen, torch.float32)]
                             ).reshape(shape).numpy()
            writer.write_tensor_data(data)
        writer.close()
        tmp.replace(path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_chunked(writer, key: str, chunks) -> None:
    """`GGUFWriter.write_tensor_data` for a tensor given in chunks: the same alignment padding
    before and after, the same bookkeeping (its tensor info popped, in order)."""
    fout = writer.fout[0]
    name = next(iter(writer.tensors[0]))
    ti = writer.tensors[0].pop(name)
    assert name == key, (name, key)
    writer.write_padding(fout, fout.tell())
    n = 0
    for c in chunks:
        c.tofile(fout)
        n += c.nbytes
    assert n == ti.nbytes, (key, n, ti.nbytes)
    writer.write_padding(fout, n)
    from gguf.gguf_writer import WriterState
    writer.state = WriterState.WEIGHTS


def ensure_files(models: Path, formats: list[str], tiny: bool) -> dict:
    """The text encoders, and the diffusion-model file of each format, unless there; returns
    {format: file bytes}."""
    fam = bench_dit.FAMILIES["flux"]
    files = bench_dit.ensure_files(fam, models, tiny) if "fp8" in formats else None
    if files is None:   # the encoders alone
        for i, e in enumerate(fam.encoders, start=1):
            p = models / "text_encoders" / bench_dit._file_name(e.name, tiny)
            if not p.exists():
                bench_dit.write_random_file(p, e.shapes(tiny), bench_dit.bf16_all, seed=i)
    out = {}
    if "fp8" in formats:
        out["fp8"] = files[bench_dit._file_name(fam.unet_file, tiny)][0]
    if "gguf_q4_0" in formats:
        p = models / "diffusion_models" / bench_dit._file_name(GGUF_FILE, tiny)
        if not p.exists():
            t0 = time.perf_counter()
            write_random_gguf(p, fam.shapes(tiny), seed=0)
            print(f"wrote {p} ({p.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        out["gguf_q4_0"] = p.stat().st_size
    return out


def prompt(fmt: str, tiny: bool, size: int, steps: int) -> dict:
    """bench_dit's Flux workflow, with UnetLoaderGGUF for the GGUF file."""
    p = bench_dit.prompt(bench_dit.FAMILIES["flux"], tiny, size, steps)
    if fmt == "gguf_q4_0":
        p["1"] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": bench_dit._file_name(GGUF_FILE, tiny)}}
    p["7"]["inputs"]["filename_prefix"] = f"bench_stream_flux/{fmt}"
    return p


def child(cfg: dict) -> None:
    """One run in this (fresh) process."""
    from mixgraph.nodes.weights import streaming
    from mixgraph.ui.bench.bench_precision import emit_child_result, peak_rss_bytes, run_measured

    torch.manual_seed(0)
    before = streaming.snapshot()
    m = run_measured(cfg["prompt"], cfg["spec"], env_kw={"models": cfg["models"], "output": cfg["output"],
                                                          "memory_budget": cfg["budget"]})
    cost = streaming.since(before)
    sampler = m["node_seconds"].get("6")
    steady = m["s_per_step"] if cfg["steps"] > 1 else None
    first = sampler - steady * (cfg["steps"] - 1) if (sampler is not None and steady is not None) else sampler
    emit_child_result({"s_per_step": m["s_per_step"] if cfg["steps"] > 1 else sampler, "first_step_s": first,
                       "seconds": m["seconds"], "node_seconds": m["node_seconds"], "warnings": m["warnings"],
                       "peak_rss_bytes": peak_rss_bytes(), "streaming": cost})


def _latent(output: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    found = sorted(output.rglob("*.latent"))
    if not found:
        raise RuntimeError(f"no .latent file under {output}")
    return load_file(str(found[-1]))["latent_tensor"]


def bench(formats: list[str], budget: float | None, resident: float | None, steps: int, size: int,
          models: Path, tiny: bool, work: Path) -> dict:
    from mixgraph.ui.bench.bench_precision import run_child

    sizes = ensure_files(models, formats, tiny)
    runs = [(f, budget) for f in formats] + ([(f, resident) for f in formats] if resident else [])
    rows = []
    for i, (fmt, gib) in enumerate(runs):
        output = work / f"out{i}"
        cfg = {"prompt": prompt(fmt, tiny, size, steps), "spec": "balanced", "models": str(models),
               "output": str(output), "steps": steps, "budget": gib}
        row = {"format": fmt, "file_bytes": sizes[fmt], "budget_gib": gib, "steps": steps, "size": size}
        t0 = time.perf_counter()
        try:
            res = run_child([__file__, "child", json.dumps(cfg)])
        except RuntimeError as e:
            row["error"] = str(e)[-1500:]
            print(f"{fmt} {gib} GiB: FAILED\n{row['error']}", file=sys.stderr, flush=True)
            rows.append(row)
            continue
        s = res["streaming"]
        # the diffusion model's share (the text encoders may stream too), per model call (CFG 1.0:
        # one per step)
        dm = [v for k, v in s.get("by_model", {}).items() if "diffusion" in k or "unet" in k]
        dm_bytes = sum(v["bytes_streamed"] for v in dm)
        dm_passes = sum(v["passes"] for v in dm) or steps
        row.update(s_per_step=res["s_per_step"], first_step_s=res["first_step_s"], seconds=res["seconds"],
                   child_wall_s=round(time.perf_counter() - t0, 1), peak_rss_bytes=res["peak_rss_bytes"],
                   streamed=bool(s.get("models")), bytes_streamed=s["bytes_streamed"],
                   bytes_per_step=dm_bytes // dm_passes,
                   streaming_by_model=s.get("by_model", {}), stream_load_s=s["load_seconds"],
                   peak_weight_bytes=s["peak_weight_bytes"], warnings=res["warnings"],
                   latent_std=float(_latent(output).float().std()),
                   latent_finite=bool(torch.isfinite(_latent(output)).all()))
        row["_output"] = output
        rows.append(row)
        print(f"{fmt} {gib} GiB: {row['s_per_step']:.1f} s/step, peak {row['peak_rss_bytes'] / GIB:.2f} GiB, "
              f"{row['bytes_per_step'] / GIB:.2f} GiB streamed/step", file=sys.stderr, flush=True)
    for fmt in formats:   # each streamed run against its format's resident run
        ref = next((r for r in rows if r["format"] == fmt and r["budget_gib"] == resident and "_output" in r), None)
        for r in rows:
            if ref is not None and r is not ref and r["format"] == fmt and "_output" in r:
                r["identical_to_resident"] = bool(torch.equal(_latent(r["_output"]), _latent(ref["_output"])))
    for r in rows:
        r.pop("_output", None)
    return {"tiny": tiny, "size": size, "steps": steps, "threads": torch.get_num_threads(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    ap.add_argument("--budget", type=float, default=8.0, help="GiB (default 8; --tiny: a third of the model)")
    ap.add_argument("--resident-budget", type=float, default=None,
                    help="also run each file with this budget (GiB, enough to hold it: 20) and compare latents")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--models", help="keep the generated files here and reuse them (default: a temporary folder)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if set(formats) - set(FORMATS):
        ap.error(f"unknown formats {sorted(set(formats) - set(FORMATS))}; known: {', '.join(FORMATS)}")
    tmp = Path(tempfile.mkdtemp(prefix="mixgraph-bench-stream-flux-"))
    try:
        models = Path(args.models) if args.models else tmp / "models"
        budget, resident = args.budget, args.resident_budget
        if args.tiny:   # a third of the tiny model's fp8 file: streamed for sure
            shapes = bench_dit.FAMILIES["flux"].shapes(True)
            budget = sum(math.prod(s) for s in shapes.values()) / 3 / GIB
            resident = 4.0 if resident is None else resident
        result = bench(formats, budget, resident, args.steps, args.size, models, args.tiny, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    print(f"Flux.1-dev{' (TINY)' if args.tiny else ''}, {args.size}x{args.size}, {args.steps} steps, "
          f"precision balanced, {result['threads']} threads")
    print(f"{'format':>10} {'file GB':>8} {'budget':>8} {'streamed':>8} {'peak RSS':>9} {'s/step':>7} "
          f"{'1st step':>8} {'GiB/step':>8} {'identical':>9}")
    for r in result["rows"]:
        head = f"{r['format']:>10} {r['file_bytes'] / 1e9:>8.2f} {r['budget_gib']:>7.3g}G"
        if "error" in r:
            print(f"{head} error: {r['error'].strip().splitlines()[-1]}")
            continue
        print(f"{head} {str(r['streamed']):>8} {r['peak_rss_bytes'] / GIB:>8.2f}G {r['s_per_step']:>7.1f} "
              f"{r['first_step_s']:>8.1f} {r['bytes_per_step'] / GIB:>8.2f} "
              f"{str(r.get('identical_to_resident', '-')):>9}")
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
