"""Node expansion: turning the graph a node returns into nodes of the running prompt.

A body returns `Result(values, expand=GRAPH)`; GRAPH is an API-format prompt such as ComfyUI's
`GraphBuilder.finalize()` makes. `expansion(...)` gives the new nodes unique ids by prefixing
each with `PARENT.CALL.` (the parent's id and the index of the mapped call that returned it, so
a loop that re-expands itself gets `5.0.next`, `5.0.next.0.next`, ...), rewrites the links
between them, and leaves links to nodes already in the prompt as they are. `values` entries that
are links `[id, slot]` become `Link`s to the renamed nodes: the parent's outputs are those
nodes' outputs once they ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mixgraph.graph.prompt import Link, NodeCall

__all__ = ["Expansion", "expansion", "is_link"]


def is_link(v: Any) -> bool:
    """ComfyUI's `is_link`: a 2-list (or tuple) of a node id (str or int) and an int slot."""
    return (isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], (str, int))
            and not isinstance(v[0], bool) and type(v[1]) is int)


@dataclass
class Expansion:
    """`calls`: the new nodes (engine form, renamed); `raw`: the same in API form (what
    DYNPROMPT shows); `display`: each new node's display node; `values`: the parent's output
    values of this call, links renamed to `Link`s."""

    calls: dict[str, NodeCall]
    raw: dict[str, dict]
    display: dict[str, str]
    values: tuple


def expansion(graph: Any, values: tuple, parent: str, call_index: int) -> Expansion:
    """Rename and convert one returned graph. Raises ValueError naming what is malformed."""
    if not isinstance(graph, dict):
        raise ValueError(f"expand must be an API-format prompt dict, not {type(graph).__name__}")
    prefix = f"{parent}.{call_index}."
    local = {str(k) for k in graph}
    rename = {k: prefix + k for k in local}

    def convert(v: Any) -> Any:
        if is_link(v):
            src = str(v[0])
            return Link(rename.get(src, src), v[1])
        if isinstance(v, dict) and "__value__" in v and len(v) == 1:
            return v["__value__"]
        return v

    def raw_value(v: Any) -> Any:
        if is_link(v):
            src = str(v[0])
            return [rename.get(src, src), v[1]]
        return v

    calls: dict[str, NodeCall] = {}
    raw: dict[str, dict] = {}
    display: dict[str, str] = {}
    for key, node in graph.items():
        nid = rename[str(key)]
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            raise ValueError(f"expanded node {key!r} needs a class_type")
        inputs = node.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise ValueError(f"expanded node {key!r}: inputs must be a dict")
        calls[nid] = NodeCall(node["class_type"], {str(k): convert(v) for k, v in inputs.items()})
        entry: dict[str, Any] = {"class_type": node["class_type"],
                                 "inputs": {str(k): raw_value(v) for k, v in inputs.items()}}
        shown = node.get("override_display_id")
        if shown is not None:
            entry["override_display_id"] = str(shown)
        raw[nid] = entry
        display[nid] = str(shown) if shown is not None else parent
    out = tuple(convert(v) if is_link(v) else v for v in values)
    return Expansion(calls, raw, display, out)
