"""WebcamCapture (ComfyUI ``comfy_extras/nodes_webcam.py``): a LoadImage for the editor's webcam
widget. The browser captures a frame, uploads it to the temp folder (subfolder ``webcam``) and
sends the annotated name (``webcam/<time>.png [temp]``) as ``image``; ``width``/``height`` only
size the capture in the browser. With ``capture_on_queue`` (default) the node runs on every
prompt, as ComfyUI's NaN ``IS_CHANGED``; without it, when the file's content changes."""

from __future__ import annotations

from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import MAX_RESOLUTION, Boolean, Int, node
from mixgraph.graph.spec import Input
from mixgraph.nodes.helpers import folders, imaging
from mixgraph.nodes.media import memory_guards


_LINKED = object()  # the validator's default: `image` comes from a link, not a literal


def _fingerprint(env: Any, image: Any = "", capture_on_queue: bool = True, **_: Any):
    if capture_on_queue:
        return float("nan")  # a new frame on every queue: never equal to an earlier run
    if not isinstance(image, str):
        return None
    try:
        return fingerprint_file(folders.annotated_path(env, image))
    except (folders.FolderError, OSError):
        return None


def _frame_exists(env: Any, image: Any = _LINKED, **_: Any) -> list[str]:
    if image is _LINKED or env is None:
        return []
    if not isinstance(image, str) or not image:
        return ["no webcam frame: 'image' is empty (a UI workflow saves none); capture one in the "
                "editor, whose webcam widget uploads it when the prompt is queued"]
    try:
        path = folders.annotated_path(env, str(image))
    except folders.FolderError as e:
        return [str(e)]
    if not path.is_file():
        return [folders.missing_image(image, path)]
    problem = memory_guards.image_problem(path, f"{image!r}")
    return [("image", problem)] if problem else []


@node(category="image", outputs=("IMAGE",), display_name="Webcam Capture",
      fingerprint=_fingerprint, validate=_frame_exists)
def WebcamCapture(ctx, image=Input("WEBCAM"),
                  width=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                  height=Int(0, min=0, max=MAX_RESOLUTION, step=1),
                  capture_on_queue=Boolean(True)):
    """The captured webcam frame (uploaded by the editor) as an IMAGE."""
    return (imaging.load_image(folders.annotated_path(ctx.env, str(image)), f"WebcamCapture image {image!r}")[0],)
