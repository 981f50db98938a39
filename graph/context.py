"""The run `Context` a node body receives when it declares a `ctx` parameter.

It is the node's only window on the run: its resolved precision, interrupt checks, progress,
warnings, and the paths of the environment. The executor creates one per node call.
"""

from __future__ import annotations

from typing import Any

import torch

from mixgraph.graph.env import Env
from mixgraph.graph.precision import NodePrecision, Policy, resolve
from mixgraph.graph.roles import ROLES

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

    `policy_for(socket_type, role=, pinned=, storage=, compute=)` is the policy to run a model of
    that socket type under: `graph.precision.resolve` over the engine's choice (region > per-type
    default > workflow default > auto, a preset decided by the socket type's precision role, or
    by `role`, one of the type's further registered roles: one text encoder of a set with a role
    of its own), the handle's pinned precision and a loader's pinned storage dtype; when
    `fallback_f32` is set (a NaN-guard re-run) it has f32 compute, whatever the handle says. Only
    the types the node declares (`NodeSpec.precision_types`, given as `precision_types`) may be
    asked for: they are what its cache key holds.
    `used_precision(policy)` records what the node actually ran under: it drives the NaN guard and
    the report's "precision".
    """

    __slots__ = ("node_id", "class_type", "env", "extra_data", "fallback_f32",
                 "_precision", "_run", "used", "precision_types")

    def __init__(self, node_id: str, class_type: str, env: Env, precision: NodePrecision,
                 run: Any, *, extra_data: dict | None = None, fallback_f32: bool = False,
                 precision_types: tuple[str, ...] = ()):
        self.node_id = node_id
        self.class_type = class_type
        self.env = env
        self.extra_data = extra_data if extra_data is not None else {}
        self.fallback_f32 = fallback_f32
        self._precision = precision
        self._run = run                  # the executor's per-run state (interrupt, events)
        self.used: list[Policy] = []   # policies reported through used_precision
        self.precision_types = precision_types

    @property
    def prompt(self) -> dict:
        """The prompt in ComfyUI's API format (what SaveImage embeds in PNG metadata)."""
        return self._run.api_prompt()

    @property
    def dynprompt(self) -> Any:
        """The run's `DynamicPrompt`: the prompt plus the nodes expansion added (what a node
        declaring the DYNPROMPT hidden input gets)."""
        return self._run.dynprompt

    def policy_for(self, socket_type: str, *, role: str | None = None, pinned: Any = None,
                   storage: torch.dtype | None = None,
                   compute: torch.dtype | None = None) -> Policy:
        if socket_type not in self.precision_types:
            raise LookupError(
                f"node {self.node_id} ({self.class_type}) asks for the {socket_type} precision but "
                f"declares only {', '.join(self.precision_types) or 'none'}; add {socket_type!r} "
                f"to precision_types in its @node(...) so its cache key includes it")
        if role is not None and role not in ROLES.roles_of(socket_type):
            raise LookupError(
                f"node {self.node_id} ({self.class_type}) asks for the {socket_type} precision in "
                f"role {role!r}, which is not a registered role of {socket_type} (registered: "
                f"{', '.join(ROLES.roles_of(socket_type)) or 'none'}); register it with "
                f"graph.roles.register_role({socket_type!r}, {role!r}) so cache keys include it")
        return resolve(self._precision.for_type(socket_type, role), pinned=pinned,
                       storage=storage, f32_compute=self.fallback_f32, warn=self.warn,
                       compute=compute)

    def for_types(self, precision_types: tuple[str, ...]) -> "Context":
        """This node's context for a call of another node's function inside its body (a ComfyUI
        custom node calling a core node): that node's precision types, the same run, the same
        record of used policies."""
        inner = Context(self.node_id, self.class_type, self.env, self._precision, self._run,
                        extra_data=self.extra_data, fallback_f32=self.fallback_f32,
                        precision_types=tuple(precision_types))
        inner.used = self.used
        return inner

    def used_precision(self, policy: Policy) -> None:
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
