"""The SD family's extra parts of a variant (``ModelHandle.parts``): what some SD models carry
beside the UNet, set by detection (``detect.py``) and read by the SD runner and SD-only nodes."""

from __future__ import annotations

from dataclasses import dataclass

from mixgraph.nodes.families.sd.sdpose import HeatmapHeadWeights
from mixgraph.nodes.families.sd.unclip import NoiseAugmentor
from mixgraph.nodes.families.sd.x4_upscaler import ImageAugmentor
from mixgraph.nodes.families.sd.zero123 import CameraProjectionWeights

__all__ = ["SDParts", "NO_PARTS", "parts_of"]


@dataclass(frozen=True)
class SDParts:
    """unclip: SD2.1 unCLIP's image-embedding noise augmentation that builds y (``unclip.py``);
    cc_projection: Stable Zero123's camera projection applied to wider conds (``zero123.py``);
    x4: the x4 upscaler's low-resolution image input and noise label (``x4_upscaler.py``);
    task_embedding: Lotus' constant vector input y, its task switcher (``lotus.task_embedding``);
    heatmap_head: SDPose's keypoint heatmap head stored next to the UNet (``sdpose.py``)."""

    unclip: NoiseAugmentor | None = None
    cc_projection: CameraProjectionWeights | None = None
    x4: ImageAugmentor | None = None
    task_embedding: tuple[float, ...] | None = None
    heatmap_head: HeatmapHeadWeights | None = None


NO_PARTS = SDParts()


def parts_of(model) -> SDParts:
    """A MODEL handle's (or runner's handle's) SD parts; none for another family's model."""
    handle = getattr(model, "handle", model)
    parts = getattr(handle, "parts", None)
    return parts if isinstance(parts, SDParts) else NO_PARTS
