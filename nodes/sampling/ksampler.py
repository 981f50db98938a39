"""The sampling glue: ComfyUI's ``common_ksampler`` (KSampler / KSamplerAdvanced) and
``sample_custom`` (SamplerCustom / SamplerCustomAdvanced), one core for both.

``sample`` turns steps into sigmas (scheduler, denoise, advanced cuts) and calls
``sample_custom``, which owns the latent format (``process_in``/``process_out``), noising to σ0,
the inpaint noise mask, the guidance denoiser (``guidance.build_denoiser``), progress/cancel and
the way back to an unscaled LATENT.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from mixgraph.nodes.vae.latent_format import format_of
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.payloads.sampling import Sampler as SamplerSpec
from .cfg_patches import denoise_mask_patches
from .guidance import build_denoiser
from .noise import initial_noise, prepare_inpaint_noise
from . import context_windows, step_cache
from .parameterization import ModelSampling
from .samplers import DISCARD_PENULTIMATE_SIGMA_SAMPLERS, get_sampler
from .schedules import calculate_sigmas

__all__ = ["sample", "sample_custom", "add_noise", "compute_sigmas", "cut_sigmas", "InpaintDenoiser", "prepare_mask",
           "fix_empty_latent_channels"]


def fix_empty_latent_channels(model, latent: Latent) -> Latent:
    """An all-zero LATENT whose channel count differs from the model's latent format, resized to
    the model's channels (ComfyUI ``comfy.sample.fix_empty_latent_channels``): EmptyLatentImage
    always makes 4 channels, and a 16-channel model (SD3, Flux) samples it as 16 zero channels.
    A latent with any nonzero value, or a model without a ``latent_format`` naming its
    ``channels``, is returned unchanged. KSampler / KSamplerAdvanced (``sample``) and
    SamplerCustom / SamplerCustomAdvanced call it before drawing the noise, as ComfyUI does, so
    the noise has the model's shape. A 4-D latent given to a video model (a runner with
    ``video_latent``: Wan) gets a frame axis first, [B, C, 1, H, W], as ComfyUI does for a latent
    format of three dimensions."""
    channels = getattr(getattr(model, "latent_format", None), "channels", None)
    samples = latent.samples
    if channels is not None and samples.ndim == 4 and getattr(model, "video_latent", False):
        # a video model given an image latent: one frame (ComfyUI adds the frame axis for a format
        # of three latent dimensions)
        latent = replace(latent, samples=samples.unsqueeze(2))  # [B, C, 1, H, W]
        samples = latent.samples
    if channels is None or samples.ndim < 2 or samples.shape[1] == int(channels):
        return latent
    if torch.count_nonzero(samples) != 0:
        return latent
    shape = (samples.shape[0], int(channels)) + tuple(samples.shape[2:])
    return replace(latent, samples=samples.new_zeros(shape))  # zeros tiled/cut = zeros


def compute_sigmas(
    model_sampling: ModelSampling, scheduler: str, sampler_name: str, steps: int,
    denoise: float = 1.0,
) -> torch.Tensor:
    """ComfyUI ``KSampler.set_steps``: full schedule, or for denoise < 1 the last steps+1 sigmas
    of a ``int(steps/denoise)``-step schedule; empty for denoise ≤ 0. Samplers in
    ``DISCARD_PENULTIMATE_SIGMA_SAMPLERS`` get one extra step with the penultimate sigma dropped."""

    def calc(n: int) -> torch.Tensor:
        if sampler_name in DISCARD_PENULTIMATE_SIGMA_SAMPLERS:
            s = calculate_sigmas(model_sampling.schedule, scheduler, n + 1)
            return torch.cat([s[:-2], s[-1:]])
        return calculate_sigmas(model_sampling.schedule, scheduler, n)

    if denoise is None or denoise > 0.9999:
        return calc(steps)
    if denoise <= 0.0:
        return torch.FloatTensor([])
    return calc(int(steps / denoise))[-(steps + 1):]


def cut_sigmas(
    sigmas: torch.Tensor, start_step: int | None, last_step: int | None, force_full_denoise: bool
) -> torch.Tensor | None:
    """KSamplerAdvanced cuts; ``None`` means "return the input latent unchanged"."""
    if last_step is not None and last_step < len(sigmas) - 1:
        sigmas = sigmas[: last_step + 1].clone()
        if force_full_denoise:
            sigmas[-1] = 0
    if start_step is not None:
        if start_step < len(sigmas) - 1:
            sigmas = sigmas[start_step:]
        else:
            return None
    return sigmas


def prepare_mask(noise_mask: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Noise mask → [B, C, H, W] at latent size (bilinear), like ComfyUI ``reshape_mask``; for a
    video latent [B, C, T, H, W], ``prepare_video_mask``."""
    if len(shape) == 5:
        return prepare_video_mask(noise_mask, shape)
    m = noise_mask.reshape(-1, 1, noise_mask.shape[-2], noise_mask.shape[-1]).float()
    m = F.interpolate(m, size=tuple(shape[2:]), mode="bilinear")  # [Bm,1,H,W]
    if m.shape[1] < shape[1]:
        m = m.repeat(1, shape[1], 1, 1)[:, : shape[1]]  # [Bm,C,H,W]
    if m.shape[0] < shape[0]:
        reps = -(-shape[0] // m.shape[0])
        m = m.repeat(reps, 1, 1, 1)
    return m[: shape[0]]


def prepare_video_mask(noise_mask: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Noise mask → [B, C, T, H, W] at latent size (trilinear), ComfyUI ``reshape_mask`` for three
    latent dimensions: a 5-D mask [Bm, 1, T', H', W'] is resized as it is; a mask of fewer
    dimensions is read as frames [1, 1, N, H', W']."""
    m = noise_mask.float()
    if m.ndim < 5:
        m = m.reshape(1, 1, -1, m.shape[-2], m.shape[-1])  # [1, 1, N, H', W']
    m = F.interpolate(m, size=tuple(shape[2:]), mode="trilinear")  # [Bm, Cm, T, H, W]
    if m.shape[1] < shape[1]:
        m = m.repeat(1, shape[1], 1, 1, 1)[:, : shape[1]]
    if m.shape[0] < shape[0]:
        m = m.repeat(-(-shape[0] // m.shape[0]), 1, 1, 1, 1)
    return m[: shape[0]]


class InpaintDenoiser:
    """Keeps the unmasked region on the input latent (ComfyUI ``KSamplerX0Inpaint``): before each
    model call the region where mask = 0 is replaced by latent + σ·noise (the input re-noised to
    the current level with the sampling noise, or ddim's separate seed+1 noise), and the
    prediction there is replaced by the input latent.

    ``mask_patches`` (sampler patches of stage "denoise_mask", e.g. DifferentialDiffusion)
    rewrite the mask before each call, given the current sigma and the run's ``sigmas``.

    ``keep_clean``: the kept region is the input latent itself, not re-noised (ComfyUI's
    ``scale_latent_inpaint`` of a model that denoises per region, Wan 2.2's 5B model, whose given
    first frame runs at timestep 0); the sampler model says so with ``inpaint_keeps_clean``."""

    def __init__(self, inner, latent_image: torch.Tensor, noise: torch.Tensor,
                 denoise_mask: torch.Tensor, model_sampling: ModelSampling,
                 mask_patches: Sequence = (), sigmas: torch.Tensor | None = None,
                 keep_clean: bool = False):
        self.inner = inner
        self.latent_image = latent_image
        self.noise = noise
        self.mask = denoise_mask
        self.ms = model_sampling
        self.mask_patches = tuple(mask_patches)
        self.sigmas = sigmas
        self.keep_clean = keep_clean

    def _mask_at(self, sigma):
        mask = self.mask
        for p in self.mask_patches:
            mask = p.mask(sigma, mask, self.sigmas, self.ms)
        return mask

    def _blend_in(self, x, sigma, mask):
        if self.keep_clean:
            return x * mask + self.latent_image * (1.0 - mask)
        renoised = self.ms.noise_scaling(sigma, self.noise, self.latent_image)
        return x * mask + renoised * (1.0 - mask)

    def _blend_out(self, out, mask):
        return out * mask + self.latent_image * (1.0 - mask)

    def __call__(self, x, sigma, **extra):
        mask = self._mask_at(sigma)
        return self._blend_out(self.inner(self._blend_in(x, sigma, mask), sigma, **extra), mask)

    def with_uncond(self, x, sigma, **extra):
        mask = self._mask_at(sigma)
        denoised, uncond = self.inner.with_uncond(self._blend_in(x, sigma, mask), sigma, **extra)
        return self._blend_out(denoised, mask), uncond


@torch.no_grad()
def sample(
    model,
    *,
    seed: int,
    steps: int,
    cfg: float,
    sampler_name: str,
    scheduler: str,
    positive: Sequence[Cond],
    negative: Sequence[Cond],
    latent: Latent,
    denoise: float = 1.0,
    add_noise: bool = True,
    start_step: int | None = None,
    last_step: int | None = None,
    force_full_denoise: bool = False,
    on_step: Callable[..., None] | None = None,
    preview: Callable[[torch.Tensor], Any] | None = None,
) -> Latent:
    """Run one KSampler (ComfyUI ``common_ksampler``); returns a new float32 CPU Latent (mask and
    batch_index kept): steps → sigmas (scheduler, denoise, penultimate drop, advanced cuts),
    then ``sample_custom`` with CFG guidance.

    ``on_step(i, total)`` is called once per sampler step with i = 1..total (ComfyUI's progress
    value); an exception raised there cancels sampling and propagates. With ``preview`` (x0 →
    image, ``sampling/preview.py``) it is called as ``on_step(i, total, image)`` with the step's
    preview of its x0 prediction.
    """
    get_sampler(sampler_name)  # fails before any work for unknown names
    ms = ModelSampling.for_model(model)
    latent = fix_empty_latent_channels(model, latent)
    noise = initial_noise(latent, seed, add_noise)  # ComfyUI draws it before the sigmas
    sigmas = compute_sigmas(ms, scheduler, sampler_name, steps, denoise)
    if len(sigmas) == 0:
        return replace(latent, samples=latent.samples.float().clone())
    sigmas = cut_sigmas(sigmas, start_step, last_step, force_full_denoise)
    if sigmas is None:
        return replace(latent, samples=latent.samples.float().clone())
    guidance = Guidance("cfg", (tuple(positive), tuple(negative)), (float(cfg),))
    out, _ = sample_custom(model, guidance=guidance, sampler=SamplerSpec(sampler_name),
                           sigmas=sigmas, noise=noise, seed=seed, latent=latent, on_step=on_step,
                           preview=preview)
    return out


@torch.no_grad()
def sample_custom(
    model,
    *,
    guidance: Guidance,
    sampler: SamplerSpec,
    sigmas: torch.Tensor,
    noise: torch.Tensor,
    seed: int,
    latent: Latent,
    on_step: Callable[..., None] | None = None,
    preview: Callable[[torch.Tensor], Any] | None = None,
    negative_model=None,
) -> tuple[Latent, Latent]:
    """The one sampling core (ComfyUI ``CFGGuider.sample`` + ``KSAMPLER.sample``), shared by
    KSampler, SamplerCustom and SamplerCustomAdvanced.

    ``noise`` is the initial noise (``initial_noise``), ``seed`` the seed the sampler's per-step
    noise is built from (``extra_args["seed"]``). Steps: bring a non-empty latent into the
    model's latent space with its latent format's ``process_in`` (the empty latent stays 0, as in
    ComfyUI), noise it to ``sigmas[0]`` (sqrt(1 + σ0²) at full denoise), wrap the guidance
    denoiser in the inpaint blend when the latent has a noise mask (``ddim``: separate seed + 1
    noise), run the sampler with ``sampler.options``, and return both the sample and the last x0
    through ``process_out``.

    ``on_step``/``preview``: as in ``sample``; the preview sees the x0 prediction in the
    sampler's latent space (after ``process_in``), as ComfyUI's previewers do.

    ``negative_model``: the SamplerModel of a "dual_model" guidance's negative pass
    (DualModelGuider); None otherwise or when it is not loaded (base cfg ≈ 1).

    Returns (output, denoised_output): the sampled Latent and the last step's x0 prediction
    (ComfyUI's ``denoised_output``; the output itself when no step ran). Empty ``sigmas``
    returns the input latent unchanged for both.
    """
    fn = get_sampler(sampler.name)
    if len(sigmas) == 0:
        same = replace(latent, samples=latent.samples.float().clone())
        return same, same
    ms = ModelSampling.for_model(model)
    fixed = fix_empty_latent_channels(model, latent)
    if fixed is not latent and noise.shape[1] != fixed.samples.shape[1]:
        raise ValueError(f"sampling: {noise.shape[1]}-channel noise for an empty latent the model "
                         f"samples with {fixed.samples.shape[1]} channels; draw the noise after "
                         f"ksampler.fix_empty_latent_channels, as KSampler does")
    latent = fixed
    latent_image = latent.samples.float()
    sigmas = sigmas.float()

    device = torch.device(getattr(model, "device", "cpu"))
    fmt = format_of(model)
    if torch.count_nonzero(latent_image) > 0:  # ComfyUI does not shift the empty latent
        latent_image = fmt.process_in(latent_image)
    latent_image = latent_image.to(device)
    noise = noise.float().to(device)
    sigmas = sigmas.to(device)

    denoise_mask = None
    if latent.noise_mask is not None:
        denoise_mask = prepare_mask(latent.noise_mask.to(device), noise.shape)

    denoiser = build_denoiser(guidance, model, latent_image, denoise_mask, ms, seed=seed,
                              negative_model=negative_model)
    context_windows.attach(denoiser, getattr(model, "sampler_patches", ()), sigmas)
    # EasyCache / LazyCache: per-run state; LazyCache wraps the guided prediction (inside the blend)
    denoiser, cache_run = step_cache.attach(denoiser, getattr(model, "sampler_patches", ()), ms)
    noise = context_windows.shuffle_noise(getattr(model, "sampler_patches", ()), noise, seed)
    if denoise_mask is not None:
        inpaint_noise = noise
        if sampler.name == "ddim":
            inpaint_noise = prepare_inpaint_noise(noise.shape, seed).to(device)
        denoiser = InpaintDenoiser(denoiser, latent_image, inpaint_noise, denoise_mask, ms,
                                   denoise_mask_patches(getattr(model, "sampler_patches", ())), sigmas,
                                   keep_clean=getattr(model, "inpaint_keeps_clean", False))

    x = ms.noise_scaling(sigmas[0], noise, latent_image, ms.is_max_denoise(sigmas))
    total = len(sigmas) - 1
    last_x0: list[torch.Tensor] = []

    def callback(info):
        last_x0[:] = [info["denoised"]]
        if on_step is None:
            return
        step = min(int(info["i"]) + 1, total)
        if preview is None:
            on_step(step, total)
        else:
            on_step(step, total, preview(info["denoised"]))

    try:
        out = fn(denoiser, x, sigmas, extra_args={"seed": seed}, callback=callback,
                 **sampler.kwargs())
    finally:
        if cache_run is not None:
            cache_run.finish(total)
    out = ms.inverse_noise_scaling(sigmas[-1], out)
    result = replace(latent, samples=fmt.process_out(out).float().cpu())
    if not last_x0:
        return result, result
    return result, replace(latent, samples=fmt.process_out(last_x0[0]).float().cpu())


@torch.no_grad()
def add_noise(model, noise: torch.Tensor, sigmas: torch.Tensor, latent: Latent) -> Latent:
    """ComfyUI's AddNoise: noise the latent to the level of a sigma span without sampling.

    The noise level is |σ_first − σ_last| (σ_first for a single sigma); the latent goes through
    the model's ``process_in`` unless it is all zero, is noised as ``latent + noise·level`` (the
    model's ``noise_scaling``), comes back through ``process_out``, and NaN/±inf become 0. Empty
    ``sigmas`` returns the latent unchanged. ``model`` is anything with ``prediction``/``zsnr``
    and a latent format or scale (a MODEL handle or a SamplerModel; ``latent_format.format_of``).
    """
    if len(sigmas) == 0:
        return latent
    ms = ModelSampling.for_model(model)
    fmt = format_of(model)
    level = (sigmas[0] - sigmas[-1]).abs() if len(sigmas) > 1 else sigmas[0]
    latent_image = latent.samples.float()
    if torch.count_nonzero(latent_image) > 0:
        latent_image = fmt.process_in(latent_image)
    noisy = fmt.process_out(ms.noise_scaling(level.float(), noise.float(), latent_image))
    return replace(latent, samples=torch.nan_to_num(noisy, nan=0.0, posinf=0.0, neginf=0.0))

