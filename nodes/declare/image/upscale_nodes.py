"""UpscaleModelLoader and ImageUpscaleWithModel (ComfyUI ``comfy_extras/nodes_upscale_model.py``):
ESRGAN-family upscalers from ``models/upscale_models``, run tiled at the UPSCALE_MODEL precision."""

from __future__ import annotations

from mixgraph.graph.node import Socket, node
from mixgraph.nodes.helpers.model_files import UPSCALE_MODEL
from mixgraph.nodes.image_models.upscale import load_upscale_model, upscale_image
from mixgraph.nodes.helpers.precision import effective


@node(category="loaders", outputs=("UPSCALE_MODEL",), display_name="Load Upscale Model")
def UpscaleModelLoader(ctx, model_name=UPSCALE_MODEL.input()):
    """Loads an ESRGAN / Real-ESRGAN (RRDBNet) upscaler; its scale comes from the file."""
    return (load_upscale_model(UPSCALE_MODEL.path(ctx.env, model_name)),)


@node(category="image/upscaling", outputs=("IMAGE",), display_name="Upscale Image (using Model)")
def ImageUpscaleWithModel(ctx, upscale_model=Socket("UPSCALE_MODEL"), image=Socket("IMAGE")):
    """Upscales the image with the model, in 512 px tiles overlapping by 32 (halved on OOM)."""
    runner = upscale_model.runner(effective(ctx, upscale_model, "UPSCALE_MODEL"))
    return (upscale_image(runner, upscale_model.config, image),)
