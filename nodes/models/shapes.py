"""The world of the embedded model: coloured shapes on coloured backgrounds.

The checkpoint shipped in ``data/models/checkpoints/mixgraph-shapes.safetensors`` was trained (by
``tools/train_embedded.py``) on pictures drawn here from captions such as
"a small red circle at the top left on a blue background". This module is the one home of that
world's vocabulary (`COLORS`, `SHAPES`, `SIZES`, `POSITIONS`), the caption grammar
(`caption`, `parse_caption`), the procedural renderer (`render`), the split of attribute
combinations into training and held-out ones (`is_held_out`), and the pixel-statistics check
(`check_image`) that says whether a picture shows what its caption asks for, without any model.

Pictures are 64x64 (an 8x8 latent at the SD VAE's 8x downscale). Everything is seeded: the same
seed gives the same pictures on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "COLORS", "SHAPES", "SIZES", "POSITIONS", "IMAGE_SIZE", "Scene", "caption", "parse_caption",
    "render", "random_scene", "is_held_out", "held_out_scenes", "check_image", "Verdict",
    "vocabulary_text", "vocabulary", "unknown_words", "EMBEDDED_CHECKPOINT", "EMBEDDED_MODELS",
    "MODEL_METADATA",
]

IMAGE_SIZE = 64
#: Models that ship with mixgraph, in a models-folder layout (checkpoints/, loras/, controlnet/):
#: every models folder lists them after the user's own files (nodes.helpers.folders).
EMBEDDED_MODELS = Path(__file__).parent / "data" / "models"
#: The trained checkpoint (tools/train_embedded.py).
EMBEDDED_CHECKPOINT = EMBEDDED_MODELS / "checkpoints" / "mixgraph-shapes.safetensors"
#: The safetensors metadata entry that marks a file as this model (tools/train_embedded.py
#: writes it), whatever the file is called or wherever it was copied.
MODEL_METADATA = ("mixgraph.model", "mixgraph-shapes")

# name -> RGB 0..255; chosen far apart so a dominant colour maps back to one name
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 140, 20),
    "yellow": (245, 225, 30),
    "green": (30, 160, 60),
    "cyan": (40, 210, 220),
    "blue": (30, 60, 210),
    "purple": (130, 40, 170),
    "pink": (250, 140, 200),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")
# shape extent (diameter / side) as a fraction of the picture side
SIZES: dict[str, float] = {"small": 0.25, "medium": 0.40, "large": 0.58}
# phrase -> (row, col) in a 3x3 grid
POSITIONS: dict[str, tuple[int, int]] = {
    "at the top left": (0, 0), "at the top": (0, 1), "at the top right": (0, 2),
    "on the left": (1, 0), "in the center": (1, 1), "on the right": (1, 2),
    "at the bottom left": (2, 0), "at the bottom": (2, 1), "at the bottom right": (2, 2),
}
MARGIN = 3  # pixels of background kept between a shape and the picture's edge


@dataclass(frozen=True)
class Scene:
    color: str
    shape: str
    size: str
    position: str
    background: str


def caption(scene: Scene, *, size: bool = True, position: bool = True, background: bool = True) -> str:
    """The caption of `scene`; the optional parts may be left out (the picture is the same)."""
    words = []
    if size and scene.size != "medium":
        words.append(scene.size)
    words += [scene.color, scene.shape]
    if position:
        words.append(scene.position)
    words = [_article(words[0]), *words]
    if background:
        words += ["on", _article(scene.background), scene.background, "background"]
    return " ".join(words)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def parse_caption(text: str) -> dict[str, str]:
    """The attributes a caption names (keys among color, shape, size, position, background)."""
    t = " " + " ".join(text.lower().replace(",", " ").split()) + " "
    found: dict[str, str] = {}
    for phrase in sorted(POSITIONS, key=len, reverse=True):
        if f" {phrase} " in t:
            found["position"] = phrase
            t = t.replace(f" {phrase} ", " ")
            break
    for name in COLORS:
        if f" {name} background " in t:
            found["background"] = name
            t = t.replace(f" {name} background ", " ")
            break
    for name in SHAPES:
        if f" {name} " in t:
            found["shape"] = name
            before = t.split(f" {name} ")[0].split()
            for word in reversed(before):
                if word in COLORS and "color" not in found:
                    found["color"] = word
                if word in SIZES and "size" not in found:
                    found["size"] = word
            break
    return found


def _key(scene: Scene) -> int:
    text = f"{scene.color}|{scene.shape}|{scene.size}|{scene.position}|{scene.background}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def is_held_out(scene: Scene) -> bool:
    """One attribute combination in ten is never drawn for training: the held-out captions."""
    return _key(scene) % 10 == 0


def all_scenes() -> list[Scene]:
    return [Scene(c, s, z, p, b) for c in COLORS for s in SHAPES for z in SIZES for p in POSITIONS
            for b in COLORS if b != c]


def held_out_scenes() -> list[Scene]:
    return [s for s in all_scenes() if is_held_out(s)]


def random_scene(rng: random.Random, held_out: bool = False, **fixed: str) -> Scene:
    """A random scene (attributes in `fixed` kept) from the training or the held-out split."""
    while True:
        color = fixed.get("color") or rng.choice(list(COLORS))
        background = fixed.get("background") or rng.choice([c for c in COLORS if c != color])
        if background == color:
            raise ValueError(f"shape and background cannot both be {color}")
        scene = Scene(color, fixed.get("shape") or rng.choice(SHAPES), fixed.get("size") or rng.choice(list(SIZES)),
                      fixed.get("position") or rng.choice(list(POSITIONS)), background)
        if is_held_out(scene) == held_out or len(fixed) == 5:
            return scene


def render(scene: Scene, rng: random.Random | None = None, size: int = IMAGE_SIZE) -> np.ndarray:
    """The picture of `scene`: uint8 [size, size, 3]. `rng` jitters the size and place a little
    (none: the nominal ones). Drawn at 4x and averaged down, so edges are anti-aliased."""
    ss = 4
    big = size * ss
    extent = SIZES[scene.size] * size
    row, col = POSITIONS[scene.position]
    jitter = (lambda a: rng.uniform(-a, a)) if rng is not None else (lambda a: 0.0)
    extent *= 1.0 + jitter(0.1)
    # centre of the grid cell, kept inside the picture with a margin
    lo, hi = MARGIN + extent / 2, size - MARGIN - extent / 2
    cx = lo + (hi - lo) * col / 2 + jitter(size * 0.04)
    cy = lo + (hi - lo) * row / 2 + jitter(size * 0.04)
    cx, cy = min(max(cx, lo), hi), min(max(cy, lo), hi)
    img = Image.new("RGB", (big, big), COLORS[scene.background])
    draw = ImageDraw.Draw(img)
    r = extent / 2 * ss
    x, y = cx * ss, cy * ss
    fill = COLORS[scene.color]
    if scene.shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif scene.shape == "square":
        draw.rectangle([x - r, y - r, x + r, y + r], fill=fill)
    elif scene.shape == "triangle":
        draw.polygon([(x, y - r), (x + r, y + r), (x - r, y + r)], fill=fill)
    else:
        raise ValueError(f"unknown shape {scene.shape!r}")
    return np.asarray(img.resize((size, size), Image.Resampling.BOX))


# ----------------------------------------------------------------------------------------------
# the pixel-statistics check


@dataclass(frozen=True)
class Verdict:
    color: str | None  # dominant colour of the shape (nearest palette colour)
    background: str | None  # dominant colour of the border
    shape: str | None  # the drawn shape whose blurred template fits the shape's coverage best
    position: str | None  # grid cell of the shape's centroid
    fill: float  # shape pixels / bounding-box pixels (circle ~0.79, square 1, triangle 0.5)
    shape_by_fill: str | None = None  # the class the fill ratio alone gives (an older, blur-sensitive reading)


_PALETTE = np.array(list(COLORS.values()), dtype=np.float32) / 255.0  # [K, 3]
_NAMES = list(COLORS)
_TEMPLATE_SUPERSAMPLE = 4  # as `render` draws
#: Gaussian blurs (pixels) tried on each template: a decoded picture's edges are soft, and a
#: 16-pixel square with softened corners fills its bounding box like a circle does
_TEMPLATE_BLURS = (0.0, 0.8, 1.4, 2.0)


def _nearest(rgb: np.ndarray) -> str:
    return _NAMES[int(np.argmin(((_PALETTE - rgb[None]) ** 2).sum(-1)))]


def _template(shape: str, cx: float, cy: float, r: float, h: int, w: int) -> np.ndarray:
    """Coverage [h, w] (0..1) of `shape` drawn as `render` draws it: centre (cx, cy), half-extent r."""
    ss = _TEMPLATE_SUPERSAMPLE
    xs = ((np.arange(w * ss) + 0.5) / ss)[None, :]
    ys = ((np.arange(h * ss) + 0.5) / ss)[:, None]
    if shape == "circle":
        inside = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
    elif shape == "square":
        inside = (np.abs(xs - cx) <= r) & (np.abs(ys - cy) <= r)
    else:  # apex up at (cx, cy - r), base from cx - r to cx + r at cy + r
        inside = (ys <= cy + r) & (np.abs(xs - cx) <= (ys - (cy - r)) / 2)
    return inside.reshape(h, ss, w, ss).mean(axis=(1, 3))


def _blur_matrix(sigma: float, n: int) -> np.ndarray:
    """[n, n] row-normalised Gaussian: G @ X @ G'.T blurs X separably (edges renormalised)."""
    if sigma == 0:
        return np.eye(n)
    i = np.arange(n)
    g = np.exp(-0.5 * ((i[:, None] - i[None, :]) / sigma) ** 2)
    return g / g.sum(axis=1, keepdims=True)


def _match_shape(coverage: np.ndarray) -> str:
    """The shape whose template, fitted to the coverage's area and centroid (scaled by +-10%,
    moved by +-half a pixel) and blurred by one of `_TEMPLATE_BLURS`, leaves the least squared
    error. A blurred picture is compared with equally blurred templates, so softened corners
    count against no class in particular."""
    h, w = coverage.shape
    area = float(coverage.sum())
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    mx, my = float((coverage * xs).sum() / area), float((coverage * ys).sum() / area)
    # half-extent r from the area (circle pi r^2, square 4 r^2, triangle 2 r^2); a triangle's
    # centroid lies r/3 below the centre of its bounding box
    fits = {"circle": (np.sqrt(area / np.pi), 0.0), "square": (np.sqrt(area) / 2, 0.0),
            "triangle": (np.sqrt(area / 2), -1 / 3)}
    # every template and its blur lie in this window; outside it the error is the same for all
    reach = int(np.ceil(1.1 * np.sqrt(area / 2) * 4 / 3 + 3 * max(_TEMPLATE_BLURS) + 1))
    y0, x0 = max(int(my) - reach, 0), max(int(mx) - reach, 0)
    coverage = coverage[y0:int(my) + reach + 1, x0:int(mx) + reach + 1]
    h, w = coverage.shape
    mx, my = mx - x0, my - y0
    blurs = [(_blur_matrix(s, h), _blur_matrix(s, w)) for s in _TEMPLATE_BLURS]
    errors = {}
    for shape, (r0, dy) in fits.items():
        best = np.inf
        for r in (0.9 * r0, r0, 1.1 * r0):
            for ox in (-0.5, 0.0, 0.5):
                for oy in (-0.5, 0.0, 0.5):
                    t = _template(shape, mx + ox, my + oy + dy * r, r, h, w)
                    for gy, gx in blurs:
                        best = min(best, float(((gy @ t @ gx.T - coverage) ** 2).sum()))
        errors[shape] = best
    return min(errors, key=errors.get)


def check_image(image: np.ndarray) -> Verdict:
    """Read colour, background, shape and position off a picture by pixel statistics.

    `image`: [H, W, 3], float 0..1 or uint8. The background colour is the median of the outer
    ring of pixels (shapes keep a margin from the edge); shape pixels are those nearer the
    shape's colour than the background's, the shape's colour being the median of the pixels far
    from the background. The class: each pixel's coverage is where its colour lies between
    the background's and the shape's; the circle, square and triangle templates of the same
    area and centroid, blurred alike, are compared with it and the closest wins
    (`_match_shape`). `shape_by_fill` is the reading from how much of its bounding box the
    shape fills (a square all of it, a circle pi/4, a triangle half), exact on sharp pictures
    but pulled towards "circle" by soft edges on small shapes.
    """
    img = np.asarray(image, dtype=np.float32)
    if img.max() > 1.5:
        img = img / 255.0
    if img.shape[0] > IMAGE_SIZE and img.shape[0] % IMAGE_SIZE == 0 and img.shape[1] % IMAGE_SIZE == 0:
        f0, f1 = img.shape[0] // IMAGE_SIZE, img.shape[1] // IMAGE_SIZE  # back to the drawn size
        img = img.reshape(IMAGE_SIZE, f0, img.shape[1] // f1, f1, 3).mean(axis=(1, 3))
    h, w, _ = img.shape
    ring = np.concatenate([img[:2].reshape(-1, 3), img[-2:].reshape(-1, 3),
                           img[:, :2].reshape(-1, 3), img[:, -2:].reshape(-1, 3)])
    bg = np.median(ring, axis=0)
    dist_bg = np.sqrt(((img - bg) ** 2).sum(-1))
    far = dist_bg > 0.25
    if far.sum() < 4:
        return Verdict(None, _nearest(bg), None, None, 0.0)
    fg = np.median(img[far], axis=0)
    dist_fg = np.sqrt(((img - fg) ** 2).sum(-1))
    mask = dist_fg < dist_bg
    ys, xs = np.nonzero(mask)
    box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
    fill = float(mask.sum() / box)
    by_fill = "square" if fill > 0.9 else "circle" if fill > 0.64 else "triangle"
    axis = fg - bg
    coverage = np.clip(((img - bg) @ axis) / float(axis @ axis), 0.0, 1.0)
    # where the centre lies in the range the shape's centre can take (see `render`)
    cells = []
    for lo, hi, n in ((ys.min(), ys.max(), h), (xs.min(), xs.max(), w)):
        extent = hi - lo + 1
        free = max(n - 2 * MARGIN - extent, 1)
        rel = ((lo + hi + 1) / 2 - MARGIN - extent / 2) / free
        cells.append(min(max(int(round(rel * 2)), 0), 2))
    cell = (cells[0], cells[1])
    position = next(p for p, rc in POSITIONS.items() if rc == cell)
    return Verdict(_nearest(fg), _nearest(bg), _match_shape(coverage), position, fill, by_fill)


def vocabulary_text() -> str:
    """What the embedded model knows, for `mixgraph demo --help` and the README."""
    return (
        "The embedded model draws one shape on a plain background, 64x64 pixels. Prompts follow "
        "'a [SIZE] COLOR SHAPE [POSITION] [on a COLOR background]', e.g. "
        "'a small red circle at the top left on a blue background'. "
        f"COLOR: {', '.join(COLORS)}. SHAPE: {', '.join(SHAPES)}. SIZE: small, large (or none). "
        f"POSITION: {', '.join(POSITIONS)}. Other words are not known to it."
    )


@functools.cache
def vocabulary() -> frozenset[str]:
    """Every word of every training caption: the only words whose token embeddings the trained
    checkpoint keeps (tools/train_embedded.py zeroes the rest), so the only ones it can draw."""
    words: set[str] = set()
    for scene in all_scenes():
        words.update(caption(scene).split())
    return frozenset(words)


_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_EMBEDDING = re.compile(r"embedding:\S+")


def unknown_words(text: str) -> list[str]:
    """The words of a prompt the model does not know, each once, in prompt order. Prompt syntax
    is not a word: `(red:1.2)` weights, numbers, `embedding:name` textual inversions."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(_EMBEDDING.sub(" ", text.lower())):
        if word not in vocabulary():
            seen.setdefault(word)
    return list(seen)
