"""V3 `ui` outputs (`comfy_api.latest.ui`): what a node shows in the editor, as the `ui` dict of
its `executed` event. Images are written as ComfyUI does (PNG, `<prefix>_<counter:05>_.png`)."""

from __future__ import annotations

import random
from typing import Any

import torch

from mixgraph.nodes.helpers import imaging
import mixgraph.ui.comfy.comfy_runtime as _rt


class _UIOutput:
    def as_dict(self) -> dict:
        raise NotImplementedError


class SavedResult(dict):
    def __init__(self, filename: str, subfolder: str, type: Any):
        super().__init__(filename=filename, subfolder=subfolder, type=getattr(type, "value", type))


class SavedImages(_UIOutput):
    def __init__(self, results: list, is_animated: bool = False):
        self.results, self.is_animated = list(results), is_animated

    def as_dict(self) -> dict:
        return {"images": self.results, "animated": (self.is_animated,)}


class PreviewText(_UIOutput):
    def __init__(self, value: str, **kwargs: Any):
        self.value = value

    def as_dict(self) -> dict:
        return {"text": (self.value,)}


def _save_temp(images: torch.Tensor, cls: Any = None) -> list:
    env = _rt.current_env()
    prefix = "ComfyUI_temp_" + "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    hidden = getattr(cls, "hidden", None)
    return imaging.save_images(images, env.temp, prefix, kind="temp",
                               prompt=getattr(hidden, "prompt", None),
                               extra_pnginfo=getattr(hidden, "extra_pnginfo", None),
                               compress_level=1)


class PreviewImage(_UIOutput):
    def __init__(self, image: torch.Tensor, animated: bool = False, cls: Any = None, **kwargs: Any):
        self.values, self.animated = _save_temp(image, cls), animated

    def as_dict(self) -> dict:
        return {"images": self.values, "animated": (self.animated,)}


class PreviewMask(PreviewImage):
    def __init__(self, mask: torch.Tensor, animated: bool = False, cls: Any = None, **kwargs: Any):
        image = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).movedim(1, -1).expand(-1, -1, -1, 3)
        super().__init__(image, animated, cls)


__all__ = ["SavedResult", "SavedImages", "PreviewText", "PreviewImage", "PreviewMask"]
