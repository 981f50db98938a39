"""The sampler seam of the NextDiT families: what a cond gives the model beside its tokens, and
the model call (``base.FamilyRunner``).

A cond's caption mask travels in ``Cond.model_inputs["attention_mask"]`` [1, T] (ComfyUI's cond
key; 1 = a token, 0 = padding), and the runner always hands the model one, all ones when the cond
has none. That keeps conds of different token counts out of one model batch (their masks differ
in shape), as ComfyUI's ``CONDRegular`` keeps them apart: the denoiser's batching repeats a
shorter context to a common length, which leaves cross-attention unchanged but would add caption
tokens to this single-stream model. The number of tokens ComfyUI passes beside the mask
(``num_tokens``, the mask's sum) is what the model reads off the mask itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

__all__ = ["NextDiTRunner", "caption_mask"]


def caption_mask(cond) -> Tensor | None:
    """The cond's caption mask as float [1, T] (ones when it carries none); None for a text-free
    cond."""
    if cond.cross_attn is None:
        return None
    tokens = cond.cross_attn.shape[1]
    mask = cond.model_inputs.get("attention_mask")
    if mask is None:
        return torch.ones(1, tokens)
    mask = torch.as_tensor(mask).float()
    mask = mask.reshape(-1, mask.shape[-1])[:1]  # [1, T']
    if mask.shape[-1] > tokens:
        raise ValueError(f"the cond's attention_mask covers {mask.shape[-1]} tokens; its text has {tokens}")
    # ConditioningConcat appends another cond's tokens and keeps the first one's mask: those are real
    return torch.cat([mask, torch.ones(1, tokens - mask.shape[-1])], dim=1)  # [1, T]


class NextDiTRunner:
    """``base.FamilyRunner`` for ``nextdit.NextDiT`` (Lumina 2, Z-Image)."""

    def __init__(self, handle, module: nn.Module, policy, display: str):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.display = display
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.in_channels
        self.sampler_patches = handle.sampler_patches
        self.sampling = handle.sampling  # the family's Sampling with the handle's pins

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        width = self.handle.config.cap_feat_dim
        if cond.cross_attn is not None and cond.cross_attn.shape[-1] != width:
            raise ValueError(f"{self.display}: text features {cond.cross_attn.shape[-1]} wide; the model takes "
                             f"{width} (load the text encoder this model pairs with)")
        mask = caption_mask(cond)
        return {} if mask is None else {"attention_mask": mask}

    def context_free_refusal(self) -> str | None:
        if self.handle.config.pad_tokens_multiple is None:
            return f"{self.display} reads its caption tokens in every pass and has no empty-caption form"
        return None  # Z-Image runs a text-free pass on its learned caption pad tokens (as ComfyUI)

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        if control is not None or patches:
            raise NotImplementedError(f"{self.display}: ControlNets and model patches: not supported yet")
        return self.model(x, timestep, context, inputs.get("attention_mask"))
