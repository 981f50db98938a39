"""The SD3 / SD3.5 sampler seam (``base.FamilyRunner``): one precision-applied MMDiT with its
conditioning.

A cond gives the MMDiT its text tokens (``Cond.cross_attn``) and the pooled vector ``y``
(``Cond.pooled``: CLIP-L's and CLIP-G's pooled outputs side by side, 2048 wide in the full
model; zeros when the cond has none, ComfyUI's ``encode_adm`` input). The runner takes the
skip-layer guidance patch (``models/block_skip.SkipBlocks``) on its joint blocks
(``skippable_blocks``) and ControlNet residuals (``Control.output``, one per joint block, added
after it: ``adapters/sd35_controlnet.py``); other model patches are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from mixgraph.nodes.models.block_skip import SkipBlocks, skipped_blocks

__all__ = ["SD3Runner", "BLOCK_KIND"]

BLOCK_KIND = "double_block"  # ComfyUI's name for the joint blocks in ``patches_replace["dit"]``


class SD3Runner:
    """``base.FamilyRunner`` for ``mmdit.MMDiT``."""

    def __init__(self, handle, module: nn.Module, policy):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.prediction = handle.prediction
        self.zsnr = handle.zsnr
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.in_channels
        self.sampler_patches = handle.sampler_patches
        self.sampling = handle.sampling  # the family's flow schedule with the handle's pins
        self.skippable_blocks: Mapping[str, int] = {BLOCK_KIND: handle.config.depth}
        if handle.unet_patches:
            names = ", ".join(sorted({type(p).__name__ for p in handle.unet_patches}))
            raise NotImplementedError(f"SD3 / SD3.5 model with model patches ({names}): not supported yet")

    def context_free_refusal(self) -> str | None:
        return ("The MMDiT's joint blocks attend over text and image tokens together and need the "
                "text tokens (ComfyUI's SD3 model fails on a cond without them as well)")

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        """``base.FamilyRunner.cond_inputs``: the pooled text vector ``y`` [1, adm] when the model
        takes one (zeros when the cond has none)."""
        width = self.handle.config.adm_in_channels
        if width is None:
            return {}
        pooled = cond.pooled
        if pooled is None:
            return {"y": torch.zeros(1, width)}
        pooled = pooled.reshape(1, -1).float()
        if pooled.shape[-1] != width:
            raise ValueError(f"SD3 model: the cond's pooled text vector is {pooled.shape[-1]} wide; this model takes "
                             f"{width} (SD3: CLIP-L's 768 + CLIP-G's 1280; use its text encoders)")
        return {"y": pooled}

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        residuals = control_residuals(control)
        other = [p for p in patches if not isinstance(p, SkipBlocks)]
        if other:
            names = ", ".join(sorted({type(p).__name__ for p in other}))
            raise NotImplementedError(f"SD3 / SD3.5 model with the patches {names}: not supported yet")
        if context is None:
            raise ValueError("SD3 model: a cond without text tokens. " + self.context_free_refusal())
        want = self.handle.config.context_in
        if want is not None and context.shape[-1] != want:
            raise ValueError(f"SD3 model: text tokens {context.shape[-1]} wide; this model takes {want} "
                             f"(SD3: 4096, CLIP-L + CLIP-G padded to T5-XXL's width)")
        return self.model(x, timestep, context, inputs.get("y"), skip=skipped_blocks(patches, BLOCK_KIND),
                          control=residuals)


def control_residuals(control) -> list:
    """The per-joint-block residuals of a ``Control`` (``Control.output``: SD3 / SD3.5 ControlNets);
    UNet ControlNet residuals are refused by name."""
    if control is None:
        return []
    if control.input or control.middle is not None or control.input_path:
        raise ValueError("SD3 / SD3.5 model with an SD 1.x / SDXL ControlNet or T2I-Adapter: use a ControlNet made "
                         "for SD3 / SD3.5")
    return list(control.output)
