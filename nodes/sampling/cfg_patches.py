"""Sampler patches: guidance that replaces or follows the CFG formula inside the denoiser
(ComfyUI's ``sampler_cfg_function`` / ``sampler_post_cfg_function`` model options).

A MODEL handle carries them in ``sampler_patches``; ``CFGDenoiser`` hands each evaluation to
``guide``. A patch is a frozen dataclass with ``stage``:

* "cfg":      ``combine(a: GuidanceArgs) -> Tensor`` replaces ``uncond + (cond − uncond)·scale``;
              the last such patch wins (ComfyUI keeps one cfg function, the last set).
* "post_cfg": ``post(a, denoised) -> Tensor`` refines the guided x0, in patch order.

All tensors are x0 (denoised) predictions, [B, C, H, W] float32. At cfg = 1 the negative is not
evaluated and ``uncond_denoised`` is zeros, as in ComfyUI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from mixgraph.nodes.models.unet_patches import IdentityAttention

__all__ = ["GuidanceArgs", "guide", "RescaleCFG", "CFGZeroStar", "PerturbedAttentionGuidance"]


@dataclass
class GuidanceArgs:
    x: Tensor  # [B, C, H, W] the noisy sample the denoiser was called with
    sigma: Tensor  # [B]
    cond_scale: float
    cond_denoised: Tensor
    uncond_denoised: Tensor
    # the positive prompt's x0 re-evaluated with extra forward-time UNet patches
    evaluate: Callable[[Sequence], Tensor]


def guide(patches: Sequence, a: GuidanceArgs) -> Tensor:
    combine = [p for p in patches if p.stage == "cfg"]
    if combine:
        denoised = combine[-1].combine(a)
    else:
        denoised = a.uncond_denoised + (a.cond_denoised - a.uncond_denoised) * a.cond_scale
    for p in patches:
        if p.stage == "post_cfg":
            denoised = p.post(a, denoised)
    return denoised


def _view(sigma: Tensor, like: Tensor) -> Tensor:
    sigma = torch.as_tensor(sigma, dtype=like.dtype, device=like.device)
    return sigma.reshape(sigma.shape[:1] + (1,) * (like.ndim - 1)) if sigma.ndim else sigma


@dataclass(frozen=True)
class RescaleCFG:
    """Guidance rescaled to the conditional prediction's std, in v-prediction space, mixed with
    plain CFG by ``multiplier`` (Lin et al. 2023, "Common Diffusion Noise Schedules and Sample
    Steps are Flawed", sec. 3.4, eq. 15-16)."""

    multiplier: float
    stage: str = "cfg"

    def combine(self, a: GuidanceArgs) -> Tensor:
        x = a.x
        s = _view(a.sigma, x)
        xs = x / (s * s + 1.0)  # the v-space pivot
        root = (s**2 + 1.0) ** 0.5
        cond = (xs - a.cond_denoised) * root / s
        uncond = (xs - a.uncond_denoised) * root / s
        cfg = uncond + a.cond_scale * (cond - uncond)
        ro_pos = torch.std(cond, dim=tuple(range(1, cond.ndim)), keepdim=True)
        ro_cfg = torch.std(cfg, dim=tuple(range(1, cfg.ndim)), keepdim=True)
        final = self.multiplier * (cfg * (ro_pos / ro_cfg)) + (1.0 - self.multiplier) * cfg
        return xs - final * s / root


def _projection_scale(pos: Tensor, neg: Tensor) -> Tensor:
    """Per-sample ⟨pos, neg⟩ / (‖neg‖² + 1e-8), shaped to broadcast over pos."""
    p, n = pos.reshape(pos.shape[0], -1), neg.reshape(neg.shape[0], -1)
    st = (p * n).sum(dim=1, keepdim=True) / ((n**2).sum(dim=1, keepdim=True) + 1e-8)
    return st.reshape([pos.shape[0]] + [1] * (pos.ndim - 1))


@dataclass(frozen=True)
class CFGZeroStar:
    """CFG-Zero* optimized scale (Fan et al. 2025, "CFG-Zero*: Improved Classifier-Free Guidance
    for Flow Matching Models", eq. 8): the unconditional prediction is rescaled by the projection
    α of the conditional noise estimate onto the unconditional one."""

    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        alpha = _projection_scale(a.x - a.cond_denoised, a.x - a.uncond_denoised)
        u = a.uncond_denoised
        return denoised + u * (alpha - 1.0) + a.cond_scale * u * (1.0 - alpha)


@dataclass(frozen=True)
class PerturbedAttentionGuidance:
    """PAG (Ahn et al. 2024, arXiv:2403.17377): a second positive evaluation with the middle
    block's self-attention replaced by identity; guidance pushes away from it by ``scale``."""

    scale: float
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        if self.scale == 0:
            return denoised
        perturbed = a.evaluate((IdentityAttention("attn1", ("middle", 0)),))
        return denoised + (a.cond_denoised - perturbed) * self.scale
