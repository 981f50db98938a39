"""DiT ControlNets: Stability's SD3.5 ControlNets (ComfyUI ``load_controlnet_sd35`` /
``cldm/dit_embedder.py``) against diffusers' ``SD3ControlNetModel`` on tiny configs in the file's
layout, the residuals added after the SD3 joint blocks (checked against diffusers'
``SD3Transformer2DModel`` with the residuals added by hooks after each block, a hand composition),
the hint through the apply node's VAE, and workflows end to end; the other DiT formats ComfyUI
loads are refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.adapters.controlnet import apply_controlnet, resize_hint
from mixgraph.nodes.adapters.sd35_controlnet import SD35ControlNetHandle, sincos_2d
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond, Control
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.nodes.vae.flow_latent_formats import SD3_LATENT
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_sd3 import TEXT_WIDTH, comfy_state_dict, diffusers_sd3
from tests.fixtures.tiny_sd3_controlnet import (diffusers_sd3_controlnet, diffusers_sd35_controlnet,
                                               write_sd3_controlnet, write_sd35_controlnet)

KIND = "sd35_large"  # two joint blocks, 128 wide: the nets' width
F32 = parse_spec("f32")


def _close(got, want, tol=1e-4):
    assert got.shape == want.shape
    assert (got - want).abs().max() <= tol * want.abs().max(), (got - want).abs().max()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from mixgraph.nodes.weights.synthetic import TINY_VAE
    from tests.fixtures.checkpoints import tiny_vae_state_dict

    root = tmp_path_factory.mktemp("dit_cn")
    vae_cfg = dataclasses.replace(TINY_VAE, z_channels=16, embed_dim=16, use_quant_conv=False)
    sd = {"model.diffusion_model." + k: v for k, v in comfy_state_dict(diffusers_sd3(KIND, seed=3)).items()}
    sd |= {"first_stage_model." + k: v for k, v in tiny_vae_state_dict(2, vae_cfg).items()}
    (root / "checkpoints").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "checkpoints" / "sd35.safetensors"))
    (root / "diffusion_models").mkdir()
    save_file({k[len("model.diffusion_model."):]: v.contiguous() for k, v in sd.items()
               if k.startswith("model.diffusion_model.")}, str(root / "diffusion_models" / "sd35.safetensors"))
    (root / "text_encoders").mkdir()
    save_file({k: v.contiguous() for k, v in tiny_clip_l_state_dict(4, width=TEXT_WIDTH).items()},
              str(root / "text_encoders" / "clip_l.safetensors"))
    write_sd35_controlnet(root / "controlnet" / "sd35_canny.safetensors", layers=1, double=True, control_type=1,
                          seed=7)
    write_sd35_controlnet(root / "controlnet" / "sd35_plain.safetensors", layers=2, double=False, control_type=0,
                          seed=8)
    write_sd3_controlnet(root / "controlnet" / "sd3_instantx.safetensors", layers=1, seed=9)
    write_sd3_controlnet(root / "controlnet" / "sd3_inpaint.safetensors", layers=1, seed=10, extra=1)
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


def _main(models):
    model, _clip, vae = loader.load_checkpoint(models / "checkpoints" / "sd35.safetensors")
    return model, vae


def _inputs(h=8, w=8, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 16, h, w, generator=g), torch.randn(batch, 16, h, w, generator=g),
            torch.tensor([700.0, 30.0][:batch]), torch.randn(batch, TEXT_WIDTH, generator=g))


# --------------------------------------------------------------------------------------------
# the net against diffusers


def test_loader_reads_the_stability_layout(models):
    net = loader.load_controlnet(models / "controlnet" / "sd35_canny.safetensors")
    assert isinstance(net, SD35ControlNetHandle)
    c = net.config
    assert (c.hidden, c.heads, c.blocks, c.double_y_emb, c.y_in, c.control_type, c.repeat) == (128, 2, 1, True, 128, 1, 2)
    plain = loader.load_controlnet(models / "controlnet" / "sd35_plain.safetensors").config
    assert (plain.blocks, plain.double_y_emb, plain.y_in, plain.control_type, plain.repeat) == (2, False, 32, 0, 1)
    pre = net.preprocess
    assert torch.equal(pre(torch.tensor([0.0, 1.0])), torch.tensor([0.5, 128.0]))  # ComfyUI's canny preprocessing
    assert net.latent_format == SD3_LATENT


@torch.no_grad()
def test_large_kind_matches_diffusers(models):
    """The Large kind (square y_embedder): the pooled vector through the main model's
    y_embedder then the net's, the net's own x_embedder, no position table; one block's residual
    repeated for the two joint blocks. diffusers' net takes the main y_embedder's output as its
    pooled input (its text_embedder is the net's y_embedder)."""
    model, _ = _main(models)
    runner = model.runner(F32)
    ref = diffusers_sd35_controlnet(1, True, seed=7)
    bound = loader.load_controlnet(models / "controlnet" / "sd35_canny.safetensors").runner(F32).bind_model(runner)
    x, hint, t, y = _inputs()
    got = bound(x, hint, t, None, y)
    assert isinstance(got, Control) and got.input == [] and len(got.output) == 2
    want = ref(hidden_states=x, controlnet_cond=hint, pooled_projections=runner.model.y_embedder(y), timestep=t,
               return_dict=False)[0]
    assert len(want) == 1
    _close(got.output[0], want[0])
    assert got.output[1] is got.output[0]


@torch.no_grad()
def test_plain_kind_matches_diffusers(models):
    """The other kind: the main model's x_embedder plus ComfyUI's 2-D sin-cos table (on a 16x16
    patch grid, diffusers' table), the pooled vector straight into the net, blocks in sequence
    (diffusers' behaviour), one residual per block."""
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    model, _ = _main(models)
    runner = model.runner(F32)
    ref = diffusers_sd35_controlnet(2, False, seed=8)
    bound = loader.load_controlnet(models / "controlnet" / "sd35_plain.safetensors").runner(F32).bind_model(runner)
    x, hint, t, y = _inputs(32, 32)
    got = bound(x, hint, t, None, y)
    tokens = runner.model.x_embedder(x) + get_2d_sincos_pos_embed(128, 16, base_size=16, output_type="pt").float()
    want = ref(hidden_states=tokens, controlnet_cond=hint, pooled_projections=y, timestep=t, return_dict=False)[0]
    assert len(got.output) == len(want) == 2
    for a, b in zip(got.output, want):
        _close(a, b)


def test_sincos_table_is_comfyuis():
    """Square grids: diffusers' 2-D table (grid positions 0..n-1); other shapes: ComfyUI's
    centre-7.5 rule stretched along the longer side, written out here."""
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    _close(sincos_2d(64, 16, 16), get_2d_sincos_pos_embed(64, 16, base_size=16, output_type="pt").float(), 1e-6)
    table = sincos_2d(8, 4, 2)  # w=4, h=2: rows of h positions -7.5+7.5..., w stretched by 2
    assert table.shape == (8, 8)
    hpos = torch.linspace(0.0, 15.0, 2).repeat_interleave(4)
    wpos = torch.linspace(-7.5, 22.5, 4).repeat(2)
    omega = 1.0 / 10000 ** (torch.arange(2) / 2.0)

    def one(p):
        return torch.cat([torch.sin(p[:, None] * omega), torch.cos(p[:, None] * omega)], 1)

    _close(table, torch.cat([one(wpos), one(hpos)], 1), 1e-6)


@torch.no_grad()
def test_residuals_are_added_after_each_joint_block(models):
    """The SD3 model with residuals r_i: diffusers' SD3 transformer with r_i added to the image
    tokens after block i by forward hooks (ComfyUI adds after every block, the last one too;
    diffusers' own ``block_controlnet_hidden_states`` skips the last block, so hooks compose it)."""
    ref = diffusers_sd3(KIND, seed=3)
    model, _ = _main(models)
    mm = model.runner(F32).model
    g = torch.Generator().manual_seed(4)
    x, ctx, y = torch.randn(2, 16, 8, 8, generator=g), torch.randn(2, 5, TEXT_WIDTH, generator=g), \
        torch.randn(2, TEXT_WIDTH, generator=g)
    t = torch.tensor([700.0, 30.0])
    res = [torch.randn(2, 16, 128, generator=g), torch.randn(2, 16, 128, generator=g)]
    hooks = [blk.register_forward_hook(lambda m, a, out, r=r: (out[0], out[1] + r))
             for blk, r in zip(ref.transformer_blocks, res)]
    try:
        want = ref(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=y, timestep=t).sample
    finally:
        for h in hooks:
            h.remove()
    got = mm(x, t, ctx, y, control=res)
    _close(got, want)
    plain = mm(x, t, ctx, y)
    assert (got - plain).abs().max() > 1e-3
    # a shorter list leaves the later blocks alone; None adds nothing
    assert torch.equal(mm(x, t, ctx, y, control=[None, None]), plain)


@torch.no_grad()
def test_instantx_sd3_net_matches_diffusers_and_a_full_step(models):
    """diffusers-layout SD3 nets (joint blocks): the residuals equal diffusers' net with a zero
    pooled vector (ComfyUI zeroes it); a one-block net on a two-block model gives one residual
    (depth // blocks − 1 for the last block), and the model with it equals diffusers'
    ``SD3Transformer2DModel`` given the same residuals (which also skips the last block)."""
    model, _ = _main(models)
    runner = model.runner(F32)
    net = loader.load_controlnet(models / "controlnet" / "sd3_instantx.safetensors")
    assert (net.config.blocks, net.config.counts, net.config.mmdit.depth, net.config.mmdit.context_in) == (1, (1,), 2, 32)
    assert net.latent_format.process_in(torch.ones(1, 16, 1, 1)).flatten()[0] == pytest.approx(1.5305)
    ref = diffusers_sd3_controlnet(1, seed=9)
    bound = net.runner(F32).bind_model(runner)
    x, hint, t, y = _inputs()
    ctx = torch.randn(2, 5, TEXT_WIDTH, generator=torch.Generator().manual_seed(6))
    got = bound(x, hint, t, ctx, y)
    want = ref(hidden_states=x, controlnet_cond=hint, encoder_hidden_states=ctx, pooled_projections=torch.zeros_like(y),
               timestep=t, return_dict=False)[0]
    assert len(got.output) == len(want) == 1
    _close(got.output[0], want[0])
    main = diffusers_sd3(KIND, seed=3)
    full = main(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=y, timestep=t,
                block_controlnet_hidden_states=list(want)).sample
    _close(runner.model(x, t, ctx, y, control=got.output), full)


@torch.no_grad()
def test_inpainting_net_takes_the_kept_area_mask(models):
    """AliMama-style nets (17 hint channels, ComfyUI's concat_mask): residuals as diffusers' net
    with ``extra_conditioning_channels=1``; ControlNetInpaintingAliMamaApply blacks out the masked
    area and the hint is the encoded image then the kept-area mask (1 − mask) on the latent grid;
    through Apply ControlNet the mask is all ones."""
    from mixgraph.nodes.adapters.dit_controlnet import inpaint_hint
    from mixgraph.nodes.models.resize import upscale

    model, vae = _main(models)
    runner = model.runner(F32)
    net = loader.load_controlnet(models / "controlnet" / "sd3_inpaint.safetensors")
    assert net.concat_mask and net.config.hint_channels == 17
    x, _, t, y = _inputs()
    hint = torch.randn(2, 17, 8, 8, generator=torch.Generator().manual_seed(8))
    ctx = torch.randn(2, 5, TEXT_WIDTH, generator=torch.Generator().manual_seed(6))
    got = net.runner(F32).bind_model(runner)(x, hint, t, ctx, y)
    ref = diffusers_sd3_controlnet(1, seed=10, extra=1)
    want = ref(hidden_states=x, controlnet_cond=hint, encoder_hidden_states=ctx, pooled_projections=torch.zeros_like(y),
               timestep=t, return_dict=False)[0]
    _close(got.output[0], want[0])

    image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(1, 64, 64)
    mask[:, 16:40, 8:56] = 1.0
    masked, keep = inpaint_hint(image, mask)
    assert torch.equal(masked[0, 20, 20], torch.zeros(3)) and torch.equal(masked[0, 0, 0], image[0, 0, 0])
    (cond,) = apply_controlnet((Cond(ctx[:1], pooled=y[:1]),), net, F32, masked, 1.0, 0.0, 1.0, vae=vae,
                               vae_policy=F32, extra_concat=(keep,))
    latent = cond.control.hint_latent(8, 8)
    want_latent = net.latent_format.process_in(vae.encode(resize_hint(masked, 64, 64).movedim(1, -1), F32))
    assert latent.shape == (1, 17, 8, 8)
    _close(latent[:, :16], want_latent, 1e-6)
    assert torch.equal(latent[:, 16:], upscale(keep, 8, 8, "nearest-exact", "center"))
    (plain,) = apply_controlnet((Cond(ctx[:1], pooled=y[:1]),), net, F32, image, 1.0, 0.0, 1.0, vae=vae,
                                vae_policy=F32)
    assert torch.equal(plain.control.hint_latent(8, 8)[:, 16:], torch.ones(1, 1, 8, 8))


# --------------------------------------------------------------------------------------------
# applied: the chain, the hint through the VAE, the sampler


@torch.no_grad()
def test_apply_encodes_the_hint_and_the_denoiser_adds_the_scaled_residuals(models):
    """A cond with the net applied (strength 0.6): the denoiser's x0 equals the model run with
    0.6 x the residuals of the net on the hint resized to the latent x 8 ("nearest-exact",
    centre), canny-preprocessed, VAE-encoded and put in SD3's latent format; outside its percent
    range the net adds nothing."""
    model, vae = _main(models)
    runner = model.runner(F32)
    net = loader.load_controlnet(models / "controlnet" / "sd35_canny.safetensors")
    image = torch.rand(1, 48, 80, 3, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    text, pooled = torch.randn(1, 5, TEXT_WIDTH, generator=g), torch.randn(1, TEXT_WIDTH, generator=g)
    (cond,) = apply_controlnet((Cond(text, pooled=pooled),), net, F32, image, 0.6, 0.0, 1.0, vae=vae,
                               vae_policy=F32)
    x = torch.randn(1, 16, 8, 8, generator=g)
    sigma = torch.tensor([0.6])
    got = CFGDenoiser(runner, (cond,), (cond,), 1.0, torch.zeros_like(x))(x, sigma)

    hint = SD3_LATENT.process_in(vae.encode((resize_hint(image, 64, 64) * 255 * 0.5 + 0.5).movedim(1, -1), F32))
    bound = net.runner(F32).bind_model(runner)
    t = torch.tensor([600.0])
    res = [r * 0.6 for r in bound(x, hint, t, text, pooled).output]
    v = runner.model(x, t, text, pooled, control=res)
    _close(got, x - 0.6 * v, 1e-5)  # flow: x0 = x − σ·v
    plain = CFGDenoiser(runner, (Cond(text, pooled=pooled),), (Cond(text, pooled=pooled),), 1.0,
                        torch.zeros_like(x))(x, sigma)
    assert (got - plain).abs().max() > 1e-3
    (late,) = apply_controlnet((Cond(text, pooled=pooled),), net, F32, image, 0.6, 0.9, 1.0, vae=vae,
                               vae_policy=F32)
    assert torch.equal(CFGDenoiser(runner, (late,), (late,), 1.0, torch.zeros_like(x))(x, sigma), plain)


def test_refusals(models):
    model, vae = _main(models)
    net = loader.load_controlnet(models / "controlnet" / "sd35_canny.safetensors")
    image = torch.rand(1, 64, 64, 3)
    with pytest.raises(ValueError, match="needs a VAE"):
        apply_controlnet((Cond(torch.zeros(1, 5, TEXT_WIDTH)),), net, F32, image, 1.0, 0.0, 1.0)
    sd15 = loader.load_checkpoint(models / "checkpoints" / "sd15.safetensors")[0]
    with pytest.raises(ValueError, match="SD3.5 ControlNet applied to a sd model"):
        net.runner(F32).bind_model(sd15.runner(F32))
    runner = model.runner(F32)
    with pytest.raises(ValueError, match="SD 1.x / SDXL ControlNet"):
        runner(torch.zeros(1, 16, 8, 8), torch.tensor([500.0]), torch.zeros(1, 5, TEXT_WIDTH), {},
               control=Control(input=[torch.zeros(1)]))


@pytest.mark.parametrize("keys,name", [
    ({"controlnet_blocks.0.weight", "transformer_blocks.0.img_mlp.net.0.proj.weight"}, "Qwen-Image InstantX"),
])
def test_other_dit_formats_are_refused_by_name(tmp_path, keys, name):
    path = tmp_path / "cn.safetensors"
    save_file({k: torch.zeros(2, 2) for k in keys}, str(path))
    with pytest.raises(NotImplementedError, match=f"{name}.*not supported yet"):
        loader.load_controlnet(path)


# --------------------------------------------------------------------------------------------
# workflows


def prompt(apply="ControlNetApplyAdvanced", strength=0.8, loader_node="CheckpointLoaderSimple"):
    p = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd35.safetensors"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "7": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["6", 0]}},
        "i": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0xff8040}},
        "c": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "sd35_canny.safetensors"}},
        "a": {"class_type": apply, "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "control_net": ["c", 0], "image": ["i", 0],
            "strength": strength, "start_percent": 0.0, "end_percent": 1.0, "vae": ["1", 2]}},
        "5": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["m", 0], "seed": 5, "steps": 3, "cfg": 4.5, "sampler_name": "euler", "scheduler": "simple",
            "positive": ["a", 0], "negative": ["a", 1], "latent_image": ["5", 0], "denoise": 1.0}},
        "d": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 2]}},
        "pi": {"class_type": "PreviewImage", "inputs": {"images": ["d", 0]}},
    }
    if loader_node == "UNETLoader":
        p["m"] = {"class_type": "UNETLoader", "inputs": {"unet_name": "sd35.safetensors", "weight_dtype": "default"}}
    else:
        p["m"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 3.0}}
    return p


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def test_workflow_alimama_inpainting(executor, models):
    """ControlNetInpaintingAliMamaApply with an inpainting net samples; the mask matters."""
    def run(mask_value):
        p = prompt()
        p["c"]["inputs"]["control_net_name"] = "sd3_inpaint.safetensors"
        p["mk"] = {"class_type": "SolidMask", "inputs": {"value": mask_value, "width": 64, "height": 64}}
        p["a"] = {"class_type": "ControlNetInpaintingAliMamaApply", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "control_net": ["c", 0], "vae": ["1", 2], "image": ["i", 0],
            "mask": ["mk", 0], "strength": 0.8, "start_percent": 0.0, "end_percent": 1.0}}
        return api.run(p, executor=executor, models=models, output=models / "out").outputs["3"][0].samples

    full, none = run(1.0), run(0.0)
    assert torch.isfinite(full).all() and (full - none).abs().max() > 1e-4


def test_workflow_checkpoint_controlnet_apply_with_vae_ksampler(executor, models):
    """CheckpointLoaderSimple + ControlNetLoader + Apply ControlNet (with the checkpoint's VAE) +
    KSampler, as ComfyUI's SD3.5 canny template; ControlNetApplySD3 is the same node; strength 0
    is no control; UNETLoader's model takes the net as well."""
    def run(p):
        return api.run(p, executor=executor, models=models, output=models / "out")

    res = run(prompt())
    got = res.outputs["3"][0].samples
    assert got.shape == (1, 16, 8, 8) and torch.isfinite(got).all()
    assert res.outputs["d"][0].shape == (1, 64, 64, 3)
    assert torch.equal(run(prompt("ControlNetApplySD3")).outputs["3"][0].samples, got)
    none = run(prompt(strength=0.0)).outputs["3"][0].samples
    assert (got - none).abs().max() > 1e-3
    unet = run(prompt(loader_node="UNETLoader")).outputs["3"][0].samples
    assert unet.shape == got.shape and torch.isfinite(unet).all()
    p = prompt()
    del p["a"]["inputs"]["vae"]
    with pytest.raises(Exception, match="needs a VAE"):
        run(p)


# --------------------------------------------------------------------------------------------
# Flux: InstantX nets (diffusers' FluxControlNetModel layout)


@pytest.fixture(scope="module")
def flux_models(tmp_path_factory):
    from tests.flux_fixtures import write_flux_models
    from tests.fixtures.tiny_flux_controlnet import write_flux_controlnet, write_xlabs_controlnet

    root = tmp_path_factory.mktemp("flux_cn")
    write_flux_models(root)
    write_flux_controlnet(root / "controlnet" / "flux_cn.safetensors", 1, 1, None, seed=11)
    write_flux_controlnet(root / "controlnet" / "flux_union.safetensors", 1, 1, 4, seed=12)
    write_xlabs_controlnet(root / "controlnet" / "xlabs.safetensors", 2, seed=13)
    return root


def _diffusers_flux_main(sd):
    from diffusers import FluxTransformer2DModel

    from mixgraph.nodes.families.flux import diffusers_keys
    from tests.flux_fixtures import TINY as c

    ref = FluxTransformer2DModel(patch_size=1, in_channels=c.in_channels * 4, out_channels=c.out_channels * 4,
                                 num_layers=c.depth, num_single_layers=c.depth_single_blocks,
                                 attention_head_dim=c.head_dim, num_attention_heads=c.num_heads,
                                 joint_attention_dim=c.context_in_dim, pooled_projection_dim=c.vec_in_dim,
                                 guidance_embeds=c.guidance_embed, axes_dims_rope=c.axes_dim).eval()
    ref.load_state_dict(diffusers_keys.to_diffusers(sd, ref.state_dict().keys()), strict=True)
    return ref


@torch.no_grad()
@pytest.mark.parametrize("name,modes,control_type", [("flux_cn", None, ()), ("flux_union", 4, (2,))])
def test_flux_instantx_net_matches_diffusers_and_a_full_step(flux_models, name, modes, control_type):
    """The net's residuals equal diffusers' ``FluxControlNetModel`` (a union net with its mode
    token); each block's residual is used ceil(19 / 1) / ceil(38 / 1) times (ComfyUI's Flux.1
    sizes), and the model with them equals diffusers' ``FluxTransformer2DModel`` given the net's
    samples (interval rule: every block of the tiny model gets the one residual)."""
    from mixgraph.nodes.families.flux.model import image_ids, patchify, unpatchify
    from tests.fixtures.tiny_flux_controlnet import diffusers_flux_controlnet

    net = loader.load_controlnet(flux_models / "controlnet" / f"{name}.safetensors")
    assert (net.config.flux.depth, net.config.flux.depth_single_blocks, net.config.union_modes) == (1, 1, modes or 0)
    if control_type:
        net = net.with_control_type(control_type)
    model = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors")
    runner = model.runner(F32)
    bound = net.runner(F32).bind_model(runner)
    g = torch.Generator().manual_seed(5)
    x, hint = torch.randn(2, 16, 8, 8, generator=g), torch.randn(2, 16, 8, 8, generator=g)
    ctx, y = torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, generator=g)
    t, guidance = torch.tensor([0.7, 0.3]), torch.tensor([3.5, 2.0])
    got = bound(x, hint, t, ctx, y, {"guidance": guidance})
    assert len(got.input) == 19 and len(got.output) == 38 and all(r is got.input[0] for r in got.input)
    ref = diffusers_flux_controlnet(1, 1, modes, seed=11 if modes is None else 12)
    kw = {"controlnet_mode": torch.tensor([[control_type[0]]] * 2)} if control_type else {}
    ids, txt_ids = image_ids(4, 4, 1)[0], torch.zeros(5, 3)
    d, s = ref(hidden_states=patchify(x), controlnet_cond=patchify(hint), encoder_hidden_states=ctx,
               pooled_projections=y, timestep=t, img_ids=ids, txt_ids=txt_ids, guidance=guidance, return_dict=False,
               **kw)
    _close(got.input[0], d[0])
    _close(got.output[0], s[0])
    from safetensors.torch import load_file
    main = _diffusers_flux_main(load_file(str(flux_models / "diffusion_models" / "flux_tiny.safetensors")))
    want = main(hidden_states=patchify(x), encoder_hidden_states=ctx, pooled_projections=y, timestep=t, img_ids=ids,
                txt_ids=txt_ids, guidance=guidance, controlnet_block_samples=list(d),
                controlnet_single_block_samples=list(s), return_dict=False)[0]
    mine = runner.model(x, t, ctx, y=y, guidance=guidance, control=(got.input, got.output))
    _close(mine, unpatchify(want, 8, 8))
    assert (mine - runner.model(x, t, ctx, y=y, guidance=guidance)).abs().max() > 1e-3


@torch.no_grad()
def test_flux_apply_passes_guidance_and_the_encoded_hint(flux_models):
    """Through the denoiser: the net gets the cond's guidance and pooled vector and the hint
    VAE-encoded into Flux's latent format; x0 = x − σ·v of the model with 0.7 x the residuals."""
    from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT

    model = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors")
    vae = loader.load_vae(flux_models / "vae" / "vae16.safetensors")
    runner = model.runner(F32)
    net = loader.load_controlnet(flux_models / "controlnet" / "flux_cn.safetensors")
    image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    text, pooled = torch.randn(1, 5, 32, generator=g), torch.randn(1, 32, generator=g)
    cond = Cond(text, pooled=pooled, model_inputs={"guidance": 2.5})
    (cond,) = apply_controlnet((cond,), net, F32, image, 0.7, 0.0, 1.0, vae=vae, vae_policy=F32)
    x = torch.randn(1, 16, 8, 8, generator=g)
    sigma = torch.tensor([0.6])
    got = CFGDenoiser(runner, (cond,), (cond,), 1.0, torch.zeros_like(x))(x, sigma)
    hint = FLUX_LATENT.process_in(vae.encode(resize_hint(image, 64, 64).movedim(1, -1), F32))
    bound = net.runner(F32).bind_model(runner)
    guidance = torch.tensor([2.5])
    res = bound(x, hint, sigma, text, pooled, {"guidance": guidance})
    v = runner.model(x, sigma, text, y=pooled, guidance=guidance,
                     control=([r * 0.7 for r in res.input], [r * 0.7 for r in res.output]))
    _close(got, x - 0.6 * v, 1e-5)


@torch.no_grad()
def test_flux_xlabs_net(flux_models):
    """XLabs' nets: the image (no VAE) mapped to [-1, 1] through the hint stack (diffusers'
    ``ControlNetConditioningEmbedding`` on the same weights), then the blocks as diffusers' Flux
    net given those features; the residual list is the block outputs cycled (d0, d1, d0, ...)."""
    from mixgraph.nodes.families.flux.model import image_ids, patchify
    from tests.fixtures.tiny_flux_controlnet import diffusers_flux_controlnet, diffusers_hint_embedding

    net = loader.load_controlnet(flux_models / "controlnet" / "xlabs.safetensors")
    assert net.config.pixel_hint and net.latent_format is None and net.config.flux.depth == 2
    runner = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors").runner(F32)
    bound = net.runner(F32).bind_model(runner)
    g = torch.Generator().manual_seed(5)
    x, image = torch.randn(2, 16, 8, 8, generator=g), torch.rand(2, 3, 64, 64, generator=g)
    ctx, y = torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, generator=g)
    t, guidance = torch.tensor([0.7, 0.3]), torch.tensor([3.5, 2.0])
    got = bound(x, image, t, ctx, y, {"guidance": guidance})
    feats = diffusers_hint_embedding(15)(image * 2 - 1)  # [B, 16, 8, 8]
    ref = diffusers_flux_controlnet(2, 0, None, 13)
    d, _ = ref(hidden_states=patchify(x), controlnet_cond=patchify(feats), encoder_hidden_states=ctx,
               pooled_projections=y, timestep=t, img_ids=image_ids(4, 4, 1)[0], txt_ids=torch.zeros(5, 3),
               guidance=guidance, return_dict=False)
    assert len(got.input) == 19 and got.output == []
    _close(got.input[0], d[0])
    _close(got.input[1], d[1])
    assert got.input[2] is got.input[0] and got.input[18] is got.input[0]


def flux_prompt(strength=0.9, control_type=None):
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux_tiny.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l_tiny.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "FluxGuidance", "inputs": {"conditioning": ["3", 0], "guidance": 3.5}},
        "6": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "8": {"class_type": "VAELoader", "inputs": {"vae_name": "vae16.safetensors"}},
        "i": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0x3060c0}},
        "c": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "flux_union.safetensors"}},
        "a": {"class_type": "ControlNetApplyAdvanced", "inputs": {
            "positive": ["5", 0], "negative": ["4", 0], "control_net": ["c", 0], "image": ["i", 0],
            "strength": strength, "start_percent": 0.0, "end_percent": 1.0, "vae": ["8", 0]}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 5, "steps": 3, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
            "positive": ["a", 0], "negative": ["a", 1], "latent_image": ["6", 0], "denoise": 1.0}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["8", 0]}},
        "p": {"class_type": "PreviewImage", "inputs": {"images": ["9", 0]}},
    }
    if control_type is not None:
        p["u"] = {"class_type": "SetUnionControlNetType", "inputs": {"control_net": ["c", 0], "type": control_type}}
        p["a"]["inputs"]["control_net"] = ["u", 0]
    return p


def test_flux_workflow_xlabs_takes_no_vae(flux_models):
    """An XLabs net needs no VAE; given one it is unused (ComfyUI keeps it only for latent nets)."""
    executor = Executor(api.default_registry(), Env.from_args(models=flux_models), cache=OutputCache(max_bytes=1 << 30))
    p = flux_prompt()
    p["c"]["inputs"]["control_net_name"] = "xlabs.safetensors"
    with_vae = api.run(p, executor=executor, models=flux_models, output=flux_models / "out").outputs["7"][0].samples
    del p["a"]["inputs"]["vae"]
    without = api.run(p, executor=executor, models=flux_models, output=flux_models / "out").outputs["7"][0].samples
    assert torch.isfinite(with_vae).all() and torch.equal(with_vae, without)
    none = api.run(flux_prompt(strength=0.0), executor=executor, models=flux_models,
                   output=flux_models / "out").outputs["7"][0].samples
    assert (with_vae - none).abs().max() > 1e-4


def test_flux_workflow_unet_controlnet_union_type_ksampler(flux_models):
    """UNETLoader + ControlNetLoader + SetUnionControlNetType + Apply ControlNet (with a VAE) +
    KSampler on the tiny Flux: the net changes the result, its type changes it again, strength 0
    is no control."""
    executor = Executor(api.default_registry(), Env.from_args(models=flux_models), cache=OutputCache(max_bytes=1 << 30))

    def run(p):
        return api.run(p, executor=executor, models=flux_models, output=flux_models / "out").outputs["7"][0].samples

    auto, typed, none = run(flux_prompt()), run(flux_prompt(control_type="depth")), run(flux_prompt(strength=0.0))
    assert auto.shape == (1, 16, 8, 8) and torch.isfinite(auto).all() and torch.isfinite(typed).all()
    assert (auto - none).abs().max() > 1e-4 and (typed - auto).abs().max() > 1e-4


def test_a_flux_controlnet_is_no_flux_model(flux_models):
    """An XLabs file carries BFL double blocks: it is not refused as a Flux model file, and
    UNETLoader does not take it for one."""
    from mixgraph.nodes.families import refused

    path = flux_models / "controlnet" / "xlabs.safetensors"
    assert refused.family_of_file(path) is None
    with pytest.raises(Exception) as err:
        loader.load_unet(path)
    assert not isinstance(err.value, KeyError)


@torch.no_grad()
def test_nets_run_under_bf16(models, flux_models):
    """Under a bf16 policy the nets' conditioning embedders stay f32 and the residuals follow the
    f32 ones closely."""
    bf16 = parse_spec("bf16")
    sd3 = loader.load_checkpoint(models / "checkpoints" / "sd35.safetensors")[0]
    flux = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors")
    g = torch.Generator().manual_seed(1)
    x, hint = torch.randn(1, 16, 8, 8, generator=g), torch.randn(1, 16, 8, 8, generator=g)
    ctx, y, t = torch.randn(1, 5, 32, generator=g), torch.randn(1, 32, generator=g), torch.tensor([0.5])
    cases = [(models / "controlnet" / "sd35_canny.safetensors", sd3, t * 1000, {}),
             (models / "controlnet" / "sd3_instantx.safetensors", sd3, t * 1000, {}),
             (flux_models / "controlnet" / "flux_cn.safetensors", flux, t, {"guidance": torch.tensor([3.0])})]
    for path, model, ts, inputs in cases:
        net = loader.load_controlnet(path)
        outs = []
        for spec in (F32, bf16):
            bound = net.runner(spec).bind_model(model.runner(spec))
            args = (x, hint, ts, ctx, y) + ((inputs,) if inputs else ())
            res = bound(*args)
            outs.append((res.input or res.output)[0])
            if spec is bf16:
                emb = getattr(bound.net, "t_embedder", None) or bound.net.time_in
                assert next(emb.parameters()).dtype == torch.float32, path.name
        _close(outs[1], outs[0], 5e-2)


@torch.no_grad()
def test_flux_inpainting_net_loads_and_runs(flux_models, tmp_path):
    """A Flux net whose ``controlnet_x_embedder`` takes 17 x 4 patch values (AliMama's inpainting
    nets): concat_mask; the 17th hint channel reaches the net."""
    from tests.fixtures.tiny_flux_controlnet import diffusers_flux_controlnet

    sd = dict(diffusers_flux_controlnet(1, 1, None, seed=11).state_dict())
    sd["controlnet_x_embedder.weight"] = torch.randn(64, 68, generator=torch.Generator().manual_seed(1)) * 0.05
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "inpaint.safetensors"))
    net = loader.load_controlnet(tmp_path / "inpaint.safetensors")
    assert net.concat_mask and net.config.hint_channels == 17
    runner = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors").runner(F32)
    bound = net.runner(F32).bind_model(runner)
    g = torch.Generator().manual_seed(5)
    x, hint = torch.randn(1, 16, 8, 8, generator=g), torch.randn(1, 17, 8, 8, generator=g)
    ctx, y, t = torch.randn(1, 5, 32, generator=g), torch.randn(1, 32, generator=g), torch.tensor([0.5])
    a = bound(x, hint, t, ctx, y, {"guidance": torch.tensor([3.0])}).input[0]
    hint[:, 16] = 0
    b = bound(x, hint, t, ctx, y, {"guidance": torch.tensor([3.0])}).input[0]
    assert a.shape == (1, 16, 64) and (a - b).abs().max() > 1e-4


def test_memory_estimate_counts_dit_controlnets(models):
    """The memory estimate (``ui/estimate.py``) builds a DiT net from its handle and counts its
    weights at the sampler."""
    from mixgraph.ui.estimate import estimate

    env = Env.from_args(models=str(models))
    empty = {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    p = prompt() | {"5": empty}
    with_cn = estimate(api.load(p, api.default_registry()), api.default_registry(), env, "f32")
    without = prompt(strength=0.0) | {"5": empty}
    without["3"]["inputs"]["positive"], without["3"]["inputs"]["negative"] = ["6", 0], ["7", 0]
    del without["a"], without["c"]
    base = estimate(api.load(without, api.default_registry()), api.default_registry(), env, "f32")
    assert with_cn["nodes"]["3"]["weights_bytes"] > base["nodes"]["3"]["weights_bytes"]


def test_controlnet_apply_sd3_spec_matches_comfyui():
    info = api.default_registry().object_info()["ControlNetApplySD3"]
    req = info["input"]["required"]
    assert list(req) == ["positive", "negative", "control_net", "vae", "image", "strength", "start_percent",
                         "end_percent"]
    assert [req[k][0] for k in list(req)[:5]] == ["CONDITIONING", "CONDITIONING", "CONTROL_NET", "VAE", "IMAGE"]
    assert req["strength"][1] == {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}
    assert req["end_percent"][1] == {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.001}
    assert info["output"] == ["CONDITIONING", "CONDITIONING"] and info["output_name"] == ["positive", "negative"]
    assert (info["category"], info["display_name"]) == ("conditioning/controlnet", "Apply Controlnet with VAE")


@torch.no_grad()
def test_flux_mistoline_net(flux_models, tmp_path):
    """MistoLine nets: the image through their conv stack (written out here with ``F.conv2d``), the
    blocks as diffusers' Flux net given those features, SiLU after each head; single-block heads
    stored as ``single_controlnet_blocks`` (ComfyUI's ``convert_mistoline``)."""
    import torch.nn.functional as F

    from mixgraph.nodes.families.flux.model import image_ids, patchify
    from tests.fixtures.tiny_flux_controlnet import MISTOLINE_CONVS, diffusers_flux_controlnet, mistoline_state_dict

    sd = mistoline_state_dict(seed=21)
    save_file(sd, str(tmp_path / "misto.safetensors"))
    net = loader.load_controlnet(tmp_path / "misto.safetensors")
    assert net.config.mistoline and net.latent_format is None
    runner = loader.load_unet(flux_models / "diffusion_models" / "flux_tiny.safetensors").runner(F32)
    bound = net.runner(F32).bind_model(runner)
    g = torch.Generator().manual_seed(5)
    x, image = torch.randn(2, 16, 8, 8, generator=g), torch.rand(2, 3, 64, 64, generator=g)
    ctx, y = torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, generator=g)
    t, guidance = torch.tensor([0.7, 0.3]), torch.tensor([3.5, 2.0])
    got = bound(x, image, t, ctx, y, {"guidance": guidance})
    h = image * 2 - 1
    for j, (kernel, stride) in enumerate(MISTOLINE_CONVS):
        if j:
            h = F.silu(h)
        h = F.conv2d(h, sd[f"input_cond_block.encoder.{2 * j}.weight"], sd[f"input_cond_block.encoder.{2 * j}.bias"],
                     stride=stride, padding=kernel // 2)
    ref = diffusers_flux_controlnet(1, 1, None, 21)
    d, s = ref(hidden_states=patchify(x), controlnet_cond=patchify(h), encoder_hidden_states=ctx,
               pooled_projections=y, timestep=t, img_ids=image_ids(4, 4, 1)[0], txt_ids=torch.zeros(5, 3),
               guidance=guidance, return_dict=False)
    assert len(got.input) == 19 and len(got.output) == 38
    _close(got.input[0], F.silu(d[0]))
    _close(got.output[0], F.silu(s[0]))
