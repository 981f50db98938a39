"""Which precision a node body computes a model in: the node library's side of the one resolver.

A node hands its model handle here; the handle's pins (its `precision`, set by a `Set*Precision`
node, UNETLoader's `weight_dtype`, a pinned storage dtype, and ModelComputeDtype's
`compute_dtype`, a pinned compute dtype) go to `Context.policy_for`, which
applies `graph.precision.resolve` over what the engine resolved for this node (innermost region >
per-type default > workflow default > auto). The rules themselves (pin beats region, pinned
storage replaces storage and turns int8 off, a NaN-guard re-run computes in f32) live only there;
the handle receives the finished policy.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.precision import Policy
from mixgraph.graph.roles import ROLES
from mixgraph.nodes.families.registry import FAMILIES


def effective(ctx: Any, handle: Any, socket: str, *, role: str | None = None) -> Policy:
    """The policy to run `handle` under in this node, reported to the engine via ctx. `role`:
    one of the socket type's further precision roles (nodes/socket_types.py), for one model of
    a handle that holds several (a text encoder of a set with a role of its own)."""
    if role is None:
        role = family_role(handle, socket)
    policy = ctx.policy_for(socket, role=role, pinned=getattr(handle, "precision", None),
                            storage=getattr(handle, "weight_dtype", None),
                            compute=getattr(handle, "compute_dtype", None))
    ctx.used_precision(policy)
    return policy


def family_role(handle: Any, socket: str) -> str | None:
    """The precision role a model handle's family names for its denoiser
    (`Family.precision_roles["diffusion"]`: the SD UNet's "sd_unet"), when the node library
    registered it as a further role of `socket`; else None (the socket type's own role)."""
    name = getattr(handle, "family", None)
    family = FAMILIES.get(name) if isinstance(name, str) else None
    role = getattr(family, "precision_roles", {}).get("diffusion") if family is not None else None
    if role is None or role == ROLES.role_of(socket) or role not in ROLES.roles_of(socket):
        return None
    return role


def encoder_policies(ctx: Any, clip: Any, socket: str = "CLIP") -> dict[str, Policy]:
    """The policy per precision role of a text-encoder set (``ClipHandle.encoders``) whose
    entries name roles of their own beside the socket type's (a T5-XXL's "text_large" beside
    CLIP-L's "text"): role -> policy, for ``ClipHandle.encode(..., policies=)``. Entries with the
    socket type's own role run under the node's CLIP policy and are not listed. A role the node
    library never registered for the socket type is refused by ``ctx.policy_for``, naming it."""
    own = ROLES.role_of(socket)
    roles = dict.fromkeys(e.role for e in getattr(clip, "encoders", ()) if e.role != own)
    return {role: effective(ctx, clip, socket, role=role) for role in roles}
