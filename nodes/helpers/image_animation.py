"""Animated WEBP and PNG files of an IMAGE batch (ComfyUI's SaveAnimatedWEBP / SaveAnimatedPNG),
written with Pillow as ComfyUI does, named ``<prefix>_<counter:05>_.webp|png`` like SaveImage.

Metadata as ComfyUI: WEBP carries the prompt in EXIF tag 0x0110 as ``"prompt:<json>"`` and each
extra_pnginfo key in tags 0x010F, 0x010E, ... as ``"<key>:<json>"``; APNG carries them in
``comf`` chunks after the image data (``b"<key>\\0<json>"``, latin-1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image, PngImagePlugin

from mixgraph.graph.env import writable_folder
from mixgraph.nodes.helpers.imaging import next_counter, expand_prefix, to_uint8

__all__ = ["WEBP_METHODS", "save_animated_webp", "save_animated_png"]

WEBP_METHODS = {"default": 4, "fastest": 0, "slowest": 6}


def _target(images: torch.Tensor, root: Path, prefix: str, kind: str) -> tuple[Path, str, str, int]:
    from mixgraph.nodes.helpers.folders import safe_join  # as imaging.save_images

    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty IMAGE batch [B, H, W, C], got shape {tuple(images.shape)}")
    height, width = int(images.shape[1]), int(images.shape[2])
    target = safe_join(Path(root), expand_prefix(prefix, width, height))
    folder, stem = target.parent, target.name
    writable_folder(folder, f"{kind} folder")
    subfolder = folder.relative_to(root).as_posix() if folder != Path(root) else ""
    return folder, stem, "" if subfolder == "." else subfolder, next_counter(folder, stem)


def _frames(images: torch.Tensor) -> list[Image.Image]:
    return [Image.fromarray(to_uint8(image)) for image in images]


def save_animated_webp(images: torch.Tensor, root: Path, prefix: str, fps: float, lossless: bool, quality: int,
                       method: str, *, prompt: Any = None, extra_pnginfo: dict | None = None,
                       kind: str = "output") -> list[dict[str, str]]:
    if method not in WEBP_METHODS:
        raise ValueError(f"SaveAnimatedWEBP method {method!r}: expected one of {tuple(WEBP_METHODS)}")
    folder, stem, subfolder, counter = _target(images, root, prefix, kind)
    frames = _frames(images)
    exif = frames[0].getexif()
    if prompt is not None:
        exif[0x0110] = "prompt:{}".format(json.dumps(prompt))
    tag = 0x010F
    for key, value in (extra_pnginfo or {}).items():
        exif[tag] = "{}:{}".format(key, json.dumps(value))
        tag -= 1
    name = f"{stem}_{counter:05}_.webp"
    frames[0].save(folder / name, save_all=True, duration=int(1000.0 / fps), append_images=frames[1:],
                   exif=exif, lossless=lossless, quality=quality, method=WEBP_METHODS[method])
    return [{"filename": name, "subfolder": subfolder, "type": kind}]


def save_animated_png(images: torch.Tensor, root: Path, prefix: str, fps: float, compress_level: int, *,
                      prompt: Any = None, extra_pnginfo: dict | None = None,
                      kind: str = "output") -> list[dict[str, str]]:
    folder, stem, subfolder, counter = _target(images, root, prefix, kind)
    frames = _frames(images)
    info = PngImagePlugin.PngInfo()
    if prompt is not None:
        info.add(b"comf", b"prompt\0" + json.dumps(prompt).encode("latin-1", "strict"), after_idat=True)
    for key, value in (extra_pnginfo or {}).items():
        info.add(b"comf", key.encode("latin-1", "strict") + b"\0" + json.dumps(value).encode("latin-1", "strict"),
                 after_idat=True)
    name = f"{stem}_{counter:05}_.png"
    frames[0].save(folder / name, pnginfo=info, compress_level=compress_level, save_all=True,
                   duration=int(1000.0 / fps), append_images=frames[1:])
    return [{"filename": name, "subfolder": subfolder, "type": kind}]
