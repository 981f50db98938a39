"""ComfyUI 0.38.1's `ResizeImageMaskNode` ("Resize Image/Mask", nodes_post_processing.py): an
IMAGE or a MASK (one MatchType socket) resized the way its `resize_type` DynamicCombo says, each
option with its own sub-inputs (graph/dynamic.py). The resizes are in nodes/helpers/resize_ops.py."""

from __future__ import annotations

from mixgraph.graph.dynamic import MatchTemplate, Option, dynamic_combo, match_input, match_output
from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers import resize_ops

IMAGE_OR_MASK = MatchTemplate("input_type", ("IMAGE", "MASK"))

_CROP = ("crop", Combo(resize_ops.CROP_METHODS, "center", tooltip=(
    "On an aspect-ratio mismatch: 'disabled' stretches, 'center' crops to keep the ratio.")))


def _size(name: str, default: int = 512, lo: int = 0, tip: str = "") -> tuple:
    return (name, Int(default, min=lo, max=MAX_RESOLUTION, step=1, tooltip=tip or None))


RESIZE_TYPE = dynamic_combo([
    Option("scale dimensions", (
        _size("width", tip="Target width; 0 keeps the aspect ratio from the height."),
        _size("height", tip="Target height; 0 keeps the aspect ratio from the width."), _CROP)),
    Option("scale by multiplier", (
        ("multiplier", Float(1.0, min=0.01, max=8.0, step=0.01, tooltip="Scale factor.")),)),
    Option("scale longer dimension", (_size("longer_size", tip="The longer edge's new size."),)),
    Option("scale shorter dimension", (_size("shorter_size", tip="The shorter edge's new size."),)),
    Option("scale width", (_size("width", tip="Target width; the height keeps the ratio."),)),
    Option("scale height", (_size("height", tip="Target height; the width keeps the ratio."),)),
    Option("scale total pixels", (
        ("megapixels", Float(1.0, min=0.01, max=16.0, step=0.01,
                             tooltip="Target megapixels (1.0 = 1024x1024); the ratio is kept.")),)),
    Option("match size", (
        ("match", Socket("IMAGE,MASK", tooltip="Resize to this image's or mask's size.")), _CROP)),
    Option("scale to multiple", (
        _size("multiple", 8, 1, "Make width and height divisible by this (scale, then crop)."),)),
], tooltip="How to resize: exact dimensions, a factor, another image's size, ...")


@node(category="transform", outputs=(match_output(IMAGE_OR_MASK, "resized"),),
      display_name="Resize Image/Mask", description="Resize an image or mask using various scaling methods.")
def ResizeImageMaskNode(input=match_input(IMAGE_OR_MASK), resize_type=RESIZE_TYPE,
                        scale_method=Combo(resize_ops.SCALE_METHODS, "area", tooltip=(
                            "Interpolation: 'area' for downscaling, 'lanczos' for upscaling, "
                            "'nearest-exact' for pixel art."))):
    return (resize_ops.resize(input, resize_type, scale_method),)
