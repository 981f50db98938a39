"""Plain functions on LATENT and CONDITIONING payloads used by the node declarations."""

from __future__ import annotations

import dataclasses

import torch

from mixgraph.nodes.imaging import grow_mask, scaled_size, upscale
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent

LATENT_CHANNELS = 4


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def empty_latent(width: int, height: int, batch_size: int) -> Latent:
    """Zeros [B,4,H/8,W/8]: the sampler leaves an all-zero latent unscaled (ComfyUI).

    A latent bigger than the free memory is refused up front with a clear error (sampling needs
    several copies of it, so even one copy that does not fit can never run)."""
    shape = (batch_size, LATENT_CHANNELS, height // 8, width // 8)
    needed = 4 * batch_size * LATENT_CHANNELS * (height // 8) * (width // 8)
    available = _available_bytes()
    if available is not None and needed > available:
        raise MemoryError(f"a {width}x{height} latent batch of {batch_size} needs {needed / 2**30:.1f} "
                          f"GiB, more than the {available / 2**30:.1f} GiB of memory available; "
                          f"lower width, height or batch_size")
    return Latent(torch.zeros(shape))


def upscale_latent(latent: Latent, method: str, width: int, height: int, crop: str) -> Latent:
    """LatentUpscale: resize to (w//8, h//8); a size of 0 keeps the aspect ratio; min 64 px."""
    s = latent.samples
    old_w, old_h = s.shape[-1] * 8, s.shape[-2] * 8
    width, height = scaled_size(old_w, old_h, width, height)
    width, height = max(64, width), max(64, height)
    samples = upscale(s, width // 8, height // 8, method, crop)
    return dataclasses.replace(latent, samples=samples)


def upscale_latent_by(latent: Latent, method: str, scale_by: float) -> Latent:
    """LatentUpscaleBy: new size = round(size * scale) in latent pixels."""
    s = latent.samples
    width, height = round(s.shape[-1] * scale_by), round(s.shape[-2] * scale_by)
    return dataclasses.replace(latent, samples=upscale(s, width, height, method, "disabled"))


def scale_image(image: torch.Tensor, method: str, width: int, height: int, crop: str) -> torch.Tensor:
    """ImageScale on IMAGE [B,H,W,3]; a size of 0 keeps the aspect ratio."""
    width, height = scaled_size(image.shape[2], image.shape[1], width, height)
    chw = image.movedim(-1, 1)  # [B,3,H,W]
    return upscale(chw, width, height, method, crop).movedim(1, -1).clamp(0, 1)


def scale_image_by(image: torch.Tensor, method: str, scale_by: float) -> torch.Tensor:
    width, height = round(image.shape[2] * scale_by), round(image.shape[1] * scale_by)
    return upscale(image.movedim(-1, 1), width, height, method, "disabled").movedim(1, -1).clamp(0, 1)


def crop_to_multiple(pixels: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """Centre-crop IMAGE [B,H,W,C] so H and W are multiples of `multiple` (VAEEncode)."""
    h, w = pixels.shape[1], pixels.shape[2]
    nh, nw = (h // multiple) * multiple, (w // multiple) * multiple
    if (nh, nw) == (h, w):
        return pixels
    y, x = (h % multiple) // 2, (w % multiple) // 2
    return pixels[:, y:y + nh, x:x + nw, :]


def prepare_inpaint(pixels: torch.Tensor, mask: torch.Tensor, grow_mask_by: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """VAEEncodeForInpaint: grey out masked pixels, dilate the mask. Returns (pixels, noise_mask)."""
    h, w = pixels.shape[1], pixels.shape[2]
    mask = torch.nn.functional.interpolate(mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]),
                                           size=(h, w), mode="bilinear")  # [B,1,H,W]
    pixels = crop_to_multiple(pixels)
    nh, nw = pixels.shape[1], pixels.shape[2]
    y, x = (h % 8) // 2, (w % 8) // 2
    mask = mask[..., y:y + nh, x:x + nw]
    noise_mask = grow_mask(mask, grow_mask_by)
    keep = (1.0 - mask.round()).squeeze(1).unsqueeze(-1)  # [B,H,W,1]
    grey = (pixels - 0.5) * keep + 0.5
    return grey, noise_mask


def with_noise_mask(latent: Latent, mask: torch.Tensor) -> Latent:
    return dataclasses.replace(latent, noise_mask=mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]))


def combine(a: tuple[Cond, ...], b: tuple[Cond, ...]) -> tuple[Cond, ...]:
    return tuple(a) + tuple(b)


def set_area(conds: tuple[Cond, ...], width: int, height: int, x: int, y: int, strength: float
             ) -> tuple[Cond, ...]:
    """ConditioningSetArea: area (h, w, y, x) in latent pixels, as ComfyUI divides by 8."""
    area = (height // 8, width // 8, y // 8, x // 8)
    return tuple(dataclasses.replace(c, area=area, strength=strength) for c in conds)


def zero_out(conds: tuple[Cond, ...]) -> tuple[Cond, ...]:
    """ConditioningZeroOut: zero cross-attention and pooled tensors, keep everything else."""
    return tuple(dataclasses.replace(
        c, cross_attn=torch.zeros_like(c.cross_attn),
        pooled=None if c.pooled is None else torch.zeros_like(c.pooled)) for c in conds)

