"""SamplerLCMUpscale and SamplerEulerCFGpp (ComfyUI ``comfy_extras/nodes_advanced_samplers.py``):
SAMPLER payloads for the node-only samplers of ``sampling/solvers_extra.py``."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Float, Int, node
from mixgraph.nodes.sampling import sampler_presets as presets

LCM_UPSCALE_METHODS = ("bislerp", "nearest-exact", "bilinear", "area", "bicubic")


@node(category="sampling/custom_sampling/samplers", outputs=("SAMPLER",))
def SamplerLCMUpscale(scale_ratio=Float(1.0, min=0.1, max=20.0, step=0.01),
                      scale_steps=Int(-1, min=-1, max=1000, step=1),
                      upscale_method=Combo(LCM_UPSCALE_METHODS)):
    """LCM that enlarges the latent by scale_ratio over scale_steps steps (-1: half the steps)."""
    return (presets.select_sampler("lcm_upscale", total_upscale=float(scale_ratio),
                                   upscale_steps=None if scale_steps < 0 else int(scale_steps),
                                   upscale_method=upscale_method),)


@node(category="_for_testing", outputs=("SAMPLER",), display_name="SamplerEulerCFG++")
def SamplerEulerCFGpp(version=Combo(("regular", "alternative"))):
    """Euler CFG++: "regular" is KSampler's euler_cfg_pp, "alternative" ComfyUI's sample_euler_pp."""
    return (presets.select_sampler("euler_cfg_pp" if version == "regular" else "euler_pp"),)
