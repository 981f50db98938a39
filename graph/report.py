"""What a run returns or raises: `RunReport` (DESIGN §2's --report JSON), `NodeReport`, and the
run failures (`ExecutionFailed` and its kinds). `graph.executor` re-exports all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixgraph.graph.validate import Validation, format_problems

__all__ = ["RunReport", "NodeReport", "ExecutionFailed", "ValidationFailed", "NodeError",
           "NonFiniteOutput", "DependencyCycleError"]


class ExecutionFailed(Exception):
    """Base of run failures; `.report` holds the partial RunReport."""

    report: "RunReport | None" = None


class ValidationFailed(ExecutionFailed):
    def __init__(self, validation: Validation | None, message: str | None = None):
        self.validation = validation
        if message is None:
            message = format_problems(validation)
        super().__init__(message)


class NodeError(ExecutionFailed):
    """A node failed. The original exception is `__cause__`."""

    def __init__(self, node_id: str, class_type: str, cause: BaseException | str):
        self.node_id = node_id
        self.class_type = class_type
        text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"node {node_id} ({class_type}) failed: {text}")


class NonFiniteOutput(ArithmeticError):
    """A node's float outputs hold NaN or Inf even with f32 compute."""


class DependencyCycleError(RuntimeError):
    """Nodes added while running (expansion, lazy inputs) wait on each other: nothing can run."""


@dataclass(slots=True)
class NodeReport:
    class_type: str
    status: str                  # "executed" | "cached" | "blocked" (an ExecutionBlocker stopped
    #                              every call: the node did not run; DESIGN §2 + dynamic execution)
    seconds: float = 0.0
    precision: str | None = None
    nan_fallback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"class_type": self.class_type, "status": self.status,
                "seconds": round(self.seconds, 6), "precision": self.precision,
                "nan_fallback": self.nan_fallback}


@dataclass
class RunReport:
    """DESIGN §2's --report JSON (`to_json()`), plus the node outputs in memory (`values`).

    `values[id]` is the node's output tuple; for a list-valued node (one with list outputs, or
    called once per element of a list input) each output is a Python list of elements. Nodes
    added by expansion are reported under their (prefixed) ids too."""

    prompt_id: str
    seconds: float = 0.0
    status: str = "running"      # "success" | "error" | "interrupted"
    nodes: dict[str, NodeReport] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)   # files written, per node
    values: dict[str, tuple] = field(default_factory=dict)        # node id -> output tuple
    ui: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    lists: set[str] = field(default_factory=set)                  # ids whose values are lists

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_id": self.prompt_id, "seconds": round(self.seconds, 6), "status": self.status,
            "nodes": {k: v.to_json() for k, v in self.nodes.items()},
            "outputs": self.outputs, "warnings": self.warnings}
        if self.error is not None:
            out["error"] = self.error
        return out

    @property
    def executed(self) -> list[str]:
        return [k for k, v in self.nodes.items() if v.status == "executed"]

    @property
    def cached(self) -> list[str]:
        return [k for k, v in self.nodes.items() if v.status == "cached"]

    @property
    def files(self) -> list[str]:
        return [p for paths in self.outputs.values() for p in paths]

    def elements(self, node_id: str, slot: int = 0) -> list:
        """Output `slot` of a node as a list of elements (a one-element list for a node that
        was called once with no list input)."""
        v = self.values[node_id][slot]
        return list(v) if node_id in self.lists else [v]
