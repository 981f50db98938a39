"""The node library and the model runtime it calls, one folder per concept.

Declarations: `declare/` (one subfolder per concept; `library.py` lists every module) and the
plain functions they call, `helpers/`. Runtime (plain PyTorch, no import of graph/ or ui/):
`families/` (the family seam and one folder per model family), `encoders/`, `vae/`, `adapters/`,
`weights/`, `image_models/`, `models/` (handles, the loader, shared layers), `sampling/`, and the
edge payloads both sides use, `payloads/`.

Importing `nodes` registers no node; `register_all()` (called by mixgraph.ui.api.load_node_library)
imports the declaration modules, so `nodes.models` stays usable from a notebook without the
executor. It does register the library's socket types and precision roles (`nodes.socket_types`:
plain data handed to `graph.spec` and `graph.roles`), first of all, because every declaration
reads them as it is decorated, however it is reached.
"""

from mixgraph.nodes import socket_types  # noqa: F401  (registers the library's socket types)


def register_all() -> None:
    import mixgraph.nodes.library  # noqa: F401  (its imports register every node)
