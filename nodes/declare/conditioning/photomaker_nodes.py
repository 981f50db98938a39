"""PhotoMaker v1 nodes (ComfyUI ``comfy_extras/nodes_photomaker.py``, read at comfyanonymous/ComfyUI
86a04ac6d9aa7396d07a58512f603e9a36a5e1bf): PhotoMakerLoader, PhotoMakerEncode. Both are marked
experimental, category ``_for_testing/photomaker``, as there. Runtime: ``adapters/photomaker.py``.

PhotoMakerEncode, as ComfyUI: the trigger word's index is its position among ``text.split(" ")``
plus 1 (-1 when absent); the text is tokenized with word ids, tokens with that word id are
removed (each chunk refilled with its last entry), the rest is encoded; then the token at
position index - 1 of the cond (with one-token words: the word before the trigger, the class
word) is replaced by the fuse of its embedding with the first image's ID embedding. Without the
trigger word the plain text conditioning is returned (ComfyUI raises nothing there either; we
add a warning). Where ComfyUI fails with a tensor error, we raise a clear one (a trigger word
past the first 77 tokens); a prompt of more than 77 tokens is fused in its first chunk, where
ComfyUI's mask is."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.node import Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.helpers.embeddings import embedding_lookup
from mixgraph.nodes.helpers.model_files import PHOTOMAKER
from mixgraph.nodes.adapters.photomaker import (TRIGGER_WORD, PhotoMakerError, drop_word, load_photomaker,
                                                trigger_word_index)
from mixgraph.nodes.helpers.precision import effective

_EXPERIMENTAL = (("experimental", True),)
CHUNK = 77  # ComfyUI's class-token mask covers range(77)


def _experimental(**kw):
    def wrap(fn):
        fn = node(register=False, **kw)(fn)
        fn.spec = REGISTRY.add(replace_spec(fn.spec, info_extra=_EXPERIMENTAL))
        return fn
    return wrap


@_experimental(category="_for_testing/photomaker", outputs=("PHOTOMAKER",))
def PhotoMakerLoader(ctx, photomaker_model_name=PHOTOMAKER.input()):
    """Loads a PhotoMaker v1 ID encoder (CLIP ViT-L/14 + fuse MLPs) from models/photomaker."""
    return (load_photomaker(PHOTOMAKER.path(ctx.env, photomaker_model_name)),)


@_experimental(category="_for_testing/photomaker", outputs=("CONDITIONING",))
def PhotoMakerEncode(ctx, photomaker=Socket("PHOTOMAKER"), image=Socket("IMAGE"), clip=Socket("CLIP"),
                     text=String("photograph of photomaker", multiline=True, dynamic_prompts=True)):
    """Encodes the text and fuses the image's ID embedding into the class word before "photomaker"."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    policy = effective(ctx, clip, "CLIP")
    index = trigger_word_index(text)
    tokens = clip.tokenize(text, embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn), warn=ctx.warn)
    (cond,) = clip.encode_tokens(drop_word(tokens, index), policy, warn=ctx.warn)
    if index <= 0:
        ctx.warn(f'PhotoMakerEncode: the text has no word "{TRIGGER_WORD}" (space-separated, exactly), so the '
                 f'image is not used: the result is the plain text conditioning, as in ComfyUI')
        return ((cond,),)
    position = index - 1
    if position >= min(CHUNK, cond.cross_attn.shape[1]):
        raise PhotoMakerError(f'PhotoMakerEncode: "{TRIGGER_WORD}" is word {index} of the text; the class word '
                              f'before it must lie in the first {CHUNK} tokens (ComfyUI fails here too)')
    cross = cond.cross_attn.clone()
    # the ID encoder runs at the text encoder's precision, as ComfyUI's (text_encoder_dtype)
    cross[0, position] = photomaker.fuse(image, cross[0, position], policy).to(cross.dtype)
    return ((dataclasses.replace(cond, cross_attn=cross),),)
