"""ComfyUI's primitive value nodes (comfy_extras/nodes_primitive.py, and the newer `SeedNode` and
`ColorToRGBInt` of the official templates) and text nodes (comfy_extras/nodes_string.py)."""

from __future__ import annotations

import sys

from mixgraph.graph.node import Boolean, Combo, Float, Int, String, Widget, node
from mixgraph.nodes.helpers import resize_ops, text_ops
from mixgraph.nodes.helpers.colour import colour_ops


@node(category="utils/primitive", outputs=("STRING",), display_name="String")
def PrimitiveString(value=String("")):
    return (value,)


@node(category="utils/primitive", outputs=("STRING",), display_name="String (Multiline)")
def PrimitiveStringMultiline(value=String("", multiline=True)):
    return (value,)


@node(category="utils/primitive", outputs=("INT",), display_name="Int")
def PrimitiveInt(value=Int(0, min=-sys.maxsize, max=sys.maxsize, control_after_generate=True)):
    return (value,)


@node(category="utils/primitive", outputs=("FLOAT",), display_name="Float")
def PrimitiveFloat(value=Float(0.0, min=-sys.maxsize, max=sys.maxsize, step=0.1)):
    return (value,)


@node(category="utils/primitive", outputs=("BOOLEAN",), display_name="Boolean")
def PrimitiveBoolean(value=Boolean(False)):
    return (value,)


@node(category="utils/string", outputs=("STRING",), display_name="Concatenate")
def StringConcatenate(string_a=String(multiline=True), string_b=String(multiline=True),
                      delimiter=String("")):
    return (text_ops.concatenate(string_a, string_b, delimiter),)


@node(category="utils/string", outputs=("STRING",), display_name="Substring")
def StringSubstring(string=String(multiline=True), start=Int(0), end=Int(0)):
    return (text_ops.substring(string, start, end),)


@node(category="utils/string", outputs=(("INT", "length"),), display_name="Length")
def StringLength(string=String(multiline=True)):
    return (len(string),)


@node(category="utils/string", outputs=("STRING",), display_name="Case Converter")
def CaseConverter(string=String(multiline=True), mode=Combo(text_ops.CASES)):
    return (text_ops.convert_case(string, mode),)


@node(category="utils/string", outputs=("STRING",), display_name="Trim")
def StringTrim(string=String(multiline=True), mode=Combo(text_ops.TRIMS)):
    return (text_ops.trim(string, mode),)


@node(category="utils/string", outputs=("STRING",), display_name="Replace")
def StringReplace(string=String(multiline=True), find=String(multiline=True),
                  replace=String(multiline=True)):
    return (string.replace(find, replace),)


@node(category="utils/string", outputs=(("BOOLEAN", "contains"),), display_name="Contains")
def StringContains(string=String(multiline=True), substring=String(multiline=True),
                   case_sensitive=Boolean(True)):
    return (text_ops.contains(string, substring, case_sensitive),)


@node(category="utils/string", outputs=("BOOLEAN",), display_name="Compare")
def StringCompare(string_a=String(multiline=True), string_b=String(multiline=True),
                  mode=Combo(text_ops.COMPARISONS), case_sensitive=Boolean(True)):
    return (text_ops.compare(string_a, string_b, mode, case_sensitive),)


@node(category="utils/string", outputs=(("BOOLEAN", "matches"),), display_name="Regex Match")
def RegexMatch(string=String(multiline=True), regex_pattern=String(multiline=True),
               case_insensitive=Boolean(True), multiline=Boolean(False), dotall=Boolean(False)):
    return (text_ops.regex_match(string, regex_pattern,
                                 text_ops.flags(case_insensitive, multiline, dotall)),)


@node(category="utils/string", outputs=("STRING",), display_name="Regex Extract")
def RegexExtract(string=String(multiline=True), regex_pattern=String(multiline=True),
                 mode=Combo(text_ops.EXTRACTIONS), case_insensitive=Boolean(True),
                 multiline=Boolean(False), dotall=Boolean(False),
                 group_index=Int(1, min=0, max=100)):
    fl = text_ops.flags(case_insensitive, multiline, dotall)
    return (text_ops.regex_extract(string, regex_pattern, mode, fl, group_index),)


@node(category="utils/string", outputs=("STRING",), display_name="Regex Replace")
def RegexReplace(string=String(multiline=True), regex_pattern=String(multiline=True),
                 replace=String(multiline=True), case_insensitive=Boolean(True, optional=True),
                 multiline=Boolean(False, optional=True), dotall=Boolean(False, optional=True),
                 count=Int(0, min=0, max=100, optional=True)):
    fl = text_ops.flags(case_insensitive, multiline, dotall)
    return (text_ops.regex_replace(string, regex_pattern, replace, fl, count),)


@node(category="utils", outputs=(("INT", "width"), ("INT", "height")), display_name="Resolution Selector")
def ResolutionSelector(aspect_ratio=Combo(tuple(resize_ops.ASPECT_RATIOS), default="1:1 (Square)"),
                       megapixels=Float(1.0, min=0.1, max=16.0, step=0.1)):
    """Width and height (multiples of 8) for an aspect ratio and a megapixel target, e.g. for an
    empty latent (ComfyUI comfy_extras/nodes_resolution.py)."""
    return resize_ops.resolution_for(aspect_ratio, megapixels)


@node(category="utils/primitive", outputs=(("INT", "seed"),), display_name="Seed")
def SeedNode(seed=Int(0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True)):
    """A seed widget with the editor's control after generate, as an INT (newer ComfyUI core;
    the ACE-Step templates use it; inputs and output from the frontend's node definitions)."""
    return (seed,)


def _check_colour(env, color=None) -> list[tuple[str, str]]:
    if color is None:   # linked: checked when the node runs
        return []
    try:
        colour_ops.rgb_int_and_alpha(color)
    except ValueError as e:
        return [("color", str(e))]
    return []


@node(category="utils/primitive", outputs=(("INT", "rgb_int"), ("COLOR", "hex"), ("FLOAT", "alpha")),
      display_name="Color Picker", validate=_check_colour)
def ColorToRGBInt(color=Widget("COLOR", "#ffffff")):
    """Return a color RGB integer value and hexadecimal representation."""
    rgb, alpha = colour_ops.rgb_int_and_alpha(color)
    return (rgb, color, alpha)
