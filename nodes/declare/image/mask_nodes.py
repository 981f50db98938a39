"""ComfyUI's mask nodes (comfy_extras/nodes_mask.py): conversions, shapes, composites, grow."""

from __future__ import annotations

import secrets
from pathlib import Path

from mixgraph.graph.node import MAX_RESOLUTION, Boolean, Combo, Float, Int, Result, Socket, node
from mixgraph.graph.spec import Hidden
from mixgraph.nodes.helpers import image_ops, imaging, latent_ops, mask_ops


@node(category="latent", outputs=("LATENT",))
def LatentCompositeMasked(destination=Socket("LATENT"), source=Socket("LATENT"),
                          x=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                          y=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                          resize_source=Boolean(False), mask=Socket("MASK", optional=True)):
    return (latent_ops.composite_masked(destination, source, x, y, resize_source, mask),)


@node(category="image", outputs=("IMAGE",))
def ImageCompositeMasked(destination=Socket("IMAGE"), source=Socket("IMAGE"),
                         x=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                         y=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                         resize_source=Boolean(False), mask=Socket("MASK", optional=True)):
    return (image_ops.composite_masked(destination, source, x, y, resize_source, mask),)


@node(category="mask", outputs=("IMAGE",), display_name="Convert Mask to Image")
def MaskToImage(mask=Socket("MASK")):
    return (mask_ops.mask_to_image(mask),)


@node(category="mask", outputs=("MASK",), display_name="Convert Image to Mask")
def ImageToMask(image=Socket("IMAGE"), channel=Combo(mask_ops.CHANNELS)):
    return (mask_ops.image_to_mask(image, channel),)


@node(category="mask", outputs=("MASK",))
def ImageColorToMask(image=Socket("IMAGE"), color=Int(0, min=0, max=0xFFFFFF, step=1)):
    return (mask_ops.color_to_mask(image, color),)


@node(category="mask", outputs=("MASK",))
def SolidMask(value=Float(1.0, min=0.0, max=1.0, step=0.01),
              width=Int(512, min=1, max=MAX_RESOLUTION, step=1),
              height=Int(512, min=1, max=MAX_RESOLUTION, step=1)):
    return (mask_ops.solid(value, width, height),)


@node(category="mask", outputs=("MASK",))
def InvertMask(mask=Socket("MASK")):
    return (mask_ops.invert(mask),)


@node(category="mask", outputs=("MASK",))
def CropMask(mask=Socket("MASK"), x=Int(0, min=0, max=MAX_RESOLUTION, step=1),
             y=Int(0, min=0, max=MAX_RESOLUTION, step=1),
             width=Int(512, min=1, max=MAX_RESOLUTION, step=1),
             height=Int(512, min=1, max=MAX_RESOLUTION, step=1)):
    return (mask_ops.crop(mask, x, y, width, height),)


@node(category="mask", outputs=("MASK",))
def MaskComposite(destination=Socket("MASK"), source=Socket("MASK"),
                  x=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                  y=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                  operation=Combo(mask_ops.OPERATIONS)):
    return (mask_ops.composite(destination, source, x, y, operation),)


@node(category="mask", outputs=("MASK",))
def FeatherMask(mask=Socket("MASK"), left=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                top=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                right=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                bottom=Int(0, min=0, max=MAX_RESOLUTION, step=1)):
    return (mask_ops.feather(mask, left, top, right, bottom),)


@node(category="mask", outputs=("MASK",), display_name="Grow Mask")
def GrowMask(mask=Socket("MASK"), expand=Int(0, min=-MAX_RESOLUTION, max=MAX_RESOLUTION, step=1),
             tapered_corners=Boolean(True)):
    return (mask_ops.grow(mask, expand, tapered_corners),)


@node(category="mask", outputs=("MASK",))
def ThresholdMask(mask=Socket("MASK"), value=Float(0.5, min=0.0, max=1.0, step=0.01)):
    return (mask_ops.threshold(mask, value),)


@node(category="mask", outputs=(("MASK", "mask"),), output_node=True, display_name="Preview Mask",
      deterministic=False)
def MaskPreview(ctx, mask=Socket("MASK"), prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Shows the mask as a grey image in the temp folder, like PreviewImage; passes the mask on."""
    prefix = "ComfyUI_temp_" + "".join(secrets.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    saved = imaging.save_images(mask_ops.mask_to_image(mask), Path(ctx.env.temp), prefix, kind="temp", prompt=prompt,
                                extra_pnginfo=extra_pnginfo, compress_level=1)
    return Result(values=(mask,), ui={"images": saved})
