"""`GraphBuilder` (build the API-format subgraph a node expands into), `is_link`, and
`ExecutionBlocker` (a value that blocks the nodes consuming it). The blocker is the engine's
class when the engine has one (`mixgraph.graph.blocker`); until then this module's own, which the
adapter passes through unchanged."""

from __future__ import annotations

from typing import Any

try:
    from mixgraph.graph.blocker import ExecutionBlocker  # noqa: F401 - the engine's, once merged
except ImportError:
    class ExecutionBlocker:  # type: ignore[no-redef]
        """Returned in place of an output: the nodes that consume it do not run; a message
        (if any) is reported as the error of the consuming output node."""

        def __init__(self, message: str | None):
            self.message = message


def is_link(obj: Any) -> bool:
    """`[node_id, output_index]`: a list of a string and an int."""
    return isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], str) \
        and isinstance(obj[1], int) and not isinstance(obj[1], bool)


class GraphBuilder:
    """Nodes added with `node(class_type, id=None, **inputs)`; `finalize()` is the API prompt.
    Ids are `prefix + id`, the prefix unique per builder (ComfyUI's `alloc_prefix`). While a pack
    node runs, the default prefix is `G.` (G: the builder's index within the call, from 0); the
    engine makes it `PARENT.CALL.G.N`, unique and the same in every run, nested loops included."""

    _default_prefix_root = ""
    _default_prefix_call_index = 0
    _default_prefix_graph_index = 0

    def __init__(self, prefix: str | None = None):
        self.prefix = prefix if prefix is not None else GraphBuilder.alloc_prefix()
        self.nodes: dict[str, Node] = {}
        self.id_gen = 1

    @classmethod
    def set_default_prefix(cls, prefix_root: str, call_index: int, graph_index: int = 0) -> None:
        cls._default_prefix_root = prefix_root
        cls._default_prefix_call_index = call_index
        cls._default_prefix_graph_index = graph_index

    @classmethod
    def alloc_prefix(cls, root: str | None = None, call_index: int | None = None,
                     graph_index: int | None = None) -> str:
        root = cls._default_prefix_root if root is None else root
        call_index = cls._default_prefix_call_index if call_index is None else call_index
        if graph_index is None:
            graph_index = cls._default_prefix_graph_index
            cls._default_prefix_graph_index += 1
        if root == "":
            # inside a running node the adapter sets root "": mixgraph's engine prefixes the
            # expanded ids with `PARENT.CALL.` itself, so the builder adds only its own index
            # (ComfyUI's root is the node id; repeating it here would double every loop level)
            return f"{graph_index}."
        return f"{root}.{call_index}.{graph_index}."

    def node(self, class_type: str, id: str | None = None, **kwargs: Any) -> "Node":
        if id is None:
            id = str(self.id_gen)
            self.id_gen += 1
        id = self.prefix + id
        if id in self.nodes:
            return self.nodes[id]
        node = Node(id, class_type, kwargs)
        self.nodes[id] = node
        return node

    def lookup_node(self, id: str) -> "Node | None":
        return self.nodes.get(self.prefix + id)

    def finalize(self) -> dict[str, dict]:
        return {nid: node.serialize() for nid, node in self.nodes.items()}

    def replace_node_output(self, node_id: str, index: int, new_value: Any) -> None:
        node_id = self.prefix + node_id
        for node in self.nodes.values():
            for key, value in node.inputs.items():
                if is_link(value) and value[0] == node_id and value[1] == index:
                    node.inputs[key] = new_value.out(0) if isinstance(new_value, Node) else new_value

    def remove_node(self, id: str) -> None:
        self.nodes.pop(self.prefix + id, None)


class Node:
    def __init__(self, id: str, class_type: str, inputs: dict[str, Any]):
        self.id = id
        self.class_type = class_type
        self.inputs = dict(inputs)
        self.override_display_id: str | None = None

    def out(self, index: int) -> list:
        return [self.id, index]

    def set_input(self, key: str, value: Any) -> None:
        if value is None:
            self.inputs.pop(key, None)
        else:
            self.inputs[key] = value

    def get_input(self, key: str) -> Any:
        return self.inputs.get(key)

    def set_override_display_id(self, override_display_id: str) -> None:
        self.override_display_id = override_display_id

    def serialize(self) -> dict:
        out: dict[str, Any] = {"class_type": self.class_type,
                               "inputs": {k: v.out(0) if isinstance(v, Node) else v
                                          for k, v in self.inputs.items()}}
        if self.override_display_id is not None:
            out["override_display_id"] = self.override_display_id
        return out


def add_graph_prefix(graph: dict, outputs: list, prefix: str) -> tuple[dict, list]:
    """The graph with every node id (and link) prefixed, and the outputs re-pointed."""
    new = {}
    for nid, node in graph.items():
        inputs = {k: [prefix + v[0], v[1]] if is_link(v) else v
                  for k, v in node.get("inputs", {}).items()}
        new[prefix + nid] = {**node, "inputs": inputs}
    return new, [[prefix + o[0], o[1]] if is_link(o) else o for o in outputs]
