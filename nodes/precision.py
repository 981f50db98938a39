"""Which precision a node body computes a model in.

Resolution, most specific first (DESIGN §4): a precision set on the handle by a precision node >
what the engine resolved for this node (innermost region > per-type default > workflow default >
auto). On a NaN-guard re-run the engine asks for f32 compute, which beats the handle too.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.precision import Policy


def effective(ctx: Any, handle: Any, socket: str) -> Policy:
    """The policy to run `handle` under in this node, reported to the engine via ctx."""
    policy = getattr(handle, "precision", None) or ctx.policy_for(socket)
    pinned_storage = getattr(handle, "weight_dtype", None)  # UNETLoader's weight_dtype
    if pinned_storage is not None:
        policy = policy.with_storage(pinned_storage)
    if ctx.fallback_f32:
        policy = policy.as_f32_compute()
    ctx.used_precision(policy)
    return policy
