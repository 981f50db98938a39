"""ComfyUI ``comfy_extras/nodes_lora_debug.py`` (828798f): ``LoraLoaderBypass`` and
``LoraLoaderBypassModelOnly``, LoraLoader / LoraLoaderModelOnly with the LoRA applied in the
forward pass (``adapters/lora_bypass.py``) instead of merged into the weights."""

from __future__ import annotations

import warnings

from mixgraph.graph.node import Float, Socket, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.helpers.model_files import LORA
from mixgraph.nodes.adapters.lora import LoraKeyWarning, load_lora
from mixgraph.nodes.adapters.lora_bypass import bypass_patches

_STRENGTH = dict(min=-100.0, max=100.0, step=0.01)
_DESCRIPTION = ("Apply LoRA in bypass mode. Unlike regular LoRA, this doesn't modify model weights - "
                "instead it injects the LoRA computation during forward pass. Useful for training scenarios.")


def _apply(ctx, model, clip, lora_name, strength_model, strength_clip):
    if strength_model == 0 and strength_clip == 0:
        return model, clip
    path = LORA.path(ctx.env, lora_name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoraKeyWarning)
        lora = load_lora(path, model.weight_shapes(),
                         clip.weight_shapes() if clip is not None and strength_clip else None,
                         unet_names=model.lora_names())
    for w in caught:
        ctx.warn(str(w.message))
    unet, clip_p = bypass_patches(lora, strength_model, strength_clip, clip is not None)
    return (model.with_patches(unet) if unet else model,
            clip.with_patches(clip_p) if clip is not None and clip_p else clip)


def _register(fn, output_tooltips=None):
    extra = (("experimental", True),) + ((("output_tooltips", output_tooltips),) if output_tooltips else ())
    fn.spec = REGISTRY.add(replace_spec(fn.spec, info_extra=extra))
    return fn


@node(category="model/loaders", outputs=("MODEL", "CLIP"), display_name="Load LoRA (Bypass) (For debugging)",
      description=_DESCRIPTION, register=False)
def LoraLoaderBypass(ctx, model=Socket("MODEL", tooltip="The diffusion model the LoRA will be applied to."),
                     clip=Socket("CLIP", tooltip="The CLIP model the LoRA will be applied to."),
                     lora_name=LORA.input(tooltip="The name of the LoRA."),
                     strength_model=Float(1.0, **_STRENGTH, tooltip=(
                         "How strongly to modify the diffusion model. This value can be negative.")),
                     strength_clip=Float(1.0, **_STRENGTH, tooltip=(
                         "How strongly to modify the CLIP model. This value can be negative."))):
    return _apply(ctx, model, clip, lora_name, strength_model, strength_clip)


@node(category="model/loaders", outputs=("MODEL",), display_name="Load LoRA (Bypass, Model Only) (for debugging)",
      description=_DESCRIPTION, register=False)
def LoraLoaderBypassModelOnly(ctx, model=Socket("MODEL"), lora_name=LORA.input(),
                              strength_model=Float(1.0, **_STRENGTH)):
    return (_apply(ctx, model, None, lora_name, strength_model, 0.0)[0],)


_OUT_TIPS = ["The modified diffusion model.", "The modified CLIP model."]
_register(LoraLoaderBypass, _OUT_TIPS)
_register(LoraLoaderBypassModelOnly, _OUT_TIPS)  # ComfyUI's subclass inherits both tooltips
