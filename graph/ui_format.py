"""ComfyUI UI-format (LiteGraph) workflows → API prompt + precision regions.

ComfyUI's backend never does this conversion; the frontend does it in `graphToPrompt`. We follow
the frontend's rules, which a file written by any ComfyUI editor relies on:

* `widgets_values` is positional over the node's widget inputs in object_info order (required,
  then optional). An INT input with `control_after_generate`, or any INT named `seed` or
  `noise_seed`, is followed by its control value ("fixed", "randomize", ...); a COMBO with
  `control_after_generate` by the control value and a filter string; a COMBO with `image_upload`
  by the upload button's value. An input converted to a socket keeps its slot in
  `widgets_values`; its link wins over the stored value.
* muted nodes (mode 2) are dropped, and so are links from them; bypassed nodes (mode 4) are wired
  through: a consumer of output k gets the bypassed node's input k when its type matches, else
  its first input of that type.
* Reroute nodes are followed through chains; a PrimitiveNode's value (`widgets_values[0]`)
  becomes a literal on each target; Note and MarkdownNote are ignored.
* a group whose title carries a precision tag (`Sampling [bf16]`, `[f16+upcast]`) or whose
  `properties.precision` is set is a precision region holding the nodes whose `pos` lies inside
  its `bounding` box; nested groups give nested regions (ordered outermost first).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mixgraph.graph.registry import widget_order
from mixgraph.graph.prompt import (Link, NodeCall, PrecisionConfig, Region, Workflow, WorkflowError,
                                   pydantic_message)

MODE_NEVER, MODE_BYPASS = 2, 4
IGNORED = frozenset({"Note", "MarkdownNote"})
REROUTE, PRIMITIVE = "Reroute", "PrimitiveNode"
CONTROL_NAMES = frozenset({"seed", "noise_seed"})
UPLOAD_KEYS = ("image_upload", "video_upload", "audio_upload", "animated_image_upload")

#: A precision tag in a group title: `[bf16]`, `[f16+upcast]`, `[fp8_e4m3fn:bf16]`, `[auto]`, or a
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


class UiWorkflow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodes: list[UiNode]
    links: list[list[Any] | dict[str, Any]] = Field(default_factory=list)
    groups: list[UiGroup] = Field(default_factory=list)
    definitions: dict[str, Any] | None = None


def convert_ui(obj: dict, registry: Any, name: str = "<workflow>") -> Workflow:
    try:
        wf = UiWorkflow.model_validate(obj)
    except ValidationError as e:
        raise WorkflowError(f"{name}: not a valid ComfyUI UI workflow: {pydantic_message(e)}") from None
    nodes = {n.key: n for n in wf.nodes}
    subgraphs = {str(s.get("id")) for s in (wf.definitions or {}).get("subgraphs", [])
                 if isinstance(s, dict)}
    for n in wf.nodes:
        if n.type in subgraphs or n.type.startswith(("workflow>", "workflow/")):
            raise NotImplementedError(f"UI subgraphs and group nodes (node {n.key}, {n.type!r}): "
                                      f"not supported yet")
    links = _link_table(wf.links, name)
    prompt: dict[str, NodeCall] = {}
    for n in wf.nodes:
        if n.mode in (MODE_NEVER, MODE_BYPASS) or n.type in IGNORED or n.type in (REROUTE, PRIMITIVE):
            continue
        spec = registry.get(n.type) if registry is not None else None
        inputs = _widget_inputs(n, spec) if spec is not None else {}
        for inp in n.inputs:
            if inp.link is None:
                continue
            input_name = (inp.widget or {}).get("name", inp.name)
            got = _resolve(links.get(inp.link), nodes, links)
            if isinstance(got, Link):
                inputs[input_name] = got
            elif isinstance(got, _Literal):
                inputs[input_name] = got.value
        prompt[n.key] = NodeCall(n.type, inputs, n.title)
    regions = _regions(wf.groups, [n for n in wf.nodes if n.key in prompt])
    return Workflow(prompt=prompt, precision=PrecisionConfig(None, regions), ui=obj, source="ui")


def _link_table(raw: list, name: str) -> dict[int, tuple[str, int]]:
    """link id -> (origin node id, origin slot). Links are `[id, origin, slot, target, slot,
    type]` (format 0.4) or objects with the same fields (format 1)."""
    table = {}
    for entry in raw:
        try:
            if isinstance(entry, dict):
                lid, origin, slot = entry["id"], entry["origin_id"], entry["origin_slot"]
            else:
                lid, origin, slot = entry[0], entry[1], entry[2]
            table[int(lid)] = (str(origin), int(slot))
        except (KeyError, IndexError, TypeError, ValueError):
            raise WorkflowError(f"{name}: malformed link {entry!r}; expected [id, origin_id, "
                                f"origin_slot, target_id, target_slot, type]") from None
    return table


def widget_slots(spec: Any) -> list[str | None]:
    """Input names in `widgets_values` order; None marks a UI-only value (control, upload)."""
    slots: list[str | None] = []
    for input_name, inp in widget_order(spec):
        if not inp.is_widget:
            continue
        slots.append(input_name)
        extra = dict(inp.extra)
        if inp.type == "INT" and (extra.get("control_after_generate") or input_name in CONTROL_NAMES):
            slots.append(None)
        elif inp.type == "COMBO" and extra.get("control_after_generate"):
            slots += [None, None]  # control mode + the combo filter string
        if inp.type == "COMBO" and any(extra.get(k) for k in UPLOAD_KEYS):
            slots.append(None)
    return slots


def _widget_inputs(n: UiNode, spec: Any) -> dict[str, Any]:
    values = n.widgets_values
    inputs: dict[str, Any] = {}
    if isinstance(values, dict):  # some extensions serialise widgets by name
        widgets = {name for name, i in spec.inputs if i.is_widget}
        return {k: v for k, v in values.items() if k in widgets}
    values = values or []
    for i, slot in enumerate(widget_slots(spec)):
        if slot is None:
            continue
        if i < len(values):
            inputs[slot] = values[i]
        else:
            inp = spec.input_map[slot]
            if inp.has_default:
                inputs[slot] = inp.default
    return inputs


class _Literal:
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _resolve(origin: tuple[str, int] | None, nodes: dict[str, UiNode],
             links: dict[int, tuple[str, int]]) -> Link | _Literal | None:
    """Follow a link back through Reroutes and bypassed nodes to a real output (a `Link`), a
    PrimitiveNode (a `_Literal`), or nothing (None: dangling, muted, or an unlinked bypass)."""
    for _ in range(len(nodes) + 1):  # a loop of Reroutes must not hang
        if origin is None:
            return None
        node_id, slot = origin
        n = nodes.get(node_id)
        if n is None or n.mode == MODE_NEVER or n.type in IGNORED:
            return None
        if n.type == PRIMITIVE:
            values = n.widgets_values
            if isinstance(values, list) and values:
                return _Literal(values[0])
            return None
        if n.type == REROUTE:
            nxt = n.inputs[0].link if n.inputs else None
        elif n.mode == MODE_BYPASS:
            index = _bypass_input(n, slot)
            nxt = n.inputs[index].link if index is not None else None
        else:
            return Link(node_id, slot)
        origin = links.get(nxt) if nxt is not None else None
    return None


def _bypass_input(n: UiNode, slot: int) -> int | None:
    """The input a bypassed node passes to its output `slot` (the frontend's rule)."""
    out_type = n.outputs[slot].type if slot < len(n.outputs) else "*"
    if out_type == "*":
        return slot if slot < len(n.inputs) else (0 if n.inputs else None)
    if slot < len(n.inputs) and _types_match(n.inputs[slot].type, out_type):
        return slot
    for i, inp in enumerate(n.inputs):
        if inp.type == out_type:
            return i
    for i, inp in enumerate(n.inputs):
        if _types_match(inp.type, out_type):
            return i
    return None


def _types_match(a: Any, b: Any) -> bool:
    if a == b or a == "*" or b == "*":
        return True
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return bool({t.strip() for t in a.split(",")} & {t.strip() for t in b.split(",")})


def group_precision(group: UiGroup) -> tuple[str, str] | None:
    """(region name, SPEC) for a precision-tagged group, else None."""
    spec = group.properties.get("precision")
    match = PRECISION_TAG.search(group.title)
    if not spec and match:
        spec = match.group(1)
    if not spec or not isinstance(spec, str):
        return None
    name = PRECISION_TAG.sub("", group.title).strip() if match else group.title.strip()
    return (name or group.title.strip() or f"[{spec}]"), spec


def _regions(groups: list[UiGroup], nodes: list[UiNode]) -> tuple[Region, ...]:
    found = []
    for g in groups:
        tagged = group_precision(g)
        if tagged is None or len(g.bounding) < 4:
            continue
        x, y, w, h = g.bounding[:4]
        inside = frozenset(n.key for n in nodes if (p := n.xy()) is not None
                           and x <= p[0] <= x + w and y <= p[1] <= y + h)
        found.append((w * h, Region(tagged[0], inside, tagged[1], origin="group")))
    found.sort(key=lambda t: -t[0])  # outermost first; sort is stable for equal areas
    return tuple(r for _, r in found)
