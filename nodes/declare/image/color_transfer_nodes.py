"""ComfyUI 0.38.1's `ColorTransfer` (nodes_post_processing.py): its `source_stats` is a
DynamicCombo (graph/dynamic.py) whose `target_frame` option brings `target_index`. The maths is in
nodes/helpers/color_transfer.py."""

from __future__ import annotations

from mixgraph.graph.dynamic import Option, dynamic_combo
from mixgraph.graph.node import Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers import color_transfer

SOURCE_STATS = dynamic_combo([
    Option("per_frame"),
    Option("uniform"),
    Option("target_frame", (("target_index", Int(0, min=0, max=10000, tooltip=(
        "The frame whose statistics are the source side of the one transform for all frames."))),)),
], tooltip=("per_frame: each frame matched to image_ref on its own. uniform: the statistics of all "
            "frames pooled, one transform. target_frame: one chosen frame's statistics, one "
            "transform for every frame (keeps the differences between frames)."))


@node(category="image/postprocessing", outputs=(("IMAGE", "image"),),
      description="Match the colors of one image to another using various algorithms.")
def ColorTransfer(image_target=Socket("IMAGE", tooltip="Image(s) to apply the color transform to."),
                  image_ref=Socket("IMAGE", optional=True, tooltip=(
                      "Reference image(s) to match colors to; without one the target passes unchanged.")),
                  method=Combo(color_transfer.METHODS), source_stats=SOURCE_STATS,
                  strength=Float(1.0, min=0.0, max=10.0, step=0.01)):
    return (color_transfer.color_transfer(image_target, image_ref, method,
                                          source_stats["source_stats"],
                                          source_stats.get("target_index", 0), strength),)
