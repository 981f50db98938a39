"""unCLIP image conditioning: the UNet's vector input built from CLIP vision image embeddings
(Ramesh et al. 2022, "Hierarchical Text-Conditional Image Generation with CLIP Latents"; Stable
Diffusion 2.1 unCLIP), and SDXL "Revision" (the same embeddings as SDXL's pooled text vector).

ComfyUI (``model_base.unclip_adm``, ``CLIPEmbeddingNoiseAugmentation``): per image embedding e
[P] of each unCLIPConditioning entry (strength s, noise augmentation a), the noise level is
n = round(999·a); e is noised to step n of a 1000-step ``squaredcos_cap_v2`` DDPM schedule,
√ᾱ_n·e + √(1−ᾱ_n)·ε, with ε ~ N(0, I) from a generator seeded with (sampling seed − 10); the
vector is cat(noised e, timestep_embedding(n, P))·s. Several entries (or a batch of images) are
summed and the sum's first P values are noised again at the merge level (0.05 for SD2.1 unCLIP,
0 for SDXL), unweighted. ComfyUI's augmentor normalises with data_mean 0 / data_std 1 (the
checkpoint's statistics are not loaded), so no normalisation happens here either.
A cond without unCLIP entries gives zeros (SD2.1 unCLIP) / its pooled text (SDXL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.families.sd.unet import timestep_embedding

__all__ = ["NoiseAugmentor", "unclip_adm", "squaredcos_alphas_cumprod"]

MAX_NOISE_LEVEL = 1000


def squaredcos_alphas_cumprod(steps: int = 1000, max_beta: float = 0.999) -> Tensor:
    """ᾱ of the "squaredcos_cap_v2" schedule (Nichol & Dhariwal 2021, "Improved DDPM", eq. 17,
    betas clipped at 0.999), computed in float64 as LDM's numpy code does, returned as float32."""
    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = torch.tensor([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), max_beta)
                          for i in range(steps)], dtype=torch.float64)
    return torch.cumprod(1.0 - betas, dim=0)  # float64


@dataclass(frozen=True)
class NoiseAugmentor:
    """The model's image-embedding noise augmentation: embedding width (the timestep embedding is
    as wide) and the noise level used to re-noise a merged sum."""

    dim: int
    merge_augmentation: float = 0.05

    def __call__(self, embeds: Tensor, level: int, seed: int) -> Tensor:
        """embeds [P] or [1, P] -> [1, 2P]: noised embedding, then the level's embedding."""
        x = embeds.reshape(1, -1).float()
        if x.shape[1] != self.dim:
            raise ValueError(f"unCLIP: the model takes {self.dim}-wide image embeddings, got {x.shape[1]} "
                             f"(use the CLIP vision model this checkpoint was made for)")
        ac = _alphas_cumprod()[level]
        # √ᾱ and √(1−ᾱ) in float64, then float32 (LDM's registered buffers)
        a, b = ac.sqrt().to(torch.float32), (1.0 - ac).sqrt().to(torch.float32)
        noise = torch.randn(x.shape[1:], generator=_generator(seed), dtype=torch.float32)  # [P]
        noised = a * x + b * noise  # [1, P]
        return torch.cat([noised, timestep_embedding(torch.tensor([level]), self.dim)], dim=1)


_CACHE: dict[str, Tensor] = {}


def _alphas_cumprod() -> Tensor:
    if "ac" not in _CACHE:
        _CACHE["ac"] = squaredcos_alphas_cumprod(MAX_NOISE_LEVEL)
    return _CACHE["ac"]


def _generator(seed: int) -> torch.Generator:
    # ComfyUI seeds torch's default CPU generator (torch.manual_seed); a fresh generator with the
    # same seed draws the same numbers. Negative seeds wrap as torch.manual_seed wraps them.
    return torch.Generator().manual_seed(int(seed) % (1 << 64))


def _level(augmentation: float) -> int:
    return round((MAX_NOISE_LEVEL - 1) * float(augmentation))


def unclip_adm(entries, augmentor: NoiseAugmentor, seed: int) -> Tensor:
    """[1, 2P] vector input from ``entries`` (each with ``image_embeds`` [B, P], ``strength``,
    ``noise_augmentation``; ``Cond.unclip``). ``seed`` is the sampling seed (ComfyUI uses seed − 10)."""
    seed = int(seed) - 10
    outs = []
    for e in entries:
        for row in e.image_embeds:
            outs.append(augmentor(row, _level(e.noise_augmentation), seed) * float(e.strength))
    if not outs:
        raise ValueError("unclip_adm: no image embeddings")
    if len(outs) == 1:
        return outs[0]
    total = torch.stack(outs).sum(0)  # [1, 2P]
    return augmentor(total[:, :augmentor.dim], _level(augmentor.merge_augmentation), seed)
