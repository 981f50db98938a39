"""ComfyUI's PreviewAny (``comfy_extras/nodes_preview_any.py``, "Preview as Text"): any value
shown as text in the UI and passed on as a STRING."""

from __future__ import annotations

import json
from typing import Any

import torch

from mixgraph.graph.node import Result, Socket, node


def as_text(value: Any) -> str:
    """The text PreviewAny shows: strings as they are, numbers and booleans by `str`, None as
    "None", JSON (indent 4) for what JSON can hold, else `str` with tensors abbreviated to 6
    items at each edge."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    try:
        return json.dumps(value, indent=4)
    except (TypeError, ValueError):
        pass
    before = torch._tensor_str.PRINT_OPTS.edgeitems   # no public getter; restored below
    torch.set_printoptions(edgeitems=6)
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a payload whose repr fails still previews
        return "source exists, but could not be serialized."
    finally:
        torch.set_printoptions(edgeitems=before)


@node(category="utilities", display_name="Preview as Text", output_node=True, outputs=("STRING",))
def PreviewAny(source=Socket("*")):
    text = as_text(source)
    return Result((text,), ui={"text": (text,)})
