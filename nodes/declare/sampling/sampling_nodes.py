"""KSampler, KSamplerAdvanced and ModelSamplingDiscrete."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers.precision import effective
from mixgraph.nodes.helpers.previews import previewer_for
from mixgraph.nodes.sampling import ksampler
from mixgraph.nodes.sampling.samplers import SAMPLER_NAMES
from mixgraph.nodes.sampling.schedules import SCHEDULER_NAMES

SEED_MAX = 0xFFFFFFFFFFFFFFFF


def step_progress(ctx):
    """A sampler's `on_step` callback that reports each step as the node's progress."""
    def on_step(i: int, total: int, preview=None) -> None:  # i: 1..total, ComfyUI's value
        ctx.progress(i, total, preview=preview)

    return on_step


@node(category="sampling", outputs=("LATENT",))
def KSampler(ctx, model=Socket("MODEL"),
             seed=Int(0, min=0, max=SEED_MAX, control_after_generate=True),
             steps=Int(20, min=1, max=10000),
             cfg=Float(8.0, min=0.0, max=100.0, step=0.1, round=0.01),
             sampler_name=Combo(SAMPLER_NAMES), scheduler=Combo(SCHEDULER_NAMES),
             positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
             latent_image=Socket("LATENT"), denoise=Float(1.0, min=0.0, max=1.0, step=0.01)):
    """Denoises the latent with the chosen sampler and schedule (ComfyUI's common_ksampler)."""
    runner = model.runner(effective(ctx, model, "MODEL"))
    return (ksampler.sample(runner, seed=seed, steps=steps, cfg=cfg, sampler_name=sampler_name,
                            scheduler=scheduler, positive=positive, negative=negative,
                            latent=latent_image, denoise=denoise, on_step=step_progress(ctx),
                            preview=previewer_for(ctx, runner)),)


@node(category="sampling", outputs=("LATENT",), display_name="KSampler (Advanced)")
def KSamplerAdvanced(ctx, model=Socket("MODEL"), add_noise=Combo(("enable", "disable")),
                     noise_seed=Int(0, min=0, max=SEED_MAX, control_after_generate=True),
                     steps=Int(20, min=1, max=10000),
                     cfg=Float(8.0, min=0.0, max=100.0, step=0.1, round=0.01),
                     sampler_name=Combo(SAMPLER_NAMES), scheduler=Combo(SCHEDULER_NAMES),
                     positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                     latent_image=Socket("LATENT"), start_at_step=Int(0, min=0, max=10000),
                     end_at_step=Int(10000, min=0, max=10000),
                     return_with_leftover_noise=Combo(("disable", "enable"))):
    """Runs steps [start_at_step, end_at_step) of a schedule: phases of one denoise can be split
    across nodes (and precisions), passing the leftover noise on."""
    runner = model.runner(effective(ctx, model, "MODEL"))
    return (ksampler.sample(runner, seed=noise_seed, steps=steps, cfg=cfg,
                            sampler_name=sampler_name, scheduler=scheduler, positive=positive,
                            negative=negative, latent=latent_image, denoise=1.0,
                            add_noise=add_noise == "enable", start_step=start_at_step,
                            last_step=end_at_step,
                            force_full_denoise=return_with_leftover_noise == "disable",
                            on_step=step_progress(ctx),
                            preview=previewer_for(ctx, runner)),)


@node(category="advanced/model", outputs=("MODEL",))
def ModelSamplingDiscrete(model=Socket("MODEL"),
                          sampling=Combo(("eps", "v_prediction", "lcm", "x0", "img_to_img")),
                          zsnr=Boolean(False)):
    """Overrides the model's prediction type (and zero-terminal-SNR rescaling)."""
    return (model.with_sampling(sampling, zsnr),)
