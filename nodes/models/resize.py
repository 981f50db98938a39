"""ComfyUI's `common_upscale`: centre crop to an aspect ratio, then resize channels-first tensors
(nearest-exact, bilinear, area, bicubic, lanczos, bislerp).

One home for the resize used by image/latent scaling nodes and the ControlNet hint.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mixgraph.nodes.media import memory_guards


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
    """Resize channels-first [B,C,H,W] as ComfyUI's common_upscale (methods and centre crop).
    A result whose tensor alone is over the memory budget is refused before resizing."""
    memory_guards.check_tensor((*samples.shape[:-2], height, width), f"resizing to {width}x{height} px")
    if crop == "center":
        samples = center_crop(samples, width, height)
    if method == "lanczos":
        out = []
        for img in samples:  # [C,H,W] → PIL per channel group
            # ComfyUI's `np.clip(255 * x, 0, 255).astype(uint8)`: truncation, not rounding
            arr = np.clip(255.0 * img.movedim(0, -1).float().cpu().numpy(), 0, 255).astype(np.uint8)
            pil = Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr)
            pil = pil.resize((width, height), Image.Resampling.LANCZOS)
            t = torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255.0)
            out.append(t.unsqueeze(-1).movedim(-1, 0) if t.dim() == 2 else t.movedim(-1, 0))
        return torch.stack(out)
    if method == "bislerp":
        return bislerp(samples, width, height)
    if method in ("bilinear", "bicubic"):
        return F.interpolate(samples, size=(height, width), mode=method, align_corners=False)
    if method in ("nearest-exact", "area"):
        return F.interpolate(samples, size=(height, width), mode=method)
    raise ValueError(f"unknown upscale method {method!r}")


def _slerp(a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Rows of a, b [N, C] interpolated along the great circle by ratios r [N, 1], the norm
    interpolated linearly; (nearly) equal directions give a, opposite ones the straight lerp, and
    a zero vector has direction 0 (ComfyUI's ``bislerp.slerp``)."""
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)  # [N, 1]
    ua = torch.where(na == 0, torch.zeros_like(a), a / na)
    ub = torch.where(nb == 0, torch.zeros_like(b), b / nb)
    dot = (ua * ub).sum(-1)  # [N]
    omega = torch.acos(dot)
    so = torch.sin(omega)
    rr = r.squeeze(1)
    out = (torch.sin((1.0 - rr) * omega) / so).unsqueeze(1) * ua + (torch.sin(rr * omega) / so).unsqueeze(1) * ub
    out = out * (na * (1.0 - r) + nb * r)
    same, opposite = dot > 1 - 1e-5, dot < 1e-5 - 1
    out[same] = a[same]
    out[opposite] = (a * (1.0 - r) + b * r)[opposite]
    return out


def _bislerp_coords(old: int, new: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each of ``new`` positions: the fractional ratio, the lower and the upper source index,
    from bilinearly (half-pixel) resampled index ramps; the upper ramp is 1..old with its last
    entry held at old - 1."""
    ramp = torch.arange(old, dtype=torch.float32, device=device).reshape(1, 1, 1, -1)
    lo = F.interpolate(ramp, size=(1, new), mode="bilinear").reshape(-1)  # [new]
    upper = ramp + 1
    upper[..., -1] -= 1
    hi = F.interpolate(upper, size=(1, new), mode="bilinear").reshape(-1)
    return lo - lo.floor(), lo.to(torch.int64), hi.to(torch.int64)


def bislerp(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """ComfyUI's "bislerp" resize of [B, C, H, W]: separable (width, then height) interpolation
    of each pixel's channel vector by spherical linear interpolation (Shoemake 1985) instead of
    a straight blend, so latent vectors keep their norm between neighbours."""
    dtype = samples.dtype
    x = samples.float()
    n, c, h, w = x.shape
    r, i1, i2 = _bislerp_coords(w, width, x.device)
    a = x[..., i1].movedim(1, -1).reshape(-1, c)  # [B, C, H, W'] -> [B*H*W', C]
    b = x[..., i2].movedim(1, -1).reshape(-1, c)
    ratios = r.expand(n, h, width).reshape(-1, 1)
    x = _slerp(a, b, ratios).reshape(n, h, width, c).movedim(-1, 1)  # [B, C, H, W']
    r, i1, i2 = _bislerp_coords(h, height, x.device)
    a = x[:, :, i1].movedim(1, -1).reshape(-1, c)  # [B, C, H', W'] -> [B*H'*W', C]
    b = x[:, :, i2].movedim(1, -1).reshape(-1, c)
    ratios = r.reshape(1, -1, 1).expand(n, height, width).reshape(-1, 1)
    return _slerp(a, b, ratios).reshape(n, height, width, c).movedim(-1, 1).to(dtype)
