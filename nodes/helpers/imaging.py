"""Image and mask plumbing for the node library: files in and out, resizing, masks.

IMAGE is float32 [B, H, W, 3] in 0..1 and MASK float32 [B, H, W], as in ComfyUI. PNG writing
follows ComfyUI's SaveImage: `uint8(clip(255 x))` (truncation, not rounding), compress_level 4,
`prompt` and `workflow` (one chunk per extra_pnginfo key) tEXt chunks, `<prefix>_<counter:05>_.png`.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, ImageSequence, PngImagePlugin

from mixgraph.graph.env import writable_folder
from mixgraph.nodes.media import memory_guards
from mixgraph.nodes.models.resize import center_crop, upscale  # noqa: F401  (re-exported)


class ImageFileError(ValueError):
    pass


@contextlib.contextmanager
def _open(path: Path, what: str | None = None) -> Iterator[Image.Image]:
    """The image at `path`, opened for a decode inside the block: its header checked against the
    memory budget first (`memory_guards`: OverBudget, an ImageFileError's sibling ValueError, names
    the file, size and budget), PIL's fixed decompression-bomb limit replaced by that check."""
    what = what or str(path)
    try:
        with memory_guards.open_image(path, what) as img:
            yield img
    except (memory_guards.OverBudget, ImageFileError):
        raise
    except (OSError, Image.DecompressionBombError, ValueError, SyntaxError) as e:
        raise ImageFileError(f"{path}: cannot be read as an image ({e})") from e


def load_image(path: Path, what: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """LoadImage: RGB frames [B,H,W,3] and MASK = 1 - alpha [B,H,W] (zeros 64x64 without alpha).
    `what` names the file in errors (default its path)."""
    images, masks = [], []
    size = None
    with _open(path, what) as img:
        for frame in ImageSequence.Iterator(img):
            frame = ImageOps.exif_transpose(frame)
            if frame.mode == "I":
                frame = frame.point(lambda v: v * (1 / 255))
            rgb = frame.convert("RGB")
            if size is None:
                size = rgb.size
            elif rgb.size != size:
                continue  # ComfyUI skips frames whose size differs from the first
            images.append(torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0))
            if "A" in frame.getbands():
                alpha = np.asarray(frame.getchannel("A"), dtype=np.float32) / 255.0
                masks.append(1.0 - torch.from_numpy(alpha))
            else:
                masks.append(torch.zeros(64, 64, dtype=torch.float32))
    image = torch.stack(images)  # [B, H, W, 3]
    if any(m.shape != masks[0].shape for m in masks):
        masks = [torch.zeros(64, 64) for _ in masks]
    return image, torch.stack(masks)  # [B, H, W]


def load_image_mask(path: Path, channel: str, what: str | None = None) -> torch.Tensor:
    """LoadImageMask: one channel as MASK [1,H,W]; alpha is inverted (1 - a), as in ComfyUI."""
    with _open(path, what) as opened:
        img = ImageOps.exif_transpose(opened)
        if img.getbands() != ("R", "G", "B", "A"):
            img = img.convert("RGBA") if "A" in img.getbands() or channel != "alpha" else img
        band = {"alpha": "A", "red": "R", "green": "G", "blue": "B"}[channel]
        if band not in img.getbands():
            return torch.zeros(1, 64, 64, dtype=torch.float32)
        mask = torch.from_numpy(np.asarray(img.getchannel(band), dtype=np.float32) / 255.0)
    if band == "A":
        mask = 1.0 - mask
    return mask.unsqueeze(0)


def to_uint8(image: torch.Tensor) -> np.ndarray:
    """[H,W,3] float → uint8 with ComfyUI's truncation (`np.clip(255*x, 0, 255).astype(uint8)`)."""
    arr = 255.0 * image.detach().cpu().float().numpy()
    return np.clip(np.nan_to_num(arr, nan=0.0), 0, 255).astype(np.uint8)


_COUNTER = re.compile(r"_(\d{5,})_?$")


def next_counter(folder: Path, stem: str) -> int:
    """The counter after the largest in `folder`'s `<stem>_<counter>_.*` files (ComfyUI's
    save-file numbering, shared by every node that writes numbered files)."""
    biggest = 0
    if folder.is_dir():
        for f in folder.iterdir():
            name = f.name
            if not name.startswith(stem + "_"):
                continue
            m = _COUNTER.search(Path(name).stem)
            if m and Path(name).stem[: m.start()] == stem:
                biggest = max(biggest, int(m.group(1)))
    return biggest + 1


def expand_prefix(prefix: str, width: int, height: int) -> str:
    return prefix.replace("%width%", str(width)).replace("%height%", str(height))


def save_images(images: torch.Tensor, root: Path, prefix: str, *, kind: str = "output",
                prompt: Any = None, extra_pnginfo: dict | None = None, compress_level: int = 4,
                metadata: bool = True) -> list[dict[str, str]]:
    """Write each image as `<prefix>_<counter:05>_.png` under root; returns ComfyUI ui entries."""
    from mixgraph.nodes.helpers.folders import safe_join  # local: folders is a sibling utility module

    height, width = int(images.shape[1]), int(images.shape[2])
    prefix = expand_prefix(prefix, width, height)
    target = safe_join(Path(root), prefix)
    folder, stem = target.parent, target.name
    writable_folder(folder, f"{kind} folder")
    subfolder = folder.relative_to(root).as_posix() if folder != Path(root) else ""
    counter = next_counter(folder, stem)
    results = []
    for image in images:
        info = None
        if metadata:
            info = PngImagePlugin.PngInfo()
            if prompt is not None:
                info.add_text("prompt", json.dumps(prompt))
            for key, value in (extra_pnginfo or {}).items():
                info.add_text(key, json.dumps(value))
        name = f"{stem}_{counter:05}_.png"
        Image.fromarray(to_uint8(image)).save(folder / name, pnginfo=info,
                                              compress_level=compress_level)
        results.append({"filename": name, "subfolder": "" if subfolder == "." else subfolder,
                        "type": kind})
        counter += 1
    return results


def scaled_size(old_w: int, old_h: int, width: int, height: int) -> tuple[int, int]:
    """A requested size of 0 keeps the aspect ratio (ComfyUI ImageScale/LatentUpscale)."""
    if width == 0 and height == 0:
        return old_w, old_h
    if width == 0:
        width = max(1, round(old_w * height / old_h))
    elif height == 0:
        height = max(1, round(old_h * width / old_w))
    return width, height


def grow_mask(mask: torch.Tensor, grow_by: int) -> torch.Tensor:
    """VAEEncodeForInpaint's dilation of [B,1,H,W]: a grow_by x grow_by box conv, clamped, rounded.

    Padding is ceil((g-1)/2), so an even g grows the map by one pixel; the result is cropped back
    to the input size, as ComfyUI does.
    """
    if grow_by <= 0:
        return mask.round()
    kernel = torch.ones(1, 1, grow_by, grow_by)
    padding = -(-(grow_by - 1) // 2)
    grown = F.conv2d(mask.round(), kernel, padding=padding).clamp(0, 1)
    return grown[..., : mask.shape[-2], : mask.shape[-1]].round()


def repeat_to_batch(t: torch.Tensor, batch: int) -> torch.Tensor:
    """Tile or cut dim 0 to `batch` entries (ComfyUI's repeat_to_batch_size)."""
    n = t.shape[0]
    if n > batch:
        return t[:batch]
    if n < batch:
        reps = -(-batch // n)
        return t.repeat(reps, *([1] * (t.dim() - 1)))[:batch]
    return t


def as_mask3(mask: torch.Tensor) -> torch.Tensor:
    """Any MASK ([H,W], [B,H,W], [B,1,H,W]) as [B,H,W]."""
    return mask.reshape(-1, mask.shape[-2], mask.shape[-1])


def match_alpha(destination: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Give `source` the channel count of `destination` (RGB vs RGBA): extra channels are
    dropped, a missing alpha is added as 1 (ComfyUI's image_alpha_fix)."""
    if destination.shape[-1] < source.shape[-1]:
        return destination, source[..., : destination.shape[-1]]
    if destination.shape[-1] > source.shape[-1]:
        return destination, F.pad(source, (0, 1), value=1.0)
    return destination, source
