"""`comfy_api.internal`: what the versioned API classes share (`ComfyAPIBase`)."""

from __future__ import annotations


class ComfyAPIBase:
    """The base of every `ComfyAPI` version: its version string and whether it is stable."""

    VERSION: str = "base"
    STABLE: bool = False


def pin_version(version: str, stable: bool, api: type, input_: type, input_impl: type, types: type) -> tuple[type, ...]:
    """The classes a pinned API version module exports, each a subclass of the version it builds
    on (ComfyUI's layout: `ComfyAPIAdapter_vX_Y_Z`, `Input`, `InputImpl`, `Types`), so a pack's
    `isinstance` and class names see the version it imported."""
    tag = "v" + version.replace(".", "_")
    adapter = type(f"ComfyAPIAdapter_{tag}", (api,), {"VERSION": version, "STABLE": stable})
    return (adapter, *(type(cls.__name__, (cls,), {}) for cls in (input_, input_impl, types)))
