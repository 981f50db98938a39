"""CLIP vision, unCLIP and style-model nodes (ComfyUI ``nodes.py``: CLIPVisionLoader,
CLIPVisionEncode, unCLIPCheckpointLoader, unCLIPConditioning, StyleModelLoader, StyleModelApply).

Runtime: ``encoders/clip_vision.py``, ``encoders/siglip_vision.py`` (+ ``clip_vision_handle.py``),
``families/sd/unclip.py``, ``adapters/style_model.py``, ``adapters/redux.py``; the unCLIP entries
ride on ``Cond.unclip`` to the model's ``adm``, a Redux attention bias on
``Cond.model_inputs["attention_mask"]`` to a Flux model."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.node import Combo, Float, Socket, node
from mixgraph.nodes.helpers.model_files import CHECKPOINT, CLIP_VISION, STYLE_MODEL
from mixgraph.nodes.models import loader
from mixgraph.nodes.encoders.clip_vision_handle import load_clip_vision
from mixgraph.nodes.adapters.style_model import append_style_tokens, load_style_model
from mixgraph.nodes.payloads.conditioning import UnclipEntry
from mixgraph.nodes.helpers.precision import effective


@node(category="loaders", outputs=("CLIP_VISION",), display_name="Load CLIP Vision")
def CLIPVisionLoader(ctx, clip_name=CLIP_VISION.input()):
    """Loads a vision tower (CLIP ViT-L/14, ViT-H/14, ViT-bigG/14, SigLIP) from models/clip_vision."""
    return (load_clip_vision(CLIP_VISION.path(ctx.env, clip_name)),)


@node(category="conditioning", outputs=("CLIP_VISION_OUTPUT",), display_name="CLIP Vision Encode")
def CLIPVisionEncode(ctx, clip_vision=Socket("CLIP_VISION"), image=Socket("IMAGE"),
                     crop=Combo(("center", "none"))):
    """Encodes an image with the vision tower: centre crop or stretch to its input size."""
    policy = effective(ctx, clip_vision, "CLIP_VISION")
    return (clip_vision.encode(image, policy, crop=crop == "center"),)


@node(category="loaders", outputs=("MODEL", "CLIP", "VAE", "CLIP_VISION"), display_name="unCLIP Checkpoint Loader")
def unCLIPCheckpointLoader(ctx, ckpt_name=CHECKPOINT.input()):
    """Loads an SD2.1 unCLIP checkpoint with the CLIP vision tower it holds."""
    return loader.load_unclip_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name))


@node(category="conditioning", outputs=("CONDITIONING",), display_name="unCLIPConditioning")
def unCLIPConditioning(conditioning=Socket("CONDITIONING"), clip_vision_output=Socket("CLIP_VISION_OUTPUT"),
                       strength=Float(1.0, min=-10.0, max=10.0, step=0.01),
                       noise_augmentation=Float(0.0, min=0.0, max=1.0, step=0.01)):
    """Adds the image embedding to each cond (strength 0: unchanged, as ComfyUI)."""
    if strength == 0:
        return (conditioning,)
    entry = UnclipEntry(clip_vision_output.image_embeds, float(strength), float(noise_augmentation))
    return (tuple(dataclasses.replace(c, unclip=c.unclip + (entry,)) for c in conditioning),)


@node(category="loaders", outputs=("STYLE_MODEL",), display_name="Load Style Model")
def StyleModelLoader(ctx, style_model_name=STYLE_MODEL.input()):
    """Loads a T2I-Adapter style model or a Flux Redux model from models/style_models."""
    return (load_style_model(STYLE_MODEL.path(ctx.env, style_model_name)),)


@node(category="conditioning/style_model", outputs=("CONDITIONING",), display_name="Apply Style Model")
def StyleModelApply(ctx, conditioning=Socket("CONDITIONING"), style_model=Socket("STYLE_MODEL"),
                    clip_vision_output=Socket("CLIP_VISION_OUTPUT"),
                    strength=Float(1.0, min=0.0, max=10.0, step=0.001),
                    strength_type=Combo(("multiply", "attn_bias"))):
    """Appends the style tokens to each cond's text tokens. "multiply" scales them by strength.
    "attn_bias" leaves them unscaled and records a log(strength) attention bias on them in the
    cond (ComfyUI's attention_mask), which Flux models read and SD 1.x / 2.x / SDXL ignore, as
    in ComfyUI."""
    tokens = style_model.get_cond(clip_vision_output, effective(ctx, style_model, "STYLE_MODEL"))
    return (append_style_tokens(conditioning, tokens, strength, strength_type),)
