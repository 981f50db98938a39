"""The Flux runner's joint attention mask (StyleModelApply's "attn_bias", e.g. with Redux):
the cond's [B, T + R, T + R] additive bias stretched to the model's image tokens and added to the
attention scores of every double and single block (ComfyUI ``model_base.Flux.extra_conds`` and
``ldm/flux``). The reference is diffusers' ``FluxTransformer2DModel`` on the same weights given
the same additive mask (its attention processors take ``attention_mask``), and a mask stretched
by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.model import Flux, image_ids, patchify, unpatchify
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.ui import api
from tests.flux_fixtures import TINY, flux_state_dict

F32 = parse_spec("f32")


def _diffusers_flux(sd):
    from diffusers import FluxTransformer2DModel

    cfg = TINY
    ref = FluxTransformer2DModel(patch_size=1, in_channels=cfg.in_channels * 4, out_channels=cfg.out_channels * 4,
                                 num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
                                 attention_head_dim=cfg.head_dim, num_attention_heads=cfg.num_heads,
                                 joint_attention_dim=cfg.context_in_dim, pooled_projection_dim=cfg.vec_in_dim,
                                 guidance_embeds=cfg.guidance_embed, axes_dims_rope=cfg.axes_dim).eval()
    converted = diffusers_keys.to_diffusers(sd, ref.state_dict().keys())
    ref.load_state_dict({k: v.clone() for k, v in converted.items()}, strict=True)
    return ref


def _reference(ref, x, t, ctx, pooled, guidance, mask):
    """diffusers' velocity for x [B, C, H, W] with the additive ``mask`` [B, L, L] over [text; image]."""
    h, w = x.shape[-2:]
    with torch.no_grad():
        out = ref(hidden_states=patchify(x), encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                  img_ids=image_ids(-(-h // 2), -(-w // 2), 1)[0], txt_ids=torch.zeros(ctx.shape[1], 3),
                  guidance=guidance, joint_attention_kwargs={"attention_mask": mask[:, None]},
                  return_dict=False)[0]
    return unpatchify(out, h, w)


def test_the_mask_enters_every_block_as_diffusers_adds_it():
    """A random additive bias over [text; image]: our model equals diffusers' with the same mask,
    and differs from the unmasked call (the mask is used)."""
    sd = flux_state_dict(TINY, seed=1)
    ours = Flux(TINY).eval()
    ours.load_state_dict(sd)
    ref = _diffusers_flux(sd)
    g = torch.Generator().manual_seed(2)
    x, ctx = torch.randn(1, 16, 6, 8, generator=g), torch.randn(1, 5, 32, generator=g)
    pooled, t, guidance = torch.randn(1, 32, generator=g), torch.tensor([0.6]), torch.tensor([3.5])
    n = 5 + 3 * 4
    mask = torch.randn(1, n, n, generator=g) * 2.0
    mask[:, :, 2] = -math.inf  # one key masked out for every query
    with torch.no_grad():
        got = ours(x, t, ctx, pooled, guidance, attn_mask=mask)
        plain = ours(x, t, ctx, pooled, guidance)
    want = _reference(ref, x, t, ctx, pooled, guidance, mask)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert not torch.allclose(got, plain, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# through the engine: CLIPVisionLoader (SigLIP) + StyleModelLoader (Redux) + StyleModelApply


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.tiny_vision import tiny_redux_state_dict, write_siglip_vision
    from tests.flux_fixtures import write_flux_models

    root = tmp_path_factory.mktemp("flux_mask")
    write_flux_models(root)
    write_siglip_vision(root / "clip_vision" / "sigclip_tiny.safetensors", seed=1)
    (root / "style_models").mkdir()
    save_file(tiny_redux_state_dict(seed=2, context_dim=32), str(root / "style_models" / "redux.safetensors"))
    (root / "in").mkdir()
    pixels = (torch.rand(40, 40, 3, generator=torch.Generator().manual_seed(9)).numpy() * 255).round()
    Image.fromarray(pixels.astype(np.uint8)).save(root / "in" / "ref.png")
    return root


def _graph(strength: float, strength_type: str):
    g = api.Graph(precision="f32")
    unet = g.add("UNETLoader", unet_name="flux_tiny.safetensors", weight_dtype="default")
    clip = g.add("CLIPLoader", clip_name="clip_l_tiny.safetensors", type="stable_diffusion")
    pos = g.add("CLIPTextEncode", text="a red cube", clip=clip)
    cv = g.add("CLIPVisionLoader", clip_name="sigclip_tiny.safetensors")
    vis = g.add("CLIPVisionEncode", clip_vision=cv, image=g.add("LoadImage", image="ref.png"), crop="center")
    sm = g.add("StyleModelLoader", style_model_name="redux.safetensors")
    app = g.add("StyleModelApply", conditioning=pos, style_model=sm, clip_vision_output=vis, strength=strength,
                strength_type=strength_type)
    ks = g.add("KSampler", model=unet, seed=3, steps=2, cfg=1.0, sampler_name="euler", scheduler="simple",
               positive=app, negative=g.add("CLIPTextEncode", text="", clip=clip),
               latent_image=g.add("EmptySD3LatentImage", width=48, height=40, batch_size=1), denoise=1.0)
    g.add("SaveLatent", samples=ks, filename_prefix="mask/ks")
    return g, unet, pos, app, ks


def _stretched_by_hand(mask: torch.Tensor, n_txt: int, n_img: int) -> torch.Tensor:
    """A mask whose image part is one stand-in token (attention_mask_img_shape (1, 1)) over
    ``n_img`` image tokens: every image query row and key column is the stand-in's."""
    t = n_txt
    m = mask[0].float()
    out = torch.empty(t + n_img, t + n_img)
    out[:t, :t] = m[:t, :t]
    out[:t, t:] = m[:t, t:t + 1]
    out[t:, :t] = m[t:t + 1, :t]
    out[t:, t:] = m[t, t]
    return out[None]


def test_redux_attn_bias_workflow_against_diffusers_with_the_same_mask(models):
    g, unet, pos, app, ks = _graph(0.5, "attn_bias")
    res = api.run(g, models=models, input=models / "in", output=models / "out")
    (cond,) = res[app.node_id][0]
    handle = res[unet.node_id][0]
    n_txt = cond.cross_attn.shape[1]  # text + 16 Redux tokens
    assert cond.model_inputs["attention_mask"].shape == (1, n_txt + 1, n_txt + 1)
    latent_shape = (1, 16, 5, 6)  # 40 x 48 pixels: a 3 x 3 token grid (5 rows rounded up)
    with torch.inference_mode():  # the weight store holds the weights the sampler (in inference mode) read
        runner = handle.runner(F32)
        inputs = runner.cond_inputs(cond, latent_shape)
    want_mask = _stretched_by_hand(cond.model_inputs["attention_mask"], n_txt, 9)
    torch.testing.assert_close(inputs["attn_mask"].clone(), want_mask, rtol=0, atol=0)
    # log(0.5) in the Redux columns for text and image queries, 0 elsewhere
    redux = slice(n_txt - 16, n_txt)
    assert torch.allclose(want_mask[0, :n_txt - 16, redux], torch.tensor(math.log(0.5)), atol=1e-3)
    assert torch.allclose(want_mask[0, n_txt:, redux], torch.tensor(math.log(0.5)), atol=1e-3)
    assert (want_mask[0, redux] == 0).all()

    x = torch.randn(latent_shape, generator=torch.Generator().manual_seed(4))
    t = torch.tensor([0.8])
    with torch.inference_mode():
        got = runner(x, t, cond.cross_attn, inputs).clone()
    inputs = {k: v.clone() for k, v in inputs.items()}
    ref = _diffusers_flux(flux_state_dict(TINY, seed=3))  # write_flux_models' weights
    want = _reference(ref, x, t, cond.cross_attn, inputs["y"], inputs["guidance"], want_mask)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()

    # the sampled latent: finite, and the bias changes it (strength 1 records no mask: multiply 1)
    biased = res[ks.node_id][0].samples
    g1, *_, ks1 = _graph(1.0, "multiply")
    plain = api.run(g1, models=models, input=models / "in", output=models / "out")[ks1.node_id][0].samples
    assert torch.isfinite(biased).all() and not torch.allclose(biased, plain, atol=1e-4)


def _runner(models):
    """The tiny Flux's runner, in inference mode (the store's weights may be inference tensors)."""
    from mixgraph.nodes.models import loader

    return loader.load_unet(models / "diffusion_models" / "flux_tiny.safetensors").runner(F32)


@torch.inference_mode()
def test_kontext_references_with_a_joint_mask_are_refused(models):
    from mixgraph.nodes.adapters.style_model import append_style_tokens

    runner = _runner(models)
    (cond,) = append_style_tokens((Cond(torch.zeros(1, 4, 32)),), torch.ones(1, 2, 32), 0.5, "attn_bias")
    assert runner.cond_inputs(cond, (1, 16, 4, 4))["attn_mask"].shape == (1, 10, 10)
    kontext = Cond(cond.cross_attn, model_inputs={**cond.model_inputs, "reference_latents": [torch.zeros(1, 16, 4, 4)]})
    with pytest.raises(NotImplementedError, match="Kontext reference latents"):
        runner.cond_inputs(kontext, (1, 16, 4, 4))
    bad = Cond(cond.cross_attn, model_inputs={"attention_mask": cond.model_inputs["attention_mask"]})
    with pytest.raises(NotImplementedError, match="without attention_mask_img_shape"):
        runner.cond_inputs(bad, (1, 16, 4, 4))


@torch.inference_mode()
def test_a_text_token_mask_still_masks_the_keys(models):
    """Chroma's T5 padding mask ([1, T], two dims) keeps its path: the padded text keys are
    ignored, so their values do not matter."""
    runner = _runner(models)
    g = torch.Generator().manual_seed(6)
    ctx = torch.randn(1, 6, 32, generator=g)
    cond = Cond(ctx, model_inputs={"attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0]])})
    inputs = runner.cond_inputs(cond, (1, 16, 4, 4))
    assert "attn_mask" not in inputs and inputs["txt_mask"].shape == (1, 6)
    x = torch.randn(1, 16, 4, 4, generator=g)
    other = ctx.clone()
    other[:, 4:] = torch.randn(1, 2, 32, generator=g)
    a = runner(x, torch.tensor([0.5]), ctx, inputs)
    b = runner(x, torch.tensor([0.5]), other, inputs)
    assert torch.allclose(a, b, atol=1e-5)


def test_a_mask_over_other_tokens_is_refused_in_the_model():
    """An area-restricted cond sees fewer image tokens than the runner stretched the mask to."""
    model = Flux(TINY).eval()
    x, ctx = torch.zeros(1, 16, 4, 4), torch.zeros(1, 3, 32)
    with pytest.raises(NotImplementedError, match="3 text \\+ 4 image tokens"):
        model(x, torch.tensor([0.5]), ctx, torch.zeros(1, 32), torch.tensor([1.0]), attn_mask=torch.zeros(1, 9, 9))
