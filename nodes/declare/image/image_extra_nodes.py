"""ComfyUI's model-free image nodes: nodes.py (invert, batch, pad, empty), comfy_extras
nodes_images.py (crop, batch picking) and nodes_post_processing.py (blend, blur, sharpen,
quantize, scale to total pixels)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers import image_ops
from mixgraph.nodes.declare.image.image_nodes import IMAGE_UPSCALE_METHODS


@node(category="image", outputs=("IMAGE",), display_name="Invert Image")
def ImageInvert(image=Socket("IMAGE")):
    return (image_ops.invert(image),)


@node(category="image", outputs=("IMAGE",), display_name="Batch Images")
def ImageBatch(image1=Socket("IMAGE"), image2=Socket("IMAGE")):
    return (image_ops.batch(image1, image2),)


@node(category="image", outputs=("IMAGE",))
def EmptyImage(width=Int(512, min=1, max=MAX_RESOLUTION, step=1),
               height=Int(512, min=1, max=MAX_RESOLUTION, step=1),
               batch_size=Int(1, min=1, max=4096),
               color=Int(0, min=0, max=0xFFFFFF, step=1)):
    return (image_ops.empty(width, height, batch_size, color),)


@node(category="image", outputs=("IMAGE", "MASK"), display_name="Pad Image for Outpainting")
def ImagePadForOutpaint(image=Socket("IMAGE"), left=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        top=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        right=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        bottom=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        feathering=Int(40, min=0, max=MAX_RESOLUTION, step=1)):
    return image_ops.pad_for_outpaint(image, left, top, right, bottom, feathering)


@node(category="image/upscaling", outputs=("IMAGE",), display_name="Scale Image to Total Pixels")
def ImageScaleToTotalPixels(image=Socket("IMAGE"), upscale_method=Combo(IMAGE_UPSCALE_METHODS),
                            megapixels=Float(1.0, min=0.01, max=16.0, step=0.01)):
    return (image_ops.scale_to_total_pixels(image, upscale_method, megapixels),)


@node(category="image/transform", outputs=("IMAGE",), display_name="Image Crop")
def ImageCrop(image=Socket("IMAGE"), width=Int(512, min=1, max=MAX_RESOLUTION, step=1),
              height=Int(512, min=1, max=MAX_RESOLUTION, step=1),
              x=Int(0, min=0, max=MAX_RESOLUTION, step=1),
              y=Int(0, min=0, max=MAX_RESOLUTION, step=1)):
    return (image_ops.crop(image, width, height, x, y),)


@node(category="image/batch", outputs=("IMAGE",))
def RepeatImageBatch(image=Socket("IMAGE"), amount=Int(1, min=1, max=4096)):
    return (image_ops.repeat_batch(image, amount),)


@node(category="image/batch", outputs=("IMAGE",))
def ImageFromBatch(image=Socket("IMAGE"), batch_index=Int(0, min=-MAX_RESOLUTION, max=MAX_RESOLUTION),
                   length=Int(1, min=1, max=4096)):
    return (image_ops.from_batch(image, batch_index, length),)


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="Image Blend")
def ImageBlend(image1=Socket("IMAGE"), image2=Socket("IMAGE"),
               blend_factor=Float(0.5, min=0.0, max=1.0, step=0.01),
               blend_mode=Combo(image_ops.BLEND_MODES)):
    return (image_ops.blend(image1, image2, blend_factor, blend_mode),)


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="Image Blur")
def ImageBlur(image=Socket("IMAGE"), blur_radius=Int(1, min=1, max=31, step=1),
              sigma=Float(1.0, min=0.1, max=10.0, step=0.1)):
    return (image_ops.blur(image, blur_radius, sigma),)


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="Image Sharpen")
def ImageSharpen(image=Socket("IMAGE"), sharpen_radius=Int(1, min=1, max=31, step=1),
                 sigma=Float(1.0, min=0.1, max=10.0, step=0.01),
                 alpha=Float(1.0, min=0.0, max=5.0, step=0.01)):
    return (image_ops.sharpen(image, sharpen_radius, sigma, alpha),)


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="Image Quantize")
def ImageQuantize(image=Socket("IMAGE"), colors=Int(256, min=1, max=256, step=1),
                  dither=Combo(image_ops.DITHERS)):
    return (image_ops.quantize(image, colors, dither),)


@node(category="image/transform", outputs=("IMAGE",))
def ImageFlip(image=Socket("IMAGE"), flip_method=Combo(image_ops.FLIP_METHODS)):
    return (image_ops.flip(image, flip_method),)


@node(category="image/transform", outputs=("IMAGE",))
def ImageRotate(image=Socket("IMAGE"), rotation=Combo(image_ops.ROTATIONS)):
    return (image_ops.rotate(image, rotation),)


@node(category="image", outputs=(("INT", "width"), ("INT", "height"), ("INT", "batch_size")))
def GetImageSize(image=Socket("IMAGE")):
    return image_ops.size(image)


@node(category="mask/compositing", outputs=("IMAGE", "MASK"), display_name="Split Image with Alpha")
def SplitImageWithAlpha(image=Socket("IMAGE")):
    return image_ops.split_alpha(image)


@node(category="mask/compositing", outputs=("IMAGE",), display_name="Join Image with Alpha")
def JoinImageWithAlpha(image=Socket("IMAGE"), alpha=Socket("MASK")):
    return (image_ops.join_alpha(image, alpha),)


@node(category="image/upscaling", outputs=("IMAGE",), display_name="Scale Image to Max Dimension")
def ImageScaleToMaxDimension(image=Socket("IMAGE"), upscale_method=Combo(image_ops.MAX_DIMENSION_METHODS),
                             largest_size=Int(512, min=0, max=MAX_RESOLUTION, step=1)):
    return (image_ops.scale_to_max_dimension(image, upscale_method, largest_size),)
