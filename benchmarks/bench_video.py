"""Video / Qwen-Image benchmark: s/step, s/frame and peak memory of a Wan 2.1 1.3B-shaped DiT, the
full-size Wan 2.1 VAE decode and a Qwen-Image-shaped DiT on this machine, per precision, with
`mixgraph estimate`'s number (ui/estimate.py) against the measured peak RSS.

Weights are seeded random, in the real architectures' shapes (benchmarks/bench_dit.py's
`write_random_file`: built on the meta device, streamed to safetensors in bf16; the model is never
held in f32 while writing):
- Wan 2.1 1.3B t2v (dim 1536, 30 layers, FFN 8960, text width 4096): UNETLoader `default`.
  Text: a real umT5 of the full output width (4096) but two narrow layers and a 256-row vocabulary
  (tests/fixtures/tiny_umt5.py), so the DiT gets context tokens of the real width; the cost of
  umT5-XXL itself is not measured. EmptyHunyuanLatentVideo WxH, LENGTH frames, KSampler euler /
  simple, cfg 1.0 (one model call per step; the templates' cfg 6 costs two), SaveLatent.
- The Wan 2.1 VAE at full size (base width 96, 2 res blocks, 127 M params, bf16 file as shipped):
  VAELoader, VAEDecode of the same latent (zeros: the cost does not depend on values), SaveImage.
- Qwen-Image (dim 3072, 24 heads, MLP 12288): 60 blocks are 20 B parameters, 40 GB in bf16 and
  20 GB in fp8, more than this machine's 24 GiB, so the run uses `--qwen-blocks` blocks (default 6)
  and the table gives the per-block time extrapolated linearly to 60 blocks (`s/step@60`,
  `peak@60`: the measured peak plus the missing blocks' weights in the storage dtype). Its text
  input is the tiny Qwen2.5-VL of tests/fixtures/tiny_qwen25_vl.py (64 wide), so txt_in reads
  64-wide tokens (a 64x3072 matrix instead of 3584x3072: 0.05% of the parameters).

s/frame: the DiT's `s_per_step / frames` (per sampling step: a 30-step video costs 30x), the VAE's
VAEDecode node time / frames; frames = the decoded frame count (1 + 4 (T - 1) for T latent frames).
Each run is a child process (its peak RSS is its own), one at a time. A DiT run whose estimate
exceeds `--max-gib` (default 18), or that `mixgraph run` would refuse, is skipped with the reason
printed instead of risking the OOM killer; a VAE run is guarded by `vae_bound` instead (the
estimate of a video decode was far too high when this was written: it is reported, not trusted).

    nice -n 10 python benchmarks/bench_video.py [--parts wan,vae,qwen] [--size 256x256] [--length 9]
        [--steps 2] [--runs "f32;bf16;fp8_e4m3fn:bf16"] [--qwen-blocks 6] [--models DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_dit import bf16_all, module_shapes, write_random_file  # noqa: E402

PROMPT = "a red fox running through snow, cinematic, slow motion"
QWEN_FULL_BLOCKS = 60
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "fp8_e4m3fn": 1, "fp8_e5m2": 1}


def wan_shapes() -> dict:
    from mixgraph.nodes.families.wan.family import WAN
    from mixgraph.nodes.families.wan.model import WanConfig

    return module_shapes(lambda: WAN.build(WanConfig()))   # defaults: Wan 2.1 1.3B t2v


def qwen_shapes(blocks: int) -> dict:
    from mixgraph.nodes.families.qwen_image.family import QWEN_IMAGE
    from mixgraph.nodes.families.qwen_image.model import QwenImageConfig

    return module_shapes(lambda: QWEN_IMAGE.build(QwenImageConfig(depth=blocks, context_dim=64)))


def ensure_files(models: Path, parts: list[str], qwen_blocks: int) -> None:
    """Write the files the parts need into `models` unless there."""
    from safetensors.torch import save_file

    from mixgraph.nodes.vae.wan_vae import WanVAEConfig
    from tests.fixtures.tiny_qwen25_vl import write_qwen25_vl
    from tests.fixtures.tiny_umt5 import tiny_umt5_state_dict, umt5_spiece_tensor
    from tests.fixtures.tiny_wan_vae import wan_vae_state_dict

    todo = []
    if "wan" in parts:
        todo.append((models / "diffusion_models" / "bench_wan21_1.3b_bf16.safetensors",
                     lambda p: write_random_file(p, wan_shapes(), bf16_all, seed=0)))
        todo.append((models / "text_encoders" / "bench_umt5_4096.safetensors", lambda p: save_file(
            {**tiny_umt5_state_dict(1, d_model=4096, layers=2, heads=4, d_kv=64, d_ff=256, vocab=256),
             "spiece_model": umt5_spiece_tensor()}, str(p))))
    if "vae" in parts:
        todo.append((models / "vae" / "bench_wan21_vae_bf16.safetensors", lambda p: save_file(
            {k: v.to(torch.bfloat16).contiguous() for k, v in wan_vae_state_dict(WanVAEConfig(), 2).items()}, str(p))))
    if "qwen" in parts:
        todo.append((models / "diffusion_models" / f"bench_qwen_image_{qwen_blocks}blocks_bf16.safetensors",
                     lambda p: write_random_file(p, qwen_shapes(qwen_blocks), bf16_all, seed=3)))
        todo.append((models / "text_encoders" / "bench_qwen25_vl_tiny.safetensors",
                     lambda p: write_qwen25_vl(p, seed=4, vision=False)))
    for path, write in todo:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            write(path)
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)


def _sampler(unet: str, clip: str, clip_type: str, latent: dict, steps: int, prefix: str) -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": clip, "type": clip_type}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["2", 0]}},
        "5": latent,
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 1, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["3", 0], "negative": ["3", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": prefix}},
    }


def workflows(parts: list[str], w: int, h: int, length: int, steps: int, qwen_blocks: int) -> dict[str, dict]:
    video = {"class_type": "EmptyHunyuanLatentVideo",
             "inputs": {"width": w, "height": h, "length": length, "batch_size": 1}}
    out = {}
    if "wan" in parts:
        out["Wan 2.1 1.3B DiT"] = _sampler("bench_wan21_1.3b_bf16.safetensors", "bench_umt5_4096.safetensors",
                                           "wan", video, steps, "bench_video/wan")
    if "vae" in parts:
        out["Wan 2.1 VAE decode"] = {
            "1": {"class_type": "VAELoader", "inputs": {"vae_name": "bench_wan21_vae_bf16.safetensors"}},
            "2": video,
            "3": {"class_type": "VAEDecode", "inputs": {"samples": ["2", 0], "vae": ["1", 0]}},
            "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "bench_video/vae"}},
        }
    if "qwen" in parts:
        out[f"Qwen-Image DiT ({qwen_blocks}/60 blocks)"] = _sampler(
            f"bench_qwen_image_{qwen_blocks}blocks_bf16.safetensors", "bench_qwen25_vl_tiny.safetensors",
            "qwen_image", {"class_type": "EmptySD3LatentImage", "inputs": {"width": w, "height": h, "batch_size": 1}},
            steps, "bench_video/qwen")
    return out


def child(cfg: dict) -> None:
    """One measured run in this (fresh) process."""
    from mixgraph.ui.bench.bench_precision import emit_child_result, peak_rss_bytes, rss_bytes, run_measured

    torch.manual_seed(0)
    base = rss_bytes()
    m = run_measured(cfg["prompt"], cfg["spec"], env_kw={"models": cfg["models"], "output": cfg["output"]})
    m.pop("images")
    emit_child_result({k: m[k] for k in ("s_per_step", "seconds", "node_seconds", "nan_fallbacks", "warnings")}
                      | {"peak_rss_bytes": peak_rss_bytes(), "base_rss_bytes": base})


def store_bytes(spec: str) -> int:
    """Bytes per weight of the MODEL storage a SPEC gives (the extrapolation's missing blocks)."""
    store = spec.split(",")[-1].split("=")[-1].split(":")[0].split("+")[0]
    return _BYTES.get(store, 4)


def bench(parts: list[str], runs: list[str], w: int, h: int, length: int, steps: int, qwen_blocks: int,
          models: Path, out_dir: str, max_bytes: int) -> list[dict]:
    from mixgraph.graph.env import Env
    from mixgraph.ui import api
    from mixgraph.ui.bench.bench_precision import fmt_bytes, run_child
    from mixgraph.ui.estimate import estimate, refusal

    reg = api.default_registry()
    env = Env.from_args(models=str(models))
    frames = 1 + 4 * ((length - 1) // 4)
    rows = []
    for name, p in workflows(parts, w, h, length, steps, qwen_blocks).items():
        is_vae = "VAE" in name
        wf = api.load(p, reg)
        for spec in (["f32", "bf16"] if is_vae else runs):
            row: dict[str, Any] = {"model": name, "precision": spec, "size": f"{w}x{h}",
                                   "frames": 1 if "Qwen" in name else frames}
            est = estimate(wf, reg, env, spec)
            row.update(estimate_bytes=est["peak_bytes"], estimate_node=est["peak_node"])
            if is_vae:   # the estimate of a video decode is far too high (see the README); a bound instead
                bound = vae_bound(w, h, spec)
                why = (f"the decode bound {fmt_bytes(bound)} exceeds --max-gib {max_bytes / 2**30:.0f}"
                       if bound > max_bytes else None)
            else:
                why = refusal(wf, reg, env, spec)
                if why is None and est["peak_bytes"] > max_bytes:
                    why = f"the estimate {fmt_bytes(est['peak_bytes'])} exceeds --max-gib {max_bytes / 2**30:.0f}"
            if why:
                row["skipped"] = why
                print(f"{name} {spec}: skipped: {why}", file=sys.stderr, flush=True)
                rows.append(row)
                continue
            t0 = time.perf_counter()
            res = run_child([__file__, "child", json.dumps({"prompt": p, "spec": spec, "models": str(models),
                                                             "output": out_dir})])
            row.update(seconds=res["seconds"], child_wall_s=time.perf_counter() - t0,
                       peak_rss_bytes=res["peak_rss_bytes"], nan_fallbacks=res["nan_fallbacks"])
            if is_vae:
                row["s_per_frame"] = res["node_seconds"]["3"] / row["frames"]
            else:
                row["s_per_step"] = res["s_per_step"]
                row["s_per_frame"] = res["s_per_step"] / row["frames"] if res["s_per_step"] else None
            row["estimate_error"] = row["estimate_bytes"] / row["peak_rss_bytes"] - 1
            if "Qwen" in name and row.get("s_per_step"):
                missing = QWEN_FULL_BLOCKS - qwen_blocks
                per_block = sum(v.numel() for k, v in qwen_block_shapes().items()) * store_bytes(spec)
                row["s_per_step_full"] = row["s_per_step"] * QWEN_FULL_BLOCKS / qwen_blocks
                row["peak_full_bytes"] = row["peak_rss_bytes"] + missing * per_block
            rows.append(row)
            print(f"{name} {spec}: {json.dumps({k: v for k, v in row.items() if k not in ('model',)}, default=str)}",
                  file=sys.stderr, flush=True)
    return rows


def vae_bound(w: int, h: int, spec: str) -> int:
    """A generous bound on a chunked Wan 2.1 VAE decode's peak: 2 GB (interpreter, f32 weights) plus
    32 full-resolution maps of the decoder's widest width (384) for one 4-frame chunk in the compute
    dtype. The decode runs one latent frame at a time with a temporal cache, so the frame count
    does not grow it; used as the guard because `mixgraph estimate` overstates video decodes."""
    per = 2 if spec.startswith("bf16") and ":f32" not in spec else 4
    return 2 * 10**9 + 32 * 384 * w * h * 4 * per


def qwen_block_shapes() -> dict:
    """One Qwen-Image block's parameter shapes (as meta tensors)."""
    shapes = qwen_shapes(1)
    return {k: torch.empty(s, device="meta") for k, s in shapes.items() if k.startswith("transformer_blocks.0.")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="wan,vae,qwen")
    ap.add_argument("--runs", default="f32;bf16;fp8_e4m3fn:bf16", help="';'-separated --precision arguments")
    ap.add_argument("--size", default="256x256", help="WxH")
    ap.add_argument("--length", type=int, default=9, help="frames (1 + 4k)")
    ap.add_argument("--steps", type=int, default=2, help="sampler steps (2: one measured after the first)")
    ap.add_argument("--qwen-blocks", type=int, default=6)
    ap.add_argument("--max-gib", type=float, default=18.0)
    ap.add_argument("--models", default=None, help="keep the generated files here and reuse them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from mixgraph.graph.precision import hardware_section
    from mixgraph.ui.bench.bench_precision import fmt_bytes, format_table

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    w, h = (int(x) for x in args.size.lower().split("x"))
    runs = [r.strip() for r in args.runs.split(";") if r.strip()]
    tmp = tempfile.mkdtemp(prefix="mixgraph-bench-video-")
    try:
        models = Path(args.models) if args.models else Path(tmp) / "models"
        ensure_files(models, parts, args.qwen_blocks)
        rows = bench(parts, runs, w, h, args.length, args.steps, args.qwen_blocks, models,
                     str(Path(tmp) / "output"), int(args.max_gib * 2**30))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hw = hardware_section("cpu")
    result = {"hardware": hw, "threads": torch.get_num_threads(), "size": args.size, "length": args.length,
              "steps": args.steps, "qwen_blocks": args.qwen_blocks, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    print(f"CPU: {hw['name']}; {result['threads']} threads; native bf16 {hw['native_bf16']} ({hw['why']}); "
          f"{args.size}, {args.length} frames, {args.steps} steps")
    print(format_table(rows, [
        ("model", "model", str), ("precision", "precision", str), ("frames", "frames", str),
        ("s_per_step", "s/step", lambda x: f"{x:.2f}"), ("s_per_frame", "s/frame", lambda x: f"{x:.3f}"),
        ("peak_rss_bytes", "peak RSS", fmt_bytes), ("estimate_bytes", "estimate", fmt_bytes),
        ("estimate_error", "est. err", lambda x: f"{100 * x:+.0f}%"),
        ("s_per_step_full", "s/step@60", lambda x: f"{x:.1f}"), ("peak_full_bytes", "peak@60", fmt_bytes),
        ("skipped", "skipped", lambda x: "yes")]))
    for r in rows:
        if r.get("skipped"):
            print(f"{r['model']} {r['precision']}: skipped: {r['skipped']}")
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
