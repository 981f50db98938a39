"""More loaders from ComfyUI's nodes.py: DiffusersLoader, DiffControlNetLoader, and
ImageOnlyCheckpointLoader (img2vid / Zero123 checkpoints), which refuses clearly.
unCLIPCheckpointLoader lives with the CLIP vision nodes (clip_vision_nodes.py)."""

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


def _image_only_refusal(node_name: str):
    def validate(env: Any, **_: Any) -> list[str]:
        return [f"{node_name}: image-only checkpoints (SVD img2vid, Stable Zero123) are not supported yet; "
                f"use unCLIPCheckpointLoader for SD2.1 unCLIP, or CheckpointLoaderSimple for the "
                f"diffusion model alone"]

    return validate


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (img2vid model)",
      validate=_image_only_refusal("ImageOnlyCheckpointLoader"))
def ImageOnlyCheckpointLoader(ctx, ckpt_name=Combo(folders.options("checkpoints"))):
    raise NotImplementedError("ImageOnlyCheckpointLoader: image-only checkpoints (SVD img2vid, Stable Zero123) "
                              "are not supported yet")
