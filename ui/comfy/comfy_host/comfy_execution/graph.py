"""`comfy_execution.graph`: the names packs import from it (`ExecutionBlocker`)."""

from comfy_execution.graph_utils import ExecutionBlocker  # noqa: F401

__all__ = ["ExecutionBlocker"]
