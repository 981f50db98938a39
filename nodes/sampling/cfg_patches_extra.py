"""More sampler patches in the contract of ``cfg_patches.py`` (stages "pre_cfg", "cfg",
"post_cfg", "cfg_scale"): ComfyUI's CFGNorm (nodes_cfg.py), Mahiro (nodes_mahiro.py), FreSca
(nodes_fresca.py), the deprecated PerpNeg model patch (nodes_perpneg.py), CFGOverride
(nodes_custom_sampler.py), LatentApplyOperationCFG (nodes_latent.py), TangentialAmplifyingGuidance
(nodes_tag.py) and RenormCFG (nodes_lumina2.py).

All tensors are x0 (denoised) predictions [B, C, H, W] unless a docstring says noise space
(x − x0, what ComfyUI hands a ``sampler_cfg_function`` as "cond"/"uncond").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .cfg_patches import GuidanceArgs
from .guidance import perp_neg

__all__ = ["CFGNorm", "CFGNormPreCFG", "Mahiro", "FreSca", "fourier_filter", "PerpNegPatch",
           "CFGOverride", "LatentOperationCFG", "TangentialAmplify", "RenormCFG"]


@dataclass(frozen=True)
class CFGNorm:
    """ComfyUI's CFGNorm (post-CFG): the guided x0 is scaled, per pixel, by
    min(1, ‖cond‖ / (‖guided‖ + 1e-8)) (norms over channels), then by ``strength``. With
    strength ≤ 1 it can only attenuate; above 1 a non-finite result is an error, not a black
    image (ComfyUI raises too)."""

    strength: float
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        scale = (a.cond_denoised.norm(dim=1, keepdim=True) / (denoised.norm(dim=1, keepdim=True) + 1e-8))
        out = denoised * scale.clamp(0.0, 1.0) * self.strength
        if self.strength > 1.0 and not torch.isfinite(out).all():
            raise RuntimeError(f"CFGNorm: strength={self.strength} made the denoised prediction "
                               f"non-finite (values above 1 amplify the prediction on every step); "
                               f"use a strength of at most 1")
        return out


@dataclass(frozen=True)
class CFGNormPreCFG:
    """CFGNorm with ``pre_cfg``: replaces the CFG formula. In noise space (ε = x − x0) the combined
    ε_cfg = ε_u + s·(ε_c − ε_u) is rescaled per pixel to ‖ε_c‖ (norms over channels; left as is
    where ‖ε_cfg‖ = 0), without clamping, then blended with ε_cfg by ``strength``."""

    strength: float
    stage: str = "cfg"

    def combine(self, a: GuidanceArgs) -> Tensor:
        cond, uncond = a.x - a.cond_denoised, a.x - a.uncond_denoised
        comb = uncond + a.cond_scale * (cond - uncond)
        cond_norm = torch.linalg.vector_norm(cond, dim=1, keepdim=True)
        comb_norm = torch.linalg.vector_norm(comb, dim=1, keepdim=True)
        ratio = torch.where(comb_norm > 0, cond_norm / comb_norm.clamp_min(1e-12), torch.ones_like(comb_norm))
        eps = comb * ratio
        if self.strength != 1.0:
            eps = self.strength * eps + (1.0 - self.strength) * comb
        return a.x - eps


@dataclass(frozen=True)
class Mahiro:
    """ComfyUI's Mahiro (post-CFG): leans the guided x0 toward the "naive leap" s·cond. With
    m = (s·cond + cfg)/2 and the signed square roots √|v|·sign(v) of s·uncond and m, their cosine
    similarity over channels averaged over pixels and batch gives w = 2·(sim + 1) ∈ [0, 4]; the
    result is (w·cfg + (4 − w)·s·cond)/4."""

    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        leap = a.cond_denoised * a.cond_scale
        u_leap = a.uncond_denoised * a.cond_scale
        merge = (leap + denoised) / 2
        norm_u = torch.sqrt(u_leap.abs()) * u_leap.sign()
        norm_m = torch.sqrt(merge.abs()) * merge.sign()
        w = 2 * (F.cosine_similarity(norm_u, norm_m, dim=1).mean() + 1)
        return (w * denoised + (4 - w) * leap) / 4


def fourier_filter(x: Tensor, scale_low: float, scale_high: float, freq_cutoff: int) -> Tensor:
    """FreSca's filter (Huang et al. 2025, "FreSca: Unveiling the Scaling Space in Diffusion
    Models"): the centred 2-D spectrum of x [B, C, H, W] is scaled by ``scale_low`` inside the
    box of ±min(freq_cutoff, n//2) bins around the centre of each spatial axis and by
    ``scale_high`` outside; computed in float32, returned in x's dtype."""
    spec = torch.fft.fftshift(torch.fft.fftn(x.to(torch.float32), dim=(-2, -1)), dim=(-2, -1))
    mask = torch.full(spec.shape, float(scale_high), device=x.device)
    box = mask
    for dim in (-2, -1):
        centre = spec.shape[dim] // 2
        half = min(int(freq_cutoff), centre)
        box = box.narrow(dim, centre - half, 2 * half)
    box.fill_(float(scale_low))
    out = torch.fft.ifftn(torch.fft.ifftshift(spec * mask, dim=(-2, -1)), dim=(-2, -1)).real
    return out.to(x.dtype)


@dataclass(frozen=True)
class FreSca:
    """ComfyUI's FreSca (pre-CFG): the guidance cond − uncond goes through ``fourier_filter``;
    the conditional prediction becomes uncond + filtered guidance. Without a negative
    (``a.has_uncond`` False: cfg = 1, or Perp-Neg at neg_scale = 0) both predictions pass
    unchanged, as ComfyUI 0.38.1's function returns its input when ``None in conds[:2]``."""

    scale_low: float
    scale_high: float
    freq_cutoff: int
    stage: str = "pre_cfg"

    def pre(self, a: GuidanceArgs) -> tuple[Tensor, Tensor]:
        if not a.has_uncond:
            return a.cond_denoised, a.uncond_denoised
        g = fourier_filter(a.cond_denoised - a.uncond_denoised, self.scale_low, self.scale_high,
                           self.freq_cutoff)
        return a.uncond_denoised + g, a.uncond_denoised


@dataclass(frozen=True, eq=False)
class PerpNegPatch:
    """ComfyUI's deprecated PerpNeg model patch: replaces the CFG formula by Perp-Neg (Armandpour
    et al. 2023, the ``guidance.perp_neg`` combination PerpNegGuider uses) with the empty prompt
    ``empty`` (a CONDITIONING) evaluated at every step as a third prediction. Compared by
    identity (it holds tensors)."""

    empty: tuple
    neg_scale: float
    stage: str = "cfg"

    def combine(self, a: GuidanceArgs) -> Tensor:
        if a.evaluate_conds is None:
            raise NotImplementedError("PerpNeg: this guider cannot evaluate an extra conditioning; "
                                      "use PerpNegGuider")
        empty = a.evaluate_conds(self.empty)
        return perp_neg(a.cond_denoised, a.uncond_denoised, empty, self.neg_scale, a.cond_scale)


@dataclass(frozen=True)
class CFGOverride:
    """ComfyUI's CFGOverride: the guider's cfg is ``cfg`` at the steps whose sigma lies in
    (sigma_low, sigma_high] (the node's end and start percent); with several overrides the last
    one applied to the model (the one nearest the sampler) wins where they overlap. The override
    also decides the cfg = 1 shortcut, as in ComfyUI."""

    cfg: float
    sigma_high: float
    sigma_low: float
    stage: str = "cfg_scale"

    def scale(self, sigma: float, cfg: float) -> float:
        return self.cfg if self.sigma_low < sigma <= self.sigma_high else cfg


@dataclass(frozen=True)
class LatentOperationCFG:
    """ComfyUI's LatentApplyOperationCFG (a ``sampler_pre_cfg_function``): a LATENT_OPERATION
    (``op(latent=[B, C, H, W]) -> tensor``) applied to the guidance direction,
    cond ← op(cond − uncond) + uncond, before the CFG formula. It also runs when cfg = 1 skipped
    the negative (as every pre-CFG patch): uncond is zeros there, as in ComfyUI, so cond ← op(cond).
    On a prediction list other than (cond, uncond) (PerpNegGuider's [positive, negative, empty])
    ComfyUI applies the operation to the positive alone, cond ← op(cond); so does this patch."""

    operation: object
    stage: str = "pre_cfg"

    def pre(self, a: GuidanceArgs) -> tuple[Tensor, Tensor]:
        uncond = a.uncond_denoised
        if a.n_outputs != 2:
            return self.operation(latent=a.cond_denoised), uncond
        return self.operation(latent=a.cond_denoised - uncond) + uncond, uncond


@dataclass(frozen=True)
class TangentialAmplify:
    """ComfyUI's TangentialAmplifyingGuidance (``comfy_extras/nodes_tag.py``, 110b1dc; Cho et al.
    2025, "Tangential Amplifying Guidance", arXiv:2510.04533, Algorithm 2), a post-CFG patch.
    With p the noisy input x and dx = guided x0 − p, dx is split into its radial part
    (dx·v)·v along v = p / (‖p‖ + 1e-8) and the tangential rest; the result is
    p + t_scale·tangential + r_scale·radial. Norms and dot products run per sample over the
    non-batch dimensions of size > 1. Active while sigma_low ≤ σ ≤ sigma_high (the node's
    end and start percent; the first sample's σ decides), else the guided x0 passes unchanged."""

    t_scale: float
    r_scale: float
    sigma_high: float
    sigma_low: float
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        s = float(torch.as_tensor(a.sigma).reshape(-1)[0])
        if not (self.sigma_low <= s <= self.sigma_high):
            return denoised
        p = a.x.to(denoised.dtype)
        dims = tuple(i + 1 for i, n in enumerate(denoised.shape[1:]) if n > 1)
        v = p / (p.norm(p=2, dim=dims, keepdim=True) + 1e-8)
        dx = denoised - p
        radial = (dx * v).sum(dim=dims, keepdim=True) * v
        return p + self.t_scale * (dx - radial) + self.r_scale * radial


@dataclass(frozen=True)
class RenormCFG:
    """ComfyUI's RenormCFG (``comfy_extras/nodes_lumina2.py``, 09494bc), a CFG-function patch.
    On the first ``in_channels`` channels of the x0 predictions: below ``cfg_trunc`` (compared
    with the first sample's σ, which ComfyUI hands its cfg functions as "timestep")
    e = u + s·(c − u), and with ``renorm_cfg`` > 0 e is scaled down to at most
    ‖c‖·renorm_cfg (L2 norm per sample over all non-batch dimensions; left as is when it is
    within); at or above ``cfg_trunc`` e = c. Channels past ``in_channels`` come from c. On SD
    models σ never reaches the default cfg_trunc of 100, so the clamped CFG always runs.

    ComfyUI compares the norms with a Python ``if`` on a tensor, which works at batch size 1
    only; here the clamp is decided per sample (the same result at batch 1)."""

    cfg_trunc: float
    renorm_cfg: float
    in_channels: int
    stage: str = "cfg"

    def combine(self, a: GuidanceArgs) -> Tensor:
        n = self.in_channels
        c, u = a.cond_denoised, a.uncond_denoised
        c_eps, rest = c[:, :n], c[:, n:]
        s = float(torch.as_tensor(a.sigma).reshape(-1)[0])
        if s < self.cfg_trunc:
            eps = u[:, :n] + a.cond_scale * (c_eps - u[:, :n])
            if self.renorm_cfg > 0.0:
                dims = tuple(range(1, eps.ndim))
                max_norm = torch.linalg.vector_norm(c_eps, dim=dims, keepdim=True) * self.renorm_cfg
                norm = torch.linalg.vector_norm(eps, dim=dims, keepdim=True)
                eps = torch.where(norm >= max_norm, eps * (max_norm / norm), eps)
        else:
            eps = c_eps
        return torch.cat([eps, rest], dim=1)
