"""ComfyUI's `node_helpers` for custom node packs (conditioning option helpers, Pillow retries,
the hasher, dtype names). Conditioning here is ComfyUI's list form, as packs see it."""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch
from PIL import Image, ImageFile, UnidentifiedImageError


def conditioning_set_values(conditioning: list, values: dict | None = None,
                            append: bool = False) -> list:
    """A copy of the conditioning with `values` set in every entry's options (with `append`, a
    list-valued option gets the values appended)."""
    out = []
    for t, opts in conditioning:
        n = dict(opts)
        for k, v in (values or {}).items():
            if append and k in n and isinstance(n[k], list):
                n[k] = n[k] + (v if isinstance(v, list) else [v])
            else:
                n[k] = v
        out.append([t, n])
    return out


def pillow(fn: Callable, arg: Any) -> Any:
    """fn(arg), retried with truncated images allowed (ComfyUI's workaround for damaged PNGs)."""
    prev = ImageFile.LOAD_TRUNCATED_IMAGES
    try:
        return fn(arg)
    except (OSError, UnidentifiedImageError, ValueError):
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        return fn(arg)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = prev


def hasher():
    return hashlib.sha256


def string_to_torch_dtype(string: str) -> torch.dtype | None:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(string)


def image_alpha_fix(destination: torch.Tensor, source: torch.Tensor):
    if destination.shape[-1] < source.shape[-1]:
        source = source[..., : destination.shape[-1]]
    elif destination.shape[-1] > source.shape[-1]:
        source = torch.nn.functional.pad(source, (0, 1))
        source[..., -1] = 1.0
    return destination, source


def open_image(path: str) -> Image.Image:
    return pillow(Image.open, path)
