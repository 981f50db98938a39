"""ComfyUI ``comfy_extras/nodes_multigpu.py`` (374ae43): ``SelectModelDevice``,
``SelectCLIPDevice``, ``SelectVAEDevice`` and ``MultiGPU_WorkUnits`` ("MultiGPU CFG Split").

mixgraph runs every model of a run on the run's device (``device_options.py``), so these nodes
keep ComfyUI's rules where they agree with that and refuse the rest:

* "default" and the run's own device pass the model through (ComfyUI: back to the loader's
  devices, which are the run's device here).
* An option that names no device of this machine ("gpu:3" on a one-GPU box) passes through,
  as ComfyUI does (with a log line); the device combos accept any value at validation so
  workflows stay portable (ComfyUI's ``validate_inputs`` returns True).
* SelectVAEDevice: "cpu" passes through with a log line, as ComfyUI (CPU is not offered for
  the VAE).
* Another device of this machine (e.g. "cpu" on a CUDA run, "gpu:1" on a "cuda:0" run) is
  refused: one model on a device of its own is not supported yet.
* MultiGPU_WorkUnits clones the model onto up to ``max_gpus`` devices so cond/uncond batches are
  split across GPUs while sampling (``comfy.multigpu.create_multigpu_deepclones``). With one
  device (or ``max_gpus`` 1) ComfyUI makes no clone and the model is unchanged; so here. With
  several CUDA devices the split is not supported yet and the node says so.

The descriptions are the first line of ComfyUI's (the rest describes its placement machinery).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from mixgraph.graph.node import Combo, Int, Socket, node
from mixgraph.nodes.helpers.device_options import check_placement, device_options, resolve_device_option

log = logging.getLogger(__name__)

CATEGORY = "advanced/multigpu"


def _no_cpu_options(env: Any = None) -> list[str]:
    """ComfyUI's ``get_gpu_device_options_no_cpu``: the device options without "cpu"."""
    return [o for o in device_options(env) if o != "cpu"]


def _any_device(env: Any, device: Any = None, **literals: Any) -> list[str]:
    """Every device value is accepted at validation (ComfyUI's ``validate_inputs``)."""
    return []


def _select(ctx, node_name: str, value, device: str | None, cpu_ok: bool = True):
    if device not in (None, "default") and resolve_device_option(device) is None:
        log.info("%s: requested device %r not available, passing through unchanged.", node_name, device)
        return value
    if not cpu_ok and device == "cpu":
        log.info("%s: CPU is not a supported choice, passing through unchanged.", node_name)
        return value
    check_placement(node_name, "device", device, ctx.env.device)
    return value


@node(category=CATEGORY, outputs=("MODEL",), display_name="Select Model Device", validate=_any_device,
      description="Place the diffusion model on a specific device (default / cpu / gpu:N).")
def SelectModelDevice(ctx, model=Socket("MODEL"), device=Combo(device_options)):
    return (_select(ctx, "SelectModelDevice", model, device),)


@node(category=CATEGORY, outputs=("CLIP",), display_name="Select CLIP Device", validate=_any_device,
      description="Place the CLIP text encoder on a specific device (default / cpu / gpu:N).")
def SelectCLIPDevice(ctx, clip=Socket("CLIP"), device=Combo(device_options)):
    return (_select(ctx, "SelectCLIPDevice", clip, device),)


@node(category=CATEGORY, outputs=("VAE",), display_name="Select VAE Device", validate=_any_device,
      description="Place the VAE on a specific device (default / gpu:N).")
def SelectVAEDevice(ctx, vae=Socket("VAE"), device=Combo(_no_cpu_options)):
    return (_select(ctx, "SelectVAEDevice", vae, device, cpu_ok=False),)


@node(category=CATEGORY, outputs=("MODEL",), display_name="MultiGPU CFG Split",
      description="Prepares model to have sampling accelerated via splitting work units.\n\n"
                  "Should be placed after nodes that modify the model object itself, such as compile "
                  "or attention-switch nodes.\n\nOther than those exceptions, this node can be placed "
                  "in any order.")
def MultiGPU_WorkUnits(model=Socket("MODEL"), max_gpus=Int(2, min=1, step=1)):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus <= 1 or int(max_gpus) <= 1:
        return (model,)  # one device: ComfyUI makes no clone either
    raise NotImplementedError(
        f"MultiGPU_WorkUnits: splitting the cond/uncond batches across {min(gpus, int(max_gpus))} GPUs is "
        f"not supported yet; mixgraph runs every model of a run on the run's one device. Remove the node "
        f"or set max_gpus to 1")
