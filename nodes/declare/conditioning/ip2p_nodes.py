"""ComfyUI's InstructPixToPixConditioning (``comfy_extras/nodes_ip2p.py``): the image an
instruct-pix2pix model edits goes to its 4 extra input channels (the SD runner's
``concat``, ``models/concat_cond.ip2p_concat``)."""

from __future__ import annotations

import torch

from mixgraph.graph.node import Socket, node
from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.helpers.precision import effective


def crop_to_multiple_of_8(pixels: torch.Tensor) -> torch.Tensor:
    """[B,H,W,C] cropped to multiples of 8 in H and W, the remainder split around the centre
    (the smaller half before)."""
    h, w = (pixels.shape[1] // 8) * 8, (pixels.shape[2] // 8) * 8
    if (h, w) == tuple(pixels.shape[1:3]):
        return pixels
    y, x = (pixels.shape[1] % 8) // 2, (pixels.shape[2] % 8) // 2
    return pixels[:, y:y + h, x:x + w, :]


@node(category="conditioning/instructpix2pix", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def InstructPixToPixConditioning(ctx, positive=Socket("CONDITIONING"),
                                 negative=Socket("CONDITIONING"), vae=Socket("VAE"),
                                 pixels=Socket("IMAGE")):
    """Encodes `pixels` as the image both conds carry for an 8-channel instruct-pix2pix model;
    the latent to sample is zeros of the same shape."""
    if pixels.shape[1] < 8 or pixels.shape[2] < 8:
        raise ValueError(f"input 'pixels': the image is {pixels.shape[2]}x{pixels.shape[1]}; "
                         f"InstructPixToPixConditioning needs at least 8x8 pixels")
    policy = effective(ctx, vae, "VAE")
    concat_latent = vae.encode(crop_to_multiple_of_8(pixels)[..., :3], policy)
    return (cond_ops.set_concat(positive, concat_latent, None),
            cond_ops.set_concat(negative, concat_latent, None),
            Latent(torch.zeros_like(concat_latent)))
