"""`mixgraph demo`: the default txt2img workflow on a small embedded model, with no setup.

The model is an SD 1.5-layout checkpoint with seeded random weights generated on first use into
the user cache (no download). It exercises every stage of a real run (checkpoint detection, text
encoding, sampling, VAE decode, PNG with workflow metadata); with random weights the picture is
abstract, not a photo.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DEMO_CHECKPOINT = "mixgraph-demo-tiny.safetensors"
DEFAULT_PROMPT = "a watercolor painting of a lighthouse at dawn"


def demo_workflow(prompt: str, seed: int = 42) -> dict:
    """ComfyUI API format: the same graph as ComfyUI's default workflow, at 256x256."""

    def link(node_id: str, slot: int = 0) -> list:
        return [node_id, slot]

    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": DEMO_CHECKPOINT}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": link("4", 1)}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": link("4", 1)}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 256, "height": 256, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "seed": seed, "steps": 12, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0, "model": link("4"), "positive": link("6"), "negative": link("7"),
            "latent_image": link("5")}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": link("3"), "vae": link("4", 2)}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "mixgraph_demo", "images": link("8")}},
    }


def demo_models_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mixgraph" / "demo-models"
    checkpoint = base / "checkpoints" / DEMO_CHECKPOINT
    if not checkpoint.exists():
        from mixgraph.nodes.models.synthetic import write_sd15_checkpoint

        tmp = checkpoint.with_suffix(".tmp")
        write_sd15_checkpoint(tmp, size="tiny", seed=0)
        tmp.replace(checkpoint)
    return base


def run(prompt: str | None = None, output: str | Path = "output", seed: int = 42) -> int:
    """Run the demo; print the written file and the per-node report. Returns an exit code."""
    from mixgraph.ui import api

    result = api.run(api.load(demo_workflow(prompt or DEFAULT_PROMPT, seed)),
                     models=demo_models_dir(), output=output)
    report = result.report.to_json()
    for node_id, entry in report["nodes"].items():
        print(f"  node {node_id:>3} {entry['class_type']:<24} {entry['status']:<9} "
              f"{entry['seconds']:.3f}s  {entry['precision'] or '-'}", file=sys.stderr)
    for paths in report["outputs"].values():
        for path in paths:
            print(path)
    print(json.dumps({"seconds": round(report["seconds"], 3)}), file=sys.stderr)
    return 0


def cli_main(args) -> int:
    """`mixgraph demo [--prompt TEXT] [--output DIR]`."""
    from mixgraph.graph.env import folder_problem
    from mixgraph.graph.executor import NodeError

    output = args.output or "output"
    problem = folder_problem(output)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        return run(args.prompt, output)
    except NodeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
