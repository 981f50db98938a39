"""`comfy_api.internal`: what the versioned API classes share (`ComfyAPIBase`)."""

from __future__ import annotations


class ComfyAPIBase:
    """The base of every `ComfyAPI` version: its version string and whether it is stable."""

    VERSION: str = "base"
    STABLE: bool = False
