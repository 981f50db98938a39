"""Qwen-Image's transformer against diffusers' ``QwenImageTransformer2DModel`` on a tiny config
(the same weights: both read ComfyUI's / diffusers' shared key names): text-to-image, Edit's
reference latents ("index" positions), Edit-2511's timestep-zero references (diffusers'
``zero_cond_t``), and ComfyUI's 5-D one-frame latents.

Token grids are even-sized: for an odd grid ComfyUI (whose positions we follow) centres rows at
r − h // 2 and diffusers at r − (h // 2 + 1). References are no larger than the sampled latent:
diffusers starts the text positions after the largest image, ComfyUI after the sampled one. The
packing into tokens is diffusers' pipeline's (``_pack_latents`` / ``_unpack_latents``)."""

from __future__ import annotations

import torch
from diffusers import QwenImagePipeline

from mixgraph.nodes.families.qwen_image.detect import qwen_image_config
from mixgraph.nodes.families.qwen_image.model import QwenImage
from tests.fixtures.tiny_qwen_image import CONTEXT_WIDTH, MARKER, QWEN_IMAGE_TINY, reference_qwen_image


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(a, b, rel=1e-4):
    assert a.shape == b.shape
    err = float((a - b).abs().max() / b.abs().max())
    assert err < rel, f"relative error {err:.2e}"


def _pack(x):
    b, c, h, w = x.shape
    return QwenImagePipeline._pack_latents(x, b, c, h, w)


def _unpack(tokens, h, w):
    return QwenImagePipeline._unpack_latents(tokens, h * 8, w * 8, 8)[:, :, 0]  # [B, C, 1, H, W] -> 4-D


def _ours(ref, marker=False):
    sd = dict(ref.state_dict())
    if marker:
        sd[MARKER] = torch.empty(0)
    cfg = qwen_image_config(sd)
    model = QwenImage(cfg).eval()
    model.load_state_dict({k: v for k, v in sd.items() if k != MARKER}, strict=True)
    return model


def test_text_to_image_matches_diffusers():
    ref = reference_qwen_image(seed=1)
    model = _ours(ref)
    assert model.cfg == QWEN_IMAGE_TINY
    x, context, sigma = _rand(2, 16, 8, 12, seed=2), _rand(2, 7, CONTEXT_WIDTH, seed=3), torch.tensor([0.3, 0.85])
    with torch.no_grad():
        expected = _unpack(ref(hidden_states=_pack(x), encoder_hidden_states=context, timestep=sigma,
                               img_shapes=[[(1, 4, 6)]] * 2, return_dict=False)[0], 8, 12)
        _close(model(x, sigma, context), expected)
        # ComfyUI's 5-D one-frame latent: the same numbers, the shape given back
        _close(model(x[:, :, None], sigma, context), expected[:, :, None])


def test_reference_latents_match_diffusers_edit_tokens():
    """Two references after the image tokens, at frame indices 1 and 2 (ComfyUI's "index",
    diffusers' Edit pipelines' ``img_shapes``), each centred on its own grid."""
    ref = reference_qwen_image(seed=4)
    model = _ours(ref)
    x, context, sigma = _rand(1, 16, 8, 12, seed=5), _rand(1, 9, CONTEXT_WIDTH, seed=6), torch.tensor([0.6])
    r1, r2 = _rand(1, 16, 8, 8, seed=7), _rand(1, 16, 4, 12, seed=8)
    tokens = torch.cat([_pack(x), _pack(r1), _pack(r2)], dim=1)
    with torch.no_grad():
        out = ref(hidden_states=tokens, encoder_hidden_states=context, timestep=sigma,
                  img_shapes=[[(1, 4, 6), (1, 4, 4), (1, 2, 6)]], return_dict=False)[0]
        expected = _unpack(out[:, :24], 8, 12)
        ours = model(x, sigma, context, ref_latents=[r1, r2[:, :, None]], ref_method="index")
        _close(ours, expected)
        assert not torch.allclose(ours, model(x, sigma, context), atol=1e-3)  # the references matter
        assert not torch.allclose(ours, model(x, sigma, context, [r1, r2], "offset"), atol=1e-3)


def test_timestep_zero_references_match_diffusers_zero_cond_t():
    """Edit-2511: the reference tokens modulated by timestep 0 (diffusers' ``zero_cond_t``); a
    file with Comfy-Org's marker defaults to that method."""
    ref = reference_qwen_image(seed=9, zero_cond_t=True)
    model = _ours(ref, marker=True)
    assert model.cfg.default_ref_method == "index_timestep_zero"
    x, context, sigma = _rand(2, 16, 8, 8, seed=10), _rand(2, 5, CONTEXT_WIDTH, seed=11), torch.tensor([0.9, 0.4])
    r1 = _rand(1, 16, 8, 8, seed=12)
    tokens = torch.cat([_pack(x), _pack(r1.expand(2, -1, -1, -1))], dim=1)
    with torch.no_grad():
        out = ref(hidden_states=tokens, encoder_hidden_states=context, timestep=sigma,
                  img_shapes=[[(1, 4, 4), (1, 4, 4)]] * 2, return_dict=False)[0]
        expected = _unpack(out[:, :16], 8, 8)
        _close(model(x, sigma, context, ref_latents=[r1]), expected)
        plain = model(x, sigma, context, ref_latents=[r1], ref_method="index")
        assert not torch.allclose(plain, expected, atol=1e-3)


def test_positions_follow_comfyui():
    """ComfyUI's ``process_img`` / ``_forward`` positions, worked by hand: text after the sampled
    image's grid on all three axes, grids centred at r − h // 2, "offset" references at frame 1
    placed below or right of the ones before (whichever keeps the canvas squarer), "index" ones
    at frames 1, 2, ... A 7 x 10 latent is a 4 x 5 grid (padded circularly to 8 x 10)."""
    from mixgraph.nodes.families.qwen_image.model import token_positions

    pos = token_positions((7, 10), [], "index", n_txt=2)
    assert pos[:2].tolist() == [[2, 2, 2], [3, 3, 3]]  # max(4 // 2, 5 // 2) = 2
    assert pos[2].tolist() == [0, -2, -2] and pos[-1].tolist() == [0, 1, 2]
    refs = [(8, 8), (8, 12)]
    index = token_positions((8, 8), refs, "index", n_txt=1)
    assert index[1 + 16].tolist() == [1, -2, -2] and index[1 + 32].tolist() == [2, -2, -3]
    offset = token_positions((8, 8), refs, "offset", n_txt=1)
    # first reference at (0, 0); the second below it: 8 + 8 > 12 + 8 is false -> h offset 8 px = 4 rows
    assert offset[1 + 16].tolist() == [1, -2, -2] and offset[1 + 32].tolist() == [1, 4 - 2, -3]
    assert torch.equal(token_positions((8, 8), refs, "uxo", 1), offset)
    assert torch.equal(token_positions((8, 8), refs, "index_timestep_zero", 1), index)


def test_odd_latent_sizes_keep_their_shape():
    model = QwenImage(QWEN_IMAGE_TINY).eval()
    x = _rand(1, 16, 7, 9, seed=13)
    with torch.no_grad():
        out = model(x, torch.tensor([0.5]), _rand(1, 3, CONTEXT_WIDTH, seed=14))
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_padded_text_matches_diffusers_encoder_mask():
    """A batch of a 4-token and a 9-token prompt, the shorter padded: its padded keys are masked
    out as diffusers' ``encoder_hidden_states_mask`` does; an all-ones mask changes nothing."""
    ref = reference_qwen_image(seed=15)
    model = _ours(ref)
    x, context, sigma = _rand(2, 16, 8, 8, seed=16), _rand(2, 9, CONTEXT_WIDTH, seed=17), torch.tensor([0.5, 0.2])
    mask = torch.ones(2, 9)
    mask[0, 4:] = 0
    with torch.no_grad():
        expected = _unpack(ref(hidden_states=_pack(x), encoder_hidden_states=context, encoder_hidden_states_mask=mask,
                               timestep=sigma, img_shapes=[[(1, 4, 4)]] * 2, return_dict=False)[0], 8, 8)
        _close(model(x, sigma, context, txt_mask=mask), expected)
        assert torch.equal(model(x, sigma, context, txt_mask=torch.ones(2, 9)), model(x, sigma, context))
