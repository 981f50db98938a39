"""Skip-layer guidance (ComfyUI's SkipLayerGuidanceSD3 / SkipLayerGuidanceDiT, "SLG";
experimental guidance by Dango233 at Stability AI, in the spirit of Ahn et al. 2024, "Perturbed
Attention Guidance", arXiv:2403.17377): a post-CFG sampler patch (``cfg_patches.py`` contract)
that, while σ is in (σ_end, σ_start], evaluates the positive prompt again with some transformer
blocks left out (``models/block_skip.SkipBlocks``) and pushes the guided x0 away from that
prediction: x0 + (cond − cond_skipped)·scale.

Which blocks a model can leave out is its runner's to say (``skippable_blocks``); a model with no
blocks of the kind is refused by name (ComfyUI would run the extra evaluation to no effect).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import Tensor

from mixgraph.nodes.models.block_skip import SkipBlocks

from .cfg_patches import GuidanceArgs

__all__ = ["SkipLayerGuidance", "parse_layers"]


def parse_layers(text: str) -> tuple[int, ...]:
    """The block indices of a layers string ("7, 8, 9"): every run of digits, as ComfyUI reads it."""
    return tuple(int(n) for n in re.findall(r"\d+", text))


@dataclass(frozen=True)
class SkipLayerGuidance:
    """Post-CFG: x0 + (cond − cond with the ``skips`` left out)·scale while
    sigma_end < σ ≤ sigma_start (σ of the batch's first entry, as ComfyUI reads it); then, when
    ``rescaling_scale`` ≠ 0, the result scaled by rescaling_scale·std(cond)/std(result) +
    (1 − rescaling_scale) (SkipLayerGuidanceDiT's rescaling, stds over the whole batch).
    ``skips``: (block kind, indices) pairs; kinds the model lacks are left alone (as ComfyUI
    ignores replacements no block asks for), but a model with none of them is refused."""

    skips: tuple[tuple[str, tuple[int, ...]], ...]
    scale: float
    sigma_start: float
    sigma_end: float
    rescaling_scale: float = 0.0
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        sigma = float(a.sigma.reshape(-1)[0])
        if not (self.scale > 0 and self.sigma_end < sigma <= self.sigma_start):
            return denoised
        blocks = getattr(a.model, "skippable_blocks", None) or {}
        kinds = [kind for kind, indices in self.skips if indices]
        if not any(kind in blocks for kind in kinds):
            what = getattr(a.model, "kind", None) or type(a.model).__name__
            raise NotImplementedError(
                f"skip-layer guidance: this model ({what}) has no {' or '.join(kinds)} blocks to skip"
                + (f" (it has {', '.join(blocks)})" if blocks else "") + ": not supported yet")
        skipped = a.evaluate(tuple(SkipBlocks(kind, indices) for kind, indices in self.skips if indices))
        out = denoised + (a.cond_denoised - skipped) * self.scale
        if self.rescaling_scale != 0:
            factor = a.cond_denoised.std() / out.std()
            out = out * (self.rescaling_scale * factor + (1 - self.rescaling_scale))
        return out
