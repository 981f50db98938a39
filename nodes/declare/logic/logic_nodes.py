"""ComfyUI 0.38.1's nodes built on dynamic sockets (graph/dynamic.py): nodes_logic.py (switch,
not/and/or, pass-or-none, CustomCombo), nodes_toolkit.py (CreateList), nodes_math.py
(ComfyMathExpression) and the nodes_string.py nodes mixgraph lacked (StringFormat,
JsonExtractString, ConvertDictionaryToString, ConvertArrayToString). Names, inputs, defaults and output order are
ComfyUI's; `Not`/`And`/`Or` use Python truthiness, as ComfyUI does."""

from __future__ import annotations

import string

from mixgraph.graph.dynamic import MatchTemplate, autogrow, match_input, match_output
from mixgraph.graph.node import Boolean, Combo, Int, Output, Socket, String, node
from mixgraph.graph.spec import Input
from mixgraph.nodes.helpers import text_ops
from mixgraph.nodes.helpers.expression import math_expression, number_convert

SWITCH = MatchTemplate("switch")
PASS = MatchTemplate("value")
LETTERS = tuple(string.ascii_lowercase)


def _switch_needs(switch, on_false=None, on_true=None):
    """Only the chosen branch is evaluated (its input is None until then)."""
    if switch and on_true is None:
        return ["on_true"]
    if not switch and on_false is None:
        return ["on_false"]
    return []


@node(category="utilities/logic", outputs=(match_output(SWITCH, "output"),),
      display_name="If/Else Switch", check_lazy_status=_switch_needs)
def ComfySwitchNode(switch=Boolean(False), on_false=match_input(SWITCH, lazy=True, optional=True),
                    on_true=match_input(SWITCH, lazy=True, optional=True)):
    """Passes on_true when switch is true, else on_false; only that branch runs."""
    return (on_true if switch else on_false,)


@node(category="utilities/logic", outputs=("BOOLEAN",), display_name="Not")
def ComfyNotNode(value=Socket("*")):
    """Logical NOT operation. Returns true if the value is falsy. Uses Python's rules for truthiness."""
    return (not value,)


@node(category="utilities/logic", outputs=("BOOLEAN",), display_name="And")
def ComfyAndNode(values=autogrow(Socket("*"), "value", prefix="value", min=1)):
    """Logical AND operation. Returns true if all of the values are truthy. Uses Python's rules for truthiness."""
    return (all(values.values()),)


@node(category="utilities/logic", outputs=("BOOLEAN",), display_name="Or")
def ComfyOrNode(values=autogrow(Socket("*"), "value", prefix="value", min=1)):
    """Logical OR operation. Returns true if any of the values are truthy. Uses Python's rules for truthiness."""
    return (any(values.values()),)


_PASS_TIP = ("Passes the input through, or a default value when input is None/not provided, or "
             "outputs None when both inputs are None/not provided.")


@node(category="utilities/logic", outputs=(match_output(PASS, "output"), ("BOOLEAN", "is_none")),
      display_name="Pass or None", description=_PASS_TIP)
def ComfyPassOrNoneNode(anything=match_input(PASS, optional=True, tooltip=_PASS_TIP),
                        default=match_input(PASS, optional=True, tooltip="Optional fallback value "
                                            "to use when the input is None/not provided.")):
    if anything is None:
        return default, default is None
    return anything, False


@node(category="utilities", outputs=(Output("*", "list", is_list=True),), display_name="Create List",
      input_is_list=True)
def CreateList(inputs=autogrow(Socket("*"), "input", prefix="input")):
    """Every input (each a list of one or more values) joined into one list, in input order."""
    out: list = []
    for values in inputs.values():
        out += values
    return (out,)


@node(category="utilities", outputs=(("FLOAT", "FLOAT"), ("INT", "INT"), ("BOOLEAN", "BOOL")),
      display_name="Math Expression")
def ComfyMathExpression(expression=String("a + b", multiline=True),
                        values=autogrow(Input("FLOAT,INT,BOOLEAN", optional=True), "value",
                                        names=LETTERS, min=1)):
    """Evaluates a math expression over the inputs a..z (and `values`, their list)."""
    return math_expression(expression, values)


@node(category="math", outputs=(("FLOAT", "FLOAT"), ("INT", "INT")), display_name="Number Convert")
def ComfyNumberConvert(value=Socket("INT,FLOAT,STRING,BOOLEAN")):
    """An INT, FLOAT, STRING or BOOLEAN as a FLOAT and an INT (comfy_extras/nodes_number_convert.py)."""
    return number_convert(value)


@node(category="text", outputs=("STRING",), display_name="Format Text")
def StringFormat(values=autogrow(Socket("*"), "value", names=LETTERS, min=0),
                 f_string=String("{a}", multiline=True)):
    """Same as Python's string format method. Supports all of Python's format options and features."""
    return (text_ops.format_string(f_string, values),)


@node(category="text", outputs=("STRING",), display_name="Extract Text from JSON")
def JsonExtractString(json_string=String(multiline=True), key=String()):
    """Extract a key's value from the first valid JSON object in the text, including Markdown code blocks."""
    return (text_ops.json_extract(json_string, key),)


_INDENT_TIP = "Spaces per indent level. 0 produces compact single-line string."


@node(category="text", outputs=("STRING",), display_name="Convert Dictionary to String")
def ConvertDictionaryToString(dictionary=Socket("DICT"),
                              indent=Int(2, min=0, max=8, tooltip=_INDENT_TIP)):
    return (text_ops.dump_json(dictionary, indent),)


@node(category="text", outputs=("STRING",), display_name="Convert Array to String")
def ConvertArrayToString(array=Socket("ARRAY"), indent=Int(2, min=0, max=8, tooltip=_INDENT_TIP)):
    return (text_ops.dump_json(array, indent),)


def _custom_options(env) -> list[str]:
    """CustomCombo's options are the user's, written in its editor widget: none server-side."""
    return []


def _custom_combo_valid(env, choice, index=0, **options):
    """Any chosen string (the options live in the editor); `index` must be an integer."""
    if isinstance(index, bool) or not isinstance(index, int):
        return [("index", f"must be an integer, got {index!r}")]
    return []


class CustomComboWidgets:
    """CustomCombo's editor-only widgets in a UI-format workflow (ComfyUI frontend's
    `Comfy.CustomWidgets` extension). After `choice`, `widgets_values` holds the hidden `index`
    widget's value, then the option strings `option1..N`, the last one always empty (the editor
    adds a blank option whenever the last one is filled in). Queuing sends every widget: `choice`,
    `index` (recomputed from the widgets: the first option equal to the chosen string, -1 if none)
    and `option1..N`, the trailing blank included."""

    def read(self, rest: list, inputs: dict) -> dict:
        if not rest:
            return {}
        if isinstance(rest[0], int) and not isinstance(rest[0], bool):
            options = rest[1:]
        else:   # no index value: files saved before the editor had the hidden index widget
            options = rest
        got = {f"option{i}": v for i, v in enumerate(options, 1)}
        choice = inputs.get("choice")
        got["index"] = next((i for i, v in enumerate(options) if v == choice), -1)
        return got

    def read_named(self, values: dict, inputs: dict) -> dict:
        """`widgets_values` saved as an object keyed by widget name (the editor's widget names:
        `choice`, the hidden `index`, `option1..N`). Options are taken in their number's order;
        `index` is recomputed from them, as the editor does when it queues."""
        numbered = sorted((int(k[6:]), v) for k, v in values.items()
                          if k.startswith("option") and k[6:].isdigit() and int(k[6:]) >= 1)
        if not numbered:
            return {}
        options = [v for _, v in numbered]
        got = {f"option{i}": v for i, v in enumerate(options, 1)}
        choice = inputs.get("choice")
        got["index"] = next((i for i, v in enumerate(options) if v == choice), -1)
        return got

    def write(self, inputs: dict) -> list:
        numbered = sorted((int(k[6:]), v) for k, v in inputs.items()
                          if k.startswith("option") and k[6:].isdigit())
        options = [v if isinstance(v, str) else "" for _, v in numbered]   # a link: no text
        while options and options[-1] == "":
            options.pop()
        index = inputs.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            choice = inputs.get("choice")
            index = next((i for i, v in enumerate(options) if v == choice), -1)
        return [index, *options, ""]


@node(category="utils", outputs=(("STRING", "STRING"), ("INT", "INDEX")), display_name="Custom Combo",
      description=("Provides a user-defined dropdown combo box where options are written by the "
                   "user, outputting the selected string and its index."),
      validate=_custom_combo_valid, accept_all_inputs=True, ui_widgets=CustomComboWidgets())
def CustomCombo(choice=Combo(_custom_options), **options):
    """ComfyUI's CustomCombo: the editor sends the chosen string as `choice`, its position as
    `index` and the user's options as `option1..N`, undeclared literals (`accept_all_inputs`);
    a UI-format workflow gives the same inputs (`CustomComboWidgets`)."""
    return (choice, options.get("index", 0))
