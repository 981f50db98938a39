"""ComfyUI 0.38.1's auto-growing batch nodes (nodes_post_processing.py): any number of IMAGEs,
MASKs or LATENTs (up to 50) into one batch, each fitted to the first (nodes/helpers/batch_ops.py)."""

from __future__ import annotations

from mixgraph.graph.dynamic import autogrow
from mixgraph.graph.node import Socket, node
from mixgraph.nodes.helpers import batch_ops


@node(category="image/batch", outputs=("IMAGE",), display_name="Batch Images")
def BatchImagesNode(images=autogrow(Socket("IMAGE"), "image", prefix="image", min=1, max=50)):
    return (batch_ops.batch_images(list(images.values())),)


@node(category="image/mask", outputs=("MASK",), display_name="Batch Masks")
def BatchMasksNode(masks=autogrow(Socket("MASK"), "mask", prefix="mask", min=1, max=50)):
    return (batch_ops.batch_masks(list(masks.values())),)


@node(category="model/latent/batch", outputs=("LATENT",), display_name="Batch Latents")
def BatchLatentsNode(latents=autogrow(Socket("LATENT"), "latent", prefix="latent", min=1, max=50)):
    return (batch_ops.batch_latents(list(latents.values())),)
