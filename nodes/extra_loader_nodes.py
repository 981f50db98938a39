"""More loaders from ComfyUI's nodes.py: DiffusersLoader, DiffControlNetLoader, and
ImageOnlyCheckpointLoader with its device-choosing variant ImageOnlyCheckpointLoaderDevice
(nodes_video_model.py; Stable Zero123 checkpoints; SVD img2vid / SV3D are refused clearly).
unCLIPCheckpointLoader lives with the CLIP vision nodes (clip_vision_nodes.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo, Socket, node
from mixgraph.nodes import folders
from mixgraph.nodes.device_options import check_placement, device_options
from mixgraph.nodes.loading import _fingerprint
from mixgraph.nodes.models import loader
from mixgraph.nodes.models.safetensors_io import SAFETENSORS_SUFFIXES, WeightFileError, inspect_file


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


def _image_only_check(env: Any, **literals: Any) -> list[str]:
    """Validation from the safetensors header alone (pickles are checked when loaded)."""
    value = literals.get("ckpt_name")
    if not isinstance(value, str):
        return []
    try:
        path = folders.resolve(env, "checkpoints", value)
    except (folders.FolderError, OSError):
        return []  # the combo check reports a missing file
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES or not path.is_file():
        return []
    try:
        info = inspect_file(path)
    except (WeightFileError, OSError):
        return []  # the loader reports an unreadable file with its cause
    problem = loader.image_only_problem(f"ckpt_name {value!r}", info)
    return [f"ImageOnlyCheckpointLoader: {problem}"] if problem else []


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (img2vid model)",
      fingerprint=_fingerprint("checkpoints", "ckpt_name"), validate=_image_only_check)
def ImageOnlyCheckpointLoader(ctx, ckpt_name=Combo(folders.options("checkpoints"))):
    """Loads a Stable Zero123 checkpoint: its UNet (with the camera projection), the CLIP vision
    tower it holds and its VAE. SVD img2vid / SV3D (video models) are not supported."""
    return loader.load_image_only_checkpoint(folders.resolve(ctx.env, "checkpoints", ckpt_name))


def _image_only_device_check(env: Any, model_device: Any = None, clip_vision_device: Any = None,
                             vae_device: Any = None, **literals: Any) -> list[str]:
    """ImageOnlyCheckpointLoader's checks; the device inputs accept any value at validation, as
    ComfyUI's VALIDATE_INPUTS does (an unknown "gpu:N" falls back to "default")."""
    return [p.replace("ImageOnlyCheckpointLoader:", "ImageOnlyCheckpointLoaderDevice:", 1)
            for p in _image_only_check(env, **literals)]


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (Device)",
      fingerprint=_fingerprint("checkpoints", "ckpt_name"), validate=_image_only_device_check)
def ImageOnlyCheckpointLoaderDevice(
        ctx, ckpt_name=Combo(folders.options("checkpoints")),
        model_device=Combo(device_options, optional=True,
                           tooltip="Device for the diffusion model (UNET)."),
        clip_vision_device=Combo(device_options, optional=True,
                                 tooltip="Device for the CLIP vision encoder."),
        vae_device=Combo(device_options, optional=True, tooltip="Device for the VAE.")):
    """ImageOnlyCheckpointLoader with a device per model; "default" (or the run's own device) is
    where mixgraph runs them, another device is not supported yet."""
    for name, option in (("model_device", model_device), ("clip_vision_device", clip_vision_device),
                         ("vae_device", vae_device)):
        check_placement("ImageOnlyCheckpointLoaderDevice", name, option, ctx.env.device)
    return loader.load_image_only_checkpoint(folders.resolve(ctx.env, "checkpoints", ckpt_name))
