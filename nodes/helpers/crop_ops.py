"""Crops of ComfyUI's nodes_images.py (015e604): `ImageCropV2` (a BOUNDING_BOX region) and
`ImageCropToMask` (a centred crop around a mask's bounding box, composited over a background
colour and resized with lanczos), plus the BOUNDING_BOX and COLOR values they read.

BOUNDING_BOX travels as ComfyUI's plain dict `{"x", "y", "width", "height"}` (ints): that is what
API prompts carry as a literal and what custom node packs produce and read, so the edge keeps that
shape and `BoundingBox.parse` is the one place that checks it.

IMAGE [B,H,W,C] and MASK [B,H,W] float32 in 0..1, as everywhere in the node library.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mixgraph.nodes.models.resize import upscale

log = logging.getLogger(__name__)

#: ComfyUI's fallbacks for keys a bounding box dict lacks (`crop_region.get("width", 512)`).
BOX_DEFAULTS = {"x": 0, "y": 0, "width": 512, "height": 512}
MASK_THRESHOLD = 0.05   # mask values below this count as background before the bbox search
FOREGROUND_U8 = 204     # a pixel is foreground when its 8-bit alpha is above this (0.8)


class CropError(ValueError):
    pass


@dataclass(frozen=True)
class BoundingBox:
    """A pixel rectangle: top-left corner (x, y) and size, all ints."""

    x: int
    y: int
    width: int
    height: int

    def as_dict(self) -> dict[str, int]:
        return {"x": self.x, "y": self.y, "width": self.width, "height": self.height}

    @classmethod
    def parse(cls, value: Any) -> "BoundingBox":
        """A BOUNDING_BOX value (a dict, missing keys taking ComfyUI's defaults) or a BoundingBox;
        CropError naming what is wrong otherwise."""
        if isinstance(value, BoundingBox):
            return value
        if not isinstance(value, dict):
            raise CropError(f"a bounding box is a dict with x, y, width, height; got "
                            f"{type(value).__name__}")
        unknown = sorted(set(value) - set(BOX_DEFAULTS))
        if unknown:
            raise CropError(f"a bounding box has the keys x, y, width, height; got also {unknown}")
        got: dict[str, int] = {}
        for key, default in BOX_DEFAULTS.items():
            v = value.get(key, default)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise CropError(f"bounding box {key} must be an integer, got {v!r}")
            got[key] = v
        if got["x"] < 0 or got["y"] < 0:
            raise CropError(f"bounding box x and y must be >= 0, got x={got['x']}, y={got['y']}")
        if got["width"] < 1 or got["height"] < 1:
            raise CropError(f"bounding box width and height must be >= 1, got "
                            f"{got['width']}x{got['height']}")
        return cls(**got)


def crop_region(image: torch.Tensor, box: BoundingBox) -> torch.Tensor:
    """ImageCropV2: [B,H,W,C] cut to `box`. As ComfyUI: a corner past the image is moved onto its
    last row/column, and a box reaching past the right or bottom edge is cut there (so the
    result may be smaller than the box, never padded)."""
    x = min(box.x, image.shape[2] - 1)
    y = min(box.y, image.shape[1] - 1)
    return image[:, y:y + box.height, x:x + box.width, :]


def parse_color(value: Any) -> tuple[float, float, float]:
    """A COLOR `"#rrggbb"` as RGB in 0..1. As ComfyUI, anything but six hex digits after the
    optional `#` (e.g. `"#fff"`) is black; six characters that are not hex are an error."""
    if not isinstance(value, str):
        raise CropError(f"a colour is a string '#rrggbb', got {type(value).__name__}")
    h = value.lstrip("#")
    if len(h) != 6:
        return (0.0, 0.0, 0.0)
    try:
        return tuple(int(h[i:i + 2], 16) / 255.0 for i in (0, 2, 4))  # type: ignore[return-value]
    except ValueError:
        raise CropError(f"colour {value!r} is not '#rrggbb' in hex digits") from None


def _grow(mask: torch.Tensor, r: int) -> torch.Tensor:
    """[1,1,H,W] dilated (r > 0) or eroded (r < 0) by a (2|r|+1)² max filter."""
    if r > 0:
        return F.max_pool2d(mask, kernel_size=2 * r + 1, stride=1, padding=r)
    if r < 0:
        r = -r
        return 1.0 - F.max_pool2d(1.0 - mask, kernel_size=2 * r + 1, stride=1, padding=r)
    return mask


def _crop_box(fg: torch.Tensor, aspect: float, pad_factor: float) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) of the crop around foreground pixel coordinates `fg` [N,2] (y, x): the
    bbox grown to `aspect` (width / height) on its longer side, times pad_factor, centred.
    Integer rules (int() truncation, ceil of the half sizes) are ComfyUI's."""
    y_min, x_min = fg.min(dim=0).values.tolist()
    y_max, x_max = fg.max(dim=0).values.tolist()
    cy, cx = (y_min + y_max) / 2.0, (x_min + x_max) / 2.0
    bw, bh = x_max - x_min + 1, y_max - y_min + 1
    if bw / max(bh, 1) >= aspect:
        crop_w, crop_h = int(bw * pad_factor), int(bw / aspect * pad_factor)
    else:
        crop_w, crop_h = int(bh * aspect * pad_factor), int(bh * pad_factor)
    half_w, half_h = math.ceil(crop_w / 2), math.ceil(crop_h / 2)
    x1, y1 = int(cx - half_w), int(cy - half_h)
    return x1, y1, x1 + 2 * half_w, y1 + 2 * half_h


def crop_one_to_mask(image: torch.Tensor, mask: torch.Tensor, *, max_size: int, pad_factor: float,
                     grow: int, background: tuple[float, float, float], aspect: float
                     ) -> torch.Tensor:
    """One [H,W,3] image and [H,W] mask → [1,3,h,w], the subject over `background`, before the
    final resize (ComfyUI's `_crop_image_with_mask`)."""
    img = image.permute(2, 0, 1).unsqueeze(0).cpu().float().clamp(0, 1)   # [1,3,H,W]
    m = mask.unsqueeze(0).unsqueeze(0).cpu().float().clamp(0, 1)          # [1,1,H,W]

    # an inverted mask (bright border, dark centre) is turned around first
    m2d = m[0, 0]
    h, w = m2d.shape
    border = torch.cat([m2d[0, :], m2d[-1, :], m2d[:, 0], m2d[:, -1]])
    centre = m2d[h // 4:h - h // 4, w // 4:w - w // 4]
    if float(border.mean()) > 0.5 and float(centre.mean()) < 0.5:
        m = 1.0 - m
    m = _grow(m, grow)
    m = torch.where(m < MASK_THRESHOLD, torch.zeros_like(m), m)

    H, W = img.shape[-2:]
    if max(H, W) > max_size:   # work at most at the output's larger side
        scale = max_size / max(H, W)
        new_w, new_h = int(W * scale), int(H * scale)
        img = upscale(img, new_w, new_h, "lanczos", "disabled")
        m = upscale(m, new_w, new_h, "lanczos", "disabled")
        H, W = new_h, new_w

    alpha = (m[0, 0].clamp(0, 1) * 255.0).to(torch.uint8)
    fg = (alpha > FOREGROUND_U8).nonzero()
    if fg.numel() == 0:
        inverse = ((255 - alpha) > FOREGROUND_U8).nonzero()
        if inverse.numel() > 0:
            m, fg = 1.0 - m, inverse
    if fg.numel() > 0:
        x1, y1, x2, y2 = _crop_box(fg, aspect, pad_factor)
    else:
        log.warning("ImageCropToMask: the mask is empty; the whole image is used")
        x1, y1, x2, y2 = 0, 0, W, H

    # a crop reaching outside the image sees zeros there (image and mask alike)
    pads = (max(0, -x1), max(0, x2 - W), max(0, -y1), max(0, y2 - H))   # left, right, top, bottom
    if any(pads):
        img = F.pad(img, pads, value=0.0)
        m = F.pad(m, pads, value=0.0)
        x1, x2, y1, y2 = x1 + pads[0], x2 + pads[0], y1 + pads[2], y2 + pads[2]
    ci, cm = img[..., y1:y2, x1:x2], m[..., y1:y2, x1:x2]
    bg = torch.tensor(background, dtype=ci.dtype).view(1, 3, 1, 1)
    return (ci * cm + bg * (1.0 - cm)).clamp(0, 1)


def crop_to_mask(images: torch.Tensor, masks: torch.Tensor, width: int, height: int,
                 pad_factor: float, grow_mask: int, background: str) -> torch.Tensor:
    """ImageCropToMask: each image cropped around its mask's subject, the background filled with
    `background`, resized to width x height with lanczos. A single mask serves a whole batch; a
    mask of another size is first resized to the image's (bilinear)."""
    bg = parse_color(background)
    images = images[..., :3]
    batch = images.shape[0]
    if masks.dim() == 2:
        masks = masks.unsqueeze(0)
    if masks.shape[0] == 1 and batch > 1:
        masks = masks.expand(batch, -1, -1)
    elif masks.shape[0] != batch:
        raise CropError(f"the mask batch ({masks.shape[0]}) does not match the image batch "
                        f"({batch}); give one mask or one per image")
    if tuple(masks.shape[-2:]) != tuple(images.shape[1:3]):
        masks = upscale(masks.unsqueeze(1).float(), images.shape[2], images.shape[1], "bilinear",
                        "disabled").squeeze(1)
    out = []
    for b in range(batch):
        composite = crop_one_to_mask(images[b], masks[b], max_size=max(width, height),
                                     pad_factor=pad_factor, grow=grow_mask, background=bg,
                                     aspect=width / height)
        composite = upscale(composite, width, height, "lanczos", "disabled")   # [1,3,height,width]
        out.append(composite.movedim(-3, -1))
    return torch.cat(out, dim=0).float()
