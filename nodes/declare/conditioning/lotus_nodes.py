"""ComfyUI ``comfy_extras/nodes_lotus.py``: `LotusConditioning`, the constant conditioning of a
Lotus depth/normal UNet (``families/sd/lotus.py``; the UNet itself loads through UNETLoader)."""

from __future__ import annotations

from mixgraph.graph.node import node
from mixgraph.graph.spec import Output
from mixgraph.nodes.families.sd import lotus


@node(category="conditioning/lotus", outputs=(Output("CONDITIONING", "conditioning"),))
def LotusConditioning():
    """Lotus' null-prompt conditioning: the output of its frozen SD2 text encoder for the empty
    prompt, [1, 2, 1024], shipped as data (the numbers ComfyUI inlines in this node)."""
    return (lotus.lotus_conditioning(),)
