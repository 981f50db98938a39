"""comfy_extras/nodes_seamless_tiling.py: ModelPatchSeamlessTiling and VAEDecodeSeamlessTiling
(``models/seamless.py``: shifted-and-blended UNet calls; periodic-context decoding)."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Int, Socket, node
from mixgraph.nodes.models import seamless
from mixgraph.nodes.helpers.precision import effective


@node(category="model/patch", outputs=("MODEL",), display_name="Seamless Tiling")
def ModelPatchSeamlessTiling(model=Socket("MODEL"), tiling=Combo(seamless.TILING_MODES, "x and y"),
                             context_size=Int(8, min=1, max=256, step=1,
                                              tooltip="Width of the seam blend on each enabled side, in latent pixels.")):
    """Blends cyclically shifted denoiser predictions for seamless image tiling. Runs the model
    twice per step for one axis or four times for both axes."""
    return (model.with_unet_patch(seamless.SeamlessTiling(*seamless.padding(tiling, context_size))),)


@node(category="model/latent", outputs=("IMAGE",), display_name="Seamless Tiling VAE Decode")
def VAEDecodeSeamlessTiling(ctx, samples=Socket("LATENT"), vae=Socket("VAE"),
                            tiling=Combo(seamless.TILING_MODES, "x and y"),
                            context_size=Int(8, min=1, max=256, step=1,
                                             tooltip="Periodic context on each enabled side, in latent pixels. "
                                                     "Larger values use more VRAM.")):
    """Decodes an image latent with periodic context and crops the result back to its original size."""
    policy = effective(ctx, vae, "VAE")
    return (seamless.decode_periodic(lambda lat: vae.decode(lat, policy), samples.samples, tiling, context_size),)
