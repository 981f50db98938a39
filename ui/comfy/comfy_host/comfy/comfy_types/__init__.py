"""`comfy.comfy_types`: see node_typing."""

from .node_typing import (IO, CheckLazyMixin, ComfyNodeABC, FileLocator,  # noqa: F401
                          HiddenInputTypeDict, InputTypeDict, InputTypeOptions, StrEnum)

__all__ = ["IO", "CheckLazyMixin", "ComfyNodeABC", "FileLocator", "HiddenInputTypeDict",
           "InputTypeDict", "InputTypeOptions", "StrEnum"]
