"""Seconds per UNet step: mixgraph's UNet (f32, and bf16 storage / f32 compute) vs diffusers.

Builds a full-size SD1.5-architecture UNet (model_channels 320, mult 1,2,4,4, 2 ResBlocks per
level, context 768, ~860M parameters) from seeded random weights, saves it as an LDM-layout
safetensors file in a temp dir, loads it back, detects its config from the tensor shapes and runs
both implementations on the same weights in one process (they share the loaded tensors, so peak
memory is ~1x f32 weights plus one bf16 copy). Random weights time the same as trained ones.

    python benchmarks/bench_unet.py [--size 256] [--batch 2] [--steps 2] [--threads N]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodes.models.cast import apply_precision, weight_bytes  # noqa: E402
from nodes.models.unet import UNetConfig, UNetModel, unet_config_from_state_dict  # noqa: E402

PREFIX = "model.diffusion_model."


@dataclass(frozen=True)
class Policy:
    storage: torch.dtype
    compute: torch.dtype
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


def random_checkpoint(cfg: UNetConfig, seed: int) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        shapes = UNetModel(cfg).state_dict()
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in shapes.items():
        if p.ndim >= 2:
            t = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
        elif name.endswith("weight"):
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            t = 0.1 * torch.randn(p.shape, generator=gen)
        out[PREFIX + name] = t
    return out


def time_round_robin(fns: dict, steps: int) -> dict[str, float]:
    """Min seconds per call of each fn, calls interleaved so that load from other processes on a
    shared machine hits all of them alike; one untimed warm-up call each."""
    best = {name: float("inf") for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            fn()  # warm-up (allocator, oneDNN primitive creation)
        for _ in range(steps):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=256, help="image size in pixels (latent = size/8)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="timed steps each (min is reported), after a warm-up")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
    from safetensors.torch import load_file, save_file

    sd15 = UNetConfig()  # the defaults are SD1.5
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sd15_random_unet.safetensors")
        t0 = time.perf_counter()
        save_file(random_checkpoint(sd15, args.seed), path)
        make_s = time.perf_counter() - t0
        ckpt = load_file(path)
    cfg = unet_config_from_state_dict(ckpt, PREFIX)
    assert cfg == sd15, cfg

    with torch.device("meta"):
        ours = UNetModel(cfg)
    ours.load_state_dict({k[len(PREFIX):]: v for k, v in ckpt.items()}, assign=True)
    ours.eval()
    ref_cfg = dict(sample_size=args.size // 8, cross_attention_dim=768, attention_head_dim=8)
    with torch.device("meta"):
        ref = UNet2DConditionModel(**ref_cfg)
    ref.load_state_dict(convert_ldm_unet_checkpoint(ckpt, dict(ref.config)), strict=True, assign=True)
    ref.eval()
    del ckpt

    g = torch.Generator().manual_seed(1)
    lat = args.size // 8
    x = torch.randn(args.batch, 4, lat, lat, generator=g)
    t = torch.full((args.batch,), 500.0)
    ctx = torch.randn(args.batch, 77, 768, generator=g)
    bf16 = apply_precision(ours, Policy(torch.bfloat16, torch.float32))

    with torch.inference_mode():
        a, b, c = ours(x, t, ctx), ref(x, t, ctx).sample, bf16(x, t, ctx)
    result = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "image_size": args.size,
        "latent": [lat, lat],
        "batch": args.batch,
        "timed_steps": args.steps,
        "params_m": round(sum(p.numel() for p in ours.parameters()) / 1e6, 1),
        "checkpoint_build_s": round(make_s, 2),
        "weight_bytes": {"f32": weight_bytes(ours), "bf16_storage": weight_bytes(bf16)},
        "max_abs_diff_vs_diffusers_f32": (a - b).abs().max().item(),
        "rel_err_bf16_storage_vs_f32": ((c - a).norm() / a.norm()).item(),
        "s_per_step_min": time_round_robin(
            {
                "mixgraph_f32": lambda: ours(x, t, ctx),
                "diffusers_f32": lambda: ref(x, t, ctx),
                "mixgraph_bf16_storage_f32_compute": lambda: bf16(x, t, ctx),
            },
            args.steps,
        ),
    }
    for name, s in result["s_per_step_min"].items():
        print(f"{name:36s} {s:8.3f} s/step")
    print(f"max |mixgraph - diffusers| (f32): {result['max_abs_diff_vs_diffusers_f32']:.2e}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
