"""SaveImageAdvanced's file writing (ComfyUI nodes_images.py, 015e604): each image of the batch
encoded by `image_codecs` and written as `<prefix>_<counter:05>.<ext>` (no trailing underscore,
unlike SaveImage), `%batch_num%` in the prefix replaced by the image's index in the batch,
`%width%` / `%height%` by the image size; returns ComfyUI's ui entries. avif's `save_mode`
"animated" writes the whole batch as one file (`%batch_num%` → 0), "still images" one per image.

The counter continues after the highest one of any file with that stem (SaveImage's files
included), so a run never overwrites an earlier one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import features

from mixgraph.graph.env import writable_folder
from mixgraph.nodes.helpers import image_codecs
from mixgraph.nodes.helpers.folders import safe_join
from mixgraph.nodes.helpers.imaging import next_counter, expand_prefix

#: (format, bit depth) pairs this build writes; ComfyUI's other choices are refused at validation.
WRITTEN = {("png", "8-bit"): 8, ("png", "16-bit"): 16, ("exr", "32-bit float"): 32}


def unsupported(file_format: str, bit_depth: str | None) -> str | None:
    """Why (format, bit depth) of png / exr cannot be written here, or None when it can (avif:
    ``avif_problems``)."""
    if (file_format, bit_depth) in WRITTEN or file_format == "avif":
        return None
    return f"format {file_format!r} at bit depth {bit_depth!r} is not supported yet"


def avif_bit_depth(bit_depth: str, colorspace: str) -> str:
    """ComfyUI's "auto": 10-bit YUV420 for the HDR colour spaces, else 8-bit YUV420."""
    if bit_depth == "auto":
        return "10-bit YUV420" if colorspace in ("HDR", "HDR PQ") else "8-bit YUV420"
    return bit_depth


def avif_problems(bit_depth: str, colorspace: str, save_mode: str, loop_count: int | None
                  ) -> list[tuple[str, str]]:
    """(input, why) for each avif choice of ComfyUI's that Pillow's AVIF writer cannot honour."""
    if not features.check("avif"):
        return [("format", "format 'avif' needs Pillow built with AVIF support (libavif; the "
                           "Pillow wheels have it from 11.3); this Pillow has none")]
    problems = []
    if colorspace != "sRGB":
        problems.append(("format.input_color_space", (
            f"avif input_color_space {colorspace!r} is not supported: ComfyUI tags the file "
            f"BT.2020 with the {'HLG' if colorspace == 'HDR' else 'PQ'} transfer, and Pillow's "
            f"AVIF writer can only tag sRGB; use sRGB, or exr for HDR")))
    elif avif_bit_depth(bit_depth, colorspace) != "8-bit YUV420":
        problems.append(("format.bit_depth", (
            f"avif bit_depth {bit_depth!r} is not supported: Pillow's AVIF writer encodes 8 bits "
            f"per channel; use '8-bit YUV420' (or 'auto' with sRGB), or png at 16-bit")))
    if save_mode == "animated" and loop_count not in (None, 0):
        problems.append(("format.save_mode.loop_count", (
            f"avif loop_count {loop_count} is not supported: Pillow's AVIF writer always writes "
            f"an animation that loops forever (loop_count 0)")))
    return problems


def _target(images: torch.Tensor, root: Path, prefix: str) -> tuple[Path, str, str]:
    """(folder, file stem, ui subfolder) of the prefix, the folder made writable."""
    height, width = int(images.shape[1]), int(images.shape[2])
    target = safe_join(Path(root), expand_prefix(prefix, width, height))
    folder, stem = target.parent, target.name
    writable_folder(folder, "output folder")
    subfolder = folder.relative_to(root).as_posix() if folder != Path(root) else ""
    return folder, stem, "" if subfolder == "." else subfolder


def _save_avif(images, folder: Path, stem: str, subfolder: str, counter: int, text, bit_depth: str,
               colorspace: str, avif: dict) -> list[dict[str, str]]:
    """ComfyUI's avif branch: still images one file each, "animated" the batch in one file."""
    mode = avif.get("save_mode") or {"save_mode": "still images"}
    animated = mode.get("save_mode") == "animated"
    problems = avif_problems(bit_depth, colorspace, mode.get("save_mode"), mode.get("loop_count"))
    if problems:
        raise image_codecs.CodecError("; ".join(why for _, why in problems))
    batches = [list(images)] if animated else [[im] for im in images]
    fps = float(mode.get("fps", 6.0)) if animated else None
    results = []
    for batch_number, batch in enumerate(batches):
        data = image_codecs.encode_avif(batch, int(avif.get("crf", 18)), fps, text)
        name = f"{stem.replace('%batch_num%', str(batch_number))}_{counter:05}.avif"
        (folder / name).write_bytes(data)
        results.append({"filename": name, "subfolder": subfolder, "type": "output"})
        counter += 1
    return results


def save_advanced(images: torch.Tensor, root: Path, prefix: str, file_format: str, bit_depth: str,
                  colorspace: str, prompt: Any = None, extra_pnginfo: dict | None = None,
                  avif: dict | None = None) -> list[dict[str, str]]:
    """The batch written per the `format` choice; `avif`: its `crf` and `save_mode` dict
    (ComfyUI's nested shape `{"save_mode": key, "fps", "loop_count"}`)."""
    why = unsupported(file_format, bit_depth) if file_format != "avif" else None
    if why is not None:
        raise image_codecs.CodecError(why)
    folder, stem, subfolder = _target(images, root, prefix)
    counter = max(next_counter(folder, stem.replace("%batch_num%", str(i)))
                  for i in range(len(images)))
    text = image_codecs.metadata_items(prompt, extra_pnginfo)
    if file_format == "avif":
        return _save_avif(images, folder, stem, subfolder, counter, text, bit_depth, colorspace,
                          avif or {})
    bits = WRITTEN[(file_format, bit_depth)]
    results = []
    for batch_number, image in enumerate(images):
        if file_format == "png":
            data = image_codecs.encode_png(image, bits, text)
        else:
            data = image_codecs.encode_exr(image, colorspace, text)
        name = f"{stem.replace('%batch_num%', str(batch_number))}_{counter:05}.{file_format}"
        (folder / name).write_bytes(data)
        results.append({"filename": name, "subfolder": subfolder, "type": "output"})
        counter += 1
    return results
