"""Step caches: skip model evaluations while the input changes little, reusing the last
output-minus-input difference (ComfyUI's ``comfy_extras/nodes_easycache.py``, comfyanonymous/ComfyUI
file commit 0f548d2; EasyCache: Zhou et al. 2025, "Less is Enough: Training-Free Video Diffusion
Acceleration via Runtime-Adaptive Caching", arXiv:2507.02860).

A MODEL handle carries the settings as a sampler patch of stage "step_cache" (``EasyCache`` or
``LazyCache``; the last one wins, as both share ComfyUI's one ``transformer_options["easycache"]``
slot). ``attach`` builds the per-run state when a sampling run starts (ComfyUI's OUTER_SAMPLE
wrapper, which clones the holder and resolves start/end percent to sigmas with the model sampling)
and ``finish`` logs the summary when it ends.

The rule, on a subsampled view s(·) (every 8th pixel along H and W):

* Only at σ ≤ σ(start_percent) is skipping considered; at σ ≤ σ(end_percent) the cache steps
  aside entirely (neither skips nor records).
* k_t = ‖s(out_t) − s(out_{t−1})‖₁ / ‖s(x_t) − s(x_{t−1})‖₁ (mean absolute values) is measured on
  every evaluated step after the first in the window; on a later step the predicted output change
  k·‖s(x_t) − s(x_prev)‖₁ / ‖out_prev‖₁ is added to an accumulator, and while the accumulator stays
  below ``reuse_threshold`` the step is skipped: output = x_t + (out_prev − x_prev). Otherwise the
  model runs and the accumulator restarts at 0. A threshold of 0 never skips.
* A change of the input's device, dtype or shape (EasyCache: per-item shape) resets the state;
  as in ComfyUI, the reset leaves k at 0 rather than unset, so the second evaluated step after a
  reset is skipped whatever the threshold above 0.

EasyCache (``EasyRun``) sits around each UNet call (ComfyUI's DIFFUSION_MODEL wrapper): x is the
UNet input c_in·x (its first latent-channel slice: an inpaint model's concat channels are not part
of it) and the output the raw prediction (ε or v). The differences are kept per cond (ComfyUI's
cond uuids: here the resolved cond entries of the run), so a UNet batch of positive and negative
skips together; the first cond of the first evaluation in the window (ComfyUI's ``uuids[0]``, the
negative when both run in one batch) decides, and every further UNet call of the same
``calc_cond_batch`` (areas, other batches) follows its decision when all its conds have a stored
difference. ControlNet residuals are still computed on a skipped call, as in ComfyUI (they are
taken before the diffusion model call). ComfyUI's handling of per-cond difference shapes that
differ from the input (cut from the start of each dimension, "cosmos world2video") and of the
audio half of an LTX2 [video, audio] input are video-only; here a mismatched shape only means
"no difference to apply" (it cannot arise for SD's per-cond shapes).

LazyCache (``LazyRun``) sits around the whole guided prediction (ComfyUI's PREDICT_NOISE wrapper,
inside the inpaint blend): x is the sampler's noisy latent, the output the guided x0, and one
difference is kept for the whole batch. A CFG++ sampler's unconditional x0 on a skipped step is
the last evaluated one (ComfyUI's post-CFG hook is not called on a skipped step).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.sampling.cfg_patches import last_patch

__all__ = ["EasyCache", "LazyCache", "EasyRun", "LazyRun", "attach", "step_cache_of"]

log = logging.getLogger(__name__)

SUBSAMPLE = 8  # ComfyUI's subsample_factor


@dataclass(frozen=True)
class _StepCacheSettings:
    reuse_threshold: float
    start_percent: float
    end_percent: float
    verbose: bool = False
    channels: int = 4  # the latent format's channels (ComfyUI's output_channels)
    stage: str = "step_cache"


class EasyCache(_StepCacheSettings):
    name = "EasyCache"


class LazyCache(_StepCacheSettings):
    name = "LazyCache"


def step_cache_of(patches) -> EasyCache | LazyCache | None:
    """The handle's step cache: the last "step_cache" sampler patch, or None."""
    return last_patch(patches, "step_cache")


def _l1(t: Tensor) -> Tensor:
    return t.flatten().abs().mean()


class _Run:
    """Per-run state shared by both caches (ComfyUI's holder after ``prepare_timesteps``)."""

    def __init__(self, patch, model_sampling):
        self.p = patch
        self.start_t = float(model_sampling.percent_to_sigma(patch.start_percent))
        self.end_t = float(model_sampling.percent_to_sigma(patch.end_percent))
        self.skipped = 0
        self.evaluated = 0
        self._reset()

    def _reset(self, rate=None):
        self.rate = rate  # k: output change per input change (None until measured)
        self.cumulative = 0.0
        self.initial = True
        self.skip_now = False
        self.first = None
        self.x_prev = None
        self.out_prev = None
        self.out_norm = None
        self.metadata = None
        self.skipped = 0

    def _check_metadata(self, x: Tensor, shape) -> None:
        meta = (x.device, x.dtype, tuple(shape))
        if self.metadata is None:
            self.metadata = meta
        elif meta != self.metadata:
            log.warning("%s - tensor shape, dtype or device changed, resetting state", self.p.name)
            self._reset(rate=0.0)  # ComfyUI's reset() sets the rate to 0.0, not None

    def _skip_by_rate(self, input_change) -> bool:
        """Accumulate the predicted output change; True when the step may be skipped."""
        self.cumulative += float(self.rate * input_change / self.out_norm)
        if self.cumulative < self.p.reuse_threshold:
            if self.p.verbose:
                log.info("%s [verbose] - skipping step; cumulative_change_rate: %s, reuse_threshold: %s",
                         self.p.name, self.cumulative, self.p.reuse_threshold)
            return True
        if self.p.verbose:
            log.info("%s [verbose] - NOT skipping step; cumulative_change_rate: %s, reuse_threshold: %s",
                     self.p.name, self.cumulative, self.p.reuse_threshold)
        self.cumulative = 0.0
        return False

    def finish(self, total_steps: int) -> None:
        left = total_steps - self.skipped
        speedup = total_steps / left if left else 1.0
        log.info("%s - skipped %d/%d steps (%.2fx speedup).", self.p.name, self.skipped, total_steps, speedup)


class EasyRun(_Run):
    """EasyCache around each UNet call (module docstring). ``begin`` is called at the start of
    every ``calc_cond_batch`` (ComfyUI's CALC_COND_BATCH wrapper)."""

    def _reset(self, rate=None):
        super()._reset(rate)
        self.diffs: dict = {}

    def begin(self) -> None:
        self.skip_now = False

    def _sub(self, t: Tensor, keys) -> Tensor:
        per = t.shape[0] // len(keys)
        i = keys.index(self.first)
        return t[i * per:(i + 1) * per, ..., ::SUBSAMPLE, ::SUBSAMPLE]

    def _can_apply(self, x: Tensor, keys) -> bool:
        per = x.shape[0] // len(keys)
        return all(k in self.diffs and self.diffs[k].shape == (per,) + tuple(x.shape[1:]) for k in keys)

    def _apply(self, x: Tensor, keys) -> Tensor:
        if self.first in keys:
            self.skipped += 1
        per = x.shape[0] // len(keys)
        parts = [x[i * per:(i + 1) * per].float() + self.diffs[k].to(x.device) for i, k in enumerate(keys)]
        return torch.cat(parts)  # [n*B, C, h, w]

    def __call__(self, call, unet_in: Tensor, keys: list, sigma: Tensor) -> Tensor:
        """The UNet output for ``unet_in`` [n*B, C', h, w] (conds ``keys``, B rows each) at
        ``sigma`` [n*B]: ``call()`` (the UNet) or the cached difference added to the input."""
        s = float(sigma.reshape(-1)[0])
        if not s > self.end_t:
            return call()
        x = unet_in[:, :self.p.channels]
        has_first = self.first in keys
        input_change = None
        if s <= self.start_t:
            self._check_metadata(x, x.shape[1:])
            can_apply = self._can_apply(x, keys)
            if self.skip_now and can_apply:
                if self.p.verbose:
                    log.info("EasyCache [verbose] - was marked to skip this step by the first cond")
                return self._apply(x, keys)
            if self.initial:
                self.first, has_first, self.initial = keys[0], True, False
            if has_first:
                if self.x_prev is not None:
                    input_change = _l1(self._sub(x, keys).float() - self.x_prev)
                if self.out_norm is not None and self.rate is not None:
                    if self._skip_by_rate(input_change) and can_apply:
                        self.skip_now = True
                        return self._apply(x, keys)
                    self.cumulative = 0.0
        out = call()
        self.evaluated += 1
        o = out[:, :self.p.channels].float()
        if has_first and self.out_norm is not None:
            output_change = _l1(self._sub(o, keys) - self.out_prev)
            if self.p.verbose:
                log.info("EasyCache [verbose] - output_change_rate: %s", float(output_change / self.out_norm))
            if input_change is not None:
                self.rate = output_change / input_change
        diff = o - x.float()
        per = diff.shape[0] // len(keys)
        for i, k in enumerate(keys):
            self.diffs[k] = diff[i * per:(i + 1) * per]
        if has_first:
            self.x_prev = self._sub(x, keys).float().clone()
            self.out_prev = self._sub(o, keys).clone()
            self.out_norm = _l1(o)
        return out


class LazyRun(_Run):
    """LazyCache around the guided prediction of ``inner`` (the guidance denoiser): a denoiser
    itself (the sampler contract: ``(x, sigma, **extra) -> x0`` and ``with_uncond``)."""

    def __init__(self, patch, model_sampling, inner):
        super().__init__(patch, model_sampling)
        self.inner = inner
        self.diff = None
        self.last_uncond = None

    def _sub(self, t: Tensor) -> Tensor:
        return t[..., ::SUBSAMPLE, ::SUBSAMPLE]

    def _reset(self, rate=None):
        super()._reset(rate)
        self.diff = None

    def _step(self, x: Tensor, sigma, evaluate) -> tuple[Tensor, bool]:
        s = float(torch.as_tensor(sigma).reshape(-1)[0])
        if not s > self.end_t:
            return evaluate(), False
        xs = x[:, :self.p.channels]
        input_change = None
        if s <= self.start_t:
            self._check_metadata(xs, xs.shape)
            if self.x_prev is not None:
                input_change = _l1(self._sub(xs).float() - self.x_prev)
                if self.out_norm is not None and self.rate is not None and self._skip_by_rate(input_change):
                    self.skipped += 1
                    return xs.float() + self.diff.to(xs.device), True
        out = evaluate()
        self.evaluated += 1
        o = out.float()
        if self.out_norm is not None:
            output_change = _l1(self._sub(o) - self.out_prev)
            if self.p.verbose:
                log.info("LazyCache [verbose] - output_change_rate: %s", float(output_change / self.out_norm))
            if input_change is not None:
                self.rate = output_change / input_change
        self.diff = o - xs.float()
        self.x_prev = self._sub(xs).float().clone()
        self.out_prev = self._sub(o).clone()
        self.out_norm = _l1(o)
        return out, False

    def __call__(self, x, sigma, **extra):
        return self._step(x, sigma, lambda: self.inner(x, sigma, **extra))[0]

    def with_uncond(self, x, sigma, **extra):
        pair = {}

        def evaluate():
            pair["denoised"], pair["uncond"] = self.inner.with_uncond(x, sigma, **extra)
            return pair["denoised"]

        denoised, _ = self._step(x, sigma, evaluate)
        if "uncond" in pair:
            self.last_uncond = pair["uncond"]
        uncond = self.last_uncond if self.last_uncond is not None else denoised
        return denoised, uncond


def attach(denoiser, patches, model_sampling):
    """(denoiser to sample with, run state or None) for a sampling run: LazyCache wraps the
    guidance ``denoiser``; EasyCache installs an ``EasyRun`` as the denoiser's ``unet_hook`` (and
    on a DualModelGuider's negative pass, sharing the state)."""
    patch = step_cache_of(patches)
    if patch is None:
        return denoiser, None
    log.info("%s enabled - threshold: %s, start_percent: %s, end_percent: %s", patch.name,
             patch.reuse_threshold, patch.start_percent, patch.end_percent)
    if isinstance(patch, LazyCache):
        run = LazyRun(patch, model_sampling, denoiser)
        return run, run
    run = EasyRun(patch, model_sampling)
    denoiser.unet_hook = run
    inner = getattr(denoiser, "_uncond", None)
    if inner is not None:
        inner.unet_hook = run
        inner.unet_hook_begins = False  # the outer calc_cond_batch marks the step
    return denoiser, run
