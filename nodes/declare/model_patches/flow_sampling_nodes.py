"""ComfyUI's flow-matching model samplings (``comfy_extras/nodes_model_advanced.py`` at
Comfy-Org/ComfyUI 691e8278): ModelSamplingSD3, ModelSamplingAuraFlow and ModelSamplingFlux. Each
returns a MODEL handle sampled as a flow model (ComfyUI's CONST) with the schedule it names,
whatever the model sampled as before, as ComfyUI's ``model_sampling`` object patch
(``ModelHandle.with_flow_sampling``; the schedules are ``sampling/schedule_flow.py``'s)."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node
from mixgraph.nodes.sampling.schedule_flow import flux_resolution_shift

_SHIFT = dict(min=0.0, max=100.0, step=0.01)


def _advanced(inp):
    """An input shown under the editor's "advanced" fold (ComfyUI's ``"advanced": True``)."""
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


def _flow(model, node_name: str, shift: float, multiplier: float, kind: str = "linear"):
    if not shift > 0:  # linear: ComfyUI's σ(t) would be 0 everywhere, nothing to sample
        raise ValueError(f"{node_name}: the shift must be > 0, got {shift}"
                         + (" (μ from max_shift, base_shift and the size)" if kind == "exponential" else ""))
    return model.with_flow_sampling(shift, multiplier, kind)


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingSD3(model=Socket("MODEL"), shift=Float(3.0, **_SHIFT)):
    """Flow matching with SD3's time shift σ = shift·t / (1 + (shift − 1)·t), timestep σ·1000."""
    return (_flow(model, "ModelSamplingSD3", shift, 1000.0),)


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingAuraFlow(model=Socket("MODEL"), shift=Float(1.73, **_SHIFT),
                          sampling=Combo(("flow", "img_to_img_velocity"), "flow", optional=True, advanced=True)):
    """Flow matching with SD3's time shift and the timestep σ itself (multiplier 1: AuraFlow,
    Lumina 2, Z-Image)."""
    if sampling != "flow":
        raise NotImplementedError(f"ModelSamplingAuraFlow sampling {sampling!r}: not supported yet (only 'flow')")
    return (_flow(model, "ModelSamplingAuraFlow", shift, 1.0),)


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingFlux(model=Socket("MODEL"), max_shift=_advanced(Float(1.15, **_SHIFT)),
                      base_shift=_advanced(Float(0.5, **_SHIFT)),
                      width=Int(1024, min=16, max=MAX_RESOLUTION, step=8),
                      height=Int(1024, min=16, max=MAX_RESOLUTION, step=8)):
    """Flux.1's exponential time shift σ = e^μ / (e^μ + 1/t − 1), μ linear in the image's patch
    count: base_shift at 256² px, max_shift at 1024² px."""
    mu = flux_resolution_shift(width, height, max_shift, base_shift)
    return (_flow(model, "ModelSamplingFlux", mu, 1.0, "exponential"),)
