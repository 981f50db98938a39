"""CLIPTextModel against transformers, and the OpenCLIP conversion against an independent
nn.MultiheadAttention reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel, open_clip_to_hf, to_hf_layout
from tests.fixtures.tiny_clip import tiny_clip_l_hf_config, tiny_clip_l_state_dict, tiny_open_clip_state_dict

# SD1-style (pad with the end token) and OpenCLIP-style (pad with 0) rows
TOKENS = torch.tensor(
    [
        [49406, 320, 1125, 539, 320, 2368, 49407] + [49407] * 70,
        [49406, 5, 6, 7, 8, 9, 10, 11, 49407] + [0] * 68,
    ]
)
TOL = dict(atol=1e-5, rtol=1e-5)


def _hf_text(sd, width, proj, act):
    from transformers import CLIPTextModel as HFText
    from transformers import CLIPTextModelWithProjection as HFProj

    cfg = tiny_clip_l_hf_config(width=width, layers=3, proj=proj, act=act)
    if proj is None:
        model = HFText(cfg)
        model.load_state_dict({k.removeprefix("text_model."): v for k, v in sd.items()})
    else:
        model = HFProj(cfg)
        model.load_state_dict(sd)
    return model.eval()


def test_clip_l_matches_transformers_hidden_and_pooled():
    sd = tiny_clip_l_state_dict(seed=1)
    ours = CLIPTextModel.from_state_dict(sd, activation="quick_gelu")
    ref = _hf_text(sd, 32, None, "quick_gelu")
    with torch.no_grad():
        out = ref(TOKENS, output_hidden_states=True)
        last, pooled = ours(TOKENS)
        pen, pooled2 = ours(TOKENS, -2)
        first, _ = ours(TOKENS, 0)
        pen_normed, _ = ours(TOKENS, -2, norm_hidden=True)
    torch.testing.assert_close(last, out.last_hidden_state, **TOL)
    torch.testing.assert_close(pooled, out.pooler_output, **TOL)
    torch.testing.assert_close(pooled2, pooled, atol=0, rtol=0)  # pooled always from the last layer
    torch.testing.assert_close(pen, out.hidden_states[-2], **TOL)
    torch.testing.assert_close(first, out.hidden_states[1], **TOL)
    normed = ref.final_layer_norm(out.hidden_states[-2])
    torch.testing.assert_close(pen_normed, normed, **TOL)
    assert (pen - out.hidden_states[-1]).abs().max() > 0.1  # the layers do differ


def test_clip_with_projection_matches_transformers():
    sd = tiny_clip_l_state_dict(seed=2, proj=24)
    ours = CLIPTextModel.from_state_dict(sd, activation="quick_gelu")
    assert ours.config.projection_dim == 24
    ref = _hf_text(sd, 32, 24, "quick_gelu")
    with torch.no_grad():
        out = ref(TOKENS, output_hidden_states=True)
        hidden, pooled = ours(TOKENS, -1)
        _, unprojected = ours(TOKENS, project_pooled=False)
    torch.testing.assert_close(hidden, out.hidden_states[-1], **TOL)
    torch.testing.assert_close(pooled, out.text_embeds, **TOL)
    assert unprojected.shape == (2, 32)


def test_clip_pools_at_first_end_token():
    sd = tiny_clip_l_state_dict(seed=3)
    ours = CLIPTextModel.from_state_dict(sd, activation="quick_gelu")
    with torch.no_grad():
        last, pooled = ours(TOKENS)
    torch.testing.assert_close(pooled[0], last[0, 6], atol=0, rtol=0)
    torch.testing.assert_close(pooled[1], last[1, 8], atol=0, rtol=0)


def test_clip_embeds_replace_token_lookup():
    ours = CLIPTextModel.from_state_dict(tiny_clip_l_state_dict(seed=4), activation="quick_gelu")
    with torch.no_grad():
        a = ours(TOKENS, -2)
        b = ours(TOKENS, -2, embeds=ours.token_embeddings(TOKENS))
        emb = ours.token_embeddings(TOKENS).clone()
        emb[0, 3] += 1.0
        c = ours(TOKENS, -2, embeds=emb)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert (c[0][0, 3:] - a[0][0, 3:]).abs().max() > 1e-3
    torch.testing.assert_close(c[0][0, :3], a[0][0, :3], atol=0, rtol=0)  # causal


def test_open_clip_conversion_matches_transformers():
    osd = tiny_open_clip_state_dict(seed=5, width=64, proj=40)
    prefixed = {"conditioner.embedders.1.model." + k: v for k, v in osd.items()}
    prefixed["first_stage_model.decoder.conv_in.weight"] = torch.zeros(1)  # other parts are skipped
    hf = open_clip_to_hf(prefixed, "conditioner.embedders.1.model.")
    ref = _hf_text(hf, 64, 40, "gelu")
    ours = CLIPTextModel.from_state_dict(prefixed, prefix="conditioner.embedders.1.model.")
    assert ours.config.activation == "gelu" and ours.config.heads == 4 and ours.config.layers == 3
    with torch.no_grad():
        out = ref(TOKENS, output_hidden_states=True)
        pen, pooled = ours(TOKENS, -2)
    torch.testing.assert_close(pen, out.hidden_states[-2], **TOL)
    torch.testing.assert_close(pooled, out.text_embeds, **TOL)


def _open_clip_reference(osd: dict, tokens: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCLIP's text tower written from its own layout: nn.MultiheadAttention with the stacked
    in_proj, GELU MLP, ln_final, x @ text_projection at the argmax token. Returns (last layer
    before ln_final, projected pooled)."""
    width = osd["token_embedding.weight"].shape[1]
    t = tokens.shape[1]
    x = osd["token_embedding.weight"][tokens] + osd["positional_embedding"][:t]
    causal = torch.full((t, t), float("-inf")).triu(1)
    n = 0
    while f"transformer.resblocks.{n}.ln_1.weight" in osd:
        p = f"transformer.resblocks.{n}."
        mha = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        mha.load_state_dict(
            {
                "in_proj_weight": osd[p + "attn.in_proj_weight"],
                "in_proj_bias": osd[p + "attn.in_proj_bias"],
                "out_proj.weight": osd[p + "attn.out_proj.weight"],
                "out_proj.bias": osd[p + "attn.out_proj.bias"],
            }
        )
        h = F.layer_norm(x, (width,), osd[p + "ln_1.weight"], osd[p + "ln_1.bias"])
        x = x + mha(h, h, h, attn_mask=causal, need_weights=False)[0]
        h = F.layer_norm(x, (width,), osd[p + "ln_2.weight"], osd[p + "ln_2.bias"])
        h = F.gelu(F.linear(h, osd[p + "mlp.c_fc.weight"], osd[p + "mlp.c_fc.bias"]))
        x = x + F.linear(h, osd[p + "mlp.c_proj.weight"], osd[p + "mlp.c_proj.bias"])
        n += 1
    final = F.layer_norm(x, (width,), osd["ln_final.weight"], osd["ln_final.bias"])
    pooled = final[torch.arange(tokens.shape[0]), tokens.argmax(dim=-1)] @ osd["text_projection"]
    return x, pooled


def test_open_clip_qkv_split_against_multihead_attention():
    osd = tiny_open_clip_state_dict(seed=6, width=64, layers=2, proj=32)
    ours = CLIPTextModel.from_state_dict(osd)
    with torch.no_grad():
        last_raw, ref_pooled = _open_clip_reference(osd, TOKENS, heads=ours.config.heads)
        hidden, pooled = ours(TOKENS, -1)
    torch.testing.assert_close(hidden, last_raw, **TOL)
    torch.testing.assert_close(pooled, ref_pooled, **TOL)
    hf = open_clip_to_hf(osd, "")
    w = osd["transformer.resblocks.1.attn.in_proj_weight"]
    assert torch.equal(hf["text_model.encoder.layers.1.self_attn.k_proj.weight"], w[64:128])
    assert torch.equal(hf["text_projection.weight"], osd["text_projection"].t())


def test_clip_config_from_state_dict_layouts():
    sd = tiny_clip_l_state_dict(seed=0, width=48, layers=2)
    cfg = CLIPTextConfig.from_state_dict(sd)
    assert cfg == CLIPTextConfig(49408, 48, 2, 3, 77, 192, None, "gelu")
    assert CLIPTextConfig.from_state_dict(sd, activation="quick_gelu").activation == "quick_gelu"
    # old SD1 checkpoints: no "text_model." level, and a position_ids buffer
    old = {"cond_stage_model.transformer." + k.removeprefix("text_model."): v for k, v in sd.items()}
    old["cond_stage_model.transformer.embeddings.position_ids"] = torch.arange(77)[None]
    hf = to_hf_layout(old, "cond_stage_model.transformer.")
    assert sorted(hf) == sorted(sd)
    model = CLIPTextModel.from_state_dict(old, prefix="cond_stage_model.transformer.")
    assert model.config == cfg
    big = {"text_model.embeddings.token_embedding.weight": torch.empty(49408, 768)}
    big |= {"text_model.embeddings.position_embedding.weight": torch.empty(77, 768)}
    big |= {"text_model.encoder.layers.11.mlp.fc1.weight": torch.empty(3072, 768)}
    big |= {"text_model.encoder.layers.0.mlp.fc1.weight": torch.empty(3072, 768)}
    cfg_l = CLIPTextConfig.from_state_dict(big)
    assert (cfg_l.heads, cfg_l.layers, cfg_l.activation) == (12, 12, "quick_gelu")  # OpenAI CLIP-L
    with pytest.raises(KeyError):
        open_clip_to_hf({"m.transformer.resblocks.0.attn.weird": torch.zeros(1)}, "m.")
