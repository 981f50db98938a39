"""`get_executing_context()`: (prompt_id, node_id, list_index) of the running custom node."""

from __future__ import annotations

from typing import NamedTuple

import mixgraph.ui.comfy.comfy_runtime as _rt


class ExecutionContext(NamedTuple):
    prompt_id: str | None
    node_id: str
    list_index: int | None


def get_executing_context() -> ExecutionContext | None:
    now = _rt.running()
    if now is None:
        return None
    run = getattr(now.ctx, "_run", None)
    return ExecutionContext(getattr(run, "prompt_id", None), now.node_id, None)
