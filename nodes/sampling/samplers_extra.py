"""The newer ComfyUI samplers, gathered under one name: CFG++ variants, RES multistep, gradient
estimation, ER-SDE, SEEDS and SA-Solver.

The algorithms live in family modules, each with its paper citations: ``solvers_cfgpp.py``
(CFG++ forms of Euler, Euler ancestral, DPM-Solver++ 2S/2M), ``solvers_res.py`` (RES multistep,
gradient estimation), ``solvers_sde.py`` (ER-SDE, SEEDS) and ``solvers_sa.py`` (SA-Solver). This
module re-exports them and maps each ComfyUI name to its function in ``EXTRA_SAMPLERS``, which the
registry in ``samplers.py`` reads for the names in ``EXTRA_SAMPLER_NAMES``.

Same contract as ``samplers.py`` (k-diffusion's). Every sampler here works in the
variance-exploding parameterisation ``x = x0 + sigma * eps`` (``alpha = 1``,
``lambda = -log(sigma)``); ComfyUI's flow ("CONST") branch is left out, as mixgraph has no such
model. Defaults follow ComfyUI 0.3.64.
"""

from __future__ import annotations

from typing import Callable

import torch

from .solvers_cfgpp import (
    sample_dpmpp_2m_cfg_pp,
    sample_dpmpp_2s_ancestral_cfg_pp,
    sample_euler_ancestral_cfg_pp,
    sample_euler_cfg_pp,
)
from .solvers_res import (
    sample_gradient_estimation,
    sample_gradient_estimation_cfg_pp,
    sample_res_multistep,
    sample_res_multistep_ancestral,
    sample_res_multistep_ancestral_cfg_pp,
    sample_res_multistep_cfg_pp,
)
from .solvers_sa import (
    sa_solver_b_coeffs,
    sa_solver_default_tau,
    sa_solver_tau_interval,
    sample_sa_solver,
    sample_sa_solver_pece,
)
from .solvers_sde import er_sde_default_noise_scaler, sample_er_sde, sample_seeds_2, sample_seeds_3

__all__ = [
    "sample_euler_cfg_pp",
    "sample_euler_ancestral_cfg_pp",
    "sample_dpmpp_2s_ancestral_cfg_pp",
    "sample_dpmpp_2m_cfg_pp",
    "sample_res_multistep",
    "sample_res_multistep_cfg_pp",
    "sample_res_multistep_ancestral",
    "sample_res_multistep_ancestral_cfg_pp",
    "sample_gradient_estimation",
    "sample_gradient_estimation_cfg_pp",
    "sample_er_sde",
    "sample_seeds_2",
    "sample_seeds_3",
    "sample_sa_solver",
    "sample_sa_solver_pece",
    "EXTRA_SAMPLERS",
    "er_sde_default_noise_scaler",
    "sa_solver_b_coeffs",
    "sa_solver_tau_interval",
    "sa_solver_default_tau",
]

EXTRA_SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {
    "euler_cfg_pp": sample_euler_cfg_pp,
    "euler_ancestral_cfg_pp": sample_euler_ancestral_cfg_pp,
    "dpmpp_2s_ancestral_cfg_pp": sample_dpmpp_2s_ancestral_cfg_pp,
    "dpmpp_2m_cfg_pp": sample_dpmpp_2m_cfg_pp,
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
}
