"""ComfyUI's CURVE and HISTOGRAM values (the `ImageHistogram` and `CurveEditor` core nodes of the
colour-adjustment templates, ComfyUI 0.22+).

A CURVE is the editor's curve widget value, `{"points": [[x, y], ...], "interpolation":
"monotone_cubic" | "linear"}` with x, y in [0, 1] (the frontend's `CurveData`, which its
`isCurveData` checks exactly so: a list of number pairs and one of the two interpolations). It
travels as that plain dict, so a prompt literal and a linked value are the same thing.

A HISTOGRAM is a tuple of 256 bin counts (ints): the frontend draws `output.histogram` of the node
holding a curve widget from such a list (`new Uint32Array(data)`, any number of bins); 256 bins is
one per 8-bit level, the resolution of the 256 x 1 curve LUTs the templates' shaders sample.
"""

from __future__ import annotations

import math
from typing import Any

import torch

INTERPOLATIONS = ("monotone_cubic", "linear")
DEFAULT_CURVE = {"points": [[0.0, 0.0], [1.0, 1.0]], "interpolation": "monotone_cubic"}
BINS = 256
#: Luma weights of the luminance histogram: Rec. 709 / sRGB primaries (the IMAGE values are sRGB).
LUMA = (0.2126, 0.7152, 0.0722)


class CurveError(ValueError):
    """A CURVE value that is not `{"points": [[x, y], ...], "interpolation": ...}`."""


def parse_curve(value: Any) -> dict:
    """A checked copy of a CURVE value: points as float pairs sorted by x (the editor keeps them
    sorted), the interpolation one of INTERPOLATIONS. CurveError says what is wrong."""
    if not isinstance(value, dict):
        raise CurveError(f"a curve is a dict {{points, interpolation}}, got {type(value).__name__}")
    points, interpolation = value.get("points"), value.get("interpolation")
    if interpolation not in INTERPOLATIONS:
        raise CurveError(f"curve interpolation {interpolation!r} is not one of {', '.join(INTERPOLATIONS)}")
    if not isinstance(points, (list, tuple)) or not points:
        raise CurveError("curve points must be a non-empty list of [x, y] pairs")
    pairs = []
    for i, p in enumerate(points):
        if (not isinstance(p, (list, tuple)) or len(p) != 2
                or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in p)):
            raise CurveError(f"curve point {i} must be a pair of numbers [x, y], got {p!r}")
        x, y = float(p[0]), float(p[1])
        if not (math.isfinite(x) and math.isfinite(y)):
            raise CurveError(f"curve point {i} is not finite: {p!r}")
        pairs.append([x, y])
    pairs.sort(key=lambda p: p[0])
    return {"points": pairs, "interpolation": interpolation}


def histograms(image: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """The five histograms of an IMAGE batch [B, H, W, C] over all its images: "red", "green",
    "blue", "rgb" (the three channels' counts added, as one histogram of every channel value) and
    "luminance" (LUMA-weighted). A value v in [0, 1] falls in bin round(v * 255) (its 8-bit
    level); values outside are clamped. A one-channel image counts as grey; alpha is ignored."""
    if image.ndim != 4:
        raise ValueError(f"ImageHistogram: expected an IMAGE [B, H, W, C], got shape {tuple(image.shape)}")
    rgb = image[..., :3] if image.shape[-1] >= 3 else image[..., :1].expand(*image.shape[:-1], 3)
    rgb = rgb.float().clamp(0.0, 1.0)
    luma = rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]

    def count(values: torch.Tensor) -> tuple[int, ...]:
        levels = torch.round(values.reshape(-1) * (BINS - 1)).long()
        return tuple(int(c) for c in torch.bincount(levels, minlength=BINS).tolist())

    red, green, blue = (count(rgb[..., c]) for c in range(3))
    return {"rgb": tuple(r + g + b for r, g, b in zip(red, green, blue)),
            "luminance": count(luma.clamp(0.0, 1.0)), "red": red, "green": green, "blue": blue}


def parse_histogram(value: Any) -> tuple[int, ...]:
    """A HISTOGRAM value as a tuple of non-negative ints (a linked tuple, or a list from a custom
    pack); ValueError otherwise."""
    if isinstance(value, torch.Tensor):
        value = value.reshape(-1).tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, int) and c >= 0 for c in value):
        raise ValueError(f"a histogram is a list of non-negative bin counts, got {type(value).__name__}")
    return tuple(value)
