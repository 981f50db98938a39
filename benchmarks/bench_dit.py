"""DiT benchmark: s/step and peak memory of full-size-architecture Flux.1-dev (fp8 storage),
SD3.5-medium and Z-Image at 512x512 on this machine, per precision preset, and the memory
estimate (`mixgraph estimate`, ui/estimate.py) against the measured peak RSS.

Weights. Each family's diffusion model is built from its real config on the meta device (no
memory), and a seeded random safetensors file is streamed from those shapes, tensor by tensor and
in row chunks, in the storage dtype (`write_random_file`): the model is never held in f32, nor
whole. Flux.1-dev (hidden 3072, 19 double + 38 single blocks, T5 4096 / CLIP 768): matrices
fp8 e4m3fn, vectors bf16, 11.9 GB, loaded with UNETLoader `weight_dtype=fp8_e4m3fn` (fp8 storage,
the preset picks the compute dtype). SD3.5-medium (depth 24, x-block self-attention in blocks
0-12, q/k norms, 384x384 position grid) and Z-Image (dim 3840, 30 layers, 2 + 2 refiners,
caption width 2560): bf16, UNETLoader `default`. Files go to a temporary folder, removed after the
run, unless `--models DIR` names one to keep and reuse (files already there are not rewritten).

Text. The cheapest honest conditioning: real text encoders of the full *output* width but two
layers and a narrow inside (CLIP-L 768 wide; T5 v1.1 4096 wide, 4 heads of 64, feed-forward 256;
Qwen3 2560 wide, 4 heads of 128, feed-forward 256; the real tokenizers' full vocabularies), loaded
with DualCLIPLoader / CLIPLoader and run by CLIPTextEncode like a user's. The diffusion model so
gets conds of the real shapes (Flux 256 T5 tokens + the CLIP-L pooled vector; SD3 77 CLIP-L + 77
T5 tokens, pooled 2048 with CLIP-G's part zero, as ComfyUI gives without CLIP-G; Z-Image the
Qwen3 hidden states of the prompt), and the encoders cost little time and memory (counted in both
the measurement and the estimate: their token tables, 0.07 / 0.26 / 0.78 GB in bf16, are the
bulk).

The workflow, per family: UNETLoader, the text loader, CLIPTextEncode (prompt and an empty
negative), EmptyLatentImage (its 4 zero channels become 16), KSampler euler / simple, SaveLatent:
no VAE (the 16-channel decode is not what is measured). CFG as the families are used: Flux.1-dev
1.0 (guidance 3.5 is embedded), SD3.5 4.5 (two model calls per step), Z-Image (Turbo) 1.0.

Each run (family x `--runs` item) is one child process, so its peak RSS (VmHWM) is its own.
`s/step` is the sampler steps after the first (with `--steps 1`: the whole KSampler, weight
loading included); `1st step` is the KSampler node's time before that (weights load lazily, at the
first step). The estimate is computed in the parent for the same workflow and precision; a run
whose estimate does not fit the memory available (ui/estimate.py's `refusal`, as `mixgraph run`
refuses) is reported as skipped with that message, not run. Runs that resolve to the same
diffusion-model policy as one already measured (Flux: UNETLoader's fp8 storage with the preset's
compute dtype) are not run again ("same as"): the text encoders here are shallow stand-ins, so
their precision is not what is measured. No timed assertions.

    python benchmarks/bench_dit.py [--families flux,sd35m,zimage] [--runs "quality;bf16:f32;balanced;memory;fast"]
        [--steps 2] [--size 512] [--models DIR] [--json] [--tiny]

`--tiny` runs the same path on tiny configs of each family (seconds; the test's smoke check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

DEFAULT_RUNS = "quality;bf16:f32;balanced;memory;fast"
#: what a row copies from the run it is the "same as"
MEASURED = ("s_per_step", "first_step_s", "seconds", "child_wall_s", "peak_rss_bytes", "nan_fallbacks",
            "warnings", "node_seconds")
PROMPT = "a photo of a red fox in the snow, sharp, detailed"
CHUNK_ELEMENTS = 1 << 24   # rows drawn at a time: at most 64 MB of f32 per draw
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
              torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


# --------------------------------------------------------------------------------------------
# random weight files, streamed from shapes


def module_shapes(factory: Callable[[], torch.nn.Module]) -> dict[str, tuple[int, ...]]:
    """State-dict shapes of a module built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        module = factory()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _chunks(key: str, shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype):
    """The tensor of `key` as row chunks in `dtype`: matrices N(0, 1/fan_in), norm scales
    1 + 0.1 N, other vectors 0.05 N (nodes/weights/synthetic.py's rule), drawn in f32 a chunk at a
    time so a 389 M-element token table never exists in f32."""
    if not shape:
        yield torch.randn((), generator=gen).mul(0.05).to(dtype)
        return
    row = math.prod(shape[1:])
    step = max(1, CHUNK_ELEMENTS // max(row, 1))
    for start in range(0, shape[0], step):
        t = torch.randn((min(step, shape[0] - start), *shape[1:]), generator=gen)
        if len(shape) >= 2:
            t.mul_(row ** -0.5)
        elif key.endswith("weight") or key.endswith("scale"):
            t.mul_(0.1).add_(1.0)
        else:
            t.mul_(0.05)
        yield t.to(dtype)


def write_random_file(path: Path, shapes: dict[str, tuple[int, ...]], dtype_of: Callable[[str, tuple], torch.dtype],
                      seed: int = 0) -> Path:
    """A safetensors file of seeded random tensors with `shapes`, each in `dtype_of(key, shape)`:
    the header from shapes first, then each tensor streamed in row chunks (peak memory: one chunk),
    written atomically (a `.partial` name, then renamed)."""
    header: dict[str, dict] = {}
    offset = 0
    dtypes = {}
    for key in sorted(shapes):
        dt = dtypes[key] = dtype_of(key, shapes[key])
        n = math.prod(shapes[key]) * torch.empty((), dtype=dt).element_size()
        header[key] = {"dtype": _ST_DTYPES[dt], "shape": list(shapes[key]), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    gen = torch.Generator().manual_seed(seed)
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for key in sorted(shapes):
                for t in _chunks(key, shapes[key], gen, dtypes[key]):
                    f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        if tmp.stat().st_size != 8 + len(raw) + offset:
            raise AssertionError(f"{tmp}: {tmp.stat().st_size} bytes written, the header says {8 + len(raw) + offset}")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def bf16_all(key: str, shape: tuple) -> torch.dtype:
    return torch.bfloat16


def fp8_matrices(key: str, shape: tuple) -> torch.dtype:
    """fp8 e4m3fn matrices, bf16 vectors (as fp8 Flux files store them)."""
    return torch.float8_e4m3fn if len(shape) >= 2 else torch.bfloat16


# --------------------------------------------------------------------------------------------
# the families and their files


@dataclass(frozen=True)
class Encoder:
    """A text-encoder file: full output width, two layers, narrow inside (module docstring)."""

    name: str
    shapes: Callable[[bool], dict[str, tuple[int, ...]]]   # tiny -> shapes


def _clip_l_shapes(tiny: bool) -> dict[str, tuple[int, ...]]:
    from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=49408, width=768, layers=2, heads=12, max_positions=77,
                         intermediate=256, projection_dim=None, activation="quick_gelu")
    shapes = module_shapes(lambda: CLIPTextModel(cfg))
    return {k: v for k, v in shapes.items() if not k.endswith("position_ids")}


def _t5_shapes(tiny: bool) -> dict[str, tuple[int, ...]]:
    from mixgraph.nodes.encoders.t5 import T5Config, T5EncoderModel

    # tiny: 768 wide, so SD3's CLIP-L tokens (768) still pad into T5's width
    cfg = T5Config(vocab=32128, width=768 if tiny else 4096, heads=4, head_dim=64, ff=256, layers=2)
    return module_shapes(lambda: T5EncoderModel(cfg))


def _qwen3_shapes(tiny: bool) -> dict[str, tuple[int, ...]]:
    from mixgraph.nodes.encoders.decoder_llm import DecoderShape
    from mixgraph.nodes.encoders.qwen3 import Qwen3Config, Qwen3TextModel

    shape = DecoderShape(vocab_size=151936, hidden=32 if tiny else 2560, layers=2, heads=4, kv_heads=2,
                         head_dim=16 if tiny else 128, intermediate=64 if tiny else 256)
    return module_shapes(lambda: Qwen3TextModel(Qwen3Config(shape)))


CLIP_L = Encoder("bench_clip_l.safetensors", _clip_l_shapes)
T5 = Encoder("bench_t5xxl.safetensors", _t5_shapes)
QWEN3 = Encoder("bench_qwen3.safetensors", _qwen3_shapes)


def _flux(tiny: bool):
    from mixgraph.nodes.families.flux.family import FLUX
    from mixgraph.nodes.families.flux.model import FluxConfig

    cfg = (FluxConfig(hidden_size=64, num_heads=2, depth=1, depth_single_blocks=2, axes_dim=(4, 14, 14),
                      context_in_dim=768) if tiny else FluxConfig())   # defaults: Flux.1-dev
    return module_shapes(lambda: FLUX.build(cfg))


def _sd35m(tiny: bool):
    from mixgraph.nodes.families.sd3.family import SD3
    from mixgraph.nodes.families.sd3.mmdit import MMDiTConfig

    cfg = (MMDiTConfig(depth=2, pos_embed_max_size=48, context_in=768, qk_norm=True, x_block_self_attn_layers=(0,))
           if tiny else MMDiTConfig(depth=24, pos_embed_max_size=384, context_in=4096, adm_in_channels=2048,
                                    qk_norm=True, x_block_self_attn_layers=tuple(range(13))))
    return module_shapes(lambda: SD3.build(cfg))


def _zimage(tiny: bool):
    from mixgraph.nodes.families.lumina.family import Z_IMAGE
    from mixgraph.nodes.families.lumina.nextdit import NextDiTConfig

    common = dict(in_channels=16, t_hidden=1024, rope_theta=256.0, time_scale=1000.0, z_image_modulation=True,
                  pad_tokens_multiple=32)
    # diffusers' ZImageTransformer2DModel defaults: dim 3840, 30 heads (kv 30), 30 layers, 2 + 2
    # refiners, FFN int(3840 / 3 * 8) = 10240, caption 2560, modulation width min(dim, 256)
    cfg = (NextDiTConfig(dim=64, heads=2, kv_heads=2, depth=2, refiner_depth=1, ffn_hidden=170, cap_feat_dim=32,
                         t_width=64, axes_dims=(8, 12, 12), **common) if tiny else
           NextDiTConfig(dim=3840, heads=30, kv_heads=30, depth=30, refiner_depth=2, ffn_hidden=10240,
                         cap_feat_dim=2560, t_width=256, axes_dims=(32, 48, 48), **common))
    return module_shapes(lambda: Z_IMAGE.build(cfg))


@dataclass(frozen=True)
class Family:
    """One benchmarked family: its diffusion-model file, text files, loader and sampler settings."""

    key: str
    display: str
    unet_file: str
    shapes: Callable[[bool], dict[str, tuple[int, ...]]]
    dtype_of: Callable[[str, tuple], torch.dtype]
    weight_dtype: str           # UNETLoader's
    encoders: tuple[Encoder, ...]
    clip_type: str              # CLIPLoader / DualCLIPLoader type
    cfg: float


FAMILIES = {
    "flux": Family("flux", "Flux.1-dev (fp8)", "bench_flux1_dev_fp8.safetensors", _flux, fp8_matrices,
                   "fp8_e4m3fn", (CLIP_L, T5), "flux", 1.0),
    "sd35m": Family("sd35m", "SD3.5-medium", "bench_sd35_medium_bf16.safetensors", _sd35m, bf16_all,
                    "default", (CLIP_L, T5), "sd3", 4.5),
    "zimage": Family("zimage", "Z-Image", "bench_z_image_bf16.safetensors", _zimage, bf16_all,
                     "default", (QWEN3,), "lumina2", 1.0),
}


def _file_name(name: str, tiny: bool) -> str:
    return name.replace("bench_", "bench_tiny_") if tiny else name


def ensure_files(fam: Family, models: Path, tiny: bool) -> dict:
    """Write the family's files into `models` (diffusion_models/, text_encoders/) unless there;
    returns {file: (bytes, seconds to write or None when reused)}."""
    out = {}
    todo = [(models / "diffusion_models" / _file_name(fam.unet_file, tiny), lambda: fam.shapes(tiny), fam.dtype_of)]
    todo += [(models / "text_encoders" / _file_name(e.name, tiny), (lambda e=e: e.shapes(tiny)), bf16_all)
             for e in fam.encoders]
    for i, (path, shapes, dtype_of) in enumerate(todo):
        took = None
        if not path.exists():
            t0 = time.perf_counter()
            write_random_file(path, shapes(), dtype_of, seed=i)
            took = time.perf_counter() - t0
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {took:.0f} s", file=sys.stderr, flush=True)
        out[path.name] = (path.stat().st_size, took)
    return out


def prompt(fam: Family, tiny: bool, size: int, steps: int) -> dict:
    """The family's workflow in ComfyUI's API format (module docstring)."""
    names = [_file_name(e.name, tiny) for e in fam.encoders]
    if len(names) == 2:
        clip = {"class_type": "DualCLIPLoader", "inputs": {"clip_name1": names[0], "clip_name2": names[1],
                                                           "type": fam.clip_type}}
    else:
        clip = {"class_type": "CLIPLoader", "inputs": {"clip_name": names[0], "type": fam.clip_type}}
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": _file_name(fam.unet_file, tiny),
                                                     "weight_dtype": fam.weight_dtype}},
        "2": clip,
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 1, "steps": steps, "cfg": fam.cfg, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": f"bench_dit/{fam.key}"}},
    }


# --------------------------------------------------------------------------------------------
# running


def child(cfg: dict) -> None:
    """One measured run in this (fresh) process."""
    from mixgraph.ui.bench.bench_precision import emit_child_result, peak_rss_bytes, rss_bytes, run_measured

    torch.manual_seed(0)
    base = rss_bytes()
    m = run_measured(cfg["prompt"], cfg["spec"], env_kw={"models": cfg["models"], "output": cfg["output"]})
    m.pop("images")
    sampler = m["node_seconds"].get("6")
    steady = m["s_per_step"] if cfg["steps"] > 1 else None
    first = sampler - steady * (cfg["steps"] - 1) if (sampler is not None and steady is not None) else sampler
    emit_child_result({"s_per_step": m["s_per_step"], "first_step_s": first, "seconds": m["seconds"],
                       "node_seconds": m["node_seconds"], "nan_fallbacks": m["nan_fallbacks"],
                       "warnings": m["warnings"], "peak_rss_bytes": peak_rss_bytes(), "base_rss_bytes": base})


def resolved(spec: str) -> tuple:
    """(MODEL, CLIP) SPECs a --precision argument resolves to on this machine."""
    from mixgraph.graph.precision import Resolver, parse_precision_arg

    default, types = parse_precision_arg(spec)
    r = Resolver(None, types, default)
    return tuple(r.policy("x", s).spec for s in ("MODEL", "CLIP"))


def model_policy(spec: str, fam: Family) -> str:
    """The diffusion model's effective SPEC: the resolved MODEL policy with UNETLoader's pinned
    storage (Flux: fp8_e4m3fn) in place of its storage, as `graph.precision.resolve` does."""
    from mixgraph.graph.precision import parse_spec

    model = resolved(spec)[0]
    if fam.weight_dtype == "default":
        return model
    pin = fam.weight_dtype.removesuffix("_fast")
    if model == "int8":
        return f"{pin}:f32"
    compute = parse_spec(model).compute
    return f"{pin}:{ {torch.float32: 'f32', torch.bfloat16: 'bf16', torch.float16: 'f16'}[compute] }"


def bench(families: list[str], runs: list[str], steps: int, size: int, models: Path, tiny: bool,
          out_dir: str) -> list[dict]:
    from mixgraph.graph.env import Env
    from mixgraph.ui import api
    from mixgraph.ui.bench.bench_precision import fmt_bytes, run_child
    from mixgraph.ui.estimate import estimate, refusal

    reg = api.default_registry()
    env = Env.from_args(models=str(models))
    rows = []
    for key in families:
        fam = FAMILIES[key]
        files = ensure_files(fam, models, tiny)
        p = prompt(fam, tiny, size, steps)
        wf = api.load(p, reg)
        seen: dict[tuple, dict] = {}
        for spec in runs:
            row: dict[str, Any] = {"family": fam.display, "precision": spec, "model_spec": model_policy(spec, fam),
                                   "resolved": "/".join(resolved(spec)),
                                   "size": size, "steps": steps,
                                   "weights_file_bytes": files[_file_name(fam.unet_file, tiny)][0]}
            est = estimate(wf, reg, env, spec)
            row.update(estimate_bytes=est["peak_bytes"], estimate_node=est["peak_node"],
                       estimate_weights_bytes=est["weights_bytes"])
            k = row["model_spec"]
            if k in seen:   # the same diffusion-model policy: its measurement stands for this row
                row.update({f: v for f, v in seen[k].items() if f in MEASURED}, same_as=seen[k]["precision"])
                row["estimate_error"] = row["estimate_bytes"] / row["peak_rss_bytes"] - 1
                rows.append(row)
                continue
            why = refusal(wf, reg, env, spec)
            if why:
                row["skipped"] = why
                print(f"{fam.display} {spec}: skipped: {why}", file=sys.stderr, flush=True)
                rows.append(row)
                continue
            t0 = time.perf_counter()
            res = run_child([__file__, "child", json.dumps({"prompt": p, "spec": spec, "models": str(models),
                                                             "output": out_dir, "steps": steps})])
            row.update(s_per_step=res["s_per_step"], first_step_s=res["first_step_s"], seconds=res["seconds"],
                       child_wall_s=time.perf_counter() - t0, peak_rss_bytes=res["peak_rss_bytes"],
                       nan_fallbacks=res["nan_fallbacks"], warnings=res["warnings"],
                       node_seconds=res["node_seconds"])
            row["estimate_error"] = row["estimate_bytes"] / row["peak_rss_bytes"] - 1
            seen[k] = dict(row)
            rows.append(row)
            per = row["s_per_step"] if row["s_per_step"] is not None else float("nan")
            print(f"{fam.display} {spec}: {per:.2f} s/step, peak {fmt_bytes(row['peak_rss_bytes'])}, estimate "
                  f"{fmt_bytes(row['estimate_bytes'])} ({100 * row['estimate_error']:+.0f}%)", file=sys.stderr,
                  flush=True)
        ref = next((r for r in rows if r["family"] == fam.display and r.get("s_per_step")), None)
        for r in rows:
            if ref is not None and r["family"] == fam.display and r.get("s_per_step"):
                r["vs_first_run"] = r["s_per_step"] / ref["s_per_step"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="';'-separated --precision arguments (presets or SPECs)")
    ap.add_argument("--steps", type=int, default=2, help="sampler steps (2: one measured after the first)")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--models", default=None, help="keep the generated files here and reuse them "
                    "(default: a temporary folder, removed at the end)")
    ap.add_argument("--tiny", action="store_true", help="tiny configs of each family (seconds; a smoke test)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args(argv)

    from mixgraph.graph.precision import hardware_section
    from mixgraph.ui.bench.bench_precision import fmt_bytes, format_table
    from mixgraph.ui.estimate import available_bytes

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    runs = [r.strip() for r in args.runs.split(";") if r.strip()]
    for spec in runs:
        resolved(spec)  # a bad SPEC fails here, before any file is written
    tmp = tempfile.mkdtemp(prefix="mixgraph-bench-dit-")
    try:
        models = Path(args.models) if args.models else Path(tmp) / "models"
        rows = bench(families, runs, args.steps, args.size, models, args.tiny, str(Path(tmp) / "output"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hw = hardware_section("cpu")
    result = {"hardware": hw, "threads": torch.get_num_threads(), "tiny": args.tiny, "size": args.size,
              "steps": args.steps, "available_bytes_at_end": available_bytes("cpu"), "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    print(f"CPU: {hw['name']}; {result['threads']} threads; native bf16 {hw['native_bf16']}, f16 "
          f"{hw['native_f16']} ({hw['why']}); {args.size}x{args.size}, {args.steps} steps"
          + (" (TINY configs)" if args.tiny else ""))
    print(format_table(rows, [
        ("family", "family", str), ("precision", "precision", str), ("model_spec", "model", str),
        ("resolved", "MODEL/CLIP", str),
        ("s_per_step", "s/step", lambda x: f"{x:.2f}"), ("vs_first_run", "vs 1st run", lambda x: f"{x:.2f}x"),
        ("first_step_s", "1st step", lambda x: f"{x:.1f}"),
        ("peak_rss_bytes", "peak RSS", fmt_bytes), ("estimate_bytes", "estimate", fmt_bytes),
        ("estimate_error", "est. err", lambda x: f"{100 * x:+.0f}%"), ("same_as", "same as", str),
        ("skipped", "skipped", lambda x: "yes")]))
    for r in rows:
        if r.get("skipped"):
            print(f"{r['family']} {r['precision']}: skipped: {r['skipped']}")
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
