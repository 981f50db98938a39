"""ComfyUI's kornia-based image filters (comfy_extras nodes_morphology.py: Morphology and the
YCbCr split/join; nodes_canny.py), the
Porter-Duff composite (nodes_compositing.py) and nodes_images.py's ImageAddNoise, ImageStitch,
ResizeAndPadImage, SaveAnimatedWEBP and SaveAnimatedPNG, on ``image_filters.py`` /
``image_animation.py``."""

from __future__ import annotations

from pathlib import Path

from mixgraph.graph.node import MAX_RESOLUTION, Boolean, Combo, Float, Int, Result, Socket, String, node
from mixgraph.graph.spec import Hidden, Output
from mixgraph.nodes.helpers import image_animation, image_filters


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="ImageMorphology")
def Morphology(image=Socket("IMAGE"), operation=Combo(image_filters.MORPHOLOGY_OPERATIONS),
               kernel_size=Int(3, min=3, max=999, step=1)):
    return (image_filters.morphology(image, operation, kernel_size),)


@node(category="image/batch", outputs=(("IMAGE", "Y"), ("IMAGE", "U"), ("IMAGE", "V")))
def ImageRGBToYUV(image=Socket("IMAGE")):
    return image_filters.rgb_to_ycbcr(image)


@node(category="image/batch", outputs=("IMAGE",))
def ImageYUVToRGB(Y=Socket("IMAGE"), U=Socket("IMAGE"), V=Socket("IMAGE")):
    return (image_filters.ycbcr_to_rgb(Y, U, V),)


@node(category="image/preprocessors", outputs=("IMAGE",))
def Canny(image=Socket("IMAGE"), low_threshold=Float(0.4, min=0.01, max=0.99, step=0.01),
          high_threshold=Float(0.8, min=0.01, max=0.99, step=0.01)):
    _, edges = image_filters.canny(image, low_threshold, high_threshold)  # [B, 1, H, W]
    return (edges.repeat(1, 3, 1, 1).movedim(1, -1),)


@node(category="image", outputs=("IMAGE",))
def ImageAddNoise(image=Socket("IMAGE"),
                  seed=Int(0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                           tooltip="The random seed used for creating the noise."),
                  strength=Float(0.5, min=0.0, max=1.0, step=0.01)):
    return (image_filters.add_noise(image, seed, strength),)


@node(category="mask/compositing", outputs=("IMAGE", "MASK"), display_name="Porter-Duff Image Composite")
def PorterDuffImageComposite(source=Socket("IMAGE"), source_alpha=Socket("MASK"), destination=Socket("IMAGE"),
                             destination_alpha=Socket("MASK"),
                             mode=Combo(image_filters.PORTER_DUFF_MODES, default="DST")):
    return image_filters.porter_duff_batch(source, source_alpha, destination, destination_alpha, mode)


@node(category="image/transform", outputs=("IMAGE",), display_name="Image Stitch",
      description="Stitches image2 to image1 in the specified direction.\nIf image2 is not provided, returns image1 "
                  "unchanged.\nOptional spacing can be added between images.")
def ImageStitch(image1=Socket("IMAGE"), direction=Combo(image_filters.STITCH_DIRECTIONS, default="right"),
                match_image_size=Boolean(True), spacing_width=Int(0, min=0, max=1024, step=2),
                spacing_color=Combo(tuple(image_filters.STITCH_COLORS), default="white"),
                image2=Socket("IMAGE", optional=True)):
    return (image_filters.stitch(image1, direction, match_image_size, spacing_width, spacing_color, image2),)


@node(category="image/transform", outputs=("IMAGE",))
def ResizeAndPadImage(image=Socket("IMAGE"), target_width=Int(512, min=1, max=MAX_RESOLUTION, step=1),
                      target_height=Int(512, min=1, max=MAX_RESOLUTION, step=1),
                      padding_color=Combo(("white", "black")),
                      interpolation=Combo(image_filters.RESIZE_PAD_INTERPOLATIONS)):
    return (image_filters.resize_and_pad(image, target_width, target_height, padding_color, interpolation),)


@node(category="image/animation", outputs=(Output("IMAGE", "images"),), output_node=True)
def SaveAnimatedWEBP(ctx, images=Socket("IMAGE"), filename_prefix=String("ComfyUI"),
                     fps=Float(6.0, min=0.01, max=1000.0, step=0.01), lossless=Boolean(True),
                     quality=Int(80, min=0, max=100), method=Combo(tuple(image_animation.WEBP_METHODS)),
                     prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    saved = image_animation.save_animated_webp(images, Path(ctx.env.output), filename_prefix, fps, lossless,
                                               quality, method, prompt=prompt, extra_pnginfo=extra_pnginfo)
    return Result((images,), ui={"images": saved, "animated": (len(images) != 1,)})


@node(category="image/animation", outputs=(Output("IMAGE", "images"),), output_node=True)
def SaveAnimatedPNG(ctx, images=Socket("IMAGE"), filename_prefix=String("ComfyUI"),
                    fps=Float(6.0, min=0.01, max=1000.0, step=0.01), compress_level=Int(4, min=0, max=9),
                    prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    saved = image_animation.save_animated_png(images, Path(ctx.env.output), filename_prefix, fps, compress_level,
                                              prompt=prompt, extra_pnginfo=extra_pnginfo)
    return Result((images,), ui={"images": saved, "animated": (True,)})
