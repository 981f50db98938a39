"""ComfyUI's `progress_state` WebSocket message: every started node's state in one message.

Newer ComfyUI (comfy_execution/progress.py, `WebUIProgressHandler`) keeps a per-prompt registry
of node states (`running` with value / max, then `finished`) and sends all non-pending ones to the
prompt's client whenever a node starts, reports progress or finishes:
`{"prompt_id", "nodes": {id: {"value", "max", "state", "node_id", "prompt_id",
"display_node_id", "parent_node_id", "real_node_id"}}}`. Today's editor takes the nodes in state
`running` as the executing ones (its node outlines and progress bars), so a node must be marked
`finished` when it is done.

mixgraph's engine has no "node finished" event; this tracker reads the ones it has: `executing`
starts a node (and finishes the ones still running: the scheduler runs one node at a time, so a
node another has followed is done; an async node left pending shows finished early), `progress`
updates it, `executed` finishes it, and the prompt's success finishes what is left. ComfyUI never
marks a node `error`; neither does this. The order is ComfyUI's: the state before `executing` and
`progress`, after `executed`.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph import events as ev

__all__ = ["ProgressStates"]

RUNNING, FINISHED = "running", "finished"


class ProgressStates:
    """One prompt's node states; `before(event)` / `after(event)` give the `progress_state`
    messages (`(type, data)` pairs) to send around the event's own message."""

    def __init__(self, prompt_id: str):
        self.prompt_id = prompt_id
        self._nodes: dict[str, dict[str, Any]] = {}

    def before(self, event: ev.Event) -> list[tuple[str, dict]]:
        if isinstance(event, ev.Executing) and event.node is not None:
            self._finish_running(except_=event.node)
            self._set(event.node, RUNNING, 0.0, 1.0, event.display_node)
            return self._message()
        if isinstance(event, ev.Progress) and event.node:
            self._set(event.node, RUNNING, float(event.value), float(event.max), None)
            return self._message()
        if isinstance(event, ev.ExecutionSuccess):
            return self._message() if self._finish_running() else []
        return []

    def after(self, event: ev.Event) -> list[tuple[str, dict]]:
        if isinstance(event, ev.Executed) and event.node:
            entry = self._nodes.get(event.node)
            if entry is None:     # a cached output node's `executed`: ComfyUI finishes it too
                self._set(event.node, FINISHED, 1.0, 1.0, event.display_node)
            elif entry["state"] != FINISHED:
                entry["state"], entry["value"] = FINISHED, entry["max"]
            else:
                return []
            return self._message()
        return []

    # --- the registry ---------------------------------------------------------------------------

    def _set(self, node: str, state: str, value: float, max_: float, display: str | None) -> None:
        entry = self._nodes.get(node)
        if entry is None:
            shown = display or node
            entry = self._nodes[node] = {
                "node_id": node, "prompt_id": self.prompt_id, "display_node_id": shown,
                "parent_node_id": shown if shown != node else None, "real_node_id": shown}
        entry.update(state=state, value=value, max=max_)

    def _finish_running(self, except_: str | None = None) -> bool:
        changed = False
        for node, entry in self._nodes.items():
            if entry["state"] == RUNNING and node != except_:
                entry["state"], entry["value"] = FINISHED, entry["max"]
                changed = True
        return changed

    def _message(self) -> list[tuple[str, dict]]:
        nodes = {node: {"value": e["value"], "max": e["max"], "state": e["state"], "node_id": node,
                        "prompt_id": self.prompt_id, "display_node_id": e["display_node_id"],
                        "parent_node_id": e["parent_node_id"], "real_node_id": e["real_node_id"]}
                 for node, e in self._nodes.items()}
        return [("progress_state", {"prompt_id": self.prompt_id, "nodes": nodes})]
