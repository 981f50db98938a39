"""ComfyUI's ImageCompare (comfy_extras/nodes_image_compare.py): two optional image batches saved
as previews for the editor's compare slider, `{"a_images": [...], "b_images": [...]}`."""

from __future__ import annotations

import secrets
from pathlib import Path

from mixgraph.graph.node import Result, Socket, Widget, node
from mixgraph.nodes.helpers import imaging


def _preview(ctx, images, stem: str) -> list[dict[str, str]]:
    """PreviewImage's files: `<stem>_temp_<5 letters>_<counter>_.png` in the temp folder."""
    if images is None or len(images) == 0:
        return []
    prefix = stem + "_temp_" + "".join(secrets.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    return imaging.save_images(images, Path(ctx.env.temp), prefix, kind="temp", compress_level=1)


@node(category="image", outputs=(), output_node=True, display_name="Image Compare", deterministic=False,
      description="Compares two images side by side with a slider.")
def ImageCompare(ctx, image_a=Socket("IMAGE", optional=True), image_b=Socket("IMAGE", optional=True),
                 compare_view=Widget("IMAGECOMPARE", None, optional=True, socketless=True)):
    return Result(ui={"a_images": _preview(ctx, image_a, "comfy.compare.a"),
                      "b_images": _preview(ctx, image_b, "comfy.compare.b")})
