"""Guidance model patches of ComfyUI 0.38.1 (``comfy_extras/nodes_cfg.py`` CFGNorm,
``nodes_mahiro.py``, ``nodes_fresca.py``, ``nodes_perpneg.py`` PerpNeg,
``nodes_custom_sampler.py`` CFGOverride), ``nodes_tag.py`` TangentialAmplifyingGuidance (110b1dc)
and ``nodes_lumina2.py`` RenormCFG (09494bc). Each returns a new MODEL handle carrying one sampler
patch of ``sampling/cfg_patches_extra.py``."""

from __future__ import annotations

import dataclasses

from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.node import Boolean, Float, Int, Socket, node, replace_spec
from mixgraph.nodes.sampling import cfg_patches_extra as P
from mixgraph.nodes.sampling.parameterization import ModelSampling

GUIDERS = "sampling/custom_sampling/guiders"  # custom_sampling_nodes' guider category


@node(category="advanced/guidance", outputs=(("MODEL", "patched_model"),))
def CFGNorm(model=Socket("MODEL"), strength=Float(1.0, min=0.0, max=100.0, step=0.01),
            pre_cfg=Boolean(False, optional=True, tooltip=(
                "If true, rescale the combined noise BEFORE the sampler's CFG combine, without "
                "clamping (can amplify). Matches the norm-scaled CFG used by models like Lens. "
                "Default false keeps the original post-CFG x0-space attenuate-only behavior."))):
    patch = P.CFGNormPreCFG(float(strength)) if pre_cfg else P.CFGNorm(float(strength))
    return (model.with_sampler_patch(patch),)


@node(category="_for_testing", outputs=(("MODEL", "patched_model"),),
      display_name="Mahiro is so cute that she deserves a better guidance function!! (。・ω・。)",
      description="Modify the guidance to scale more on the 'direction' of the positive prompt rather "
                  "than the difference between the negative prompt.")
def Mahiro(model=Socket("MODEL")):
    return (model.with_sampler_patch(P.Mahiro()),)


@node(category="_for_testing", outputs=("MODEL",), display_name="FreSca",
      description="Applies frequency-dependent scaling to the guidance")
def FreSca(model=Socket("MODEL"),
           scale_low=Float(1.0, min=0, max=10, step=0.01,
                           tooltip="Scaling factor for low-frequency components"),
           scale_high=Float(1.25, min=0, max=10, step=0.01,
                            tooltip="Scaling factor for high-frequency components"),
           freq_cutoff=Int(20, min=1, max=10000, step=1,
                           tooltip="Number of frequency indices around center to consider as low-frequency")):
    return (model.with_sampler_patch(P.FreSca(float(scale_low), float(scale_high), int(freq_cutoff))),)


@node(category="_for_testing", outputs=("MODEL",), display_name="Perp-Neg (DEPRECATED by Perp-Neg Guider)")
def PerpNeg(model=Socket("MODEL"), empty_conditioning=Socket("CONDITIONING"),
            neg_scale=Float(1.0, min=0.0, max=100.0, step=0.01)):
    """Perp-Neg as a model patch: the empty prompt is evaluated as a third prediction each step."""
    return (model.with_sampler_patch(P.PerpNegPatch(tuple(empty_conditioning), float(neg_scale))),)


@node(category=GUIDERS, outputs=("MODEL",), display_name="CFG Override",
      description="Override cfg to a fixed value over a [start, end] percent (sigma) range. "
                  "With multiple overrides, the one nearest the sampler wins on overlap.")
def CFGOverride(model=Socket("MODEL"), cfg=Float(1.0, min=0.0, max=100.0, step=0.1, round=0.01),
                start_percent=Float(0.0, min=0.0, max=1.0, step=0.001),
                end_percent=Float(1.0, min=0.0, max=1.0, step=0.001)):
    ms = ModelSampling.for_model(model)
    patch = P.CFGOverride(float(cfg), float(ms.percent_to_sigma(start_percent)),
                          float(ms.percent_to_sigma(end_percent)))
    return (model.with_sampler_patch(patch),)


def _advanced(inp):
    """An input shown under the editor's "advanced" fold (ComfyUI V3's ``advanced=True``)."""
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


@node(category="experimental", outputs=("MODEL",), display_name="Tangential Amplifying Guidance",
      register=False)
def TangentialAmplifyingGuidance(
        model=Socket("MODEL"),
        t_scale=Float(1.05, min=0.0, max=10.0, step=0.001,
                      tooltip="scale for the tangential (orthogonal) component"),
        r_scale=Float(1.0, min=0.0, max=10.0, step=0.001,
                      tooltip="scale for the radial (parallel) component"),
        start_percent=_advanced(Float(0.0, min=0.0, max=1.0, step=0.01)),
        end_percent=_advanced(Float(1.0, min=0.0, max=1.0, step=0.01))):
    ms = ModelSampling.for_model(model)
    patch = P.TangentialAmplify(float(t_scale), float(r_scale), float(ms.percent_to_sigma(start_percent)),
                                float(ms.percent_to_sigma(end_percent)))
    return (model.with_sampler_patch(patch),)


TangentialAmplifyingGuidance.spec = REGISTRY.add(replace_spec(  # type: ignore[attr-defined]
    TangentialAmplifyingGuidance.spec, info_extra=(("experimental", True),)))


@node(category="model/patch", outputs=("MODEL",))
def RenormCFG(model=Socket("MODEL"), cfg_trunc=_advanced(Float(100, min=0.0, max=100.0, step=0.01)),
              renorm_cfg=_advanced(Float(1.0, min=0.0, max=100.0, step=0.01))):
    patch = P.RenormCFG(float(cfg_trunc), float(renorm_cfg), int(model.config.in_channels))
    return (model.with_sampler_patch(patch),)
