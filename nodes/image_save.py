"""SaveImageAdvanced's file writing (ComfyUI nodes_images.py, 015e604): each image of the batch
encoded by `image_codecs` and written as `<prefix>_<counter:05>.<ext>` (no trailing underscore,
unlike SaveImage), `%batch_num%` in the prefix replaced by the image's index in the batch,
`%width%` / `%height%` by the image size; returns ComfyUI's ui entries.

The counter continues after the highest one of any file with that stem (SaveImage's files
included), so a run never overwrites an earlier one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mixgraph.graph.env import writable_folder
from mixgraph.nodes import image_codecs
from mixgraph.nodes.folders import safe_join
from mixgraph.nodes.imaging import _next_counter, expand_prefix

#: (format, bit depth) pairs this build writes; ComfyUI's other choices are refused at validation.
WRITTEN = {("png", "8-bit"): 8, ("png", "16-bit"): 16, ("exr", "32-bit float"): 32}


def unsupported(file_format: str, bit_depth: str | None) -> str | None:
    """Why (format, bit depth) cannot be written here, or None when it can."""
    if (file_format, bit_depth) in WRITTEN:
        return None
    if file_format == "avif":
        return ("format 'avif' is not supported yet (ComfyUI encodes it with PyAV's SVT-AV1; "
                "mixgraph writes png at 8 or 16 bits and exr at 32-bit float)")
    return f"format {file_format!r} at bit depth {bit_depth!r} is not supported yet"


def save_advanced(images: torch.Tensor, root: Path, prefix: str, file_format: str, bit_depth: str,
                  colorspace: str, prompt: Any = None, extra_pnginfo: dict | None = None
                  ) -> list[dict[str, str]]:
    why = unsupported(file_format, bit_depth)
    if why is not None:
        raise image_codecs.CodecError(why)
    bits = WRITTEN[(file_format, bit_depth)]
    height, width = int(images.shape[1]), int(images.shape[2])
    target = safe_join(Path(root), expand_prefix(prefix, width, height))
    folder, stem = target.parent, target.name
    writable_folder(folder, "output folder")
    subfolder = folder.relative_to(root).as_posix() if folder != Path(root) else ""
    counter = max(_next_counter(folder, stem.replace("%batch_num%", str(i)))
                  for i in range(len(images)))
    text = image_codecs.metadata_items(prompt, extra_pnginfo)
    results = []
    for batch_number, image in enumerate(images):
        if file_format == "png":
            data = image_codecs.encode_png(image, bits, text)
        else:
            data = image_codecs.encode_exr(image, colorspace, text)
        name = f"{stem.replace('%batch_num%', str(batch_number))}_{counter:05}.{file_format}"
        (folder / name).write_bytes(data)
        results.append({"filename": name, "subfolder": "" if subfolder == "." else subfolder,
                        "type": "output"})
        counter += 1
    return results
