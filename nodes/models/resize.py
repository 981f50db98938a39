"""ComfyUI's `common_upscale`: centre crop to an aspect ratio, then resize channels-first tensors.

One home for the resize used by image/latent scaling nodes and the ControlNet hint.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def center_crop(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Crop [B,C,H,W] to the aspect ratio of width:height around the centre (ComfyUI "center")."""
    old_w, old_h = samples.shape[-1], samples.shape[-2]
    old_aspect, new_aspect = old_w / old_h, width / height
    x = y = 0
    if old_aspect > new_aspect:
        x = round((old_w - old_w * (new_aspect / old_aspect)) / 2)
    elif old_aspect < new_aspect:
        y = round((old_h - old_h * (old_aspect / new_aspect)) / 2)
    return samples[..., y:old_h - y, x:old_w - x]


def upscale(samples: torch.Tensor, width: int, height: int, method: str, crop: str) -> torch.Tensor:
    """Resize channels-first [B,C,H,W] as ComfyUI's common_upscale (methods and centre crop)."""
    if crop == "center":
        samples = center_crop(samples, width, height)
    if method == "lanczos":
        out = []
        for img in samples:  # [C,H,W] → PIL per channel group
            arr = (img.movedim(0, -1).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
            pil = Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr)
            pil = pil.resize((width, height), Image.Resampling.LANCZOS)
            t = torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255.0)
            out.append(t.unsqueeze(-1).movedim(-1, 0) if t.dim() == 2 else t.movedim(-1, 0))
        return torch.stack(out)
    if method == "bislerp":
        raise NotImplementedError("upscale_method 'bislerp': not supported yet")
    if method in ("bilinear", "bicubic"):
        return F.interpolate(samples, size=(height, width), mode=method, align_corners=False)
    if method in ("nearest-exact", "area"):
        return F.interpolate(samples, size=(height, width), mode=method)
    raise ValueError(f"unknown upscale method {method!r}")
