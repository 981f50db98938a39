"""Conditioning nodes: text encoding, clip skip, combining, areas, ControlNet application."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Float, Int, Socket, String, node
from mixgraph.nodes.helpers import latent_ops
from mixgraph.nodes.helpers.embedded_model import prompt_warning
from mixgraph.nodes.helpers.embeddings import embedding_lookup, embeddings_fingerprint
from mixgraph.nodes.adapters.controlnet import apply_controlnet
from mixgraph.nodes.helpers.precision import effective, encoder_policies

@node(category="conditioning", outputs=("CONDITIONING",), display_name="CLIP Text Encode (Prompt)",
      fingerprint=embeddings_fingerprint)
def CLIPTextEncode(ctx, text=String(multiline=True, dynamic_prompts=True), clip=Socket("CLIP")):
    """Encodes a prompt with `(word:1.2)` weights and `embedding:name` textual inversions."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    warning = prompt_warning(clip, text)   # the embedded model's few words
    if warning:
        ctx.warn(warning)
    policy = effective(ctx, clip, "CLIP")
    return (clip.encode(text, policy, policies=encoder_policies(ctx, clip),
                        embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn)),)


@node(category="conditioning", outputs=("CLIP",), display_name="CLIP Set Last Layer")
def CLIPSetLastLayer(clip=Socket("CLIP"), stop_at_clip_layer=Int(-1, min=-24, max=-1, step=1)):
    return (clip.with_layer(stop_at_clip_layer),)


@node(category="conditioning", outputs=("CONDITIONING",), display_name="Conditioning (Combine)")
def ConditioningCombine(conditioning_1=Socket("CONDITIONING"), conditioning_2=Socket("CONDITIONING")):
    return (latent_ops.combine(conditioning_1, conditioning_2),)


@node(category="conditioning", outputs=("CONDITIONING",), display_name="Conditioning (Set Area)")
def ConditioningSetArea(conditioning=Socket("CONDITIONING"),
                        width=Int(64, min=64, max=MAX_RESOLUTION, step=8),
                        height=Int(64, min=64, max=MAX_RESOLUTION, step=8),
                        x=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        y=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                        strength=Float(1.0, min=0.0, max=10.0, step=0.01)):
    return (latent_ops.set_area(conditioning, width, height, x, y, strength),)


@node(category="advanced/conditioning", outputs=("CONDITIONING",))
def ConditioningZeroOut(conditioning=Socket("CONDITIONING")):
    return (latent_ops.zero_out(conditioning),)


@node(category="conditioning/controlnet", outputs=("CONDITIONING",),
      display_name="Apply ControlNet (OLD)")
def ControlNetApply(ctx, conditioning=Socket("CONDITIONING"), control_net=Socket("CONTROL_NET"),
                    image=Socket("IMAGE"), strength=Float(1.0, min=0.0, max=10.0, step=0.01)):
    """The deprecated form: the same control also applies to the negative prompt."""
    if strength == 0:
        return (conditioning,)
    policy = effective(ctx, control_net, "CONTROL_NET")
    return (apply_controlnet(conditioning, control_net, policy, image, strength, 0.0, 1.0,
                             apply_to_uncond=True),)


@node(category="conditioning/controlnet", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Apply ControlNet")
def ControlNetApplyAdvanced(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                            control_net=Socket("CONTROL_NET"), image=Socket("IMAGE"),
                            strength=Float(1.0, min=0.0, max=10.0, step=0.01),
                            start_percent=Float(0.0, min=0.0, max=1.0, step=0.001),
                            end_percent=Float(1.0, min=0.0, max=1.0, step=0.001),
                            vae=Socket("VAE", optional=True)):
    """Chains a ControlNet onto both conditionings, active between start and end percent. The VAE
    encodes the hint for nets that take it as a latent (SD3 / SD3.5 ControlNets)."""
    if strength == 0:
        return positive, negative
    policy = effective(ctx, control_net, "CONTROL_NET")
    vae_policy = effective(ctx, vae, "VAE") if vae is not None else None
    return tuple(apply_controlnet(c, control_net, policy, image, strength, start_percent,
                                  end_percent, vae=vae, vae_policy=vae_policy) for c in (positive, negative))


@node(category="conditioning/controlnet", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Apply Controlnet with VAE")
def ControlNetApplySD3(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                       control_net=Socket("CONTROL_NET"), vae=Socket("VAE"), image=Socket("IMAGE"),
                       strength=Float(1.0, min=0.0, max=10.0, step=0.01),
                       start_percent=Float(0.0, min=0.0, max=1.0, step=0.001),
                       end_percent=Float(1.0, min=0.0, max=1.0, step=0.001)):
    """ComfyUI's deprecated name (comfy_extras/nodes_sd3.py) of Apply ControlNet with its VAE required."""
    return ControlNetApplyAdvanced(ctx, positive, negative, control_net, image, strength, start_percent,
                                   end_percent, vae=vae)
