"""Memory guards: image files, video files and tensors checked against the memory budget
before they are decoded or allocated (DESIGN §12).

Why: a 144-megapixel PNG decodes to about 7 GB of float32 IMAGE and working copies, a
900-megapixel one to 45 GB; an EmptyLatentImage of 16384x16384 px and batch 4096 asks for
256 TiB. Allocating first and failing later means the OOM killer (no error at all) or an
estimate that traces for a minute only to say "no". Every such size is known before the work:
an image's from its header (PIL reads it without decoding a pixel), a video's from its container
(PyAV: the stream's width, height and frame count or duration x rate), a latent's from the
node's inputs. So each is compared with `memory_budget.budget("cpu")` first and refused in
milliseconds, naming the file or node, the size, the bytes needed, the budget and how to raise
it (`--memory-budget GIB`).

Edge payloads (IMAGE, LATENT, decoded video frames) are float32 CPU tensors, so the CPU budget
is the one they count against. A size that passes here can still be too big for the whole run
(models, activations): that is the memory estimate's question (`ui/estimate.py`).

PIL's decompression-bomb limit (`Image.MAX_IMAGE_PIXELS`, 89 MP warning, 179 MP error) is a
fixed guess at the same danger; where mixgraph decodes a file itself the budget replaces it:
`image_header` and `open_image` lift the limit for their own call (under a lock, restoring it)
after or while checking the budget, so a 200-MP image within the budget loads and one over it is
refused with this module's message instead of an unhandled DecompressionBombError. (The limit
is a PIL global: while one of these calls runs, another thread's `Image.open` sees it lifted too.)
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Sequence

from PIL import Image

from mixgraph.nodes.models import memory_budget

__all__ = ["OverBudget", "ImageHeader", "tensor_bytes", "over_budget", "check_bytes", "check_tensor",
           "image_header", "image_decode_bytes", "image_problem", "check_image", "open_image",
           "video_decode_bytes", "video_problem", "bomb_limit_lifted", "describe_bytes", "HOW_TO_RAISE"]

#: what every refusal says about raising the budget
HOW_TO_RAISE = "raise it with --memory-budget GIB (or MIXGRAPH_MEMORY_BUDGET_GIB)"
#: bytes per pixel of a frame PIL holds decoded: PIL keeps RGB as 32-bit pixels, and 4 bytes
#: cover every mode LoadImage reads (L / P take less; the guard errs on the safe side)
PIL_PIXEL_BYTES = 4
#: bytes per pixel of an IMAGE element row: 3 channels of float32
IMAGE_PIXEL_BYTES = 3 * 4


class OverBudget(ValueError, MemoryError):
    """A file or tensor whose decoded / allocated size alone is over the memory budget (a
    MemoryError raised before the memory is asked for; a ValueError: the input is what is wrong)."""


def describe_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


def tensor_bytes(shape: Sequence[int], itemsize: int = 4) -> int:
    """Bytes of a dense tensor of `shape` (Python ints: no overflow for absurd sizes)."""
    n = itemsize
    for s in shape:
        n *= max(0, int(s))
    return n


def over_budget(needed: int, what: str, detail: str, fix: str = "use a smaller size") -> str | None:
    """The refusal when `needed` bytes are over the CPU budget, else None. `what` names the
    thing (file, node input), `detail` its size and what the bytes are, `fix` the other way out."""
    b = memory_budget.budget("cpu")
    if needed <= b.nbytes:
        return None
    return (f"{what}: {detail} needs {describe_bytes(needed)}, over the memory budget of "
            f"{describe_bytes(b.nbytes)} ({b.origin}); {HOW_TO_RAISE}, or {fix}")


def check_bytes(needed: int, what: str, detail: str, fix: str = "use a smaller size") -> None:
    problem = over_budget(needed, what, detail, fix)
    if problem:
        raise OverBudget(problem)


def check_tensor(shape: Sequence[int], what: str, itemsize: int = 4, fix: str = "use a smaller size") -> None:
    """OverBudget before allocating a tensor of `shape` whose bytes alone are over the budget."""
    shape = tuple(int(s) for s in shape)
    check_bytes(tensor_bytes(shape, itemsize), what,
                f"a float32 tensor {list(shape)}" if itemsize == 4 else f"a tensor {list(shape)}", fix)


# --------------------------------------------------------------------------------------------
# images

_pil_lock = threading.RLock()


@contextlib.contextmanager
def bomb_limit_lifted() -> Iterator[None]:
    """PIL's decompression-bomb limit lifted for this block (the budget is the limit here)."""
    with _pil_lock:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says, read without decoding a pixel."""
    width: int
    height: int
    frames: int
    mode: str

    @property
    def megapixels(self) -> float:
        return self.width * self.height / 1e6


Source = str | Path | bytes | BinaryIO


def _fp(source: Source) -> Any:
    return io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source


def image_header(source: Source) -> ImageHeader:
    """Width, height, frame count and mode from the header; OSError / ValueError (PIL's) when it
    is no image. Never a DecompressionBombError: the size is what the caller judges."""
    with bomb_limit_lifted(), Image.open(_fp(source)) as im:
        return ImageHeader(int(im.width), int(im.height), int(getattr(im, "n_frames", 1) or 1), im.mode)


def image_decode_bytes(h: ImageHeader) -> int:
    """Peak bytes LoadImage's decode holds: PIL's decoded frame and its RGB copy, the float32
    frame being converted (and its /255 copy), and the IMAGE batch [N, H, W, 3] twice (the list
    of frames and their stack), plus the MASK [N, H, W] twice when the image has alpha."""
    px = h.width * h.height
    frame = px * (2 * PIL_PIXEL_BYTES + 2 * IMAGE_PIXEL_BYTES)
    batch = 2 * h.frames * px * IMAGE_PIXEL_BYTES
    mask = 2 * h.frames * px * 4 if ("A" in h.mode or h.mode in ("LA", "PA", "P")) else 0
    return frame + batch + mask


def _image_detail(h: ImageHeader) -> str:
    frames = "1 frame" if h.frames == 1 else f"{h.frames} frames"
    return (f"{h.width}x{h.height} px ({h.megapixels:.0f} MP, {frames}); decoding it to an IMAGE "
            f"[{h.frames}, {h.height}, {h.width}, 3] float32")


def image_problem(source: Source, what: str) -> str | None:
    """The refusal of an image file over the budget (read from its header only), else None.
    A file that is no image is not this check's business (None: the decode says so)."""
    try:
        h = image_header(source)
    except Exception:  # noqa: BLE001 - PIL raises many types for undecodable data
        return None
    return over_budget(image_decode_bytes(h), what, _image_detail(h))


def check_image(source: Source, what: str) -> ImageHeader:
    """The header, after checking the decode against the budget (OverBudget if over it)."""
    h = image_header(source)
    check_bytes(image_decode_bytes(h), what, _image_detail(h))
    return h


@contextlib.contextmanager
def open_image(source: Source, what: str) -> Iterator[Image.Image]:
    """`Image.open` for a decode: the budget checked from the header first, then PIL's
    decompression-bomb limit lifted for the whole block (the budget took its place; GIF frames
    check it again on seek). The caller decodes (`convert`, frames) inside the block; decodes
    through this function run one at a time."""
    check_image(source, what)
    if hasattr(source, "seek"):
        source.seek(0)
    with bomb_limit_lifted(), Image.open(_fp(source)) as im:
        im.load()
        yield im


# --------------------------------------------------------------------------------------------
# videos


def video_decode_bytes(width: int, height: int, frames: int) -> int:
    """Peak bytes of decoding a whole video to IMAGE frames (`video_codec.decode`): the rgb24
    frames and their stack (uint8), the float32 batch [N, H, W, 3] and its /255 copy."""
    px = max(1, frames) * width * height
    return px * (2 * 3 + 2 * IMAGE_PIXEL_BYTES)


def video_problem(width: int, height: int, frames: int, what: str) -> str | None:
    """The refusal of a video whose decoded frames are over the budget, else None."""
    detail = (f"{width}x{height} px x {frames} frames; decoding it to an IMAGE "
              f"[{frames}, {height}, {width}, 3] float32")
    return over_budget(video_decode_bytes(width, height, frames), what, detail)

