"""ComfyUI ``comfy_extras/nodes_text_overlay.py`` (Comfy-Org/ComfyUI 1df2885): `TextOverlay`.
The drawing is `nodes/helpers/text_overlay.py`; the `font` combo lists the `fonts` folder (ComfyUI's
`<base>/fonts`, .ttf / .otf: `folders.FOLDERS["fonts"]`)."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Combo, Float, Socket, String, Widget, node
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers import text_overlay
from mixgraph.nodes.helpers.model_files import FONT


@node(category="text", outputs=(Output("IMAGE", "images"),), display_name="Draw Text Overlay",
      description="Draw text overlay on an image or batch of images.")
def TextOverlay(ctx, images=Socket("IMAGE"), text=String("", multiline=True),
                font=FONT.input(),
                font_size=Float(5.0, min=0.5, max=50.0, step=0.5,
                                tooltip="Font size as a percentage of the image height."),
                color=Widget("COLOR", "#ffffff", socketless=True, tooltip="Color of the text."),
                position=Combo(["top", "bottom"], "top"),
                align=Combo(["left", "center", "right"], "left"),
                outline=Boolean(True, tooltip="Draw a black outline around the text.")):
    # an empty font value is PIL's built-in default font (ComfyUI's `if font:` test)
    path = FONT.path(ctx.env, font) if font else None
    return (text_overlay.overlay_text(images, text, path, font_size, color, position, align, outline),)
