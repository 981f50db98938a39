"""ComfyUI's colour-curve core nodes (ComfyUI 0.22+, used by the "Image color adjustment"
template): `ImageHistogram` (an image's five 256-bin histograms) and `CurveEditor` (the editor's
curve widget as a CURVE value, drawn over an optional histogram).

The local ComfyUI mirror (Oct 2025) predates them; the facts are the template's node data (inputs,
outputs, the widget value `{points, interpolation}`), the frontend's i18n node definitions
(display names, input and output names) and its curve widget (`CURVE_INTERPOLATIONS`,
`isCurveData`, the default curve, the `histogram` key it reads from the node's output). The
categories and the luminance weights are mixgraph's choice (helpers/colour/curve_ops.py says which).
"""

from __future__ import annotations

from mixgraph.graph.node import Result, Socket, Widget, node
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers.colour import curve_ops

_HISTOGRAMS = ("rgb", "luminance", "red", "green", "blue")


@node(category="image/color", outputs=tuple(Output("HISTOGRAM", n) for n in _HISTOGRAMS),
      display_name="Image Histogram")
def ImageHistogram(image=Socket("IMAGE")):
    """The 256-bin histograms of an image batch: all channels together, luminance, red, green and
    blue (for a Curve Editor to draw under its curve)."""
    h = curve_ops.histograms(image)
    return tuple(h[n] for n in _HISTOGRAMS)


def _check_curve(env, curve=None) -> list[tuple[str, str]]:
    if curve is None:   # linked: checked when the node runs
        return []
    try:
        curve_ops.parse_curve(curve)
    except curve_ops.CurveError as e:
        return [("curve", str(e))]
    return []


@node(category="image/color", outputs=(Output("CURVE", "curve"),), display_name="Curve Editor",
      validate=_check_curve)
def CurveEditor(curve=Widget("CURVE", dict(curve_ops.DEFAULT_CURVE)),
                histogram=Socket("HISTOGRAM", optional=True)):
    """A tone curve drawn in the editor, passed on as a CURVE; a connected histogram is sent to
    the editor (`{"histogram": [counts]}`) to draw under the curve."""
    value = curve_ops.parse_curve(curve)
    ui = {"histogram": list(curve_ops.parse_histogram(histogram))} if histogram is not None else None
    return Result((value,), ui=ui)
