"""ComfyUI's `nodes` module for custom node packs: `NODE_CLASS_MAPPINGS` (mixgraph's core nodes
as ComfyUI classes, plus the loaded custom nodes), `NODE_DISPLAY_NAME_MAPPINGS`,
`MAX_RESOLUTION`, the core classes by name (`nodes.KSampler`) and `common_ksampler`.

A core class wraps the registered node: `KSampler().sample(model, seed, ...)` takes ComfyUI's
arguments (positional in INPUT_TYPES order, or by name) and payloads (LATENT dicts,
CONDITIONING lists), runs mixgraph's node function inside the running custom node (its run
context: precision, progress, interrupts) and answers in ComfyUI's form: the output tuple, or
`{"ui", "result"}` for nodes that show something.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.node import MAX_RESOLUTION, Result  # noqa: F401  (MAX_RESOLUTION: ComfyUI's name)
from mixgraph.graph.registry import render_spec, widget_order
import mixgraph.ui.comfy.comfy_payloads as _payloads
import mixgraph.ui.comfy.comfy_runtime as _rt

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
EXTENSION_WEB_DIRS: dict[str, str] = {}

#: ComfyUI's FUNCTION name of each core class (packs call them by it).
CORE_FUNCTIONS = {
    "CheckpointLoaderSimple": "load_checkpoint", "CheckpointLoader": "load_checkpoint",
    "CLIPTextEncode": "encode", "CLIPSetLastLayer": "set_last_layer",
    "EmptyLatentImage": "generate", "KSampler": "sample", "KSamplerAdvanced": "sample",
    "VAEDecode": "decode", "VAEEncode": "encode", "VAEEncodeForInpaint": "encode",
    "VAEDecodeTiled": "decode", "VAEEncodeTiled": "encode", "VAELoader": "load_vae",
    "LoraLoader": "load_lora", "LoraLoaderModelOnly": "load_lora_model_only",
    "ControlNetLoader": "load_controlnet", "ControlNetApply": "apply_controlnet",
    "ControlNetApplyAdvanced": "apply_controlnet", "LoadImage": "load_image",
    "LoadImageMask": "load_image", "SaveImage": "save_images", "PreviewImage": "save_images",
    "ImageScale": "upscale", "ImageScaleBy": "upscale", "LatentUpscale": "upscale",
    "LatentUpscaleBy": "upscale", "ConditioningCombine": "combine",
    "ConditioningSetArea": "append", "ConditioningSetMask": "append",
    "ConditioningZeroOut": "zero_out", "ConditioningAverage": "addWeighted",
    "ConditioningConcat": "concat", "UNETLoader": "load_unet", "CLIPLoader": "load_clip",
    "DualCLIPLoader": "load_clip", "ModelSamplingDiscrete": "patch", "ImageInvert": "invert",
    "ImageBatch": "batch", "EmptyImage": "generate", "ImagePadForOutpaint": "expand_image",
    "LatentFromBatch": "frombatch", "RepeatLatentBatch": "repeat", "LatentComposite": "composite",
    "SetLatentNoiseMask": "set_mask", "ImageCrop": "crop", "SolidMask": "solid",
    "InvertMask": "invert", "ImageToMask": "image_to_mask", "MaskToImage": "mask_to_image",
}


def _core_class(spec: Any) -> type:
    func = CORE_FUNCTIONS.get(spec.name, "execute")
    names = [n for n, _ in widget_order(spec)]
    types = dict(spec.inputs)

    def INPUT_TYPES(cls):  # noqa: N802 - ComfyUI's name
        return render_spec(spec, _rt.current_env())["input"]

    def call(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(names):
            raise TypeError(f"{spec.name}.{func}() takes {len(names)} inputs, got {len(args)}")
        values = dict(zip(names, args))
        values.update(kwargs)
        now = _rt.running()
        if now is None:
            raise _rt.MissingHostAPI(f"nodes.{spec.name} called outside a running node "
                                     f"(mixgraph runs core nodes inside a prompt only)")
        call_args: dict[str, Any] = {}
        for n, inp in spec.inputs:
            if n in values:
                call_args[n] = _payloads.from_comfy(inp.type, values[n])
            elif inp.has_default:
                call_args[n] = inp.default
            elif inp.optional:
                call_args[n] = None
            else:
                raise TypeError(f"{spec.name}.{func}() missing required input {n!r}")
        for pname, hidden in spec.hidden:
            call_args[pname] = values.get(pname, now.ctx.prompt if hidden.kind == "PROMPT" else
                                          now.ctx.extra_data.get("extra_pnginfo")
                                          if hidden.kind == "EXTRA_PNGINFO" else
                                          now.node_id if hidden.kind == "UNIQUE_ID" else None)
        if spec.wants_ctx:
            call_args["ctx"] = now.ctx.for_types(spec.precision_types)
        ret = spec.fn(**call_args)
        ui = None
        if isinstance(ret, Result):
            ui, ret = ret.ui, ret.values
        if not isinstance(ret, tuple):
            ret = () if ret is None and not spec.outputs else (ret,)
        out = tuple(_payloads.to_comfy(o.type, v) for o, v in zip(spec.outputs, ret))
        return {"ui": ui, "result": out} if ui is not None else out

    call.__name__ = func
    return type(spec.name, (), {
        "INPUT_TYPES": classmethod(INPUT_TYPES), "FUNCTION": func,
        "RETURN_TYPES": tuple(o.type for o in spec.outputs),
        "RETURN_NAMES": tuple(o.name for o in spec.outputs),
        "OUTPUT_IS_LIST": tuple(o.is_list for o in spec.outputs),
        "CATEGORY": spec.category, "OUTPUT_NODE": spec.output_node,
        "DESCRIPTION": spec.description, func: call, "__module__": __name__,
        "_mixgraph_spec": spec, "_input_types": types,
    })


def sync(registry: Any) -> None:
    """Fill the mappings from a registry: core nodes as wrappers, custom nodes as their classes
    (`custom` maps a custom node's name to its original class)."""
    if registry is None:
        return
    for spec in registry.specs():
        if spec.name in NODE_CLASS_MAPPINGS:
            continue
        original = getattr(spec.fn, "cls", None)
        cls = original if original is not None else _core_class(spec)
        NODE_CLASS_MAPPINGS[spec.name] = cls
        if spec.display_name:
            NODE_DISPLAY_NAME_MAPPINGS[spec.name] = spec.display_name
        if original is None and spec.name.isidentifier():
            globals().setdefault(spec.name, cls)


def common_ksampler(model: Any, seed: int, steps: int, cfg: float, sampler_name: str,
                    scheduler: str, positive: Any, negative: Any, latent: dict,
                    denoise: float = 1.0, disable_noise: bool = False, start_step: int | None = None,
                    last_step: int | None = None, force_full_denoise: bool = False) -> tuple:
    """ComfyUI's common_ksampler through the core KSampler / KSamplerAdvanced nodes."""
    advanced = disable_noise or start_step is not None or last_step is not None or force_full_denoise
    if not advanced:
        return NODE_CLASS_MAPPINGS["KSampler"]().sample(
            model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent, denoise)
    if denoise != 1.0:
        raise _rt.missing("common_ksampler with denoise and start/last steps together")
    return NODE_CLASS_MAPPINGS["KSamplerAdvanced"]().sample(
        model=model, add_noise="disable" if disable_noise else "enable", noise_seed=seed,
        steps=steps, cfg=cfg, sampler_name=sampler_name, scheduler=scheduler, positive=positive,
        negative=negative, latent_image=latent, start_at_step=start_step or 0,
        end_at_step=10000 if last_step is None else last_step,
        return_with_leftover_noise="disable" if force_full_denoise else "enable")


sync(_rt.STATE.registry)
