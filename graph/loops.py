"""Loop boundaries: pairing start/end nodes, marking the body between them, and the run-time
control a loop's start node needs (ComfyUI's hidden `execution_list`).

A node declared with `loop_boundary="start"` or `"end"` (ComfyUI's schema flag of that name)
opens or closes a loop. `loop_bodies(...)` pairs each end node with the nearest start node
upstream of it (an inner loop's start is downstream of the outer loop's start, so ends are
matched innermost first) and gives the body: the nodes downstream of the start and upstream of
the end, both boundaries left out. The scheduler marks the prompt with it (DYNPROMPT's
`get_node(start)` then holds ComfyUI's `_loop_body` and `_loop_end` keys), for the original
prompt when the run starts and for each expanded graph as it is added, so loops nested in a
loop body are marked again in every unrolled copy.

`ExecutionList` is what a node declaring `Hidden("EXECUTION_LIST")` gets: ComfyUI's
`add_node`, `add_external_block`, `release_external_block`, `get_external_block_result` and
`inhibit_nodes`, plus `override_inputs` (ComfyUI does this through
`DynamicPrompt.override_node`). The engine knows nothing of what a loop computes; the loop
nodes build their unrolled graph with node expansion (`Result(expand=...)`).

Reference: ComfyUI `comfy_execution/graph.py` (0b45812: `TopologicalSort.add_external_block`,
`ExecutionList.inhibit_nodes`, `DynamicPrompt.override_node`) and `comfy_extras/nodes_loop.py`
(023f153), which reads `_loop_body` / `_loop_end`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["ExecutionList", "loop_bodies"]


def loop_bodies(ids: Iterable[str], ups: Callable[[str], list[str]],
                boundary: Callable[[str], str | None]) -> dict[str, tuple[list[str], str]]:
    """`{start: (body, end)}` for the loops among `ids`. `ups(n)`: the nodes `n` links to
    (within `ids` or not); `boundary(n)`: "start", "end" or None. A start with no end downstream
    (or an end with no start upstream) is left unmarked; its node reports it when it runs."""
    ids = list(ids)
    starts = [n for n in ids if boundary(n) == "start"]
    ends = [n for n in ids if boundary(n) == "end"]
    if not starts or not ends:
        return {}
    memo: dict[str, frozenset] = {}

    def ancestors(n: str) -> frozenset:
        got = memo.get(n)
        if got is not None:
            return got
        seen: set[str] = set()
        stack = list(ups(n))
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            stack.extend(ups(u))
        memo[n] = frozenset(seen)
        return memo[n]

    out: dict[str, tuple[list[str], str]] = {}
    order = {n: i for i, n in enumerate(ids)}
    for end in sorted(ends, key=lambda e: (len(ancestors(e)), order[e])):   # innermost first
        above = ancestors(end)
        cands = [s for s in starts if s in above and s not in out]
        if not cands:
            continue
        start = max(cands, key=lambda s: (len(ancestors(s)), order[s]))   # the nearest one
        body = [n for n in ids if n in above and n != start and start in ancestors(n)]
        out[start] = (body, end)
    return out


class ExecutionList:
    """A running loop's handle on the scheduler (ComfyUI's `ExecutionList` subset)."""

    def __init__(self, sched: Any):
        self._s = sched
        self._blocks: dict[str, int] = {}
        self._results: dict[str, Any] = {}

    def add_node(self, node_id: str) -> None:
        """Make `node_id` (and what it needs) part of the run if it is not yet."""
        self._s.schedule([node_id], None)

    def add_external_block(self, node_id: str) -> Callable[..., None]:
        """`node_id` does not run until `release_external_block(node_id)`."""
        self._blocks[node_id] = self._blocks.get(node_id, 0) + 1
        self._s.hold(node_id)
        return lambda value=None: self.release_external_block(node_id, value)

    def release_external_block(self, node_id: str, value: Any = None) -> None:
        n = self._blocks.get(node_id, 0)
        if n <= 0:
            raise RuntimeError(f"node {node_id} has no external block to release")
        self._blocks[node_id] = n - 1
        if value is not None:
            self._results[node_id] = value
        self._s.release(node_id)

    def get_external_block_result(self, node_id: str) -> Any:
        return self._results.get(node_id)

    def inhibit_nodes(self, node_ids: Iterable[str]) -> None:
        """The pending nodes among `node_ids` never run in this prompt (a loop's original body,
        replaced by its unrolled copies)."""
        self._s.inhibit(set(node_ids))

    def override_inputs(self, node_id: str, inputs: dict) -> None:
        """Replace a pending node's inputs (API form: literals and `[id, slot]` links)."""
        self._s.override(node_id, inputs)
