"""ComfyUI's RebatchLatents and RebatchImages (``comfy_extras/nodes_rebatch.py``, its newest V3
form): take a list of batches (INPUT_IS_LIST) and give a list of batches of `batch_size`
(OUTPUT_IS_LIST), optionally overlapping. The rules are ``rebatch_ops``'s."""

from __future__ import annotations

import dataclasses
from typing import Any

from mixgraph.graph.node import Combo, Int, Output, Socket, node
from mixgraph.graph.spec import Input
from mixgraph.nodes.helpers.rebatch_ops import DIMENSIONS, MERGE_MODES, rebatch_images, rebatch_latents

__all__ = ["RebatchLatents", "RebatchImages", "rebatch_latents", "rebatch_images"]


def _advanced(inp: Input) -> Input:
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


def _batch_size(tip: str) -> Input:
    return Int(1, min=1, max=4096, tooltip=tip)


def _overlap(tip: str) -> Input:
    return _advanced(Int(0, min=0, max=4096, tooltip=tip, optional=True))


def _mode(tip: str) -> Input:
    return Combo(MERGE_MODES, default="truncate start", advanced=True, tooltip=tip, optional=True)


def _check(env: Any, **literals: Any) -> list[tuple[str, str]]:
    """overlap < batch_size, when both are literals (a linked one is checked when the node runs)."""
    size, overlap = literals.get("batch_size"), literals.get("overlap")
    if isinstance(size, int) and isinstance(overlap, int) and overlap >= size:
        return [("overlap", f"{overlap} must be smaller than batch_size ({size})")]
    return []


@node(category="model/latent/batch", display_name="Rebatch Latents", input_is_list=True,
      outputs=[Output("LATENT", "LATENT", is_list=True)], validate=_check)
def RebatchLatents(latents=Socket("LATENT"),
                   batch_size=_batch_size("Output size along the selected dimension."),
                   dimension=Combo(DIMENSIONS, default="b", optional=True,
                                   tooltip="Rebatch batch items, video latent time, or audio latent time."),
                   overlap=_overlap("Samples duplicated between output splits and reconciled between "
                                    "input batches."),
                   merge_overlap_mode=_mode("How overlapping samples from consecutive input batches "
                                            "are merged.")):
    return (rebatch_latents(list(latents), int(batch_size[0]), dimension[0], int(overlap[0]),
                            merge_overlap_mode[0]),)


@node(category="image/batch", display_name="Rebatch Images", input_is_list=True,
      outputs=[Output("IMAGE", "IMAGE", is_list=True)], validate=_check)
def RebatchImages(images=Socket("IMAGE"),
                  batch_size=_batch_size("Number of images or frames in each output batch."),
                  overlap=_overlap("Frames duplicated between output splits and reconciled between "
                                   "input batches."),
                  merge_overlap_mode=_mode("How overlapping frames from consecutive input batches "
                                           "are merged.")):
    return (rebatch_images(list(images), int(batch_size[0]), int(overlap[0]), merge_overlap_mode[0]),)
