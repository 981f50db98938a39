"""Text-encode nodes of the DiT families: CLIPTextEncodeFlux (Flux.1: a CLIP-L prompt, a T5
prompt and the distilled guidance), CLIPTextEncodeSD3 (SD3 / SD3.5: a prompt per encoder) and
T5TokenizerOptions (the T5 encoders' prompt padding).
How the encoders' outputs join into one cond is the CLIP set's join
(``nodes/encoders/dit_joins.py``)."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Float, Int, Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.helpers.embeddings import embedding_lookup, embeddings_fingerprint
from mixgraph.nodes.helpers.precision import effective, encoder_policies


def _flux_fingerprint(env, clip_l="", t5xxl="", **_):
    return embeddings_fingerprint(env, text=f"{clip_l or ''} {t5xxl or ''}")


def _sd3_fingerprint(env, clip_l="", clip_g="", t5xxl="", **_):
    return embeddings_fingerprint(env, text=f"{clip_l or ''} {clip_g or ''} {t5xxl or ''}")


@node(category="advanced/conditioning/flux", outputs=("CONDITIONING",), fingerprint=_flux_fingerprint)
def CLIPTextEncodeFlux(ctx, clip=Socket("CLIP"), clip_l=String(multiline=True, dynamic_prompts=True),
                       t5xxl=String(multiline=True, dynamic_prompts=True),
                       guidance=Float(3.5, min=0.0, max=100.0, step=0.1)):
    """Flux.1: CLIP-L reads clip_l, T5-XXL reads t5xxl; the cond carries the guidance value
    (ComfyUI's ``guidance`` key)."""
    cond_ops.require_encoders(clip, "CLIPTextEncodeFlux", "clip_l", "t5xxl")
    conds = clip.encode(clip_l, effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                        embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn), warn=ctx.warn,
                        texts={"t5xxl": t5xxl})
    return (cond_ops.set_model_input(conds, "guidance", float(guidance)),)


@node(category="_for_testing/conditioning", outputs=("CLIP",), register=False)
def T5TokenizerOptions(clip=Socket("CLIP"), min_padding=Int(0, min=0, max=10000, step=1),
                       min_length=Int(0, min=0, max=10000, step=1)):
    """The CLIP with its T5 encoders' prompt padding set (ComfyUI comfy_extras/nodes_cond.py):
    ``min_padding`` pad tokens after the end token, then at least ``min_length`` tokens."""
    return (cond_ops.t5_tokenizer_options(clip, min_padding, min_length),)


# experimental in ComfyUI (``is_experimental=True``): object_info says so
T5TokenizerOptions.spec = REGISTRY.add(replace_spec(T5TokenizerOptions.spec, info_extra=(("experimental", True),)))


@node(category="advanced/conditioning", outputs=("CONDITIONING",), fingerprint=_sd3_fingerprint)
def CLIPTextEncodeSD3(ctx, clip=Socket("CLIP"), clip_l=String(multiline=True, dynamic_prompts=True),
                      clip_g=String(multiline=True, dynamic_prompts=True),
                      t5xxl=String(multiline=True, dynamic_prompts=True),
                      empty_padding=Combo(("none", "empty_prompt"))):
    """SD3 / SD3.5: a prompt per encoder; with empty_padding "none" an empty prompt leaves its
    encoder out (ComfyUI)."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    tokens = cond_ops.sd3_tokens(clip, {"clip_l": clip_l, "clip_g": clip_g, "t5xxl": t5xxl}, empty_padding,
                                 embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn), warn=ctx.warn)
    return (clip.encode_tokens(tokens, effective(ctx, clip, "CLIP"), warn=ctx.warn,
                               policies=encoder_policies(ctx, clip)),)
