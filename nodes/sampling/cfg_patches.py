"""Sampler patches: guidance that replaces or follows the CFG formula inside the denoiser
(ComfyUI's ``sampler_cfg_function`` / ``sampler_post_cfg_function`` model options).

A MODEL handle carries them in ``sampler_patches``; ``CFGDenoiser`` hands each evaluation to
``guide``. A patch is a frozen dataclass with ``stage``:

* "cfg":      ``combine(a: GuidanceArgs) -> Tensor`` replaces ``uncond + (cond − uncond)·scale``;
              the last such patch wins (ComfyUI keeps one cfg function, the last set).
* "post_cfg": ``post(a, denoised) -> Tensor`` refines the guided x0, in patch order.
* "pre_cfg":  ``pre(a) -> (cond, uncond)`` rewrites the two predictions before the CFG formula,
              in patch order (ComfyUI's ``sampler_pre_cfg_function``; ``a.n_outputs`` is the
              length of ComfyUI's prediction list, 3 under PerpNegGuider). Every one runs, also
              when the negative was not evaluated (CFG at cfg = 1, Perp-Neg at neg_scale = 0):
              ComfyUI calls every ``sampler_pre_cfg_function`` then, with zeros for the negative's
              prediction and ``None`` for its conds. ``a.has_uncond`` is False there; a patch whose
              ComfyUI function returns its input unchanged when ``None in conds[:2]`` (TCFG,
              FreSca) checks it, one that does not (APG, LatentApplyOperationCFG) works on zeros.
* "cfg_scale": ``scale(sigma: float, cfg: float) -> float`` replaces the guider's cfg at that
              sigma, in patch order (ComfyUI's CFGOverride wrapper; see ``cfg_at``); it also
              decides the cfg = 1 shortcut.
* "denoise_mask": ``mask(sigma, mask, sigmas, model_sampling) -> Tensor`` rewrites the inpaint
              noise mask before each model call (ComfyUI's ``denoise_mask_function``); applied by
              ``ksampler.InpaintDenoiser``, never by ``guide``.
* "step_cache": EasyCache / LazyCache settings (``step_cache.py``), turned into per-run state by
              ``ksampler.sample_custom`` (``step_cache.attach``), never by ``guide``.

A patch with ``needs_uncond = True`` turns off the cfg = 1 shortcut (the negative is always
evaluated). Per-run state (APG's momentum) lives in ``GuidanceArgs.state``, a dict the denoiser
owns (one per sampling run), keyed by the patch: a patch object itself is shared by every run
of every handle that carries it, so it must hold no state.

All tensors are x0 (denoised) predictions, [B, C, H, W] float32. At cfg = 1 the negative is not
evaluated and ``uncond_denoised`` is zeros, as in ComfyUI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mixgraph.nodes.families.sd.unet_patches import AttentionRecorder, IdentityAttention

__all__ = ["GuidanceArgs", "last_patch", "guide", "run_pre_cfg", "post_cfg", "cfg_at", "RescaleCFG", "CFGZeroStar", "PerturbedAttentionGuidance", "APG",
           "TangentialDampingCFG", "SelfAttentionGuidance", "DifferentialDiffusion", "needs_uncond",
           "denoise_mask_patches", "gaussian_blur_2d", "sag_blur_map"]


@dataclass
class GuidanceArgs:
    x: Tensor  # [B, C, H, W] the noisy sample the denoiser was called with
    sigma: Tensor  # [B]
    cond_scale: float
    cond_denoised: Tensor
    uncond_denoised: Tensor
    # the positive prompt's x0 re-evaluated with extra forward-time UNet patches
    evaluate: Callable[[Sequence], Tensor]
    # the negative prompt's x0 at another input x, with extra forward-time UNet patches
    evaluate_negative: Callable[[Tensor, Sequence], Tensor] | None = None
    # per-sampling-run state, owned by the denoiser; keyed by patch
    state: dict = field(default_factory=dict)
    has_uncond: bool = True  # False when cfg = 1 skipped the negative (uncond_denoised is zeros)
    # x0 of another CONDITIONING (a tuple of Cond, treated as a negative prompt) at x
    evaluate_conds: Callable[[Sequence], Tensor] | None = None
    # how many predictions ComfyUI's ``conds_out`` list holds for the pre-CFG patches: 2 (cond,
    # uncond) for CFG; 3 for PerpNegGuider ([positive, negative, empty]; the empty one is never
    # rewritten by a pre-CFG patch here, as by ComfyUI's, but a patch may branch on the length)
    n_outputs: int = 2
    # the runner being sampled (``families.base.FamilyRunner``), for patches that ask what the
    # model offers (skip-layer guidance: its ``skippable_blocks``)
    model: Any = None


def needs_uncond(patches: Sequence) -> bool:
    return any(getattr(p, "needs_uncond", False) for p in patches)


def cfg_at(patches: Sequence, sigma, cfg: float) -> float:
    """The cfg the guider uses at ``sigma`` (a float or a [B] tensor; its first entry counts)."""
    stages = [p for p in patches if p.stage == "cfg_scale"]
    if not stages:
        return cfg
    s = float(torch.as_tensor(sigma).reshape(-1)[0])
    for p in stages:
        cfg = p.scale(s, cfg)
    return cfg


def last_patch(patches: Sequence, stage: str):
    """The last sampler patch of ``stage`` (a later one replaces an earlier one), or None."""
    return next((p for p in reversed(tuple(patches)) if getattr(p, "stage", None) == stage), None)


def denoise_mask_patches(patches: Sequence) -> tuple:
    return tuple(p for p in patches if p.stage == "denoise_mask")


def guide(patches: Sequence, a: GuidanceArgs, pre: bool = True) -> Tensor:
    """ComfyUI's ``sampling_function`` + ``cfg_function`` on x0 predictions: the pre-CFG patches
    (unless ``pre`` is False: ``cfg_function`` alone, as DualCFGGuider calls it), the CFG formula
    or the last "cfg" patch, then the post-CFG patches."""
    if pre:
        run_pre_cfg(patches, a)
    stages = [p for p in patches if p.stage == "cfg"]
    if stages:
        denoised = stages[-1].combine(a)
    else:
        denoised = a.uncond_denoised + (a.cond_denoised - a.uncond_denoised) * a.cond_scale
    return post_cfg(patches, a, denoised)


def run_pre_cfg(patches: Sequence, a: GuidanceArgs) -> None:
    """The pre-CFG patches, in order, rewriting ``a.cond_denoised`` / ``a.uncond_denoised``; all of
    them, also without a negative (``a.has_uncond`` False, uncond zeros), as ComfyUI's
    ``sampling_function`` and PerpNegGuider call them."""
    for p in patches:
        if p.stage == "pre_cfg":
            a.cond_denoised, a.uncond_denoised = p.pre(a)


def post_cfg(patches: Sequence, a: GuidanceArgs, denoised: Tensor) -> Tensor:
    """The post-CFG patches, in order, refining the guided x0 ``denoised``."""
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


def _project(v0: Tensor, v1: Tensor) -> tuple[Tensor, Tensor]:
    """(parallel, orthogonal) parts of v0 relative to v1, per sample over (C, H, W)."""
    dims = tuple(range(1, v0.ndim))
    unit = F.normalize(v1, dim=dims)
    parallel = (v0 * unit).sum(dim=dims, keepdim=True) * unit
    return parallel, v0 - parallel


@dataclass(frozen=True)
class APG:
    """Adaptive projected guidance (Sadat et al. 2024, "Eliminating Oversaturation and Artifacts
    of High Guidance Scales in Diffusion Models", Algorithm 1), ComfyUI's APG node. The guidance
    g = cond − uncond is (momentum ≠ 0; ComfyUI's V3 node takes −5 … 1, the paper's negative
    momentum included) replaced by the running average ḡ ← momentum·ḡ + g, whose state restarts
    when σ rises, (norm_threshold > 0) shrunk to at most that L2 norm per sample,
    split into the part parallel to cond and the orthogonal part, and recombined as
    orthogonal + eta·parallel. The conditional prediction handed to CFG is then
    uncond + g' + (cond − uncond)/cfg, so CFG yields cond + (cfg − 1)·g' (the paper's update).
    The running average is kept in the denoiser's per-run state, never across runs.

    Without a negative (cfg = 1, ``a.has_uncond`` False) it runs on uncond = 0, as ComfyUI's
    function (which has no guard for that case) does: g = cond, so the result is
    cond + eta·g' with g' = cond shrunk to the norm threshold, not cond."""

    eta: float
    norm_threshold: float
    momentum: float
    stage: str = "pre_cfg"

    def pre(self, a: GuidanceArgs) -> tuple[Tensor, Tensor]:
        cond, uncond = a.cond_denoised, a.uncond_denoised
        sigma = float(torch.as_tensor(a.sigma).reshape(-1)[0])
        st = a.state.setdefault(self, {"avg": None, "prev_sigma": None})
        if st["prev_sigma"] is not None and sigma > st["prev_sigma"]:
            st["avg"] = None
        st["prev_sigma"] = sigma
        g = cond - uncond
        if self.momentum != 0:
            st["avg"] = g if st["avg"] is None else self.momentum * st["avg"] + g
            g = st["avg"]
        if self.norm_threshold > 0:
            norm = g.norm(p=2, dim=tuple(range(1, g.ndim)), keepdim=True)
            g = g * torch.minimum(torch.ones_like(norm), self.norm_threshold / norm)
        parallel, orthogonal = _project(g, cond)
        g = orthogonal + self.eta * parallel
        return uncond + g + (cond - uncond) / a.cond_scale, uncond


@dataclass(frozen=True)
class TangentialDampingCFG:
    """TCFG (Kwon et al. 2025, "TCFG: Tangential Damping Classifier-free Guidance",
    arXiv:2503.18137): the unconditional score x − uncond is replaced by its projection onto the
    first right singular vector of the per-sample 2×N matrix [uncond score; cond score].
    Without a negative (``a.has_uncond`` False) it leaves both predictions as they are (ComfyUI's
    function returns its input when ``None in conds[:2]``)."""

    stage: str = "pre_cfg"

    def pre(self, a: GuidanceArgs) -> tuple[Tensor, Tensor]:
        if not a.has_uncond:
            return a.cond_denoised, a.uncond_denoised
        x, cond, uncond = a.x, a.cond_denoised, a.uncond_denoised
        b = x.shape[0]
        c_score = (x - cond).reshape(b, 1, -1).float()
        u_score = (x - uncond).reshape(b, 1, -1).float()
        _, _, vh = torch.linalg.svd(torch.cat((u_score, c_score), dim=1), full_matrices=False)
        v1 = vh[:, :1, :]  # [B, 1, N]
        damped = (u_score @ v1.transpose(-2, -1)) * v1
        return cond, x - damped.reshape_as(uncond).to(uncond.dtype)


def gaussian_blur_2d(img: Tensor, kernel_size: int, sigma: float) -> Tensor:
    """Separable-normalised Gaussian (outer product of a normalised 1-D kernel sampled at
    −(k−1)/2..(k−1)/2), reflect padding, per channel."""
    half = (kernel_size - 1) * 0.5
    t = torch.linspace(-half, half, steps=kernel_size)
    pdf = torch.exp(-0.5 * (t / sigma) ** 2)
    k1 = (pdf / pdf.sum()).to(device=img.device, dtype=img.dtype)
    k2 = (k1[:, None] * k1[None, :]).expand(img.shape[-3], 1, kernel_size, kernel_size)
    pad = kernel_size // 2
    return F.conv2d(F.pad(img, [pad] * 4, mode="reflect"), k2, groups=img.shape[-3])


def sag_blur_map(x0: Tensor, attn: Tensor, sigma: float, threshold: float = 1.0) -> Tensor:
    """SAG's degraded x0: where the self-attention a key receives, summed over queries and
    averaged over heads, exceeds ``threshold``, x0 is replaced by its Gaussian blur (kernel 9).
    ``attn``: [B·heads, T, T] softmax probabilities of the middle block at (H/r)×(W/r) tokens."""
    _, hw1, hw2 = attn.shape
    b, _, lh, lw = x0.shape
    probs = attn.reshape(b, -1, hw1, hw2)
    mask = probs.mean(1).sum(1) > threshold  # [B, T]
    ratio = 2 ** (math.ceil(math.sqrt(lh * lw / hw1)) - 1).bit_length()
    mid = [math.ceil(lh / ratio), math.ceil(lw / ratio)]
    mask = mask.reshape(b, *mid).unsqueeze(1).to(x0.dtype)
    mask = F.interpolate(mask, (lh, lw))  # nearest
    blurred = gaussian_blur_2d(x0, kernel_size=9, sigma=sigma)
    return blurred * mask + x0 * (1 - mask)


@dataclass(frozen=True)
class SelfAttentionGuidance:
    """SAG (Hong et al. 2023, "Improving Sample Quality of Diffusion Models Using Self-Attention
    Guidance"): the unconditional x0 is blurred where the middle block's self-attention is
    concentrated (``sag_blur_map``), re-noised with the same noise (degraded + x − uncond),
    evaluated on the negative prompt again, and the guided x0 moves by
    (degraded − that prediction)·scale. The attention probabilities come from the unconditional
    evaluation at x with an ``AttentionRecorder`` on the middle block's attn1 (one extra UNet call
    per step: the main batched call is left untouched). Latents with a side ≤ 4 are left alone."""

    scale: float
    blur_sigma: float
    stage: str = "post_cfg"
    needs_uncond: bool = True

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        if self.scale == 0 or min(denoised.shape[2:]) <= 4 or a.evaluate_negative is None:
            return denoised
        sink: list = []
        recorder = AttentionRecorder("attn1", ("middle", 0), sink)
        a.evaluate_negative(a.x, (recorder,))
        if not sink:
            return denoised  # no self-attention in the middle block
        uncond = a.uncond_denoised
        degraded = sag_blur_map(uncond, sink[-1], self.blur_sigma, 1.0)
        sag = a.evaluate_negative(degraded + a.x - uncond, ())
        return denoised + (degraded - sag) * self.scale


@dataclass(frozen=True)
class DifferentialDiffusion:
    """Differential diffusion (Levin & Fried 2023, "Differential Diffusion: Giving Each Pixel
    Its Strength"): at each model call the soft inpaint mask becomes the binary mask
    mask ≥ (t − t_to)/(t_from − t_to), t the current timestep, t_from the first step's and
    t_to that of max(last sigma, σ_min); strength < 1 blends the binary mask with the soft one."""

    strength: float = 1.0
    stage: str = "denoise_mask"

    def mask(self, sigma: Tensor, mask: Tensor, sigmas: Tensor, ms) -> Tensor:
        sigma_to = ms.sigma_min
        if sigmas[-1] > sigma_to:
            sigma_to = sigmas[-1]
        ts_from = ms.timestep(torch.as_tensor(sigmas[0]))
        ts_to = ms.timestep(torch.as_tensor(sigma_to))
        current = ms.timestep(torch.as_tensor(sigma).reshape(-1)[0])
        threshold = (current - ts_to) / (ts_from - ts_to)
        binary = (mask >= threshold.to(mask.device)).to(mask.dtype)
        if self.strength and self.strength < 1:
            return self.strength * binary + (1 - self.strength) * mask
        return binary
