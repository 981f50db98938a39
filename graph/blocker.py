"""`ExecutionBlocker`: an output value that stops whatever consumes it (ComfyUI's semantics).

A node may return an `ExecutionBlocker` as any of its output values (or as its whole return,
which blocks every output). A node that receives one on any input does not run: its outputs
are blockers too, and an output node shows nothing. A blocker with a message makes the first
node it stops report an `execution_error` event ("Execution Blocked: MESSAGE", exception type
`ExecutionBlocked`) and then travels on silently; without a message nothing is reported. The
prompt itself goes on and can still succeed, as in ComfyUI. With list mapping the check is per
call: one blocked element blocks only its own call.
"""

from __future__ import annotations

__all__ = ["ExecutionBlocker", "is_blocker"]


class ExecutionBlocker:
    """Stops the nodes that consume it. `message`: reported once, by the first blocked node."""

    __slots__ = ("message",)

    def __init__(self, message: str | None = None):
        self.message = message

    def __repr__(self) -> str:
        return f"ExecutionBlocker({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is ExecutionBlocker and other.message == self.message

    def __hash__(self) -> int:
        return hash((ExecutionBlocker, self.message))

    def __mixgraph_nbytes__(self) -> int:
        return 0


def is_blocker(value: object) -> bool:
    return isinstance(value, ExecutionBlocker)
