"""Legacy group nodes of UI-format workflows, turned into subgraphs the way ComfyUI's editor
migrates them on load.

Editors before subgraphs saved a *group node* as a definition in `extra.groupNodes[NAME]` (its
inner nodes, the links between them by node index, the outputs that also leave the group) and
instances of type `workflow>NAME` (older files: `workflow/NAME`). Today's editor unpacks each
instance into its inner nodes, copies the instance's widget values onto them, reconnects the
instance's links, and packs the result as a subgraph. `legacy_group_subgraphs` does the same
on the file: each instance gets its own subgraph definition (its values differ per instance)
and its `type` becomes that definition's id, so `graph.formats.ui_subgraph` expands it like any
subgraph (execution ids `"<instance>:<inner index>"`).

The instance's interface is the one the editor derived from the inner nodes' specs (the
frontend's `GroupNodeConfig`), in this order per inner node: its widget inputs (each followed by
its UI-only companions, a seed's control value), then its socket inputs that no inner link
feeds; after all inner nodes, the inner inputs that were widgets converted to sockets and no
inner link feeds. The instance's `widgets_values` are positional over those widgets; its inputs
are positional over the sockets; its outputs are the inner outputs that no inner link consumes
or that `external` lists, in inner-node order. A PrimitiveNode inside shows its `value` widget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixgraph.graph.prompt import WorkflowError
from mixgraph.graph.registry import widget_order
from mixgraph.graph.formats.ui_graph import (GROUP_NODE_PREFIXES, PRIMITIVE, SUBGRAPH_INPUT_ID, SUBGRAPH_OUTPUT_ID,
                                             SubgraphDef, SubgraphSlot, UiInput, UiNode, companions)

__all__ = ["legacy_group_subgraphs", "group_name"]


def group_name(node_type: str) -> str | None:
    """NAME of a `workflow>NAME` / `workflow/NAME` type, else None."""
    for prefix in GROUP_NODE_PREFIXES:
        if node_type.startswith(prefix):
            return node_type[len(prefix):]
    return None


@dataclass
class _Interface:
    """What one group definition shows on its instances."""

    widgets: list[tuple[int, str, int]] = field(default_factory=list)  # (inner index, input, companions)
    sockets: list[tuple[int, str]] = field(default_factory=list)  # (inner index, input name)
    outputs: list[tuple[int, int, Any]] = field(default_factory=list)  # (inner index, output slot, type)


def legacy_group_subgraphs(nodes: list[UiNode], extra: dict | None, registry: Any,
                           name: str) -> tuple[list[UiNode], list[SubgraphDef]]:
    """(`nodes` with each legacy group instance retyped, one subgraph definition per instance)."""
    instances = [n for n in nodes if group_name(n.type) is not None]
    if not instances:
        return nodes, []
    groups = (extra or {}).get("groupNodes") or {}
    if not isinstance(groups, dict):
        raise WorkflowError(f"{name}: extra.groupNodes must be an object of group node definitions")
    out_nodes, definitions = [], []
    for n in nodes:
        gname = group_name(n.type)
        if gname is None:
            out_nodes.append(n)
            continue
        data = groups.get(gname)
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise WorkflowError(f"{name}: node {n.id} is legacy group node {gname!r}, but the file's "
                                f"extra.groupNodes has no definition of that name "
                                f"(it has: {', '.join(map(repr, groups)) or 'none'})")
        where = f"{name}: group node {gname!r} (node {n.id})"
        sub = _instance_definition(n, data, registry, where)
        definitions.append(sub)
        out_nodes.append(n.model_copy(update={"type": sub.id, "inputs": _instance_inputs(n, sub)}))
    return out_nodes, definitions


def _instance_definition(instance: UiNode, data: dict, registry: Any, where: str) -> SubgraphDef:
    raw_nodes = data["nodes"]
    links = [tuple(entry) for entry in data.get("links") or [] if isinstance(entry, list) and len(entry) >= 4
             and entry[0] is not None]
    linked_to = {(int(t), int(ts)) for _, _, t, ts, *_ in links}
    external = {(int(e[0]), int(e[1])) for e in data.get("external") or [] if isinstance(e, list) and len(e) >= 3
                and e[2] is not None}
    inner = []
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise WorkflowError(f"{where}: inner node {i} has no type")
        fields = {k: v for k, v in raw.items() if k in ("type", "title", "mode", "inputs", "outputs",
                                                         "widgets_values", "properties")}
        fields["inputs"] = [dict(inp, link=None) for inp in fields.get("inputs") or [] if isinstance(inp, dict)]
        inner.append(UiNode.model_validate({**fields, "id": i, "pos": raw.get("pos")}))
    face = _interface(inner, links, linked_to, external, data.get("config") or {}, registry, where)
    inner = _with_widget_values(inner, face, instance.widgets_values, registry)

    # inner links, then the boundary: definition input k -> its inner socket, inner output -> output k
    table: list[list[Any]] = []
    inputs_of = {i: [inp.model_copy() for inp in n.inputs] for i, n in enumerate(inner)}

    def connect(origin: int, slot: int, target: int, input_name: str | None, tslot: int | None) -> int:
        lid = len(table) + 1
        if target != SUBGRAPH_OUTPUT_ID:
            ins = inputs_of[target]
            if tslot is None:
                tslot = next((k for k, inp in enumerate(ins) if inp.name == input_name), None)
                if tslot is None:  # a widget input with no socket saved: give it one
                    ins.append(UiInput(name=input_name, widget={"name": input_name}))
                    tslot = len(ins) - 1
            while len(ins) <= tslot:
                ins.append(UiInput(name=f"input_{len(ins)}"))
            ins[tslot] = ins[tslot].model_copy(update={"link": lid})
        table.append([lid, origin, slot, target, tslot, "*"])
        return lid

    for origin, slot, target, tslot, *_ in links:
        if 0 <= int(origin) < len(inner) and 0 <= int(target) < len(inner):
            connect(int(origin), int(slot), int(target), None, int(tslot))
    sub_inputs = [SubgraphSlot(name=f"{inner[i].type} {inp}", linkIds=[connect(SUBGRAPH_INPUT_ID, k, i, inp, None)])
                  for k, (i, inp) in enumerate(face.sockets)]
    sub_outputs = [SubgraphSlot(name=f"output_{k}", type=t, linkIds=[connect(i, slot, SUBGRAPH_OUTPUT_ID, None, k)])
                   for k, (i, slot, t) in enumerate(face.outputs)]
    inner = [n.model_copy(update={"inputs": inputs_of[i]}) for i, n in enumerate(inner)]
    return SubgraphDef(id=f"legacy-group-node:{instance.id}", name=group_name(instance.type) or "", nodes=inner,
                       links=table, inputs=sub_inputs, outputs=sub_outputs)


def _instance_inputs(instance: UiNode, sub: SubgraphDef) -> list[UiInput]:
    """The instance's socket inputs renamed to the definition's, positionally (the editor
    reconnects them by slot index); inputs past the interface are dropped."""
    return [inp.model_copy(update={"name": sub.inputs[k].name})
            for k, inp in enumerate(instance.inputs) if k < len(sub.inputs)]


def _interface(inner: list[UiNode], links: list[tuple], linked_to: set[tuple[int, int]],
               external: set[tuple[int, int]], config: dict, registry: Any, where: str) -> _Interface:
    face = _Interface()
    converted: list[tuple[int, str]] = []
    linked_from = {(int(o), int(s)) for o, s, *_ in links}
    for i, n in enumerate(inner):
        custom = config.get(str(i)) or config.get(i) or {}
        hidden_inputs = {k for k, v in (custom.get("input") or {}).items() if isinstance(v, dict)
                         and v.get("visible") is False}
        if n.type == PRIMITIVE:
            if any(o == i for o, _ in linked_from):
                face.widgets.append((i, "value", _primitive_companions(n)))
            continue
        spec = registry.get(n.type) if registry is not None else None
        if spec is None:
            if n.type in ("Reroute", "Note", "MarkdownNote"):
                continue
            raise WorkflowError(f"{where}: inner node {i} has type {n.type!r}, which is not a known node")
        slot_of = {inp.name: k for k, inp in enumerate(n.inputs)}
        for input_name, inp in widget_order(spec):
            k = slot_of.get(input_name)
            if inp.is_widget:
                saved = n.inputs[k] if k is not None else None
                if saved is not None and (saved.widget or {}).get("name") == input_name:
                    converted.append((i, input_name))
                else:
                    face.widgets.append((i, input_name, companions(input_name, inp)))
            elif (i, k) not in linked_to and input_name not in hidden_inputs:
                face.sockets.append((i, input_name))
        for slot, out in enumerate(spec.outputs):
            shown = (custom.get("output") or {}).get(str(slot), {}).get("visible")
            if shown is None:
                shown = (i, slot) not in linked_from or (i, slot) in external
            if shown:
                face.outputs.append((i, slot, getattr(out, "type", "*")))
    for i, input_name in converted:
        k = next(k for k, inp in enumerate(inner[i].inputs) if inp.name == input_name)
        if (i, k) not in linked_to:
            face.sockets.append((i, input_name))
    return face


def _primitive_companions(n: UiNode) -> int:
    """UI-only values after a PrimitiveNode's value: those its own save holds."""
    values = n.widgets_values
    return max(len(values) - 1, 0) if isinstance(values, list) else 0


def _with_widget_values(inner: list[UiNode], face: _Interface, values: Any, registry: Any) -> list[UiNode]:
    """Inner nodes with the instance's widget values copied onto them (positional over
    `face.widgets`, each widget followed by its companions)."""
    if not isinstance(values, list) or not values:
        return inner
    new_values = {i: list(n.widgets_values) if isinstance(n.widgets_values, list) else []
                  for i, n in enumerate(inner)}
    at = 0
    for i, input_name, extra in face.widgets:
        if at >= len(values):
            break
        if inner[i].type == PRIMITIVE:
            own = new_values[i]
            for j in range(1 + extra):
                if at + j < len(values):
                    (own.__setitem__(j, values[at + j]) if j < len(own) else own.append(values[at + j]))
        else:
            spec = registry.get(inner[i].type)
            position = _widget_position(spec, input_name)
            own = new_values[i]
            while len(own) <= position:
                own.append(None)
            own[position] = values[at]
        at += 1 + extra
    return [n.model_copy(update={"widgets_values": new_values[i]}) if isinstance(n.widgets_values, list)
            or new_values[i] else n for i, n in enumerate(inner)]


def _widget_position(spec: Any, input_name: str) -> int:
    """Where `input_name`'s value sits in the node's own `widgets_values`."""
    position = 0
    for name, inp in widget_order(spec):
        if not inp.is_widget:
            continue
        if name == input_name:
            return position
        position += 1 + companions(name, inp)
    raise KeyError(input_name)
