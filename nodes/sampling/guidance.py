"""Guidance rules beyond plain CFG, and the one place a ``Guidance`` payload becomes a denoiser.

* CFG (Ho & Salimans 2022): ``parameterization.CFGDenoiser`` (KSampler, CFGGuider, BasicGuider).
* Dual CFG (ComfyUI ``DualCFGGuider``), three lists (cond1, cond2, negative), scales
  (c1 = cfg_conds, c2 = cfg_cond2_negative), on x0 predictions P1, P2, N:
  regular ``N + c2·(P2 − N) + c1·(P1 − P2)``; nested ``N + c2·((P2 + c1·(P1 − P2)) − N)``.
  Regular skips N when c2 ≈ 1 and also P2 when c1 ≈ 1 (a skipped list predicts 0, as in
  ComfyUI's ``calc_cond_batch``, and drops out of the formula).
* Perp-Neg (Armandpour et al. 2023, "Re-imagine the Negative Prompt Algorithm: Transform 2D
  Diffusion into 3D, alleviate Janus problem and Beyond"), lists (positive, negative, empty),
  scales (cfg, neg_scale): with p = P − E and n = N − E,
  ``E + cfg·(p − neg_scale·(n − (⟨n, p⟩/‖p‖²)·p))``, the inner product and norm taken over the
  whole batch tensor as ComfyUI does. N is skipped when neg_scale ≈ 0 and E too when cfg ≈ 1.

* Dual-model CFG (ComfyUI ``DualModelGuider``): CFG with the positive evaluated on the guider's
  MODEL and the negative on a second MODEL (``negative_model``), each with its own weights
  (weight patches: LoRA, merges) and precision; as in ComfyUI (which hands the second model the
  first model's ``model_options``), the forward-time UNet patches (FreeU, …) of the negative pass,
  the guidance formula and the sampler patches ("cfg" and post-CFG functions, CFGOverride; no
  pre-CFG function: ComfyUI's guider calls ``cfg_function``, not ``sampling_function``) are the
  first model's, and the second model's own forward-time patches are not used. The negative list is resolved against the second model
  alone (no ControlNet carried over from the positive: ComfyUI prepares it on its own). At a base
  cfg ≈ 1 the second model is never run and the x0 prediction is the positive's, unpatched; a
  step whose cfg is driven to ≈ 1 (CFGOverride) does the same unless a patch needs the negative.

Sampler patches on the MODEL (``cfg_patches``), as ComfyUI's guiders run them:

* Dual CFG calls ComfyUI's ``cfg_function`` (no pre-CFG patches): regular on (cond = P2,
  uncond = N, scale c2), the result plus ``c1·(P1 − P2)``; nested on (cond = P1, uncond = P2,
  scale c1) for the inner text prediction. A "cfg" patch (RescaleCFG, …) replaces that CFG and
  the post-CFG patches refine it, with those lists as the patches' cond/uncond.
* Perp-Neg runs the pre-CFG patches on (P, N) with ``GuidanceArgs.n_outputs`` = 3 (ComfyUI
  passes them [P, N, E]: APG, TCFG and FreSca rewrite P/N and pass E through, as here;
  LatentApplyOperationCFG then applies its operation to P alone, not to P − N),
  then ``perp_neg``, then the post-CFG patches with cond = P, uncond = N and scale cfg; a "cfg"
  patch is not used (ComfyUI's guider never calls the model's cfg function).
* A patch that needs the negative (``needs_uncond``, ComfyUI's ``disable_cfg1_optimization``)
  turns off both guiders' skipping of lists.

``with_uncond`` gives the CFG++ samplers the prediction ComfyUI's post-CFG hook reports as
``uncond_denoised``: N (regular dual CFG and Perp-Neg), P2 (nested dual CFG); every list is then
evaluated, as ComfyUI's CFG++ samplers disable the cfg1 optimisation. With ``skip_cfg1``
(``cfgpp_ud10_ab``, which keeps it) a skipped N is reported as the hook's cond (P2, resp. P).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from mixgraph.nodes.payloads.sampling import Guidance
from .cfg_patches import GuidanceArgs, cfg_at, guide, needs_uncond, post_cfg, run_pre_cfg
from .parameterization import CFGDenoiser, CondDenoiser, ModelSampling

__all__ = ["DualCFGDenoiser", "DualModelDenoiser", "PerpNegDenoiser", "build_denoiser", "perp_neg"]


def _zeros_for_skipped(den: CondDenoiser, x, sigma, lists):
    """calc_cond_batch over the lists that are not None; a None list predicts zeros."""
    active = [lst for lst in lists if lst is not None]
    outs = iter(den.calc_cond_batch(active, x, sigma)) if active else iter(())
    return [next(outs) if lst is not None else torch.zeros_like(x) for lst in lists]


def _guidance_args(den: CondDenoiser, x, sigma, scale: float, lists, preds, has_uncond: bool):
    """``GuidanceArgs`` for a CFG step of a multi-list guider: ``lists`` = (cond list, uncond list)
    play the positive and negative of ``CFGDenoiser._guide`` (re-evaluations included)."""
    cond_list, uncond_list = lists

    def evaluate(unet_patches):
        return den.calc_cond_batch([cond_list], x, sigma, unet_patches)[0]

    def evaluate_negative(x_in, unet_patches):
        return den.calc_cond_batch([uncond_list], x_in, sigma, unet_patches)[0]

    def evaluate_conds(conds):
        return den.calc_cond_batch([den.extra_list(conds)], x, sigma)[0]

    return GuidanceArgs(x, sigma, scale, preds[0], preds[1], evaluate, evaluate_negative,
                        den.patch_state, has_uncond, evaluate_conds, model=den.model)


class DualCFGDenoiser(CondDenoiser):
    def __init__(self, model, cond1, cond2, negative, cfg_conds: float, cfg_cond2_negative: float,
                 nested: bool, latent_image, denoise_mask=None, model_sampling=None, seed=None):
        # ComfyUI marks cond2 ("middle") as a negative prompt; controls go positive -> negative.
        super().__init__(model, (cond1, cond2, negative), (False, True, True), latent_image,
                         denoise_mask, model_sampling, control_to_uncond=(0, 2), seed=seed)
        self.positive, self.middle, self.negative = self.lists
        self.cfg1, self.cfg2, self.nested = float(cfg_conds), float(cfg_cond2_negative), nested
        self.sampler_patches = tuple(getattr(model, "sampler_patches", ()))
        self.patch_state: dict = {}

    def _cfg(self, x, sigma, scale, lists, preds, has_uncond=True):
        """ComfyUI's ``cfg_function``: the "cfg" and post-CFG patches, or plain CFG."""
        if not self.sampler_patches:
            return preds[1] + (preds[0] - preds[1]) * scale
        args = _guidance_args(self, x, sigma, scale, lists, preds, has_uncond)
        return guide(self.sampler_patches, args, pre=False)

    def _predict(self, x, sigma, all_lists: bool):
        neg, mid, pos = self.negative, self.middle, self.positive
        all_lists = all_lists or needs_uncond(self.sampler_patches)
        if not self.nested and not all_lists and math.isclose(self.cfg2, 1.0):
            neg = None
            if math.isclose(self.cfg1, 1.0):
                mid = None
        n, m, p = _zeros_for_skipped(self, x, sigma, [neg, mid, pos])
        if self.nested:
            text = self._cfg(x, sigma, self.cfg1, (pos, mid), (p, m))
            return n + self.cfg2 * (text - n), m
        guided = self._cfg(x, sigma, self.cfg2, (mid, self.negative), (m, n), has_uncond=neg is not None)
        return guided + (p - m) * self.cfg1, (n if neg is not None else m)

    def __call__(self, x, sigma, seed=None, **_):
        return self._predict(x, sigma, all_lists=False)[0]

    def with_uncond(self, x, sigma, seed=None, skip_cfg1: bool = False, **_):
        return self._predict(x, sigma, all_lists=not skip_cfg1)


def perp_neg(pos: torch.Tensor, neg: torch.Tensor, empty: torch.Tensor, neg_scale: float,
             cfg: float) -> torch.Tensor:
    """Perp-Neg combination of x0 predictions (module docstring). A projection coefficient that
    is not finite (p = 0: the positive equals the empty prompt; or an overflow) counts as 0, so
    the result falls back to plain CFG, as in ComfyUI 0.38.1."""
    p, n = pos - empty, neg - empty
    scale = torch.nan_to_num(torch.mul(n, p).sum() / torch.norm(p) ** 2, nan=0.0, posinf=0.0,
                             neginf=0.0)
    perp = n - scale * p
    return empty + cfg * (p - perp * neg_scale)


class PerpNegDenoiser(CondDenoiser):
    def __init__(self, model, positive, negative, empty, cfg: float, neg_scale: float,
                 latent_image, denoise_mask=None, model_sampling=None, seed=None):
        # ComfyUI's list order: positive, empty_negative_prompt, negative.
        super().__init__(model, (positive, empty, negative), (False, True, True), latent_image,
                         denoise_mask, model_sampling, control_to_uncond=(0, 2), seed=seed)
        self.positive, self.empty, self.negative = self.lists
        self.cfg, self.neg_scale = float(cfg), float(neg_scale)
        self.sampler_patches = tuple(getattr(model, "sampler_patches", ()))
        self.patch_state: dict = {}

    def _predict(self, x, sigma, all_lists: bool):
        neg, empty = self.negative, self.empty
        patches = self.sampler_patches
        cfg = cfg_at(patches, sigma, self.cfg)  # CFGOverride
        all_lists = all_lists or needs_uncond(patches)
        if not all_lists and math.isclose(self.neg_scale, 0.0):
            neg = None
            if math.isclose(cfg, 1.0):
                empty = None
        p, n, e = _zeros_for_skipped(self, x, sigma, [self.positive, neg, empty])
        if not patches:
            return perp_neg(p, n, e, self.neg_scale, cfg), (n if neg is not None else p)
        args = _guidance_args(self, x, sigma, cfg, (self.positive, self.negative), (p, n),
                              has_uncond=neg is not None)
        args.n_outputs = 3  # ComfyUI's conds_out here: [positive, negative, empty]
        run_pre_cfg(patches, args)
        p, n = args.cond_denoised, args.uncond_denoised
        out = post_cfg(patches, args, perp_neg(p, n, e, self.neg_scale, cfg))
        return out, (n if neg is not None else p)

    def __call__(self, x, sigma, seed=None, **_):
        return self._predict(x, sigma, all_lists=False)[0]

    def with_uncond(self, x, sigma, seed=None, skip_cfg1: bool = False, **_):
        return self._predict(x, sigma, all_lists=not skip_cfg1)


def _with_forward_patches_of(runner, first):
    """``runner`` (the second model's SamplerModel) evaluating with ``first``'s forward-time UNet
    patches in place of its own (ComfyUI runs the negative pass with the first model's
    ``model_options``). A SamplerModel without a MODEL handle is returned as is."""
    handle, first_handle = getattr(runner, "handle", None), getattr(first, "handle", None)
    if handle is None or first_handle is None:
        return runner
    view = copy.copy(runner)
    view.handle = dataclasses.replace(handle, unet_patches=first_handle.unet_patches)
    view.run_state = {}
    return view


class DualModelDenoiser(CFGDenoiser):
    """CFG with the negative list evaluated on ``negative_model`` (a SamplerModel, or None when
    the base cfg is ≈ 1 and it is not loaded); see the module docstring. ComfyUI's guider calls
    ``cfg_function`` itself, so the model's pre-CFG patches do not run (``pre_cfg``)."""

    pre_cfg = False

    def __init__(self, model, negative_model, positive, negative, cfg: float, latent_image,
                 denoise_mask=None, model_sampling=None, seed=None):
        super().__init__(model, positive, negative, cfg, latent_image, denoise_mask,
                         model_sampling, seed=seed)
        self._negative_off = negative_model is None or math.isclose(self.cfg, 1.0)
        self._uncond = None
        if not self._negative_off:
            negative_model = _with_forward_patches_of(negative_model, model)
            self._uncond = CondDenoiser(negative_model, (negative,), (True,), latent_image,
                                        denoise_mask, ModelSampling.for_model(negative_model),
                                        control_to_uncond=None, seed=seed)

    def calc_cond_batch(self, cond_lists, x, sigma, unet_patches=()):
        """The negative list on the second model, every other list on the first."""
        if self._uncond is None or not any(lst is self.negative for lst in cond_lists):
            return super().calc_cond_batch(cond_lists, x, sigma, unet_patches)
        others = [lst for lst in cond_lists if lst is not self.negative]
        outs = iter(super().calc_cond_batch(others, x, sigma, unet_patches) if others else ())
        (uncond,) = self._uncond.calc_cond_batch(self._uncond.lists, x, sigma, unet_patches)
        return [uncond if lst is self.negative else next(outs) for lst in cond_lists]

    def __call__(self, x, sigma, seed=None, **_):
        cfg = cfg_at(self.sampler_patches, sigma, self.cfg)
        if self._negative_off or (self._skip_cfg1 and math.isclose(cfg, 1.0)):
            return self.calc_cond_batch([self.positive], x, sigma)[0]
        return super().__call__(x, sigma)

    def with_uncond(self, x, sigma, seed=None, skip_cfg1: bool = False, **_):
        if self._negative_off and skip_cfg1:
            (cond,) = self.calc_cond_batch([self.positive], x, sigma)
            return cond, cond
        if self._negative_off:
            raise ValueError("DualModelGuider at cfg 1 runs no negative pass, and this sampler "
                             "(a CFG++ one) needs the negative prediction; use a cfg other than 1 "
                             "or another sampler")
        return super().with_uncond(x, sigma, skip_cfg1=skip_cfg1)


def build_denoiser(guidance: Guidance, model, latent_image: torch.Tensor,
                   denoise_mask: torch.Tensor | None, model_sampling: ModelSampling, seed: int | None = None,
                   negative_model=None):
    """The sampler-contract denoiser for ``guidance`` on ``model`` (a SamplerModel); ``seed`` is
    the sampling seed (unCLIP's noise augmentation draws from it). ``negative_model``: the
    SamplerModel of a "dual_model" guidance's negative pass (None: not loaded, base cfg ≈ 1)."""
    args = (latent_image, denoise_mask, model_sampling)
    if guidance.kind == "dual_model":
        positive, negative = guidance.conds
        return DualModelDenoiser(model, negative_model, positive, negative, guidance.scales[0],
                                 *args, seed=seed)
    if guidance.kind == "cfg":
        positive, negative = guidance.conds
        return CFGDenoiser(model, positive, negative, guidance.scales[0], *args, seed=seed)
    if guidance.kind == "dual_cfg":
        cond1, cond2, negative = guidance.conds
        return DualCFGDenoiser(model, cond1, cond2, negative, *guidance.scales, guidance.nested,
                               *args, seed=seed)
    positive, negative, empty = guidance.conds
    return PerpNegDenoiser(model, positive, negative, empty, *guidance.scales, *args, seed=seed)
