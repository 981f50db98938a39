"""Plain functions on CONDITIONING payloads for the conditioning nodes (ComfyUI ``nodes.py``):
averaging, concatenation, percentage areas, masks, timestep ranges, the inpaint-model concat, model
inputs (Flux's guidance) and the token handling of the DiT text-encode nodes.

Every function returns new ``Cond``s (``dataclasses.replace``); inputs are never modified.
What these fields mean at sampling time is applied in ``nodes/sampling/parameterization.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from mixgraph.nodes.payloads.conditioning import Cond

logger = logging.getLogger(__name__)

Conditioning = tuple[Cond, ...]


def _first(conds: Conditioning, node: str, name: str) -> Cond:
    if not conds:
        raise ValueError(f"{node}: {name} is an empty conditioning")
    if len(conds) > 1:
        logger.warning("%s: %s holds %d conds; only the first is applied", node, name, len(conds))
    return conds[0]


def average(to: Conditioning, frm: Conditioning, to_strength: float) -> Conditioning:
    """ConditioningAverage: ``to·s + from·(1 − s)`` per token; ``from`` is cut or zero-padded to
    each ``to`` cond's token count. Pooled outputs mix the same way (a missing ``to`` pooled
    counts as ``from``'s)."""
    src = _first(frm, "ConditioningAverage", "conditioning_from")
    out = []
    for c in to:
        t1 = c.cross_attn
        t0 = src.cross_attn[:, : t1.shape[1]]
        if t0.shape[1] < t1.shape[1]:
            pad = torch.zeros(1, t1.shape[1] - t0.shape[1], t1.shape[2], dtype=t0.dtype)
            t0 = torch.cat([t0, pad], dim=1)  # [1, T1, D]
        mixed = t1 * to_strength + t0 * (1.0 - to_strength)
        pooled_to = c.pooled if c.pooled is not None else src.pooled
        pooled = c.pooled
        if src.pooled is not None and pooled_to is not None:
            pooled = pooled_to * to_strength + src.pooled * (1.0 - to_strength)
        out.append(dataclasses.replace(c, cross_attn=mixed, pooled=pooled))
    return tuple(out)


def concat(to: Conditioning, frm: Conditioning) -> Conditioning:
    """ConditioningConcat: ``from``'s tokens appended to each ``to`` cond ([1, T1 + T2, D])."""
    src = _first(frm, "ConditioningConcat", "conditioning_from")
    out = []
    for c in to:
        if c.cross_attn.shape[-1] != src.cross_attn.shape[-1]:
            raise ValueError(f"ConditioningConcat: token widths differ ({c.cross_attn.shape[-1]} "
                             f"vs {src.cross_attn.shape[-1]}); both must come from the same CLIP")
        out.append(dataclasses.replace(c, cross_attn=torch.cat([c.cross_attn, src.cross_attn], dim=1)))
    return tuple(out)


def set_area_percentage(conds: Conditioning, width: float, height: float, x: float, y: float,
                        strength: float) -> Conditioning:
    """ConditioningSetAreaPercentage: an area in fractions of the latent, resolved when sampling."""
    return tuple(dataclasses.replace(c, area=None, area_fraction=(height, width, y, x),
                                     strength=strength, set_area_to_bounds=False) for c in conds)


def set_strength(conds: Conditioning, strength: float) -> Conditioning:
    """ConditioningSetAreaStrength."""
    return tuple(dataclasses.replace(c, strength=strength) for c in conds)


def set_mask(conds: Conditioning, mask: torch.Tensor, strength: float, set_cond_area: str) -> Conditioning:
    """ConditioningSetMask: a [B, H, W] weight mask (resized to the latent when sampling);
    "mask bounds" makes the cond's area the mask's bounding box."""
    if mask.ndim < 3:
        mask = mask.unsqueeze(0)  # [H, W] -> [1, H, W]
    bounds = set_cond_area != "default"
    return tuple(dataclasses.replace(c, mask=mask, set_area_to_bounds=bounds, mask_strength=strength)
                 for c in conds)


def set_timestep_range(conds: Conditioning, start: float, end: float) -> Conditioning:
    """ConditioningSetTimestepRange: active while sampling progress is within [start, end]."""
    return tuple(dataclasses.replace(c, timestep_range=(float(start), float(end))) for c in conds)


def set_size(conds: Conditioning, size) -> Conditioning:
    """SDXL size / aesthetic conditioning (CLIPTextEncodeSDXL, CLIPTextEncodeSDXLRefiner)."""
    return tuple(dataclasses.replace(c, size=size) for c in conds)


def set_model_input(conds: Conditioning, key: str, value) -> Conditioning:
    """Every cond with ``model_inputs[key] = value`` (a ComfyUI cond key a family reads, e.g.
    Flux's "guidance" from CLIPTextEncodeFlux)."""
    return tuple(dataclasses.replace(c, model_inputs={**c.model_inputs, key: value}) for c in conds)


def set_concat(conds: Conditioning, latent: torch.Tensor, mask: torch.Tensor) -> Conditioning:
    return tuple(dataclasses.replace(c, concat_latent=latent, concat_mask=mask) for c in conds)


def set_model_inputs(conds: Conditioning, values: dict, append: bool = False) -> Conditioning:
    """ComfyUI's ``node_helpers.conditioning_set_values``: every cond gets ``values`` in its
    ``model_inputs`` (ComfyUI's cond keys: "guidance", "reference_latents", ...); with ``append``
    a list value extends the cond's list under that key instead of replacing it (ReferenceLatent
    chains)."""
    out = []
    for c in conds:
        inputs = dict(c.model_inputs)
        for key, value in values.items():
            if append and isinstance(value, list) and inputs.get(key) is not None:
                value = list(inputs[key]) + value
            inputs[key] = value
        out.append(dataclasses.replace(c, model_inputs=inputs))
    return tuple(out)


def set_concat_image(conds: Conditioning, image: torch.Tensor, noise_augmentation: float) -> Conditioning:
    """Every cond carries the x4 upscaler's low-resolution image and its noise augmentation."""
    return tuple(dataclasses.replace(c, concat_image=image, noise_augmentation=float(noise_augmentation))
                 for c in conds)


def inpaint_pixels(pixels: torch.Tensor, mask: torch.Tensor, multiple: int = 8
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """InpaintModelConditioning's pixel preparation: the mask resized (bilinear) to the image as
    [B, 1, H, W]; image and mask center-cropped to a multiple of ``multiple``; masked pixels
    (mask rounded to 1) set to grey 0.5. Returns (greyed pixels [B, H', W', C], mask)."""
    h, w = pixels.shape[1], pixels.shape[2]
    m = F.interpolate(mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float(), size=(h, w),
                      mode="bilinear")  # [Bm, 1, H, W]
    hh, ww = (h // multiple) * multiple, (w // multiple) * multiple
    if (hh, ww) != (h, w):
        oy, ox = (h % multiple) // 2, (w % multiple) // 2
        pixels = pixels[:, oy:oy + hh, ox:ox + ww, :]
        m = m[:, :, oy:oy + hh, ox:ox + ww]
    keep = (1.0 - m.round()).squeeze(1).unsqueeze(-1)  # [Bm, H, W, 1]
    rgb = (pixels[..., :3] - 0.5) * keep + 0.5
    return torch.cat([rgb, pixels[..., 3:]], dim=-1), m


# --------------------------------------------------------------------------------------------
# the DiT text-encode nodes (ComfyUI comfy_extras/nodes_flux.py CLIPTextEncodeFlux,
# nodes_sd3.py CLIPTextEncodeSD3): one prompt per encoder, SD3's "none" padding (an empty prompt
# gives its encoder no tokens), CLIP-L / CLIP-G chunk counts made equal with empty-prompt chunks


def require_encoders(clip: Any, node: str, *names: str) -> None:
    """A clear error when ``clip`` lacks an encoder the node writes a prompt for."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    missing = [n for n in names if n not in clip.names]
    if missing:
        raise ValueError(f"{node} needs a CLIP with {', '.join(names)}; this {clip.kind} CLIP has "
                         f"{', '.join(clip.names) or 'no encoder'} (no {', '.join(missing)})")


#: the T5 encoder names ComfyUI's T5TokenizerOptions sets its options for (its embedding keys)
T5_ENCODER_NAMES = ("t5xxl", "pile_t5xl", "t5base", "mt5xl", "umt5xxl")


def t5_tokenizer_options(clip: Any, min_padding: int, min_length: int) -> Any:
    """ComfyUI's T5TokenizerOptions: ``clip`` with every T5 encoder's tokenizer padding a prompt by
    ``min_padding`` pad tokens after its end token and to at least ``min_length`` tokens (these
    replace the set's own, e.g. Flux's 256); the other encoders unchanged."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    entries = tuple(dataclasses.replace(e, rule=dataclasses.replace(e.rule, min_padding=min_padding,
                                                                    min_length=min_length))
                    if e.name in T5_ENCODER_NAMES else e for e in clip.encoders)
    return dataclasses.replace(clip, encoders=entries)


def sd3_tokens(clip: Any, texts: Mapping[str, str], empty_padding: str, *, embedding_lookup: Any = None,
               warn: Callable[[str], None] | None = None) -> dict[str, list]:
    """encoder name -> chunks for CLIPTextEncodeSD3: each encoder of ``clip`` reads its own text
    (``texts``: clip_l, clip_g, t5xxl); with ``empty_padding`` "none" an empty text gives no
    chunks; CLIP-L and CLIP-G are padded to the same chunk count with the empty prompt."""
    if empty_padding not in ("none", "empty_prompt"):
        raise ValueError(f"empty_padding must be 'none' or 'empty_prompt', got {empty_padding!r}")
    no_padding = empty_padding == "none"
    tokens: dict[str, list] = {}
    for name in clip.names:
        text = texts.get(name, "")
        if len(text) == 0 and no_padding:
            tokens[name] = []
        else:
            tokens[name] = clip.tokenize(text, embedding_lookup=embedding_lookup, warn=warn)[name]
    if "clip_l" in tokens and "clip_g" in tokens and len(tokens["clip_l"]) != len(tokens["clip_g"]):
        empty = clip.tokenize("", warn=warn)
        while len(tokens["clip_l"]) < len(tokens["clip_g"]):
            tokens["clip_l"] = tokens["clip_l"] + empty["clip_l"]
        while len(tokens["clip_l"]) > len(tokens["clip_g"]):
            tokens["clip_g"] = tokens["clip_g"] + empty["clip_g"]
    return tokens
