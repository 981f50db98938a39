"""`DynamicPrompt`: the prompt as it grows by node expansion (the DYNPROMPT hidden input).

A node that declares `Hidden("DYNPROMPT")` gets the run's instance. It offers ComfyUI's
`DynamicPrompt` methods: `get_node(id)` (the API-format dict of an original or expanded node),
`has_node(id)`, `get_original_prompt()`, `all_node_ids()`, plus `get_real_node_id(id)` (the
original node an expanded one descends from), `get_parent_node_id(id)` and
`get_display_node_id(id)`. The original prompt's API form is made only when first asked for, so
runs whose nodes never look at it pay nothing.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["DynamicPrompt", "NodeNotFoundError"]


class NodeNotFoundError(KeyError):
    """`get_node` of an id that is neither in the prompt nor expanded."""


class DynamicPrompt:
    """The current prompt: the original nodes plus the expanded ("ephemeral") ones."""

    def __init__(self, original: Callable[[], dict] | dict, original_ids: Any = None):
        self._original_fn = original if callable(original) else None
        self._original = None if callable(original) else original
        self._original_ids = original_ids
        self.ephemeral: dict[str, dict] = {}
        self.parents: dict[str, str] = {}
        self.display: dict[str, str] = {}
        # graph.loops: `{start id: {"_loop_body": [...], "_loop_end": id}}`, merged by get_node;
        # node_overrides: inputs replaced while running (ComfyUI's override_node)
        self.loop_marks: dict[str, dict] = {}
        self.node_overrides: dict[str, dict] = {}

    def get_original_prompt(self) -> dict:
        if self._original is None:
            self._original = self._original_fn()
        return self._original

    def _is_original(self, node_id: str) -> bool:
        ids = self._original_ids
        return node_id in (ids if ids is not None else self.get_original_prompt())

    def has_node(self, node_id: str) -> bool:
        return node_id in self.ephemeral or self._is_original(node_id)

    def get_node(self, node_id: str) -> dict:
        node = self.node_overrides.get(node_id)
        if node is not None:
            return node
        node = self.ephemeral.get(node_id)
        if node is None:
            node = self.get_original_prompt().get(node_id)
        if node is None:
            raise NodeNotFoundError(f"node {node_id} is not in the prompt")
        marks = self.loop_marks.get(node_id) if self.loop_marks else None
        return {**node, **marks} if marks else node

    def override_node(self, node_id: str, node: dict) -> None:
        if not self.has_node(node_id):
            raise NodeNotFoundError(f"node {node_id} is not in the prompt")
        self.node_overrides[node_id] = node

    def all_node_ids(self) -> set[str]:
        return set(self.get_original_prompt()) | set(self.ephemeral)

    def add_ephemeral_node(self, node_id: str, node: dict, parent_id: str, display_id: str) -> None:
        self.ephemeral[node_id] = node
        self.parents[node_id] = parent_id
        self.display[node_id] = display_id

    def get_parent_node_id(self, node_id: str) -> str | None:
        return self.parents.get(node_id)

    def get_real_node_id(self, node_id: str) -> str:
        """The original node an expanded node descends from (itself for an original node)."""
        while node_id in self.parents:
            node_id = self.parents[node_id]
        return node_id

    def get_display_node_id(self, node_id: str) -> str:
        """The node a client shows as running: an expanded node's `override_display_id`, else
        its parent's display node, down to an original node."""
        seen = 0
        while True:
            shown = self.display.get(node_id)
            if shown is None or shown == node_id or seen > len(self.display):
                return node_id
            node_id = shown
            seen += 1
