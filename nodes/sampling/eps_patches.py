"""Post-CFG patches of ComfyUI's ``comfy_extras/nodes_eps.py`` (comfyanonymous/ComfyUI, file
commit 09d0de4): EpsilonScaling and TemporalScoreRescaling, in the "post_cfg" stage of
``cfg_patches.py`` (both are ``set_model_sampler_post_cfg_function`` patches there, not model
function wrappers: they refine the guided x0 after CFG and every other patch before them).

Both rewrite the guided x0 ``D`` of the noisy sample ``x`` at noise level σ through its noise
prediction x − D (VE view x = x0 + σ·ε).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from .cfg_patches import GuidanceArgs

__all__ = ["EpsilonScaling", "TemporalScoreRescaling", "tsr_factor"]


@dataclass(frozen=True)
class EpsilonScaling:
    """Epsilon scaling (Ning et al. 2023, "Elucidating the Exposure Bias in Diffusion Models",
    arXiv:2308.15321, uniform schedule): the predicted noise is divided by ``scaling_factor``,
    D' = x − (x − D)/λ. A factor of exactly 0 counts as 1e-9, as in ComfyUI."""

    scaling_factor: float
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        factor = self.scaling_factor if self.scaling_factor != 0 else 1e-9
        return a.x - (a.x - denoised) / factor


def tsr_factor(snr: float, k: float, variance: float) -> float:
    """The score rescaling ratio r = (snr·v + 1)/(snr·v/k + 1) of Temporal Score Rescaling
    (eq. 6 of arXiv:2510.01184); r → k as snr → ∞."""
    if math.isinf(snr):
        return k
    return (snr * variance + 1.0) / (snr * variance / k + 1.0)


@dataclass(frozen=True)
class TemporalScoreRescaling:
    """Temporal Score Rescaling (arXiv:2510.01184): the noise prediction is scaled by r(σ) of
    ``tsr_factor`` with v = tsr_sigma², i.e. D' = x/α + r·(D − x/α), with the half log-SNR
    λ = −log σ and α = σ·e^λ of a VE/VP (non flow-matching) model sampling, which is every model
    sampling mixgraph runs (SD 1.x/2.x/SDXL, discrete or continuous EDM/V): α = 1, snr = 1/σ².
    Unchanged at k = 1, at σ = 0 and where the snr is 0 (σ = ∞), as in ComfyUI. The sigma used
    is the batch's first (ComfyUI's ``args["sigma"][0]``)."""

    tsr_k: float
    tsr_sigma: float
    stage: str = "post_cfg"

    def post(self, a: GuidanceArgs, denoised: Tensor) -> Tensor:
        sigma = float(a.sigma.reshape(-1)[0])
        if self.tsr_k == 1 or sigma == 0:
            return denoised
        half_log_snr = -math.log(sigma)
        snr = math.exp(2.0 * half_log_snr)
        if snr == 0:
            return denoised
        r = tsr_factor(snr, self.tsr_k, self.tsr_sigma ** 2)
        alpha = sigma * math.exp(half_log_snr)
        base = a.x / alpha
        return base + (denoised - base) * r
