"""ComfyUI ``comfy_extras/nodes_controlnet.py`` (comfyanonymous/ComfyUI 060dbf5, V3 form; the type
list from ``comfy/cldm/control_types.py`` at Comfy-Org/ComfyUI ee71d5c):
`SetUnionControlNetType` and `ControlNetInpaintingAliMamaApply`.

SetUnionControlNetType sets the CONTROL_NET's control type, ComfyUI's extra argument
``control_type`` ([] for "auto", else [index]); a ControlNet++ union net reads it
(``adapters/controlnet_union.py``), a plain ControlNet or T2I-Adapter ignores it, as in ComfyUI.

ControlNetInpaintingAliMamaApply is ControlNetApplyAdvanced with a required VAE, image and mask;
for nets that declare ``concat_mask`` (the AliMama inpainting ControlNets for SD3 and Flux: 17
hint channels) ComfyUI blacks out the masked area of the image and concatenates the kept-area
mask (1 − mask) to the encoded hint (``adapters/dit_controlnet.py: inpaint_hint``); for every
other net the node is ControlNetApplyAdvanced, as in ComfyUI (the mask is unused).
"""

from __future__ import annotations

from mixgraph.graph.node import Combo, Float, Socket, node
from mixgraph.nodes.adapters.controlnet import apply_controlnet
from mixgraph.nodes.adapters.controlnet_union import UNION_CONTROLNET_TYPES
from mixgraph.nodes.adapters.dit_controlnet import inpaint_hint
from mixgraph.nodes.helpers.precision import effective

# ComfyUI: ["auto"] + the keys of UNION_CONTROLNET_TYPES
TYPE_OPTIONS = ["auto"] + list(UNION_CONTROLNET_TYPES)


@node(category="conditioning/controlnet", outputs=("CONTROL_NET",))
def SetUnionControlNetType(control_net=Socket("CONTROL_NET"), type=Combo(TYPE_OPTIONS)):
    index = UNION_CONTROLNET_TYPES.get(type, -1)
    control_type = (index,) if index >= 0 else ()
    setter = getattr(control_net, "with_control_type", None)
    if setter is None:  # a T2I-Adapter: ComfyUI sets the argument, nothing reads it
        return (control_net,)
    return (setter(control_type),)


@node(category="conditioning/controlnet", outputs=(("CONDITIONING", "positive"), ("CONDITIONING", "negative")))
def ControlNetInpaintingAliMamaApply(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                                     control_net=Socket("CONTROL_NET"), vae=Socket("VAE"),
                                     image=Socket("IMAGE"), mask=Socket("MASK"),
                                     strength=Float(1.0, min=0.0, max=10.0, step=0.01),
                                     start_percent=Float(0.0, min=0.0, max=1.0, step=0.001),
                                     end_percent=Float(1.0, min=0.0, max=1.0, step=0.001)):
    extra_concat = ()
    if getattr(control_net, "concat_mask", False):  # SD3 / Flux AliMama inpainting nets
        image, keep = inpaint_hint(image, mask)
        extra_concat = (keep,)
    if strength == 0:
        return positive, negative
    policy = effective(ctx, control_net, "CONTROL_NET")
    vae_policy = effective(ctx, vae, "VAE")
    return tuple(apply_controlnet(c, control_net, policy, image, strength, start_percent, end_percent,
                                  vae=vae, vae_policy=vae_policy, extra_concat=extra_concat)
                 for c in (positive, negative))
