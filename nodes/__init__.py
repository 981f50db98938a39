"""The node library (declarations) and the model runtime they call (mixgraph.nodes.models and
mixgraph.nodes.sampling), with the edge payloads both use (mixgraph.nodes.payloads).

Importing `nodes` registers nothing; `register_all()` (called by mixgraph.ui.api.load_node_library)
imports the declaration modules, so `nodes.models` stays usable from a notebook without the engine.
"""


def register_all() -> None:
    import mixgraph.nodes.library  # noqa: F401  (its imports register every node)
