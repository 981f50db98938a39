"""ComfyUI ``comfy_extras/nodes_qwen.py`` (comfyanonymous 01ec967): the Qwen-Image Edit text
encoders. `TextEncodeQwenImageEdit` encodes the prompt with one image (seen by Qwen2.5-VL's vision
tower, ``encoders/qwen25_vl.py``) and adds its VAE latent as ``reference_latents``;
`TextEncodeQwenImageEditPlus` does so for up to three images ("Picture N:" in the prompt). The
sizes and templates are ComfyUI's (``helpers/qwen_edit_ops.py``, ``encoders/qwen_image_set.py``)."""

from __future__ import annotations

from typing import Any

from mixgraph.graph.node import Socket, String, node
from mixgraph.nodes.encoders.qwen_image_set import EDIT_PLUS_TEMPLATE
from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.helpers.embeddings import embedding_lookup, embeddings_fingerprint
from mixgraph.nodes.helpers.precision import effective, encoder_policies
from mixgraph.nodes.helpers.qwen_edit_ops import EDIT_AREA, VISION_AREA, encode_with_images, scale_to_area

CATEGORY = "advanced/conditioning"


def _prompt_fingerprint(env: Any, prompt: str = "", **_: Any):
    return embeddings_fingerprint(env, text=prompt)


def _encode(ctx, clip, text: str, images: list, llama_template: str | None = None) -> tuple:
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    return encode_with_images(clip, text, images, effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                              embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn), warn=ctx.warn,
                              llama_template=llama_template)


@node(category=CATEGORY, outputs=("CONDITIONING",), fingerprint=_prompt_fingerprint)
def TextEncodeQwenImageEdit(ctx, clip=Socket("CLIP"), prompt=String(multiline=True, dynamic_prompts=True),
                            vae=Socket("VAE", optional=True), image=Socket("IMAGE", optional=True)):
    images, ref = [], None
    if image is not None:
        scaled = scale_to_area(image, EDIT_AREA)[..., :3]
        images = [scaled]
        if vae is not None:
            ref = vae.encode(scaled, effective(ctx, vae, "VAE"))
    conds = _encode(ctx, clip, prompt, images)
    if ref is not None:
        conds = cond_ops.set_model_inputs(conds, {"reference_latents": [ref]}, append=True)
    return (conds,)


@node(category=CATEGORY, outputs=("CONDITIONING",), fingerprint=_prompt_fingerprint)
def TextEncodeQwenImageEditPlus(ctx, clip=Socket("CLIP"), prompt=String(multiline=True, dynamic_prompts=True),
                                vae=Socket("VAE", optional=True), image1=Socket("IMAGE", optional=True),
                                image2=Socket("IMAGE", optional=True), image3=Socket("IMAGE", optional=True)):
    images, refs, image_prompt = [], [], ""
    for i, image in enumerate((image1, image2, image3)):
        if image is None:
            continue
        images.append(scale_to_area(image, VISION_AREA)[..., :3])
        if vae is not None:
            refs.append(vae.encode(scale_to_area(image, EDIT_AREA, multiple=8)[..., :3], effective(ctx, vae, "VAE")))
        image_prompt += f"Picture {i + 1}: <|vision_start|><|image_pad|><|vision_end|>"
    conds = _encode(ctx, clip, image_prompt + prompt, images, EDIT_PLUS_TEMPLATE)
    if refs:
        conds = cond_ops.set_model_inputs(conds, {"reference_latents": refs}, append=True)
    return (conds,)
