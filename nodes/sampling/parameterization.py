"""Model parameterisations and the classifier-free-guidance denoiser.

``ModelSampling`` turns a raw UNet output into a denoised x0 prediction, in the VE ("k-diffusion")
view x = x0 + σ·n of Karras et al. 2022 ("Elucidating the Design Space of Diffusion-Based
Generative Models"): the UNet sees ``c_in · x`` with c_in = 1/sqrt(σ² + 1) and its integer
timestep, and

* eps (Ho et al. 2020):            D = x − σ·ε̂
* v_prediction (Salimans & Ho 2022, "Progressive Distillation"):
                                   D = x/(σ²+1) − v̂·σ/sqrt(σ²+1)
* x0:                              D = x̂0
* img_to_img (ComfyUI's IMG_TO_IMG): x0, with the UNet given x itself (no c_in scaling)
* lcm (Luo et al. 2023, "Latent Consistency Models"; ComfyUI's ModelSamplingDiscrete "lcm"):
  the eps x0 estimate mixed with the input by the consistency-model boundary condition,
  c_skip = σ_d²/((10t)² + σ_d²), c_out = 10t/sqrt((10t)² + σ_d²), σ_d = 0.5, on the distilled
  50-step schedule.
* flow (rectified flow / flow matching; ComfyUI's CONST): not the VE view but
  x_σ = (1 − σ)·x0 + σ·ε, σ in [0, 1]; the model sees x itself and predicts the velocity
  v̂ = ε − x0, so D = x − σ·v̂; noising is σ·ε + (1 − σ)·latent (no max-denoise special case)
  and the sampled x is divided by (1 − σ_last) on the way out. Its schedule (shift, multiplier,
  Flux's exponential shift) is ``schedule_flow.FlowSchedule``. The Karras ODE derivative
  (x − D)/σ = ε − x0 is the flow velocity, so ODE samplers in σ run unchanged; the samplers
  that need α_σ = 1 − σ branch on ``ModelSampling.is_flow`` (``sampler_utils``).

``CFGDenoiser`` is the callable the samplers see (the sampler contract in ``samplers.py``):
classifier-free guidance (Ho & Salimans 2022) on x0 predictions, ``uncond + (cond − uncond)·cfg``,
with several conds / areas / masks combined as ComfyUI's ``calc_cond_batch`` weighted average,
the model family's own conditioning (``FamilyRunner.cond_inputs``: SDXL's vector ``y``, ...),
ControlNet residuals, the extra input channels the runner gives (``FamilyRunner.concat``:
inpaint, instruct-pix2pix, ...) and timestep ranges. The model is called as
``model(x, timestep, context, inputs, control=, patches=, sigma=)`` (``families/base.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F

from mixgraph.nodes.adapters.control_lora import bind_chain
from mixgraph.nodes.adapters.gligen import grounding_patch
from mixgraph.nodes.models.concat_cond import repeat_to_batch
from mixgraph.nodes.payloads.conditioning import Cond, Control
from .cfg_patches import GuidanceArgs, cfg_at, guide, needs_uncond
from .hooks import HookRuntime
from .schedule_continuous import ContinuousSchedule
from .schedule_flow import FlowSchedule
from .schedules import DiscreteSchedule

__all__ = ["ModelSampling", "CondDenoiser", "CFGDenoiser", "PREDICTIONS"]

# The same names as ``families.base.PREDICTIONS`` (a test keeps the two equal).
PREDICTIONS = ("eps", "v_prediction", "x0", "lcm", "img_to_img", "edm", "flow")



def _bcast(sigma: torch.Tensor, ndim: int) -> torch.Tensor:
    sigma = torch.as_tensor(sigma)
    return sigma.reshape(sigma.shape[:1] + (1,) * (ndim - 1)) if sigma.ndim else sigma


class ModelSampling:
    """Schedule + parameterisation of one model (ComfyUI ``model_sampling``)."""

    sigma_data = 1.0

    def __init__(self, prediction: str = "eps", zsnr: bool = False, continuous: tuple | None = None,
                 beta_range: tuple[float, float] | None = None, shift: float = 1.0,
                 multiplier: float = 1000.0, shift_kind: str = "linear"):
        """``continuous``: (kind "edm" | "v", sigma_min, sigma_max) for a continuous-time schedule
        (``schedule_continuous.py``, the ModelSamplingContinuous* nodes); "edm" prediction
        (Karras et al. 2022, D = c_skip·x + c_out·F with σ_data = 0.5) only with one.
        ``beta_range``: (linear_start, linear_end) of the discrete schedule (the model family's
        ``sampling_settings``; the x4 upscaler's 0.0001..0.02), None = SD's 0.00085..0.012.
        ``shift``, ``multiplier``, ``shift_kind``: the "flow" prediction's schedule
        (``schedule_flow.FlowSchedule``: "linear" = ComfyUI's ModelSamplingDiscreteFlow,
        "exponential" = ModelSamplingFlux with μ = shift); ignored by the other predictions."""
        if prediction not in PREDICTIONS:
            raise NotImplementedError(
                f"prediction type {prediction!r}: not supported yet (supported: "
                f"{', '.join(PREDICTIONS)})"
            )
        self.prediction = prediction
        if prediction == "flow":
            if continuous:
                raise ValueError("prediction type 'flow' takes the flow schedule (shift, multiplier), "
                                 f"not a continuous {continuous[0]!r} schedule")
            self.schedule = FlowSchedule(shift, multiplier, shift_kind)
        elif continuous:
            kind, sigma_min, sigma_max = continuous
            self.schedule = ContinuousSchedule(kind, float(sigma_min), float(sigma_max))
        else:
            if prediction == "edm":
                raise NotImplementedError("prediction type 'edm' on the discrete schedule: not supported yet "
                                          "(it needs a continuous schedule: ModelSamplingContinuousEDM)")
            betas = {} if beta_range is None else {"linear_start": beta_range[0], "linear_end": beta_range[1]}
            self.schedule = DiscreteSchedule(zsnr=zsnr, distilled=prediction == "lcm", **betas)
        if prediction == "edm":
            self.sigma_data = 0.5

    @property
    def is_flow(self) -> bool:
        """Flow matching (ComfyUI's CONST): α_σ = 1 − σ instead of the VE α = 1."""
        return self.prediction == "flow"

    @classmethod
    def from_sampling(cls, sampling) -> "ModelSampling":
        """From a family's ``families.base.Sampling`` (duck-typed: this module does not import
        the families package, which imports model code)."""
        return cls(sampling.prediction, bool(sampling.zsnr), sampling.continuous, sampling.beta_range,
                   float(sampling.shift), float(sampling.multiplier),
                   getattr(sampling, "shift_kind", "linear"))

    @classmethod
    def for_model(cls, model) -> "ModelSampling":
        """The model's own ``model_sampling`` when it carries one; else from its family's
        ``sampling`` (a ``families.base.Sampling``); else from the older attributes
        ``prediction``, ``zsnr``, ``continuous_sampling`` and ``beta_range``."""
        existing = getattr(model, "model_sampling", None)
        if isinstance(existing, ModelSampling):
            return existing
        sampling = getattr(model, "sampling", None)
        if sampling is not None and hasattr(sampling, "prediction") and hasattr(sampling, "multiplier"):
            return cls.from_sampling(sampling)
        return cls(getattr(model, "prediction", "eps"), bool(getattr(model, "zsnr", False)),
                   getattr(model, "continuous_sampling", None), getattr(model, "beta_range", None))

    # schedule pass-throughs
    @property
    def sigma_min(self) -> torch.Tensor:
        return self.schedule.sigma_min

    @property
    def sigma_max(self) -> torch.Tensor:
        return self.schedule.sigma_max

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return self.schedule.timestep(sigma)

    def percent_to_sigma(self, percent: float) -> float:
        return self.schedule.percent_to_sigma(percent)

    # parameterisation
    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.prediction in ("img_to_img", "flow"):
            return x
        sigma = _bcast(sigma, x.ndim)
        return x / (sigma**2 + self.sigma_data**2) ** 0.5

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor
    ) -> torch.Tensor:
        s = _bcast(sigma, model_output.ndim)
        if self.prediction in ("eps", "flow"):
            return model_input - model_output * s
        if self.prediction == "v_prediction":
            sd2 = self.sigma_data**2
            return model_input * sd2 / (s**2 + sd2) - model_output * s * self.sigma_data / (
                s**2 + sd2
            ) ** 0.5
        if self.prediction == "edm":
            sd = self.sigma_data
            return model_input * sd**2 / (s**2 + sd**2) + model_output * s * sd / (s**2 + sd**2) ** 0.5
        if self.prediction in ("x0", "img_to_img"):
            return model_output
        # lcm
        t = self.timestep(torch.as_tensor(sigma)).reshape(-1).to(model_output.dtype)
        t = _bcast(t * 10.0, model_output.ndim)
        sigma_data = 0.5
        c_skip = sigma_data**2 / (t**2 + sigma_data**2)
        c_out = t / (t**2 + sigma_data**2) ** 0.5
        x0 = model_input - model_output * s
        return c_out * x0 + c_skip * model_input

    def noise_scaling(
        self, sigma, noise: torch.Tensor, latent: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        """x_σ = latent + σ·noise; at full denoise the noise is scaled by sqrt(1 + σ²) instead,
        the std of a VP sample at the last training step seen in VE units. Flow: x_σ =
        σ·noise + (1 − σ)·latent, with no max-denoise case (σ_max is 1: pure noise)."""
        sigma = _bcast(torch.as_tensor(sigma, dtype=noise.dtype, device=noise.device), noise.ndim)
        if self.prediction == "flow":
            return sigma * noise + (1.0 - sigma) * latent
        if max_denoise:
            noise = noise * torch.sqrt(1.0 + sigma**2.0)
        else:
            noise = noise * sigma
        return noise + latent

    def inverse_noise_scaling(self, sigma, latent: torch.Tensor) -> torch.Tensor:
        """Flow: latent / (1 − σ) (the identity at σ = 0); the other predictions: the latent."""
        if self.prediction == "flow":
            sigma = _bcast(torch.as_tensor(sigma, dtype=latent.dtype, device=latent.device), latent.ndim)
            return latent / (1.0 - sigma)
        return latent

    def is_max_denoise(self, sigmas: torch.Tensor) -> bool:
        sigma_max = float(self.sigma_max)
        sigma = float(sigmas[0])
        return math.isclose(sigma_max, sigma, rel_tol=1e-05) or sigma > sigma_max


# ------------------------------------------------------------------------------------- CFG


@dataclass
class _Entry:
    """One cond resolved against the latent: what ``calc_cond_batch`` needs per evaluation."""

    cond: Cond
    context: torch.Tensor | None  # [1, T, D]; None for a text-free cond (``Cond.cross_attn`` None)
    inputs: dict  # name -> [1, ...]: the model's own conditioning (``FamilyRunner.cond_inputs``)
    area: tuple[int, int, int, int] | None  # (h, w, y, x) latent px
    mask: torch.Tensor | None  # [Bm, H, W] resized to the latent, times mask_strength
    sigma_start: float | None  # active while sigma_end <= σ <= sigma_start
    sigma_end: float | None
    concat: torch.Tensor | None = None  # [B, E, H, W] extra input channels (``FamilyRunner.concat``), or None
    gligen: object | None = None  # the GLIGEN module for the cond's boxes, or None
    control_context: torch.Tensor | None = None  # [1, T', D] ControlNet-only text, or None


def _mask_bounds(mask: torch.Tensor) -> tuple[int, int, int, int]:
    """(h, w, y, x) of the box holding every nonzero pixel of any mask in the batch, at least
    8 x 8 latent px; (8, 8, 0, 0) for an empty mask (ComfyUI ``set_area_to_bounds``)."""
    nz = torch.nonzero(mask.abs().amax(dim=0))  # [N, 2] (y, x) of [H, W]
    if nz.shape[0] == 0:
        return (8, 8, 0, 0)
    y0, x0 = (int(v) for v in nz.min(dim=0).values)
    y1, x1 = (int(v) for v in nz.max(dim=0).values)
    return (max(8, y1 - y0 + 1), max(8, x1 - x0 + 1), y0, x0)


def resolve_area_and_mask(c: Cond, hw: tuple[int, int], device=None) -> Cond:
    """A cond's percentage area in latent px and its mask resized (bilinear) to the latent as
    [Bm, H, W]; with ``set_area_to_bounds`` the area becomes the mask's bounding box (ComfyUI
    ``resolve_areas_and_cond_masks_multidim``, run before conds are paired across CFG sides)."""
    H, W = hw
    changes: dict = {}
    if c.area_fraction is not None:
        fh, fw, fy, fx = c.area_fraction
        changes.update(area_fraction=None, area=(max(1, round(fh * H)), max(1, round(fw * W)),
                                                 round(fy * H), round(fx * W)))
    if c.mask is not None:
        m = c.mask.to(device=device, dtype=torch.float32)
        if m.ndim == 2:
            m = m.unsqueeze(0)  # [1, H, W]
        if tuple(m.shape[-2:]) != (H, W):
            m = F.interpolate(m.unsqueeze(1), size=(H, W), mode="bilinear",
                              align_corners=False).squeeze(1)  # [Bm, H, W]
        changes["mask"] = m
        if c.set_area_to_bounds:
            changes["area"] = _mask_bounds(m)
            changes["area_fraction"] = None
    return replace(c, **changes) if changes else c


def _contains(outer: tuple, inner: tuple) -> bool:
    return (
        inner[2] >= outer[2]
        and inner[3] >= outer[3]
        and outer[0] + outer[2] >= inner[0] + inner[2]
        and outer[1] + outer[3] >= inner[1] + inner[3]
    )


def _add_same_area_opposites(lists: list[list[Cond]]) -> None:
    """For every cond with an area, make sure each other list has a cond with that area: copy the
    smallest enclosing cond's model inputs (text, pooled, size, concat, a family's
    ``model_inputs``) into it (ComfyUI create_cond_with_same_area_if_none copies its model_conds).
    Keeps both sides of CFG evaluated on the same crops."""
    for k, src in enumerate(lists):
        for c in src:  # lists grow while iterated, as in ComfyUI
            if c.area is None:
                continue
            for kk, dst in enumerate(lists):
                if kk == k:
                    continue
                smallest = None
                for x in dst:
                    if x.area is not None:
                        if _contains(x.area, c.area):
                            if smallest is None or smallest.area is None:
                                smallest = x
                            elif smallest.area[0] * smallest.area[1] > x.area[0] * x.area[1]:
                                smallest = x
                    elif smallest is None:
                        smallest = x
                if smallest is None:
                    continue
                if smallest.area is not None and tuple(smallest.area) == tuple(c.area):
                    continue
                dst.append(
                    replace(c, cross_attn=smallest.cross_attn, pooled=smallest.pooled,
                            size=smallest.size, unclip=smallest.unclip, concat_latent=smallest.concat_latent,
                            concat_mask=smallest.concat_mask, concat_image=smallest.concat_image,
                            noise_augmentation=smallest.noise_augmentation,
                            model_inputs=smallest.model_inputs)
                )


def _apply_control_to_uncond(positive: list[Cond], negative: list[Cond]) -> None:
    """ControlNetApply (old) semantics: controls of positive non-area conds marked
    ``control_apply_to_uncond`` go to the negative non-area conds without one, round robin
    (ComfyUI apply_empty_x_to_equal_area for 'control')."""
    cnets = [c.control for c in positive
             if c.control_apply_to_uncond and c.area is None and c.control is not None]
    if any(c.area is None and c.control is not None for c in negative):
        return
    others = [(c, i) for i, c in enumerate(negative) if c.area is None and c.control is None]
    if not others:
        return
    for n, cnet in enumerate(cnets):
        o, idx = others[n % len(others)]
        if negative[idx] is o:
            negative[idx] = replace(o, control=cnet)
        else:
            negative.append(replace(o, control=cnet))


class CondDenoiser:
    """Resolves several conditioning lists against a latent and evaluates them
    (``calc_cond_batch``); subclasses combine the per-list x0 predictions into one (the guidance
    rule: ``CFGDenoiser`` here, DualCFG and Perp-Neg in ``guidance.py``). ComfyUI's
    ``CFGGuider.inner_set_conds`` + ``process_conds`` with named lists, in its order.

    Args:
        model: a ``SamplerModel`` (see ARCHITECTURE.md): a ``families.base.FamilyRunner``
            (``cond_inputs``, called as the model, ``in_channels``, ``sampling``; optionally
            ``concat`` and ``context_free_refusal``).
        cond_lists: one CONDITIONING tuple per list (e.g. positive, negative).
        negatives: per list, whether it is a "negative" prompt (SDXL ADM defaults).
        latent_image: [B, C, H, W] the process_in-scaled input latent (for the runner's concat).
        denoise_mask: [B, C, H, W] noise mask at latent size (1 = resample), or None.
        model_sampling: parameterisation + schedule; default from ``model.prediction/zsnr``.
        control_to_uncond: (positive index, negative index) for ControlNetApply's
            ``control_apply_to_uncond``; None to skip.
        seed: the sampling seed; a cond's unCLIP image embeddings are noised with seed − 10
            (``families/sd/unclip.py``), so the model's ``cond_inputs`` gets it.

    A model with more input channels than the latent (ComfyUI's ``concat_cond``) gets
    ``cat([c_in·x, concat])``, where ``concat`` [B, E, H, W] is what the runner's
    ``concat(cond, latent_image, denoise_mask, seed)`` gives per cond (``families/base.py``;
    SD: inpaint mask + masked latent, instruct-pix2pix's image latent, the x4 upscaler's image;
    the tensors in ``models/concat_cond.py``). The denoiser only crops it with the cond's area
    like the input and batches it; a runner without ``concat`` gives none.

    ``unet_hook`` (None, or a ``step_cache.EasyRun`` set for one sampling run) stands around each
    UNet call: ``hook(call, unet_in, cond keys, sigma)``; ``hook.begin()`` marks each
    ``calc_cond_batch`` unless ``unet_hook_begins`` is False (a nested denoiser).
    """

    unet_hook = None
    unet_hook_begins = True
    context_run = None  # a context_windows.WindowRun for one sampling run (ContextWindowsManual)

    def __init__(
        self,
        model,
        cond_lists: Sequence[Sequence[Cond]],
        negatives: Sequence[bool],
        latent_image: torch.Tensor,
        denoise_mask: torch.Tensor | None = None,
        model_sampling: ModelSampling | None = None,
        control_to_uncond: tuple[int, int] | None = (0, 1),
        seed: int | None = None,
    ):
        self.model = model
        self.seed = seed
        self.ms = model_sampling or ModelSampling.for_model(model)
        self.device = latent_image.device
        H, W = latent_image.shape[-2:]  # [B, C, H, W], or a video's [B, C, T, H, W]
        self.latent_hw = (H, W)

        # Areas and masks are resolved before conds are paired across the lists (ComfyUI's order).
        lists = [[resolve_area_and_mask(c, (H, W), self.device) for c in conds]
                 for conds in cond_lists]
        _add_same_area_opposites(lists)
        if control_to_uncond is not None:
            _apply_control_to_uncond(lists[control_to_uncond[0]], lists[control_to_uncond[1]])
        # ControlLoRA links are built on this model's UNet (ComfyUI ControlLora.pre_run)
        bound: dict = {}
        lists = [[c if c.control is None else replace(c, control=bind_chain(c.control, model, bound))
                  for c in conds] for conds in lists]
        self._latent_image = latent_image
        self._denoise_mask = denoise_mask
        self._gligen_modules: dict = {}
        self.lists = [[self._resolve(c, negative=neg) for c in conds]
                      for conds, neg in zip(lists, negatives)]

    # -- preparation
    def _resolve(self, c: Cond, negative: bool = False) -> _Entry:
        """`c` (areas and masks already resolved) as an evaluation entry."""
        H, W = self.latent_hw
        mask = None if c.mask is None else c.mask * c.mask_strength
        area = None
        if c.area is not None:
            h, w, y, x = (int(v) for v in c.area)
            area = (min(H - y, h), min(W - x, w), y, x)
        # the family's conditioning (SDXL's y: the refiner's aesthetic score defaults by prompt
        # side, 6.0 / 2.5 negative; unCLIP noises image embeddings with the sampling seed)
        cond_inputs = getattr(self.model, "cond_inputs", None)  # None: a model with no conditioning of its own
        inputs = {}
        if cond_inputs is not None:
            more = {"denoise_mask": self._denoise_mask} if getattr(self.model, "wants_denoise_mask", False) else {}
            inputs = cond_inputs(c, tuple(self._latent_image.shape), negative=negative,
                                 seed=0 if self.seed is None else self.seed, **more)
            inputs = {k: v.to(self.device, torch.float32) for k, v in inputs.items()}
        start, end = c.timestep_range
        if c.clip_range is not None:  # a CLIP hook schedule's range (ComfyUI clip_start/end_percent)
            start, end = max(c.clip_range[0], start), min(c.clip_range[1], end)
        s_start = s_end = None
        if (start, end) != (0.0, 1.0):
            s_start, s_end = self.ms.percent_to_sigma(start), self.ms.percent_to_sigma(end)
        concat = self._concat(c)
        gligen = None
        if c.gligen is not None:
            gligen = self._gligen_modules.get(id(c.gligen.model))
            if gligen is None:
                gligen = c.gligen.model.runner(getattr(self.model, "policy", None))
                self._gligen_modules[id(c.gligen.model)] = gligen
        context = None  # a text-free cond: no cross-attention context (ComfyUI's [[None, {}]])
        if c.cross_attn is not None:
            context = c.cross_attn.to(self.device, torch.float32)
            project = getattr(self.model, "project_context", None)
            if project is not None:  # Stable Zero123's camera projection (ComfyUI's extra_conds)
                context = project(context)
        control_context = None
        if c.controlnet_cross_attn is not None:  # CLIPTextEncodeControlnet
            control_context = c.controlnet_cross_attn.to(self.device, torch.float32)
        return _Entry(c, context, inputs, area, mask, s_start, s_end, concat, gligen, control_context)

    def _concat(self, c: Cond) -> torch.Tensor | None:
        """The runner's extra input channels for ``c`` [B, E, H, W] (``FamilyRunner.concat``), or
        None; checked against the model's ``in_channels`` so a missing or wrong concat is named
        here, not found as a convolution shape error."""
        concat_fn = getattr(self.model, "concat", None)  # None: a model with no extra channels
        concat = None
        if concat_fn is not None:
            concat = concat_fn(c, self._latent_image, self._denoise_mask, 0 if self.seed is None else self.seed)
        in_channels = getattr(self.model, "in_channels", None)
        if in_channels is not None:
            C = self._latent_image.shape[1]
            extra = 0 if concat is None else concat.shape[1]
            if concat is None and in_channels > C:
                raise ValueError(f"a {in_channels}-channel model with a {C}-channel latent, and its runner "
                                 f"gives no extra input channels (FamilyRunner.concat)")
            if concat is not None and C + extra != in_channels:
                raise ValueError(f"the runner's concat gives {extra} channels for a {C}-channel latent; "
                                 f"the model takes {in_channels}")
        return concat

    def _area_and_mult(self, e: _Entry, x: torch.Tensor, sigma: torch.Tensor):
        s = float(sigma.reshape(-1)[0])
        if e.sigma_start is not None and s > e.sigma_start:
            return None
        if e.sigma_end is not None and s < e.sigma_end:
            return None
        H, W = x.shape[-2:]
        area = e.area
        inp = x if area is None else x[..., area[2]:area[2] + area[0], area[3]:area[3] + area[1]]  # a video: all frames
        if e.mask is not None:
            m = e.mask[: inp.shape[0]]
            if area is not None:
                m = m[:, area[2]:area[2] + area[0], area[3]:area[3] + area[1]]
            m = m.unsqueeze(1)  # [Bm, 1, H, W]
            if inp.ndim == 5:
                m = m.unsqueeze(2)  # [Bm, 1, 1, H, W]: the same mask on every frame of a video latent
            mult = m.repeat(inp.shape[0] // m.shape[0], inp.shape[1], *inp.shape[2:-2], 1, 1)
            mult = mult * e.cond.strength
        else:
            mult = torch.ones_like(inp) * e.cond.strength
            if area is not None:
                # Feather the area's inner edges over up to 8 latent px (ComfyUI's fuzz), so
                # area conds blend into their surroundings.
                for dim, (size, off, full) in enumerate(((area[0], area[2], H),
                                                         (area[1], area[3], W))):
                    rr = min(8, mult.shape[2 + dim] // 4)
                    for t in range(rr):
                        f = (1.0 / rr) * (t + 1)
                        if off != 0:
                            mult.narrow(mult.ndim - 2 + dim, t, 1).mul_(f)
                        if size + off < full:
                            mult.narrow(mult.ndim - 2 + dim, size - 1 - t, 1).mul_(f)
        return inp, mult, area

    def extra_list(self, conds: Sequence[Cond], negative: bool = True) -> list[_Entry]:
        """Another CONDITIONING resolved against this latent as a negative-prompt list (for
        patches that evaluate a third prompt, e.g. PerpNeg); resolved once per run."""
        cache = self.__dict__.setdefault("_extra_lists", {})
        key = (id(conds), negative)
        if key not in cache:
            resolved = [resolve_area_and_mask(c, self.latent_hw, self.device) for c in conds]
            cache[key] = (conds, [self._resolve(c, negative=negative) for c in resolved])
        return cache[key][1]

    def calc_cond_batch(self, cond_lists, x: torch.Tensor, sigma: torch.Tensor, unet_patches=()):
        """Weighted average of every active cond's x0 per list (ComfyUI calc_cond_batch);
        ``unet_patches``: forward-time UNet patches for these evaluations only.

        Conds carrying hooks are evaluated with the hooks' weight patches at this sigma
        (``sampling/hooks.py``), batched only with conds whose patches are equal. Default conds
        (``Cond.default``) fill, per list, the weight the other active conds leave uncovered
        (ComfyUI ``finalize_default_conds``).

        With ``context_run`` set and the latent longer than its windows, the evaluation runs per
        window and is fused there (``sampling/context_windows.py``)."""
        run = self.context_run
        if run is not None and run.applies(x):
            return run.evaluate(self, cond_lists, x, sigma, unet_patches)
        return self._calc_cond_batch(cond_lists, x, sigma, unet_patches)

    def _calc_cond_batch(self, cond_lists, x: torch.Tensor, sigma: torch.Tensor, unet_patches=()):
        if self.unet_hook is not None and self.unet_hook_begins:
            self.unet_hook.begin()
        outs = [torch.zeros_like(x) for _ in cond_lists]
        counts = [torch.ones_like(x) * 1e-37 for _ in cond_lists]
        to_run = []
        defaults: list[list] = [[] for _ in cond_lists]
        for idx, entries in enumerate(cond_lists):
            for e in entries:
                if e.cond.default:
                    defaults[idx].append(e)
                    continue
                p = self._area_and_mult(e, x, sigma)
                if p is not None:
                    to_run.append((e, p, idx))
        if any(defaults):
            to_run += self._default_runs(defaults, to_run, x, sigma)
        s = float(sigma.reshape(-1)[0])
        hooked = {id(e): self._hook_runtime().patches_at(e.cond.hooks, s)
                  for e, _, _ in to_run if e.cond.hooks}
        while to_run:
            first = to_run[0]
            patches = hooked.get(id(first[0]), ())
            group = [k for k in range(len(to_run)) if self._can_batch(to_run[k], first)
                     and hooked.get(id(to_run[k][0]), ()) == patches]
            group.reverse()  # ComfyUI pops from the back: batch order is reversed
            batch = [to_run.pop(k) for k in group]
            model = self._hook_runtime().runner(patches) if patches else None
            outputs = self._run(batch, sigma, unet_patches, model=model)
            for (e, (inp, mult, area), idx), out in zip(batch, outputs):
                if area is None:
                    outs[idx] += out * mult
                    counts[idx] += mult
                else:
                    sl = (..., slice(area[2], area[2] + area[0]), slice(area[3], area[3] + area[1]))
                    outs[idx][sl] += out * mult
                    counts[idx][sl] += mult
        return [o / c for o, c in zip(outs, counts)]

    def _hook_runtime(self):
        rt = self.__dict__.get("_hooks")
        if rt is None:
            rt = self._hooks = HookRuntime(self.model, self.ms.percent_to_sigma)
        return rt

    def _default_runs(self, defaults, to_run, x: torch.Tensor, sigma: torch.Tensor) -> list:
        """Evaluations of the default conds: per list with any, the weight 1 − Σ mult of that
        list's active conds (clamped at 0), over the whole latent; none where nothing is left."""
        remaining = [torch.ones_like(x) if d else None for d in defaults]
        for e, (_, mult, area), idx in to_run:
            if remaining[idx] is None:
                continue
            if area is None:
                remaining[idx] -= mult
            else:
                remaining[idx][..., area[2]:area[2] + area[0], area[3]:area[3] + area[1]] -= mult
        runs = []
        for idx, entries in enumerate(defaults):
            if not entries:
                continue
            left = torch.relu(remaining[idx])
            if float(left.max()) == 0.0:
                continue
            for e in entries:
                p = self._area_and_mult(e, x, sigma)
                if p is None:
                    continue
                inp, _, area = p
                if area is not None:
                    left_e = left[..., area[2]:area[2] + area[0], area[3]:area[3] + area[1]]
                else:
                    left_e = left
                runs.append((e, (inp, left_e, area), idx))
        return runs

    @staticmethod
    def _can_batch(a, b) -> bool:
        ea, (ia, _, _), _ = a
        eb, (ib, _, _), _ = b
        if ia.shape != ib.shape or ea.cond.control is not eb.cond.control:
            return False
        if (ea.gligen is not None or eb.gligen is not None) and a is not b:
            return False  # a per-cond UNet patch: evaluated on its own (ComfyUI)
        if (ea.concat is None) != (eb.concat is None):
            return False
        if ea.inputs.keys() != eb.inputs.keys() or any(ea.inputs[k].shape != eb.inputs[k].shape for k in ea.inputs):
            return False
        if ea.cond.control is not None and not _can_concat(ea.control_context, eb.control_context):
            return False  # ControlNet-only text: only with the same kind (ComfyUI's can_concat)
        return _can_concat(ea.context, eb.context)

    def _run(self, batch, sigma: torch.Tensor, unet_patches=(), model=None) -> list[torch.Tensor]:
        """One UNet call for a batch of compatible conds; returns each cond's x0 prediction.
        ``model``: the SamplerModel to evaluate with (a hooked runner), default ``self.model``."""
        model = self.model if model is None else model
        n = len(batch)
        inputs = [p[0] for _, p, _ in batch]
        b = inputs[0].shape[0]
        x_in = torch.cat(inputs)  # [n*B, C, h, w]
        sig = torch.cat([sigma] * n)  # [n*B]
        xc = self.ms.calculate_input(sig, x_in)
        t = self.ms.timestep(sig).float()
        context = _batch_context([e.context for e, _, _ in batch], b)  # [n*B, T, D] or None
        if context is None:
            _check_text_free(model, batch[0][0])
        cond_inputs = {name: torch.cat([e.inputs[name].expand(b, *v.shape[1:]) for e, _, _ in batch])
                       for name, v in batch[0][0].inputs.items()}  # name -> [n*B, ...]
        control: Control | None = None
        chain = batch[0][0].cond.control
        if chain is not None:
            percent = self.ms.schedule.sigma_to_percent(float(sigma.reshape(-1)[0]))
            cn_context = context
            if batch[0][0].control_context is not None:  # ComfyUI's crossattn_controlnet
                cn_context = _batch_context([e.control_context for e, _, _ in batch], b)
            more = {"inputs": cond_inputs} if getattr(chain, "accepts_inputs", False) else {}  # DiT nets
            control = chain.residuals(xc, t, cn_context, cond_inputs.get("y"), sig, percent, **more)
        unet_in = xc
        if batch[0][0].concat is not None:
            crops = []
            for e, (_, _, area), _ in batch:
                c = e.concat[:b] if e.concat.shape[0] >= b else e.concat.expand(b, *e.concat.shape[1:])
                if area is not None:
                    c = c[..., area[2]:area[2] + area[0], area[3]:area[3] + area[1]]
                crops.append(c)
            unet_in = torch.cat([xc, torch.cat(crops)], dim=1)  # [n*B, C + E, h, w]
        first = batch[0][0]
        if first.gligen is not None:
            b_, _, h_, w_ = inputs[0].shape
            unet_patches = tuple(unet_patches) + (grounding_patch(first.cond.gligen, first.gligen, b_, h_, w_),)

        sigma_arg = float(sig.reshape(-1)[0]) if getattr(model, "wants_sigma", False) else None

        def call():
            return model(unet_in, t, context, cond_inputs, control=control, patches=tuple(unet_patches),
                         sigma=sigma_arg)

        if self.unet_hook is not None:
            out = self.unet_hook(call, unet_in, [id(e) for e, _, _ in batch], sig)
        else:
            out = call()
        out = out.float()
        return list(self.ms.calculate_denoised(sig, out, x_in).chunk(n))


def _can_concat(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two conds' token tensors can share a UNet batch (ComfyUI CONDCrossAttn.can_concat):
    both absent, or the same batch and width with token counts at most 4x apart at their lcm."""
    if a is None or b is None:
        return a is None and b is None
    ta, tb = a.shape, b.shape
    if ta[0] != tb[0] or ta[2] != tb[2]:
        return False
    return math.lcm(ta[1], tb[1]) // min(ta[1], tb[1]) <= 4


def _check_text_free(model, entry: _Entry) -> None:
    """A text-free cond runs the model with no context (ComfyUI's ``[[None, {}]]``): refuse, with
    what to do, where that cannot work (the runner's ``context_free_refusal`` says why), instead
    of a matrix-shape error from inside the model."""
    refusal = getattr(model, "context_free_refusal", None)
    reason = refusal() if refusal is not None else None
    if reason is not None:
        raise ValueError(
            f"DualModelGuider's 'negative' is not connected, so its negative pass is text-free: "
            f"the model runs with no cross-attention context (ComfyUI's [[None, {{}}]] negative). "
            f"{reason}. Connect a negative CONDITIONING (an empty prompt, or ConditioningZeroOut), "
            f"or set cfg to 1 (the negative is then not run)")
    if entry.cond.control is not None:
        raise ValueError("a text-free cond (DualModelGuider's unconnected 'negative') cannot "
                         "drive a ControlNet: the ControlNet reads the text context (ComfyUI "
                         "fails here too); connect a negative CONDITIONING")


def _batch_context(contexts: Sequence[torch.Tensor | None], b: int) -> torch.Tensor | None:
    """[n*b, T, D]: each cond's tokens repeated to the lcm length (repeating tokens leaves
    attention unchanged) and to the batch; a cond with one entry per image (Stable Zero123's
    batched cameras) is cut or tiled to the batch, as ComfyUI. None for text-free conds (they
    batch only with each other: ``_can_concat``)."""
    if contexts[0] is None:
        return None
    t_len = math.lcm(*(c.shape[1] for c in contexts))
    return torch.cat([repeat_to_batch(c.repeat(1, t_len // c.shape[1], 1), b) for c in contexts])


class CFGDenoiser(CondDenoiser):
    """x0 denoiser with classifier-free guidance (Ho & Salimans 2022) on x0 predictions,
    ``uncond + (cond − uncond)·cfg``; at cfg == 1 (isclose) the negative is not evaluated
    (ComfyUI's cfg1 optimisation). KSampler's and CFGGuider's rule. The model's sampler patches
    run as ComfyUI's ``sampling_function`` runs them: the pre-CFG ones (also at cfg == 1, on a
    zero negative), the "cfg" one, the post-CFG ones; a subclass whose ComfyUI guider calls
    ``cfg_function`` alone sets ``pre_cfg = False``."""

    pre_cfg = True  # run the pre-CFG patches (ComfyUI's sampling_function; not cfg_function)

    def __init__(
        self,
        model,
        positive: Sequence[Cond],
        negative: Sequence[Cond],
        cfg: float,
        latent_image: torch.Tensor,
        denoise_mask: torch.Tensor | None = None,
        model_sampling: ModelSampling | None = None,
        seed: int | None = None,
    ):
        super().__init__(model, (positive, negative), (False, True), latent_image, denoise_mask,
                         model_sampling, seed=seed)
        self.positive, self.negative = self.lists
        self.cfg = float(cfg)
        self.sampler_patches = tuple(getattr(model, "sampler_patches", ()))
        self.patch_state: dict = {}  # per-run state of sampler patches (APG momentum)
        self._skip_cfg1 = not needs_uncond(self.sampler_patches)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, seed=None, **_) -> torch.Tensor:
        cfg = cfg_at(self.sampler_patches, sigma, self.cfg)
        if self._skip_cfg1 and math.isclose(cfg, 1.0):
            (cond,) = self.calc_cond_batch([self.positive], x, sigma)
            if self.sampler_patches:
                return self._guide(x, sigma, cond, torch.zeros_like(cond), cfg, has_uncond=False)
            return cond
        cond, uncond = self.calc_cond_batch([self.positive, self.negative], x, sigma)
        if self.sampler_patches:
            return self._guide(x, sigma, cond, uncond, cfg)
        return uncond + (cond - uncond) * cfg

    def with_uncond(self, x: torch.Tensor, sigma: torch.Tensor, seed=None, skip_cfg1: bool = False,
                    **_):
        """(guided x0, unconditional x0); evaluates the negative (CFG++ samplers) unless
        ``skip_cfg1`` and the step's cfg is ≈ 1: then, as ComfyUI's post-CFG hook with the cfg-1
        optimisation on, the unconditional x0 reported is the conditional one."""
        cfg = cfg_at(self.sampler_patches, sigma, self.cfg)
        if skip_cfg1 and self._skip_cfg1 and math.isclose(cfg, 1.0):
            (cond,) = self.calc_cond_batch([self.positive], x, sigma)
            if self.sampler_patches:
                return self._guide(x, sigma, cond, torch.zeros_like(cond), cfg, has_uncond=False), cond
            return cond, cond
        cond, uncond = self.calc_cond_batch([self.positive, self.negative], x, sigma)
        if self.sampler_patches:
            return self._guide(x, sigma, cond, uncond, cfg), uncond
        return uncond + (cond - uncond) * cfg, uncond

    def _guide(self, x, sigma, cond, uncond, cfg: float, has_uncond: bool = True) -> torch.Tensor:
        """The model's sampler patches (sampling/cfg_patches.py) in place of the CFG formula."""
        def evaluate(unet_patches):
            return self.calc_cond_batch([self.positive], x, sigma, unet_patches)[0]

        def evaluate_negative(x_in, unet_patches):
            return self.calc_cond_batch([self.negative], x_in, sigma, unet_patches)[0]

        def evaluate_conds(conds):
            return self.calc_cond_batch([self.extra_list(conds)], x, sigma)[0]

        args = GuidanceArgs(x, sigma, cfg, cond, uncond, evaluate, evaluate_negative,
                            self.patch_state, has_uncond, evaluate_conds, model=self.model)
        return guide(self.sampler_patches, args, pre=self.pre_cfg)
