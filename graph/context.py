"""The run `Context` a node body receives when it declares a `ctx` parameter.

It is the node's only window on the run: its resolved precision, interrupt checks, progress,
warnings, and the paths of the environment. The executor creates one per node call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mixgraph.graph.precision import F32, resolve

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from mixgraph.graph.env import Env
    from mixgraph.graph.precision import NodePrecision, Policy

__all__ = ["Context", "Interrupted"]


class Interrupted(Exception):
    """The run was interrupted (POST /interrupt, Ctrl-C, or an API call)."""

    def __init__(self, message: str = "interrupted", node_id: str | None = None,
                 class_type: str | None = None):
        super().__init__(message)
        self.node_id = node_id
        self.class_type = class_type
        self.report: Any = None


class Context:
    """What a node body can ask of the run.

    `policy_for(socket_type, pinned=, storage=)` is the policy to run a model of that socket type
    under: `graph.precision.resolve` over the engine's choice (region > per-type default > workflow
    default > auto), the handle's pinned precision and a loader's pinned storage dtype; when
    `fallback_f32` is set (a NaN-guard re-run) it has f32 compute, whatever the handle says.
    `used_precision(policy)` records what the node actually ran under: it drives the NaN guard and
    the report's "precision".
    """

    __slots__ = ("node_id", "class_type", "env", "extra_data", "fallback_f32",
                 "_precision", "_run", "used", "asked")

    def __init__(self, node_id: str, class_type: str, env: "Env", precision: "NodePrecision | None",
                 run: Any, *, extra_data: dict | None = None, fallback_f32: bool = False):
        self.node_id = node_id
        self.class_type = class_type
        self.env = env
        self.extra_data = extra_data if extra_data is not None else {}
        self.fallback_f32 = fallback_f32
        self._precision = precision
        self._run = run                  # the executor's per-run state (interrupt, events)
        self.used: list["Policy"] = []   # policies reported through used_precision
        self.asked: set[str] = set()     # socket types asked through policy_for

    @property
    def prompt(self) -> dict:
        """The prompt in ComfyUI's API format (what SaveImage embeds in PNG metadata)."""
        return self._run.api_prompt()

    def policy_for(self, socket_type: str, *, pinned: Any = None,
                   storage: "torch.dtype | None" = None) -> "Policy":
        self.asked.add(socket_type)
        base = F32 if self._precision is None else self._precision.for_type(socket_type)
        return resolve(base, pinned=pinned, storage=storage, f32_compute=self.fallback_f32,
                       warn=self.warn)

    def used_precision(self, policy: "Policy") -> None:
        if policy not in self.used:
            self.used.append(policy)

    def check_interrupt(self) -> None:
        """Raise `Interrupted` if the run was asked to stop. Cheap: call it every step."""
        if self._run.interrupt.is_set():
            raise Interrupted(f"interrupted in node {self.node_id} ({self.class_type})",
                              self.node_id, self.class_type)

    def progress(self, value: int, total: int, preview: Any = None) -> None:
        """Report progress (value of total) and check for an interrupt."""
        self.check_interrupt()
        self._run.progress(self.node_id, value, total, preview)

    def warn(self, message: str) -> None:
        self._run.warn(message, self.node_id)
