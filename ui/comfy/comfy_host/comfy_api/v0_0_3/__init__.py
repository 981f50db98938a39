"""`comfy_api.v0_0_3`: the API pinned at version 0.0.3, today the same as `latest` (ComfyUI's
`sdk` namespace of this version is not provided: importing it fails by name)."""

from __future__ import annotations

from comfy_api.internal import pin_version
from comfy_api.internal.async_to_sync import create_sync_class
from comfy_api.latest import IO, UI, ComfyAPI_latest, ComfyExtension, io, ui  # noqa: F401
from comfy_api.latest import Input as Input_latest
from comfy_api.latest import InputImpl as InputImpl_latest
from comfy_api.latest import Types as Types_latest

ComfyAPIAdapter_v0_0_3, Input, InputImpl, Types = pin_version("0.0.3", False,
    ComfyAPI_latest, Input_latest, InputImpl_latest, Types_latest)

ComfyAPI = ComfyAPIAdapter_v0_0_3
ComfyAPISync = create_sync_class(ComfyAPIAdapter_v0_0_3)

__all__ = ["ComfyAPI", "ComfyAPISync", "Input", "InputImpl", "Types", "ComfyExtension", "io", "IO",
           "ui", "UI"]
