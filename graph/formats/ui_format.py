"""ComfyUI UI-format (LiteGraph) workflows → API prompt + precision regions.

ComfyUI's backend never does this conversion; the frontend does it in `graphToPrompt`. We follow
the frontend's rules, which a file written by any ComfyUI editor relies on:

* `widgets_values` is positional over the node's widget inputs (`graph.formats.ui_graph.widget_slots`).
  An input converted to a socket keeps its slot in `widgets_values`; its link wins over the
  stored value.
* muted nodes (mode 2) are dropped, and so are links from them; bypassed nodes (mode 4) are wired
  through: a consumer of output k gets the bypassed node's input k when its type matches, else
  its first input of that type.
* Reroute nodes are followed through chains; a PrimitiveNode's value (`widgets_values[0]`)
  becomes a literal on each target; Note and MarkdownNote are ignored.
* subgraph instances (`definitions.subgraphs`) are expanded in place, inner nodes under ids
  `"<instance>:<inner>"` (`graph.formats.ui_subgraph`); legacy group nodes (`workflow>NAME`,
  `extra.groupNodes`) become subgraphs first, as today's editor migrates them
  (`graph.formats.ui_group_nodes`).
* a group whose title carries a precision tag (`Sampling [bf16]`, `[f16+upcast]`) or whose
  `properties.precision` is set is a precision region holding the nodes whose `pos` lies inside
  its `bounding` box (an instance inside it: all its inner nodes). A subgraph is a region too when
  its instance has `properties.precision` or a tag in its title, or its definition has
  `properties.precision` or a tag in its `name`; it holds every node inside the instance. Regions
  nest (groups inside subgraphs, subgraphs inside groups and subgraphs) and are listed outermost
  first, so the innermost region holding a node decides its precision.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from mixgraph.graph.prompt import (Link, NodeCall, PrecisionConfig, Region, Workflow, WorkflowError,
                                   pydantic_message)
from mixgraph.graph.formats.ui_graph import (PRECISION_TAG, UiGroup, UiNode, UiWorkflow, link_table,
                                             precision_tag, widget_inputs, widget_slots)
from mixgraph.graph.formats.ui_group_nodes import legacy_group_subgraphs
from mixgraph.graph.formats.ui_subgraph import Literal, Scope, collect_definitions

__all__ = ["PRECISION_TAG", "UiGroup", "convert_ui", "group_precision", "subgraph_precision",
           "widget_slots"]


def convert_ui(obj: dict, registry: Any, name: str = "<workflow>") -> Workflow:
    try:
        wf = UiWorkflow.model_validate(obj)
    except ValidationError as e:
        raise WorkflowError(f"{name}: not a valid ComfyUI UI workflow: {pydantic_message(e)}") from None
    nodes, group_defs = legacy_group_subgraphs(wf.nodes, wf.extra, registry, name)
    definitions = collect_definitions(wf.definitions, name)
    definitions.update({d.id: d for d in group_defs})
    root = Scope(nodes, link_table(wf.links, name), wf.groups, definitions, registry, name)
    prompt: dict[str, NodeCall] = {}
    for scope, n in root.walk():
        spec = registry.get(n.type) if registry is not None else None
        inputs = widget_inputs(n, spec) if spec is not None else {}
        for inp in n.inputs:
            if inp.link is None:
                continue
            input_name = (inp.widget or {}).get("name", inp.name)
            got = scope.resolve(inp.link)
            if isinstance(got, Link):
                inputs[input_name] = got
            elif isinstance(got, Literal):
                inputs[input_name] = got.value
        prompt[scope.exec_id(n.key)] = NodeCall(n.type, inputs, n.title)
    for call in prompt.values():  # the frontend drops links to nodes that were not emitted
        for k in [k for k, v in call.inputs.items() if isinstance(v, Link) and v.node_id not in prompt]:
            del call.inputs[k]
    regions = _regions(root, frozenset(prompt))
    return Workflow(prompt=prompt, precision=PrecisionConfig(None, regions), ui=obj, source="ui")


def group_precision(group: UiGroup) -> tuple[str, str] | None:
    """(region name, SPEC) for a precision-tagged group, else None."""
    spec = group.properties.get("precision")
    tagged = precision_tag(group.title)
    if not spec and tagged:
        spec = tagged[1]
    if not spec or not isinstance(spec, str):
        return None
    name = tagged[0] if tagged else group.title.strip()
    return (name or group.title.strip() or f"[{spec}]"), spec


def subgraph_precision(instance: UiNode, scope: Scope) -> tuple[str, str] | None:
    """(region name, SPEC) for a precision-tagged subgraph instance, else None. The instance's
    own setting (properties.precision, then a tag in its title) wins over its definition's
    (properties.precision, then a tag in its name)."""
    sub = scope.definition
    title_tag, name_tag = precision_tag(instance.title), precision_tag(sub.name)
    spec = (instance.properties.get("precision") or (title_tag and title_tag[1])
            or sub.properties.get("precision") or (name_tag and name_tag[1]))
    if not spec or not isinstance(spec, str):
        return None
    label = (title_tag[0] if title_tag else (instance.title or "").strip()) \
        or (name_tag[0] if name_tag else sub.name.strip()) or f"[{spec}]"
    return f"{label} (subgraph node {':'.join(scope.path)})", spec


def _regions(scope: Scope, emitted: frozenset[str]) -> tuple[Region, ...]:
    """The precision regions of `scope` and everything inside it, outermost first."""
    def members(n: UiNode) -> set[str]:
        eid = scope.exec_id(n.key)
        if scope.is_instance(n):
            return {k for k in emitted if k.startswith(eid + ":")}
        return {eid} if eid in emitted else set()

    found = []
    for g in scope.groups:
        tagged = group_precision(g)
        if tagged is None or len(g.bounding) < 4:
            continue
        x, y, w, h = g.bounding[:4]
        inside = frozenset().union(*(members(n) for n in scope.order if (p := n.xy()) is not None
                                     and x <= p[0] <= x + w and y <= p[1] <= y + h))
        found.append((w * h, Region(tagged[0], inside, tagged[1], origin="group")))
    found.sort(key=lambda t: -t[0])  # outermost first; sort is stable for equal areas
    out = [r for _, r in found]
    for n, child in scope.expanded_instances():
        tagged = subgraph_precision(n, child)
        inside = frozenset(members(n))
        if tagged is not None and inside:
            out.append(Region(tagged[0], inside, tagged[1], origin="subgraph"))
        out += _regions(child, emitted)
    return tuple(out)
