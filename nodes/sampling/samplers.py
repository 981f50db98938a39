"""Sampler registry and the sampler contract (ComfyUI's ``KSAMPLER_NAMES``).

CONTRACT (every ``sample_<name>`` in the ``solvers_*.py`` modules follows it; keep it stable)
----------------------------------------------------------------------------------------------
``sample_<name>(model, x, sigmas, extra_args=None, callback=None, disable=None,
noise_sampler=None, **opts) -> Tensor``

* ``x``: [B, C, H, W] float32, already noised to ``sigmas[0]`` (the glue does the scaling).
* ``sigmas``: 1-D float32 tensor on x's device, decreasing, usually ending in 0.
* ``model(x, sigma, **extra_args) -> denoised``: the x0 prediction (CFG already combined);
  ``sigma`` is a [B] tensor (``sigmas[i] * x.new_ones([B])``). Pass ``extra_args`` through
  unchanged. ``extra_args`` may hold ``"seed"`` (int): denoisers accept and ignore it.
* Noise: use ``noise_sampler`` when given, else build one from ``extra_args.get("seed")``:
  ``default_noise_sampler(x, seed)`` for ancestral samplers, ``brownian_noise_sampler(x, sigmas,
  seed, cpu=True)`` for the BrownianTree SDE samplers (``cpu=False`` for ``*_gpu``). Both live in
  ``nodes.sampling.noise``. Never draw from the global RNG.
* ``callback({"i", "x", "sigma", "sigma_hat", "denoised"})`` once per step, right after the
  step's first model call, before x is updated (the glue turns it into progress + cancel).
  ``disable`` (a progress-bar switch in k-diffusion) is accepted and ignored: progress is the
  glue's job.
* CFG++ samplers (Chung et al. 2024, "CFG++: Manifold-constrained Classifier Free Guidance")
  get the unconditional x0 prediction with ``denoise_with_uncond(model, x, sigma, **extra_args)
  -> (denoised, uncond_denoised)``. It calls ``model.with_uncond(...)`` when the model has it
  (``parameterization.CFGDenoiser`` does; it then evaluates the negative even at cfg == 1, as
  ComfyUI's ``disable_cfg1_optimization``); a plain denoiser without conditioning has a single
  prediction, which is then both.
* Helpers for samplers: ``to_d``, ``get_ancestral_step``, ``append_dims``,
  ``denoise_with_uncond`` (in ``sampler_utils``, re-exported here) and the noise samplers
  (``nodes.sampling.noise``).

LAYOUT: the algorithms live in family modules, which import helpers from ``sampler_utils`` only
(never from this module, so there is no import cycle):

* ``solvers_euler``: euler, ddim, euler_ancestral, heun, heunpp2, dpm_2(_ancestral), lms, ddpm,
  lcm;
* ``solvers_dpm``: dpm_fast, dpm_adaptive (DPM-Solver);
* ``solvers_dpmpp``: the DPM-Solver++ family (2s_ancestral, sde, 2m, 2m_sde, 3m_sde, ``*_gpu``);
* ``solvers_multistep``: ipndm, ipndm_v, deis, uni_pc, uni_pc_bh2;
* ``samplers_extra`` gathers ``EXTRA_SAMPLERS`` (the names in ``EXTRA_SAMPLER_NAMES``) from
  ``solvers_cfgpp``, ``solvers_res``, ``solvers_sde`` and ``solvers_sa``.

The registry below resolves a name to ``sample_<name>`` in the core families, or to
``EXTRA_SAMPLERS[name]``. The core ``sample_*`` functions are re-exported here.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import solvers_dpm, solvers_dpmpp, solvers_euler, solvers_multistep
from .noise import BrownianTreeNoiseSampler, brownian_noise_sampler, default_noise_sampler
from .sampler_utils import append_dims, denoise_with_uncond, get_ancestral_step, to_d
from .samplers_extra import EXTRA_SAMPLERS
from .solvers_dpm import sample_dpm_adaptive, sample_dpm_fast
from .solvers_dpmpp import (
    sample_dpmpp_2m,
    sample_dpmpp_2m_sde,
    sample_dpmpp_2m_sde_gpu,
    sample_dpmpp_2m_sde_heun,
    sample_dpmpp_2m_sde_heun_gpu,
    sample_dpmpp_2s_ancestral,
    sample_dpmpp_3m_sde,
    sample_dpmpp_3m_sde_gpu,
    sample_dpmpp_sde,
    sample_dpmpp_sde_gpu,
)
from .solvers_euler import (
    sample_ddim,
    sample_ddpm,
    sample_dpm_2,
    sample_dpm_2_ancestral,
    sample_euler,
    sample_euler_ancestral,
    sample_heun,
    sample_heunpp2,
    sample_lcm,
    sample_lms,
)
from .solvers_multistep import (
    deis_coefficients,
    sample_deis,
    sample_ipndm,
    sample_ipndm_v,
    sample_uni_pc,
    sample_uni_pc_bh2,
)

_CORE_FAMILIES = (solvers_euler, solvers_dpm, solvers_dpmpp, solvers_multistep)

__all__ = [
    "SAMPLER_NAMES",
    "EXTRA_SAMPLER_NAMES",
    "DISCARD_PENULTIMATE_SIGMA_SAMPLERS",
    "UNSUPPORTED",
    "get_sampler",
    "is_supported",
    "to_d",
    "get_ancestral_step",
    "append_dims",
    "denoise_with_uncond",
    "BrownianTreeNoiseSampler",
    "brownian_noise_sampler",
    "default_noise_sampler",
    "deis_coefficients",
    *(name for module in _CORE_FAMILIES for name in module.__all__ if name.startswith("sample_")),
]

# ComfyUI's KSAMPLER_NAMES followed by ["ddim", "uni_pc", "uni_pc_bh2"], in its order.
SAMPLER_NAMES: tuple[str, ...] = (
    "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2",
    "dpm_2", "dpm_2_ancestral", "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral",
    "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis",
    "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
    "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece",
    "ddim", "uni_pc", "uni_pc_bh2",
)

# Provided by samplers_extra.EXTRA_SAMPLERS.
EXTRA_SAMPLER_NAMES: frozenset[str] = frozenset({
    "euler_cfg_pp", "euler_ancestral_cfg_pp", "dpmpp_2s_ancestral_cfg_pp", "dpmpp_2m_cfg_pp",
    "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
    "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece",
})

# KSampler computes one extra step and drops the penultimate sigma for these.
DISCARD_PENULTIMATE_SIGMA_SAMPLERS: frozenset[str] = frozenset(
    {"dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"}
)

Sampler = Callable[..., torch.Tensor]


def _lookup(name: str) -> Sampler | None:
    if name not in SAMPLER_NAMES:
        return None
    if name in EXTRA_SAMPLER_NAMES:
        return EXTRA_SAMPLERS.get(name)
    for module in _CORE_FAMILIES:
        fn = getattr(module, f"sample_{name}", None)
        if fn is not None:
            return fn
    return None


def is_supported(name: str) -> bool:
    """True if ``name`` is a ComfyUI sampler name that mixgraph implements."""
    return _lookup(name) is not None


def get_sampler(name: str) -> Sampler:
    """The ``sample_<name>`` function; a clear error for unknown or unimplemented names."""
    if name not in SAMPLER_NAMES:
        raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLER_NAMES)}")
    fn = _lookup(name)
    if fn is None:
        raise NotImplementedError(f"sampler {name!r}: not supported yet")
    return fn


# ComfyUI names without an implementation (empty today; kept so callers can list the gaps).
UNSUPPORTED: frozenset[str] = frozenset(n for n in SAMPLER_NAMES if not is_supported(n))
