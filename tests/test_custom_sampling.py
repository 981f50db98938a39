"""The custom-sampling node group: specs against ComfyUI 0.3.64's (hand-copied below), schedule
values against reference formulas and numbers, the sigma tools on small tensors, the guidance
rules on a closed-form model, and end-to-end runs on a tiny generated SD1.5 checkpoint
(SamplerCustom / SamplerCustomAdvanced reproduce KSampler)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.sampling import custom_sampling_nodes  # noqa: F401  (registers the nodes)
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.sampling import Guidance, Sampler
from mixgraph.nodes.sampling import sigma_tools as T
from mixgraph.nodes.sampling.guidance import build_denoiser
from mixgraph.nodes.sampling.ksampler import add_noise, sample, sample_custom
from mixgraph.nodes.sampling.noise import initial_noise, prepare_noise
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.nodes.sampling.samplers import SAMPLER_NAMES
from mixgraph.nodes.sampling.schedules import SCHEDULER_NAMES, DiscreteSchedule
from tests.fixtures.sampler_models import UNetSeam

SEED_MAX = 0xFFFFFFFFFFFFFFFF
SCHED = DiscreteSchedule()

# --------------------------------------------------------------------------------- specs

# name: ([(input, type, default, min, max, options)], [(output type, output name)])
# Copied by hand from ComfyUI 0.3.64's INPUT_TYPES / define_schema; None = not set.
SPECS = {
    "BasicScheduler": ([("model", "MODEL", None, None, None, None),
                        ("scheduler", "COMBO", "simple", None, None, SCHEDULER_NAMES),
                        ("steps", "INT", 20, 1, 10000, None),
                        ("denoise", "FLOAT", 1.0, 0.0, 1.0, None)], [("SIGMAS", "SIGMAS")]),
    "KarrasScheduler": ([("steps", "INT", 20, 1, 10000, None),
                         ("sigma_max", "FLOAT", 14.614642, 0.0, 5000.0, None),
                         ("sigma_min", "FLOAT", 0.0291675, 0.0, 5000.0, None),
                         ("rho", "FLOAT", 7.0, 0.0, 100.0, None)], [("SIGMAS", "SIGMAS")]),
    "ExponentialScheduler": ([("steps", "INT", 20, 1, 10000, None),
                              ("sigma_max", "FLOAT", 14.614642, 0.0, 5000.0, None),
                              ("sigma_min", "FLOAT", 0.0291675, 0.0, 5000.0, None)],
                             [("SIGMAS", "SIGMAS")]),
    "PolyexponentialScheduler": ([("steps", "INT", 20, 1, 10000, None),
                                  ("sigma_max", "FLOAT", 14.614642, 0.0, 5000.0, None),
                                  ("sigma_min", "FLOAT", 0.0291675, 0.0, 5000.0, None),
                                  ("rho", "FLOAT", 1.0, 0.0, 100.0, None)], [("SIGMAS", "SIGMAS")]),
    "LaplaceScheduler": ([("steps", "INT", 20, 1, 10000, None),
                          ("sigma_max", "FLOAT", 14.614642, 0.0, 5000.0, None),
                          ("sigma_min", "FLOAT", 0.0291675, 0.0, 5000.0, None),
                          ("mu", "FLOAT", 0.0, -10.0, 10.0, None),
                          ("beta", "FLOAT", 0.5, 0.0, 10.0, None)], [("SIGMAS", "SIGMAS")]),
    "VPScheduler": ([("steps", "INT", 20, 1, 10000, None),
                     ("beta_d", "FLOAT", 19.9, 0.0, 5000.0, None),
                     ("beta_min", "FLOAT", 0.1, 0.0, 5000.0, None),
                     ("eps_s", "FLOAT", 0.001, 0.0, 1.0, None)], [("SIGMAS", "SIGMAS")]),
    "BetaSamplingScheduler": ([("model", "MODEL", None, None, None, None),
                               ("steps", "INT", 20, 1, 10000, None),
                               ("alpha", "FLOAT", 0.6, 0.0, 50.0, None),
                               ("beta", "FLOAT", 0.6, 0.0, 50.0, None)], [("SIGMAS", "SIGMAS")]),
    "SDTurboScheduler": ([("model", "MODEL", None, None, None, None),
                          ("steps", "INT", 1, 1, 10, None),
                          ("denoise", "FLOAT", 1.0, 0.0, 1.0, None)], [("SIGMAS", "SIGMAS")]),
    "AlignYourStepsScheduler": ([("model_type", "COMBO", "SD1", None, None, ("SD1", "SDXL", "SVD")),
                                 ("steps", "INT", 10, 1, 10000, None),
                                 ("denoise", "FLOAT", 1.0, 0.0, 1.0, None)], [("SIGMAS", "SIGMAS")]),
    "OptimalStepsScheduler": ([("model_type", "COMBO", "FLUX", None, None,
                                ("FLUX", "Wan", "Chroma")),
                               ("steps", "INT", 20, 3, 1000, None),
                               ("denoise", "FLOAT", 1.0, 0.0, 1.0, None)], [("SIGMAS", "SIGMAS")]),
    "SplitSigmas": ([("sigmas", "SIGMAS", None, None, None, None),
                     ("step", "INT", 0, 0, 10000, None)],
                    [("SIGMAS", "high_sigmas"), ("SIGMAS", "low_sigmas")]),
    "SplitSigmasDenoise": ([("sigmas", "SIGMAS", None, None, None, None),
                            ("denoise", "FLOAT", 1.0, 0.0, 1.0, None)],
                           [("SIGMAS", "high_sigmas"), ("SIGMAS", "low_sigmas")]),
    "FlipSigmas": ([("sigmas", "SIGMAS", None, None, None, None)], [("SIGMAS", "SIGMAS")]),
    "SetFirstSigma": ([("sigmas", "SIGMAS", None, None, None, None),
                       ("sigma", "FLOAT", 136.0, 0.0, 20000.0, None)], [("SIGMAS", "SIGMAS")]),
    "ExtendIntermediateSigmas": ([("sigmas", "SIGMAS", None, None, None, None),
                                  ("steps", "INT", 2, 1, 100, None),
                                  ("start_at_sigma", "FLOAT", -1.0, -1.0, 20000.0, None),
                                  ("end_at_sigma", "FLOAT", 12.0, 0.0, 20000.0, None),
                                  ("spacing", "COMBO", "linear", None, None,
                                   ("linear", "cosine", "sine"))], [("SIGMAS", "SIGMAS")]),
    "SamplingPercentToSigma": ([("model", "MODEL", None, None, None, None),
                                ("sampling_percent", "FLOAT", 0.0, 0.0, 1.0, None),
                                ("return_actual_sigma", "BOOLEAN", False, None, None, None)],
                               [("FLOAT", "sigma_value")]),
    "KSamplerSelect": ([("sampler_name", "COMBO", "euler", None, None, SAMPLER_NAMES)],
                       [("SAMPLER", "SAMPLER")]),
    "SamplerEulerAncestral": ([("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                               ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None)], [("SAMPLER", "SAMPLER")]),
    "SamplerEulerAncestralCFGPP": ([("eta", "FLOAT", 1.0, 0.0, 1.0, None),
                                    ("s_noise", "FLOAT", 1.0, 0.0, 10.0, None)],
                                   [("SAMPLER", "SAMPLER")]),
    "SamplerLMS": ([("order", "INT", 4, 1, 100, None)], [("SAMPLER", "SAMPLER")]),
    "SamplerDPMPP_3M_SDE": ([("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                             ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None),
                             ("noise_device", "COMBO", "gpu", None, None, ("gpu", "cpu"))],
                            [("SAMPLER", "SAMPLER")]),
    "SamplerDPMPP_2M_SDE": ([("solver_type", "COMBO", "midpoint", None, None, ("midpoint", "heun")),
                             ("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                             ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None),
                             ("noise_device", "COMBO", "gpu", None, None, ("gpu", "cpu"))],
                            [("SAMPLER", "SAMPLER")]),
    "SamplerDPMPP_SDE": ([("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                          ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None),
                          ("r", "FLOAT", 0.5, 0.0, 100.0, None),
                          ("noise_device", "COMBO", "gpu", None, None, ("gpu", "cpu"))],
                         [("SAMPLER", "SAMPLER")]),
    "SamplerDPMPP_2S_Ancestral": ([("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                                   ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None)],
                                  [("SAMPLER", "SAMPLER")]),
    "SamplerDPMAdaptative": ([("order", "INT", 3, 2, 3, None),
                              ("rtol", "FLOAT", 0.05, 0.0, 100.0, None),
                              ("atol", "FLOAT", 0.0078, 0.0, 100.0, None),
                              ("h_init", "FLOAT", 0.05, 0.0, 100.0, None),
                              ("pcoeff", "FLOAT", 0.0, 0.0, 100.0, None),
                              ("icoeff", "FLOAT", 1.0, 0.0, 100.0, None),
                              ("dcoeff", "FLOAT", 0.0, 0.0, 100.0, None),
                              ("accept_safety", "FLOAT", 0.81, 0.0, 100.0, None),
                              ("eta", "FLOAT", 0.0, 0.0, 100.0, None),
                              ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None)], [("SAMPLER", "SAMPLER")]),
    "SamplerER_SDE": ([("solver_type", "COMBO", "ER-SDE", None, None,
                        ("ER-SDE", "Reverse-time SDE", "ODE")),
                       ("max_stage", "INT", 3, 1, 3, None),
                       ("eta", "FLOAT", 1.0, 0.0, 100.0, None),
                       ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None)], [("SAMPLER", "SAMPLER")]),
    "SamplerSASolver": ([("model", "MODEL", None, None, None, None),
                         ("eta", "FLOAT", 1.0, 0.0, 10.0, None),
                         ("sde_start_percent", "FLOAT", 0.2, 0.0, 1.0, None),
                         ("sde_end_percent", "FLOAT", 0.8, 0.0, 1.0, None),
                         ("s_noise", "FLOAT", 1.0, 0.0, 100.0, None),
                         ("predictor_order", "INT", 3, 1, 6, None),
                         ("corrector_order", "INT", 4, 0, 6, None),
                         ("use_pece", "BOOLEAN", False, None, None, None),
                         ("simple_order_2", "BOOLEAN", False, None, None, None)],
                        [("SAMPLER", "SAMPLER")]),
    "RandomNoise": ([("noise_seed", "INT", 0, 0, SEED_MAX, None)], [("NOISE", "NOISE")]),
    "DisableNoise": ([], [("NOISE", "NOISE")]),
    "AddNoise": ([("model", "MODEL", None, None, None, None), ("noise", "NOISE", None, None, None, None),
                  ("sigmas", "SIGMAS", None, None, None, None),
                  ("latent_image", "LATENT", None, None, None, None)], [("LATENT", "LATENT")]),
    "BasicGuider": ([("model", "MODEL", None, None, None, None),
                     ("conditioning", "CONDITIONING", None, None, None, None)], [("GUIDER", "GUIDER")]),
    "CFGGuider": ([("model", "MODEL", None, None, None, None),
                   ("positive", "CONDITIONING", None, None, None, None),
                   ("negative", "CONDITIONING", None, None, None, None),
                   ("cfg", "FLOAT", 8.0, 0.0, 100.0, None)], [("GUIDER", "GUIDER")]),
    "DualCFGGuider": ([("model", "MODEL", None, None, None, None),
                       ("cond1", "CONDITIONING", None, None, None, None),
                       ("cond2", "CONDITIONING", None, None, None, None),
                       ("negative", "CONDITIONING", None, None, None, None),
                       ("cfg_conds", "FLOAT", 8.0, 0.0, 100.0, None),
                       ("cfg_cond2_negative", "FLOAT", 8.0, 0.0, 100.0, None),
                       ("style", "COMBO", "regular", None, None, ("regular", "nested"))],
                      [("GUIDER", "GUIDER")]),
    "PerpNegGuider": ([("model", "MODEL", None, None, None, None),
                       ("positive", "CONDITIONING", None, None, None, None),
                       ("negative", "CONDITIONING", None, None, None, None),
                       ("empty_conditioning", "CONDITIONING", None, None, None, None),
                       ("cfg", "FLOAT", 8.0, 0.0, 100.0, None),
                       ("neg_scale", "FLOAT", 1.0, 0.0, 100.0, None)], [("GUIDER", "GUIDER")]),
    "SamplerCustom": ([("model", "MODEL", None, None, None, None),
                       ("add_noise", "BOOLEAN", True, None, None, None),
                       ("noise_seed", "INT", 0, 0, SEED_MAX, None),
                       ("cfg", "FLOAT", 8.0, 0.0, 100.0, None),
                       ("positive", "CONDITIONING", None, None, None, None),
                       ("negative", "CONDITIONING", None, None, None, None),
                       ("sampler", "SAMPLER", None, None, None, None),
                       ("sigmas", "SIGMAS", None, None, None, None),
                       ("latent_image", "LATENT", None, None, None, None)],
                      [("LATENT", "output"), ("LATENT", "denoised_output")]),
    "SamplerCustomAdvanced": ([("noise", "NOISE", None, None, None, None),
                               ("guider", "GUIDER", None, None, None, None),
                               ("sampler", "SAMPLER", None, None, None, None),
                               ("sigmas", "SIGMAS", None, None, None, None),
                               ("latent_image", "LATENT", None, None, None, None)],
                              [("LATENT", "output"), ("LATENT", "denoised_output")]),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_custom_sampling_node_spec_matches_comfyui(name):
    spec = REGISTRY.get(name)
    want_inputs, want_outputs = SPECS[name]
    got = [(n, i.type, i.default if i.has_default else None, i.min, i.max,
            tuple(i.option_list()) if i.type == "COMBO" else None) for n, i in spec.inputs]
    assert got == want_inputs
    assert [(o.type, o.name) for o in spec.outputs] == want_outputs


def test_custom_sampling_seed_inputs_have_control_after_generate():
    for name, inp in (("RandomNoise", "noise_seed"), ("SamplerCustom", "noise_seed")):
        assert ("control_after_generate", True) in REGISTRY.get(name).input_map[inp].extra


def test_custom_sampling_nodes_that_run_the_unet_declare_model_precision():
    assert REGISTRY.get("SamplerCustomAdvanced").precision_types == ("MODEL",)
    assert REGISTRY.get("SamplerCustom").precision_types == ("MODEL",)


# ------------------------------------------------------------------------------ schedules


def test_basic_scheduler_normal_reference_values():
    s = T.basic_scheduler(SCHED, "normal", 4)
    assert s.tolist() == pytest.approx([14.61464, 2.91831, 0.93236, 0.02917, 0.0], abs=1e-5)


def test_basic_scheduler_denoise_keeps_tail_of_longer_schedule_and_zero_is_empty():
    full = T.basic_scheduler(SCHED, "karras", 10)
    assert torch.equal(T.basic_scheduler(SCHED, "karras", 5, 0.5), full[-6:])
    assert len(T.basic_scheduler(SCHED, "karras", 5, 0.0)) == 0


def test_karras_and_exponential_schedulers_reference_sums():
    k = T.karras_sigmas(20, 14.614642, 0.0291675, 7.0)
    assert float(k[0]) == pytest.approx(14.614643, abs=2e-5)
    assert float(k[1]) == pytest.approx(11.725368, abs=2e-5)
    assert float(k.sum()) == pytest.approx(66.509695, abs=1e-3)
    assert float(T.exponential_sigmas(20, 14.614642, 0.0291675).sum()) == pytest.approx(
        52.295978, abs=1e-3)


def test_polyexponential_with_rho_one_is_exponential_and_matches_formula():
    assert torch.allclose(T.polyexponential_sigmas(7, 10.0, 0.1, 1.0),
                          T.exponential_sigmas(7, 10.0, 0.1), rtol=1e-6)
    ramp = np.linspace(1, 0, 5) ** 2.0
    ref = np.exp(ramp * (math.log(10.0) - math.log(0.1)) + math.log(0.1))
    got = T.polyexponential_sigmas(5, 10.0, 0.1, 2.0)
    assert got[:-1].tolist() == pytest.approx(ref.tolist(), rel=1e-5) and float(got[-1]) == 0


def test_laplace_scheduler_formula_clamped_without_final_zero():
    u = np.linspace(0, 1, 6)
    lmb = 0.0 - 0.5 * np.sign(0.5 - u) * np.log(1 - 2 * np.abs(0.5 - u) + 1e-5)
    ref = np.clip(np.exp(lmb), 0.0291675, 14.614642)
    got = T.laplace_sigmas(6, 14.614642, 0.0291675, 0.0, 0.5)
    assert len(got) == 6 and got.tolist() == pytest.approx(ref.tolist(), rel=1e-5)


def test_vp_scheduler_formula():
    t = np.linspace(1, 1e-3, 4)
    ref = np.sqrt(np.expm1(19.9 * t**2 / 2 + 0.1 * t))
    got = T.vp_sigmas(4, 19.9, 0.1, 1e-3)
    assert got[:-1].tolist() == pytest.approx(ref.tolist(), rel=1e-5) and float(got[-1]) == 0
    assert float(got[0]) == pytest.approx(152.167, abs=1e-3)


def test_sd_turbo_scheduler_timesteps():
    one = T.sd_turbo_sigmas(SCHED, 1, 1.0)
    assert one.tolist() == pytest.approx([14.614641, 0.0], abs=1e-5)
    four = T.sd_turbo_sigmas(SCHED, 4, 1.0)
    assert four[:-1].tolist() == pytest.approx(
        [float(SCHED.sigmas[t]) for t in (999, 899, 799, 699)], rel=1e-6)
    half = T.sd_turbo_sigmas(SCHED, 2, 0.5)  # starts at index 5: timestep 499
    assert float(half[0]) == pytest.approx(float(SCHED.sigmas[499]), rel=1e-6)


def test_align_your_steps_table_and_interpolation():
    ten = T.ays_sigmas("SD1", 10, 1.0)
    assert ten.tolist()[:3] == pytest.approx([14.6146412293, 6.4745760956, 3.8636745985], rel=1e-6)
    assert float(ten[-1]) == 0 and len(ten) == 11
    twenty = T.ays_sigmas("SDXL", 20, 1.0)
    assert len(twenty) == 21 and float(twenty[0]) == pytest.approx(14.6146412293, rel=1e-6)
    # every second point of the 20-step resampling is a table point (log-linear on an even grid)
    assert twenty[2:-1:2].tolist() == pytest.approx(
        [6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945, 0.8620721141, 0.5550693289,
         0.3798540708, 0.2332364134, 0.1114188177], rel=1e-5)
    assert float(twenty[1]) == pytest.approx(math.sqrt(14.6146412293 * 6.3184485287), rel=1e-5)
    tail = T.ays_sigmas("SD1", 10, 0.5)  # round(10 * 0.5) = 5 steps, the table's tail
    assert tail[:-1].tolist() == pytest.approx(
        [1.3943805092, 0.9642583904, 0.6523686016, 0.3977456272, 0.1515232662], rel=1e-6)


def test_optimal_steps_interpolates_the_flux_table():
    s = T.optimal_steps_sigmas("FLUX", 10, 1.0)
    assert s[:-1].tolist() == pytest.approx(
        [0.9968, 0.9886, 0.9819, 0.975, 0.966, 0.9471, 0.9158, 0.8287, 0.5512, 0.2808], rel=1e-6)
    assert len(T.optimal_steps_sigmas("Wan", 5, 1.0)) == 6


def test_sampling_percent_to_sigma():
    assert T.percent_to_sigma(SCHED, 0.0) == pytest.approx(999999999.9)
    assert T.percent_to_sigma(SCHED, 0.0, actual=True) == pytest.approx(14.614642, abs=1e-5)
    assert T.percent_to_sigma(SCHED, 1.0, actual=True) == pytest.approx(0.0291675, abs=1e-6)
    assert T.percent_to_sigma(SCHED, 0.5) == pytest.approx(float(SCHED.sigma(torch.tensor(499.5))))


# ---------------------------------------------------------------------------- sigma tools

S5 = torch.tensor([10.0, 5.0, 2.0, 1.0, 0.0])


def test_split_sigmas_shares_the_split_point():
    hi, lo = T.split_sigmas(S5, 2)
    assert hi.tolist() == [10.0, 5.0, 2.0] and lo.tolist() == [2.0, 1.0, 0.0]


def test_split_sigmas_denoise_rounds_steps_and_zero_gives_empty_high():
    hi, lo = T.split_sigmas_denoise(S5, 0.5)  # round(4 * 0.5) = 2 low steps
    assert hi.tolist() == [10.0, 5.0, 2.0] and lo.tolist() == [2.0, 1.0, 0.0]
    hi, lo = T.split_sigmas_denoise(S5, 0.0)
    assert hi.tolist() == [] and lo.tolist() == [0.0]


def test_flip_sigmas_replaces_leading_zero_and_keeps_input():
    out = T.flip_sigmas(S5)
    assert out.tolist() == pytest.approx([0.0001, 1.0, 2.0, 5.0, 10.0])
    assert S5[-1] == 0 and len(T.flip_sigmas(torch.tensor([]))) == 0


def test_set_first_sigma_copies():
    out = T.set_first_sigma(S5, 136.0)
    assert out.tolist() == [136.0, 5.0, 2.0, 1.0, 0.0] and S5[0] == 10.0


@pytest.mark.parametrize("spacing,fracs", [("linear", [1 / 3, 2 / 3]),
                                           ("cosine", [0.5, math.sqrt(3) / 2]),
                                           ("sine", [1 - math.sqrt(3) / 2, 0.5])])
def test_extend_intermediate_sigmas_inside_range_only(spacing, fracs):
    out = T.extend_intermediate_sigmas(S5, 3, -1.0, 4.0, spacing)
    expect = [10.0] + [10 + f * (5 - 10) for f in fracs] + [5.0] + [5 + f * (2 - 5) for f in fracs]
    expect += [2.0, 1.0, 0.0]
    assert out.tolist() == pytest.approx(expect, rel=1e-6)
    capped = T.extend_intermediate_sigmas(S5, 2, 6.0, 0.5, "linear")
    assert capped.tolist() == pytest.approx([10.0, 5.0, 3.5, 2.0, 1.5, 1.0, 0.5, 0.0])


# ------------------------------------------------------------------------------- guidance


@dataclass
class PromptModel(UNetSeam):
    """x0 model predicting k·c + 0.1·c²·input for a cond whose context holds the value c, so
    differences of predictions are not all parallel (``k``: the model's own weight, so two models
    differ); records each UNet call's batch size."""

    k: float = 1.0
    prediction: str = "x0"
    zsnr: bool = False
    latent_scale: float = 1.0
    in_channels: int = 4
    calls: list = field(default_factory=list)

    def unet(self, x, timesteps, context, y=None, control=None):
        self.calls.append(context.shape[0] // 1)
        c = context[:, 0, 0].reshape(-1, 1, 1, 1)
        return self.k * c + 0.1 * c * c * x

    def adm(self, cond, latent_hw, negative=False):
        return None


def cond_value(v):
    return (Cond(torch.full((1, 2, 3), float(v))),)


def _predict(guidance, x=None):
    x = torch.zeros(1, 4, 4, 4) if x is None else x
    ms = ModelSampling("x0")
    den = build_denoiser(guidance, PromptModel(), x, None, ms)
    return den(x, torch.tensor([1.0]))


def test_dual_cfg_regular_and_nested_formulas():
    p1, p2, n = 3.0, 2.0, -1.0  # x = 0: predictions are the cond values
    reg = _predict(Guidance("dual_cfg", (cond_value(p1), cond_value(p2), cond_value(n)), (1.5, 4.0)))
    assert torch.allclose(reg, torch.full_like(reg, n + (p2 - n) * 4.0 + (p1 - p2) * 1.5))
    nest = _predict(Guidance("dual_cfg", (cond_value(p1), cond_value(p2), cond_value(n)), (1.5, 4.0), nested=True))
    text = p2 + (p1 - p2) * 1.5
    assert torch.allclose(nest, torch.full_like(nest, n + 4.0 * (text - n)))


def test_dual_cfg_at_cfg_one_evaluates_only_cond1():
    model = PromptModel()
    x = torch.zeros(1, 4, 4, 4)
    den = build_denoiser(Guidance("dual_cfg", (cond_value(3), cond_value(2), cond_value(-1)), (1.0, 1.0)), model, x,
                         None, ModelSampling("x0"))
    out = den(x, torch.tensor([1.0]))
    assert torch.allclose(out, torch.full_like(out, 3.0)) and model.calls == [1]


def test_perp_neg_removes_only_the_perpendicular_part():
    pos, neg, empty = 2.0, 1.0, 0.0  # parallel negative: nothing perpendicular to remove
    out = _predict(Guidance("perp_neg", (cond_value(pos), cond_value(neg), cond_value(empty)), (3.0, 1.0)))
    assert torch.allclose(out, torch.full_like(out, empty + 3.0 * (pos - empty)))
    # a non-parallel negative, checked against the closed form on the whole tensor
    x = torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)
    out = _predict(Guidance("perp_neg", (cond_value(pos), cond_value(neg), cond_value(0.5)), (3.0, 0.7)), x)
    xs = x / math.sqrt(2.0)  # the UNet sees c_in·x at σ = 1
    p, n, e = (v + 0.1 * v * v * xs for v in (pos, neg, 0.5))
    pp, nn_ = p - e, n - e
    perp = nn_ - ((nn_ * pp).sum() / pp.norm() ** 2) * pp
    assert perp.abs().max() > 0.01  # a real perpendicular part
    assert torch.allclose(out, e + 3.0 * (pp - 0.7 * perp), atol=1e-6)


def test_basic_guidance_never_evaluates_a_negative():
    model = PromptModel()
    x = torch.zeros(1, 4, 4, 4)
    den = build_denoiser(Guidance("cfg", (cond_value(2.0), ()), (1.0,)), model, x, None,
                         ModelSampling("x0"))
    assert torch.allclose(den(x, torch.tensor([1.0])), torch.full_like(x, 2.0))
    assert model.calls == [1]


# ---------------------------------------------------------------------- sampling core


def _glue_args():
    return dict(positive=cond_value(1.0), negative=cond_value(-1.0))


@pytest.mark.parametrize("sampler_name", ["euler", "euler_ancestral", "dpmpp_2m_sde", "lms"])
def test_sample_custom_with_basic_scheduler_equals_ksampler(sampler_name):
    model = PromptModel(latent_scale=0.5)
    latent = Latent(torch.zeros(2, 4, 4, 4))
    ks = sample(model, seed=7, steps=5, cfg=3.0, sampler_name=sampler_name, scheduler="karras",
                latent=latent, denoise=0.8, **_glue_args())
    sigmas = T.basic_scheduler(SCHED, "karras", 5, 0.8)
    out, den = sample_custom(model, guidance=Guidance("cfg", (cond_value(1.0), cond_value(-1.0)), (3.0,)),
                             sampler=Sampler(sampler_name), sigmas=sigmas,
                             noise=initial_noise(latent, 7), seed=7, latent=latent)
    assert torch.equal(out.samples, ks.samples)
    assert torch.allclose(den.samples, out.samples, atol=1e-4)  # last step lands on its x0


def test_sample_custom_denoised_output_is_last_x0_unscaled():
    model = PromptModel(latent_scale=0.5)
    latent = Latent(torch.zeros(1, 4, 4, 4))
    sigmas = torch.tensor([2.0, 1.0, 0.5])
    out, den = sample_custom(model, guidance=Guidance("cfg", (cond_value(1.0), ()), (1.0,)),
                             sampler=Sampler("euler"), sigmas=sigmas,
                             noise=initial_noise(latent, 3), seed=3, latent=latent)
    # Euler σ 1 → 0.5 on the scaled state x: out·s = x + (x − D)(0.5 − 1) = 0.5x + 0.5D, so
    # x = 2·out·s − D, and the model's x0 there is D = 1 + 0.1·x/sqrt(1 + 1²).
    d = den.samples * 0.5
    assert torch.allclose(d, 1.0 + 0.1 * (2 * out.samples * 0.5 - d) / math.sqrt(2), atol=1e-5)


def test_sample_custom_empty_sigmas_returns_input():
    latent = Latent(torch.randn(1, 4, 4, 4))
    out, den = sample_custom(PromptModel(), guidance=Guidance("cfg", (cond_value(1.0), ()), (1.0,)),
                             sampler=Sampler("euler"), sigmas=torch.FloatTensor([]),
                             noise=torch.zeros(1, 4, 4, 4), seed=0, latent=latent)
    assert torch.equal(out.samples, latent.samples) and den is out


def test_sample_custom_passes_sampler_options():
    model = PromptModel()
    latent = Latent(torch.zeros(1, 4, 4, 4))
    sig = T.basic_scheduler(SCHED, "normal", 4)
    kw = dict(guidance=Guidance("cfg", (cond_value(1.0), ()), (1.0,)), sigmas=sig,
              noise=initial_noise(latent, 1), seed=1, latent=latent)
    eta0, _ = sample_custom(model, sampler=Sampler("euler_ancestral", (("eta", 0.0),)), **kw)
    euler, _ = sample_custom(model, sampler=Sampler("euler"), **kw)
    default, _ = sample_custom(model, sampler=Sampler("euler_ancestral"), **kw)
    assert torch.allclose(eta0.samples, euler.samples, atol=1e-6)
    assert not torch.allclose(default.samples, euler.samples, atol=1e-3)


def test_disable_noise_then_add_noise_equals_random_noise_sampling():
    """AddNoise(RandomNoise, sigmas) + sampling with DisableNoise == sampling with the noise
    (the initial state x = latent + σ0·noise, without the max-denoise sqrt(1+σ²))."""
    model = PromptModel(latent_scale=0.5)
    latent = Latent(torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4))
    sig = T.basic_scheduler(SCHED, "karras", 4, 0.6)
    g = Guidance("cfg", (cond_value(1.0), cond_value(-1.0)), (2.0,))
    noisy = add_noise(model, initial_noise(latent, 11), sig, latent)
    assert torch.allclose(noisy.samples,
                          latent.samples + prepare_noise(latent.samples, 11)
                          * float(sig[0] - sig[-1]) / 0.5, atol=1e-5)
    # sampling from the noised latent with no extra noise, at the span's top sigma
    direct, _ = sample_custom(model, guidance=g, sampler=Sampler("euler"), sigmas=sig,
                              noise=initial_noise(latent, 11), seed=11, latent=latent)
    staged, _ = sample_custom(model, guidance=g, sampler=Sampler("euler"), sigmas=sig,
                              noise=initial_noise(noisy, 11, add=False), seed=0, latent=noisy)
    assert torch.allclose(direct.samples, staged.samples, atol=1e-4)


def test_add_noise_empty_sigmas_and_nan_cleanup():
    latent = Latent(torch.ones(1, 4, 2, 2))
    assert add_noise(PromptModel(), torch.ones(1, 4, 2, 2), torch.FloatTensor([]), latent) is latent
    bad = add_noise(PromptModel(), torch.full((1, 4, 2, 2), float("nan")), torch.tensor([1.0]),
                    latent)
    assert torch.equal(bad.samples, torch.zeros(1, 4, 2, 2))
