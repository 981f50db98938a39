"""Precision roles: how the presets treat each kind of model, as data a node library registers.

A preset (`quality`, `balanced` = `auto`, `memory`, `fast`; `graph.precision`) gives each model
socket type its own SPEC on a device, because the models of one pipeline want different things:
a denoiser runs every step and gains from native half precision, an image decoder shows its
rounding as banding, a text encoder runs once per prompt. The engine does not know which socket
type is which kind of model. A node library says so, in two registrations:

    register_preset_role("decoder", RolePresets(fast=("native_f16", "native_bf16", "f32")))
    register_role("DECODER_MODEL", "decoder")

`register_preset_role` declares a role and what each preset gives it (`RolePresets`: per preset,
candidates in order of preference); `register_role` gives a socket type its role. The first role
registered for a socket type is its own; further ones are roles a node may ask for by name, for
one model among several that travel on one socket (`ctx.policy_for(TYPE, role=...)`: one text
encoder of a set, a large one with a role of its own). Every registered role of a socket type is
part of the cache key of the nodes that declare it, so a node is re-run when any of them changes.

A socket type with no role (or no library loaded at all) gets `DEFAULT_PRESETS`, the careful
choice: f32 unless the device is an accelerator with native half precision, 16-bit storage under
`memory`, f16/bf16 where native under `fast`. `primary=True` names the socket type whose policy
stands for a whole preset where one must (a preset SPEC parsed with no socket type named).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DEVICE_CHOICES", "RolePresets", "DEFAULT_PRESETS", "PrecisionRoles", "ROLES",
           "register_role", "register_preset_role", "unregister_role"]

#: The device-dependent candidates a role's preset may name, beside plain SPECs (which any
#: device runs). `graph.precision.preset_spec` evaluates them on a device's capabilities.
DEVICE_CHOICES = {
    "native_half": "the device's native half-precision compute: bf16 where native, f16+upcast "
                   "on CUDA without bf16; nothing where neither is native",
    "accelerator_half": "native_half, on an accelerator (CUDA, MPS) only",
    "native_f16": "f16 where f16 arithmetic is native",
    "native_bf16": "bf16 where bf16 arithmetic is native",
    "cpu_int8": "int8 on a CPU whose row of graph.precision.CPU_INT8_TABLE lists the preset "
                "(int8 measured faster than the alternative there); nothing elsewhere",
}

@dataclass(frozen=True)
class RolePresets:
    """What each preset gives one role: candidates in order of preference, the first the device
    can run wins. A candidate is a `DEVICE_CHOICES` name or a plain SPEC (`f32`, `bf16:f32`),
    which every device runs; when none applies the role gets f32. The defaults are
    `DEFAULT_PRESETS`, the careful choice (see the module docstring)."""

    quality: tuple[str, ...] = ("f32",)
    balanced: tuple[str, ...] = ("accelerator_half", "f32")
    memory: tuple[str, ...] = ("bf16:f32",)
    fast: tuple[str, ...] = ("native_f16", "native_bf16", "f32")

    def __post_init__(self) -> None:
        presets = {f.name for f in fields(self)} | {"auto"}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) or not value \
                    or not all(isinstance(c, str) and c.strip() for c in value):
                raise TypeError(f"RolePresets.{f.name}: a non-empty tuple of candidates "
                                f"({', '.join(DEVICE_CHOICES)} or a SPEC), not {value!r}")
            named = [c for c in value if c.strip().lower() in presets]
            if named:
                raise ValueError(f"RolePresets.{f.name}: {named[0]!r} is a preset; a role's "
                                 f"candidates are SPECs or {', '.join(DEVICE_CHOICES)}")

    def candidates(self, preset: str) -> tuple[str, ...]:
        return getattr(self, preset)


DEFAULT_PRESETS = RolePresets()


class PrecisionRoles:
    """The registry behind `register_role` / `register_preset_role` (module docstring). Socket
    type names are matched upper-cased, as `--precision TYPE=SPEC` spells them."""

    def __init__(self) -> None:
        self._presets: dict[str, RolePresets] = {}
        self._roles: dict[str, tuple[str, ...]] = {}   # socket type -> (its role, asked-for roles)
        self.primary: str | None = None

    def register_preset_role(self, role: str, presets: RolePresets = DEFAULT_PRESETS) -> RolePresets:
        """Declare `role` and how each preset treats it; the same declaration twice is a no-op."""
        if not isinstance(role, str) or not role:
            raise TypeError(f"a precision role is a non-empty string, not {role!r}")
        if not isinstance(presets, RolePresets):
            raise TypeError(f"precision role {role!r}: presets must be a RolePresets, not {presets!r}")
        old = self._presets.get(role)
        if old is not None and old != presets:
            raise ValueError(f"precision role {role!r} is registered already as {old}; "
                             f"cannot register it again as {presets}")
        self._presets[role] = presets
        return presets

    def register_role(self, socket: str, role: str, *, primary: bool = False) -> None:
        """Give `socket` the role `role` (declared first with `register_preset_role`). The first
        role of a socket type is its own; a later one is a role a node may ask for by name."""
        if role not in self._presets:
            raise LookupError(f"precision role {role!r} for socket type {socket!r} is not declared; "
                              f"declare it first: register_preset_role({role!r}, RolePresets(...))")
        key = socket.upper()
        if primary and self.primary not in (None, key):
            raise ValueError(f"socket type {socket!r} cannot be the primary one: "
                             f"{self.primary!r} is registered already as primary")
        roles = self._roles.get(key, ())
        if role not in roles:
            self._roles[key] = (*roles, role)
        if primary:
            self.primary = key

    def unregister_role(self, socket: str) -> None:
        """Forget a socket type's roles (tests that register toy ones)."""
        key = socket.upper()
        self._roles.pop(key, None)
        if self.primary == key:
            self.primary = None

    def role_of(self, socket: str | None) -> str | None:
        """The role of a socket type (None: it has none; so has `None`)."""
        roles = self._roles.get(socket.upper()) if socket else None
        return roles[0] if roles else None

    def roles_of(self, socket: str) -> tuple[str, ...]:
        """Every role registered for a socket type, its own first."""
        return self._roles.get(socket.upper(), ())

    def presets(self, role: str | None) -> RolePresets:
        """How the presets treat `role` (None: `DEFAULT_PRESETS`)."""
        if role is None:
            return DEFAULT_PRESETS
        try:
            return self._presets[role]
        except KeyError:
            raise LookupError(f"precision role {role!r} is not declared (declared: "
                              f"{', '.join(self._presets) or 'none'}); a node library declares "
                              f"its roles with register_preset_role") from None

    def declared(self) -> tuple[str, ...]:
        """The declared roles, in the order they were declared."""
        return tuple(self._presets)

    def sockets(self) -> tuple[str, ...]:
        """The socket types with a role, in the order they were registered."""
        return tuple(self._roles)


#: The one registry of precision roles.
ROLES = PrecisionRoles()
register_role = ROLES.register_role
register_preset_role = ROLES.register_preset_role
unregister_role = ROLES.unregister_role
