"""ComfyUI ``comfy_extras/nodes_lumina2.py`` (comfyanonymous 09494bc): `CLIPTextEncodeLumina2`,
a prompt with one of Lumina Image 2.0's system prompts in front (``families/lumina``). Its other
node, RenormCFG, is in ``model_patches/guidance_extra_nodes.py``."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Socket, String, node
from mixgraph.nodes.helpers.embedded_model import prompt_warning
from mixgraph.nodes.helpers.embeddings import embedding_lookup, embeddings_fingerprint
from mixgraph.nodes.helpers.precision import effective, encoder_policies

# ComfyUI's SYSTEM_PROMPT, the prompts Lumina Image 2.0 was trained with
SYSTEM_PROMPTS = {
    "superior": "You are an assistant designed to generate superior images with the superior "
                "degree of image-text alignment based on textual prompts or user prompts.",
    "alignment": "You are an assistant designed to generate high-quality images with the "
                 "highest degree of image-text alignment based on textual prompts.",
    "low-quality": "You are an assistant designed to generate low-quality images "
                   "based on textual prompts.",
}
SYSTEM_PROMPT_TIP = (
    "Lumina2 provide 3 types of system prompts:"
    "Superior: You are an assistant designed to generate superior images with the superior "
    "degree of image-text alignment based on textual prompts or user prompts. "
    "Alignment: You are an assistant designed to generate high-quality images with the highest "
    "degree of image-text alignment based on textual prompts."
    "Low Quality: You are an assistant designed to generate low-quality images "
    "based on textual prompts or user prompts.")


def lumina2_prompt(system_prompt: str, user_prompt: str) -> str:
    """The text Lumina 2 encodes: ``<system prompt> <Prompt Start> <user prompt>``."""
    return f"{SYSTEM_PROMPTS[system_prompt]} <Prompt Start> {user_prompt}"


@node(category="model/conditioning/lumina", outputs=("CONDITIONING",), display_name="CLIP Text Encode (Lumina 2)",
      fingerprint=embeddings_fingerprint,
      description="Encodes a system prompt and a user prompt using a CLIP model into an embedding "
                  "that can be used to guide the diffusion model towards generating specific images.")
def CLIPTextEncodeLumina2(ctx, system_prompt=Combo(tuple(SYSTEM_PROMPTS), tooltip=SYSTEM_PROMPT_TIP),
                          user_prompt=String(multiline=True, dynamic_prompts=True, tooltip="The text to be encoded."),
                          clip=Socket("CLIP", tooltip="The CLIP model used for encoding the text.")):
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    text = lumina2_prompt(system_prompt, user_prompt)
    warning = prompt_warning(clip, text)
    if warning:
        ctx.warn(warning)
    policy = effective(ctx, clip, "CLIP")
    return (clip.encode(text, policy, policies=encoder_policies(ctx, clip),
                        embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn)),)
