"""ComfyUI's further conditioning nodes: averaging, concatenation, percentage areas, masks,
timestep ranges and inpaint-model conditioning (``nodes.py``), and the SDXL text encoders
(``comfy_extras/nodes_clip_sdxl.py``)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Boolean, Combo, Float, Int, Socket, String, node
from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.helpers.embeddings import embeddings_fingerprint
from mixgraph.nodes.helpers.embeddings import embedding_lookup
from mixgraph.nodes.payloads.conditioning import SizeCond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.helpers.precision import effective, encoder_policies

_STRENGTH = dict(min=0.0, max=10.0, step=0.01)


@node(category="conditioning", outputs=("CONDITIONING",))
def ConditioningAverage(conditioning_to=Socket("CONDITIONING"), conditioning_from=Socket("CONDITIONING"),
                        conditioning_to_strength=Float(1.0, min=0.0, max=1.0, step=0.01)):
    return (cond_ops.average(conditioning_to, conditioning_from, conditioning_to_strength),)


@node(category="conditioning", outputs=("CONDITIONING",), display_name="Conditioning (Concat)")
def ConditioningConcat(conditioning_to=Socket("CONDITIONING"), conditioning_from=Socket("CONDITIONING")):
    return (cond_ops.concat(conditioning_to, conditioning_from),)


@node(category="conditioning", outputs=("CONDITIONING",),
      display_name="Conditioning (Set Area with Percentage)")
def ConditioningSetAreaPercentage(conditioning=Socket("CONDITIONING"),
                                  width=Float(1.0, min=0, max=1.0, step=0.01),
                                  height=Float(1.0, min=0, max=1.0, step=0.01),
                                  x=Float(0, min=0, max=1.0, step=0.01),
                                  y=Float(0, min=0, max=1.0, step=0.01),
                                  strength=Float(1.0, **_STRENGTH)):
    return (cond_ops.set_area_percentage(conditioning, width, height, x, y, strength),)


@node(category="conditioning", outputs=("CONDITIONING",))
def ConditioningSetAreaStrength(conditioning=Socket("CONDITIONING"), strength=Float(1.0, **_STRENGTH)):
    return (cond_ops.set_strength(conditioning, strength),)


@node(category="conditioning", outputs=("CONDITIONING",), display_name="Conditioning (Set Mask)")
def ConditioningSetMask(conditioning=Socket("CONDITIONING"), mask=Socket("MASK"),
                        strength=Float(1.0, **_STRENGTH),
                        set_cond_area=Combo(["default", "mask bounds"])):
    return (cond_ops.set_mask(conditioning, mask, strength, set_cond_area),)


@node(category="advanced/conditioning", outputs=("CONDITIONING",))
def ConditioningSetTimestepRange(conditioning=Socket("CONDITIONING"),
                                 start=Float(0.0, min=0.0, max=1.0, step=0.001),
                                 end=Float(1.0, min=0.0, max=1.0, step=0.001)):
    return (cond_ops.set_timestep_range(conditioning, start, end),)


@node(category="conditioning/inpaint", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def InpaintModelConditioning(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                             vae=Socket("VAE"), pixels=Socket("IMAGE"), mask=Socket("MASK"),
                             noise_mask=Boolean(True, tooltip=(
                                 "Add a noise mask to the latent so sampling will only happen within "
                                 "the mask. Might improve results or completely break things "
                                 "depending on the model."))):
    """The masked image (grey where masked) and the mask go to an inpaint model's extra input
    channels; the latent is the whole image, with the mask as noise mask if asked."""
    policy = effective(ctx, vae, "VAE")
    grey, m = cond_ops.inpaint_pixels(pixels, mask)
    concat_latent = vae.encode(grey[..., :3], policy)
    latent = Latent(vae.encode(pixels[..., :3], policy), noise_mask=m if noise_mask else None)
    return (cond_ops.set_concat(positive, concat_latent, m),
            cond_ops.set_concat(negative, concat_latent, m), latent)


def _sdxl_fingerprint(env, text_g="", text_l="", **_):
    return embeddings_fingerprint(env, text=f"{text_g or ''} {text_l or ''}")


_SIZE = dict(min=0, max=MAX_RESOLUTION)


@node(category="advanced/conditioning", outputs=("CONDITIONING",), fingerprint=_sdxl_fingerprint)
def CLIPTextEncodeSDXL(ctx, clip=Socket("CLIP"), width=Int(1024, **_SIZE), height=Int(1024, **_SIZE),
                       crop_w=Int(0, **_SIZE), crop_h=Int(0, **_SIZE),
                       target_width=Int(1024, **_SIZE), target_height=Int(1024, **_SIZE),
                       text_g=String(multiline=True, dynamic_prompts=True),
                       text_l=String(multiline=True, dynamic_prompts=True)):
    """SDXL base: clip_g reads text_g and clip_l reads text_l; size conditioning as given."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    if set(clip.names) != {"clip_l", "clip_g"}:
        raise ValueError(f"CLIPTextEncodeSDXL needs an SDXL CLIP (clip_l + clip_g); this CLIP has "
                         f"{', '.join(clip.names) or 'no encoder'} ({clip.kind})")
    conds = clip.encode("", effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                        embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn),
                        warn=ctx.warn, texts={"clip_g": text_g, "clip_l": text_l})
    size = SizeCond(width=width, height=height, crop_w=crop_w, crop_h=crop_h,
                    target_width=target_width, target_height=target_height)
    return (cond_ops.set_size(conds, size),)


@node(category="advanced/conditioning", outputs=("CONDITIONING",), fingerprint=embeddings_fingerprint)
def CLIPTextEncodeSDXLRefiner(ctx, ascore=Float(6.0, min=0.0, max=1000.0, step=0.01),
                              width=Int(1024, **_SIZE), height=Int(1024, **_SIZE),
                              text=String(multiline=True, dynamic_prompts=True), clip=Socket("CLIP")):
    """SDXL refiner: the prompt with its aesthetic score and size conditioning."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    conds = clip.encode(text, effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                        embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn), warn=ctx.warn)
    return (cond_ops.set_size(conds, SizeCond(width=width, height=height, aesthetic_score=ascore)),)
