"""`comfy_api.v0_0_1`: the API pinned at version 0.0.1, built on 0.0.2 and marked stable. As in
ComfyUI it has only the progress API and the value types (no `io`, `ui`, `ComfyExtension`)."""

from __future__ import annotations

from comfy_api.internal import pin_version
from comfy_api.internal.async_to_sync import create_sync_class
from comfy_api.v0_0_2 import ComfyAPIAdapter_v0_0_2
from comfy_api.v0_0_2 import Input as Input_v0_0_2
from comfy_api.v0_0_2 import InputImpl as InputImpl_v0_0_2
from comfy_api.v0_0_2 import Types as Types_v0_0_2

ComfyAPIAdapter_v0_0_1, Input, InputImpl, Types = pin_version("0.0.1", True,
    ComfyAPIAdapter_v0_0_2, Input_v0_0_2, InputImpl_v0_0_2, Types_v0_0_2)

ComfyAPI = ComfyAPIAdapter_v0_0_1
ComfyAPISync = create_sync_class(ComfyAPIAdapter_v0_0_1)

__all__ = ["ComfyAPI", "ComfyAPISync", "Input", "InputImpl", "Types"]
