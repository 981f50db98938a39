"""Latent and VAE nodes."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers import latent_ops
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.helpers.precision import effective

LATENT_UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "bislerp")
CROP = ("disabled", "center")


@node(category="latent", outputs=("LATENT",), display_name="Empty Latent Image")
def EmptyLatentImage(width=Int(512, min=16, max=MAX_RESOLUTION, step=8),
                     height=Int(512, min=16, max=MAX_RESOLUTION, step=8),
                     batch_size=Int(1, min=1, max=4096)):
    return (latent_ops.empty_latent(width, height, batch_size),)


@node(category="latent", outputs=("LATENT",), display_name="Upscale Latent")
def LatentUpscale(samples=Socket("LATENT"), upscale_method=Combo(LATENT_UPSCALE_METHODS),
                  width=Int(512, min=0, max=MAX_RESOLUTION, step=8),
                  height=Int(512, min=0, max=MAX_RESOLUTION, step=8), crop=Combo(CROP)):
    return (latent_ops.upscale_latent(samples, upscale_method, width, height, crop),)


@node(category="latent", outputs=("LATENT",), display_name="Upscale Latent By")
def LatentUpscaleBy(samples=Socket("LATENT"), upscale_method=Combo(LATENT_UPSCALE_METHODS),
                    scale_by=Float(1.5, min=0.01, max=8.0, step=0.01)):
    return (latent_ops.upscale_latent_by(samples, upscale_method, scale_by),)


@node(category="latent", outputs=("IMAGE",), display_name="VAE Decode")
def VAEDecode(ctx, samples=Socket("LATENT"), vae=Socket("VAE")):
    return (vae.decode(samples.samples, effective(ctx, vae, "VAE")),)


@node(category="_for_testing", outputs=("IMAGE",), display_name="VAE Decode (Tiled)")
def VAEDecodeTiled(ctx, samples=Socket("LATENT"), vae=Socket("VAE"),
                   tile_size=Int(512, min=64, max=4096, step=32),
                   overlap=Int(64, min=0, max=4096, step=32),
                   temporal_size=Int(64, min=8, max=4096, step=4),
                   temporal_overlap=Int(8, min=4, max=4096, step=4)):
    """Decodes in overlapping tiles (pixel units) to bound memory; temporal inputs (pixel frames)
    are for video VAEs and unused by image VAEs."""
    return (vae.decode_tiled(samples.samples, effective(ctx, vae, "VAE"), tile_size, overlap,
                             temporal_size=temporal_size, temporal_overlap=temporal_overlap),)


@node(category="latent", outputs=("LATENT",), display_name="VAE Encode")
def VAEEncode(ctx, pixels=Socket("IMAGE"), vae=Socket("VAE")):
    pixels = latent_ops.crop_to_multiple(pixels[..., :3])
    return (Latent(vae.encode(pixels, effective(ctx, vae, "VAE"))),)


@node(category="latent/inpaint", outputs=("LATENT",), display_name="VAE Encode (for Inpainting)")
def VAEEncodeForInpaint(ctx, pixels=Socket("IMAGE"), vae=Socket("VAE"), mask=Socket("MASK"),
                        grow_mask_by=Int(6, min=0, max=64, step=1)):
    """Greys out the masked pixels, encodes, and sets the (dilated) noise mask on the latent."""
    grey, noise_mask = latent_ops.prepare_inpaint(pixels[..., :3], mask, grow_mask_by)
    return (Latent(vae.encode(grey, effective(ctx, vae, "VAE")), noise_mask=noise_mask),)
