"""Edge values at the custom-node boundary: mixgraph's typed payloads <-> ComfyUI's plain ones.

A ComfyUI custom node reads and writes LATENT as a dict (`{"samples": [B,C,H,W], "noise_mask",
"batch_index"}`) and CONDITIONING as a list of `[cross_attn [1,T,D], {options}]`; mixgraph's nodes
pass `Latent` and `tuple[Cond, ...]` (nodes/payloads). The adapter converts on the way in
(`to_comfy`, by the declared input type, or by value for `*` and multi-type inputs) and on the
way out (`from_comfy`, by the declared output type, or by shape for `*`), so packs work
unchanged and mixgraph's core nodes downstream get their own types. AUDIO is
`{"waveform", "sample_rate"}` there and `Audio` here, VIDEO a ComfyUI `VideoInput` there
(`comfy_video.PackVideo`) and mixgraph's video here. IMAGE and MASK are the same tensors on both
sides; model handles go through as they are (a pack reaching into ComfyUI model internals gets
`MissingHostAPI` from the adapter).

The conditioning option keys are ComfyUI's: `pooled_output`, `area` `(h, w, y, x)` in latent
pixels, `strength`, `mask` + `mask_strength` (+ `set_area_to_bounds`), `control`,
`control_apply_to_uncond`, the SDXL size keys (`width`, `height`, `crop_w`, `crop_h`,
`target_width`, `target_height`, `aesthetic_score`), `start_percent` / `end_percent`,
`unclip_conditioning` (a list of `{"clip_vision_output", "strength", "noise_augmentation"}`),
`gligen` (`("position", GLIGEN, [(pooled, h, w, y, x), ...])`) and the x4 upscaler's
`concat_image` + `noise_augmentation`, CLIPTextEncodeControlnet's `cross_attn_controlnet` +
`pooled_output_controlnet`, and InpaintModelConditioning's `concat_latent_image` + `concat_mask`.
Every other key (a model family's entries: Flux's `guidance`, `attention_mask`,
`reference_latents`, a pack's own) is kept in `Cond.model_inputs` under its name and written
back as a dict key, so such entries travel through mixgraph's nodes and back into packs.
"""

from __future__ import annotations

from typing import Any

import torch

from mixgraph.nodes.adapters.gligen import GligenBoxes
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond, UnclipEntry
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.video import Audio
from mixgraph.ui.comfy.comfy_video import audio_from_comfy, audio_to_comfy, is_video, video_from_comfy, \
    video_to_comfy

__all__ = ["to_comfy", "from_comfy", "latent_to_comfy", "latent_from_comfy", "cond_to_comfy",
           "cond_from_comfy"]

_SIZE_KEYS = ("width", "height", "crop_w", "crop_h", "target_width", "target_height",
              "aesthetic_score")

# The option keys `cond_from_comfy` maps onto `Cond` fields; any other key goes to model_inputs.
_FIELD_KEYS = frozenset(("pooled_output", "area", "strength", "mask", "mask_strength",
                         "set_area_to_bounds", "control", "control_apply_to_uncond",
                         "start_percent", "end_percent", "unclip_conditioning", "gligen",
                         "concat_image", "noise_augmentation", "cross_attn_controlnet",
                         "pooled_output_controlnet", "concat_latent_image", "concat_mask",
                         *_SIZE_KEYS))


def latent_to_comfy(latent: Latent) -> dict:
    out: dict[str, Any] = {"samples": latent.samples}
    if latent.noise_mask is not None:
        out["noise_mask"] = latent.noise_mask
    if latent.batch_index is not None:
        out["batch_index"] = list(latent.batch_index)
    return out


def latent_from_comfy(d: dict) -> Latent:
    samples = d.get("samples")
    if not isinstance(samples, torch.Tensor):
        raise TypeError("a LATENT dict needs a 'samples' tensor")
    index = d.get("batch_index")
    return Latent(samples.float(), d.get("noise_mask"),
                  tuple(int(i) for i in index) if index is not None else None)


class _Embeds:
    """What an unCLIP entry keeps of a CLIP_VISION_OUTPUT (ComfyUI reads only image_embeds)."""

    def __init__(self, image_embeds: torch.Tensor):
        self.image_embeds = image_embeds

    def __getitem__(self, key: str):
        return getattr(self, key)


def cond_to_comfy(conds: tuple[Cond, ...]) -> list:
    out = []
    for c in conds:
        # a family's entries first: a Cond field written below wins over a same-named entry
        opts: dict[str, Any] = {k: v for k, v in c.model_inputs.items() if k not in _FIELD_KEYS}
        if c.pooled is not None:
            opts["pooled_output"] = c.pooled
        if c.area is not None:
            opts["area"] = tuple(c.area)
        if c.strength != 1.0 or c.area is not None or c.mask is not None:
            opts["strength"] = c.strength
        if c.mask is not None:
            opts.update(mask=c.mask, mask_strength=1.0, set_area_to_bounds=False)
        if c.control is not None:
            opts["control"] = c.control
            opts["control_apply_to_uncond"] = c.control_apply_to_uncond
        if c.size is not None:
            opts.update({k: getattr(c.size, k) for k in _SIZE_KEYS if getattr(c.size, k) is not None})
        if c.timestep_range != (0.0, 1.0):
            opts["start_percent"], opts["end_percent"] = c.timestep_range
        if c.unclip:
            opts["unclip_conditioning"] = [
                {"clip_vision_output": _Embeds(u.image_embeds), "strength": u.strength, "noise_augmentation": u.noise_augmentation} for u in c.unclip]
        if c.gligen is not None:
            opts["gligen"] = ("position", c.gligen.model, list(c.gligen.boxes))
        if c.concat_image is not None:  # SD_4XUpscale_Conditioning
            opts.update(concat_image=c.concat_image, noise_augmentation=c.noise_augmentation)
        if c.controlnet_cross_attn is not None:
            opts["cross_attn_controlnet"] = c.controlnet_cross_attn
            opts["pooled_output_controlnet"] = c.controlnet_pooled
        if c.concat_latent is not None:  # InpaintModelConditioning
            opts["concat_latent_image"] = c.concat_latent
        if c.concat_mask is not None:
            opts["concat_mask"] = c.concat_mask
        out.append([c.cross_attn, opts])
    return out


def cond_from_comfy(items: list) -> tuple[Cond, ...]:
    conds = []
    for i, item in enumerate(items):
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], dict)
                and isinstance(item[0], torch.Tensor)):
            raise TypeError(f"CONDITIONING entry {i} is not a [tensor, dict] pair")
        t, o = item
        area = o.get("area")
        if area is not None:
            if len(area) != 4 or isinstance(area[0], str):
                raise ValueError(f"CONDITIONING entry {i}: area {area!r} is not (h, w, y, x) in "
                                 f"latent pixels; percentage areas are not supported yet")
            area = tuple(int(a) for a in area)
        mask = o.get("mask")
        if mask is not None and o.get("mask_strength", 1.0) != 1.0:
            mask = mask * float(o["mask_strength"])
        size = None
        if any(k in o for k in _SIZE_KEYS):
            size = SizeCond(**{k: o[k] for k in _SIZE_KEYS if k in o})
        unclip = tuple(UnclipEntry(u["clip_vision_output"]["image_embeds"], float(u.get("strength", 1.0)),
                                   float(u.get("noise_augmentation", 0.0)))
                       for u in o.get("unclip_conditioning") or ())
        gligen = None
        if o.get("gligen") is not None:
            gligen = GligenBoxes(o["gligen"][1], tuple(tuple(b) for b in o["gligen"][2]))
        conds.append(Cond(
            unclip=unclip, gligen=gligen, concat_image=o.get("concat_image"),
            noise_augmentation=float(o.get("noise_augmentation", 0.0)),
            controlnet_cross_attn=o.get("cross_attn_controlnet"),
            controlnet_pooled=o.get("pooled_output_controlnet"),
            concat_latent=o.get("concat_latent_image"), concat_mask=o.get("concat_mask"),
            model_inputs={k: v for k, v in o.items() if k not in _FIELD_KEYS},
            cross_attn=t.float(), pooled=o.get("pooled_output"), area=area,
            strength=float(o.get("strength", 1.0)), mask=mask, control=o.get("control"),
            control_apply_to_uncond=bool(o.get("control_apply_to_uncond", False)), size=size,
            timestep_range=(float(o.get("start_percent", 0.0)), float(o.get("end_percent", 1.0)))))
    return tuple(conds)


def _is_conds(value: Any) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(c, Cond) for c in value)


def _is_comfy_conds(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], torch.Tensor)
        and isinstance(x[1], dict) for x in value)


def to_comfy(type_: str, value: Any) -> Any:
    """A value as a ComfyUI node expects it on an input of `type_`."""
    if isinstance(value, Latent):
        return latent_to_comfy(value)
    if _is_conds(value):
        return cond_to_comfy(value)
    if isinstance(value, Audio):
        return audio_to_comfy(value)
    if is_video(value):
        return video_to_comfy(value)
    return value


def from_comfy(type_: str, value: Any) -> Any:
    """A ComfyUI node's output value as mixgraph's nodes take it."""
    types = {t.strip() for t in str(type_).split(",")}
    if isinstance(value, dict) and "samples" in value and ("LATENT" in types or "*" in types):
        return latent_from_comfy(value)
    if _is_comfy_conds(value) and ("CONDITIONING" in types or "*" in types):
        return cond_from_comfy(value)
    if isinstance(value, list) and not value and "CONDITIONING" in types:
        return ()
    if "AUDIO" in types or "*" in types:
        value = audio_from_comfy(value)
    if "VIDEO" in types or "*" in types:
        value = video_from_comfy(value)
    return value
