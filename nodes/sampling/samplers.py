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
(never from this module, so there is no import cycle); each cites its papers:

* ``solvers_euler``: euler, ddim, euler_ancestral, heun, heunpp2, dpm_2(_ancestral), lms, ddpm,
  lcm;
* ``solvers_dpm``: dpm_fast, dpm_adaptive (DPM-Solver);
* ``solvers_dpmpp``: the DPM-Solver++ family (2s_ancestral, sde, 2m, 2m_sde, 3m_sde, ``*_gpu``);
* ``solvers_multistep``: ipndm, ipndm_v, deis, uni_pc, uni_pc_bh2;
* ``solvers_cfgpp``: CFG++ forms of euler, euler_ancestral, dpmpp_2s_ancestral, dpmpp_2m, and
  cfgpp_ud10_ab (CFG++ Euler with AB2 history; keeps the cfg-1 optimisation, as ComfyUI);
* ``solvers_res``: res_multistep (+ ancestral, CFG++), gradient_estimation (+ CFG++);
* ``solvers_sde``: er_sde, seeds_2, seeds_3, exp_heun_2_x0, exp_heun_2_x0_sde;
* ``solvers_sa``: sa_solver, sa_solver_pece;
* ``solvers_extra``: lcm_upscale, euler_pp (node-only: ``NODE_ONLY_SAMPLERS``, not in KSampler's list).

The samplers work in the variance-exploding parameterisation ``x = x0 + sigma * eps``
(``alpha = 1``, ``lambda = -log(sigma)``). On flow-matching models (ComfyUI's CONST) the samplers
ComfyUI branches for take their flow form (``alpha = 1 - sigma``; see ``sampler_utils``), the ODE
samplers in sigma need none, and er_sde, seeds_2/3, exp_heun_2_x0(_sde) and sa_solver(_pece)
raise "not supported yet on flow-matching models". They find the parameterisation on the
denoiser (``sampler_utils.model_sampling_of``). Defaults follow ComfyUI 0.3.64.

``SAMPLERS`` below is the one registry: every name of ComfyUI's list, in its order, mapped to
exactly one function. Importing this module fails, naming the names, if the two ever differ.
Every ``sample_*`` function is importable from here as well as from its family.
"""

from __future__ import annotations

from typing import Callable

import torch

from .noise import BrownianTreeNoiseSampler, brownian_noise_sampler, default_noise_sampler
from .sampler_utils import append_dims, denoise_with_uncond, get_ancestral_step, to_d
from .solvers_cfgpp import (
    sample_cfgpp_history,
    sample_cfgpp_ud10_ab,
    sample_dpmpp_2m_cfg_pp,
    sample_dpmpp_2s_ancestral_cfg_pp,
    sample_euler_ancestral_cfg_pp,
    sample_euler_cfg_pp,
)
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
from .solvers_res import (
    sample_gradient_estimation,
    sample_gradient_estimation_cfg_pp,
    sample_res_multistep,
    sample_res_multistep_ancestral,
    sample_res_multistep_ancestral_cfg_pp,
    sample_res_multistep_cfg_pp,
)
from .solvers_sa import sample_sa_solver, sample_sa_solver_pece
from .solvers_extra import sample_euler_pp, sample_lcm_upscale
from .solvers_sde import (
    sample_er_sde,
    sample_exp_heun_2_x0,
    sample_exp_heun_2_x0_sde,
    sample_seeds_2,
    sample_seeds_3,
)

Sampler = Callable[..., torch.Tensor]

# ComfyUI's KSAMPLER_NAMES (its newest list, with "cfgpp_ud10_ab" after "deis") followed by
# ["ddim", "uni_pc", "uni_pc_bh2"], in its order.
SAMPLER_NAMES: tuple[str, ...] = (
    "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2",
    "exp_heun_2_x0", "exp_heun_2_x0_sde", "dpm_2", "dpm_2_ancestral", "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral",
    "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis",
    "cfgpp_ud10_ab", "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
    "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece",
    "ddim", "uni_pc", "uni_pc_bh2",
)

SAMPLERS: dict[str, Sampler] = {
    "euler": sample_euler,
    "euler_cfg_pp": sample_euler_cfg_pp,
    "euler_ancestral": sample_euler_ancestral,
    "euler_ancestral_cfg_pp": sample_euler_ancestral_cfg_pp,
    "heun": sample_heun,
    "heunpp2": sample_heunpp2,
    "exp_heun_2_x0": sample_exp_heun_2_x0,
    "exp_heun_2_x0_sde": sample_exp_heun_2_x0_sde,
    "dpm_2": sample_dpm_2,
    "dpm_2_ancestral": sample_dpm_2_ancestral,
    "lms": sample_lms,
    "dpm_fast": sample_dpm_fast,
    "dpm_adaptive": sample_dpm_adaptive,
    "dpmpp_2s_ancestral": sample_dpmpp_2s_ancestral,
    "dpmpp_2s_ancestral_cfg_pp": sample_dpmpp_2s_ancestral_cfg_pp,
    "dpmpp_sde": sample_dpmpp_sde,
    "dpmpp_sde_gpu": sample_dpmpp_sde_gpu,
    "dpmpp_2m": sample_dpmpp_2m,
    "dpmpp_2m_cfg_pp": sample_dpmpp_2m_cfg_pp,
    "dpmpp_2m_sde": sample_dpmpp_2m_sde,
    "dpmpp_2m_sde_gpu": sample_dpmpp_2m_sde_gpu,
    "dpmpp_2m_sde_heun": sample_dpmpp_2m_sde_heun,
    "dpmpp_2m_sde_heun_gpu": sample_dpmpp_2m_sde_heun_gpu,
    "dpmpp_3m_sde": sample_dpmpp_3m_sde,
    "dpmpp_3m_sde_gpu": sample_dpmpp_3m_sde_gpu,
    "ddpm": sample_ddpm,
    "lcm": sample_lcm,
    "ipndm": sample_ipndm,
    "ipndm_v": sample_ipndm_v,
    "deis": sample_deis,
    "cfgpp_ud10_ab": sample_cfgpp_ud10_ab,
    "res_multistep": sample_res_multistep,
    "res_multistep_cfg_pp": sample_res_multistep_cfg_pp,
    "res_multistep_ancestral": sample_res_multistep_ancestral,
    "res_multistep_ancestral_cfg_pp": sample_res_multistep_ancestral_cfg_pp,
    "gradient_estimation": sample_gradient_estimation,
    "gradient_estimation_cfg_pp": sample_gradient_estimation_cfg_pp,
    "er_sde": sample_er_sde,
    "seeds_2": sample_seeds_2,
    "seeds_3": sample_seeds_3,
    "sa_solver": sample_sa_solver,
    "sa_solver_pece": sample_sa_solver_pece,
    "ddim": sample_ddim,
    "uni_pc": sample_uni_pc,
    "uni_pc_bh2": sample_uni_pc_bh2,
}


def _check_registry() -> None:
    missing = [n for n in SAMPLER_NAMES if n not in SAMPLERS]
    unknown = [n for n in SAMPLERS if n not in SAMPLER_NAMES]
    if missing or unknown or tuple(SAMPLERS) != SAMPLER_NAMES:
        raise ImportError(
            f"nodes.sampling.samplers: SAMPLERS must map each of ComfyUI's sampler names, in its "
            f"order, to one function; without a function: {missing or 'none'}; not ComfyUI "
            f"names: {unknown or 'none'}")


_check_registry()

# Samplers reached only through their own Sampler* nodes (not in KSampler's list): one function
# each, in ``solvers_extra``.
NODE_ONLY_SAMPLERS: dict[str, Sampler] = {"lcm_upscale": sample_lcm_upscale, "euler_pp": sample_euler_pp}

# KSampler computes one extra step and drops the penultimate sigma for these.
DISCARD_PENULTIMATE_SIGMA_SAMPLERS: frozenset[str] = frozenset(
    {"dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"}
)

__all__ = [
    "SAMPLER_NAMES",
    "SAMPLERS",
    "NODE_ONLY_SAMPLERS",
    "DISCARD_PENULTIMATE_SIGMA_SAMPLERS",
    "Sampler",
    "get_sampler",
    "to_d",
    "get_ancestral_step",
    "append_dims",
    "denoise_with_uncond",
    "BrownianTreeNoiseSampler",
    "brownian_noise_sampler",
    "default_noise_sampler",
    "deis_coefficients",
    "sample_cfgpp_history",
    *(f"sample_{name}" for name in SAMPLERS),
]


def get_sampler(name: str) -> Sampler:
    """The function registered for ComfyUI sampler ``name``; ValueError for any other name."""
    fn = SAMPLERS.get(name) or NODE_ONLY_SAMPLERS.get(name)
    if fn is None:
        raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLER_NAMES)}")
    return fn
