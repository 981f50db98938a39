"""Stability's SD 2.x x4 upscaler ("x4-upscaler-ema"): the low-resolution image the UNet is
conditioned on, and the model family's fixed settings.

The model (Rombach et al. 2022, "High-Resolution Image Synthesis with Latent Diffusion Models",
§4.4 super-resolution; Stability's ``x4-upscaling.yaml``) is an SD2-style UNet whose input is the
noisy latent (4 channels) concatenated with the low-resolution RGB image at latent size
(3 channels, pixel values in [-1, 1]); the image may be noised first ("noise augmentation") and
its noise level is the UNet's class label (``label_emb``, an embedding of ``num_classes`` = 1000
rows). Its VAE has 3 resolution levels, so a latent pixel is 4×4 image pixels and the decoded
picture is 4× the low-resolution image.

Facts carried over from ComfyUI (``supported_models.SD_X4Upscaler``, ``model_base.SD_X4Upscaler``,
``ldm/modules/diffusionmodules/upscaling.py``, ``latent_formats.SD_X4``):

* v-prediction on the discrete schedule with betas linear in sqrt from 0.0001 to 0.02
  (``sampling_settings``); latent scale factor 0.08333; heads: 8 per transformer whatever its width
  (``num_heads`` 8, ``num_head_channels`` −1), self-attention off on the first three levels
  (read from tensor shapes here, ``unet.UNetConfig.disable_self_attentions``).
* Per cond (``extra_conds``): the noise level is ``round(350 · noise_augmentation)``; the cond's
  image (zeros without one) is resized bilinearly with a centre crop to the latent's size; when
  noise_augmentation > 0 it is noised to that level of the augmentation schedule (1000 steps,
  betas linear in sqrt 0.0001..0.02, ᾱ in float64, √ᾱ and √(1−ᾱ) stored as float32):
  ``√ᾱ_n·image + √(1−ᾱ_n)·ε``, ε ~ N(0, I) of the image's shape from a generator seeded with
  (sampling seed − 10); then brought to the latent's batch size (``resize_to_batch_size``). The
  noise level is the UNet's ``y``, the same for every image of the batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.families.sd.unet import UNetConfig

__all__ = ["ImageAugmentor", "conditioning_inputs", "is_x4_upscaler", "x4_unet_config", "linear_alphas_cumprod",
           "resize_to_batch_size", "LATENT_SCALE", "BETA_RANGE", "IMAGE_CHANNELS"]

LATENT_SCALE = 0.08333  # ComfyUI latent_formats.SD_X4
BETA_RANGE = (0.0001, 0.02)  # the diffusion schedule and the augmentation schedule alike
IMAGE_CHANNELS = 3
MAX_NOISE_LEVEL = 350


def is_x4_upscaler(cfg: UNetConfig) -> bool:
    """A UNet with class labels and 3 more input channels than it outputs (the RGB image)."""
    return (cfg.num_classes is not None and cfg.adm_in_channels is None
            and cfg.in_channels == cfg.out_channels + IMAGE_CHANNELS)


def x4_unet_config(cfg: UNetConfig) -> UNetConfig:
    """The family's head rule (8 heads at every width), which tensor shapes cannot tell."""
    return dataclasses.replace(cfg, num_heads=8, num_head_channels=-1)


def linear_alphas_cumprod(linear_start: float, linear_end: float, steps: int = 1000) -> Tensor:
    """ᾱ of LDM's "linear" schedule (betas linear in sqrt, then squared), float64."""
    betas = torch.linspace(linear_start**0.5, linear_end**0.5, steps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


def resize_to_batch_size(t: Tensor, batch: int) -> Tensor:
    """ComfyUI's ``utils.resize_to_batch_size``: ``batch`` entries picked evenly from dim 0
    (stretched, not tiled: 2 images for a batch of 4 give a, a, b, b)."""
    n = t.shape[0]
    if n == batch:
        return t
    if batch <= 1:
        return t[:batch]
    if batch < n:
        scale = (n - 1) / (batch - 1)
        index = [min(round(i * scale), n - 1) for i in range(batch)]
    else:
        scale = n / batch
        index = [min(math.floor((i + 0.5) * scale), n - 1) for i in range(batch)]
    return t[index]


@dataclass(frozen=True)
class ImageAugmentor:
    """The x4 upscaler's low-resolution image conditioning (ComfyUI's
    ``ImageConcatWithNoiseAugmentation`` with ``max_noise_level`` 350)."""

    max_noise_level: int = MAX_NOISE_LEVEL
    linear_start: float = BETA_RANGE[0]
    linear_end: float = BETA_RANGE[1]

    def level(self, noise_augmentation: float) -> int:
        return round(self.max_noise_level * float(noise_augmentation))

    def noised(self, image: Tensor, level: int, seed: int) -> Tensor:
        """q_sample: √ᾱ_level·image + √(1−ᾱ_level)·ε, ε drawn with ``seed`` in image's shape."""
        ac = linear_alphas_cumprod(self.linear_start, self.linear_end)[level]
        a, b = ac.sqrt().to(torch.float32), (1.0 - ac).sqrt().to(torch.float32)
        gen = torch.Generator().manual_seed(_wrap_seed(seed))
        noise = torch.randn(image.shape, generator=gen, dtype=torch.float32)  # [B, 3, H, W]
        return a * image.float() + b * noise.to(image.device)

    def concat(self, image: Tensor | None, noise_augmentation: float, latent_shape, seed: int) -> Tensor:
        """[B, 3, H, W]: the UNet's extra input channels for a latent of ``latent_shape``
        (B, C, H, W). ``image``: the cond's [Bi, 3, h, w] in [-1, 1], or None (zeros).
        ``seed``: the sampling seed (the noise is drawn with seed − 10)."""
        b, _, h, w = (int(v) for v in latent_shape)
        if image is None:
            image = torch.zeros(b, IMAGE_CHANNELS, h, w)
        else:
            image = upscale(image.float(), w, h, "bilinear", "center")  # [Bi, 3, H, W]
        if noise_augmentation > 0:
            image = self.noised(image, self.level(noise_augmentation), int(seed) - 10)
        return resize_to_batch_size(image, b)

    def label(self, noise_augmentation: float) -> Tensor:
        """[1, 1] the noise level as the UNet's class label (float32; whole number)."""
        return torch.tensor([[float(self.level(noise_augmentation))]])


def _wrap_seed(seed: int) -> int:
    # ComfyUI seeds torch.manual_seed(seed), which draws as a generator seeded with seed mod 2**64
    # (seeds below 10 give negative seeds here)
    return int(seed) % (1 << 64)


def conditioning_inputs(images: Tensor, scale_ratio: float) -> tuple[Tensor, Tensor]:
    """SD_4XUpscale_Conditioning's tensors for IMAGE ``images`` [B, H, W, C] in 0..1: the output
    is W·scale_ratio × H·scale_ratio pixels (rounded, at least 1), so the latent is a quarter of
    that (floor). Returns (the image the conds carry, [B, 3, h, w] in [-1, 1]: centre-cropped to
    the output's aspect and resized bilinearly to the latent size; the empty latent [B, 4, h, w])."""
    width = max(1, round(images.shape[-2] * float(scale_ratio)))
    height = max(1, round(images.shape[-3] * float(scale_ratio)))
    w, h = width // 4, height // 4
    if w < 1 or h < 1:
        raise ValueError(f"the output would be {width}x{height} pixels (the {images.shape[-2]}x{images.shape[-3]} "
                         f"image times scale_ratio {scale_ratio}); the x4 upscaler needs at least 4x4")
    pixels = images[..., :IMAGE_CHANNELS].movedim(-1, 1).float() * 2.0 - 1.0  # [B, 3, H, W] in [-1, 1]
    pixels = upscale(pixels, w, h, "bilinear", "center")  # [B, 3, h, w]
    return pixels, torch.zeros(images.shape[0], 4, h, w)
