"""`mixgraph demo`: the default txt2img workflow on the embedded model, with no setup.

The embedded model (`nodes/models/data/models/checkpoints/mixgraph-shapes.safetensors`, a few MB, trained by
`tools/train_embedded.py`) is a tiny Stable Diffusion 1.x in the ordinary single-file layout that
draws coloured shapes on coloured backgrounds from captions like "a small red circle at the top
left on a blue background". Every models folder lists it among the checkpoints (after the user's
own files), so CheckpointLoaderSimple loads it like any other file and this workflow runs on a
fresh install. It samples a 64x64 picture (the size it was trained at) and scales it to 256x256
for viewing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mixgraph.nodes.models.shapes import EMBEDDED_CHECKPOINT, vocabulary_text

DEMO_CHECKPOINT = EMBEDDED_CHECKPOINT.name
DEFAULT_PROMPT = "a blue circle on a yellow background"


def demo_workflow(prompt: str = DEFAULT_PROMPT, seed: int = 42) -> dict:
    """ComfyUI API format: ComfyUI's default graph (checkpoint, two prompts, KSampler, VAE decode,
    save) on the embedded model, at its 64x64 size, plus a 4x upscale of the picture."""

    def link(node_id: str, slot: int = 0) -> list:
        return [node_id, slot]

    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": DEMO_CHECKPOINT},
              "_meta": {"title": "Load Checkpoint"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": link("4", 1)},
              "_meta": {"title": "Positive"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": link("4", 1)},
              "_meta": {"title": "Negative"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "seed": seed, "steps": 20, "cfg": 5.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0, "model": link("4"), "positive": link("6"), "negative": link("7"),
            "latent_image": link("5")}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": link("3"), "vae": link("4", 2)}},
        "10": {"class_type": "ImageScale", "inputs": {
            "image": link("8"), "upscale_method": "bilinear", "width": 256, "height": 256, "crop": "disabled"},
            "_meta": {"title": "Upscale for viewing"}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "mixgraph_demo", "images": link("10")}},
    }


def run(prompt: str | None = None, output: str | Path = "output", seed: int = 42, *,
        models: str | None = None, device: str | None = None, quiet: bool = False) -> int:
    """Run the demo; print the written file and the per-node report. Returns an exit code."""
    from mixgraph.ui import api
    from mixgraph.ui.progress import ProgressBar

    prompt = prompt or DEFAULT_PROMPT
    print(f"mixgraph demo: \"{prompt}\" on the embedded model ({DEMO_CHECKPOINT}), "
          f"device {device or 'cpu'}", file=sys.stderr)
    bar = ProgressBar(disable=quiet, prefix="demo ")
    try:
        result = api.run(api.load(demo_workflow(prompt, seed)), models=models, output=output,
                         device=device, on_event=bar)
    finally:
        bar.close()
    report = result.report.to_json()
    for node_id, entry in report["nodes"].items():
        print(f"  node {node_id:>3} {entry['class_type']:<24} {entry['status']:<9} "
              f"{entry['seconds']:.3f}s  {entry['precision'] or '-'}", file=sys.stderr)
    for paths in report["outputs"].values():
        for path in paths:
            print(path)
    print(json.dumps({"seconds": round(report["seconds"], 3)}), file=sys.stderr)
    return 0


def help_text() -> str:
    return ("Run txt2img on the embedded model (no download; 4 to 16 s on a CPU, longer when "
            "other programs keep its cores busy) and write a "
            f"PNG. {vocabulary_text()} Default prompt: '{DEFAULT_PROMPT}'.")


def cli_main(args) -> int:
    """`mixgraph demo [--prompt TEXT] [--seed N] [--output DIR] [--device D]`."""
    from mixgraph.graph.env import check_device, folder_problem, models_problem
    from mixgraph.graph.executor import NodeError

    problem = check_device(getattr(args, "device", None))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    output = args.output or "output"
    problem = folder_problem(output) or models_problem(getattr(args, "models", None))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        seed = getattr(args, "seed", None)
        return run(args.prompt, output, 42 if seed is None else seed, models=getattr(args, "models", None),
                   device=getattr(args, "device", None))
    except NodeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
