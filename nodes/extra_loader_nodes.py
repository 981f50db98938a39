"""More loaders from ComfyUI's nodes.py: DiffusersLoader, DiffControlNetLoader, and the CLIP-vision checkpoint loaders
(unCLIPCheckpointLoader, ImageOnlyCheckpointLoader), which refuse clearly until CLIP vision
models exist here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo, Socket, node
from mixgraph.nodes import folders
from mixgraph.nodes.models import loader


def list_diffusers(env: Any) -> list[str]:
    """DiffusersLoader's options: every folder holding a ``model_index.json`` under the
    ``diffusers`` model folders, relative to that folder (ComfyUI walks them recursively)."""
    if env is None:
        return []
    found: set[str] = set()
    for root in folders.roots(env, "diffusers"):
        if not root.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(root, followlinks=True):
            if "model_index.json" in files:
                found.add(Path(os.path.relpath(dirpath, root)).as_posix())
    return sorted(found)


def _diffusers_fingerprint(env: Any, model_path: str = "", **_: Any):
    try:
        folder = folders.resolve(env, "diffusers", model_path)
        return tuple(fingerprint_file(p) for p in sorted(folder.rglob("*")) if p.is_file())
    except (folders.FolderError, OSError):
        return None


@node(category="advanced/loaders/deprecated", outputs=("MODEL", "CLIP", "VAE"),
      fingerprint=_diffusers_fingerprint)
def DiffusersLoader(ctx, model_path=Combo(list_diffusers)):
    """A diffusers model folder (unet/, text_encoder[_2]/, vae/, scheduler/)."""
    return loader.load_checkpoint(folders.resolve(ctx.env, "diffusers", model_path))


def _controlnet_fingerprint(env: Any, control_net_name: str = "", **_: Any):
    try:
        return fingerprint_file(folders.resolve(env, "controlnet", control_net_name))
    except (folders.FolderError, OSError):
        return None


@node(category="loaders", outputs=("CONTROL_NET",), fingerprint=_controlnet_fingerprint)
def DiffControlNetLoader(ctx, model=Socket("MODEL"), control_net_name=Combo(folders.options("controlnet"))):
    """A ControlNet stored as a difference to its base UNet: the model's weights are added back."""
    return (loader.load_diff_controlnet(folders.resolve(ctx.env, "controlnet", control_net_name), model),)


def _clip_vision_refusal(node_name: str):
    def validate(env: Any, **_: Any) -> list[str]:
        return [f"{node_name}: CLIP vision models are not supported yet, so checkpoints that carry one "
                f"(unCLIP, SVD image-only) cannot be loaded; use CheckpointLoaderSimple for the "
                f"diffusion model alone"]

    return validate


@node(category="loaders", outputs=("MODEL", "CLIP", "VAE", "CLIP_VISION"),
      validate=_clip_vision_refusal("unCLIPCheckpointLoader"))
def unCLIPCheckpointLoader(ctx, ckpt_name=Combo(folders.options("checkpoints"))):
    raise NotImplementedError("unCLIPCheckpointLoader: CLIP vision models are not supported yet")


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (img2vid model)",
      validate=_clip_vision_refusal("ImageOnlyCheckpointLoader"))
def ImageOnlyCheckpointLoader(ctx, ckpt_name=Combo(folders.options("checkpoints"))):
    raise NotImplementedError("ImageOnlyCheckpointLoader: CLIP vision models are not supported yet")
