"""Plain functions on IMAGE [B,H,W,C] (float32, 0..1) behind ComfyUI's filter nodes that use
kornia (comfy_extras nodes_morphology.py, nodes_canny.py) and ImageAddNoise, written in torch.

* Morphology with a flat k×k square (kornia.morphology, "geodesic" border: pixels outside the
  image take no part): dilation = window max, erosion = window min, the window spanning
  k//2 pixels before and k − 1 − k//2 after each pixel on both axes; open = dilate(erode),
  close = erode(dilate), gradient = dilate − erode, top_hat = x − open, bottom_hat = close − x.
* Canny (Canny 1986, "A Computational Approach to Edge Detection"; kornia.filters.canny):
  RGB → grey (0.299, 0.587, 0.114), 5×5 Gaussian blur σ = 1 (reflect border), Sobel gradients
  (unnormalised, replicate border), magnitude sqrt(gx² + gy² + 1e-6), direction rounded to 45°,
  non-maximum suppression (a pixel survives only when strictly above both neighbours along the
  gradient), thresholds (> low: weak 0.5, > high: strong 1) and hysteresis (weak pixels
  8-connected to strong ones become strong, repeated until nothing changes; the rest drop).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixgraph.nodes.models.resize import upscale

__all__ = ["MORPHOLOGY_OPERATIONS", "PORTER_DUFF_MODES", "morphology", "canny", "add_noise", "hysteresis",
           "porter_duff", "porter_duff_batch", "rgb_to_ycbcr", "ycbcr_to_rgb"]

MORPHOLOGY_OPERATIONS = ("erode", "dilate", "open", "close", "gradient", "bottom_hat", "top_hat")


def _window_max(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [B, C, H, W] → max over the k×k window, outside pixels ignored."""
    before = k // 2
    after = k - 1 - before
    padded = F.pad(x, (before, after, before, after), value=float("-inf"))
    return F.max_pool2d(padded, kernel_size=k, stride=1)


def _dilate(x, k):
    return _window_max(x, k)


def _erode(x, k):
    return -_window_max(-x, k)


def morphology(image: torch.Tensor, operation: str, kernel_size: int) -> torch.Tensor:
    if operation not in MORPHOLOGY_OPERATIONS:
        raise ValueError(f"morphology operation {operation!r}: expected one of {MORPHOLOGY_OPERATIONS}")
    k = int(kernel_size)
    x = image.float().movedim(-1, 1)  # [B, C, H, W]
    if operation == "erode":
        out = _erode(x, k)
    elif operation == "dilate":
        out = _dilate(x, k)
    elif operation == "open":
        out = _dilate(_erode(x, k), k)
    elif operation == "close":
        out = _erode(_dilate(x, k), k)
    elif operation == "gradient":
        out = _dilate(x, k) - _erode(x, k)
    elif operation == "top_hat":
        out = x - _dilate(_erode(x, k), k)
    else:  # bottom_hat
        out = _erode(_dilate(x, k), k) - x
    return out.movedim(1, -1)


def add_noise(image: torch.Tensor, seed: int, strength: float) -> torch.Tensor:
    """ImageAddNoise: image + strength·N(0, 1) drawn on the CPU from ``torch.manual_seed(seed)``
    in the image's shape, clipped to [0, 1]."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn(image.size(), generator=gen, device="cpu").to(image)
    return torch.clip(image + strength * noise, min=0.0, max=1.0)


def _gaussian_1d(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float32) - size // 2
    g = torch.exp(-(x**2) / (2.0 * sigma**2))
    return g / g.sum()


# neighbour offsets (dy, dx) of directions 0°, 45°, ..., 315° in image coordinates (y down)
_DIRS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))


def _neighbour_kernels(center: float, neighbour: float) -> torch.Tensor:
    k = torch.zeros(8, 1, 3, 3)
    for i, (dy, dx) in enumerate(_DIRS):
        k[i, 0, 1, 1] = center
        k[i, 0, 1 + dy, 1 + dx] = neighbour
    return k


def hysteresis(edges: torch.Tensor) -> torch.Tensor:
    """edges [B, 1, H, W] with 0 / 0.5 (weak) / 1 (strong) → 0 / 1: weak pixels 8-connected
    (through other weak pixels) to a strong one become 1, the others 0."""
    kernels = _neighbour_kernels(0.0, 1.0).to(edges)
    weak = (edges == 0.5).to(edges.dtype)
    strong = (edges == 1).to(edges.dtype)
    while True:
        touches = (F.conv2d(strong, kernels, padding=1) == 1).any(1, keepdim=True).to(edges.dtype)
        grown = torch.clamp(strong + touches * weak, max=1.0)
        if torch.equal(grown, strong):
            return strong
        strong = grown


def canny(image: torch.Tensor, low_threshold: float, high_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """IMAGE [B,H,W,C] → (magnitude after suppression, edges) as [B, 1, H, W] (module docstring)."""
    x = image.float().movedim(-1, 1)  # [B, C, H, W]
    if x.shape[1] == 3:
        w = torch.tensor([0.299, 0.587, 0.114]).reshape(1, 3, 1, 1)
        x = (x * w).sum(1, keepdim=True)
    elif x.shape[1] != 1:
        raise ValueError(f"Canny: expected a 1- or 3-channel image, got {x.shape[1]} channels")
    g = _gaussian_1d(5, 1.0)
    c = x.shape[1]
    x = F.pad(x, (2, 2, 2, 2), mode="reflect")
    x = F.conv2d(x, g.reshape(1, 1, 1, 5).expand(c, 1, 1, 5), groups=c)
    x = F.conv2d(x, g.reshape(1, 1, 5, 1).expand(c, 1, 5, 1), groups=c)
    sobel_x = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
    kernels = torch.stack([sobel_x, sobel_x.T]).unsqueeze(1)  # [2, 1, 3, 3]
    grads = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernels)  # [B, 2, H, W]
    gx, gy = grads[:, :1], grads[:, 1:]
    magnitude = torch.sqrt(gx * gx + gy * gy + 1e-6)
    angle = torch.round(torch.rad2deg(torch.atan2(gy, gx)) / 45.0) * 45.0
    diffs = F.conv2d(magnitude, _neighbour_kernels(1.0, -1.0), padding=1)  # [B, 8, H, W]
    pos = ((angle / 45.0) % 8).long()
    neg = ((angle / 45.0 + 4) % 8).long()
    is_max = torch.minimum(diffs.gather(1, pos), diffs.gather(1, neg)) > 0.0
    magnitude = magnitude * is_max
    edges = (magnitude > low_threshold) * 0.5 + (magnitude > high_threshold) * 0.5
    return magnitude, hysteresis(edges.float())


PORTER_DUFF_MODES = ("ADD", "CLEAR", "DARKEN", "DST", "DST_ATOP", "DST_IN", "DST_OUT", "DST_OVER", "LIGHTEN",
                     "MULTIPLY", "OVERLAY", "SCREEN", "SRC", "SRC_ATOP", "SRC_IN", "SRC_OUT", "SRC_OVER", "XOR")


def porter_duff(src: torch.Tensor, src_a: torch.Tensor, dst: torch.Tensor, dst_a: torch.Tensor,
                mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Porter & Duff 1984, "Compositing Digital Images", on one image: colours [H, W, C] and
    MASKs [H, W, 1] (mask = 1 − alpha, ComfyUI's convention). Colours are premultiplied, combined
    by ``mode`` (the 12 operators plus ADD, DARKEN, LIGHTEN, MULTIPLY, OVERLAY, SCREEN), and
    divided by the result alpha again (0 where alpha ≤ 1e−5), clamped to [0, 1]; the alpha is
    returned as a mask."""
    sa, da = 1 - src_a, 1 - dst_a
    s, d = src * sa, dst * da
    union = sa + da - sa * da
    if mode == "ADD":
        a, c = torch.clamp(sa + da, 0, 1), torch.clamp(s + d, 0, 1)
    elif mode == "CLEAR":
        a, c = torch.zeros_like(da), torch.zeros_like(d)
    elif mode == "DARKEN":
        a, c = union, (1 - da) * s + (1 - sa) * d + torch.min(s, d)
    elif mode == "LIGHTEN":
        a, c = union, (1 - da) * s + (1 - sa) * d + torch.max(s, d)
    elif mode == "DST":
        a, c = da, d
    elif mode == "DST_ATOP":
        a, c = sa, sa * d + (1 - da) * s
    elif mode == "DST_IN":
        a, c = sa * da, d * sa
    elif mode == "DST_OUT":
        a, c = (1 - sa) * da, (1 - sa) * d
    elif mode == "DST_OVER":
        a, c = da + (1 - da) * sa, d + (1 - da) * s
    elif mode == "MULTIPLY":
        a, c = sa * da, s * d
    elif mode == "OVERLAY":
        a, c = union, torch.where(2 * d < da, 2 * s * d, sa * da - 2 * (da - s) * (sa - d))
    elif mode == "SCREEN":
        a, c = union, s + d - s * d
    elif mode == "SRC":
        a, c = sa, s
    elif mode == "SRC_ATOP":
        a, c = da, da * s + (1 - sa) * d
    elif mode == "SRC_IN":
        a, c = sa * da, s * da
    elif mode == "SRC_OUT":
        a, c = (1 - da) * sa, (1 - da) * s
    elif mode == "SRC_OVER":
        a, c = sa + (1 - sa) * da, s + (1 - sa) * d
    elif mode == "XOR":
        a, c = (1 - da) * sa + (1 - sa) * da, (1 - da) * s + (1 - sa) * d
    else:
        raise ValueError(f"Porter-Duff mode {mode!r}: expected one of {PORTER_DUFF_MODES}")
    c = torch.clamp(torch.where(a > 1e-5, c / a, torch.zeros_like(c)), 0, 1)
    return c, 1 - a


def porter_duff_batch(source, source_alpha, destination, destination_alpha, mode):
    """PorterDuffImageComposite: per index of the shortest batch; the destination mask, source
    image and source mask are resized (bicubic, centre crop) to the destination's size first."""
    n = min(len(source), len(source_alpha), len(destination), len(destination_alpha))
    images, masks = [], []
    for i in range(n):
        src, dst = source[i], destination[i]
        if src.shape[2] != dst.shape[2]:
            raise ValueError(f"PorterDuffImageComposite: source has {src.shape[2]} channels, destination "
                             f"{dst.shape[2]}; they must match")
        h, w = dst.shape[:2]

        def fit(t: torch.Tensor, hh: int, ww: int) -> torch.Tensor:  # [H, W, C] -> [hh, ww, C]
            if t.shape[:2] == (hh, ww):
                return t
            return upscale(t.movedim(-1, 0)[None], ww, hh, "bicubic", "center")[0].movedim(0, -1)

        src_a, dst_a = source_alpha[i].unsqueeze(2), destination_alpha[i].unsqueeze(2)
        dst_a = fit(dst_a, h, w)
        src = fit(src, h, w)
        src_a = fit(src_a, *dst_a.shape[:2])
        img, mask = porter_duff(src, src_a, dst, dst_a, mode)
        images.append(img)
        masks.append(mask.squeeze(2))
    return torch.stack(images), torch.stack(masks)


STITCH_DIRECTIONS = ("right", "down", "left", "up")
STITCH_COLORS = {"white": 1.0, "black": 0.0, "red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0),
                 "blue": (0.0, 0.0, 1.0)}


def _pad_axis(img: torch.Tensor, axis: int, target: int, value: float) -> torch.Tensor:
    """Centre ``img`` [B, H, W, C] along axis 1 (H) or 2 (W) in ``target`` pixels of ``value``
    (the odd pixel after)."""
    extra = target - img.shape[axis]
    if extra <= 0:
        return img
    before, after = extra // 2, extra - extra // 2
    pad = (0, 0, before, after) if axis == 2 else (0, 0, 0, 0, before, after)
    return F.pad(img, pad, mode="constant", value=value)


def stitch(image1: torch.Tensor, direction: str, match_image_size: bool, spacing_width: int,
           spacing_color: str, image2: torch.Tensor | None = None) -> torch.Tensor:
    """ImageStitch: image2 placed right of / below / left of / above image1.

    Batches are evened by repeating the shorter one's last image; with ``match_image_size``
    image2 is resized (lanczos) to image1's height (horizontal) or width (vertical), keeping its
    aspect ratio (the other side truncated to int); otherwise the smaller one is centred in
    padding (the spacing colour when it is grey-level, else black). A missing alpha channel is
    filled with ones; the spacing strip (widened to an even number) is the colour with alpha 1."""
    if image2 is None:
        return image1
    if direction not in STITCH_DIRECTIONS:
        raise ValueError(f"ImageStitch direction {direction!r}: expected one of {STITCH_DIRECTIONS}")
    horizontal = direction in ("left", "right")
    n = max(image1.shape[0], image2.shape[0])
    image1 = torch.cat([image1, image1[-1:].repeat(n - image1.shape[0], 1, 1, 1)])
    image2 = torch.cat([image2, image2[-1:].repeat(n - image2.shape[0], 1, 1, 1)])
    color = STITCH_COLORS[spacing_color]
    if match_image_size:
        h1, w1 = image1.shape[1:3]
        h2, w2 = image2.shape[1:3]
        aspect = w2 / h2
        tw, th = (int(h1 * aspect), h1) if horizontal else (w1, int(w1 / aspect))
        image2 = upscale(image2.movedim(-1, 1), tw, th, "lanczos", "disabled").movedim(1, -1)
    else:
        value = 0.0 if isinstance(color, tuple) else color
        axis = 1 if horizontal else 2
        target = max(image1.shape[axis], image2.shape[axis])
        image1, image2 = _pad_axis(image1, axis, target, value), _pad_axis(image2, axis, target, value)
    channels = max(image1.shape[-1], image2.shape[-1])
    image1, image2 = (torch.cat([t, torch.ones(*t.shape[:-1], channels - t.shape[-1], dtype=t.dtype)], dim=-1)
                      for t in (image1, image2))
    parts = [image2, image1] if direction in ("left", "up") else [image1, image2]
    if spacing_width > 0:
        spacing_width += spacing_width % 2
        if horizontal:
            shape = (n, max(image1.shape[1], image2.shape[1]), spacing_width, channels)
        else:
            shape = (n, spacing_width, max(image1.shape[2], image2.shape[2]), channels)
        strip = torch.zeros(shape, dtype=image1.dtype)
        if isinstance(color, tuple):
            for i, c in enumerate(color[:channels]):
                strip[..., i] = c
        else:
            strip[..., :min(3, channels)] = color
        if channels == 4:
            strip[..., 3] = 1.0
        parts.insert(1, strip)
    return torch.cat(parts, dim=2 if horizontal else 1)


RESIZE_PAD_INTERPOLATIONS = ("area", "bicubic", "nearest-exact", "bilinear", "lanczos")


def resize_and_pad(image: torch.Tensor, target_width: int, target_height: int, padding_color: str,
                   interpolation: str) -> torch.Tensor:
    """ResizeAndPadImage: scale by min(tw/w, th/h) (sides truncated to int), centre in a
    target-size canvas of white (1) or black (0), offsets floor((target − new)/2)."""
    b, h, w, c = image.shape
    scale = min(target_width / w, target_height / h)
    nw, nh = int(w * scale), int(h * scale)
    resized = upscale(image.movedim(-1, 1), nw, nh, interpolation, "disabled")
    out = torch.full((b, c, target_height, target_width), 0.0 if padding_color == "black" else 1.0,
                     dtype=image.dtype)
    y, x = (target_height - nh) // 2, (target_width - nw) // 2
    out[:, :, y:y + nh, x:x + nw] = resized
    return out.movedim(1, -1)


# --- ImageRGBToYUV / ImageYUVToRGB (comfy_extras/nodes_morphology.py; kornia.color's YCbCr) --------
# JPEG-style full-range YCbCr with chroma centred at 0.5 (kornia's constants).

def rgb_to_ycbcr(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IMAGE [B,H,W,C≥3] → (Y, U=Cb, V=Cr), each a grey IMAGE [B,H,W,3] (the channel repeated);
    an alpha channel is ignored."""
    r, g, b = image[..., 0:1], image[..., 1:2], image[..., 2:3]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = (b - y) * 0.564 + 0.5
    cr = (r - y) * 0.713 + 0.5
    return tuple(c.expand(*image.shape[:-1], 3) for c in (y, cb, cr))


def ycbcr_to_rgb(y: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Three IMAGEs (each averaged over its channels) as Y, Cb, Cr → RGB IMAGE [B,H,W,3]."""
    y, cb, cr = (c.mean(dim=-1, keepdim=True) for c in (y, u, v))
    cb, cr = cb - 0.5, cr - 0.5
    return torch.cat((y + 1.403 * cr, y - 0.714 * cr - 0.344 * cb, y + 1.773 * cb), dim=-1)
