"""The node library (declarations) and the model runtime they call (nodes.models, nodes.sampling).

Importing `nodes` registers nothing; `register_all()` (called by graph.api.load_node_library)
imports the declaration modules, so `nodes.models` stays usable from a notebook without the engine.
"""


def register_all() -> None:
    import nodes.library  # noqa: F401  (its imports register every node)
