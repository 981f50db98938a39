"""Noise for sampling: the initial latent noise and the noise samplers used during sampling.

Three sources, each matching ComfyUI so seeds reproduce its images:

* ``prepare_noise``: the initial noise (``comfy/sample.py: prepare_noise``). It seeds torch's
  **global** CPU generator with ``torch.manual_seed(seed)`` and draws from it. This is the one
  place in mixgraph allowed to touch the global RNG: ComfyUI does exactly this, and code that draws
  from the global generator after a KSampler (custom nodes, ``randn_like`` in churn) sees that
  state, so parity needs the same side effect. Everything else gets an explicit generator.
* ``default_noise_sampler``: per-step noise for ancestral samplers, a ``torch.Generator`` on x's
  device seeded with the node's seed itself (ComfyUI 0.3.64; its docstring states the convention
  exactly).
* ``BrownianTreeNoiseSampler``: Brownian-motion increments from ``torchsde.BrownianTree``
  (Li et al. 2020, "Scalable Gradients for Stochastic Differential Equations"), used by the SDE
  samplers so the noise is a consistent function of the sigma interval (Kidger et al. 2021,
  "Efficient and Accurate Gradients for Neural SDEs"), independent of the step count. A library
  does this well, so we use torchsde rather than write our own tree.

A noise sampler is a callable ``noise_sampler(sigma, sigma_next) -> Tensor`` shaped like x with
unit variance per element.
"""

from __future__ import annotations

from typing import Callable, Sequence

import warnings

import numpy as np
import torch
import torchsde

__all__ = [
    "NoiseSampler",
    "prepare_noise",
    "default_noise_sampler",
    "BrownianTreeNoiseSampler",
    "brownian_noise_sampler",
    "prepare_inpaint_noise",
    "initial_noise",
]

NoiseSampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def prepare_noise(
    latent: torch.Tensor, seed: int, batch_index: Sequence[int] | None = None
) -> torch.Tensor:
    """Initial noise for ``latent`` ([B, C, H, W]), bit-identical to ComfyUI.

    Seeds the global CPU generator (see module docstring). With ``batch_index``, noise for image k
    is the k-th of ``max(batch_index) + 1`` draws of shape [1, C, H, W], so a split batch gets the
    same noise as the whole batch would.
    """
    generator = torch.manual_seed(seed)
    if batch_index is None:
        return torch.randn(latent.shape, dtype=latent.dtype, generator=generator, device="cpu")
    unique, inverse = np.unique(np.asarray(batch_index), return_inverse=True)
    kept = []
    for i in range(int(unique[-1]) + 1):
        draw = torch.randn(
            (1, *latent.shape[1:]), dtype=latent.dtype, generator=generator, device="cpu"
        )
        if i in unique:
            kept.append(draw)
    return torch.cat([kept[j] for j in inverse.reshape(-1)], dim=0)  # [len(batch_index),C,H,W]


def default_noise_sampler(x: torch.Tensor, seed: int | None = None) -> NoiseSampler:
    """Per-step noise of the ancestral samplers, in ComfyUI 0.3.64's convention
    (``comfy/k_diffusion/sampling.py: default_noise_sampler``; comfy-conventions 6.2):

    * one ``torch.Generator(device=x.device)``, created once per sampler run and seeded with
      ``manual_seed(seed)``, where ``seed`` is the sampling node's seed unchanged (KSampler
      ``seed``, KSamplerAdvanced / SamplerCustom ``noise_seed``, RandomNoise ``noise_seed``,
      passed as ``extra_args["seed"]``);
    * each call draws ``torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=g)``: one
      draw of the whole batch per call, in call order (one per step for euler_ancestral, one
      per step after the second model call for dpm_2_ancestral / dpmpp_2s_ancestral; the
      ``sigma``/``sigma_next`` arguments are ignored).

    On the CPU this generator is the same algorithm, seeded alike, as the one ``prepare_noise``
    draws the initial noise from, so the first per-step draw equals the initial noise of a
    [B, C, H, W] latent bit for bit. That is what ComfyUI 0.3.64 does (its later fix, PR 11528,
    adds 1 to the seed on the CPU; mixgraph targets 0.3.64 and matches it). On CUDA the stream is
    CUDA's Philox generator, so ancestral results depend on the device, as in ComfyUI.
    ``seed=None`` draws from the global generator (k-diffusion's behaviour without a seed).
    """
    generator = None
    if seed is not None:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(int(seed))

    def sample(sigma, sigma_next):
        return torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)

    return sample


class BrownianTreeNoiseSampler:
    """Noise from a Brownian tree W(t) over t = transform(sigma), normalised to unit variance.

    ``__call__(sigma, sigma_next)`` returns (W(t1) - W(t0)) / sqrt(|t1 - t0|), with the sign of the
    increment following the direction t0 -> t1. ``transform`` maps sigma to the tree's time
    (identity by default, as ComfyUI's samplers use it). ``cpu=True`` keeps the tree on the CPU
    (seeded results independent of the accelerator); the ``*_gpu`` samplers pass ``cpu=False``.
    ``seed`` may be a sequence of one seed per batch item.
    """

    def __init__(
        self,
        x: torch.Tensor,
        sigma_min,
        sigma_max,
        seed: int | Sequence[int] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
        cpu: bool = False,
    ):
        self.transform = transform
        self.cpu = cpu
        t0 = transform(torch.as_tensor(sigma_min))
        t1 = transform(torch.as_tensor(sigma_max))
        t0, t1, self.sign = (t0, t1, 1) if t0 < t1 else (t1, t0, -1)
        w0 = torch.zeros_like(x)
        self.batched = isinstance(seed, (list, tuple))
        if seed is None:
            seeds = (int(torch.randint(0, 2**63 - 1, ()).item()),)
        elif self.batched:
            if len(seed) != x.shape[0]:
                raise ValueError("one seed per batch item is needed for a batched Brownian tree")
            seeds = tuple(seed)
            w0 = w0[0]
        else:
            seeds = (seed,)
        if cpu:
            t0, w0, t1 = t0.detach().cpu(), w0.detach().cpu(), t1.detach().cpu()
        self.trees = tuple(torchsde.BrownianTree(t0, w0, t1, entropy=s) for s in seeds)

    def _increment(self, t0: torch.Tensor, t1: torch.Tensor) -> torch.Tensor:
        t0, t1, sign = (t0, t1, 1) if t0 < t1 else (t1, t0, -1)
        device, dtype = t0.device, t0.dtype
        if self.cpu:
            t0, t1 = t0.detach().cpu().float(), t1.detach().cpu().float()
        with warnings.catch_warnings():
            # σ_max (or, with denoise < 1, the smallest σ) queried as float32 vs the tree's stored
            # end: a harmless 1-ulp mismatch; torchsde clamps to the interval.
            warnings.filterwarnings("ignore", message="Should have tb<=t1")
            warnings.filterwarnings("ignore", message="Should have ta>=t0")
            w = torch.stack([tree(t0, t1) for tree in self.trees])  # [n_trees, *x.shape or x[0].shape]
        w = w.to(device=device, dtype=dtype) * (self.sign * sign)
        return w if self.batched else w[0]

    def __call__(self, sigma, sigma_next) -> torch.Tensor:
        t0 = self.transform(torch.as_tensor(sigma))
        t1 = self.transform(torch.as_tensor(sigma_next))
        return self._increment(t0, t1) / (t1 - t0).abs().sqrt()


def brownian_noise_sampler(
    x: torch.Tensor, sigmas: torch.Tensor, seed: int | None, cpu: bool = True
) -> BrownianTreeNoiseSampler:
    """The Brownian sampler ComfyUI's SDE samplers build: t in [min σ>0, max σ]."""
    sigma_min, sigma_max = sigmas[sigmas > 0].min(), sigmas.max()
    return BrownianTreeNoiseSampler(x, sigma_min, sigma_max, seed=seed, cpu=cpu)


def prepare_inpaint_noise(shape: Sequence[int], seed: int) -> torch.Tensor:
    """The fixed noise that re-noises the kept region when ``ddim`` inpaints: ComfyUI's
    ``inpaint_options={"random": True}`` draws it with ``torch.manual_seed(seed + 1)`` on the
    CPU. Touches the global RNG for the same parity reason as ``prepare_noise``."""
    generator = torch.manual_seed(seed + 1)
    return torch.randn(tuple(shape), generator=generator, device="cpu")


def initial_noise(latent, seed: int, add: bool = True) -> torch.Tensor:
    """A LATENT's initial noise: ``prepare_noise`` from ``seed`` (honouring ``batch_index``), or
    zeros of the same shape when ``add`` is False (ComfyUI ``Noise_EmptyNoise``)."""
    samples = latent.samples.float()
    if not add:
        return torch.zeros_like(samples, device="cpu")
    return prepare_noise(samples, seed, latent.batch_index)
