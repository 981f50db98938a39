"""Model patches and guidance that act in the sampler (comfy_extras nodes_model_advanced.py,
nodes_cfg.py, nodes_freelunch.py, nodes_pag.py, nodes_attention_multiply.py). Each returns a new
handle; the shared weights are never changed (docs/subsystems.md, "Model patches")."""

from __future__ import annotations

from mixgraph.graph.node import Combo, Float, Socket, node
from mixgraph.nodes.vae.latent_format import PLAYGROUND_V2_5
from mixgraph.nodes.adapters.lora import ScalePatch
from mixgraph.nodes.families.sd.unet_patches import FreeU as FreeUPatch
from mixgraph.nodes.sampling import cfg_patches

_FREEU = dict(min=0.0, max=10.0, step=0.01)
_MULT = dict(min=0.0, max=10.0, step=0.01)


@node(category="advanced/model", outputs=("MODEL",))
def RescaleCFG(model=Socket("MODEL"), multiplier=Float(0.7, min=0.0, max=1.0, step=0.01)):
    return (model.with_sampler_patch(cfg_patches.RescaleCFG(multiplier)),)


@node(category="advanced/guidance", outputs=(("MODEL", "patched_model"),))
def CFGZeroStar(model=Socket("MODEL")):
    return (model.with_sampler_patch(cfg_patches.CFGZeroStar()),)


@node(category="model_patches/unet", outputs=("MODEL",))
def PerturbedAttentionGuidance(model=Socket("MODEL"),
                               scale=Float(3.0, min=0.0, max=100.0, step=0.01, round=0.01)):
    return (model.with_sampler_patch(cfg_patches.PerturbedAttentionGuidance(scale)),)


@node(category="model_patches/unet", outputs=("MODEL",))
def FreeU(model=Socket("MODEL"), b1=Float(1.1, **_FREEU), b2=Float(1.2, **_FREEU),
          s1=Float(0.9, **_FREEU), s2=Float(0.2, **_FREEU)):
    return (model.with_unet_patch(FreeUPatch(model.config.model_channels, b1, b2, s1, s2)),)


@node(category="model_patches/unet", outputs=("MODEL",))
def FreeU_V2(model=Socket("MODEL"), b1=Float(1.3, **_FREEU), b2=Float(1.4, **_FREEU),
             s1=Float(0.9, **_FREEU), s2=Float(0.2, **_FREEU)):
    return (model.with_unet_patch(FreeUPatch(model.config.model_channels, b1, b2, s1, s2, v2=True)),)


def _unet_attention(attn: str, q: float, k: float, v: float, out: float) -> ScalePatch:
    return ScalePatch("unet", tuple(
        (f"{attn}.{name}.{kind}", f) for name, f in (("to_q", q), ("to_k", k), ("to_v", v), ("to_out.0", out))
        for kind in ("weight", "bias")))


@node(category="_for_testing/attention_experiments", outputs=("MODEL",))
def UNetSelfAttentionMultiply(model=Socket("MODEL"), q=Float(1.0, **_MULT), k=Float(1.0, **_MULT),
                              v=Float(1.0, **_MULT), out=Float(1.0, **_MULT)):
    return (model.with_patches((_unet_attention("attn1", q, k, v, out),)),)


@node(category="_for_testing/attention_experiments", outputs=("MODEL",))
def UNetCrossAttentionMultiply(model=Socket("MODEL"), q=Float(1.0, **_MULT), k=Float(1.0, **_MULT),
                               v=Float(1.0, **_MULT), out=Float(1.0, **_MULT)):
    return (model.with_patches((_unet_attention("attn2", q, k, v, out),)),)


@node(category="_for_testing/attention_experiments", outputs=("CLIP",))
def CLIPAttentionMultiply(clip=Socket("CLIP"), q=Float(1.0, **_MULT), k=Float(1.0, **_MULT),
                          v=Float(1.0, **_MULT), out=Float(1.0, **_MULT)):
    factors = tuple((f"self_attn.{name}.{kind}", f)
                    for name, f in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("out_proj", out))
                    for kind in ("weight", "bias"))
    return (clip.with_patches(tuple(ScalePatch(enc, factors) for enc in clip.names)),)


@node(category="sampling/custom_sampling", outputs=("MODEL",), display_name="Adaptive Projected Guidance")
def APG(model=Socket("MODEL"),
        eta=Float(1.0, min=-10.0, max=10.0, step=0.01,
                  tooltip="Controls the scale of the parallel guidance vector. Default CFG behavior at a setting of 1."),
        norm_threshold=Float(5.0, min=0.0, max=50.0, step=0.1,
                             tooltip="Normalize guidance vector to this value, normalization disable at a setting of 0."),
        momentum=Float(0.0, min=-5.0, max=1.0, step=0.01,
                       tooltip="Controls a running average of guidance during diffusion, disabled at a setting of 0.")):
    return (model.with_sampler_patch(cfg_patches.APG(eta, norm_threshold, momentum)),)


@node(category="advanced/guidance", outputs=(("MODEL", "patched_model"),), display_name="Tangential Damping CFG",
      description="TCFG – Tangential Damping CFG (2503.18137)\n\nRefine the uncond (negative) to align with the "
                  "cond (positive) for improving quality.")
def TCFG(model=Socket("MODEL")):
    return (model.with_sampler_patch(cfg_patches.TangentialDampingCFG()),)


@node(category="_for_testing", outputs=("MODEL",), display_name="Self-Attention Guidance")
def SelfAttentionGuidance(model=Socket("MODEL"), scale=Float(0.5, min=-2.0, max=5.0, step=0.01),
                          blur_sigma=Float(2.0, min=0.0, max=10.0, step=0.1)):
    return (model.with_sampler_patch(cfg_patches.SelfAttentionGuidance(scale, blur_sigma)),)


@node(category="_for_testing", outputs=("MODEL",), display_name="Differential Diffusion")
def DifferentialDiffusion(model=Socket("MODEL"),
                          strength=Float(1.0, min=0.0, max=1.0, step=0.0001, optional=True)):
    return (model.with_sampler_patch(cfg_patches.DifferentialDiffusion(float(strength))),)


_SIGMA = dict(min=0.0, max=1000.0, step=0.001, round=False)
_EDM_SAMPLING = ("v_prediction", "edm", "edm_playground_v2.5", "eps", "cosmos_rflow")
_EDM_UNSUPPORTED = {
    "cosmos_rflow": "Cosmos is a model family mixgraph does not run",
}


def _continuous(model, prediction: str, kind: str, sigma_max: float, sigma_min: float, node_name: str):
    if not (0 < sigma_min < sigma_max):
        raise ValueError(f"{node_name}: sigma_min ({sigma_min}) must be > 0 and below sigma_max ({sigma_max})")
    return model.with_sampling(prediction, False, (kind, float(sigma_min), float(sigma_max)))


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingContinuousEDM(model=Socket("MODEL"), sampling=Combo(_EDM_SAMPLING),
                               sigma_max=Float(120.0, **_SIGMA), sigma_min=Float(0.002, **_SIGMA)):
    """A continuous EDM schedule (timestep ¼·ln σ, log-spaced sigmas from sigma_min to sigma_max)
    with the chosen prediction; "edm" uses Karras et al.'s preconditioning with σ_data = 0.5 ("eps"
    and "v_prediction" keep σ_data = 1). "edm_playground_v2.5" is "edm" plus Playground v2.5's
    per-channel latent format (``models/latent_format.PLAYGROUND_V2_5``), which replaces the
    model's, as ComfyUI's object patch does (``comfy_extras/nodes_model_advanced.py`` at
    Comfy-Org/ComfyUI 691e8278)."""
    if sampling in _EDM_UNSUPPORTED:
        raise NotImplementedError(f"ModelSamplingContinuousEDM sampling {sampling!r}: not supported yet "
                                  f"({_EDM_UNSUPPORTED[sampling]})")
    if sampling == "edm_playground_v2.5":
        channels = model.latent_format.channels
        if channels != PLAYGROUND_V2_5.channels:
            raise ValueError(f"ModelSamplingContinuousEDM sampling 'edm_playground_v2.5': the model's latent has "
                             f"{channels} channels, Playground v2.5's latent format has {PLAYGROUND_V2_5.channels}")
        patched = _continuous(model, "edm", "edm", sigma_max, sigma_min, "ModelSamplingContinuousEDM")
        return (patched.with_latent_format(PLAYGROUND_V2_5),)
    return (_continuous(model, sampling, "edm", sigma_max, sigma_min, "ModelSamplingContinuousEDM"),)


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingContinuousV(model=Socket("MODEL"), sampling=Combo(("v_prediction",)),
                             sigma_max=Float(500.0, **_SIGMA), sigma_min=Float(0.03, **_SIGMA)):
    """A continuous v schedule (timestep (2/π)·atan σ) with v prediction."""
    return (_continuous(model, sampling, "v", sigma_max, sigma_min, "ModelSamplingContinuousV"),)
