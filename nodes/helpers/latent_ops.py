"""Plain functions on LATENT and CONDITIONING payloads used by the node declarations."""

from __future__ import annotations

import dataclasses

import torch

from mixgraph.nodes.helpers.image_ops import gaussian_kernel
from mixgraph.nodes.helpers.imaging import grow_mask, repeat_to_batch, scaled_size, upscale
from mixgraph.nodes.helpers.mask_ops import paste
from mixgraph.nodes.media import memory_guards
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent

LATENT_CHANNELS = 4


def empty_latent(width: int, height: int, batch_size: int, channels: int = LATENT_CHANNELS) -> Latent:
    """Zeros [B,C,H/8,W/8] (C = 4; EmptySD3LatentImage: 16): the sampler leaves an all-zero
    latent unscaled (ComfyUI).

    A latent whose tensor alone is over the memory budget is refused before it is allocated
    (`memory_guards.OverBudget`; sampling needs several copies of it, so one that does not fit
    can never run)."""
    shape = (batch_size, channels, height // 8, width // 8)
    memory_guards.check_tensor(shape, f"a {width}x{height} latent of batch {batch_size}",
                               fix="lower width, height or batch_size")
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
    return tuple(dataclasses.replace(c, area=area, area_fraction=None, strength=strength,
                                     set_area_to_bounds=False) for c in conds)


def zero_out(conds: tuple[Cond, ...]) -> tuple[Cond, ...]:
    """ConditioningZeroOut: zero cross-attention and pooled tensors, keep everything else."""
    return tuple(dataclasses.replace(
        c, cross_attn=torch.zeros_like(c.cross_attn),
        pooled=None if c.pooled is None else torch.zeros_like(c.pooled)) for c in conds)



# --- batch, composite and arithmetic on LATENT (nodes.py and comfy_extras/nodes_latent.py) ---

def _mask_rows(mask: torch.Tensor, batch: int) -> torch.Tensor:
    """A noise mask [b,1,H,W] tiled to at least `batch` rows, so a slice of the batch can index it."""
    if mask.shape[0] < batch:
        mask = mask.repeat(-(-batch // mask.shape[0]), 1, 1, 1)[:batch]
    return mask


def from_batch(latent: Latent, batch_index: int, length: int) -> Latent:
    """LatentFromBatch: images [i, i+length) of the batch; they keep their noise (batch_index)."""
    n = latent.samples.shape[0]
    start = min(n - 1, batch_index)
    length = min(n - start, length)
    mask = latent.noise_mask
    if mask is not None and mask.shape[0] > 1:
        mask = _mask_rows(mask, n)[start:start + length].clone()
    elif mask is not None:
        mask = mask.clone()
    index = (tuple(range(start, start + length)) if latent.batch_index is None
             else tuple(latent.batch_index[start:start + length]))
    return Latent(latent.samples[start:start + length].clone(), mask, index)


def repeat_batch(latent: Latent, amount: int) -> Latent:
    """RepeatLatentBatch: the batch `amount` times; a batch_index continues past its range."""
    mask = latent.noise_mask
    if mask is not None and mask.shape[0] > 1:
        mask = mask.repeat(amount, 1, 1, 1)
    index = latent.batch_index
    if index is not None:
        offset = max(index) - min(index) + 1
        index = tuple(index) + tuple(x + i * offset for i in range(1, amount) for x in index)
    memory_guards.check_tensor((latent.samples.shape[0] * amount, *latent.samples.shape[1:]),
                               f"RepeatLatentBatch x{amount}")
    return Latent(latent.samples.repeat(amount, 1, 1, 1), mask, index)


def composite(to: Latent, src: Latent, x: int, y: int, feather: int) -> Latent:
    """LatentComposite: paste `src` at (x, y) image pixels (floored to latent pixels). A feather
    ramps the pasted edges that lie inside `to` linearly over feather // 8 latent pixels."""
    x, y, feather = x // 8, y // 8, feather // 8
    out = to.samples.clone()
    th, tw = out.shape[2], out.shape[3]
    piece = src.samples[:, :, :th - y, :tw - x]
    ph, pw = piece.shape[2], piece.shape[3]
    if feather == 0:
        out[:, :, y:y + ph, x:x + pw] = piece
        return dataclasses.replace(to, samples=out)
    w = torch.ones_like(piece)
    for t in range(feather):
        rate = (1.0 / feather) * (t + 1)
        if y != 0:
            w[:, :, t, :] *= rate
        if y + ph < th:
            w[:, :, ph - 1 - t, :] *= rate
        if x != 0:
            w[:, :, :, t] *= rate
        if x + pw < tw:
            w[:, :, :, pw - 1 - t] *= rate
    out[:, :, y:y + ph, x:x + pw] = piece * w + out[:, :, y:y + ph, x:x + pw] * (1.0 - w)
    return dataclasses.replace(to, samples=out)


def composite_masked(destination: Latent, source: Latent, x: int, y: int, resize_source: bool,
                     mask: torch.Tensor | None) -> Latent:
    """LatentCompositeMasked: x, y in image pixels; the mask is resized to the source."""
    samples = paste(destination.samples, source.samples, x, y, mask, 8, resize_source)
    return dataclasses.replace(destination, samples=samples)


def blend(a: Latent, b: Latent, factor: float) -> Latent:
    """LatentBlend: a * f + b * (1 - f); b resized (bicubic, centre crop) to a when shapes differ."""
    s1, s2 = a.samples, b.samples
    if s1.shape != s2.shape:
        s2 = upscale(s2, s1.shape[3], s1.shape[2], "bicubic", "center")
    return dataclasses.replace(a, samples=s1 * factor + s2 * (1 - factor))


ROTATIONS = ("none", "90 degrees", "180 degrees", "270 degrees")
FLIPS = ("x-axis: vertically", "y-axis: horizontally")


def rotate(latent: Latent, rotation: str) -> Latent:
    """LatentRotate: clockwise quarter turns."""
    k = ROTATIONS.index(rotation)
    return dataclasses.replace(latent, samples=torch.rot90(latent.samples, k=k, dims=(3, 2)))


def flip(latent: Latent, method: str) -> Latent:
    dim = 2 if method.startswith("x") else 3
    return dataclasses.replace(latent, samples=torch.flip(latent.samples, dims=(dim,)))


def crop(latent: Latent, width: int, height: int, x: int, y: int) -> Latent:
    """LatentCrop: x, y, size in image pixels; the origin is kept at least 8 latent px from the
    right/bottom edge."""
    s = latent.samples
    x, y = min(x // 8, s.shape[3] - 8), min(y // 8, s.shape[2] - 8)
    samples = s[:, :, y:y + height // 8, x:x + width // 8]
    return dataclasses.replace(latent, samples=samples)


def reshape_to(shape: torch.Size, samples: torch.Tensor, repeat: bool = True) -> torch.Tensor:
    """Fit `samples` to `shape`: bilinear resize with centre crop if C/H/W differ, then (optionally)
    tile or cut the batch (ComfyUI's reshape_latent_to)."""
    if samples.shape[1:] != shape[1:]:
        samples = upscale(samples, shape[-1], shape[-2], "bilinear", "center")
    return repeat_to_batch(samples, shape[0]) if repeat else samples


def add(a: Latent, b: Latent) -> Latent:
    return dataclasses.replace(a, samples=a.samples + reshape_to(a.samples.shape, b.samples))


def subtract(a: Latent, b: Latent) -> Latent:
    return dataclasses.replace(a, samples=a.samples - reshape_to(a.samples.shape, b.samples))


def multiply(a: Latent, multiplier: float) -> Latent:
    return dataclasses.replace(a, samples=a.samples * multiplier)


def interpolate(a: Latent, b: Latent, ratio: float) -> Latent:
    """LatentInterpolate: per-pixel channel vectors; directions are lerped (ratio weights a) and
    renormalised, magnitudes lerped; zero vectors give 0, not NaN."""
    s1 = a.samples
    s2 = reshape_to(s1.shape, b.samples)
    m1 = torch.linalg.vector_norm(s1, dim=1, keepdim=True)  # [B,1,H,W]
    m2 = torch.linalg.vector_norm(s2, dim=1, keepdim=True)
    d = torch.nan_to_num(s1 / m1) * ratio + torch.nan_to_num(s2 / m2) * (1.0 - ratio)
    direction = torch.nan_to_num(d / torch.linalg.vector_norm(d, dim=1, keepdim=True))
    return dataclasses.replace(a, samples=direction * (m1 * ratio + m2 * (1.0 - ratio)))


def concat_batch(a: Latent, b: Latent) -> Latent:
    """LatentBatch: b (resized to a's C/H/W) after a; batch indices concatenated (each side's
    own 0..n-1 when it has none). a's noise mask is kept, as in ComfyUI."""
    s2 = reshape_to(a.samples.shape, b.samples, repeat=False)
    ia = a.batch_index if a.batch_index is not None else tuple(range(a.samples.shape[0]))
    ib = b.batch_index if b.batch_index is not None else tuple(range(s2.shape[0]))
    return dataclasses.replace(a, samples=torch.cat((a.samples, s2), dim=0),
                               batch_index=tuple(ia) + tuple(ib))


SEED_BEHAVIORS = ("random", "fixed")


def seed_behavior(latent: Latent, behavior: str) -> Latent:
    """LatentBatchSeedBehavior: "random" drops batch_index (each image its own slice of the noise);
    "fixed" gives every image the first image's index (the same noise for all)."""
    if behavior == "random":
        return dataclasses.replace(latent, batch_index=None)
    first = latent.batch_index[0] if latent.batch_index else 0
    return dataclasses.replace(latent, batch_index=(first,) * latent.samples.shape[0])


# --- comfy_extras/nodes_latent.py: LatentConcat, LatentCut, LatentCutToBatch ---------------------
# Axis names as ComfyUI counts them from the end: x = width, y = height, t = the axis before height
# (frames in a 5-D video latent; on a 4-D image latent that is the channel axis, as in ComfyUI).
CONCAT_DIMS = ("x", "-x", "y", "-y", "t", "-t")
CUT_DIMS = ("x", "y", "t")
CUT_TO_BATCH_DIMS = ("t", "x", "y")
_AXIS_FROM_END = {"x": 1, "y": 2, "t": 3}


def concat(a: Latent, b: Latent, dim: str) -> Latent:
    """LatentConcat: b (batch tiled/cut to a's) appended after a along the axis (before it for a
    "-" direction); the other axes must match."""
    s2 = repeat_to_batch(b.samples, a.samples.shape[0])
    pair = (s2, a.samples) if dim.startswith("-") else (a.samples, s2)
    axis = -_AXIS_FROM_END[dim.lstrip("-")]
    if any(p != q for i, (p, q) in enumerate(zip(pair[0].shape, pair[1].shape)) if i != pair[0].ndim + axis):
        raise ValueError(f"LatentConcat along {dim!r}: latent shapes {tuple(a.samples.shape)} and "
                         f"{tuple(b.samples.shape)} differ on another axis")
    return dataclasses.replace(a, samples=torch.cat(pair, dim=axis))


def cut(latent: Latent, dim: str, index: int, amount: int) -> Latent:
    """LatentCut: `amount` entries from `index` along the axis; a negative index counts from the
    end; both are clamped to the axis (at least one entry stays)."""
    s = latent.samples
    axis = s.ndim - _AXIS_FROM_END[dim]
    size = s.shape[axis]
    if index >= 0:
        index = min(index, size - 1)
        amount = min(size - index, amount)
    else:
        index = max(index, -size)
        amount = min(-index, amount)
        index += size
    return dataclasses.replace(latent, samples=s.narrow(axis, index, amount))


def cut_to_batch(latent: Latent, dim: str, slice_size: int) -> Latent:
    """LatentCutToBatch: split the axis into slices of `slice_size` (the rest dropped) and stack
    the slices on the batch axis, each image's slices together. An axis before H (channels of a
    4-D latent) is left as it is, as in ComfyUI. batch_index and the noise mask are kept."""
    s = latent.samples
    axis = s.ndim - _AXIS_FROM_END[dim]
    if axis < 2:
        return latent
    moved = s.movedim(axis, 1)  # [B, N, ...]
    size = min(slice_size, moved.shape[1])
    moved = moved[:, : (moved.shape[1] // size) * size]
    out = moved.reshape(-1, size, *moved.shape[2:]).movedim(1, axis)  # [B * N/size, ..., size, ...]
    return dataclasses.replace(latent, samples=out)


# --- LATENT_OPERATION (comfy_extras/nodes_latent.py): a function latent -> latent ----------------
# A LATENT_OPERATION socket carries one of these frozen callables; LatentApplyOperation runs it on
# the samples. Each is `op(latent=[B, C, H, W] tensor) -> tensor of the same shape`.

@dataclasses.dataclass(frozen=True)
class TonemapReinhard:
    """Per-pixel channel-vector magnitude m is tone-mapped with Reinhard's operator x/(1+x) after
    scaling by 1/top, top = (mean(m) + 5·std(m))·multiplier per image (unbiased std); the
    direction is kept (m gets +1e-10 so a zero vector stays zero)."""

    multiplier: float

    def __call__(self, latent: torch.Tensor, **_) -> torch.Tensor:
        m = (torch.linalg.vector_norm(latent, dim=1) + 1e-10)[:, None]  # [B, 1, H, W]
        direction = latent / m
        dims = tuple(range(1, m.ndim))
        top = (torch.std(m, dim=dims, keepdim=True) * 5 + torch.mean(m, dim=dims, keepdim=True)) * self.multiplier
        m = m * (1.0 / top)
        return direction * (m / (m + 1.0) * top)


@dataclasses.dataclass(frozen=True)
class SharpenDirections:
    """ImageSharpen's kernel (-10·alpha·Gaussian on the -1..1 grid, centre raised so it sums to 1;
    reflect border) applied to the unit channel vectors, which are then scaled back by the
    original magnitudes (+1e-6)."""

    radius: int
    sigma: float
    alpha: float

    def __call__(self, latent: torch.Tensor, **_) -> torch.Tensor:
        lum = (torch.linalg.vector_norm(latent, dim=1) + 1e-6)[:, None]  # [B, 1, H, W]
        unit = latent / lum
        r, c = self.radius, latent.shape[1]
        kernel = gaussian_kernel(2 * r + 1, self.sigma).to(latent) * (self.alpha * -10)
        kernel[r, r] = kernel[r, r] - kernel.sum() + 1.0
        padded = torch.nn.functional.pad(unit, (r, r, r, r), mode="reflect")
        sharp = torch.nn.functional.conv2d(padded, kernel.expand(c, 1, 2 * r + 1, 2 * r + 1), groups=c)
        return lum * sharp


@dataclasses.dataclass(frozen=True, eq=False)
class BlendToward:
    """Lerp the latent toward a reference latent (nearest-resized to its H, W; batch tiled/cut)."""

    reference: torch.Tensor
    strength: float

    def __call__(self, latent: torch.Tensor, **_) -> torch.Tensor:
        if self.strength == 0:
            return latent
        target = self.reference.to(latent)
        if target.shape[2:] != latent.shape[2:]:
            target = torch.nn.functional.interpolate(target, size=latent.shape[2:], mode="nearest")
        return torch.lerp(latent, repeat_to_batch(target, latent.shape[0]), self.strength)


def apply_operation(latent: Latent, operation) -> Latent:
    return dataclasses.replace(latent, samples=operation(latent=latent.samples))
