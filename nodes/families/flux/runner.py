"""The Flux.1 / Chroma sampler seam (``base.FamilyRunner``): what a CONDITIONING entry gives the
model beside its text tokens, and the model call.

``cond_inputs`` (ComfyUI ``model_base.Flux.extra_conds`` / ``Chroma.extra_conds``):

* ``y``: the pooled CLIP-L vector [1, vec_in_dim] (zeros when the cond has none); Chroma has none;
* ``guidance``: ``Cond.model_inputs["guidance"]`` (FluxGuidance), default 3.5 (Chroma: 0); a
  cond whose guidance is None (FluxDisableGuidance) gives none, and the model adds no guidance
  embedding;
* ``ref_latent_<i>``: Kontext reference latents (ReferenceLatent's ``reference_latents``), in
  the model's latent space, and ``ref_method`` (ComfyUI's ``reference_latents_method``);
* ``txt_mask``: a text-token attention mask [1, T] (``model_inputs["attention_mask"]`` of two
  dims: T5 padding, Chroma);
* ``attn_mask``: an additive bias [1, T + N, T + N] over the joint [text; image] sequence
  (``model_inputs["attention_mask"]`` of three dims with its ``attention_mask_img_shape``:
  StyleModelApply's "attn_bias"), its image rows and columns stretched from the mask's image grid
  to the model's N = ceil(H/2)·ceil(W/2) image tokens (ComfyUI ``model_base.Flux.extra_conds`` →
  ``utils.upscale_dit_mask``); the model adds it to the attention scores of every double and
  single block. With Kontext reference latents the sequence holds their tokens too, which such
  a mask does not cover: refused by name.

``concat`` (ComfyUI ``model_base.Flux.concat_cond``): Canny / Depth take the control image latent
(the cond's InstructPixToPixConditioning latent; 16 more channels), Fill the masked image latent
and the mask folded 8 x 8 into 64 channels (80 more).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.families.flux.model import PATCH
from mixgraph.nodes.models.concat_cond import repeat_to_batch
from mixgraph.nodes.models.dit_mask import upscale_dit_mask
from mixgraph.nodes.models.resize import upscale

__all__ = ["FluxRunner", "REF_METHODS", "DEFAULT_GUIDANCE", "fill_concat", "control_concat", "joint_mask"]

DEFAULT_GUIDANCE = {"chroma": 0.0}  # others: 3.5 (ComfyUI's extra_conds defaults)
FLUX_GUIDANCE = 3.5
#: ComfyUI's ``reference_latents_method`` values, coded as the number the model input carries
REF_METHODS = ("offset", "index", "uxo")
FOLD = 8  # Fill: the pixel mask at 8x the latent size, each 8 x 8 block folded into channels


def control_concat(latent_image: Tensor, concat_latent: Tensor | None, latent_format) -> Tensor:
    """[B, C, H, W]: the cond's image latent (zeros without; ComfyUI's ``zeros_like(noise)``)
    resized to the latent (centre crop, bilinear) and taken into the model's latent space."""
    B, C, H, W = latent_image.shape
    image = torch.zeros_like(latent_image) if concat_latent is None else concat_latent.to(latent_image)
    image = upscale(image, W, H, "bilinear", "center")
    return latent_format.process_in(repeat_to_batch(image, B))


def fill_concat(latent_image: Tensor, denoise_mask: Tensor | None, concat_latent: Tensor | None,
                concat_mask: Tensor | None, latent_format) -> Tensor:
    """[B, C + 64, H, W]: the control-style image latent then the mask (the cond's, else the
    noise mask, else all ones; channel mean) resized to 8·H x 8·W and folded so that each 8 x 8
    pixel block becomes 64 channels of one latent pixel."""
    B, C, H, W = latent_image.shape
    image = control_concat(latent_image, concat_latent, latent_format)
    mask = concat_mask if concat_mask is not None else denoise_mask
    if mask is None:
        mask = torch.ones_like(latent_image[:, :1])
    mask = mask.to(latent_image)
    mask = mask.reshape(-1, 1, *mask.shape[-2:]) if mask.ndim != 4 else mask.mean(dim=1, keepdim=True)
    mask = upscale(mask, W * FOLD, H * FOLD, "bilinear", "center")  # [Bm, 1, 8H, 8W]
    b = mask.shape[0]
    mask = mask.view(b, H, FOLD, W, FOLD).permute(0, 2, 4, 1, 3).reshape(b, FOLD * FOLD, H, W)  # [Bm, 64, H, W]
    return torch.cat([image, repeat_to_batch(mask, B)], dim=1)


def joint_mask(mask: Tensor, img_shape, n_txt: int | None, latent_shape: tuple[int, ...]) -> Tensor:
    """A cond's joint attention bias [B, T + h·w, T + h·w] (text first, an h × w image grid:
    ``img_shape``) -> [1, T + N, T + N] float32 over the model's sequence, the image part
    stretched to the latent's token grid (ceil(H / 2), ceil(W / 2)), as ComfyUI's
    ``model_base.Flux.extra_conds``. Raises NotImplementedError naming the sizes when they do not fit."""
    hi, wi = (int(v) for v in img_shape) if img_shape is not None else (0, 0)
    if img_shape is None or n_txt is None or mask.shape[-1] != n_txt + hi * wi or mask.shape[-2] != mask.shape[-1]:
        raise NotImplementedError(
            f"Flux / Chroma: an attention_mask {list(mask.shape)} for {n_txt} text tokens"
            + (f" and an image grid {hi} x {wi}" if img_shape is not None else " without attention_mask_img_shape")
            + ": a text-token mask [1, T] or a joint bias [B, T + h*w, T + h*w] (text first) with its "
              "attention_mask_img_shape (h, w) is supported, not this one")
    h_tok, w_tok = -(-latent_shape[-2] // PATCH), -(-latent_shape[-1] // PATCH)
    out = upscale_dit_mask(mask[:1].float(), (hi, wi), (h_tok, w_tok))  # [1, T + N, T + N]
    return out


class FluxRunner:
    """``base.FamilyRunner`` for Flux.1 and Chroma (see the module docstring)."""

    def __init__(self, handle, module: torch.nn.Module, policy):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.config = handle.config
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.in_channels
        self.sampler_patches = handle.sampler_patches
        self.sampling: Sampling = handle.sampling

    def context_free_refusal(self) -> str | None:
        return ("Flux.1 / Chroma models attend jointly over text and image tokens and need a text "
                "context (connect a text encoding; ComfyUI stops here too)")

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        inputs: dict[str, Tensor] = {}
        extra = cond.model_inputs
        if self.kind != "chroma":
            width = self.config.vec_in_dim
            pooled = cond.pooled if cond.pooled is not None else torch.zeros(1, width)
            if pooled.shape[-1] < width:
                raise ValueError(f"Flux model: a {pooled.shape[-1]}-wide pooled text vector; it takes {width} "
                                 f"(CLIP-L's pooled output)")
            inputs["y"] = pooled[:1, :width].float()
        guidance = extra.get("guidance", DEFAULT_GUIDANCE.get(self.kind, FLUX_GUIDANCE))
        if guidance is not None:
            inputs["guidance"] = torch.tensor([float(guidance)])
        refs = extra.get("reference_latents") or ()
        for i, ref in enumerate(refs):
            inputs[f"ref_latent_{i}"] = self.latent_format.process_in(ref[:1].float())
        if refs:
            method = extra.get("reference_latents_method") or "offset"
            if method not in REF_METHODS:
                raise ValueError(f"reference_latents_method {method!r}: one of {', '.join(REF_METHODS)}")
            inputs["ref_method"] = torch.tensor([float(REF_METHODS.index(method))])
        mask = extra.get("attention_mask")
        if mask is not None:
            mask = torch.as_tensor(mask)
            n_txt = None if cond.cross_attn is None else cond.cross_attn.shape[1]
            if mask.ndim == 3:
                if refs:
                    raise NotImplementedError(
                        "Flux: a joint attention mask (StyleModelApply with strength_type attn_bias, e.g. Redux) "
                        "together with Kontext reference latents: the mask does not cover the reference tokens "
                        "(ComfyUI fails here too); not supported yet. Use strength_type multiply")
                inputs["attn_mask"] = joint_mask(mask, extra.get("attention_mask_img_shape"), n_txt, latent_shape)
            elif mask.ndim == 2 and n_txt is not None and mask.shape[-1] == n_txt:
                inputs["txt_mask"] = mask[:1].float()
            else:
                raise NotImplementedError(
                    f"Flux / Chroma: an attention_mask of shape {tuple(mask.shape)}: a text-token mask [1, T] "
                    f"over the cond's tokens or a joint [B, T + N, T + N] bias with its attention_mask_img_shape "
                    f"are supported, not this one")
        return inputs

    def concat(self, cond, latent_image: Tensor, denoise_mask: Tensor | None, seed: int) -> Tensor | None:
        """``base.FamilyRunner.concat``: by the model's input width beside the latent's C
        channels: C more (Canny / Depth), C + 64 more (Fill), none otherwise."""
        C = latent_image.shape[1]
        extra = self.in_channels - C
        if extra <= 0:
            return None
        if extra == C:
            return control_concat(latent_image, cond.concat_latent, self.latent_format)
        if extra == C + FOLD * FOLD:
            return fill_concat(latent_image, denoise_mask, cond.concat_latent, cond.concat_mask, self.latent_format)
        raise NotImplementedError(f"a Flux model with {self.in_channels} input channels and a {C}-channel latent: "
                                  f"only Canny / Depth ({2 * C}) and Fill ({2 * C + FOLD * FOLD}) are supported yet")

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        more = {"control": flux_control(control, self.kind)} if control is not None else {}
        if patches or self.handle.unet_patches:
            raise NotImplementedError("Flux / Chroma with UNet patches (FreeU, attention patches, ...): "
                                      "not supported yet")
        if context is None:
            raise ValueError(self.context_free_refusal())
        refs = [inputs[f"ref_latent_{i}"] for i in range(len(inputs)) if f"ref_latent_{i}" in inputs]
        method = REF_METHODS[int(inputs["ref_method"][0])] if refs else "offset"
        return self.model(x, timestep, context, y=inputs.get("y"), guidance=inputs.get("guidance"),
                          ref_latents=refs, ref_method=method, txt_mask=inputs.get("txt_mask"),
                          attn_mask=inputs.get("attn_mask"), **more)


def flux_control(control, kind: str) -> tuple[list, list]:
    """A ``Control``'s per-double-block (``input``) and per-single-block (``output``) residuals
    (Flux ControlNets, ``adapters/flux_controlnet.py``); UNet nets and Chroma are refused by name."""
    if kind == "chroma":
        raise NotImplementedError("Chroma with ControlNets: not supported yet")
    if control.middle is not None or control.input_path or any(t is not None and t.ndim != 3 for t in control.input):
        raise ValueError("Flux model with an SD 1.x / SDXL ControlNet or T2I-Adapter: use a ControlNet made for Flux")
    return list(control.input), list(control.output)
