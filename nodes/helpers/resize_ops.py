"""The resizes of ComfyUI 0.38.1's `ResizeImageMaskNode` (nodes_post_processing.py), on IMAGE
([B,H,W,C]) or MASK ([B,H,W]) tensors alike: by a multiplier, to given dimensions (0 = keep the
aspect ratio), to a longer / shorter edge, a width, a height, a number of megapixels, another
image's size, or down to a multiple (scaled to cover the multiple, then centre-cropped).

Every target size is rounded as ComfyUI rounds it (Python's `round`, half to even), and the
resampling is `nodes.models.resize.upscale` (ComfyUI's `common_upscale`)."""

from __future__ import annotations

import math

import torch

from mixgraph.nodes.models.resize import upscale

SCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")
CROP_METHODS = ("disabled", "center")
RESIZE_TYPES = ("scale dimensions", "scale by multiplier", "scale longer dimension",
                "scale shorter dimension", "scale width", "scale height", "scale total pixels",
                "match size", "scale to multiple")


def resize_to(x: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled") -> torch.Tensor:
    """IMAGE or MASK `x` resampled to width x height."""
    image = x.dim() == 4
    chw = x.movedim(-1, 1) if image else x.unsqueeze(1)
    out = upscale(chw, int(width), int(height), method, crop)
    return out.movedim(1, -1) if image else out.squeeze(1)


def _hw(x: torch.Tensor) -> tuple[int, int]:
    return (x.shape[1], x.shape[2])


def scale_by(x: torch.Tensor, multiplier: float, method: str) -> torch.Tensor:
    h, w = _hw(x)
    return resize_to(x, round(w * multiplier), round(h * multiplier), method)


def scale_dimensions(x: torch.Tensor, width: int, height: int, method: str,
                     crop: str = "disabled") -> torch.Tensor:
    if width == 0 and height == 0:
        return x
    h, w = _hw(x)
    if width == 0:
        width = max(1, round(w * height / h))
    elif height == 0:
        height = max(1, round(h * width / w))
    return resize_to(x, width, height, method, crop)


def fit_side(h: int, w: int, size: int, longer: bool) -> tuple[int, int]:
    """(width, height) with the longer (``longer``) or shorter side at ``size`` and the other
    keeping the aspect ratio (Python's round); a square becomes size × size."""
    if h == w:
        return size, size
    if (h > w) == longer:
        return round(w / h * size), size
    return size, round(h / w * size)


def scale_longer(x: torch.Tensor, size: int, method: str) -> torch.Tensor:
    return resize_to(x, *fit_side(*_hw(x), size, longer=True), method)


def scale_shorter(x: torch.Tensor, size: int, method: str) -> torch.Tensor:
    return resize_to(x, *fit_side(*_hw(x), size, longer=False), method)


def scale_total_pixels(x: torch.Tensor, megapixels: float, method: str) -> torch.Tensor:
    h, w = _hw(x)
    factor = math.sqrt(int(megapixels * 1024 * 1024) / (w * h))
    return resize_to(x, round(w * factor), round(h * factor), method)


def match_size(x: torch.Tensor, match: torch.Tensor, method: str, crop: str) -> torch.Tensor:
    h, w = _hw(match)
    return resize_to(x, w, h, method, crop)


def scale_to_multiple(x: torch.Tensor, multiple: int, method: str) -> torch.Tensor:
    """Scale (keeping the aspect ratio) until both sides cover the largest multiples of
    `multiple` that fit, then crop the centre to exactly those."""
    if multiple <= 1:
        return x
    h, w = _hw(x)
    tw, th = w // multiple * multiple, h // multiple * multiple
    if tw == 0 or th == 0 or (tw == w and th == h):
        return x
    sw, sh = tw / w, th / h
    if sw >= sh:
        cw, ch = tw, max(th, int(math.ceil(h * sw)))
    else:
        cw, ch = max(tw, int(math.ceil(w * sh))), th
    out = resize_to(x, cw, ch, method)
    x0, y0 = (cw - tw) // 2, (ch - th) // 2
    return out[:, y0:y0 + th, x0:x0 + tw]


def resize(x: torch.Tensor, choice: dict, method: str) -> torch.Tensor:
    """The node's dispatch: `choice` is its DynamicCombo value, {"resize_type": key, sub: value}."""
    kind = choice["resize_type"]
    if kind == "scale dimensions":
        return scale_dimensions(x, choice["width"], choice["height"], method, choice["crop"])
    if kind == "scale by multiplier":
        return scale_by(x, choice["multiplier"], method)
    if kind == "scale longer dimension":
        return scale_longer(x, choice["longer_size"], method)
    if kind == "scale shorter dimension":
        return scale_shorter(x, choice["shorter_size"], method)
    if kind == "scale width":
        return scale_dimensions(x, choice["width"], 0, method)
    if kind == "scale height":
        return scale_dimensions(x, 0, choice["height"], method)
    if kind == "scale total pixels":
        return scale_total_pixels(x, choice["megapixels"], method)
    if kind == "match size":
        return match_size(x, choice["match"], method, choice["crop"])
    if kind == "scale to multiple":
        return scale_to_multiple(x, choice["multiple"], method)
    raise ValueError(f"resize_type {kind!r} is not one of {list(RESIZE_TYPES)}")


#: ResolutionSelector's aspect ratios (ComfyUI comfy_extras/nodes_resolution.py), in its option order.
ASPECT_RATIOS = {
    "1:1 (Square)": (1, 1),
    "3:2 (Photo)": (3, 2),
    "4:3 (Standard)": (4, 3),
    "16:9 (Widescreen)": (16, 9),
    "21:9 (Ultrawide)": (21, 9),
    "2:3 (Portrait Photo)": (2, 3),
    "3:4 (Portrait Standard)": (3, 4),
    "9:16 (Portrait Widescreen)": (9, 16),
}


def resolution_for(aspect_ratio: str, megapixels: float) -> tuple[int, int]:
    """(width, height) of about ``megapixels`` · 1024² pixels at ``aspect_ratio``, each a multiple
    of 8 (ComfyUI's ResolutionSelector: Python's round, so halves go to the even multiple)."""
    w_ratio, h_ratio = ASPECT_RATIOS[aspect_ratio]
    scale = math.sqrt(megapixels * 1024 * 1024 / (w_ratio * h_ratio))
    return round(w_ratio * scale / 8) * 8, round(h_ratio * scale / 8) * 8
