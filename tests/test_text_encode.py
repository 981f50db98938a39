"""Prompt encoding: ComfyUI weighting, chunking, embeddings, layer choice, SDXL/SD2 layouts."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel
from mixgraph.nodes.encoders.text_encode import TextEncoder, encode_prompt
from mixgraph.nodes.families.sd.encoders import sd_text_encoders, text_encoders_from_checkpoint
from mixgraph.nodes.encoders.tokenizer import END_TOKEN, START_TOKEN, CLIPTokenizer
from mixgraph.nodes.payloads.conditioning import Cond
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict, tiny_open_clip_state_dict


@pytest.fixture(scope="module")
def tok() -> CLIPTokenizer:
    return CLIPTokenizer()


@pytest.fixture(scope="module")
def sd1() -> tuple[TextEncoder, ...]:
    clip_l = CLIPTextModel.from_state_dict(tiny_clip_l_state_dict(seed=0), activation="quick_gelu")
    return sd_text_encoders("sd1", clip_l=clip_l)


@pytest.fixture(scope="module")
def sdxl() -> tuple[TextEncoder, ...]:
    ckpt = {"conditioner.embedders.0.transformer." + k: v for k, v in tiny_clip_l_state_dict(seed=1).items()}
    ckpt |= {"conditioner.embedders.1.model." + k: v for k, v in tiny_open_clip_state_dict(1, 32, 3, 32).items()}
    return text_encoders_from_checkpoint(ckpt, "sdxl")


def _model(encoders: tuple[TextEncoder, ...], name: str) -> CLIPTextModel:
    return next(e.model for e in encoders if e.name == name)


def _ids(tokens: list[int]) -> torch.Tensor:
    return torch.tensor([tokens + [END_TOKEN] * (77 - len(tokens))])


def _one(conds: tuple[Cond, ...]) -> Cond:
    assert len(conds) == 1 and isinstance(conds[0], Cond)
    return conds[0]


def test_encode_prompt_sd1_default_last_layer(sd1, tok):
    c = _one(encode_prompt(sd1, "a photo of a cat", layer_idx=None))
    with torch.no_grad():
        hidden, pooled = _model(sd1, "clip_l")(_ids(tok("a photo of a cat")))
    assert c.cross_attn.shape == (1, 77, 32) and c.cross_attn.dtype == torch.float32
    torch.testing.assert_close(c.cross_attn, hidden, atol=0, rtol=0)
    torch.testing.assert_close(c.pooled, pooled, atol=0, rtol=0)


def test_encode_prompt_sd1_clip_skip_is_normed_penultimate(sd1, tok):
    c = _one(encode_prompt(sd1, "a photo of a cat", layer_idx=-2))
    c_last = _one(encode_prompt(sd1, "a photo of a cat", layer_idx=-1))
    c_default = _one(encode_prompt(sd1, "a photo of a cat"))
    with torch.no_grad():
        pen, _ = _model(sd1, "clip_l")(_ids(tok("a photo of a cat")), -2, norm_hidden=True)
    torch.testing.assert_close(c.cross_attn, pen, atol=0, rtol=0)
    torch.testing.assert_close(c_last.cross_attn, c_default.cross_attn, atol=1e-6, rtol=0)
    # |n| > layers falls back to the last layer (ComfyUI set_clip_options)
    c_far = _one(encode_prompt(sd1, "a photo of a cat", layer_idx=-24))
    torch.testing.assert_close(c_far.cross_attn, c_default.cross_attn, atol=0, rtol=0)


def test_encode_prompt_weight_one_equals_unweighted(sd1, tok):
    a = _one(encode_prompt(sd1, "a cat sitting", layer_idx=-2))
    b = _one(encode_prompt(sd1, "a (cat:1.0) sitting", layer_idx=-2))
    torch.testing.assert_close(a.cross_attn, b.cross_attn, atol=0, rtol=0)


def test_encode_prompt_weight_formula_exact(sd1, tok):
    c = _one(encode_prompt(sd1, "a (cat:1.3) sitting", layer_idx=-2))
    rows = torch.cat([_ids(tok("a cat sitting")), _ids([START_TOKEN, END_TOKEN])])  # prompt + empty
    with torch.no_grad():
        hidden, pooled = _model(sd1, "clip_l")(rows, -2, norm_hidden=True)
    z, z_empty = hidden[0], hidden[1]
    expected = z.clone()
    expected[2] = (z[2] - z_empty[2]) * 1.3 + z_empty[2]  # "cat" is token 2 after <start>, "a"
    assert torch.equal(c.cross_attn[0], expected)
    assert not torch.equal(expected[2], z[2])
    torch.testing.assert_close(c.pooled, pooled[:1], atol=0, rtol=0)  # pooled is not weighted


def test_encode_prompt_long_prompt_two_chunks(sd1, tok):
    text = " ".join(["cat"] * 80)
    c = _one(encode_prompt(sd1, text))
    assert c.cross_attn.shape == (1, 154, 32)
    with torch.no_grad():
        first, pooled = _model(sd1, "clip_l")(_ids([START_TOKEN] + [2368] * 75 + [END_TOKEN]))
        second, _ = _model(sd1, "clip_l")(_ids([START_TOKEN] + [2368] * 5 + [END_TOKEN]))
    torch.testing.assert_close(c.cross_attn[:, :77], first, atol=1e-6, rtol=0)
    torch.testing.assert_close(c.cross_attn[:, 77:], second, atol=1e-6, rtol=0)
    torch.testing.assert_close(c.pooled, pooled, atol=1e-6, rtol=0)  # from the first chunk


def test_encode_prompt_embedding_injection(sd1, tok):
    cat_row = _model(sd1, "clip_l").text_model.embeddings.token_embedding.weight[2368].detach()
    lookup = {"kitty": cat_row[None], "wide": torch.zeros(1, 99)}.get
    plain = _one(encode_prompt(sd1, "a cat sitting"))
    injected = _one(encode_prompt(sd1, "a embedding:kitty sitting", embedding_lookup=lookup))
    torch.testing.assert_close(injected.cross_attn, plain.cross_attn, atol=0, rtol=0)
    torch.testing.assert_close(injected.pooled, plain.pooled, atol=0, rtol=0)

    warnings: list[str] = []
    missing = _one(encode_prompt(sd1, "a embedding:nope sitting", embedding_lookup=lookup, warn=warnings.append))
    torch.testing.assert_close(missing.cross_attn, _one(encode_prompt(sd1, "a sitting")).cross_attn, atol=0, rtol=0)
    assert len(warnings) == 1 and "nope" in warnings[0]

    warnings.clear()
    wrong = _one(encode_prompt(sd1, "a embedding:wide sitting", embedding_lookup=lookup, warn=warnings.append))
    torch.testing.assert_close(wrong.cross_attn, _one(encode_prompt(sd1, "a sitting")).cross_attn, atol=0, rtol=0)
    assert len(warnings) == 1 and "99" in warnings[0]


def test_encode_prompt_sdxl_concat_and_pooled(sdxl, tok):
    c = _one(encode_prompt(sdxl, "a photo of a cat"))
    ids = tok("a photo of a cat")
    with torch.no_grad():
        l_pen, _ = _model(sdxl, "clip_l")(_ids(ids), -2)
        g_ids = torch.tensor([ids + [0] * (77 - len(ids))])  # clip_g pads with 0
        g_pen, g_pooled = _model(sdxl, "clip_g")(g_ids, -2)
    assert c.cross_attn.shape == (1, 77, 64) and c.pooled.shape == (1, 32)
    torch.testing.assert_close(c.cross_attn[..., :32], l_pen, atol=0, rtol=0)  # raw penultimate
    torch.testing.assert_close(c.cross_attn[..., 32:], g_pen, atol=0, rtol=0)
    torch.testing.assert_close(c.pooled, g_pooled, atol=0, rtol=0)


def test_encode_prompt_sdxl_real_widths(tok):
    def model(width, proj, act):
        torch.manual_seed(0)  # default init, seeded; only shapes and finiteness are checked
        return CLIPTextModel(CLIPTextConfig(49408, width, 2, width // 64, 77, 4 * width, proj, act)).eval()

    enc = sd_text_encoders("sdxl", clip_l=model(768, None, "quick_gelu"), clip_g=model(1280, 1280, "gelu"))
    c = _one(encode_prompt(enc, "a (photo:1.2) of a cat"))
    assert c.cross_attn.shape == (1, 77, 2048) and c.pooled.shape == (1, 1280)
    assert torch.isfinite(c.cross_attn).all()
    refiner = sd_text_encoders("sdxl_refiner", clip_g=_model(enc, "clip_g"))
    r = _one(encode_prompt(refiner, "a cat"))
    assert r.cross_attn.shape == (1, 77, 1280) and r.pooled.shape == (1, 1280)


def test_encode_prompt_sd2_normed_penultimate_projected_pooled(tok):
    ckpt = {"cond_stage_model.model." + k: v for k, v in tiny_open_clip_state_dict(2, 48, 3, 48).items()}
    enc = text_encoders_from_checkpoint(ckpt, "sd2")
    c = _one(encode_prompt(enc, "a photo of a cat"))
    ids = tok("a photo of a cat")
    with torch.no_grad():
        pen, pooled = _model(enc, "clip_h")(torch.tensor([ids + [0] * (77 - len(ids))]), -2, norm_hidden=True)
    torch.testing.assert_close(c.cross_attn, pen, atol=0, rtol=0)
    torch.testing.assert_close(c.pooled, pooled, atol=0, rtol=0)


def test_text_encoders_require_their_models():
    with pytest.raises(ValueError, match="clip_g"):
        sd_text_encoders("sdxl", clip_l=None, clip_g=None)
    with pytest.raises(ValueError, match="kind"):
        sd_text_encoders("sd3")
    with pytest.raises(ValueError, match="at least one"):
        encode_prompt((), "a cat")


def test_encode_prompt_under_bf16_policy_stays_f32(sd1, tok):
    from dataclasses import dataclass

    from mixgraph.nodes.weights.cast import apply_precision

    @dataclass(frozen=True)
    class Policy:
        storage: torch.dtype = torch.bfloat16
        compute: torch.dtype = torch.bfloat16
        upcast_attention: bool = True
        f32_norms: bool = True
        int8: bool = False

    lookup = {"x": torch.randn(2, 32, generator=torch.Generator().manual_seed(0))}.get
    text = "a (cat:1.2) embedding:x sitting"
    ref = _one(encode_prompt(sd1, text, embedding_lookup=lookup))
    half = sd_text_encoders("sd1", clip_l=apply_precision(_model(sd1, "clip_l"), Policy()))
    c = _one(encode_prompt(half, text, embedding_lookup=lookup))
    assert c.cross_attn.dtype == torch.float32 and c.pooled.dtype == torch.float32
    err = (c.cross_attn - ref.cross_attn).abs().max() / ref.cross_attn.abs().max()
    assert 0 < err < 0.05
