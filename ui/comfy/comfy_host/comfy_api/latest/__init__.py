"""`comfy_api.latest`: the V3 node API (`io`, `ui`, `ComfyExtension`), the value types (`Input`,
`InputImpl`, `Types`) and the progress API (`ComfyAPI().execution.set_progress(...)`, awaitable;
`ComfyAPISync` the same, blocking). The pinned versions (`comfy_api.v0_0_1`...) build on these."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

import mixgraph.ui.comfy.comfy_runtime as _rt

from comfy_api.internal import ComfyAPIBase
from comfy_api.internal.async_to_sync import create_sync_class

from . import _io as io  # noqa: F401
from . import _ui as ui  # noqa: F401
from ._inputs import Input, InputImpl, Types  # noqa: F401


class ComfyExtension(ABC):
    """What a V3 pack's `comfy_entrypoint()` returns."""

    async def on_load(self) -> None:
        """Called once when the pack is loaded."""

    @abstractmethod
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        """The pack's node classes."""


def _set_progress(value: float, max_value: float, node_id: str | None, preview_image: Any) -> None:
    now = _rt.running()
    if now is None or (node_id is not None and node_id != now.node_id):
        raise ValueError("set_progress: call it from the running node (node_id must be the "
                         "running node's or None)")
    preview = preview_image if isinstance(preview_image, torch.Tensor) else None
    now.ctx.progress(int(value), int(max_value), preview)


class ComfyAPI_latest(ComfyAPIBase):
    """The progress API: `ComfyAPI().execution.set_progress(...)`, awaitable."""

    VERSION = "latest"
    STABLE = False

    class Execution:
        async def set_progress(self, value: float, max_value: float, node_id: str | None = None,
                               preview_image: Any = None, ignore_size_limit: bool = False) -> None:
            _set_progress(value, max_value, node_id, preview_image)

    execution: Execution

    def __init__(self) -> None:
        self.execution = self.Execution()


ComfyAPI = ComfyAPI_latest
# the same API, blocking (for sync node bodies)
ComfyAPISync = create_sync_class(ComfyAPI_latest)
IO = io
UI = ui

__all__ = ["ComfyAPI", "ComfyAPISync", "Input", "InputImpl", "Types", "ComfyExtension", "io", "IO",
           "ui", "UI"]
