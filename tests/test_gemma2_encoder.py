"""Gemma 2 text encoder (Lumina 2): parity with transformers' ``Gemma2Model`` on a tiny config in
the real key layout, with attention soft-capping off as ComfyUI runs it; config from shapes."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config as HFGemma2Config, Gemma2Model

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders.encoder_set import OutputRule, get_tokenizer
from mixgraph.nodes.encoders.llm_sets import (GEMMA2_2B, GEMMA2_RULE, LLM_PREFIXES, LUMINA2, entry_tokenizer,
                                              find_gemma2, find_qwen3, gemma2_arch_config, llm_entry, lumina2_prompt)
from mixgraph.nodes.models.handles import ClipHandle
from mixgraph.nodes.encoders.gemma2 import GEMMA_BOS, Gemma2TextModel, gemma2_config, is_gemma2
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource
from tests.fixtures.tiny_llm import gemma2_state_dict, qwen3_state_dict, write_gemma2

PAD = 0
F32 = parse_spec("f32")
RULE = OutputRule(pad_token=PAD, default_layer=-2, norm_hidden=False, project_pooled=False)


def tiny_hf(seed: int = 0, softcap: float | None = None) -> Gemma2Model:
    cfg = HFGemma2Config(vocab_size=120, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
                         attn_logit_softcapping=softcap, final_logit_softcapping=None, sliding_window=4096,
                         hidden_activation="gelu_pytorch_tanh", attn_implementation="eager")
    torch.manual_seed(seed)
    model = Gemma2Model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.3 * torch.randn_like(p))  # Gemma norms scale by 1 + w; w near 0
            else:
                p.normal_(0.0, 0.08)
    return model


def file_keys(hf: Gemma2Model) -> dict[str, torch.Tensor]:
    """The key map: a Gemma 2 text-encoder file is ``Gemma2ForCausalLM``'s ``model.`` part."""
    return {"model." + k: v.clone() for k, v in hf.state_dict().items()}


def ours(sd: dict[str, torch.Tensor]) -> Gemma2TextModel:
    model = Gemma2TextModel(gemma2_config({k: tuple(v.shape) for k, v in sd.items()}))
    model.load_state_dict(sd, strict=True)
    return model.eval()


def test_gemma2_config_from_shapes_and_recognition():
    sd = file_keys(tiny_hf())
    assert is_gemma2(sd)
    s = gemma2_config({k: tuple(v.shape) for k, v in sd.items()}).shape
    assert (s.vocab_size, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate) == (120, 48, 3, 2, 1, 256, 72)
    gemma3_like = dict(sd, **{"model.layers.0.self_attn.q_norm.weight": torch.ones(256)})
    assert not is_gemma2(gemma3_like)


@pytest.mark.parametrize("padded", [False, True])
def test_gemma2_hidden_layers_match_transformers(padded):
    hf = tiny_hf()
    model = ours(file_keys(hf))
    ids = torch.tensor([[GEMMA_BOS, 17, 33, 5, 90, 41, 7, 12], [GEMMA_BOS, 3, 60, 22, 11, PAD, PAD, PAD]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3]) if padded else torch.ones_like(ids)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        embeds = model.embed(ids)
        # hidden_states[i + 1] is decoder layer i's output; the last entry is the normed output
        for layer in range(2):
            torch.testing.assert_close(model(embeds, mask, layer), ref.hidden_states[layer + 1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(embeds, mask, None), ref.last_hidden_state, rtol=1e-4, atol=1e-5)
        # Lumina 2's layer: the second-to-last decoder layer's output (hidden_states[-2])
        z = model.encode_chunks([[(int(t), 1.0) for t in ids[0]]], RULE, None, print)
        torch.testing.assert_close(z.hidden[0], ref.hidden_states[-2][0], rtol=1e-4, atol=1e-5)


def test_gemma2_without_softcapping_is_what_comfyui_computes():
    """The reference with its default attention soft-capping (50) differs from ComfyUI's (and
    ours) only a little at these logit sizes: the choice is visible, not a bug hiding."""
    capped = tiny_hf(softcap=50.0)
    model = ours(file_keys(capped))
    ids = torch.tensor([[GEMMA_BOS, 17, 33, 5]])
    with torch.no_grad():
        ref = capped(input_ids=ids, output_hidden_states=True).hidden_states[-2]
        got = model(model.embed(ids), torch.ones_like(ids), 1)
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-3)


def test_gemma2_weights_measure_against_bos_then_padding():
    model = ours(file_keys(tiny_hf()))
    chunk = [(GEMMA_BOS, 1.0), (17, 1.0), (33, 1.5), (5, 1.0)]
    out = model.encode_chunks([chunk], RULE, None, print)
    plain = model.encode_chunks([[(t, 1.0) for t, _ in chunk]], RULE, None, print)
    assert out.mask.tolist() == [[1, 1, 1, 1]] and out.hidden.shape == (1, 4, 48)
    with torch.no_grad():  # ComfyUI's empty prompt: [start, pad, pad, ...], start = <bos>
        empty = model(model.embed(torch.tensor([[GEMMA_BOS, PAD, PAD, PAD]])), torch.tensor([[1, 0, 0, 0]]), 1)[0]
    torch.testing.assert_close(out.hidden[0, 2], (plain.hidden[0, 2] - empty[2]) * 1.5 + empty[2])
    torch.testing.assert_close(out.hidden[0, [0, 1, 3]], plain.hidden[0, [0, 1, 3]])


def test_gemma2_textual_inversion_vector_and_width_check():
    model = ours(file_keys(tiny_hf()))
    vec = model.embed(torch.tensor([33]))[0].detach()
    warned = []
    by_vector = model.encode_chunks([[(GEMMA_BOS, 1.0), (17, 1.0), (vec, 1.0)]], RULE, None, warned.append)
    by_id = model.encode_chunks([[(GEMMA_BOS, 1.0), (17, 1.0), (33, 1.0)]], RULE, None, warned.append)
    torch.testing.assert_close(by_vector.hidden, by_id.hidden)
    wrong = model.encode_chunks([[(GEMMA_BOS, 1.0), (torch.zeros(7), 1.0), (17, 1.0)]], RULE, None, warned.append)
    assert warned and "width 7" in warned[0]
    assert wrong.mask.tolist() == [[1, 1, 0]]  # dropped, refilled with padding at the end


def test_gemma2_runs_under_fp8_storage_with_f32_norms():
    model = ours(file_keys(tiny_hf()))
    chunk = [[(t, 1.0) for t in (GEMMA_BOS, 17, 33, 5)]]
    ref = model.encode_chunks(chunk, RULE, None, print).hidden
    for spec in ("bf16", "fp8_e4m3fn:bf16"):
        cast = apply_precision(model, parse_spec(spec))
        assert cast.model.layers[1].post_feedforward_layernorm.weight.dtype == torch.float32
        got = cast.encode_chunks(chunk, RULE, None, print).hidden
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert (got - ref).norm() / ref.norm() < 0.15, spec


# --------------------------------------------------------------------------------------------
# end to end: a Lumina 2 text-encoder set, built by hand from its entry, through ClipHandle.encode


def test_lumina2_set_encodes_a_weighted_prompt_with_the_files_tokenizer(tmp_path):
    source = WeightSource.from_file(write_gemma2(tmp_path / "gemma_2_2b.safetensors"))
    entry = llm_entry("gemma2", source, GEMMA2_2B, "gemma", GEMMA2_RULE)
    assert entry.tokenizer.startswith("gemma:")  # the file's own SentencePiece model
    clip = ClipHandle(LUMINA2, (entry,))
    text = lumina2_prompt("superior", "a (red cat:1.3) under the sky")
    assert text.startswith("You are an assistant designed to generate superior images") and " <Prompt Start> a (" in text
    tokens = clip.tokenize(text)[GEMMA2_2B][0]
    assert tokens[0] == (GEMMA_BOS, 1.0, 0)
    weighted = [i for i, (_, w, _) in enumerate(tokens) if w != 1.0]
    assert weighted and all(tokens[i][1] == pytest.approx(1.3) for i in weighted)

    (cond,) = clip.encode(text, F32)
    n = len(tokens)
    assert cond.cross_attn.shape == (1, n, 32) and cond.pooled is None
    assert cond.model_inputs["attention_mask"].tolist() == [[1] * n]
    sd = gemma2_state_dict()
    del sd["spiece_model"]
    model = ours(sd)
    ids = torch.tensor([[t for t, _, _ in tokens]])
    with torch.no_grad():
        z = model(model.embed(ids), torch.ones_like(ids), 1)[0]  # layer -2 of 3
        empty_ids = torch.tensor([[GEMMA_BOS] + [PAD] * (n - 1)])
        z_empty = model(model.embed(empty_ids), (empty_ids == GEMMA_BOS).long(), 1)[0]
    want = z.clone()
    want[weighted] = (z[weighted] - z_empty[weighted]) * 1.3 + z_empty[weighted]
    torch.testing.assert_close(cond.cross_attn[0], want)
    (plain,) = clip.encode(lumina2_prompt("superior", "a red cat under the sky"), F32)
    # causal: the system prompt's tokens (before any weighted one) are the same either way
    torch.testing.assert_close(plain.cross_attn[0, :10], cond.cross_attn[0, :10])
    assert weighted[0] > 10


def test_lumina2_entry_refuses_a_file_that_is_not_gemma2(tmp_path):
    sd = gemma2_state_dict()
    sd["model.layers.0.self_attn.q_norm.weight"] = torch.ones(256)  # a Gemma 3 marker
    with pytest.raises(ValueError, match="not a gemma2 model"):
        llm_entry("gemma2", WeightSource.from_state_dict(sd), GEMMA2_2B, "gemma", GEMMA2_RULE)
    assert get_tokenizer(llm_entry("gemma2", WeightSource.from_state_dict(gemma2_state_dict()), GEMMA2_2B, "gemma",
                                   GEMMA2_RULE).tokenizer).vocab_size == 120


def test_llm_architectures_in_a_registrys_shape():
    """find(info, prefix) / config(info, found, slot) over a checkpoint's keys as stored, and the
    entry's tokenizer: the slot's for Qwen3, the file's for Gemma 2."""
    prefix = LLM_PREFIXES["gemma2"][1]
    info = {prefix + k: v for k, v in gemma2_state_dict().items()}
    found = find_gemma2(info, prefix)
    assert found is not None and (found.arch, found.prefix, found.width) == ("gemma2", prefix, 32)
    assert find_gemma2(info, "") is None and find_qwen3(info, prefix) is None
    assert gemma2_arch_config(info, found, GEMMA2_2B).shape.layers == 3
    assert find_qwen3(qwen3_state_dict(vocab=64), "").width == 32
    src = WeightSource.from_state_dict(info, prefix=prefix)
    assert entry_tokenizer("gemma2", src, "gemma").startswith("gemma:")
    assert entry_tokenizer("qwen3", src, "z_image") == "z_image"
