"""What the persistent output cache may keep (graph.persist; DESIGN §5, last bullet).

The edge payloads that travel between nodes are declared storable by their socket type, with the
dataclasses their values are made of (registered under stable names, so a blob outlives a module
move): CONDITIONING (`Cond`, `SizeCond`), LATENT (`Latent`), IMAGE and MASK (plain tensors).
INT, FLOAT, STRING and BOOLEAN may ride along with one of them in a node's outputs. MODEL, CLIP,
VAE and the other model handles are never declared: their weights are files already, and a
`Cond` holding a ControlNet chain is refused by the codec (the chain is not a registered class),
so a CONDITIONING with a ControlNet attached is recomputed, not stored.
"""

from __future__ import annotations

from mixgraph.graph.codec import CODEC, TreeCodec
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond
from mixgraph.nodes.payloads.latent import Latent

__all__ = ["declare", "PAYLOAD_TYPES", "PLAIN_TYPES"]

PAYLOAD_TYPES = ("CONDITIONING", "LATENT", "IMAGE", "MASK")
PLAIN_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")


def declare(codec: TreeCodec = CODEC) -> None:
    codec.register(Latent, name="mixgraph.Latent")
    codec.register(Cond, name="mixgraph.Cond")
    codec.register(SizeCond, name="mixgraph.SizeCond")
    for t in PAYLOAD_TYPES:
        codec.declare(t)
    for t in PLAIN_TYPES:
        codec.declare(t, payload=False)


declare()
