"""ComfyUI's custom-sampling node group (``comfy_extras/nodes_custom_sampler.py``,
``nodes_align_your_steps.py``, ``nodes_optimalsteps.py``, ``nodes_perpneg.py``; ComfyUI 0.3.64,
SamplerSEEDS2 and DualModelGuider as in 0.38.1): sampler, sigma, noise and guider nodes, and
SamplerCustom / SamplerCustomAdvanced.

SAMPLER, NOISE and GUIDER are the frozen dataclasses of ``nodes/payloads/sampling.py``; SIGMAS is
a 1-D float32 tensor. The nodes that run the UNet (SamplerCustom, SamplerCustomAdvanced) resolve
the MODEL precision exactly as KSampler does; the guider nodes only carry the handle.
"""

from __future__ import annotations

import math

from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, String, node
from mixgraph.nodes.payloads.conditioning import TEXT_FREE
from mixgraph.nodes.payloads.sampling import Guidance, Guider, Noise
from mixgraph.nodes.helpers.precision import effective
from mixgraph.nodes.sampling import ksampler, sampler_presets as presets, sigma_tools
from mixgraph.nodes.sampling.noise import initial_noise
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.nodes.sampling.samplers import SAMPLER_NAMES
from mixgraph.nodes.sampling.schedule_tables import AYS_NOISE_LEVELS, OPTIMAL_STEPS_NOISE_LEVELS
from mixgraph.nodes.sampling.schedules import SCHEDULER_NAMES, beta_scheduler
from mixgraph.nodes.helpers.previews import previewer_for
from mixgraph.nodes.declare.sampling.sampling_nodes import SEED_MAX, step_progress

SCHED = "sampling/custom_sampling/schedulers"
SAMPLERS = "sampling/custom_sampling/samplers"
SIGMAS = "sampling/custom_sampling/sigmas"
GUIDERS = "sampling/custom_sampling/guiders"
NOISE = "sampling/custom_sampling/noise"
SIGMA_MAX, SIGMA_MIN = 14.614642, 0.0291675  # the nodes' defaults (SD's discrete range)


def _schedule(model):
    return ModelSampling.for_model(model).schedule


def _cfg(default: float = 8.0):
    return Float(default, min=0.0, max=100.0, step=0.1, round=0.01)


def _opt(default: float):
    return Float(default, min=0.0, max=100.0, step=0.01)


# ------------------------------------------------------------------------------ schedulers


@node(category=SCHED, outputs=("SIGMAS",))
def BasicScheduler(model=Socket("MODEL"), scheduler=Combo(SCHEDULER_NAMES),
                   steps=Int(20, min=1, max=10000),
                   denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """One of KSampler's schedulers over the model's noise schedule."""
    return (sigma_tools.basic_scheduler(_schedule(model), scheduler, steps, denoise),)


@node(category=SCHED, outputs=("SIGMAS",))
def KarrasScheduler(steps=Int(20, min=1, max=10000),
                    sigma_max=Float(SIGMA_MAX, min=0.0, max=5000.0, step=0.01),
                    sigma_min=Float(SIGMA_MIN, min=0.0, max=5000.0, step=0.01),
                    rho=Float(7.0, min=0.0, max=100.0, step=0.01)):
    """Karras et al. 2022 schedule with a free sigma range and rho."""
    return (sigma_tools.karras_sigmas(steps, sigma_max, sigma_min, rho),)


@node(category=SCHED, outputs=("SIGMAS",))
def ExponentialScheduler(steps=Int(20, min=1, max=10000),
                         sigma_max=Float(SIGMA_MAX, min=0.0, max=5000.0, step=0.01),
                         sigma_min=Float(SIGMA_MIN, min=0.0, max=5000.0, step=0.01)):
    """Sigmas evenly spaced in log sigma."""
    return (sigma_tools.exponential_sigmas(steps, sigma_max, sigma_min),)


@node(category=SCHED, outputs=("SIGMAS",))
def PolyexponentialScheduler(steps=Int(20, min=1, max=10000),
                             sigma_max=Float(SIGMA_MAX, min=0.0, max=5000.0, step=0.01),
                             sigma_min=Float(SIGMA_MIN, min=0.0, max=5000.0, step=0.01),
                             rho=Float(1.0, min=0.0, max=100.0, step=0.01)):
    """Sigmas on a polynomial of power rho in log sigma."""
    return (sigma_tools.polyexponential_sigmas(steps, sigma_max, sigma_min, rho),)


@node(category=SCHED, outputs=("SIGMAS",))
def LaplaceScheduler(steps=Int(20, min=1, max=10000),
                     sigma_max=Float(SIGMA_MAX, min=0.0, max=5000.0, step=0.01),
                     sigma_min=Float(SIGMA_MIN, min=0.0, max=5000.0, step=0.01),
                     mu=Float(0.0, min=-10.0, max=10.0, step=0.1),
                     beta=Float(0.5, min=0.0, max=10.0, step=0.1)):
    """Log sigma at Laplace(mu, beta) quantiles (no final 0, as in ComfyUI)."""
    return (sigma_tools.laplace_sigmas(steps, sigma_max, sigma_min, mu, beta),)


@node(category=SCHED, outputs=("SIGMAS",))
def VPScheduler(steps=Int(20, min=1, max=10000),
                beta_d=Float(19.9, min=0.0, max=5000.0, step=0.01),
                beta_min=Float(0.1, min=0.0, max=5000.0, step=0.01),
                eps_s=Float(0.001, min=0.0, max=1.0, step=0.0001)):
    """The continuous variance-preserving schedule."""
    return (sigma_tools.vp_sigmas(steps, beta_d, beta_min, eps_s),)


@node(category=SCHED, outputs=("SIGMAS",))
def BetaSamplingScheduler(model=Socket("MODEL"), steps=Int(20, min=1, max=10000),
                          alpha=Float(0.6, min=0.0, max=50.0, step=0.01),
                          beta=Float(0.6, min=0.0, max=50.0, step=0.01)):
    """Timesteps at Beta(alpha, beta) quantiles of the model's schedule."""
    return (beta_scheduler(_schedule(model), steps, alpha=alpha, beta=beta),)


@node(category=SCHED, outputs=("SIGMAS",))
def SDTurboScheduler(model=Socket("MODEL"), steps=Int(1, min=1, max=10),
                     denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """SD-Turbo's timesteps 999, 899, ... from 10 - int(10 * denoise) on."""
    return (sigma_tools.sd_turbo_sigmas(_schedule(model), steps, denoise),)


@node(category=SCHED, outputs=("SIGMAS",))
def AlignYourStepsScheduler(model_type=Combo(tuple(AYS_NOISE_LEVELS)),
                            steps=Int(10, min=1, max=10000),
                            denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """NVIDIA's Align Your Steps schedules, log-linearly resampled to the step count."""
    return (sigma_tools.ays_sigmas(model_type, steps, denoise),)


@node(category=SCHED, outputs=("SIGMAS",))
def OptimalStepsScheduler(model_type=Combo(tuple(OPTIMAL_STEPS_NOISE_LEVELS)),
                          steps=Int(20, min=3, max=1000),
                          denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """Optimal Stepsize schedules (flow models), log-linearly resampled to the step count."""
    return (sigma_tools.optimal_steps_sigmas(model_type, steps, denoise),)


@node(category=SCHED, outputs=("SIGMAS",))
def GITSScheduler(coeff=Float(1.20, min=0.80, max=1.50, step=0.05),
                  steps=Int(10, min=2, max=1000),
                  denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """Geometry-Inspired Time Scheduling (GITS) tables for SD's sigmas; above 20 steps the
    20-step schedule log-linearly resampled."""
    return (sigma_tools.gits_sigmas(coeff, steps, denoise),)


# ---------------------------------------------------------------------------- sigma tools


@node(category=SIGMAS, outputs=("SIGMAS", "SIGMAS"), output_names=("high_sigmas", "low_sigmas"))
def SplitSigmas(sigmas=Socket("SIGMAS"), step=Int(0, min=0, max=10000)):
    """Split a schedule at a step; both halves keep the sigma at that step."""
    return sigma_tools.split_sigmas(sigmas, step)


@node(category=SIGMAS, outputs=("SIGMAS", "SIGMAS"), output_names=("high_sigmas", "low_sigmas"))
def SplitSigmasDenoise(sigmas=Socket("SIGMAS"),
                       denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """Split so the low half holds round(steps * denoise) steps."""
    return sigma_tools.split_sigmas_denoise(sigmas, denoise)


@node(category=SIGMAS, outputs=("SIGMAS",))
def FlipSigmas(sigmas=Socket("SIGMAS")):
    """Reverse a schedule (a leading 0 becomes 0.0001)."""
    return (sigma_tools.flip_sigmas(sigmas),)


@node(category=SIGMAS, outputs=("SIGMAS",))
def SetFirstSigma(sigmas=Socket("SIGMAS"),
                  sigma=Float(136.0, min=0.0, max=20000.0, step=0.001)):
    """Replace the first sigma."""
    return (sigma_tools.set_first_sigma(sigmas, sigma),)


@node(category=SIGMAS, outputs=("SIGMAS",))
def ManualSigmas(sigmas=String("1, 0.5")):
    """Sigmas typed as a list of numbers (every number in the text, in order)."""
    return (sigma_tools.manual_sigmas(sigmas),)


@node(category=SIGMAS, outputs=("SIGMAS",))
def ExtendIntermediateSigmas(sigmas=Socket("SIGMAS"), steps=Int(2, min=1, max=100),
                             start_at_sigma=Float(-1.0, min=-1.0, max=20000.0, step=0.01),
                             end_at_sigma=Float(12.0, min=0.0, max=20000.0, step=0.01),
                             spacing=Combo(sigma_tools.EXTEND_SPACINGS)):
    """Insert intermediate sigmas between the steps in a sigma range."""
    return (sigma_tools.extend_intermediate_sigmas(sigmas, steps, start_at_sigma, end_at_sigma,
                                                   spacing),)


@node(category=SIGMAS, outputs=("FLOAT",), output_names=("sigma_value",))
def SamplingPercentToSigma(model=Socket("MODEL"),
                           sampling_percent=Float(0.0, min=0.0, max=1.0, step=0.0001),
                           return_actual_sigma=Boolean(False)):
    """The model's sigma at a sampling percent (0 = start); with return_actual_sigma, 0 and 1
    give sigma_max and sigma_min instead of the interval-check values."""
    return (sigma_tools.percent_to_sigma(_schedule(model), sampling_percent,
                                         return_actual_sigma),)


# ------------------------------------------------------------------------------- samplers


@node(category=SAMPLERS, outputs=("SAMPLER",))
def KSamplerSelect(sampler_name=Combo(SAMPLER_NAMES)):
    """One of KSampler's samplers with its default options."""
    return (presets.select_sampler(sampler_name),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerEulerAncestral(eta=_opt(1.0), s_noise=_opt(1.0)):
    return (presets.select_sampler("euler_ancestral", eta=eta, s_noise=s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",), display_name="SamplerEulerAncestralCFG++")
def SamplerEulerAncestralCFGPP(eta=Float(1.0, min=0.0, max=1.0, step=0.01),
                               s_noise=Float(1.0, min=0.0, max=10.0, step=0.01)):
    return (presets.select_sampler("euler_ancestral_cfg_pp", eta=eta, s_noise=s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerLMS(order=Int(4, min=1, max=100)):
    return (presets.select_sampler("lms", order=order),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerDPMPP_3M_SDE(eta=_opt(1.0), s_noise=_opt(1.0), noise_device=Combo(presets.NOISE_DEVICES)):
    return (presets.sde_sampler("dpmpp_3m_sde", noise_device, eta=eta, s_noise=s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerDPMPP_2M_SDE(solver_type=Combo(("midpoint", "heun")), eta=_opt(1.0),
                        s_noise=_opt(1.0), noise_device=Combo(presets.NOISE_DEVICES)):
    return (presets.sde_sampler("dpmpp_2m_sde", noise_device, eta=eta, s_noise=s_noise,
                                solver_type=solver_type),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerDPMPP_SDE(eta=_opt(1.0), s_noise=_opt(1.0), r=_opt(0.5),
                     noise_device=Combo(presets.NOISE_DEVICES)):
    return (presets.sde_sampler("dpmpp_sde", noise_device, eta=eta, s_noise=s_noise, r=r),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerDPMPP_2S_Ancestral(eta=_opt(1.0), s_noise=_opt(1.0)):
    return (presets.select_sampler("dpmpp_2s_ancestral", eta=eta, s_noise=s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerDPMAdaptative(order=Int(3, min=2, max=3), rtol=_opt(0.05), atol=_opt(0.0078),
                         h_init=_opt(0.05), pcoeff=_opt(0.0), icoeff=_opt(1.0),
                         dcoeff=_opt(0.0), accept_safety=_opt(0.81), eta=_opt(0.0),
                         s_noise=_opt(1.0)):
    return (presets.select_sampler("dpm_adaptive", order=order, rtol=rtol, atol=atol,
                                   h_init=h_init, pcoeff=pcoeff, icoeff=icoeff, dcoeff=dcoeff,
                                   accept_safety=accept_safety, eta=eta, s_noise=s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerER_SDE(solver_type=Combo(presets.ER_SDE_SOLVER_TYPES), max_stage=Int(3, min=1, max=3),
                  eta=_opt(1.0), s_noise=_opt(1.0)):
    return (presets.er_sde_sampler(solver_type, max_stage, eta, s_noise),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerSASolver(model=Socket("MODEL"), eta=Float(1.0, min=0.0, max=10.0, step=0.01),
                    sde_start_percent=Float(0.2, min=0.0, max=1.0, step=0.001),
                    sde_end_percent=Float(0.8, min=0.0, max=1.0, step=0.001),
                    s_noise=_opt(1.0), predictor_order=Int(3, min=1, max=6),
                    corrector_order=Int(4, min=0, max=6), use_pece=Boolean(False),
                    simple_order_2=Boolean(False)):
    return (presets.sa_solver_sampler(_schedule(model), eta, sde_start_percent, sde_end_percent,
                                      s_noise, predictor_order, corrector_order, use_pece,
                                      simple_order_2),)


@node(category=SAMPLERS, outputs=("SAMPLER",))
def SamplerSEEDS2(solver_type=Combo(("phi_1", "phi_2")),
                  eta=Float(1.0, min=0.0, max=100.0, step=0.01, tooltip="Stochastic strength"),
                  s_noise=Float(1.0, min=0.0, max=100.0, step=0.01,
                                tooltip="SDE noise multiplier"),
                  r=Float(0.5, min=0.01, max=1.0, step=0.01,
                          tooltip="Relative step size for the intermediate stage (c2 node)")):
    """This sampler node can represent multiple samplers:

    seeds_2
    - default setting

    exp_heun_2_x0
    - solver_type=phi_2, r=1.0, eta=0.0

    exp_heun_2_x0_sde
    - solver_type=phi_2, r=1.0, eta=1.0, s_noise=1.0"""
    return (presets.select_sampler("seeds_2", eta=eta, s_noise=s_noise, r=r,
                                   solver_type=solver_type),)


# --------------------------------------------------------------------------------- noise


@node(category=NOISE, outputs=("NOISE",))
def RandomNoise(noise_seed=Int(0, min=0, max=SEED_MAX, control_after_generate=True)):
    return (Noise(seed=noise_seed, add=True),)


@node(category=NOISE, outputs=("NOISE",))
def DisableNoise():
    return (Noise(seed=0, add=False),)


@node(category="_for_testing/custom_sampling/noise", outputs=("LATENT",))
def AddNoise(model=Socket("MODEL"), noise=Socket("NOISE"), sigmas=Socket("SIGMAS"),
             latent_image=Socket("LATENT")):
    """Noise a latent to the level of a sigma span (|first - last|) without sampling."""
    return (ksampler.add_noise(model, initial_noise(latent_image, noise.seed, noise.add), sigmas,
                               latent_image),)


# -------------------------------------------------------------------------------- guiders


@node(category=GUIDERS, outputs=("GUIDER",))
def BasicGuider(model=Socket("MODEL"), conditioning=Socket("CONDITIONING")):
    """The conditioning alone (no negative, cfg 1)."""
    return (Guider(model, Guidance("cfg", (tuple(conditioning), ()), (1.0,))),)


@node(category=GUIDERS, outputs=("GUIDER",))
def CFGGuider(model=Socket("MODEL"), positive=Socket("CONDITIONING"),
              negative=Socket("CONDITIONING"), cfg=_cfg()):
    """Classifier-free guidance, as in KSampler."""
    return (Guider(model, Guidance("cfg", (tuple(positive), tuple(negative)), (cfg,))),)


@node(category=GUIDERS, outputs=("GUIDER",))
def DualCFGGuider(model=Socket("MODEL"), cond1=Socket("CONDITIONING"),
                  cond2=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                  cfg_conds=_cfg(), cfg_cond2_negative=_cfg(),
                  style=Combo(("regular", "nested"))):
    """Two guidance scales: cond1 against cond2, and cond2 against the negative."""
    return (Guider(model, Guidance("dual_cfg", (tuple(cond1), tuple(cond2), tuple(negative)),
                                   (cfg_conds, cfg_cond2_negative), nested=style == "nested")),)


@node(category=GUIDERS, outputs=("GUIDER",), display_name="Dual Model CFG Guider")
def DualModelGuider(model=Socket("MODEL", tooltip="Model used for the positive (conditional) pass."),
                    model_negative=Socket("MODEL", optional=True,
                                          tooltip="Model used for the negative (unconditional) "
                                                  "pass. Use the same model for ordinary CFG."),
                    positive=Socket("CONDITIONING"), cfg=_cfg(4.0),
                    negative=Socket("CONDITIONING", optional=True,
                                    tooltip="Negative conditioning run on the negative model. "
                                            "Leave unconnected for a text-free (image-only) "
                                            "unconditional pass.")):
    """CFG with the negative pass on a second model (each with its own weights, patches and
    precision); without model_negative it is CFGGuider. Without negative the negative is
    ``TEXT_FREE`` (ComfyUI's ``[[None, {}]]``): the negative pass runs the UNet with no text
    context, which a UNet whose cross-attention needs text refuses when it runs (cfg ≠ 1)."""
    if negative is None:
        negative = TEXT_FREE
    conds = (tuple(positive), tuple(negative))
    if model_negative is None:
        return (Guider(model, Guidance("cfg", conds, (cfg,))),)
    return (Guider(model, Guidance("dual_model", conds, (cfg,)), negative_model=model_negative),)


@node(category="_for_testing", outputs=("GUIDER",), display_name="Perp-Neg Guider")
def PerpNegGuider(model=Socket("MODEL"), positive=Socket("CONDITIONING"),
                  negative=Socket("CONDITIONING"), empty_conditioning=Socket("CONDITIONING"),
                  cfg=_cfg(), neg_scale=Float(1.0, min=0.0, max=100.0, step=0.01)):
    """Perp-Neg: only the part of the negative perpendicular to the positive is subtracted."""
    return (Guider(model, Guidance("perp_neg", (tuple(positive), tuple(negative),
                                                tuple(empty_conditioning)), (cfg, neg_scale))),)


# ------------------------------------------------------------------------------- sampling


@node(category="sampling/custom_sampling", outputs=("LATENT", "LATENT"),
      output_names=("output", "denoised_output"))
def SamplerCustom(ctx, model=Socket("MODEL"), add_noise=Boolean(True),
                  noise_seed=Int(0, min=0, max=SEED_MAX, control_after_generate=True),
                  cfg=_cfg(), positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                  sampler=Socket("SAMPLER"), sigmas=Socket("SIGMAS"),
                  latent_image=Socket("LATENT")):
    """Samples with a SAMPLER and SIGMAS of your choice and CFG; also returns the last step's
    x0 prediction (denoised_output)."""
    runner = model.runner(effective(ctx, model, "MODEL"))
    guidance = Guidance("cfg", (tuple(positive), tuple(negative)), (cfg,))
    latent_image = ksampler.fix_empty_latent_channels(runner, latent_image)  # before the noise
    return ksampler.sample_custom(runner, guidance=guidance, sampler=sampler, sigmas=sigmas,
                                  noise=initial_noise(latent_image, noise_seed, add_noise),
                                  seed=noise_seed, latent=latent_image, on_step=step_progress(ctx),
                                  preview=previewer_for(ctx, runner))


@node(category="sampling/custom_sampling", outputs=("LATENT", "LATENT"),
      output_names=("output", "denoised_output"), precision_types=("MODEL",))
def SamplerCustomAdvanced(ctx, noise=Socket("NOISE"), guider=Socket("GUIDER"),
                          sampler=Socket("SAMPLER"), sigmas=Socket("SIGMAS"),
                          latent_image=Socket("LATENT")):
    """Samples with separate NOISE, GUIDER, SAMPLER and SIGMAS; the guider's MODEL (and a
    DualModelGuider's negative MODEL) runs at the precision resolved for this node."""
    runner = guider.model.runner(effective(ctx, guider.model, "MODEL"))
    negative_runner = None
    if guider.negative_model is not None and not math.isclose(guider.guidance.scales[0], 1.0):
        negative_runner = guider.negative_model.runner(effective(ctx, guider.negative_model, "MODEL"))
    latent_image = ksampler.fix_empty_latent_channels(runner, latent_image)  # before the noise
    return ksampler.sample_custom(runner, guidance=guider.guidance, sampler=sampler,
                                  sigmas=sigmas,
                                  noise=initial_noise(latent_image, noise.seed, noise.add),
                                  seed=noise.seed, latent=latent_image, on_step=step_progress(ctx),
                                  preview=previewer_for(ctx, runner),
                                  negative_model=negative_runner)
