"""Flux Redux: the projector loaded by StyleModelLoader from its real keys, StyleModelApply's two
strength types (multiply scales the tokens; attn_bias records ComfyUI's log(strength) attention
mask in ``Cond.model_inputs``), and the whole chain CLIPVisionLoader (SigLIP) -> CLIPVisionEncode
-> StyleModelLoader -> StyleModelApply through the engine, checked against a hand computation
(transformers' SiglipVisionModel, then the two linear layers written out)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.adapters.redux import ReduxConfig, ReduxHandle, ReduxImageEncoder
from mixgraph.nodes.adapters.style_model import (StyleModelError, StyleModelHandle, append_style_tokens,
                                                 extend_attention_bias, load_style_model)
from mixgraph.nodes.encoders.clip_vision import clip_preprocess
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.vision import ClipVisionOutput
from mixgraph.ui import api
from tests.fixtures.tiny_vision import (
    SIGLIP_WIDTH, hf_siglip_config, tiny_redux_state_dict, tiny_style_state_dict, write_siglip_vision,
)

F32 = parse_spec("f32")
CONTEXT = 32  # the tiny SD CLIP's width (tests/fixtures/tiny_clip.py), so Redux tokens join its cond


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("redux_models")
    write_siglip_vision(root / "clip_vision" / "sigclip_tiny.safetensors", seed=1)
    (root / "style_models").mkdir()
    save_file(tiny_redux_state_dict(seed=2, context_dim=CONTEXT), str(root / "style_models" / "redux.safetensors"))
    save_file(tiny_style_state_dict(seed=3, context_dim=CONTEXT), str(root / "style_models" / "t2i.safetensors"))
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    return root


def _redux_by_hand(sd, x):
    return F.linear(F.silu(F.linear(x, sd["redux_up.weight"], sd["redux_up.bias"])),
                    sd["redux_down.weight"], sd["redux_down.bias"])


# --- loading and the projector ----------------------------------------------------------------


def test_redux_config_of_the_real_file_from_shapes():
    cfg = ReduxConfig.from_shapes({"redux_up.weight": (12288, 1152), "redux_up.bias": (12288,),
                                   "redux_down.weight": (4096, 12288), "redux_down.bias": (4096,)})
    assert (cfg.vision_width, cfg.hidden, cfg.context_dim) == (1152, 12288, 4096)


def test_style_model_loader_reads_redux_and_t2i_files(models, tmp_path):
    redux = load_style_model(models / "style_models" / "redux.safetensors")
    t2i = load_style_model(models / "style_models" / "t2i.safetensors")
    assert isinstance(redux, ReduxHandle) and redux.config == ReduxConfig(SIGLIP_WIDTH, 3 * CONTEXT, CONTEXT)
    assert isinstance(t2i, StyleModelHandle) and t2i.config.num_tokens == 4
    assert set(ReduxImageEncoder(redux.config).state_dict()) == set(tiny_redux_state_dict())
    save_file({"foo.weight": torch.zeros(2, 2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(StyleModelError, match="not a style model"):
        load_style_model(tmp_path / "x.safetensors")


def test_redux_projects_each_image_and_flattens_them_into_one_sequence(models):
    handle = load_style_model(models / "style_models" / "redux.safetensors")
    x = torch.randn(2, 5, SIGLIP_WIDTH, generator=torch.Generator().manual_seed(6))
    vision = ClipVisionOutput(x, x, x)
    got = handle.get_cond(vision, F32)
    sd = load_file(str(models / "style_models" / "redux.safetensors"))
    torch.testing.assert_close(got, _redux_by_hand(sd, x).reshape(1, 10, CONTEXT), rtol=1e-5, atol=1e-5)
    narrow = torch.zeros(1, 5, 64)
    with pytest.raises(ValueError, match="48-wide SigLIP tokens"):
        handle.get_cond(ClipVisionOutput(narrow, narrow, narrow), F32)


# --- StyleModelApply's mask ---------------------------------------------------------------------


def _expected_mask(n_txt, n_new, bias, batch=1, n_ref=1):
    """ComfyUI's StyleModelApply mask with no mask before: zeros, log(bias) in the new key columns
    for the text and image queries."""
    size = n_txt + n_new + n_ref
    m = torch.zeros(batch, size, size)
    for q in range(size):
        if not n_txt <= q < n_txt + n_new:
            m[:, q, n_txt:n_txt + n_new] = math.log(bias) if bias > 0 else -math.inf
    return m.to(torch.float16)


def test_attn_bias_records_comfyui_mask_and_multiply_scales():
    text = torch.randn(1, 3, CONTEXT, generator=torch.Generator().manual_seed(7))
    tokens = torch.randn(1, 2, CONTEXT, generator=torch.Generator().manual_seed(8))
    (plain,) = append_style_tokens((Cond(text),), tokens, 0.5, "attn_bias")
    torch.testing.assert_close(plain.cross_attn, torch.cat([text, tokens], dim=1), rtol=0, atol=0)
    assert plain.model_inputs["attention_mask_img_shape"] == (1, 1)
    mask = plain.model_inputs["attention_mask"]
    assert mask.dtype == torch.float16 and mask.shape == (1, 6, 6)
    torch.testing.assert_close(mask, _expected_mask(3, 2, 0.5), rtol=0, atol=0)
    (scaled,) = append_style_tokens((Cond(text),), tokens, 0.5, "multiply")
    torch.testing.assert_close(scaled.cross_attn[:, 3:], tokens * 0.5)
    assert "attention_mask" not in scaled.model_inputs  # no mask before, none recorded
    (one,) = append_style_tokens((Cond(text),), tokens, 1.0, "attn_bias")
    assert "attention_mask" not in one.model_inputs  # log(1) = 0 everywhere: ComfyUI records nothing
    (zero,) = append_style_tokens((Cond(text),), tokens, 0.0, "attn_bias")
    assert torch.isneginf(zero.model_inputs["attention_mask"][0, 0, 3:5]).all()


def test_a_second_apply_extends_the_mask_around_the_new_tokens():
    text = torch.zeros(1, 3, CONTEXT)
    first = append_style_tokens((Cond(text),), torch.ones(1, 2, CONTEXT), 0.5, "attn_bias")
    (second,) = append_style_tokens(first, torch.ones(1, 4, CONTEXT), 2.0, "multiply")
    m = second.model_inputs["attention_mask"]
    assert m.shape == (1, 10, 10) and second.cross_attn.shape == (1, 9, CONTEXT)
    # sequence: 5 old text tokens (3 text + 2 first Redux), 4 new, 1 image; the old bias on columns 3, 4
    want = torch.zeros(10, 10)
    for q in (0, 1, 2, 9):  # text and image queries; the first Redux tokens' own rows stay 0
        want[q, 3:5] = math.log(0.5)
    torch.testing.assert_close(m[0], want.to(torch.float16), rtol=0, atol=0)
    boolean = torch.ones(1, 4, 4, dtype=torch.bool)
    boolean[0, 3, 0] = False
    (b,) = append_style_tokens((Cond(text, model_inputs={"attention_mask": boolean}),), torch.ones(1, 1, CONTEXT),
                               0.5, "attn_bias")
    assert b.model_inputs["attention_mask"][0, 4, 0] == -math.inf  # log(False), kept in the image row
    with pytest.raises(StyleModelError, match="Flux form"):
        append_style_tokens((Cond(text, model_inputs={"attention_mask": torch.ones(1, 3)}),),
                            torch.ones(1, 1, CONTEXT), 0.5, "attn_bias")


def test_extend_attention_bias_keeps_a_larger_reference_image():
    old = torch.arange(36, dtype=torch.float16).reshape(1, 6, 6)  # 2 text + 2x2 image tokens
    out = extend_attention_bias({"attention_mask": old, "attention_mask_img_shape": (2, 2)}, 1, 2, 3, 0.25)
    m = out["attention_mask"][0]
    assert out["attention_mask_img_shape"] == (2, 2) and m.shape == (9, 9)
    keep = [0, 1, 5, 6, 7, 8]  # the old rows / columns, around the 3 new ones
    torch.testing.assert_close(m[keep][:, keep], old[0], rtol=0, atol=0)
    assert (m[keep][:, 2:5] == torch.tensor(math.log(0.25), dtype=torch.float16)).all()
    assert (m[2:5] == 0).all()


# --- through the engine -------------------------------------------------------------------------


def _graph(strength, strength_type):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    cv = g.add("CLIPVisionLoader", clip_name="sigclip_tiny.safetensors")
    vis = g.add("CLIPVisionEncode", clip_vision=cv, image=g.add("LoadImage", image="ref.png"), crop="center")
    sm = g.add("StyleModelLoader", style_model_name="redux.safetensors")
    pos = g.add("CLIPTextEncode", text="a red fox", clip=ck[1])
    app = g.add("StyleModelApply", conditioning=pos, style_model=sm, clip_vision_output=vis, strength=strength,
                strength_type=strength_type)
    ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=app, negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
               latent_image=g.add("EmptyLatentImage", width=32, height=32, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return g, pos, app, ks


def test_redux_workflow_matches_a_hand_computation(models, tmp_path):
    from transformers import SiglipVisionModel

    (tmp_path / "in").mkdir()
    pixels = (torch.rand(45, 40, 3, generator=torch.Generator().manual_seed(9)).numpy() * 255).round()
    Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "in" / "ref.png")
    g, pos, app, ks = _graph(0.7, "multiply")
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    text = out[pos.node_id][0][0].cross_attn
    (cond,) = out[app.node_id][0]

    siglip = load_file(str(models / "clip_vision" / "sigclip_tiny.safetensors"))
    ref = SiglipVisionModel(hf_siglip_config()).eval()
    ref.load_state_dict({k.removeprefix("vision_model."): v for k, v in siglip.items()})
    image = torch.from_numpy(pixels.astype(np.float32) / 255.0)[None]  # [1, H, W, 3]
    with torch.no_grad():
        last = ref(pixel_values=clip_preprocess(image, 32, True, (0.5,) * 3, (0.5,) * 3)).last_hidden_state
    want = _redux_by_hand(load_file(str(models / "style_models" / "redux.safetensors")), last) * 0.7  # [1, 16, D]
    assert cond.cross_attn.shape == (1, text.shape[1] + 16, CONTEXT)  # 4 x 4 SigLIP patches -> 16 tokens
    torch.testing.assert_close(cond.cross_attn[:, :text.shape[1]], text, rtol=0, atol=0)
    torch.testing.assert_close(cond.cross_attn[:, text.shape[1]:], want, rtol=1e-4, atol=1e-4)
    assert "attention_mask" not in cond.model_inputs and torch.isfinite(out[ks.node_id][0].samples).all()

    g2, _, app2, ks2 = _graph(0.5, "attn_bias")
    out2 = api.run(g2, models=models, input=tmp_path / "in", output=tmp_path / "out")
    (biased,) = out2[app2.node_id][0]
    torch.testing.assert_close(biased.cross_attn[:, text.shape[1]:], want / 0.7, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(biased.model_inputs["attention_mask"], _expected_mask(text.shape[1], 16, 0.5),
                               rtol=0, atol=0)
    # An SD UNet reads no attention mask (as ComfyUI's): attn_bias 0.5 samples as multiply 1.0 does.
    g3, _, _, ks3 = _graph(1.0, "multiply")
    out3 = api.run(g3, models=models, input=tmp_path / "in", output=tmp_path / "out")
    torch.testing.assert_close(out2[ks2.node_id][0].samples, out3[ks3.node_id][0].samples, rtol=0, atol=0)


def test_the_mask_crosses_the_custom_node_boundary():
    from mixgraph.ui.comfy.comfy_payloads import cond_from_comfy, cond_to_comfy

    (cond,) = append_style_tokens((Cond(torch.zeros(1, 3, CONTEXT)),), torch.ones(1, 2, CONTEXT), 0.5, "attn_bias")
    [[tokens, opts]] = cond_to_comfy((cond,))
    assert opts["attention_mask"].shape == (1, 6, 6) and opts["attention_mask_img_shape"] == (1, 1)
    (back,) = cond_from_comfy([[tokens, opts]])
    torch.testing.assert_close(back.model_inputs["attention_mask"], cond.model_inputs["attention_mask"])


# --- what a Flux runner does with the mask (ComfyUI's upscale_dit_mask) ----------------------------


def _bilinear_weights(n_in: int, n_out: int) -> torch.Tensor:
    """[n_out, n_in] 1-D linear interpolation, half-pixel centres, edges clamped (align_corners=False)."""
    w = torch.zeros(n_out, n_in, dtype=torch.float64)
    for o in range(n_out):
        src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
        i0 = min(int(src), n_in - 1)
        i1, frac = min(i0 + 1, n_in - 1), src - i0
        w[o, i0] += 1 - frac
        w[o, i1] += frac
    return w


def test_upscale_dit_mask_stretches_the_image_rows_and_columns():
    from mixgraph.nodes.models.dit_mask import upscale_dit_mask

    (cond,) = append_style_tokens((Cond(torch.zeros(1, 3, CONTEXT)),), torch.ones(1, 2, CONTEXT), 0.5, "attn_bias")
    mask = cond.model_inputs["attention_mask"].float()  # [1, 3 + 2 + 1, ...]
    big = upscale_dit_mask(mask, (1, 1), (2, 3))  # the one stand-in image token becomes 6
    assert big.shape == (1, 11, 11)
    src = [0, 1, 2, 3, 4] + [5] * 6  # each row / column of the result copies this one of the mask
    torch.testing.assert_close(big[0], mask[0][src][:, src], rtol=0, atol=0)
    assert upscale_dit_mask(mask, (1, 1), (1, 1)) is mask

    t, (hi, wi), (ho, wo) = 2, (2, 2), (3, 5)
    m = torch.randn(1, t + hi * wi, t + hi * wi, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    a = torch.kron(_bilinear_weights(hi, ho), _bilinear_weights(wi, wo))  # [ho*wo, hi*wi] 2-D bilinear
    want = torch.zeros(1, t + ho * wo, t + ho * wo, dtype=torch.float64)
    want[0, :t, :t] = m[0, :t, :t]
    want[0, :t, t:] = m[0, :t, t:] @ a.T
    want[0, t:, :t] = a @ m[0, t:, :t]
    want[0, t:, t:] = a @ m[0, t:, t:] @ a.T
    torch.testing.assert_close(upscale_dit_mask(m, (hi, wi), (ho, wo)), want, rtol=1e-12, atol=1e-12)
