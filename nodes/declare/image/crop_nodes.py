"""ComfyUI nodes_images.py (015e604): `PrimitiveBoundingBox`, `ImageCropV2`, `ImageCropToMask`.

BOUNDING_BOX and COLOR are widget types (`graph.spec.WIDGET_TYPES`, declared with
`graph.node.Widget`): a literal `{"x", "y", "width", "height"}` / `"#rrggbb"` in the prompt, or a
link. The nodes' `validate` checks literals before anything runs; linked boxes are checked by
`crop_ops.BoundingBox.parse` when the node runs.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from mixgraph.graph.node import MAX_RESOLUTION, Float, Int, Result, Socket, Widget, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers import crop_ops, imaging


@node(category="utilities/primitive", outputs=("BOUNDING_BOX",), display_name="Bounding Box")
def PrimitiveBoundingBox(x=Int(0, min=0, max=MAX_RESOLUTION), y=Int(0, min=0, max=MAX_RESOLUTION),
                         width=Int(512, min=1, max=MAX_RESOLUTION),
                         height=Int(512, min=1, max=MAX_RESOLUTION)):
    return (crop_ops.BoundingBox(x, y, width, height).as_dict(),)


def _check_box(env, crop_region=None) -> list[tuple[str, str]]:
    if crop_region is None:   # linked: checked when the node runs
        return []
    try:
        crop_ops.BoundingBox.parse(crop_region)
    except crop_ops.CropError as e:
        return [("crop_region", str(e))]
    return []


@node(category="image/transform", outputs=("IMAGE",), display_name="Crop Image", validate=_check_box,
      register=False)
def ImageCropV2(ctx, image=Socket("IMAGE"),
                crop_region=Widget("BOUNDING_BOX", dict(crop_ops.BOX_DEFAULTS), socketless=True,
                                   component="ImageCrop")):
    """Crop an image to the specified dimensions."""
    cropped = crop_ops.crop_region(image, crop_ops.BoundingBox.parse(crop_region))
    prefix = "ComfyUI_temp_" + "".join(secrets.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    preview = imaging.save_images(cropped, Path(ctx.env.temp), prefix, kind="temp", compress_level=1,
                                  metadata=False)
    return Result((cropped,), ui={"images": preview})


# ComfyUI's flag for a node that shows its result while the prompt still runs
REGISTRY.add(replace_spec(ImageCropV2.spec, info_extra=(("has_intermediate_output", True),)))


def _check_colour(env, background=None) -> list[tuple[str, str]]:
    if background is None:   # linked: checked when the node runs
        return []
    try:
        crop_ops.parse_color(background)
    except crop_ops.CropError as e:
        return [("background", str(e))]
    return []


@node(category="image/transform", outputs=(Output("IMAGE", "images"),),
      display_name="Crop Image to Mask", validate=_check_colour)
def ImageCropToMask(images=Socket("IMAGE"), masks=Socket("MASK"),
                    width=Int(1024, min=64, max=4096, step=8, tooltip="Output width in pixels."),
                    height=Int(1024, min=64, max=4096, step=8, tooltip="Output height in pixels."),
                    pad_factor=Float(1.0, min=1.0, max=2.0, step=0.01,
                                     tooltip="Extra margin around the mask bounding box as a multiplier."),
                    grow_mask=Int(0, min=-32, max=32, step=1,
                                  tooltip="Grow or shrink the mask by this many pixels before cropping."),
                    background=Widget("COLOR", "#000000", socketless=True,
                                      tooltip="Background color behind the masked subject.")):
    """Crop an image to its mask's bounding box (centred, with pad_factor margin), composite the
    subject over the background colour and resize to width x height."""
    return (crop_ops.crop_to_mask(images, masks, width, height, pad_factor, grow_mask, background),)
