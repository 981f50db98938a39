"""ComfyUI's SkipLayerGuidanceSD3 (``comfy_extras/nodes_sd3.py``) and SkipLayerGuidanceDiT
(``nodes_slg.py`` at Comfy-Org/ComfyUI 39c19fb): skip-layer guidance on a model's joint
("double") and single-stream blocks, a post-CFG sampler patch (``sampling/skip_layer_guidance.py``)
whose model says which blocks it can leave out (its runner's ``skippable_blocks``)."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.node import Float, Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.nodes.sampling.skip_layer_guidance import SkipLayerGuidance, parse_layers

_PERCENT = dict(min=0.0, max=1.0, step=0.001)
_DESCRIPTION = "Generic version of SkipLayerGuidance node that can be used on every DiT model."
_EXPERIMENTAL = (("experimental", True),)


def _advanced(inp):
    """An input shown under the editor's "advanced" fold (ComfyUI V3's ``advanced=True``)."""
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


def _guided(model, skips, scale, start_percent, end_percent, rescaling_scale=0.0):
    """The model with the SLG patch; unchanged when no layer is named (ComfyUI returns it as
    is). The sigmas come from the model's sampling when the node runs, as in ComfyUI."""
    if not any(indices for _, indices in skips):
        return model
    ms = ModelSampling.for_model(model)
    patch = SkipLayerGuidance(tuple(skips), float(scale), float(ms.percent_to_sigma(start_percent)),
                              float(ms.percent_to_sigma(end_percent)), float(rescaling_scale))
    return model.with_sampler_patch(patch)


@node(category="advanced/guidance", outputs=("MODEL",), register=False, description=_DESCRIPTION)
def SkipLayerGuidanceSD3(model=Socket("MODEL"), layers=String("7, 8, 9"),
                         scale=Float(3.0, min=0.0, max=10.0, step=0.1),
                         start_percent=Float(0.01, **_PERCENT), end_percent=Float(0.15, **_PERCENT)):
    return (_guided(model, (("double_block", parse_layers(layers)),), scale, start_percent, end_percent),)


@node(category="advanced/guidance", outputs=("MODEL",), register=False, description=_DESCRIPTION)
def SkipLayerGuidanceDiT(model=Socket("MODEL"), double_layers=_advanced(String("7, 8, 9")),
                         single_layers=_advanced(String("7, 8, 9")),
                         scale=Float(3.0, min=0.0, max=10.0, step=0.1),
                         start_percent=_advanced(Float(0.01, **_PERCENT)),
                         end_percent=_advanced(Float(0.15, **_PERCENT)),
                         rescaling_scale=Float(0.0, min=0.0, max=10.0, step=0.01)):
    skips = (("double_block", parse_layers(double_layers)), ("single_block", parse_layers(single_layers)))
    return (_guided(model, skips, scale, start_percent, end_percent, rescaling_scale),)


for _fn in (SkipLayerGuidanceSD3, SkipLayerGuidanceDiT):
    _fn.spec = REGISTRY.add(replace_spec(_fn.spec, info_extra=_EXPERIMENTAL))  # type: ignore[attr-defined]
