"""ComfyUI nodes_images.py (015e604): `SaveImageAdvanced`, its `format` DynamicCombo (png / exr /
avif, each with its own bit depth and input colour space; avif also crf and a nested `save_mode`
DynamicCombo) as ComfyUI declares it. png (8-bit, 16-bit), exr (32-bit float) and avif (8-bit
YUV420, sRGB, crf, still or animated) are written (`nodes/helpers/image_save.py`); avif's choices Pillow
cannot honour (10-bit, HDR, a finite loop count) are refused at validation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mixgraph.graph.dynamic import Option, dynamic_combo
from mixgraph.graph.node import Combo, Float, Int, Result, Socket, String, node
from mixgraph.graph.spec import Hidden, Input, Output
from mixgraph.nodes.helpers import image_save


def _advanced(inp: Input) -> Input:
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


_EXR_SPACE_TIP = (
    "Colorspace of the input tensor. The EXR is always written as scene-linear in the matching gamut.\n"
    "sRGB — input is sRGB-encoded Rec.709; the inverse sRGB EOTF is applied.\n"
    "HDR — input is HLG-encoded Rec.2020 (BT.2100); the inverse HLG OETF is applied to get "
    "scene-linear light.\n"
    "linear — input is already scene-linear (Rec.709 primaries); written through unchanged. Use "
    "this for renderer/compositor output.")

FORMAT = dynamic_combo([
    Option("png", (
        ("bit_depth", Combo(("8-bit", "16-bit"), default="8-bit", advanced=True)),
        ("input_color_space", Combo(("sRGB",), default="sRGB", advanced=True)),
    )),
    Option("exr", (
        ("bit_depth", Combo(("32-bit float",), default="32-bit float", advanced=True)),
        ("input_color_space", Combo(("sRGB", "HDR", "linear"), default="sRGB", advanced=True,
                                    tooltip=_EXR_SPACE_TIP)),
    )),
    Option("avif", (
        ("bit_depth", Combo(("auto", "8-bit YUV420", "10-bit YUV420"), default="auto", advanced=True,
                            tooltip="Auto uses 8-bit YUV420 for sRGB and 10-bit YUV420 for HDR.")),
        ("input_color_space", Combo(("sRGB", "HDR", "HDR PQ"), default="sRGB", advanced=True,
                                    tooltip="Colorspace of the input images. HDR selects "
                                            "BT.2020/HLG and HDR PQ selects BT.2020/PQ.")),
        ("crf", _advanced(Int(18, min=1, max=63,
                              tooltip="Lower values produce higher quality and larger files."))),
        ("save_mode", dataclasses.replace(dynamic_combo([
            Option("still images"),
            Option("animated", (
                ("fps", Float(6.0, min=0.01, max=1000.0, step=0.01)),
                ("loop_count", _advanced(Int(0, min=0, max=1000, tooltip="Number of times to loop "
                                             "the animation. 0 loops forever."))),
            )),
        ]), extra=(("display_name", "save mode"),))),
    )),
], tooltip="The file format in which to save the image.")


def _check_format(env, format=None, **choice) -> list[tuple[str, str]]:
    if format == "avif":
        return image_save.avif_problems(
            choice.get("format.bit_depth", "auto"), choice.get("format.input_color_space", "sRGB"),
            choice.get("format.save_mode", "still images"), choice.get("format.save_mode.loop_count"))
    why = image_save.unsupported(format, choice.get("format.bit_depth", "8-bit"))
    return [("format", why)] if why else []


@node(category="image", outputs=(Output("IMAGE", "images"),), output_node=True,
      display_name="Save Image (Advanced)", validate=_check_format)
def SaveImageAdvanced(ctx, images=Socket("IMAGE", tooltip="The images to save."),
                      filename_prefix=String("ComfyUI", tooltip=(
                          "The prefix for the file to save. May include formatting tokens such as "
                          "%date:yyyy-MM-dd% or %Empty Latent Image.width%.")),
                      format=FORMAT, prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Saves the input images to your ComfyUI output directory."""
    saved = image_save.save_advanced(
        images, Path(ctx.env.output), filename_prefix, format["format"], format["bit_depth"],
        format.get("input_color_space", "sRGB"), prompt=prompt, extra_pnginfo=extra_pnginfo,
        avif=format if format["format"] == "avif" else None)
    ui = {"images": saved}
    if format["format"] == "avif" and (format.get("save_mode") or {}).get("save_mode") == "animated" \
            and len(images) > 1:
        ui["animated"] = (True,)   # ComfyUI's flag for an animated result
    return Result((images,), ui=ui)
