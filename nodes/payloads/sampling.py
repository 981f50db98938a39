"""SAMPLER, NOISE and GUIDER: the custom-sampling payloads (ComfyUI's ``SamplerCustomAdvanced``
inputs), as small frozen dataclasses. SIGMAS needs no class: it is a 1-D float32 CPU tensor,
decreasing, usually ending in 0.

ComfyUI passes objects with behaviour (``KSAMPLER``, ``Noise_RandomNoise``, ``CFGGuider``) along
these edges; here they are data, and ``nodes.sampling`` (``ksampler.sample_custom``,
``guidance.build_denoiser``, ``noise.initial_noise``) gives them their behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conditioning import Cond

__all__ = ["Sampler", "Noise", "Guidance", "Guider", "GUIDANCE_KINDS"]

GUIDANCE_KINDS = ("cfg", "dual_cfg", "perp_neg", "dual_model")


@dataclass(frozen=True)
class Sampler:
    """SAMPLER: one of ComfyUI's sampler names (``nodes.sampling.samplers.SAMPLERS``) plus options
    passed to its function as keywords (``eta``, ``s_noise``, ``order``...); ``options`` is a
    tuple of (name, value) pairs so the payload stays hashable. ``name == "ddim"`` also selects
    ComfyUI's separate inpaint noise (seed + 1), as ``sampler_object("ddim")`` does."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass(frozen=True)
class Noise:
    """NOISE: the initial noise of a run.

    seed: the node's seed; also the seed the ancestral/SDE samplers' per-step noise is built from
          (ComfyUI passes ``noise.seed`` as ``extra_args["seed"]``; DisableNoise's is 0).
    add:  False = zeros (DisableNoise, ``add_noise`` off), True = ``prepare_noise`` from ``seed``.
    """

    seed: int = 0
    add: bool = True


@dataclass(frozen=True)
class Guidance:
    """How the x0 predictions of a guider's conditionings combine into one, per step.

    kind "cfg":      conds (positive, negative), scales (cfg,). BasicGuider is cfg with no
                     negative and cfg 1 (the negative is then never evaluated).
    kind "dual_cfg": conds (cond1, cond2, negative), scales (cfg_conds, cfg_cond2_negative);
                     ``nested`` selects DualCFGGuider's "nested" style.
    kind "perp_neg": conds (positive, negative, empty), scales (cfg, neg_scale).
    kind "dual_model": conds (positive, negative), scales (cfg,): CFG whose negative is evaluated
                     on the guider's ``negative_model`` (DualModelGuider).
    """

    kind: str
    conds: tuple[tuple[Cond, ...], ...]
    scales: tuple[float, ...]
    nested: bool = False

    def __post_init__(self):
        if self.kind not in GUIDANCE_KINDS:
            raise ValueError(f"unknown guidance {self.kind!r}; one of {', '.join(GUIDANCE_KINDS)}")


@dataclass(frozen=True)
class Guider:
    """GUIDER: the MODEL handle it runs plus its guidance rule. The node that samples with it
    (SamplerCustomAdvanced) chooses the precision the model runs in.

    ``negative_model``: guidance "dual_model" only, the MODEL handle the negative pass runs on
    (its own weights and patches; SamplerCustomAdvanced resolves its precision separately)."""

    model: Any  # nodes.models.handles.ModelHandle
    guidance: Guidance
    negative_model: Any = None  # nodes.models.handles.ModelHandle | None

    def __post_init__(self):
        if (self.guidance.kind == "dual_model") != (self.negative_model is not None):
            raise ValueError("a GUIDER has a negative_model exactly when its guidance is 'dual_model'")
