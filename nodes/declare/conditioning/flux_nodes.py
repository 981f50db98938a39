"""ComfyUI's Flux conditioning and latent nodes (``comfy_extras/nodes_flux.py``,
``nodes_edit_model.py``, ``nodes_sd3.py``'s EmptySD3LatentImage): names, inputs, defaults and
categories as ComfyUI's. What they set travels in ``Cond.model_inputs`` under ComfyUI's keys; the
Flux runner reads it (``families/flux/runner.py``)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.helpers import cond_ops, image_ops, latent_ops

FLUX_CATEGORY = "advanced/conditioning/flux"
FLUX_LATENT_CHANNELS = 16  # the Flux / SD3 autoencoders' latent


@node(category=FLUX_CATEGORY, outputs=("CONDITIONING",))
def FluxGuidance(conditioning=Socket("CONDITIONING"), guidance=Float(3.5, min=0.0, max=100.0, step=0.1)):
    # the guidance strength a guidance-distilled model (Flux.1 dev) embeds (no description in ComfyUI)
    return (cond_ops.set_model_inputs(conditioning, {"guidance": guidance}),)


@node(category=FLUX_CATEGORY, outputs=("CONDITIONING",),
      description="This node completely disables the guidance embed on Flux and Flux like models")
def FluxDisableGuidance(conditioning=Socket("CONDITIONING")):
    return (cond_ops.set_model_inputs(conditioning, {"guidance": None}),)


@node(category=FLUX_CATEGORY, outputs=("IMAGE",),
      description="This node resizes the image to one that is more optimal for flux kontext.")
def FluxKontextImageScale(image=Socket("IMAGE")):
    return (image_ops.kontext_scale(image),)


@node(category=FLUX_CATEGORY, outputs=("CONDITIONING",), register=False)
def FluxKontextMultiReferenceLatentMethod(conditioning=Socket("CONDITIONING"),
                                          reference_latents_method=Combo(("offset", "index", "uxo/uno",
                                                                         "index_timestep_zero"))):
    # where a Kontext model places its reference images' tokens ("uxo/uno": diagonally);
    # "index_timestep_zero": newer ComfyUI's Qwen-Image-Edit-2511 method (families/qwen_image)
    method = reference_latents_method
    if "uxo" in method or "uso" in method:
        method = "uxo"
    return (cond_ops.set_model_inputs(conditioning, {"reference_latents_method": method}),)


# experimental in ComfyUI (``is_experimental=True``): object_info says so
FluxKontextMultiReferenceLatentMethod.spec = REGISTRY.add(
    replace_spec(FluxKontextMultiReferenceLatentMethod.spec, info_extra=(("experimental", True),)))


@node(category="advanced/conditioning/edit_models", outputs=("CONDITIONING",),
      description="This node sets the guiding latent for an edit model. If the model supports it you can chain "
                  "multiple to set multiple reference images.")
def ReferenceLatent(conditioning=Socket("CONDITIONING"), latent=Socket("LATENT", optional=True)):
    if latent is None:
        return (conditioning,)
    return (cond_ops.set_model_inputs(conditioning, {"reference_latents": [latent.samples]}, append=True),)


@node(category="latent/sd3", outputs=("LATENT",))
def EmptySD3LatentImage(width=Int(1024, min=16, max=MAX_RESOLUTION, step=16),
                        height=Int(1024, min=16, max=MAX_RESOLUTION, step=16),
                        batch_size=Int(1, min=1, max=4096)):
    # zeros [B, 16, H/8, W/8]: the latent of the Flux.1 / SD3 16-channel autoencoders
    return (latent_ops.empty_latent(width, height, batch_size, FLUX_LATENT_CHANNELS),)
