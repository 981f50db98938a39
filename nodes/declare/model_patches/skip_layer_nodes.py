"""ComfyUI's SkipLayerGuidanceSD3 (``comfy_extras/nodes_sd3.py``): skip-layer guidance on a
model's joint ("double") blocks, a post-CFG sampler patch (``sampling/skip_layer_guidance.py``)."""

from __future__ import annotations

from mixgraph.graph.node import Float, Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.nodes.sampling.skip_layer_guidance import SkipLayerGuidance, parse_layers

_PERCENT = dict(min=0.0, max=1.0, step=0.001)


@node(category="advanced/guidance", outputs=("MODEL",), register=False,
      description="Generic version of SkipLayerGuidance node that can be used on every DiT model.")
def SkipLayerGuidanceSD3(model=Socket("MODEL"), layers=String("7, 8, 9"),
                         scale=Float(3.0, min=0.0, max=10.0, step=0.1),
                         start_percent=Float(0.01, **_PERCENT), end_percent=Float(0.15, **_PERCENT)):
    # ComfyUI reads the sigmas from the model's sampling when the node runs, and returns the
    # model unchanged when the string names no layer
    indices = parse_layers(layers)
    if not indices:
        return (model,)
    ms = ModelSampling.for_model(model)
    patch = SkipLayerGuidance(indices, float(scale), float(ms.percent_to_sigma(start_percent)),
                              float(ms.percent_to_sigma(end_percent)))
    return (model.with_sampler_patch(patch),)


SkipLayerGuidanceSD3.spec = REGISTRY.add(replace_spec(  # type: ignore[attr-defined]
    SkipLayerGuidanceSD3.spec, info_extra=(("experimental", True),)))
