"""Samplers that ComfyUI offers only through their own ``Sampler*`` nodes, never in KSampler's
list (``comfy_extras/nodes_advanced_samplers.py``): LCM with progressive latent upscaling
(SamplerLCMUpscale) and the "alternative" Euler CFG++ (SamplerEulerCFGpp, version
"alternative"). Same contract as every ``sample_*`` (``samplers.py``).

SamplerLCMUpscale's re-noising draws ``randn_like`` from torch's global CPU generator, as
ComfyUI does: ``noise.prepare_noise`` seeded it with the sampling seed and drew the initial noise
from it just before the sampler starts, so the stream continues exactly where ComfyUI's does.
``global_noise_like`` is the one place this sampler touches the global generator.
"""

from __future__ import annotations

import numpy as np
import torch

from mixgraph.nodes.models.resize import upscale
from .sampler_utils import denoise_with_uncond, report_step, to_d

__all__ = ["sample_lcm_upscale", "sample_euler_pp", "global_noise_like"]


def global_noise_like(x: torch.Tensor) -> torch.Tensor:
    """N(0, I) like x from torch's global CPU generator (ComfyUI parity, see the module doc)."""
    return torch.randn(x.shape, dtype=x.dtype).to(x.device)


@torch.no_grad()
def sample_lcm_upscale(model, x, sigmas, extra_args=None, callback=None, disable=None, noise_sampler=None,
                       total_upscale=2.0, upscale_method="bislerp", upscale_steps=None):
    """LCM multistep sampling (Luo et al. 2023, Algorithm 1) that enlarges the x0 estimate by
    ``total_upscale`` over the first ``upscale_steps`` steps (equal factor increments from 1;
    default: half the steps + 1, at least 2 entries) before re-noising it to the next σ."""
    extra_args = {} if extra_args is None else extra_args
    if upscale_steps is None:
        upscale_steps = max(len(sigmas) // 2 + 1, 2)
    else:
        upscale_steps = min(int(upscale_steps) + 1, len(sigmas) + 1)
    factors = np.linspace(1.0, float(total_upscale), upscale_steps)[1:]
    h0, w0 = x.shape[-2:]
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report_step(callback, i, x, sigmas[i], denoised)
        x = denoised
        if i < len(factors):
            x = upscale(x, round(w0 * factors[i]), round(h0 * factors[i]), upscale_method, "disabled")
        if sigmas[i + 1] > 0:
            noise = noise_sampler(sigmas[i], sigmas[i + 1]) if noise_sampler is not None else global_noise_like(x)
            x = x + sigmas[i + 1] * noise
    return x


@torch.no_grad()
def sample_euler_pp(model, x, sigmas, extra_args=None, callback=None, disable=None, noise_sampler=None):
    """Euler with the unconditional prediction folded into the direction (ComfyUI's
    "alternative" SamplerEulerCFG++): d = (x − 2·D_cfg + D_uncond) / σ, x += d·(σ_next − σ)."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised, uncond = denoise_with_uncond(model, x, sigmas[i] * s_in, **extra_args)
        d = to_d(x - denoised + uncond, sigmas[i], denoised)
        report_step(callback, i, x, sigmas[i], denoised)
        x = x + d * (sigmas[i + 1] - sigmas[i])
    return x
