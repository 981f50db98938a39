"""ComfyUI ``comfy_extras/nodes_bg_removal.py`` (read at Comfy-Org/ComfyUI 2e40f31f):
`LoadBackgroundRemovalModel` (a BiRefNet file from ``models/background_removal``) and
`RemoveBackground` (IMAGE -> foreground MASK). Runtime: ``image_models/birefnet.py``."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.node import Int, Socket, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers.model_files import BACKGROUND_REMOVAL
from mixgraph.nodes.image_models.birefnet import load_background_removal_model

RESOLUTION_TIP = ("Square size the image is resized to before inference. Use the size the model was trained "
                  "at, e.g. 1024 for BiRefNet and 2048 for BiRefNet_HR.")


# No docstrings on the node functions: they would become object_info descriptions, and ComfyUI's
# loader has none.
@node(category="model/loaders", outputs=(Output("BACKGROUND_REMOVAL", "bg_model"),),
      display_name="Load Background Removal Model")
def LoadBackgroundRemovalModel(ctx, bg_removal_name=BACKGROUND_REMOVAL.input(tooltip=(
        "The model used to remove backgrounds from images"))):
    # ComfyUI detects the file by its Swin key and fails with its own message otherwise
    return (load_background_removal_model(BACKGROUND_REMOVAL.path(ctx.env, bg_removal_name)),)


def _resolution():
    inp = Int(1024, min=256, max=4096, step=32, optional=True, tooltip=RESOLUTION_TIP)
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


@node(category="image/background removal", outputs=(Output("MASK", "mask"),), display_name="Remove Background",
      description="Generates a foreground mask to remove the background from an image using a background "
                  "removal model.", register=False)
def RemoveBackground(bg_removal_model=Socket("BACKGROUND_REMOVAL", tooltip=(
        "Background removal model used to generate the mask")),
        image=Socket("IMAGE", tooltip="Input image to remove the background from"),
        resolution=_resolution()):
    return (bg_removal_model.encode_image(image, image_size=resolution),)


RemoveBackground.spec = REGISTRY.add(replace_spec(RemoveBackground.spec, info_extra=(
    ("output_tooltips", ["Generated foreground mask"]),)))
