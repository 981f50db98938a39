"""Plain functions on MASK [B,H,W] (and the masked paste shared by latents and images).

Numerics follow ComfyUI's comfy_extras/nodes_mask.py (0.3.64), quirks included where a workflow's
result depends on them: FeatherMask's right/bottom ramps index from `-0` (so the first column or
row, not the last, gets the smallest factor) and GrowMask works one 3x3 step at a time with the
edge pixel repeated at the border (scipy's "reflect" mode reduces to that for a 3x3 footprint).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixgraph.nodes.helpers.imaging import as_mask3, repeat_to_batch

CHANNELS = ("red", "green", "blue", "alpha")
OPERATIONS = ("multiply", "add", "subtract", "and", "or", "xor")


def paste(destination: torch.Tensor, source: torch.Tensor, x: int, y: int,
          mask: torch.Tensor | None = None, multiplier: int = 8, resize_source: bool = False
          ) -> torch.Tensor:
    """Paste channels-first `source` [B,C,h,w] into a copy of `destination` [B,C,H,W] at (x, y),
    blended by `mask` (resized bilinearly to the source). x, y are in units of 1/multiplier of a
    destination pixel (8 for latents given in image pixels, 1 for images)."""
    out = destination.clone()
    if resize_source:
        source = F.interpolate(source, size=out.shape[-2:], mode="bilinear")
    source = repeat_to_batch(source, out.shape[0])
    sh, sw = source.shape[-2], source.shape[-1]
    x = max(-sw * multiplier, min(x, out.shape[-1] * multiplier))
    y = max(-sh * multiplier, min(y, out.shape[-2] * multiplier))
    left, top = x // multiplier, y // multiplier
    right, bottom = left + sw, top + sh
    if mask is None:
        weight = torch.ones_like(source)
    else:
        weight = F.interpolate(mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]),
                               size=(sh, sw), mode="bilinear")  # [B,1,h,w]
        weight = repeat_to_batch(weight, source.shape[0])
    vis_w = out.shape[-1] - left + min(0, x)
    vis_h = out.shape[-2] - top + min(0, y)
    weight = weight[..., :vis_h, :vis_w]
    region = out[..., top:bottom, left:right]
    out[..., top:bottom, left:right] = (weight * source[..., :vis_h, :vis_w]
                                        + (1.0 - weight) * region)
    return out


def mask_to_image(mask: torch.Tensor) -> torch.Tensor:
    """MASK → grey IMAGE [B,H,W,3]."""
    return mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).movedim(1, -1).expand(-1, -1, -1, 3)


def image_to_mask(image: torch.Tensor, channel: str) -> torch.Tensor:
    return image[..., CHANNELS.index(channel)]


def color_to_mask(image: torch.Tensor, color: int) -> torch.Tensor:
    """1 where the pixel's 8-bit RGB (rounded) packs to `color` (0xRRGGBB), else 0."""
    rgb = (image.clamp(0, 1) * 255.0).round().to(torch.int64)
    packed = (rgb[..., 0] << 16) + (rgb[..., 1] << 8) + rgb[..., 2]
    return (packed == color).to(torch.float32)


def solid(value: float, width: int, height: int) -> torch.Tensor:
    return torch.full((1, height, width), value, dtype=torch.float32)


def invert(mask: torch.Tensor) -> torch.Tensor:
    return 1.0 - mask


def crop(mask: torch.Tensor, x: int, y: int, width: int, height: int) -> torch.Tensor:
    return as_mask3(mask)[:, y:y + height, x:x + width]


def composite(destination: torch.Tensor, source: torch.Tensor, x: int, y: int, operation: str
              ) -> torch.Tensor:
    """MaskComposite: combine `source` into `destination` at (x, y), clamped to 0..1; the logic
    operations see each mask rounded to 0/1."""
    out = as_mask3(destination).clone()
    source = as_mask3(source)
    right = min(x + source.shape[-1], out.shape[-1])
    bottom = min(y + source.shape[-2], out.shape[-2])
    src = source[:, :bottom - y, :right - x]
    dst = out[:, y:bottom, x:right]
    if operation == "multiply":
        res = dst * src
    elif operation == "add":
        res = dst + src
    elif operation == "subtract":
        res = dst - src
    elif operation in ("and", "or", "xor"):
        fn = {"and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor}[operation]
        res = fn(dst.round().bool(), src.round().bool()).float()
    else:
        raise ValueError(f"unknown mask operation {operation!r}; one of {', '.join(OPERATIONS)}")
    out[:, y:bottom, x:right] = res
    return out.clamp(0.0, 1.0)


def feather(mask: torch.Tensor, left: int, top: int, right: int, bottom: int) -> torch.Tensor:
    """Linear ramps on the edges: line i of a ramp of n is scaled by (i+1)/n. ComfyUI indexes the
    right and bottom ramps as -i, so i = 0 lands on the first column/row (kept for parity)."""
    out = as_mask3(mask).clone()
    h, w = out.shape[-2], out.shape[-1]
    left, right, top, bottom = min(left, w), min(right, w), min(top, h), min(bottom, h)
    for i in range(left):
        out[:, :, i] *= (i + 1.0) / left
    for i in range(right):
        out[:, :, -i] *= (i + 1) / right
    for i in range(top):
        out[:, i, :] *= (i + 1) / top
    for i in range(bottom):
        out[:, -i, :] *= (i + 1) / bottom
    return out


def grow(mask: torch.Tensor, expand: int, tapered_corners: bool = True) -> torch.Tensor:
    """GrowMask: |expand| steps of 3x3 grey dilation (expand > 0) or erosion (expand < 0). The
    footprint is a cross with tapered corners, else the full square; borders repeat the edge."""
    out = as_mask3(mask).float()
    offsets = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)
               if not (tapered_corners and dy != 0 and dx != 0)]
    reduce = torch.maximum if expand > 0 else torch.minimum
    h, w = out.shape[-2], out.shape[-1]
    for _ in range(abs(expand)):
        padded = F.pad(out.unsqueeze(1), (1, 1, 1, 1), mode="replicate").squeeze(1)  # [B,H+2,W+2]
        acc = out
        for dy, dx in offsets:
            acc = reduce(acc, padded[:, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w])
        out = acc
    return out


def threshold(mask: torch.Tensor, value: float) -> torch.Tensor:
    return (mask > value).float()
