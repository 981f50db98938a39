"""ComfyUI's SD_4XUpscale_Conditioning (``comfy_extras/nodes_sdupscale.py``): the image Stability's
SD 2.x x4 upscaler enlarges travels on both conds (``Cond.concat_image``, with its noise
augmentation); the latent to sample is empty at a quarter of the output size
(``families/sd/x4_upscaler.py``)."""

from __future__ import annotations

from mixgraph.graph.node import Float, Socket, node
from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.families.sd.x4_upscaler import conditioning_inputs
from mixgraph.nodes.payloads.latent import Latent


@node(category="conditioning/upscale_diffusion", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def SD_4XUpscale_Conditioning(images=Socket("IMAGE"), positive=Socket("CONDITIONING"),
                              negative=Socket("CONDITIONING"),
                              scale_ratio=Float(4.0, min=0.0, max=10.0, step=0.01),
                              noise_augmentation=Float(0.0, min=0.0, max=1.0, step=0.001)):
    """Both conds carry `images` (resized to the latent) for the x4 upscaler; the latent is
    empty at (image size × scale_ratio) / 4."""
    pixels, latent = conditioning_inputs(images, scale_ratio)
    return (cond_ops.set_concat_image(positive, pixels, noise_augmentation),
            cond_ops.set_concat_image(negative, pixels, noise_augmentation),
            Latent(latent))
