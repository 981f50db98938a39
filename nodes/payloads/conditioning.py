"""CONDITIONING: ``tuple[Cond, ...]``, with the SDXL size conditioning and ControlNet residuals
a ``Cond`` carries.

Float32 on the CPU and immutable by convention: a consumer never modifies a payload in place; it
derives a new one with ``dataclasses.replace``. These are ComfyUI's untyped ``[[tensor, dict]]``
conditioning lists, given named fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Cond", "SizeCond", "Control", "ControlLike", "Conditioning", "UnclipEntry", "TEXT_FREE"]


@dataclass(frozen=True)
class SizeCond:
    """SDXL ADM size/crop/aesthetic conditioning (Podell et al. 2023, "SDXL", sec. 2.2).

    Pixel units. ``None`` for width/height/target means "latent size × 8" at sampling time, as in
    ComfyUI; crops default to 0. ``aesthetic_score`` is used by the refiner only; None means
    ComfyUI's default by prompt type (6.0 for the positive, 2.5 for the negative).
    """

    width: int | None = None
    height: int | None = None
    crop_w: int = 0
    crop_h: int = 0
    target_width: int | None = None
    target_height: int | None = None
    aesthetic_score: float | None = None


@dataclass(frozen=True, eq=False)
class UnclipEntry:
    """One unCLIPConditioning on a cond: CLIP vision ``image_embeds`` [B, P], ``strength`` and
    ``noise_augmentation`` (0..1); the model turns a cond's entries into its vector input y
    (``nodes/families/sd/unclip.py``)."""

    image_embeds: torch.Tensor
    strength: float = 1.0
    noise_augmentation: float = 0.0


@dataclass(frozen=True)
class Control:
    """ControlNet residuals, diffusers convention.

    input:  one tensor (or None) per UNet input-block output, in order; added to the skip
            connections. Each [B, C_i, H_i, W_i]. Any sequence: a tuple or a list (the
            ControlNet chain and ``+`` build lists; the UNet only indexes and zips it). Flux
            ControlNets: one token tensor [B, N, D] per double-stream block, added to the first
            N image tokens after block i (ComfyUI's control["input"] there).
    middle: added to the middle-block output, [B, C_mid, H_mid, W_mid], or None.
    input_path: added to the main path right after input block k (so also to its skip), one
            entry (or None) per input block from the first; T2I-Adapter features (ComfyUI's
            control["input"]). Empty for ControlNets; ``input`` is empty for T2I-Adapters.
    output: DiT ControlNets (ComfyUI's control["output"]): one token tensor (or None) per block
            of the diffusion model, [B, N, D], added to the image tokens after block i (SD3's
            joint blocks, Flux's single-stream blocks). Empty for UNet ControlNets. Lists of
            different lengths add as ComfyUI's ``control_merge`` does: the longer one's tail is
            kept.

    ``a + b`` sums two nets' residuals slot by slot (a chain of ControlNets); None means "nothing
    here", so None + r = r.
    """

    input: Sequence[torch.Tensor | None]
    middle: torch.Tensor | None = None
    input_path: Sequence[torch.Tensor | None] = ()
    output: Sequence[torch.Tensor | None] = ()

    def __add__(self, other: Control) -> Control:
        return Control(
            input=_add_lists(self.input, other.input, "residuals"),
            middle=_add_opt(self.middle, other.middle),
            input_path=_add_lists(self.input_path, other.input_path, "input-path features"),
            output=_merge_lists(self.output, other.output),
        )


def _add_lists(a, b, what: str) -> list:
    if not a or not b:  # an empty list adds nothing (a T2I-Adapter has no skip residuals)
        return list(a or b)
    if len(a) != len(b):
        raise ValueError(f"Control: cannot add {len(a)} and {len(b)} {what}")
    return [_add_opt(x, y) for x, y in zip(a, b)]


def _merge_lists(a, b) -> list:
    """Slot-wise sum; where one list is longer its extra entries are kept (ComfyUI control_merge)."""
    n = max(len(a), len(b))
    return [_add_opt(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


def _add_opt(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@runtime_checkable
class ControlLike(Protocol):
    """What ``Cond.control`` holds: a ControlNet chain (the sum of every chained net).

    ``residuals`` is called once per UNet evaluation with the batch the UNet is about to see:
      x_in:      [B, C, H, W] the noisy latent already multiplied by c_in (ComfyUI
                 ``calculate_input``); for 9-channel inpaint models, the 4 noisy channels only.
      timesteps: [B] float discrete timesteps (what the UNet receives).
      context:   [B, T, D] cross-attention context of the same batch.
      y:         [B, adm] or None (SDXL vector conditioning).
      sigma:     [B] the current sigmas.
      percent:   float in 0..1, sampling progress of the current sigma (0 = start, 1 = end);
                 a net outside its (start_percent, end_percent) returns None.
    Returns the summed residuals for that batch, or None when no net is active.
    """

    def residuals(
        self,
        x_in: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        y: torch.Tensor | None,
        sigma: torch.Tensor,
        percent: float,
    ) -> Control | None: ...


@dataclass(frozen=True)
class Cond:
    """One entry of a CONDITIONING (``tuple[Cond, ...]``).

    cross_attn:  [1, T, D] text-encoder hidden states (T a multiple of 77 for CLIP); [N, T, D]
                 gives image i of the sampled batch entry i (Stable Zero123's batched cameras:
                 [N, 1, P+4] image embedding + camera, projected by the model). None: a text-free
                 cond (ComfyUI's ``[[None, {}]]``, DualModelGuider's unconnected negative): the
                 UNet runs with no context, each cross-attention attending to the image tokens
                 (``TEXT_FREE``).
    pooled:      [1, P] pooled text embedding (SDXL clip_g projection) or None.
    area:        (h, w, y, x) in latent pixels (ComfyUI ConditioningSetArea divides px by 8), or
                 None for the whole latent.
    strength:    weight of this cond in the area-weighted average (calc_cond_batch).
    mask:        [H, W] or [1, H, W] float mask (any size; resized to the latent) multiplying this
                 cond's weight, or None.
    control:     ControlNet chain, or None.
    control_apply_to_uncond: the old ControlNetApply semantics (also on the negative).
    size:        SDXL ADM size conditioning, or None (defaults derived from the latent).
    timestep_range: (start_percent, end_percent) of sampling progress where this cond is active
                 (ConditioningSetTimestepRange); (0, 1) = always.
    area_fraction: (h, w, y, x) as fractions of the latent (ConditioningSetAreaPercentage),
                 resolved to ``area`` at sampling time; at most one of area / area_fraction set.
    mask_strength: multiplies ``mask`` (ConditioningSetMask's strength).
    set_area_to_bounds: the cond's area is the bounding box of its mask (min 8 latent px).
    concat_latent: [B, C, h, w] unscaled latent an inpaint model gets as its masked image instead
                 of the sampled latent (InpaintModelConditioning), or None.
    concat_mask: [B, 1, H, W] mask (any size) an inpaint model gets instead of the noise mask.
    unclip:      ``UnclipEntry``s (unCLIPConditioning), in order; () = none.
    gligen:      GLIGEN text boxes (``adapters.gligen.GligenBoxes``: the model and its boxes), or None.
    concat_image: [B, 3, h, w] low-resolution image in [-1, 1] the x4 upscaler gets as its extra
                 input channels (SD_4XUpscale_Conditioning), or None.
    noise_augmentation: how much that image is noised, 0..1 (x4 upscaler; noise level
                 round(350 · value) is also the UNet's class label).
    hooks:       weight hooks (``payloads.hooks.HookGroup``) the UNet applies while evaluating
                 this cond (ComfyUI's ``hooks``), or None.
    clip_range:  (start_percent, end_percent) of the CLIP hook schedule this cond was encoded
                 for (ComfyUI's clip_start/end_percent), intersected with ``timestep_range``.
    default:     a default cond (ConditioningSetDefaultCombine): evaluated only where the other
                 conds of its list leave weight uncovered, with that remaining weight.
    controlnet_cross_attn: [1, T, D] text hidden states the ControlNets of this cond read instead
                 of ``cross_attn`` (CLIPTextEncodeControlnet; ComfyUI's ``cross_attn_controlnet``);
                 the UNet keeps ``cross_attn``. None: the ControlNets read ``cross_attn``.
    controlnet_pooled: [1, P] the pooled embedding of that text (ComfyUI's
                 ``pooled_output_controlnet``); carried and saved, read by no SD-family model
                 (as in ComfyUI, whose SD ControlNets take the UNet's y).
    model_inputs: the entries a model family reads beside the text, under ComfyUI's key names
                 (Flux's ``guidance``, ``attention_mask``, ``reference_latents``, a custom
                 pack's Lumina entries, ...); the family's runner says which it reads
                 (``FamilyRunner.cond_inputs``). Every key of a ComfyUI cond dict that no field
                 above takes lands here and goes back out as a dict key, so entries travel
                 through custom nodes both ways. A plain dict (the output cache's codec stores
                 dicts), copied on construction, never changed afterwards; left out of the
                 Cond's hash.
    """

    cross_attn: torch.Tensor | None
    pooled: torch.Tensor | None = None
    area: tuple[int, int, int, int] | None = None
    strength: float = 1.0
    mask: torch.Tensor | None = None
    control: ControlLike | None = None
    control_apply_to_uncond: bool = False
    size: SizeCond | None = None
    timestep_range: tuple[float, float] = (0.0, 1.0)
    area_fraction: tuple[float, float, float, float] | None = None
    mask_strength: float = 1.0
    set_area_to_bounds: bool = False
    concat_latent: torch.Tensor | None = None
    concat_mask: torch.Tensor | None = None
    unclip: tuple = ()
    gligen: object | None = None
    concat_image: torch.Tensor | None = None
    noise_augmentation: float = 0.0
    hooks: object | None = None
    clip_range: tuple[float, float] | None = None
    default: bool = False
    controlnet_cross_attn: torch.Tensor | None = None
    controlnet_pooled: torch.Tensor | None = None
    model_inputs: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        # One private dict per Cond: a caller's mapping (or a MappingProxy) is copied, so a later
        # change to it cannot reach this immutable payload.
        inputs = self.model_inputs
        if type(inputs) is not dict or inputs:
            object.__setattr__(self, "model_inputs", dict(inputs))


Conditioning = tuple[Cond, ...]

# ComfyUI's ``[[None, {}]]``: one cond without text, evaluated with no cross-attention context
# (DualModelGuider's "text-free (image-only) unconditional pass").
TEXT_FREE: Conditioning = (Cond(None),)
