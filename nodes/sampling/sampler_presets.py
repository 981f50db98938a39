"""SAMPLER payloads of ComfyUI's ``Sampler*`` nodes: which registry sampler, with which options
(``comfy_extras/nodes_custom_sampler.py``, ComfyUI 0.3.64). Each function returns a
``payloads.sampling.Sampler``; the option names are the keyword arguments of the sampler
functions in ``solvers_*.py``."""

from __future__ import annotations

from mixgraph.nodes.payloads.sampling import Sampler
from .samplers import get_sampler
from .schedules import DiscreteSchedule
from .solvers_sa import sa_solver_tau_interval

__all__ = [
    "select_sampler",
    "sde_sampler",
    "er_sde_sampler",
    "sa_solver_sampler",
    "reverse_time_sde_noise_scaler",
    "ER_SDE_SOLVER_TYPES",
    "NOISE_DEVICES",
]

NOISE_DEVICES = ("gpu", "cpu")
ER_SDE_SOLVER_TYPES = ("ER-SDE", "Reverse-time SDE", "ODE")


def _opts(**kw) -> tuple:
    return tuple(kw.items())


def select_sampler(name: str, **options) -> Sampler:
    """KSamplerSelect (no options) and the fixed-name Sampler* nodes; unknown names fail here."""
    get_sampler(name)
    return Sampler(name, _opts(**options))


def sde_sampler(base: str, noise_device: str, **options) -> Sampler:
    """The Brownian-tree SDE samplers: ``noise_device`` "cpu" → ``base`` (tree on the CPU),
    "gpu" → ``base_gpu`` (tree on x's device)."""
    if noise_device not in NOISE_DEVICES:
        raise ValueError(f"noise_device {noise_device!r}: one of {', '.join(NOISE_DEVICES)}")
    return select_sampler(base if noise_device == "cpu" else f"{base}_gpu", **options)


class reverse_time_sde_noise_scaler:
    """ER-SDE noise-scale function of the reverse-time SDE with stochastic strength η:
    φ(λ) = λ^(η+1) (η = 0 is the probability-flow ODE). A class, not a closure, so the SAMPLER
    payload compares and hashes by value."""

    def __init__(self, eta: float):
        self.eta = float(eta)

    def __call__(self, x):
        return x ** (self.eta + 1)

    def __eq__(self, other):
        return isinstance(other, reverse_time_sde_noise_scaler) and other.eta == self.eta

    def __hash__(self):
        return hash(("reverse_time_sde", self.eta))


def er_sde_sampler(solver_type: str, max_stage: int, eta: float, s_noise: float) -> Sampler:
    """SamplerER_SDE: "ER-SDE" uses the solver's default noise scaler; "Reverse-time SDE" φ(λ) =
    λ^(η+1); "ODE" (or reverse-time with η = 0) is η = 0 and no noise."""
    if solver_type not in ER_SDE_SOLVER_TYPES:
        raise ValueError(f"solver_type {solver_type!r}: one of {', '.join(ER_SDE_SOLVER_TYPES)}")
    if solver_type == "ODE" or (solver_type == "Reverse-time SDE" and eta == 0):
        eta, s_noise = 0.0, 0.0
    scaler = None if solver_type == "ER-SDE" else reverse_time_sde_noise_scaler(eta)
    return select_sampler("er_sde", s_noise=s_noise, noise_scaler=scaler, max_stage=max_stage)


def sa_solver_sampler(schedule: DiscreteSchedule, eta: float, sde_start_percent: float,
                      sde_end_percent: float, s_noise: float, predictor_order: int,
                      corrector_order: int, use_pece: bool, simple_order_2: bool) -> Sampler:
    """SamplerSASolver: τ = η between the model's sigmas at the two sampling percents."""
    tau = sa_solver_tau_interval(schedule.percent_to_sigma(sde_start_percent),
                                 schedule.percent_to_sigma(sde_end_percent), eta=eta)
    return select_sampler("sa_solver", tau_func=tau, s_noise=s_noise,
                          predictor_order=predictor_order, corrector_order=corrector_order,
                          use_pece=use_pece, simple_order_2=simple_order_2)
