"""HyperTile, TomePatchModel and HypernetworkLoader (ComfyUI ``comfy_extras/nodes_hypertile.py``,
``nodes_tomesd.py``, ``nodes_hypernetwork.py``): attention token patches
(``models/token_patches.py``, ``adapters/hypernetwork.py``) on a new MODEL handle; the shared UNet
module is never changed."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Float, Int, Socket, node
from mixgraph.nodes.helpers.model_files import HYPERNETWORK
from mixgraph.nodes.adapters.hypernetwork import load_hypernetwork
from mixgraph.nodes.models.token_patches import HyperTile as HyperTilePatch
from mixgraph.nodes.models.token_patches import TokenMerge


@node(category="_for_testing", outputs=("MODEL",))
def HyperTile(model=Socket("MODEL"), tile_size=Int(256, min=1, max=2048), swap_size=Int(2, min=1, max=128),
              max_depth=Int(0, min=0, max=10), scale_depth=Boolean(False)):
    """Tiles the self-attention queries of the shallow UNet levels (faster at high resolution)."""
    return (model.with_unet_patch(HyperTilePatch(model.config.model_channels, int(tile_size), int(swap_size),
                                                 int(max_depth), bool(scale_depth))),)


@node(category="_for_testing", outputs=("MODEL",))
def TomePatchModel(model=Socket("MODEL"), ratio=Float(0.3, min=0.0, max=1.0, step=0.01)):
    """Token merging: averages the most similar self-attention query tokens at full resolution."""
    return (model.with_unet_patch(TokenMerge(float(ratio))),)


@node(category="loaders", outputs=("MODEL",))
def HypernetworkLoader(ctx, model=Socket("MODEL"), hypernetwork_name=HYPERNETWORK.input(),
                       strength=Float(1.0, min=-10.0, max=10.0, step=0.01)):
    """Adds an A1111 hypernetwork to every self- and cross-attention of the UNet."""
    patch = load_hypernetwork(HYPERNETWORK.path(ctx.env, hypernetwork_name), strength)
    return (model.with_unet_patch(patch),)
