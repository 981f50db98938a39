"""ComfyUI's kornia-based image filters (comfy_extras nodes_morphology.py, nodes_canny.py) and
ImageAddNoise (nodes_images.py), on the torch functions of ``image_filters.py``."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Float, Int, Socket, node
from mixgraph.nodes import image_filters


@node(category="image/postprocessing", outputs=("IMAGE",), display_name="ImageMorphology")
def Morphology(image=Socket("IMAGE"), operation=Combo(image_filters.MORPHOLOGY_OPERATIONS),
               kernel_size=Int(3, min=3, max=999, step=1)):
    return (image_filters.morphology(image, operation, kernel_size),)


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
