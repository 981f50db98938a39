"""Model patches of ComfyUI's ``comfy_extras/nodes_eps.py`` (EpsilonScaling, TemporalScoreRescaling;
file commit 09d0de4), ``nodes_easycache.py`` (EasyCache, LazyCache; 0f548d2) and
``nodes_torch_compile.py`` (TorchCompileModel; 0793668), all comfyanonymous/ComfyUI. Each returns
a new MODEL handle: a post-CFG sampler patch (``sampling/eps_patches.py``), a step cache
(``sampling/step_cache.py``) or a torch.compile backend (``models/compile.py``)."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Combo, Float, Output, Socket, node
from mixgraph.nodes.models import compile as compile_ops
from mixgraph.nodes.sampling import eps_patches, step_cache


@node(name="Epsilon Scaling", category="model/patch/unet", outputs=("MODEL",),
      description="Implements the Epsilon Scaling method from 'Elucidating the Exposure Bias in "
                  "Diffusion Models' (https://arxiv.org/abs/2308.15321v6).")
def EpsilonScaling(model=Socket("MODEL"), scaling_factor=Float(1.005, min=0.5, max=1.5, step=0.001)):
    return (model.with_sampler_patch(eps_patches.EpsilonScaling(float(scaling_factor))),)


@node(category="model/patch/unet", outputs=(Output("MODEL", "patched_model"),),
      display_name="TSR - Temporal Score Rescaling",
      description="[Post-CFG Function]\nTSR - Temporal Score Rescaling (2510.01184)\n\n"
                  "Rescaling the model's score or noise to steer the sampling diversity.\n")
def TemporalScoreRescaling(
        model=Socket("MODEL"),
        tsr_k=Float(0.95, min=0.01, max=100.0, step=0.001, tooltip=(
            "Controls the rescaling strength.\nLower k produces more detailed results; higher k "
            "produces smoother results in image generation. Setting k = 1 disables rescaling.")),
        tsr_sigma=Float(1.0, min=0.01, max=100.0, step=0.001, tooltip=(
            "Controls how early rescaling takes effect.\nLarger values take effect earlier."))):
    return (model.with_sampler_patch(eps_patches.TemporalScoreRescaling(float(tsr_k), float(tsr_sigma))),)


def _cache_inputs(what: str) -> dict:
    return dict(
        reuse_threshold=Float(0.2, min=0.0, max=3.0, step=0.01, tooltip="The threshold for reusing cached steps."),
        start_percent=Float(0.15, min=0.0, max=1.0, step=0.01,
                            tooltip=f"The relative sampling step to begin use of {what}."),
        end_percent=Float(0.95, min=0.0, max=1.0, step=0.01,
                          tooltip=f"The relative sampling step to end use of {what}."),
        verbose=Boolean(False, tooltip="Whether to log verbose information."))


_EASY = _cache_inputs("EasyCache")
_LAZY = _cache_inputs("LazyCache")


def _with_step_cache(settings: type, model, reuse_threshold, start_percent, end_percent, verbose):
    return (model.with_sampler_patch(settings(float(reuse_threshold), float(start_percent), float(end_percent),
                                              bool(verbose), model.latent_format.channels)),)


@node(category="advanced/debug", outputs=("MODEL",), display_name="EasyCache",
      description="Native EasyCache implementation.")
def EasyCache(model=Socket("MODEL", tooltip="The model to add EasyCache to."),
              reuse_threshold=_EASY["reuse_threshold"], start_percent=_EASY["start_percent"],
              end_percent=_EASY["end_percent"], verbose=_EASY["verbose"]):
    return _with_step_cache(step_cache.EasyCache, model, reuse_threshold, start_percent, end_percent, verbose)


@node(category="advanced/debug", outputs=("MODEL",), display_name="LazyCache",
      description="A homebrew version of EasyCache - even 'easier' version of EasyCache to implement. "
                  "Overall works worse than EasyCache, but better in some rare cases AND universal "
                  "compatibility with everything in ComfyUI.")
def LazyCache(model=Socket("MODEL", tooltip="The model to add LazyCache to."),
              reuse_threshold=_LAZY["reuse_threshold"], start_percent=_LAZY["start_percent"],
              end_percent=_LAZY["end_percent"], verbose=_LAZY["verbose"]):
    return _with_step_cache(step_cache.LazyCache, model, reuse_threshold, start_percent, end_percent, verbose)


def check_compile_backend(env, backend=None) -> list[tuple[str, str]]:
    if backend is None or backend not in compile_ops.BACKENDS:
        return []  # linked, or an unknown literal (the option check reports it)
    try:
        compile_ops.check_backend(backend, getattr(env, "device", "cpu"))
    except ValueError as e:
        return [("backend", str(e))]
    return []


@node(category="_for_testing", outputs=("MODEL",), validate=check_compile_backend)
def TorchCompileModel(model=Socket("MODEL"), backend=Combo(compile_ops.BACKENDS)):
    return (model.with_compile(compile_ops.check_backend(backend)),)
