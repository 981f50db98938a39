"""GLIGEN: the loader (fusers in UNet order, sizes from shapes), the position net and gated
self-attention against diffusers' implementations, the box -> latent grid rule, the fusers
patched between self- and cross-attention, and the two nodes end to end on a tiny SD1 model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.adapters.gligen import GligenBoxes, fourier_embed, grounding_patch, load_gligen
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.ui import api
from tests.fixtures.tiny_unet import tiny_unet_config
from tests.fixtures.tiny_vision import gligen_state_dict

F32 = parse_spec("f32")
KEY = 32  # the tiny SD1 text width


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("gligen_models")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    (root / "gligen").mkdir()
    cfg = tiny_unet_config("sd15")
    save_file(gligen_state_dict(cfg, KEY, seed=1, gates=1.0), str(root / "gligen" / "tiny.safetensors"))
    save_file(gligen_state_dict(cfg, KEY, seed=1, gates=0.0), str(root / "gligen" / "closed.safetensors"))
    return root


def test_gligen_loader_orders_fusers_as_the_unet_calls_them(models):
    handle = load_gligen(models / "gligen" / "tiny.safetensors")
    # tiny SD1 UNet: transformers in input block 1 (32 ch), the middle (64), output blocks 2, 3 (32)
    assert handle.config.query_dims == (32, 64, 32, 32)
    assert (handle.config.key_dim, handle.config.position_in, handle.config.position_out) == (KEY, KEY, KEY)
    module = handle.runner(F32)
    sd = gligen_state_dict(tiny_unet_config("sd15"), KEY, seed=1, gates=1.0)
    torch.testing.assert_close(module.module_list[1].linear.weight,
                               sd["middle_block.1.transformer_blocks.0.fuser.linear.weight"])
    torch.testing.assert_close(module.module_list[3].attn.to_q.weight,
                               sd["output_blocks.3.1.transformer_blocks.0.fuser.attn.to_q.weight"])


def test_gligen_loader_refuses_other_files(tmp_path):
    save_file({"x.weight": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a GLIGEN model"):
        load_gligen(tmp_path / "x.safetensors")


def test_gligen_position_net_and_fuser_match_diffusers(models):
    from diffusers.models.attention import GatedSelfAttentionDense as RefFuser
    from diffusers.models.embeddings import GLIGENTextBoundingboxProjection

    module = load_gligen(models / "gligen" / "tiny.safetensors").runner(F32)
    g = torch.Generator().manual_seed(3)
    boxes, masks = torch.rand(2, 30, 4, generator=g), (torch.rand(2, 30, generator=g) > 0.5).float()
    embeds = torch.randn(2, 30, KEY, generator=g)
    ref_pos = GLIGENTextBoundingboxProjection(KEY, KEY).eval()
    ref_pos.load_state_dict(module.position_net.state_dict())
    with torch.no_grad():
        objs = module.position_net(boxes, masks, embeds)
        torch.testing.assert_close(objs, ref_pos(boxes, masks, positive_embeddings=embeds), rtol=1e-5, atol=1e-5)
        fuser = module.module_list[1]  # 64 wide: one 64-wide head on both sides
        ref = RefFuser(64, KEY, 1, 64).eval()
        ref.load_state_dict(fuser.state_dict())
        x = torch.randn(2, 16, 64, generator=g)
        torch.testing.assert_close(fuser(x, objs), ref(x, objs), rtol=1e-5, atol=1e-5)


def test_fourier_embedding_orders_sin_then_cos_per_frequency():
    box = torch.tensor([[0.1, 0.2, 0.6, 0.9]])
    emb = fourier_embed(box)
    assert emb.shape == (1, 64)
    f1 = 100 ** (1 / 8)
    torch.testing.assert_close(emb[0, 8:12], torch.sin(f1 * box[0]))
    torch.testing.assert_close(emb[0, 12:16], torch.cos(f1 * box[0]))


def test_grounding_patch_normalises_latent_boxes_by_the_evaluated_latent(models):
    handle = load_gligen(models / "gligen" / "tiny.safetensors")
    module = handle.runner(F32)
    pooled = torch.randn(1, KEY)
    # a 64 x 48 px box at (16, 8) px -> latent (h 6, w 8, y 1, x 2) on a 10 x 20 latent
    patch = grounding_patch(GligenBoxes(handle, ((pooled, 6, 8, 1, 2),)), module, batch=2, h=10, w=20)
    boxes = torch.zeros(1, 30, 4)
    boxes[0, 0] = torch.tensor([2 / 20, 1 / 10, 10 / 20, 7 / 10])
    masks = torch.zeros(1, 30)
    masks[0, 0] = 1.0
    embeds = torch.zeros(1, 30, KEY)
    embeds[0, 0] = pooled[0]
    with torch.no_grad():
        expected = module.position_net(boxes, masks, embeds)
    assert patch.objs.shape == (2, 30, KEY)
    torch.testing.assert_close(patch.objs[1:], expected, rtol=1e-6, atol=1e-6)


def _sample(models, tmp_path, gligen_name=None, seed=5):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    pos = g.add("CLIPTextEncode", text="a cat and a dog", clip=ck[1])
    box = None
    if gligen_name is not None:
        gl = g.add("GLIGENLoader", gligen_name=gligen_name)
        box = g.add("GLIGENTextBoxApply", conditioning_to=pos, clip=ck[1], gligen_textbox_model=gl,
                    text="a cat", width=16, height=24, x=8, y=0)
        pos = g.add("GLIGENTextBoxApply", conditioning_to=box, clip=ck[1], gligen_textbox_model=gl,
                    text="a dog", width=16, height=16, x=16, y=16)
    ks = g.add("KSampler", model=ck[0], seed=seed, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
               latent_image=g.add("EmptyLatentImage", width=32, height=32, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    out = api.run(g, models=models, output=tmp_path)
    return out, pos, ks


def test_gligen_nodes_ground_boxes_end_to_end(models, tmp_path):
    out, pos, ks = _sample(models, tmp_path, "tiny.safetensors")
    (cond,) = out[pos.node_id][0]
    # pixels // 8: (height, width, y, x) in latent px, both boxes kept in order
    assert [b[1:] for b in cond.gligen.boxes] == [(3, 2, 0, 1), (2, 2, 2, 2)]
    assert cond.gligen.boxes[0][0].shape == (1, KEY)
    plain, _, ks_plain = _sample(models, tmp_path)
    closed, _, ks_closed = _sample(models, tmp_path, "closed.safetensors")
    a, b = out[ks.node_id][0].samples, plain[ks_plain.node_id][0].samples
    assert torch.isfinite(a).all() and (a - b).abs().max() > 1e-2  # open gates steer the sample
    # closed gates (tanh(0) = 0): the fusers add nothing, the sample is the plain one (up to the
    # summation order: a grounded cond is evaluated apart, not batched with the negative)
    torch.testing.assert_close(closed[ks_closed.node_id][0].samples, b, rtol=1e-4, atol=5e-4)


def test_gligen_cond_in_cfg_equals_its_own_evaluation(models, tmp_path):
    out, pos, _ = _sample(models, tmp_path, "tiny.safetensors")
    model = out["1"][0]  # the checkpoint loader
    (cond,) = out[pos.node_id][0]
    plain = Cond(cond.cross_attn * 0.5)
    latent = torch.zeros(1, 4, 4, 4)
    x, sigma = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([2.0])
    with torch.inference_mode():
        runner = model.runner(F32)
        both = CFGDenoiser(runner, (cond,), (plain,), 3.0, latent)(x, sigma)
        grounded = CFGDenoiser(runner, (cond,), (plain,), 1.0, latent)(x, sigma)  # cfg 1: positive only
        negative = CFGDenoiser(runner, (plain,), (plain,), 1.0, latent)(x, sigma)
    torch.testing.assert_close(both, negative + 3.0 * (grounded - negative), rtol=1e-4, atol=1e-4)
    assert (grounded - CFGDenoiser(runner, (Cond(cond.cross_attn),), (plain,), 1.0, latent)(x, sigma)).abs().max() > 1e-3
