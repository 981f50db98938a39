"""Qwen3 text encoder (Z-Image): parity with transformers' ``Qwen3Model`` on a tiny config in the
real key layout (``model.`` + the HF model's keys), config from shapes, precision, encode_chunks."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config as HFQwen3Config, Qwen3Model

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders.decoder_llm import causal_padding_mask
from mixgraph.nodes.encoders.encoder_set import OutputRule, get_tokenizer
from mixgraph.nodes.encoders.llm_sets import QWEN3_4B, QWEN3_RULE, Z_IMAGE, llm_entry
from mixgraph.nodes.models.handles import ClipHandle
from mixgraph.nodes.encoders.qwen3 import Qwen3TextModel, is_qwen3, qwen3_config
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource
from tests.fixtures.tiny_llm import write_qwen3

PAD = 0
F32 = parse_spec("f32")
RULE = OutputRule(pad_token=PAD, default_layer=-2, norm_hidden=False, project_pooled=False)


def tiny_hf(seed: int = 0) -> Qwen3Model:
    cfg = HFQwen3Config(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                        attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen3Model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))  # norms away from their init
            else:
                p.normal_(0.0, 0.08)
    return model


def file_keys(hf: Qwen3Model) -> dict[str, torch.Tensor]:
    """The key map: a Qwen3 text-encoder file is ``Qwen3ForCausalLM``'s ``model.`` part."""
    return {"model." + k: v.clone() for k, v in hf.state_dict().items()}


def ours(sd: dict[str, torch.Tensor]) -> Qwen3TextModel:
    cfg = qwen3_config({k: tuple(v.shape) for k, v in sd.items()})
    model = Qwen3TextModel(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def test_qwen3_config_from_shapes_and_recognition():
    sd = file_keys(tiny_hf())
    assert is_qwen3(sd) and is_qwen3({"te." + k: v for k, v in sd.items()}, "te.")
    s = qwen3_config({k: tuple(v.shape) for k, v in sd.items()}).shape
    assert (s.vocab_size, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate) == (96, 64, 3, 4, 2, 16, 80)
    gemma_like = dict(sd, **{"model.layers.0.post_feedforward_layernorm.weight": torch.ones(64)})
    assert not is_qwen3(gemma_like)


@pytest.mark.parametrize("padded", [False, True])
def test_qwen3_hidden_layers_match_transformers(padded):
    hf = tiny_hf()
    model = ours(file_keys(hf))
    ids = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12], [9, 3, 60, 22, 11, PAD, PAD, PAD]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3]) if padded else torch.ones_like(ids)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        embeds = model.embed(ids)
        # hidden_states[i + 1] is decoder layer i's output, except the last entry: transformers
        # gives the normed last layer there
        for layer in range(2):
            got = model(embeds, mask, layer)
            torch.testing.assert_close(got, ref.hidden_states[layer + 1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(embeds, mask, None), ref.last_hidden_state, rtol=1e-4, atol=1e-5)
        # Z-Image's layer: the second-to-last decoder layer's output (hidden_states[-2])
        z = model.encode_chunks([[(int(t), 1.0) for t in ids[0]]], RULE, None, print)
        torch.testing.assert_close(z.hidden[0], ref.hidden_states[-2][0], rtol=1e-4, atol=1e-5)


def test_qwen3_encode_chunks_mask_weights_and_layers():
    model = ours(file_keys(tiny_hf()))
    chunk = [(5, 1.0), (17, 1.3), (33, 1.0), (PAD, 1.0), (4, 1.0)]
    out = model.encode_chunks([chunk], RULE, None, print)
    assert out.hidden.shape == (1, 5, 64) and out.pooled is None
    assert out.mask.tolist() == [[1, 1, 1, 0, 0]]  # ComfyUI: padding from the first pad token on
    plain = model.encode_chunks([[(t, 1.0) for t, _ in chunk]], RULE, None, print)
    # weighted token: (z - z_empty) * w + z_empty against the all-padding empty prompt
    with torch.no_grad():
        empty = model(model.embed(torch.tensor([[PAD] * 5])), torch.zeros(1, 5, dtype=torch.long), 1)[0]
    torch.testing.assert_close(out.hidden[0, 1], (plain.hidden[0, 1] - empty[1]) * 1.3 + empty[1])
    torch.testing.assert_close(out.hidden[0, [0, 2]], plain.hidden[0, [0, 2]])
    three = [(5, 1.0), (17, 1.0), (33, 1.0)]
    last = model.encode_chunks([three], RULE, -1, print)  # CLIPSetLastLayer -1: last layer, unnormed
    normed = model.encode_chunks([three], RULE, -9, print)  # |n| > layers: the normed output
    with torch.no_grad():
        x = model.embed(torch.tensor([[5, 17, 33]]))
        m = torch.ones(1, 3, dtype=torch.long)
        torch.testing.assert_close(normed.hidden, model(x, m, None))
        assert not torch.allclose(last.hidden, normed.hidden)


def test_qwen3_runs_under_a_bf16_policy_with_f32_norms():
    model = ours(file_keys(tiny_hf()))
    chunk = [[(t, 1.0) for t in (5, 17, 33, 2)]]
    ref = model.encode_chunks(chunk, RULE, None, print).hidden
    cast = apply_precision(model, parse_spec("bf16"))
    assert cast.model.layers[0].input_layernorm.weight.dtype == torch.float32  # keep_f32
    assert cast.model.layers[0].self_attn.q_norm.weight.dtype == torch.float32
    got = cast.encode_chunks(chunk, RULE, None, print).hidden
    assert got.dtype == torch.float32
    assert (got - ref).norm() / ref.norm() < 0.05


def test_mask_is_finite_when_every_key_is_padding():
    m = causal_padding_mask(torch.zeros(1, 3, dtype=torch.long), torch.float16)
    assert torch.isfinite(m).all()


# --------------------------------------------------------------------------------------------
# end to end: a Z-Image text-encoder set, built by hand from its entry, through ClipHandle.encode


def test_z_image_set_encodes_a_prompt_in_the_chat_template(tmp_path):

    source = WeightSource.from_file(write_qwen3(tmp_path / "qwen_3_4b.safetensors"))
    entry = llm_entry("qwen3", source, QWEN3_4B, "z_image", QWEN3_RULE)
    assert entry.config.shape.vocab_size == 151936 and entry.tokenizer == "z_image"
    clip = ClipHandle(Z_IMAGE, (entry,))
    text = "a (red:1.3) fox"
    tokens = clip.tokenize(text)[QWEN3_4B]
    ids = [t for t, _, _ in tokens[0]]
    qwen = get_tokenizer("qwen2.5")
    assert ids[:3] == [151644, 872, 198] and ids[-5:] == qwen.encode("<|im_end|>\n<|im_start|>assistant\n")
    assert ids == qwen.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    assert all(w == 1.0 for _, w, _ in tokens[0])  # ComfyUI's Z-Image tokenizer: weights off

    store.clear()
    (cond,) = clip.encode(text, F32)
    assert cond.cross_attn.shape == (1, len(ids), 32) and cond.cross_attn.dtype == torch.float32
    assert cond.pooled is None
    assert cond.model_inputs["attention_mask"].tolist() == [[1] * len(ids)]
    model = ours({k: v.float() for k, v in source_tensors(source).items()})
    with torch.no_grad():
        want = model(model.embed(torch.tensor([ids])), torch.ones(1, len(ids), dtype=torch.long), 1)
    torch.testing.assert_close(cond.cross_attn, want)
    (bf16,) = clip.encode(text, parse_spec("bf16"))
    assert (bf16.cross_attn - want).norm() / want.norm() < 0.05
    (last,) = clip.with_layer(-1).encode(text, F32)  # CLIPSetLastLayer -1: the last layer
    assert not torch.allclose(last.cross_attn, cond.cross_attn)


def source_tensors(source):
    return load_file(source.path)
