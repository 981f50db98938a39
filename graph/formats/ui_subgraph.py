"""Subgraphs of UI-format workflows, expanded the way ComfyUI's frontend expands them for a prompt.

A `Scope` is one graph level: the root graph, or one *instance* of a subgraph definition (an
instance node's `type` is the definition's `id`). Instances are expanded in place: each inner node
gets the execution id the frontend sends, the instance path joined with `:` (`"12:5"`; nested:
`"12:7:5"`), so several instances of one definition give disjoint node sets. `Scope.resolve`
follows a link to the real output that feeds it, across every boundary:

* an inner link from the definition's input node (id -10, slot k) continues at the instance's
  input k (bound by name and type, as the frontend rebinds them) in the parent scope; when that
  input is unconnected, a *promoted widget* value on the instance (its `widgets_values`, one value
  per promoted input in definition order) becomes a literal; otherwise the inner node keeps its
  own widget value;
* a link from an instance's output k continues inside, at the inner link that reaches the
  definition's output node (id -20, slot k);
* Reroutes, PrimitiveNodes, muted and bypassed nodes follow the flat graph's rules at every level.
  A muted instance contributes nothing; a bypassed one is wired through like any bypassed node
  (the frontend since 1.38 drops the contents of both).

Older files promote widgets with `properties.proxyWidgets` (values kept on the inner nodes, so the
inner `widgets_values` already hold them); they need nothing here. Legacy *group nodes*
(`extra.groupNodes`, types `workflow>NAME`) in the root graph arrive here as subgraphs
(`graph.formats.ui_group_nodes`); one inside a subgraph definition is refused, as the editor
unpacks those into the root graph (lossily).
"""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import ValidationError

from mixgraph.graph.prompt import Link, WorkflowError, pydantic_message
from mixgraph.graph.formats.ui_graph import (GROUP_NODE_PREFIXES, IGNORED, MODE_BYPASS, MODE_NEVER, PRIMITIVE,
                                             REROUTE, SubgraphDef, UiGroup, UiInput, UiLink, UiNode,
                                             bypass_input, companion_count, link_table)


class Literal:
    """A value that stands where a link was (a PrimitiveNode, a promoted widget)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def collect_definitions(definitions: dict | None, name: str,
                        into: dict[str, SubgraphDef] | None = None) -> dict[str, SubgraphDef]:
    """Every subgraph definition by id, including those nested in other definitions."""
    into = {} if into is None else into
    raw = (definitions or {}).get("subgraphs") or []
    if not isinstance(raw, list):
        raise WorkflowError(f"{name}: definitions.subgraphs must be a list")
    for i, entry in enumerate(raw):
        try:
            sub = SubgraphDef.model_validate(entry)
        except ValidationError as e:
            raise WorkflowError(f"{name}: subgraph definition {i} is not valid: "
                                f"{pydantic_message(e)}") from None
        if sub.id not in into:
            into[sub.id] = sub
            collect_definitions(sub.definitions, f"{name}: subgraph {sub.name or sub.id!r}", into)
    return into


class Scope:
    """One graph level and the path of instance ids that leads to it."""

    def __init__(self, nodes: list[UiNode], links: dict[int, UiLink], groups: list[UiGroup],
                 definitions: dict[str, SubgraphDef], registry: Any, name: str,
                 path: tuple[str, ...] = (), definition: SubgraphDef | None = None,
                 instance: UiNode | None = None, parent: "Scope | None" = None):
        self.nodes = {n.key: n for n in nodes}
        self.order = nodes
        self.links = links
        self.groups = groups
        self.definitions = definitions
        self.registry = registry
        self.name = name
        self.path = path
        self.definition = definition
        self.instance = instance
        self.parent = parent
        self._children: dict[str, Scope] = {}
        self._bound: list[UiInput | None] = []
        self._promoted: dict[int, Any] = {}
        if definition is not None and instance is not None:
            self._bound = bind_inputs(instance, definition)
            self._promoted = self._promoted_values()

    # --- structure -------------------------------------------------------------------------

    def exec_id(self, key: str) -> str:
        return ":".join((*self.path, key))

    def is_instance(self, n: UiNode) -> bool:
        return n.type in self.definitions

    def child(self, n: UiNode) -> "Scope":
        """The scope of instance node `n` of this scope."""
        got = self._children.get(n.key)
        if got is not None:
            return got
        sub = self.definitions[n.type]
        scope = self
        while scope is not None:
            if scope.definition is not None and scope.definition.id == sub.id:
                raise WorkflowError(f"{self.name}: subgraph {sub.name or sub.id!r} contains an "
                                    f"instance of itself (node {self.exec_id(n.key)})")
            scope = scope.parent
        where = f"{self.name}: subgraph {sub.name or sub.id!r} (node {self.exec_id(n.key)})"
        got = Scope(sub.nodes, link_table(sub.links, where), sub.groups, self.definitions,
                    self.registry, self.name, (*self.path, n.key), sub, n, self)
        self._children[n.key] = got
        return got

    def walk(self) -> Iterator[tuple["Scope", UiNode]]:
        """Every node that becomes a prompt node, instances expanded in place."""
        for n in self.order:
            if n.type.startswith(GROUP_NODE_PREFIXES):
                raise NotImplementedError(f"{self.name}: legacy group node {self.exec_id(n.key)} "
                                          f"({n.type!r}) inside a subgraph: not supported yet; "
                                          f"open the workflow in the ComfyUI editor and save it again")
            if n.mode in (MODE_NEVER, MODE_BYPASS) or n.type in IGNORED or n.type in (REROUTE, PRIMITIVE):
                continue
            if self.is_instance(n):
                yield from self.child(n).walk()
            else:
                yield self, n

    def expanded_instances(self) -> Iterator[tuple[UiNode, "Scope"]]:
        for n in self.order:
            if self.is_instance(n) and n.mode not in (MODE_NEVER, MODE_BYPASS):
                yield n, self.child(n)

    # --- links -----------------------------------------------------------------------------

    def resolve(self, link_id: int) -> Link | Literal | None:
        """Follow link `link_id` of this scope back to a real output (a `Link` with execution
        id), a literal, or nothing (None: dangling, muted, unconnected boundary)."""
        scope: Scope = self
        seen: set[tuple[int, int]] = set()
        lid: int | None = link_id
        while lid is not None:
            if (id(scope), lid) in seen:  # a loop of Reroutes must not hang
                return None
            seen.add((id(scope), lid))
            link = scope.links.get(lid)
            if link is None:
                return None
            if scope.definition is not None and link.origin == str(scope.definition.inputNode.id):
                scope, lid, value = scope._enter_parent(link.origin_slot)
                if value is not None:
                    return value
                continue
            n = scope.nodes.get(link.origin)
            if n is None or n.mode == MODE_NEVER or n.type in IGNORED:
                return None
            if n.type == PRIMITIVE:
                values = n.widgets_values
                return Literal(values[0]) if isinstance(values, list) and values else None
            if n.type == REROUTE:
                lid = n.inputs[0].link if n.inputs else None
            elif n.mode == MODE_BYPASS:
                index = bypass_input(n, link.origin_slot)
                lid = n.inputs[index].link if index is not None else None
            elif scope.is_instance(n):
                scope = scope.child(n)
                lid = scope._output_link(link.origin_slot)
            else:
                return Link(scope.exec_id(n.key), link.origin_slot)
        return None

    def _enter_parent(self, slot: int) -> tuple["Scope", int | None, Literal | None]:
        """Across the input boundary at definition input `slot`: (parent scope, its link id or
        None, a promoted widget literal or None)."""
        bound = self._bound[slot] if slot < len(self._bound) else None
        if bound is not None and bound.link is not None:
            return self.parent, bound.link, None
        if slot in self._promoted:
            return self.parent, None, Literal(self._promoted[slot])
        return self.parent, None, None

    def _output_link(self, slot: int) -> int | None:
        """The inner link that reaches the definition's output `slot`."""
        outputs = self.definition.outputs
        if slot < len(outputs) and outputs[slot].linkIds:
            return outputs[slot].linkIds[0]
        out_id = str(self.definition.outputNode.id)
        for lid, link in self.links.items():
            if link.target == out_id and link.target_slot == slot:
                return lid
        return None

    # --- promoted widgets ------------------------------------------------------------------

    def _promoted_values(self) -> dict[int, Any]:
        """definition input index -> the instance's value for that promoted widget."""
        values = self.instance.widgets_values
        if not isinstance(values, list) or not values:
            return {}
        promoted = [(k, extra) for k in range(len(self.definition.inputs))
                    if (extra := promoted_widget(self.definition, k, self.definitions,
                                                 self.registry)) is not None]
        # Older saves hold the control value ("randomize") after a seed; skip it then.
        with_companions = len(values) > len(promoted)
        out, i = {}, 0
        for k, extra in promoted:
            if i < len(values) and values[i] is not None:
                out[k] = values[i]
            i += 1 + (extra if with_companions else 0)
        return out


def bind_inputs(instance: UiNode, definition: SubgraphDef) -> list[UiInput | None]:
    """For each definition input, the instance input bound to it (name and type, then name)."""
    bound: list[UiInput | None] = [None] * len(definition.inputs)
    for inp in instance.inputs:
        free = [k for k, d in enumerate(definition.inputs) if bound[k] is None and d.name == inp.name]
        same_type = [k for k in free if definition.inputs[k].type == inp.type]
        if same_type or free:
            bound[(same_type or free)[0]] = inp
    return bound


def promoted_widget(definition: SubgraphDef, slot: int, definitions: dict[str, SubgraphDef],
                    registry: Any, _depth: int = 0) -> int | None:
    """If definition input `slot` reaches a widget inside (so the instance shows it as a promoted
    widget), the number of UI-only values that follow that widget; else None."""
    if slot >= len(definition.inputs) or _depth > len(definitions):
        return None
    for lid in definition.inputs[slot].linkIds:
        for n in definition.nodes:
            for inp in n.inputs:
                if inp.link != lid:
                    continue
                if n.type in definitions:
                    inner = definitions[n.type]
                    bound = bind_inputs(n, inner)
                    k = next((i for i, b in enumerate(bound) if b is inp), None)
                    got = None if k is None else promoted_widget(inner, k, definitions, registry,
                                                                 _depth + 1)
                    if got is not None:
                        return got
                elif inp.widget is not None:
                    spec = registry.get(n.type) if registry is not None else None
                    name = inp.widget.get("name", inp.name)
                    return companion_count(spec, name) if spec is not None else 0
    return None
