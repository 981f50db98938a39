"""The Qwen-Image sampler seam (``base.FamilyRunner``): what a CONDITIONING entry gives the model
beside its text tokens, and the model call.

``cond_inputs`` (ComfyUI ``model_base.QwenImage.extra_conds``):

* ``ref_latent_<i>``: Qwen-Image-Edit's reference latents (``Cond.model_inputs
  ["reference_latents"]``: ReferenceLatent, TextEncodeQwenImageEdit(Plus)), each taken into the
  model's latent space (the Wan 2.1 format's ``process_in``), and ``ref_method`` (ComfyUI's
  ``reference_latents_method``, FluxKontextMultiReferenceLatentMethod; without one the model's
  ``default_ref_method``), coded as its place in ``model.REF_METHODS``;
* ``attention_mask``: the cond's text mask [1, T] (``Cond.model_inputs["attention_mask"]``, 1 = a
  token, 0 = padding) when it has one, as newer ComfyUI's ``model_base.QwenImage`` hands it on
  (comfyanonymous 003617c). The October 2025 one (Comfy-Org a125cd8) ignores it: its text
  encoder gives unpadded tokens, whose mask is all ones and changes nothing. A mask shorter than
  the tokens (ConditioningConcat keeps the first cond's) is extended with ones. Conds with masks
  batch only with conds of the same token count.

No pooled vector, no guidance. Conds without a mask share a batch as ComfyUI's
``CONDCrossAttn`` lets them: each repeated to a common length.

Skip-layer guidance may leave blocks out (``skippable_blocks``: its ``depth`` blocks, ComfyUI's
"double_block" kind); other model patches and ControlNets are refused by name.

The sampled latent may be 4-D [B, 16, H, W] (EmptySD3LatentImage) or ComfyUI's 5-D one-frame
[B, 16, 1, H, W]; the model returns the shape it was given.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.families.qwen_image.model import REF_METHODS
from mixgraph.nodes.models.block_skip import SkipBlocks, skipped_blocks

__all__ = ["QwenImageRunner", "text_mask"]

DISPLAY = "Qwen-Image"
BLOCK_KIND = "double_block"  # ComfyUI's name for its blocks in ``patches_replace["dit"]``


def text_mask(mask, tokens: int) -> Tensor:
    """A cond's ``attention_mask`` as float [1, T] over its ``tokens`` text tokens."""
    mask = torch.as_tensor(mask).float()
    mask = mask.reshape(-1, mask.shape[-1])[:1]  # [1, T']
    if mask.shape[-1] > tokens:
        raise ValueError(f"{DISPLAY}: the cond's attention_mask covers {mask.shape[-1]} tokens; its text has {tokens}")
    return torch.cat([mask, torch.ones(1, tokens - mask.shape[-1])], dim=1)  # [1, T]


class QwenImageRunner:
    """``base.FamilyRunner`` for ``model.QwenImage`` (see the module docstring)."""

    def __init__(self, handle, module: nn.Module, policy):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.config = handle.config
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.in_channels
        self.sampler_patches = handle.sampler_patches
        self.sampling: Sampling = handle.sampling  # the family's Sampling with the handle's pins
        self.skippable_blocks: Mapping[str, int] = {BLOCK_KIND: handle.config.depth}

    def context_free_refusal(self) -> str | None:
        return (f"{DISPLAY} attends jointly over text and image tokens and needs a text context "
                f"(connect a text encoding; ComfyUI stops here too)")

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        width = self.config.context_dim
        if cond.cross_attn is not None and cond.cross_attn.shape[-1] != width:
            raise ValueError(f"{DISPLAY}: text features {cond.cross_attn.shape[-1]} wide; the model takes {width} "
                             f"(load the Qwen2.5-VL 7B text encoder with CLIPLoader type qwen_image)")
        extra = cond.model_inputs
        inputs: dict[str, Tensor] = {}
        refs = extra.get("reference_latents") or ()
        for i, ref in enumerate(refs):
            ref = torch.as_tensor(ref)
            if ref.shape[1] != self.config.in_channels:
                raise ValueError(f"{DISPLAY}: a reference latent of {ref.shape[1]} channels; the model takes "
                                 f"{self.config.in_channels} (encode the image with the Qwen-Image / Wan 2.1 VAE)")
            inputs[f"ref_latent_{i}"] = self.latent_format.process_in(ref[:1].float())
        if refs:
            method = extra.get("reference_latents_method") or self.config.default_ref_method
            if method not in REF_METHODS:
                raise ValueError(f"{DISPLAY}: reference_latents_method {method!r}; one of {', '.join(REF_METHODS)}")
            inputs["ref_method"] = torch.tensor([float(REF_METHODS.index(method))])
        mask = extra.get("attention_mask")
        if mask is not None and cond.cross_attn is not None:
            inputs["attention_mask"] = text_mask(mask, cond.cross_attn.shape[1])
        return inputs

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        if control is not None:
            raise NotImplementedError(f"{DISPLAY} with ControlNets: not supported yet")
        other = [p for p in patches if not isinstance(p, SkipBlocks)]
        if other or self.handle.unet_patches:
            names = ", ".join(sorted({type(p).__name__ for p in [*other, *self.handle.unet_patches]}))
            raise NotImplementedError(f"{DISPLAY} with model patches ({names}): not supported yet")
        if context is None:
            raise ValueError(self.context_free_refusal())
        refs = []
        while f"ref_latent_{len(refs)}" in inputs:
            refs.append(inputs[f"ref_latent_{len(refs)}"])
        method = REF_METHODS[int(inputs["ref_method"][0])] if refs else None
        return self.model(x, timestep, context, ref_latents=refs, ref_method=method,
                          skip=skipped_blocks(patches, BLOCK_KIND), txt_mask=inputs.get("attention_mask"))
