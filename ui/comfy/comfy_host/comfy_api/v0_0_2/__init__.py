"""`comfy_api.v0_0_2`: the API pinned at version 0.0.2, today the same as `latest` (the version
ComfyUI's own test pack imports)."""

from __future__ import annotations

from comfy_api.internal import pin_version
from comfy_api.internal.async_to_sync import create_sync_class
from comfy_api.latest import ComfyAPI_latest, ComfyExtension, io, ui  # noqa: F401
from comfy_api.latest import Input as Input_latest
from comfy_api.latest import InputImpl as InputImpl_latest
from comfy_api.latest import Types as Types_latest

ComfyAPIAdapter_v0_0_2, Input, InputImpl, Types = pin_version("0.0.2", False,
    ComfyAPI_latest, Input_latest, InputImpl_latest, Types_latest)

ComfyAPI = ComfyAPIAdapter_v0_0_2
ComfyAPISync = create_sync_class(ComfyAPIAdapter_v0_0_2)

__all__ = ["ComfyAPI", "ComfyAPISync", "Input", "InputImpl", "Types", "ComfyExtension"]
