"""Typed execution events. `to_comfy()` gives ComfyUI's WebSocket `(type, data)` shape (§2.2).

The executor calls `on_event(event)` with these; the CLI turns them into a progress bar, the
server into WebSocket messages. Events that ComfyUI has no message for (NaN fallback, warnings)
use `mixgraph.*` types, which ComfyUI clients ignore.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Event", "ExecutionStart", "ExecutionCached", "Executing", "Progress", "Executed",
    "ExecutionSuccess", "ExecutionError", "ExecutionInterrupted", "NanFallback", "Warning",
    "now_ms",
]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Event:
    prompt_id: str

    def to_comfy(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__}.to_comfy: not supported yet")


@dataclass(frozen=True)
class ExecutionStart(Event):
    planned: tuple[str, ...] = ()       # node ids that will execute (the rest are cached)
    timestamp: int = field(default_factory=now_ms)

    def to_comfy(self):
        return "execution_start", {"prompt_id": self.prompt_id, "timestamp": self.timestamp}


@dataclass(frozen=True)
class ExecutionCached(Event):
    nodes: tuple[str, ...] = ()
    timestamp: int = field(default_factory=now_ms)

    def to_comfy(self):
        return "execution_cached", {"nodes": list(self.nodes), "prompt_id": self.prompt_id,
                                    "timestamp": self.timestamp}


@dataclass(frozen=True)
class Executing(Event):
    node: str | None = None             # None: the prompt is finished
    class_type: str | None = None
    display_node: str | None = None     # an expanded node's display node (None: `node`)

    def to_comfy(self):
        return "executing", {"node": self.node, "display_node": self.display_node or self.node,
                             "prompt_id": self.prompt_id}


@dataclass(frozen=True)
class Progress(Event):
    node: str = ""
    value: int = 0
    max: int = 0
    preview: Any = None                 # an optional preview image (the server encodes it)

    def to_comfy(self):
        return "progress", {"value": self.value, "max": self.max, "prompt_id": self.prompt_id,
                            "node": self.node}


@dataclass(frozen=True)
class Executed(Event):
    node: str = ""
    output: dict[str, Any] = field(default_factory=dict)
    display_node: str | None = None     # an expanded node's display node (None: `node`)

    def to_comfy(self):
        return "executed", {"node": self.node, "display_node": self.display_node or self.node,
                            "output": self.output, "prompt_id": self.prompt_id}


@dataclass(frozen=True)
class ExecutionSuccess(Event):
    timestamp: int = field(default_factory=now_ms)

    def to_comfy(self):
        return "execution_success", {"prompt_id": self.prompt_id, "timestamp": self.timestamp}


@dataclass(frozen=True)
class ExecutionError(Event):
    node_id: str = ""
    node_type: str = ""
    exception_message: str = ""
    exception_type: str = ""
    traceback: tuple[str, ...] = ()
    executed: tuple[str, ...] = ()
    current_inputs: dict[str, Any] = field(default_factory=dict)
    current_outputs: tuple[str, ...] = ()
    timestamp: int = field(default_factory=now_ms)

    def to_comfy(self):
        return "execution_error", {
            "prompt_id": self.prompt_id, "node_id": self.node_id, "node_type": self.node_type,
            "executed": list(self.executed), "exception_message": self.exception_message,
            "exception_type": self.exception_type, "traceback": list(self.traceback),
            "current_inputs": self.current_inputs, "current_outputs": list(self.current_outputs),
            "timestamp": self.timestamp}


@dataclass(frozen=True)
class ExecutionInterrupted(Event):
    node_id: str | None = None
    node_type: str | None = None
    executed: tuple[str, ...] = ()
    timestamp: int = field(default_factory=now_ms)

    def to_comfy(self):
        return "execution_interrupted", {
            "prompt_id": self.prompt_id, "node_id": self.node_id, "node_type": self.node_type,
            "executed": list(self.executed), "timestamp": self.timestamp}


@dataclass(frozen=True)
class NanFallback(Event):
    """A node under half precision returned non-finite values; it is re-run with f32 compute."""

    node_id: str = ""
    node_type: str = ""
    precision: str = ""                 # the half-precision policy it ran under
    fallback: str = ""                  # the policy of the re-run
    message: str = ""

    def to_comfy(self):
        return "mixgraph.nan_fallback", {
            "prompt_id": self.prompt_id, "node_id": self.node_id, "node_type": self.node_type,
            "precision": self.precision, "fallback": self.fallback, "message": self.message}


@dataclass(frozen=True)
class Warning(Event):  # noqa: A001 - the event's name in the protocol
    message: str = ""
    node_id: str | None = None

    def to_comfy(self):
        return "mixgraph.warning", {"prompt_id": self.prompt_id, "node_id": self.node_id,
                                    "message": self.message}
