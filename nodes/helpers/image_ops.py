"""Plain functions on IMAGE [B,H,W,C] (float32, 0..1) behind the model-free image nodes.

Numerics follow ComfyUI (nodes.py and comfy_extras/nodes_images.py / nodes_post_processing.py,
0.3.64). Colour quantization uses Pillow, as ComfyUI does: its median-cut palette is what a
workflow's result depends on, and no tensor library reproduces it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mixgraph.nodes.helpers.imaging import match_alpha, upscale
from mixgraph.nodes.helpers.mask_ops import paste
from mixgraph.nodes.helpers.resize_ops import fit_side
from mixgraph.nodes.media import memory_guards

BLEND_MODES = ("normal", "multiply", "screen", "overlay", "soft_light", "difference")
DITHERS = ("none", "floyd-steinberg", "bayer-2", "bayer-4", "bayer-8", "bayer-16")


def invert(image: torch.Tensor) -> torch.Tensor:
    return 1.0 - image


def batch(image1: torch.Tensor, image2: torch.Tensor) -> torch.Tensor:
    """ImageBatch: image2 gets image1's channels (alpha padded with 1) and size (bilinear, centre
    crop), then the two are concatenated."""
    if image1.shape[-1] != image2.shape[-1]:
        if image1.shape[-1] > image2.shape[-1]:
            image2 = F.pad(image2, (0, 1), value=1.0)
        else:
            image1 = F.pad(image1, (0, 1), value=1.0)
    if image1.shape[1:] != image2.shape[1:]:
        image2 = upscale(image2.movedim(-1, 1), image1.shape[2], image1.shape[1], "bilinear",
                         "center").movedim(1, -1)
    return torch.cat((image1, image2), dim=0)


def empty(width: int, height: int, batch_size: int, color: int) -> torch.Tensor:
    """EmptyImage: a solid 0xRRGGBB colour, each channel byte / 255."""
    rgb = [((color >> shift) & 0xFF) / 0xFF for shift in (16, 8, 0)]
    memory_guards.check_tensor((batch_size, height, width, 3), f"EmptyImage {width}x{height} batch {batch_size}")
    return torch.tensor(rgb, dtype=torch.float32).expand(batch_size, height, width, 3).clone()


def pad_for_outpaint(image: torch.Tensor, left: int, top: int, right: int, bottom: int,
                     feathering: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ImagePadForOutpaint: grey (0.5) border, MASK 1 on the border. Inside, pixels closer than
    `feathering` to a padded edge get ((feathering - d) / feathering)^2; only when the image is
    more than twice `feathering` in both directions."""
    b, h, w, c = image.shape
    out = torch.full((b, h + top + bottom, w + left + right, c), 0.5, dtype=torch.float32)
    out[:, top:top + h, left:left + w, :] = image
    mask = torch.ones((h + top + bottom, w + left + right), dtype=torch.float32)
    inner = torch.zeros((h, w), dtype=torch.float32)
    if feathering > 0 and feathering * 2 < h and feathering * 2 < w:
        i = torch.arange(h, dtype=torch.float64)[:, None].expand(h, w)
        j = torch.arange(w, dtype=torch.float64)[None, :].expand(h, w)
        far_h, far_w = torch.full_like(i, h), torch.full_like(j, w)
        d = torch.stack([i if top else far_h, h - i if bottom else far_h,
                         j if left else far_w, w - j if right else far_w]).amin(0)
        v = (feathering - d) / feathering
        inner = torch.where(d < feathering, v * v, 0.0).to(torch.float32)
    mask[top:top + h, left:left + w] = inner
    return out, mask.unsqueeze(0)


def scale_to_total_pixels(image: torch.Tensor, method: str, megapixels: float) -> torch.Tensor:
    """ImageScaleToTotalPixels: keep the aspect ratio, aim at megapixels x 1024^2 pixels."""
    h, w = image.shape[1], image.shape[2]
    scale = math.sqrt(megapixels * 1024 * 1024 / (w * h))
    return upscale(image.movedim(-1, 1), round(w * scale), round(h * scale), method,
                   "disabled").movedim(1, -1)


# ComfyUI's option list for ImageScaleToMaxDimension, "bilinear" twice included (as it is there).
MAX_DIMENSION_METHODS = ("area", "lanczos", "bilinear", "nearest-exact", "bilinear", "bicubic")


def scale_to_max_dimension(image: torch.Tensor, method: str, largest_size: int) -> torch.Tensor:
    """ImageScaleToMaxDimension: the longer side becomes largest_size, the other keeps the aspect
    ratio (Python's round); a square image becomes largest_size × largest_size."""
    w, h = fit_side(image.shape[1], image.shape[2], largest_size, longer=True)
    return upscale(image.movedim(-1, 1), w, h, method, "disabled").movedim(1, -1)


def crop(image: torch.Tensor, width: int, height: int, x: int, y: int) -> torch.Tensor:
    x, y = min(x, image.shape[2] - 1), min(y, image.shape[1] - 1)
    return image[:, y:y + height, x:x + width, :]


def repeat_batch(image: torch.Tensor, amount: int) -> torch.Tensor:
    memory_guards.check_tensor((image.shape[0] * amount, *image.shape[1:]), f"RepeatImageBatch x{amount}")
    return image.repeat(amount, 1, 1, 1)


def from_batch(image: torch.Tensor, batch_index: int, length: int) -> torch.Tensor:
    """ImageFromBatch: `length` images from `batch_index` (negative counts from the end), clamped."""
    n = image.shape[0]
    if batch_index < 0:
        batch_index += n
    start = max(0, min(n - 1, batch_index))
    return image[start:start + min(n - start, length)].clone()


def composite_masked(destination: torch.Tensor, source: torch.Tensor, x: int, y: int,
                     resize_source: bool, mask: torch.Tensor | None) -> torch.Tensor:
    destination, source = match_alpha(destination, source)
    out = paste(destination.movedim(-1, 1), source.movedim(-1, 1), x, y, mask, 1, resize_source)
    return out.movedim(1, -1)


def _soft_light_g(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x <= 0.25, ((16 * x - 12) * x + 4) * x, torch.sqrt(x))


def blend(image1: torch.Tensor, image2: torch.Tensor, factor: float, mode: str) -> torch.Tensor:
    """ImageBlend: image1 * (1 - f) + mode(image1, image2) * f, clamped; image2 is resized
    (bicubic, centre crop) to image1. An alpha channel of image1 is kept as is."""
    image1, image2 = match_alpha(image1, image2)
    if image1.shape != image2.shape:
        image2 = upscale(image2.movedim(-1, 1), image1.shape[2], image1.shape[1], "bicubic",
                         "center").movedim(1, -1)
    a, b = image1, image2
    if mode == "normal":
        mixed = b
    elif mode == "multiply":
        mixed = a * b
    elif mode == "screen":
        mixed = 1 - (1 - a) * (1 - b)
    elif mode == "overlay":
        mixed = torch.where(a <= 0.5, 2 * a * b, 1 - 2 * (1 - a) * (1 - b))
    elif mode == "soft_light":
        mixed = torch.where(b <= 0.5, a - (1 - 2 * b) * a * (1 - a),
                            a + (2 * b - 1) * (_soft_light_g(a) - a))
    elif mode == "difference":
        mixed = a - b
    else:
        raise ValueError(f"unknown blend mode {mode!r}; one of {', '.join(BLEND_MODES)}")
    out = torch.clamp(a * (1 - factor) + mixed * factor, 0, 1)
    if a.shape[-1] == 4:
        out[..., 3] = a[..., 3]
    return out


def gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    """ComfyUI's 2-D blur kernel: the Gaussian sampled on a size x size grid spanning -1..1
    (not pixel units), normalised to sum 1."""
    y, x = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    d = torch.sqrt(x * x + y * y)
    g = torch.exp(-(d * d) / (2.0 * sigma * sigma))
    return g / g.sum()


def _filter(image: torch.Tensor, kernel: torch.Tensor, radius: int) -> torch.Tensor:
    """Depthwise 2-D convolution of [B,H,W,C] with reflect padding."""
    c = image.shape[-1]
    x = F.pad(image.movedim(-1, 1), (radius,) * 4, mode="reflect")
    weight = kernel.expand(c, 1, *kernel.shape)
    return F.conv2d(x, weight, groups=c).movedim(1, -1)


def blur(image: torch.Tensor, radius: int, sigma: float) -> torch.Tensor:
    if radius == 0:
        return image
    return _filter(image, gaussian_kernel(2 * radius + 1, sigma), radius)


def sharpen(image: torch.Tensor, radius: int, sigma: float, alpha: float) -> torch.Tensor:
    """ImageSharpen: kernel = -10 alpha x Gaussian with the centre raised so the kernel sums to 1."""
    if radius == 0:
        return image
    kernel = gaussian_kernel(2 * radius + 1, sigma) * -(alpha * 10)
    kernel[radius, radius] = kernel[radius, radius] - kernel.sum() + 1.0
    return _filter(image, kernel, radius).clamp(0, 1)


def _bayer_matrix(order: int) -> np.ndarray:
    """Normalised ordered-dither matrix of side 2^order, values centred on 0 (step 1/4^order)."""
    m = np.zeros((1, 1), np.float64)
    for n in range(1, order + 1):
        q = 4 ** n
        s = q * m
        m = np.block([[s - 1.5, s + 0.5], [s + 1.5, s - 0.5]]) / q
    return m


def _bayer(img: Image.Image, palette: Image.Image, size: int) -> Image.Image:
    colours = len(palette.getpalette()) // 3
    spread = 2 * 256 / colours
    matrix = torch.from_numpy(spread * _bayer_matrix(int(math.log2(size))) + 0.5)
    px = torch.from_numpy(np.asarray(img, dtype=np.float32).copy())  # [H,W,3]
    tiles = matrix.tile(math.ceil(px.shape[0] / size), math.ceil(px.shape[1] / size))
    px.add_(tiles[:px.shape[0], :px.shape[1], None]).clamp_(0, 255)  # in place: stays float32
    px = px.to(torch.uint8)
    return Image.fromarray(px.numpy()).quantize(palette=palette, dither=Image.Dither.NONE)


def quantize(image: torch.Tensor, colors: int, dither: str) -> torch.Tensor:
    """ImageQuantize: Pillow's median-cut palette of `colors`, then remap with the dither."""
    rgb = image[..., :3]
    out = torch.zeros_like(rgb)
    for b in range(rgb.shape[0]):
        img = Image.fromarray((rgb[b] * 255).to(torch.uint8).numpy(), mode="RGB")
        palette = img.quantize(colors=colors)
        if dither == "none":
            q = img.quantize(palette=palette, dither=Image.Dither.NONE)
        elif dither == "floyd-steinberg":
            q = img.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG)
        elif dither.startswith("bayer-"):
            q = _bayer(img, palette, int(dither.split("-")[1]))
        else:
            raise ValueError(f"unknown dither {dither!r}; one of {', '.join(DITHERS)}")
        out[b] = torch.from_numpy(np.asarray(q.convert("RGB"), dtype=np.float32)) / 255
    if image.shape[-1] == 4:
        out = torch.cat((out, image[..., 3:]), dim=-1)
    return out


# --- transforms and alpha (comfy_extras/nodes_images.py, nodes_compositing.py) ---

FLIP_METHODS = ("x-axis: vertically", "y-axis: horizontally")
ROTATIONS = ("none", "90 degrees", "180 degrees", "270 degrees")


def flip(image: torch.Tensor, method: str) -> torch.Tensor:
    """ImageFlip: "x-axis" mirrors rows (top <-> bottom), "y-axis" mirrors columns."""
    return torch.flip(image, dims=[1] if method.startswith("x") else [2])


def rotate(image: torch.Tensor, rotation: str) -> torch.Tensor:
    """ImageRotate: clockwise by 0/90/180/270 degrees ([B,H,W,C] -> [B,W,H,C] for 90/270)."""
    turns = ROTATIONS.index(rotation)
    return torch.rot90(image, k=turns, dims=[2, 1]).contiguous()


def size(image: torch.Tensor) -> tuple[int, int, int]:
    """GetImageSize: (width, height, batch_size)."""
    return int(image.shape[2]), int(image.shape[1]), int(image.shape[0])


def split_alpha(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SplitImageWithAlpha: (RGB, MASK = 1 − alpha); an image without alpha gives a zero mask."""
    alpha = image[..., 3] if image.shape[-1] > 3 else torch.ones_like(image[..., 0])
    return image[..., :3].clone(), 1.0 - alpha


def join_alpha(image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """JoinImageWithAlpha: RGBA with alpha = 1 − mask, the mask resized (bilinear) to the image;
    the batch is the shorter of the two."""
    m = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    m = F.interpolate(m, size=(image.shape[1], image.shape[2]), mode="bilinear").squeeze(1)  # [Bm,H,W]
    n = min(image.shape[0], m.shape[0])
    return torch.cat([image[:n, ..., :3], (1.0 - m[:n]).unsqueeze(-1)], dim=-1)  # [n,H,W,4]


#: ComfyUI's ``PREFERED_KONTEXT_RESOLUTIONS`` (comfy_extras/nodes_flux.py): (width, height) pairs
#: of about one megapixel that Flux.1 Kontext was trained on
KONTEXT_RESOLUTIONS = ((672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248), (880, 1184),
                       (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832), (1328, 800), (1392, 752),
                       (1456, 720), (1504, 688), (1568, 672))


def kontext_scale(image: torch.Tensor) -> torch.Tensor:
    """FluxKontextImageScale: [B,H,W,C] resized (lanczos, centre crop) to the Kontext resolution
    whose aspect ratio is nearest the image's (ties: the first of the list, as ComfyUI's min)."""
    aspect = image.shape[2] / image.shape[1]
    _, width, height = min((abs(aspect - w / h), w, h) for w, h in KONTEXT_RESOLUTIONS)
    return upscale(image.movedim(-1, 1), width, height, "lanczos", "center").movedim(1, -1)
