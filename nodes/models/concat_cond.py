"""Extra input channels a model takes beside the noisy latent (ComfyUI's ``concat_cond``), as
tensors: what a family runner's ``concat`` (``families/base.py``) builds from a cond.

* inpainting (SD 1.x/2.x/SDXL inpaint UNets, ComfyUI ``BaseModel.concat_cond``; Flux Fill takes
  the same two pieces): ``cat([mask (1), masked latent (C)])``;
* instruct-pix2pix (ComfyUI ``IP2P.concat_cond``; Stable Zero123 too): the image latent (C).

The denoiser crops them with a cond's area and batches them; it puts them after the scaled
latent, ``cat([c_in·x, concat])``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mixgraph.nodes.models.resize import center_crop

__all__ = ["inpaint_concat", "ip2p_concat", "blank_inpaint_latent", "repeat_to_batch"]

# What pixel value 0 (grey after the VAE's [-1, 1] mapping) encodes to in the SD1/SD2 latent,
# already multiplied by the latent scale: the "masked image" a 9-channel inpaint model sees when
# no mask is given (ComfyUI blank_inpaint_image_like).
_BLANK_INPAINT = (0.8223, -0.6876, 0.6364, 0.1380)


def repeat_to_batch(t: Tensor, batch: int) -> Tensor:
    """Tile or cut dim 0 to ``batch`` entries."""
    if t.shape[0] < batch:
        t = t.repeat(-(-batch // t.shape[0]), *([1] * (t.ndim - 1)))
    return t[:batch]


def blank_inpaint_latent(like: Tensor) -> Tensor:
    """[B, 4, H, W] latent of an all-grey image (ComfyUI's SD1 constants)."""
    blank = torch.ones_like(like[:, :4])
    for c, v in enumerate(_BLANK_INPAINT):
        blank[:, c] *= v
    return blank


def inpaint_concat(latent_image: Tensor, denoise_mask: Tensor | None, concat_latent: Tensor | None,
                   concat_mask: Tensor | None, latent_format,
                   blank: Callable[[Tensor], Tensor] = blank_inpaint_latent) -> Tensor:
    """[B, 1+C, H, W] = cat(mask, masked latent) for an inpaint model (ComfyUI
    ``BaseModel.concat_cond``).

    latent_image: [B, C, H, W] the process_in-scaled sampled latent. denoise_mask: its noise mask
    (1 = resample) or None. concat_latent / concat_mask: the cond's InpaintModelConditioning
    latent (VAE space: through ``latent_format.process_in`` here) and mask, or None.
    Mask: the cond's, else the noise mask, rounded and resized to the latent; masked latent: the
    cond's latent, else the sampled latent (VAEEncodeForInpaint greys the masked pixels before
    encoding). Without any mask: mask 1 and, without a cond latent, ``blank(latent_image)`` (the
    grey image's latent)."""
    B, C, H, W = latent_image.shape
    device = latent_image.device
    masked = latent_image
    if concat_latent is not None:
        masked = latent_format.process_in(concat_latent.to(device, torch.float32))
        if tuple(masked.shape[-2:]) != (H, W):
            masked = F.interpolate(masked, size=(H, W), mode="bilinear")
        masked = repeat_to_batch(masked, B)
    m = concat_mask if concat_mask is not None else denoise_mask
    if m is None:
        return torch.cat([torch.ones_like(latent_image[:, :1]),
                          blank(latent_image) if concat_latent is None else masked], dim=1)
    m = m.to(device, torch.float32)
    m = m[:, :1] if m.ndim == 4 else m
    m = m.reshape(-1, 1, m.shape[-2], m.shape[-1])  # [Bm, 1, h, w]
    if tuple(m.shape[-2:]) != (H, W):
        m = F.interpolate(m, size=(H, W), mode="bilinear")
    return torch.cat([repeat_to_batch(m.round(), B), masked], dim=1)  # [B, 1+C, H, W]


def ip2p_concat(latent_image: Tensor, concat_latent: Tensor | None) -> Tensor:
    """[B, C, H, W] for an instruct-pix2pix model (ComfyUI ``IP2P.concat_cond``): the cond's
    InstructPixToPixConditioning latent as encoded (unscaled: SD1.x and diffusers SDXL ip2p
    models take it raw), cropped to the sampled latent's aspect ratio around its centre and
    resized bilinearly when its size differs, repeated to the batch; zeros when the cond carries
    none. latent_image: [B, C, H, W] the sampled latent."""
    B, C, H, W = latent_image.shape
    if concat_latent is None:
        return torch.zeros_like(latent_image)
    image = concat_latent.to(latent_image.device, torch.float32)
    if tuple(image.shape[1:]) != (C, H, W):
        image = F.interpolate(center_crop(image, W, H), size=(H, W), mode="bilinear")
    return repeat_to_batch(image, B)
