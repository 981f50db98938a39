"""ComfyUI's PatchModelAddDownscale (``comfy_extras/nodes_model_downscale.py``, Kohya Deep
Shrink): a UNet patch (``unet_patches.DeepShrink``) that shrinks the main path after one input
block during the early, high-noise part of sampling."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, node
from mixgraph.nodes.families.sd.unet_patches import DeepShrink
from mixgraph.nodes.sampling.parameterization import ModelSampling

UPSCALE_METHODS = ("bicubic", "nearest-exact", "bilinear", "area", "bislerp")
_PERCENT = dict(min=0.0, max=1.0, step=0.001)


@node(category="model_patches/unet", display_name="PatchModelAddDownscale (Kohya Deep Shrink)",
      outputs=("MODEL",))
def PatchModelAddDownscale(model=Socket("MODEL"), block_number=Int(3, min=1, max=32, step=1),
                           downscale_factor=Float(2.0, min=0.1, max=9.0, step=0.001),
                           start_percent=Float(0.0, **_PERCENT), end_percent=Float(0.35, **_PERCENT),
                           downscale_after_skip=Boolean(True),
                           downscale_method=Combo(UPSCALE_METHODS), upscale_method=Combo(UPSCALE_METHODS)):
    ms = ModelSampling.for_model(model)
    patch = DeepShrink(int(block_number), float(downscale_factor),
                       float(ms.percent_to_sigma(start_percent)), float(ms.percent_to_sigma(end_percent)),
                       bool(downscale_after_skip), downscale_method, upscale_method)
    return (model.with_unet_patch(patch),)
