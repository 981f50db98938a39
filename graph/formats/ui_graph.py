"""The ComfyUI UI-format (LiteGraph) file model: nodes, links, groups, subgraph definitions, and
the positional layout of `widgets_values`.

Shapes follow what ComfyUI's frontend saves (its zod schema `comfyWorkflow`): the root graph is
format 0.4 (links as `[id, origin_id, origin_slot, target_id, target_slot, type]`) or 1 (links as
objects with the same fields); a subgraph definition in `definitions.subgraphs` is a format-1
graph plus `id` (the UUID an instance node carries as its `type`), `name`, `inputs`/`outputs`
(ordered slots, each with the `linkIds` that leave or reach it inside) and `inputNode`/`outputNode`
(the boundary pseudo-nodes, ids -10 and -20, that inner links name as origin or target).
Conversion to a prompt lives in `graph.formats.ui_format`; subgraph expansion in `graph.formats.ui_subgraph`.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from mixgraph.graph.dynamic import DynCombo, Rows
from mixgraph.graph.prompt import WorkflowError
from mixgraph.graph.registry import widget_order

MODE_NEVER, MODE_BYPASS = 2, 4
IGNORED = frozenset({"Note", "MarkdownNote"})
REROUTE, PRIMITIVE = "Reroute", "PrimitiveNode"
CONTROL_NAMES = frozenset({"seed", "noise_seed"})
UPLOAD_KEYS = ("image_upload", "video_upload", "audio_upload", "animated_image_upload")
#: Legacy group nodes (`extra.groupNodes`) are instanced as `workflow>NAME` (older: `workflow/NAME`).
GROUP_NODE_PREFIXES = ("workflow>", "workflow/")
SUBGRAPH_INPUT_ID, SUBGRAPH_OUTPUT_ID = -10, -20

#: A precision tag in a group title or subgraph name: `[bf16]`, `[f16+upcast]`, `[auto]`, or a
#: preset: `[quality]`, `[balanced]`, `[memory]`, `[fast]`.
PRECISION_TAG = re.compile(
    r"\[\s*((?:auto|quality|balanced|memory|fast|f32|fp32|bf16|f16|fp16|fp8_?\w*|int8)"
    r"(?:[:+][\w.:+]*)?)\s*\]", re.IGNORECASE)


class UiInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    type: Any = "*"
    link: int | None = None
    widget: dict[str, Any] | None = None


class UiOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = ""
    type: Any = "*"


class UiNode(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int | str
    type: str
    pos: list[float] | dict[str, float] | None = None
    mode: int = 0
    title: str | None = None
    inputs: list[UiInput] = Field(default_factory=list)
    outputs: list[UiOutput] = Field(default_factory=list)
    widgets_values: list[Any] | dict[str, Any] | None = None
    properties: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return str(self.id)

    def xy(self) -> tuple[float, float] | None:
        p = self.pos
        if isinstance(p, dict):
            p = [p.get("0"), p.get("1")]
        if not p or len(p) < 2 or p[0] is None or p[1] is None:
            return None
        return float(p[0]), float(p[1])


class UiGroup(BaseModel):
    model_config = ConfigDict(extra="ignore")
    title: str = ""
    bounding: list[float]
    properties: dict[str, Any] = Field(default_factory=dict)


class SubgraphSlot(BaseModel):
    """One input or output of a subgraph definition; `linkIds` are the inner links at it."""

    model_config = ConfigDict(extra="ignore")
    name: str = ""
    type: Any = "*"
    linkIds: list[int] = Field(default_factory=list)


class SubgraphIONode(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int | str


class SubgraphDef(BaseModel):
    """One entry of `definitions.subgraphs`."""

    model_config = ConfigDict(extra="ignore")
    id: str
    name: str = ""
    nodes: list[UiNode] = Field(default_factory=list)
    links: list[list[Any] | dict[str, Any]] | dict[str, dict[str, Any]] = Field(default_factory=list)
    groups: list[UiGroup] = Field(default_factory=list)
    inputs: list[SubgraphSlot] = Field(default_factory=list)
    outputs: list[SubgraphSlot] = Field(default_factory=list)
    inputNode: SubgraphIONode = SubgraphIONode(id=SUBGRAPH_INPUT_ID)
    outputNode: SubgraphIONode = SubgraphIONode(id=SUBGRAPH_OUTPUT_ID)
    properties: dict[str, Any] = Field(default_factory=dict)
    definitions: dict[str, Any] | None = None


class UiWorkflow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodes: list[UiNode]
    links: list[list[Any] | dict[str, Any]] | dict[str, dict[str, Any]] = Field(default_factory=list)
    groups: list[UiGroup] = Field(default_factory=list)
    definitions: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


class UiLink(NamedTuple):
    origin: str
    origin_slot: int
    target: str | None
    target_slot: int | None


def link_table(raw: list | dict, where: str) -> dict[int, UiLink]:
    """link id -> UiLink. Links are `[id, origin, slot, target, slot, type]` (format 0.4) or
    objects with the same fields (format 1; a dict of them keyed by id is accepted too)."""
    table = {}
    for entry in (raw.values() if isinstance(raw, dict) else raw):
        try:
            if isinstance(entry, dict):
                lid, origin, slot = entry["id"], entry["origin_id"], entry["origin_slot"]
                target, tslot = entry.get("target_id"), entry.get("target_slot")
            else:
                lid, origin, slot = entry[0], entry[1], entry[2]
                target, tslot = (entry[3], entry[4]) if len(entry) > 4 else (None, None)
            table[int(lid)] = UiLink(str(origin), int(slot), None if target is None else str(target),
                                     None if tslot is None else int(tslot))
        except (KeyError, IndexError, TypeError, ValueError):
            raise WorkflowError(f"{where}: malformed link {entry!r}; expected [id, origin_id, "
                                f"origin_slot, target_id, target_slot, type]") from None
    return table


def widget_slots(spec: Any) -> list[str | None]:
    """Input names in `widgets_values` order; None marks a UI-only value (control, upload).

    `widgets_values` is positional over the node's widget inputs in object_info order (required,
    then optional). An INT input with `control_after_generate`, or any INT named `seed` or
    `noise_seed`, is followed by its control value ("fixed", "randomize", ...); a COMBO with
    `control_after_generate` by the control value and a filter string; a COMBO with
    `image_upload` by the upload button's value. A DynamicCombo's slot is its chosen key; the
    chosen option's widget values follow it. A DynamicGroup's slot is its hidden row-count
    widget; the rows' field values follow it (`widget_inputs` reads both: their count depends on
    the value in the slot)."""
    slots: list[str | None] = []
    for input_name, inp in widget_order(spec):
        if not inp.is_widget and not isinstance(inp.grow, (DynCombo, Rows)):
            continue
        slots.append(input_name)
        slots += [None] * companions(input_name, inp)
    return slots


def companions(name: str, inp: Any) -> int:
    """How many UI-only values the editor saves right after widget input `inp` named `name`."""
    extra = dict(inp.extra)
    n = 0
    if inp.type == "INT" and (extra.get("control_after_generate") or name in CONTROL_NAMES):
        n += 1
    elif inp.type == "COMBO" and extra.get("control_after_generate"):
        n += 2  # control mode + the combo filter string
    if inp.type == "COMBO" and any(extra.get(k) for k in UPLOAD_KEYS):
        n += 1
    return n


def companion_count(spec: Any, widget_name: str) -> int:
    """How many UI-only values follow widget `widget_name` in `widgets_values` (0 if none)."""
    slots = widget_slots(spec)
    if widget_name not in slots:
        return 0
    i, n = slots.index(widget_name) + 1, 0
    while i + n < len(slots) and slots[i + n] is None:
        n += 1
    return n


def widget_inputs(n: UiNode, spec: Any) -> dict[str, Any]:
    """The literal inputs a node's own widgets give (missing trailing values: the defaults), plus
    those its editor-only trailing widgets give (`NodeSpec.ui_widgets`)."""
    values = n.widgets_values
    inputs: dict[str, Any] = {}
    if isinstance(values, dict):  # some extensions serialise widgets by name
        widgets = {name for name, i in spec.inputs if i.is_widget or isinstance(i.grow, (DynCombo, Rows))}
        counts = {name for name, i in spec.inputs if isinstance(i.grow, Rows)}   # row counts: UI-only
        inputs = {k: v for k, v in values.items() if k.split(".", 1)[0] in widgets and k not in counts}
        if spec.ui_widgets is not None:   # editor-only widgets by their names (CustomCombo's options)
            inputs.update(spec.ui_widgets.read_named(values, dict(inputs)))
        return inputs
    values = values or []
    skip = 0   # the values of DynamicCombo sub-widgets and DynamicGroup rows read so far
    slots = widget_slots(spec)
    for i, slot in enumerate(slots):
        if slot is None:
            continue
        i += skip
        grow = spec.input_map[slot].grow
        if isinstance(grow, Rows):
            skip += _read_rows(slot, grow, values, i, inputs)
        elif i < len(values):
            inputs[slot] = values[i]
            if isinstance(grow, DynCombo):
                for sub in grow.widget_subs(values[i]):
                    skip += 1
                    if i + skip < len(values):
                        inputs[f"{slot}.{sub}"] = values[i + skip]
        else:
            inp = spec.input_map[slot]
            if inp.has_default:
                inputs[slot] = inp.default
    if spec.ui_widgets is not None:   # editor-only values after the declared ones (CustomCombo)
        inputs.update(spec.ui_widgets.read(values[len(slots) + skip:], dict(inputs)))
    return inputs


def _read_rows(name: str, rows: Rows, values: list, at: int, inputs: dict[str, Any]) -> int:
    """A DynamicGroup's part of `widget_inputs`: `values[at]` is the row count (the editor's
    hidden count widget), then each row's fields in `Rows.widget_fields` order, each followed by
    its UI-only values. Gives `<name>.<row>.<field>` as the editor queues them; a None value is
    a field left out (how `ui_export` writes a row missing from the prompt), a value past the end
    of the list the field's default (the editor's new row). Returns how many values after the
    count the rows took."""
    count = rows.editor_count(values[at] if at < len(values) else None)
    inp_of = dict(rows.fields)
    k = at + 1
    for r in range(count):
        for f in rows.widget_fields():
            inp = inp_of[f]
            if k < len(values):
                if values[k] is not None:
                    inputs[f"{name}.{r}.{f}"] = values[k]
            elif inp.has_default:
                inputs[f"{name}.{r}.{f}"] = inp.default
            k += 1 + companions(f, inp)
    return k - (at + 1)


def bypass_input(n: UiNode, slot: int) -> int | None:
    """The input a bypassed node passes to its output `slot` (the frontend's rule)."""
    out_type = n.outputs[slot].type if slot < len(n.outputs) else "*"
    if out_type == "*":
        return slot if slot < len(n.inputs) else (0 if n.inputs else None)
    if slot < len(n.inputs) and types_match(n.inputs[slot].type, out_type):
        return slot
    for i, inp in enumerate(n.inputs):
        if inp.type == out_type:
            return i
    for i, inp in enumerate(n.inputs):
        if types_match(inp.type, out_type):
            return i
    return None


def types_match(a: Any, b: Any) -> bool:
    if a == b or a == "*" or b == "*":
        return True
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return bool({t.strip() for t in a.split(",")} & {t.strip() for t in b.split(",")})


def precision_tag(text: str | None) -> tuple[str, str] | None:
    """(text without the tag, SPEC) when `text` carries a precision tag, else None."""
    match = PRECISION_TAG.search(text or "")
    if match is None:
        return None
    return PRECISION_TAG.sub("", text).strip(), match.group(1)
