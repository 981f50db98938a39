"""The node library (declarations) and the model runtime they call (mixgraph.nodes.models and
mixgraph.nodes.sampling), with the edge payloads both use (mixgraph.nodes.payloads).

Importing `nodes` registers no node; `register_all()` (called by mixgraph.ui.api.load_node_library)
imports the declaration modules, so `nodes.models` stays usable from a notebook without the
executor. It does register the library's socket types and precision roles (`nodes.socket_types`:
plain data handed to `graph.spec` and `graph.roles`), first of all, because every declaration
reads them as it is decorated, however it is reached.
"""

from mixgraph.nodes import socket_types  # noqa: F401  (registers the library's socket types)


def register_all() -> None:
    import mixgraph.nodes.library  # noqa: F401  (its imports register every node)
