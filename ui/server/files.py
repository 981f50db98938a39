"""File work behind `/view` and the upload routes: image conversions, storing uploads (checked:
an image, or a video where the name ends as one; deduplicated by name), merging a mask's alpha
into its original, safetensors metadata. Plain functions, run in worker threads by the handlers (PIL and PyAV work must not block the event loop)."""

from __future__ import annotations

import io
import json
import os
import uuid
from pathlib import Path

from aiohttp import web

from mixgraph.nodes.media import memory_guards
from mixgraph.nodes.media.video_codec import VideoFileError, is_video_name, probe
from mixgraph.ui.server.security import SecurityError, check_image, unique_name

__all__ = ["header_safe", "convert_image", "store_upload", "merge_mask", "safetensors_metadata", "check_video"]


def header_safe(name: str) -> str:
    return "".join(c for c in name if c.isprintable() and c not in '"\\\r\n')


def convert_image(path: Path, channel: str, preview: str | None) -> tuple[bytes, str] | None:
    """`/view` conversions: channel rgb|a, preview "webp;90" / "jpeg;90". None: not an image."""
    from PIL import Image
    if memory_guards.image_problem(path, str(path)):
        return None     # a decode over the memory budget: /view returns the file itself
    try:
        with memory_guards.bomb_limit_lifted():
            im = Image.open(path)
            im.load()
    except Exception:  # noqa: BLE001 - not an image: /view returns the file itself
        return None
    if channel == "rgb":
        im = im.convert("RGB")
    elif channel == "a":
        alpha = im.convert("RGBA").getchannel("A")
        im = Image.new("RGBA", im.size)
        im.putalpha(alpha)
    fmt, quality = "png", 90
    if preview:
        fmt, _, q = preview.partition(";")
        fmt = fmt.lower() if fmt.lower() in ("webp", "jpeg", "png") else "webp"
        quality = int(q) if q.isdigit() else 90
        if fmt == "jpeg":
            im = im.convert("RGB")
    buf = io.BytesIO()
    im.save(buf, format=fmt.upper(), quality=quality)
    return buf.getvalue(), f"image/{fmt}"


def store_upload(path: Path, data: bytes, original: Path | None, overwrite: bool) -> str:
    """Check an upload, merge a mask into its original, pick the file name, write. Runs in a
    worker thread (PIL / PyAV work). A file named as a video (``.mp4``, ``.webm``, ...) must hold a
    readable video stream, as ComfyUI's editor uploads LoadVideo's files here too."""
    if original is None and is_video_name(path.name):
        check_video(data)
    else:
        check_image(data)
    if original is not None:
        data = merge_mask(original, data)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    name, write = unique_name(folder, path.name, data, overwrite)
    if write:
        tmp = folder / f".{name}.{uuid.uuid4().hex}.part"
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)
    return name


def check_video(data: bytes) -> None:
    """SecurityError unless the bytes are a video PyAV reads, with frames of sane sides."""
    try:
        probe(io.BytesIO(data), "the upload")
    except VideoFileError as e:
        raise SecurityError(str(e)) from None


def merge_mask(original: Path, mask_png: bytes) -> bytes:
    """The original image with the uploaded image's alpha as its alpha channel (PNG, text chunks
    kept)."""
    from PIL import Image, PngImagePlugin
    check_image(original.read_bytes())
    with memory_guards.bomb_limit_lifted(), Image.open(original) as im:
        info = PngImagePlugin.PngInfo()
        for key, value in (getattr(im, "text", None) or {}).items():
            info.add_text(key, str(value))
        base = im.convert("RGBA")
    with memory_guards.bomb_limit_lifted(), Image.open(io.BytesIO(mask_png)) as m:
        if "A" not in m.getbands():
            raise SecurityError("the mask upload has no alpha channel")
        alpha = m.getchannel("A")
    if alpha.size != base.size:
        alpha = alpha.resize(base.size, Image.Resampling.LANCZOS)
    base.putalpha(alpha)
    buf = io.BytesIO()
    base.save(buf, format="PNG", pnginfo=info, compress_level=4)
    return buf.getvalue()


def safetensors_metadata(path: Path) -> dict:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise web.HTTPBadRequest(text="truncated safetensors file")
        n = int.from_bytes(head, "little")
        if n > 100 * 1024 * 1024:
            raise web.HTTPBadRequest(text="safetensors header too large")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise web.HTTPBadRequest(text="unreadable safetensors header") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}
