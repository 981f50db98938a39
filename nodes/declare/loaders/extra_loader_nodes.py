"""More loaders from ComfyUI's nodes.py: DiffusersLoader, DiffControlNetLoader, and
ImageOnlyCheckpointLoader with its device-choosing variant ImageOnlyCheckpointLoaderDevice
(nodes_video_model.py; Stable Zero123 checkpoints; SVD img2vid / SV3D are refused clearly).
unCLIPCheckpointLoader lives with the CLIP vision nodes (clip_vision_nodes.py)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo, Socket, node
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.helpers.device_options import check_placement, device_options
from mixgraph.nodes.helpers.model_files import ModelFile
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights.safetensors_io import SAFETENSORS_SUFFIXES, WeightFileError, inspect_file


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


class DiffusersFolder(ModelFile):
    """DiffusersLoader's input: a diffusers model folder, fingerprinted by all its files."""

    def options(self, env: Any) -> list[str]:
        return list_diffusers(env)

    def fingerprint(self, env: Any, name: Any) -> Any:
        try:
            return tuple(fingerprint_file(p) for p in sorted(self.path(env, name).rglob("*")) if p.is_file())
        except (folders.FolderError, OSError, TypeError, AttributeError):
            return None


DIFFUSERS = DiffusersFolder("diffusers")
DIFF_CONTROLNET = ModelFile("controlnet")   # ComfyUI's DiffControlNetLoader checks no family


@node(category="advanced/loaders/deprecated", outputs=("MODEL", "CLIP", "VAE"))
def DiffusersLoader(ctx, model_path=DIFFUSERS.input()):
    """A diffusers model folder (unet/, text_encoder[_2]/, vae/, scheduler/)."""
    return loader.load_checkpoint(DIFFUSERS.path(ctx.env, model_path))


@node(category="loaders", outputs=("CONTROL_NET",))
def DiffControlNetLoader(ctx, model=Socket("MODEL"), control_net_name=DIFF_CONTROLNET.input()):
    """A ControlNet stored as a difference to its base UNet: the model's weights are added back."""
    return (loader.load_diff_controlnet(DIFF_CONTROLNET.path(ctx.env, control_net_name), model),)


def _image_only_refusal(node_name: str, path: Path, where: str) -> str | None:
    """Validation from the safetensors header alone (pickles are checked when loaded)."""
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES or not path.is_file():
        return None
    try:
        info = inspect_file(path)
    except (WeightFileError, OSError):
        return None  # the loader reports an unreadable file with its cause
    problem = loader.image_only_problem(where, info)
    return f"{node_name}: {problem}" if problem else None


IMAGE_ONLY_CHECKPOINT = ModelFile(
    "checkpoints", refuse=partial(_image_only_refusal, "ImageOnlyCheckpointLoader"))
IMAGE_ONLY_CHECKPOINT_DEVICE = ModelFile(
    "checkpoints", refuse=partial(_image_only_refusal, "ImageOnlyCheckpointLoaderDevice"))


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (img2vid model)")
def ImageOnlyCheckpointLoader(ctx, ckpt_name=IMAGE_ONLY_CHECKPOINT.input()):
    """Loads a Stable Zero123 checkpoint: its UNet (with the camera projection), the CLIP vision
    tower it holds and its VAE. SVD img2vid / SV3D (video models) are not supported."""
    return loader.load_image_only_checkpoint(IMAGE_ONLY_CHECKPOINT.path(ctx.env, ckpt_name))


def _any_device(env: Any, model_device: Any = None, clip_vision_device: Any = None,
                vae_device: Any = None) -> list[str]:
    """The device inputs accept any value at validation, as ComfyUI's VALIDATE_INPUTS does (an
    unknown "gpu:N" falls back to "default"); the file's check is its input's."""
    return []


@node(category="loaders/video_models", outputs=("MODEL", "CLIP_VISION", "VAE"),
      display_name="Image Only Checkpoint Loader (Device)", validate=_any_device)
def ImageOnlyCheckpointLoaderDevice(
        ctx, ckpt_name=IMAGE_ONLY_CHECKPOINT_DEVICE.input(),
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
    return loader.load_image_only_checkpoint(IMAGE_ONLY_CHECKPOINT_DEVICE.path(ctx.env, ckpt_name))
