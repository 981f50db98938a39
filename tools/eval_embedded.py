"""Measure the embedded model: quality on held-out captions, precision variants, LoRA, ControlNet.

Everything runs through the real graph (`mixgraph.ui.api.run` on the demo workflow: tokenizer,
text encoder, UNet, sampler, VAE) and is judged by the pixel-statistics check of
`nodes/models/shapes.py` (no extra model).

    PYTHONPATH=. python tools/eval_embedded.py quality [--n 200]   # held-out captions
    PYTHONPATH=. python tools/eval_embedded.py precision [--n 24] [--precisions "int8;bf16"]  # PSNR/SSIM vs f32
    PYTHONPATH=. python tools/eval_embedded.py lora                # strength 0 / 0.5 / 1
    PYTHONPATH=. python tools/eval_embedded.py controlnet          # the mask moves the shape
    PYTHONPATH=. python tools/eval_embedded.py roundtrip [--n 240] # the check on VAE round trips
    ... --json                                                     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mixgraph.nodes.models import shapes as S
from mixgraph.ui import api
from mixgraph.ui.bench.bench_precision import psnr, ssim
from mixgraph.ui.demo import DEMO_CHECKPOINT, demo_workflow

ROOT = Path(__file__).resolve().parent.parent


def held_out_prompts(n: int, seed: int = 0) -> list[tuple[S.Scene, str]]:
    rng = random.Random(seed)
    scenes = S.held_out_scenes()
    rng.shuffle(scenes)
    return [(s, S.caption(s)) for s in scenes[:n]]


class Runner:
    def __init__(self, checkpoint: Path | None = None) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="mixgraph-eval-")
        self.executor = api.default_executor()
        if checkpoint is not None:  # a user file of the same name comes before the embedded one
            folder = Path(self.tmp.name) / "models" / "checkpoints"
            folder.mkdir(parents=True)
            shutil.copyfile(checkpoint, folder / DEMO_CHECKPOINT)  # (a symlink out of the folder is refused)

    def image(self, wf: dict, precision: str | None = None) -> np.ndarray:
        """The decoded 64x64 picture (VAEDecode's output), float 0..1 [64, 64, 3]."""
        result = api.run(wf, executor=self.executor, precision=precision,
                         models=Path(self.tmp.name) / "models", output=Path(self.tmp.name) / "out")
        return result.outputs["8"][0][0].numpy()


def score(verdicts: list[tuple[S.Scene, S.Verdict]]) -> dict:
    n = len(verdicts)
    return {
        "n": n,
        "color": sum(v.color == s.color for s, v in verdicts) / n,
        "background": sum(v.background == s.background for s, v in verdicts) / n,
        "both_colors": sum(v.color == s.color and v.background == s.background for s, v in verdicts) / n,
        "shape": sum(v.shape == s.shape for s, v in verdicts) / n,
        "shape_by_fill": sum(v.shape_by_fill == s.shape for s, v in verdicts) / n,
        "position": sum(v.position == s.position for s, v in verdicts) / n,
        "shape_by_size": {size: round(sum(v.shape == s.shape for s, v in verdicts if s.size == size)
                                      / max(1, sum(s.size == size for s, _ in verdicts)), 3)
                          for size in S.SIZES},
        "shape_by_fill_by_size": {size: round(sum(v.shape_by_fill == s.shape for s, v in verdicts if s.size == size)
                                              / max(1, sum(s.size == size for s, _ in verdicts)), 3)
                                  for size in S.SIZES},
    }


def quality(args, runner: Runner) -> dict:
    verdicts = []
    t0 = time.time()
    for i, (scene, prompt) in enumerate(held_out_prompts(args.n)):
        wf = demo_workflow(prompt, seed=1000 + i)
        wf["3"]["inputs"].update(sampler_name=args.sampler, scheduler=args.scheduler, steps=args.steps)
        if args.cfg is not None:
            wf["3"]["inputs"]["cfg"] = args.cfg
        verdicts.append((scene, S.check_image(runner.image(wf))))
        if (i + 1) % 25 == 0:
            print(f"quality {i + 1}/{args.n}: {score(verdicts)}  {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    out = score(verdicts)
    out["sampler"] = f"{args.sampler}/{args.scheduler}, {args.steps} steps, cfg {args.cfg or demo_workflow()['3']['inputs']['cfg']}"
    out["confusions"] = sorted({f"{s.shape}->{v.shape}" for s, v in verdicts if v.shape != s.shape})[:12]
    return out


PRECISIONS = {
    "bf16 UNet + f32 VAE": "f32,MODEL=bf16,VAE=f32",
    "f16+upcast": "f16+upcast",
    "bf16:f32": "bf16:f32",
    "int8": "int8",
    "int8:bf16": "int8:bf16",
    "bf16": "bf16",
}


def precision(args, runner: Runner) -> dict:
    rows: dict[str, dict] = {}
    ref: list[np.ndarray] = []
    prompts = held_out_prompts(args.n, seed=1)
    for i, (scene, prompt) in enumerate(prompts):
        ref.append(runner.image(demo_workflow(prompt, seed=2000 + i), "f32"))
    rows["f32"] = {"spec": "f32", **score([(s, S.check_image(im)) for (s, _), im in zip(prompts, ref)])}
    chosen = PRECISIONS if not args.precisions else {s: s for s in args.precisions.split(";") if s}
    for name, spec in chosen.items():
        images = [runner.image(demo_workflow(p, seed=2000 + i), spec) for i, (_, p) in enumerate(prompts)]
        a = [torch.from_numpy(x)[None] for x in images]
        b = [torch.from_numpy(x)[None] for x in ref]
        rows[name] = {"spec": spec,
                      "psnr_db_mean": float(np.mean([min(psnr(x, y), 99.0) for x, y in zip(a, b)])),
                      "psnr_db_min": float(min(psnr(x, y) for x, y in zip(a, b))),
                      "psnr_db_each": [round(min(psnr(x, y), 99.0), 1) for x, y in zip(a, b)],
                      "ssim_mean": float(np.mean([ssim(x, y) for x, y in zip(a, b)])),
                      **score([(s, S.check_image(im)) for (s, _), im in zip(prompts, images)])}
        print(f"precision {name}: {rows[name]}", file=sys.stderr, flush=True)
    return rows


def lora(args, runner: Runner) -> dict:
    out = {}
    prompts = [("a red circle on a blue background", "blue"), ("a yellow square on a green background", "green"),
               ("a white triangle on a pink background", "pink"), ("a small cyan circle on an orange background", "orange")]
    wf_path = ROOT / "workflows" / "lora_shapes.json"
    base_images = []
    for strength in (0.0, 0.5, 1.0):
        bgs, diffs = [], []
        for i, (prompt, _) in enumerate(prompts):
            wf = json.loads(wf_path.read_text())
            wf["6"]["inputs"]["text"] = prompt
            wf["3"]["inputs"]["seed"] = 3000 + i
            wf["11"]["inputs"].update(strength_model=strength, strength_clip=strength)
            im = runner.image(wf)
            if strength == 0.0:
                base = demo_workflow(prompt, seed=3000 + i)
                base_im = runner.image(base)
                base_images.append(base_im)
                diffs.append(float(np.abs(im - base_im).max()))
            else:
                diffs.append(float(np.abs(im - base_images[i]).mean()))
            bgs.append(S.check_image(im).background)
        key = f"strength {strength}"
        out[key] = {"backgrounds": bgs,
                    ("max |diff| vs base model" if strength == 0.0 else "mean |diff| vs base model"): diffs}
    out["prompted backgrounds"] = [b for _, b in prompts]
    return out


def controlnet(args, runner: Runner) -> dict:
    wf_path = ROOT / "workflows" / "controlnet_shapes.json"
    out = {}
    for (x, y), want in (((36, 36), "at the bottom right"), ((4, 4), "at the top left"),
                         ((36, 4), "at the top right"), ((4, 36), "at the bottom left"), ((20, 20), "in the center")):
        found = []
        for strength in (0.0, 1.0):
            wf = json.loads(wf_path.read_text())
            wf["14"]["inputs"].update(x=x, y=y)
            wf["17"]["inputs"]["strength"] = strength
            v = S.check_image(runner.image(wf))
            found.append(v.position)
        out[f"mask at x={x},y={y} ({want})"] = {"strength 0": found[0], "strength 1": found[1]}
    return out


def roundtrip(args, runner: Runner) -> dict:
    """The ceiling the VAE puts on the shape score: held-out pictures drawn exactly (`render`),
    encoded and decoded by the checkpoint's VAE, then checked. What the check misreads here no
    UNet can fix; it also shows how much of that each reading (`shape`, `shape_by_fill`) loses."""
    from mixgraph.graph.precision import Policy
    from mixgraph.nodes.models.loader import load_checkpoint

    _, _, vae = load_checkpoint(args.checkpoint or S.EMBEDDED_CHECKPOINT)
    rng = random.Random(5)
    scenes = S.held_out_scenes()
    rng.shuffle(scenes)
    scenes = scenes[:args.n]
    pictures = torch.from_numpy(np.stack([S.render(s, rng) for s in scenes]).astype(np.float32) / 255.0)
    decoded = vae.decode(vae.encode(pictures, Policy()), Policy()).clamp(0, 1).numpy()
    out = {"n": len(scenes)}
    for name, images in (("drawn", pictures.numpy()), ("vae round trip", decoded)):
        out[name] = score([(s, S.check_image(im)) for s, im in zip(scenes, images)])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("quality", "precision", "lora", "controlnet", "roundtrip", "all"))
    p.add_argument("--n", type=int)
    p.add_argument("--sampler", default="euler")
    p.add_argument("--scheduler", default="normal")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cfg", type=float)
    p.add_argument("--json", action="store_true")
    p.add_argument("--precisions", help="precision: these SPECs (';'-separated) instead of the default set")
    p.add_argument("--checkpoint", type=Path, help="evaluate this file instead of the embedded model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (more than the free cores slows it down)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    runner = Runner(args.checkpoint)
    result = {}
    for what in (("quality", "precision", "lora", "controlnet") if args.what == "all" else (args.what,)):
        args.n = args.n or {"quality": 200, "precision": 24, "roundtrip": 240}.get(what)
        result[what] = {"quality": quality, "precision": precision, "lora": lora, "controlnet": controlnet,
                        "roundtrip": roundtrip}[what](args, runner)
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
