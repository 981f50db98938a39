"""File encoders for SaveImageAdvanced (ComfyUI nodes_images.py, 015e604): PNG at 8 or 16 bits per
channel and OpenEXR with 32-bit float channels, each with ComfyUI's metadata.

Written by hand with zlib + struct + numpy because Pillow writes 16-bit PNG only for one grey
channel (no RGB48 / RGBA64) and cannot write EXR at all, and ComfyUI's own route (PyAV's ffmpeg
codecs) is a large binary dependency for two simple container formats. What decides the pixels
is ComfyUI's:

* PNG: `(x * scale).clamp(0, scale)` truncated to an integer, scale 255 or 65535; 1, 3 or 4
  channels (grey, RGB, RGBA); `prompt` and one `tEXt` chunk per extra_pnginfo key (`workflow`),
  JSON, placed right after IHDR. The colour space option changes nothing for PNG.
* EXR: no clamp; the input is made scene-linear by its colour space (sRGB: inverse sRGB EOTF;
  HDR: inverse HLG OETF, BT.2100; linear: as is; alpha untouched), channels `Y` | `B,G,R` |
  `A,B,G,R` (the file format wants them sorted) as FLOAT, uncompressed scanlines, `gamma` 1
  (ffmpeg's exr encoder defaults, which ComfyUI keeps), and extra header attributes: `prompt` / extra_pnginfo keys as `string`
  attributes holding JSON and `chromaticities` (Rec.709 for sRGB and linear, Rec.2020 for HDR).
* AVIF (`encode_avif`): Pillow's AVIF writer (libavif + aom), not by hand. ComfyUI's choices it
  can honour: 8-bit YUV 4:2:0 at the limited (MPEG) range, sRGB-tagged (nclx BT.709 primaries,
  sRGB transfer; the matrix is libavif's BT.601 where ComfyUI tags BT.709, a decoder follows the
  tag), `crf` as the AV1 quantizer (libavif's quality chosen so its quantizer equals crf; ComfyUI
  hands crf to SVT-AV1), frames quantized as ComfyUI (`x·255` clamped, truncated), grey as RGB
  (ComfyUI converts grey to yuv420p too), an animation with per-frame durations of 1000/fps ms
  (libavif's millisecond timescale) that loops forever, and ComfyUI's EXIF item: tag 0x0110
  `prompt:<JSON>`, then 0x010F, 0x010E, ... `<key>:<JSON>` per extra_pnginfo key. With metadata,
  an animation's `avis` major brand becomes `avif` (`avis` stays a compatible brand), as ComfyUI
  does so that the editor's metadata reader finds it; libavif-based readers (Pillow, Chromium)
  then open such a file's first frame unless asked for its track, with ComfyUI's files as well.
  Not honoured (refused at validation, `image_save.avif_problems`): 10-bit (Pillow writes 8 bits
  per channel), the HDR colour descriptions (BT.2020 HLG / PQ: Pillow cannot write those nclx
  tags), a finite loop count.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXR_MAGIC = b"\x76\x2f\x31\x01"

#: CIE 1931 xy of (R, G, B, white), D65 white for both.
CHROMATICITIES = {
    "Rec.709": (0.6400, 0.3300, 0.3000, 0.6000, 0.1500, 0.0600, 0.3127, 0.3290),
    "Rec.2020": (0.7080, 0.2920, 0.1700, 0.7970, 0.1310, 0.0460, 0.3127, 0.3290),
}
EXR_PRIMARIES = {"sRGB": "Rec.709", "linear": "Rec.709", "HDR": "Rec.2020"}

# HLG OETF constants, BT.2100 Table 5
_HLG_A = 0.17883277
_HLG_B = 0.28466892
_HLG_C = 0.55991072928


class CodecError(ValueError):
    pass


def metadata_items(prompt: Any, extra_pnginfo: dict | None) -> list[tuple[str, str]]:
    """(key, JSON text) pairs as ComfyUI's savers write them: `prompt`, then each extra key."""
    items = [] if prompt is None else [("prompt", json.dumps(prompt))]
    return items + [(k, json.dumps(v)) for k, v in (extra_pnginfo or {}).items()]


def _channels_last(image: torch.Tensor) -> torch.Tensor:
    """[H,W,C] with C in (1, 3, 4); a bare [H,W] is grey."""
    if image.dim() == 2:
        image = image.unsqueeze(-1)
    if image.dim() != 3 or image.shape[-1] not in (1, 3, 4):
        raise CodecError(f"cannot encode an image of shape {tuple(image.shape)}: the channel "
                         "counts written are 1 (grey), 3 (RGB) and 4 (RGBA)")
    return image.detach().cpu().float()


# --- PNG ------------------------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def quantize(image: torch.Tensor, bits: int) -> np.ndarray:
    """[H,W,C] float → uint8 / uint16 as ComfyUI: scale, clamp, truncate (NaN → 0)."""
    scale = 255.0 if bits == 8 else 65535.0
    scaled = torch.nan_to_num(image * scale, nan=0.0).clamp(0, scale)
    return scaled.to(torch.int32).numpy().astype(np.uint8 if bits == 8 else np.uint16)


def encode_png(image: torch.Tensor, bits: int, text: list[tuple[str, str]] = (),
               compress_level: int = 4) -> bytes:
    """One [H,W,C] image as PNG bytes at 8 or 16 bits per channel, `text` as tEXt chunks."""
    if bits not in (8, 16):
        raise CodecError(f"PNG bit depth {bits} is not written (8 or 16)")
    px = quantize(_channels_last(image), bits)                       # [H,W,C]
    height, width, channels = px.shape
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    rows = px.astype(">u2" if bits == 16 else np.uint8).reshape(height, -1).view(np.uint8)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), rows], axis=1)  # filter 0 per row
    ihdr = struct.pack(">IIBBBBB", width, height, bits, color_type, 0, 0, 0)
    chunks = [_png_chunk(b"IHDR", ihdr)]
    chunks += [_png_chunk(b"tEXt", k.encode("latin-1") + b"\0" + v.encode("latin-1", "replace"))
               for k, v in text]
    chunks += [_png_chunk(b"IDAT", zlib.compress(raw.tobytes(), compress_level)),
               _png_chunk(b"IEND", b"")]
    return PNG_SIGNATURE + b"".join(chunks)


# --- colour transforms -----------------------------------------------------------------------------


def _rgb_only(fn):
    """Apply fn to the colour channels; a 4th (alpha) channel passes through."""
    def wrapped(t: torch.Tensor) -> torch.Tensor:
        if t.shape[-1] == 4:
            return torch.cat([fn(t[..., :3]), t[..., 3:]], dim=-1)
        return fn(t)
    wrapped.__doc__ = fn.__doc__
    return wrapped


@_rgb_only
def srgb_to_linear(t: torch.Tensor) -> torch.Tensor:
    """Inverse sRGB EOTF (IEC 61966-2-1): linear toe up to 0.04045, then the 2.4 power curve."""
    low = t / 12.92
    high = ((t.clamp(min=0.0) + 0.055) / 1.055) ** 2.4
    return torch.where(t <= 0.04045, low, high)


@_rgb_only
def hlg_to_linear(t: torch.Tensor) -> torch.Tensor:
    """Inverse HLG OETF (BT.2100, scene light, Note 5a): t²/3 up to 0.5, then the log branch
    (its input clamped at 0.5 so the unused lane stays finite; values above 1 extrapolate)."""
    low = t * t / 3.0
    high = (torch.exp((t.clamp(min=0.5) - _HLG_C) / _HLG_A) + _HLG_B) / 12.0
    return torch.where(t <= 0.5, low, high)


TO_LINEAR = {"sRGB": srgb_to_linear, "HDR": hlg_to_linear, "linear": lambda t: t}


# --- EXR ------------------------------------------------------------------------------------------


def _attr(name: str, kind: str, value: bytes) -> bytes:
    return name.encode() + b"\0" + kind.encode() + b"\0" + struct.pack("<i", len(value)) + value


def encode_exr(image: torch.Tensor, colorspace: str, text: list[tuple[str, str]] = ()) -> bytes:
    """One [H,W,C] image as a single-part scanline OpenEXR file, FLOAT channels, no compression,
    made scene-linear per `colorspace` (sRGB, HDR, linear); `text` as string attributes."""
    if colorspace not in TO_LINEAR:
        raise CodecError(f"EXR colour space {colorspace!r} is not one of {list(TO_LINEAR)}")
    img = TO_LINEAR[colorspace](_channels_last(image))
    px = img.numpy().astype("<f4")                                       # [H,W,C]
    height, width, channels = px.shape
    names = {1: ("Y",), 3: ("B", "G", "R"), 4: ("A", "B", "G", "R")}[channels]
    index = {"R": 0, "G": 1, "B": 2, "A": 3, "Y": 0}
    planes = np.stack([px[..., index[n]] for n in names], axis=1)       # [H, channels, W]

    chlist = b"".join(n.encode() + b"\0" + struct.pack("<iB3xii", 2, 0, 1, 1) for n in names) + b"\0"
    box = struct.pack("<iiii", 0, 0, width - 1, height - 1)
    header = (_attr("channels", "chlist", chlist) + _attr("compression", "compression", b"\0")
              + _attr("dataWindow", "box2i", box) + _attr("displayWindow", "box2i", box)
              + _attr("lineOrder", "lineOrder", b"\0")
              + _attr("screenWindowCenter", "v2f", struct.pack("<ff", 0.0, 0.0))
              + _attr("screenWindowWidth", "float", struct.pack("<f", 1.0))
              + _attr("pixelAspectRatio", "float", struct.pack("<f", 1.0))
              + _attr("gamma", "float", struct.pack("<f", 1.0)))
    header += b"".join(_attr(k, "string", v.encode("utf-8")) for k, v in text)
    header += _attr("chromaticities", "chromaticities",
                    struct.pack("<8f", *CHROMATICITIES[EXR_PRIMARIES[colorspace]]))
    head = EXR_MAGIC + struct.pack("<I", 2) + header + b"\0"

    row_bytes = channels * width * 4
    first = len(head) + 8 * height                                       # after the offset table
    offsets = first + np.arange(height, dtype=np.uint64) * (8 + row_bytes)
    rows = [struct.pack("<ii", y, row_bytes) + planes[y].tobytes() for y in range(height)]
    return head + offsets.astype("<u8").tobytes() + b"".join(rows)


# --- AVIF -----------------------------------------------------------------------------------------


def avif_quality_for_crf(crf: int) -> int:
    """Pillow's AVIF `quality` whose libavif quantizer ((100 − q)·63 + 50) // 100 equals `crf`."""
    if not 0 <= crf <= 63:
        raise CodecError(f"AVIF crf {crf} is outside 0..63")
    return 100 - math.ceil((100 * crf - 50) / 63)


def avif_exif(text: Sequence[tuple[str, str]]) -> bytes:
    """ComfyUI's AVIF EXIF: `prompt` under 0x0110 (Model), every other key from 0x010F (Make)
    downwards, each value `<key>:<JSON>`."""
    exif = Image.Exif()
    tag = 0x010F
    for key, value in text:
        if key == "prompt":
            exif[0x0110] = f"prompt:{value}"
        else:
            exif[tag] = f"{key}:{value}"
            tag -= 1
    return exif.tobytes()


def _avif_frame(image: torch.Tensor) -> Image.Image:
    px = quantize(_channels_last(image), 8)                        # [H,W,C] uint8
    if px.shape[-1] == 4:
        raise CodecError("AVIF saving supports 1-channel grey and 3-channel RGB images, not RGBA "
                         "(as ComfyUI's); use png or exr for an image with alpha")
    if px.shape[-1] == 1:
        px = np.repeat(px, 3, axis=-1)                             # grey → RGB (→ YUV 4:2:0)
    return Image.fromarray(np.ascontiguousarray(px), "RGB")


def encode_avif(images: Sequence[torch.Tensor], crf: int, fps: float | None = None,
                text: Sequence[tuple[str, str]] = (), speed: int = 8) -> bytes:
    """[H,W,C] images as one AVIF: a still image (one image, `fps` None) or an animation at
    `fps` that loops forever; 8-bit 4:2:0, limited range, sRGB-tagged (module docstring).
    `speed`: libavif's 0 (slowest) .. 10, 8 by default (ComfyUI runs SVT-AV1 at preset 8)."""
    frames = [_avif_frame(im) for im in images]
    if not frames:
        raise CodecError("no image to encode as AVIF")
    opts: dict[str, Any] = dict(quality=avif_quality_for_crf(int(crf)), subsampling="4:2:0",
                                range="limited", speed=speed, codec="auto")
    if text:
        opts["exif"] = avif_exif(text)
    buf = io.BytesIO()
    if fps is None:
        if len(frames) != 1:
            raise CodecError("a still AVIF holds one image")
        frames[0].save(buf, "AVIF", **opts)
        return buf.getvalue()
    duration = max(1, round(1000.0 / float(fps)))
    frames[0].save(buf, "AVIF", save_all=True, append_images=frames[1:], duration=duration, **opts)
    data = bytearray(buf.getvalue())
    # ftyp: size, "ftyp", major brand, minor version, compatible brands
    size = struct.unpack_from(">I", data, 0)[0]
    if text and data[4:8] == b"ftyp" and data[8:12] == b"avis" and b"avif" in bytes(data[16:size]):
        data[8:12] = b"avif"   # ComfyUI's inject_avif_metadata does this, for the editor
    return bytes(data)
