"""Image nodes: load, save, preview, scale."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Result, Socket, String, node
from mixgraph.graph.spec import Hidden, Output
from mixgraph.nodes.helpers import folders, imaging, latent_ops
from mixgraph.nodes.media import memory_guards

IMAGE_UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")


def _image_path(env: Any, image: str) -> Path:
    return folders.safe_join(Path(env.input), image)


def _image_fingerprint(env: Any, image: str = "", **_: Any):
    """LoadImage's external state is the file's content (ComfyUI hashes it: IS_CHANGED)."""
    try:
        return fingerprint_file(_image_path(env, image))
    except (folders.FolderError, OSError):
        return None


def _image_exists(env: Any, image: str | None = None, **_: Any) -> list[str]:
    if image is None or env is None:
        return []
    try:
        path = _image_path(env, image)
    except folders.FolderError as e:
        return [str(e)]
    if not path.is_file():
        return [folders.missing_image(
            image, path, f"put it in the input folder {os.path.abspath(env.input)} (--input DIR) "
                         f"or upload it in the editor")]
    return _fits(path, image)


def _fits(path: Path, image: str) -> list[str]:
    """The image's decode checked against the memory budget from its header (no pixel read)."""
    problem = memory_guards.image_problem(path, f"{image!r}")
    return [("image", problem)] if problem else []


@node(category="image", outputs=("IMAGE", "MASK"), display_name="Load Image",
      fingerprint=_image_fingerprint, validate=_image_exists)
def LoadImage(ctx, image=Combo(folders.list_images, image_upload=True)):
    """An image from the input folder: RGB as IMAGE, 1 - alpha as MASK."""
    return imaging.load_image(_image_path(ctx.env, image), f"LoadImage image {image!r}")


@node(category="mask", outputs=("MASK",), display_name="Load Image (as Mask)",
      fingerprint=_image_fingerprint, validate=_image_exists)
def LoadImageMask(ctx, image=Combo(folders.list_images, image_upload=True),
                  channel=Combo(("alpha", "red", "green", "blue"))):
    return (imaging.load_image_mask(_image_path(ctx.env, image), channel, f"LoadImageMask image {image!r}"),)


@node(category="image", outputs=(Output("IMAGE", "images"),), output_node=True, display_name="Save Image")
def SaveImage(ctx, images=Socket("IMAGE"), filename_prefix=String("ComfyUI"),
              prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes PNGs `<prefix>_<counter:05>_.png` with the workflow in their text chunks."""
    saved = imaging.save_images(images, Path(ctx.env.output), filename_prefix, kind="output",
                                prompt=prompt, extra_pnginfo=extra_pnginfo, compress_level=4)
    return Result((images,), ui={"images": saved})


@node(category="image", outputs=(Output("IMAGE", "images"),), output_node=True, display_name="Preview Image",
      deterministic=False)
def PreviewImage(ctx, images=Socket("IMAGE"), prompt=Hidden("PROMPT"),
                 extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    prefix = "ComfyUI_temp_" + "".join(secrets.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    saved = imaging.save_images(images, Path(ctx.env.temp), prefix, kind="temp", prompt=prompt,
                                extra_pnginfo=extra_pnginfo, compress_level=1)
    return Result((images,), ui={"images": saved})


@node(category="image/upscaling", outputs=("IMAGE",), display_name="Upscale Image")
def ImageScale(image=Socket("IMAGE"), upscale_method=Combo(IMAGE_UPSCALE_METHODS),
               width=Int(512, min=0, max=MAX_RESOLUTION, step=1),
               height=Int(512, min=0, max=MAX_RESOLUTION, step=1),
               crop=Combo(("disabled", "center"))):
    return (latent_ops.scale_image(image, upscale_method, width, height, crop),)


@node(category="image/upscaling", outputs=("IMAGE",), display_name="Upscale Image By")
def ImageScaleBy(image=Socket("IMAGE"), upscale_method=Combo(IMAGE_UPSCALE_METHODS),
                 scale_by=Float(1.0, min=0.01, max=8.0, step=0.01)):
    return (latent_ops.scale_image_by(image, upscale_method, scale_by),)


_OUTPUT_TAG = " [output]"


def _output_image_path(env: Any, image: str) -> Path:
    """LoadImageOutput's value: a name in the output folder, plain or annotated " [output]"
    (ComfyUI's annotated file names)."""
    name = image[:-len(_OUTPUT_TAG)] if image.endswith(_OUTPUT_TAG) else image
    return folders.safe_join(Path(env.output), name)


def _list_output_images(env: Any) -> list[str]:
    if env is None:
        return []
    root = Path(getattr(env, "output", "output"))
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() + _OUTPUT_TAG for p in root.rglob("*")
                  if p.is_file() and p.suffix.lower() in folders.IMAGE_EXTENSIONS)


def _output_image_fingerprint(env: Any, image: str = "", **_: Any):
    try:
        return fingerprint_file(_output_image_path(env, image))
    except (folders.FolderError, OSError):
        return None


def _output_image_exists(env: Any, image: str | None = None, **_: Any) -> list[str]:
    """ComfyUI declares this input without an option list, so only the file is checked."""
    if image is None or env is None:
        return []
    try:
        path = _output_image_path(env, str(image))
    except folders.FolderError as e:
        return [str(e)]
    return _fits(path, str(image)) if path.is_file() else [folders.missing_image(str(image), path)]


@node(category="image", outputs=("IMAGE", "MASK"), display_name="Load Image (from Outputs)",
      fingerprint=_output_image_fingerprint, validate=_output_image_exists,
      description="Load an image from the output folder. When the refresh button is clicked, the node will update "
                  "the image list and automatically select the first image, allowing for easy iteration.")
def LoadImageOutput(ctx, image=Combo(_list_output_images, image_upload=True, image_folder="output",
                                     remote={"route": "/internal/files/output", "refresh_button": True,
                                             "control_after_refresh": "first"})):
    return imaging.load_image(_output_image_path(ctx.env, image), f"LoadImageOutput image {image!r}")
