"""Text drawn over images: ComfyUI ``comfy_extras/nodes_text_overlay.py`` (Comfy-Org/ComfyUI
1df2885), node `TextOverlay`.

Rules as read there: the text is laid out once on a transparent RGBA PIL layer the size of one
frame and composited over every frame. Margin = 1 % of min(W, H) (rounded); the font starts at
round(font_size % of H) pixels and shrinks by x0.9 (int) until the wrapped block fits the height
inside the margins, never below min(start, max(10, round(2 % of H))). The black outline is
max(1, round(0.04 * size)) px when on. Line spacing is 1.2 * size minus the font's natural line
advance (measured with "Ay" one and two lines high). Words wrap to the width inside the margins;
a word too wide on its own is cut into pieces that fit. Horizontal anchor l / m / r at the left
margin, the centre or the right margin; the block's top (or bottom) sits flush on the margin.
Compositing: RGB frames `img*(1-a) + rgb*a`; RGBA frames premultiplied source-over. No font
file (an empty value) means PIL's built-in scalable default font, as in ComfyUI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageColor, ImageDraw, ImageFont

LINE_SPACING = 1.2
MARGIN_PERCENT = 1.0
MIN_FONT_PERCENT = 2.0
MIN_FONT_PIXELS = 10
OUTLINE_FACTOR = 0.04


class TextOverlayError(ValueError):
    pass


def parse_rgba(color: str) -> tuple[int, int, int, int]:
    """PIL's colour string grammar (``ImageColor.getrgb``); alpha 255 unless given."""
    try:
        parsed = ImageColor.getrgb(str(color))
    except ValueError as e:
        raise TextOverlayError(f"color: {color!r} is not a colour PIL understands ({e})") from e
    return tuple(parsed) + (255,) if len(parsed) == 3 else tuple(parsed)  # type: ignore[return-value]


def _font(path: Path | None, size: int):
    if path is None:
        return ImageFont.load_default(size=size)
    try:
        return ImageFont.truetype(str(path), size)
    except OSError as e:
        raise TextOverlayError(f"font: cannot read {path}: {e}") from e


def wrap_lines(text: str, font, max_width: float) -> list[str]:
    """Greedy word wrap per paragraph; an over-wide word is cut at the longest prefix that fits
    (at least one character)."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        words = paragraph.split()
        if not words:
            out.append("")
            continue
        line = ""
        for word in words:
            while len(word) > 1 and font.getlength(word) > max_width:
                n = 1
                while n < len(word) and font.getlength(word[:n + 1]) <= max_width:
                    n += 1
                if line:
                    out.append(line)
                    line = ""
                out.append(word[:n])
                word = word[n:]
            joined = f"{line} {word}" if line else word
            if not line or font.getlength(joined) <= max_width:
                line = joined
            else:
                out.append(line)
                line = word
        if line:
            out.append(line)
    return out


def render_layer(width: int, height: int, text: str, position: str, align: str,
                 font_path: Path | None, font_size: float, fill: tuple, stroke_fill: tuple
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The overlay for one W x H frame: (rgb [H,W,3], alpha [H,W,1]) floats in [0, 1]."""
    layer = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    margin = int(round(MARGIN_PERCENT / 100.0 * min(width, height)))
    avail_w = max(1, width - 2 * margin)
    avail_h = max(1, height - 2 * margin)
    size = max(1, int(round(font_size / 100.0 * height)))
    floor = min(size, max(MIN_FONT_PIXELS, int(round(MIN_FONT_PERCENT / 100.0 * height))))
    while True:
        font = _font(font_path, size)
        stroke = max(1, int(round(size * OUTLINE_FACTOR))) if stroke_fill[3] > 0 else 0
        block = "\n".join(wrap_lines(text, font, avail_w))
        one = draw.textbbox((0, 0), "Ay", font=font, stroke_width=stroke)
        two = draw.multiline_textbbox((0, 0), "Ay\nAy", font=font, spacing=0, stroke_width=stroke)
        advance = (two[3] - two[1]) - (one[3] - one[1])
        spacing = int(round(size * LINE_SPACING - advance))
        box = draw.multiline_textbbox((0, 0), block, font=font, spacing=spacing, stroke_width=stroke)
        if box[3] - box[1] <= avail_h or size <= floor:
            break
        size = max(floor, int(size * 0.9))
    anchor, x = {"left": ("l", margin), "center": ("m", width / 2),
                 "right": ("r", width - margin)}[align]
    y = height - margin - box[3] if position == "bottom" else margin - box[1]
    draw.multiline_text((x, y), block, font=font, fill=tuple(fill), anchor=anchor + "a", align=align,
                        spacing=spacing, stroke_width=stroke, stroke_fill=tuple(stroke_fill))
    arr = torch.from_numpy(np.asarray(layer, dtype=np.float32) / 255.0)
    return arr[..., :3], arr[..., 3:4]


def overlay_text(images: torch.Tensor, text: str, font_path: Path | None, font_size: float,
                 color: str, position: str, align: str, outline: bool) -> torch.Tensor:
    """`TextOverlay` on a [B,H,W,3|4] batch (see the module docstring)."""
    if text.strip() == "":
        return images
    if position not in ("top", "bottom"):
        raise TextOverlayError(f"position: {position!r} is not 'top' or 'bottom'")
    if align not in ("left", "center", "right"):
        raise TextOverlayError(f"align: {align!r} is not 'left', 'center' or 'right'")
    text = text.replace("\\n", "\n").replace("\\t", "\t")
    fill = parse_rgba(color)
    stroke_fill = (0, 0, 0, 255) if outline else (0, 0, 0, 0)
    rgb, alpha = render_layer(images.shape[2], images.shape[1], text, position, align, font_path,
                              font_size, fill, stroke_fill)
    rgb = rgb.to(device=images.device, dtype=images.dtype)
    alpha = alpha.to(device=images.device, dtype=images.dtype)
    if images.shape[-1] == 4:   # premultiplied source-over
        dst_rgb, dst_a = images[..., :3], images[..., 3:]
        out_a = alpha + (1.0 - alpha) * dst_a
        out_rgb = rgb * alpha + (1.0 - alpha) * dst_rgb * dst_a
        out_rgb = torch.where(out_a > 1e-5, out_rgb / out_a, torch.zeros_like(out_rgb))
        return torch.cat((out_rgb.clamp(0, 1), out_a), dim=-1)
    return images * (1.0 - alpha) + rgb * alpha
