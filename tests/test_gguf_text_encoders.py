"""Text encoders from GGUF files through ComfyUI-GGUF's CLIP loader nodes: files named by
llama.cpp (T5 ``enc.blk.N.*``, Qwen3 ``blk.N.*``) encode as the same weights, dequantised by
gguf-py, in safetensors with the usual names; a quantised vocabulary is looked up row by row."""

from __future__ import annotations

import re

import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import save_file

from mixgraph.nodes.encoders.t5 import T5EncoderModel
from mixgraph.nodes.declare.loaders import gguf_nodes
from mixgraph.nodes.weights.cast import CastEmbedding
from mixgraph.nodes.weights.gguf_file import contents
from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor, is_quantized
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_clip_l
from tests.fixtures.tiny_llm import qwen3_state_dict
from tests.fixtures.tiny_t5 import tiny_t5_state_dict
from tests.gguf_fixtures import write_gguf

# llama.cpp's names of the Hugging Face tensors (what its converters write; ComfyUI-GGUF's
# T5_SD_MAP / LLAMA_SD_MAP read backwards), stated here independently of the code under test
T5_NAMES = [(r"^shared\.", "token_embd."), (r"^encoder\.final_layer_norm\.", "enc.output_norm."),
            (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.", r"enc.blk.\1.attn_rel_b."),
            (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.", r"enc.blk.\1.attn_\2."),
            (r"^encoder\.block\.(\d+)\.layer\.0\.layer_norm\.", r"enc.blk.\1.attn_norm."),
            (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.", r"enc.blk.\1.ffn_gate."),
            (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.", r"enc.blk.\1.ffn_up."),
            (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.", r"enc.blk.\1.ffn_down."),
            (r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.", r"enc.blk.\1.ffn_norm.")]
QWEN_NAMES = [(r"^model\.embed_tokens\.", "token_embd."), (r"^model\.norm\.", "output_norm."),
              (r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.", r"blk.\1.attn_\2."),
              (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"blk.\1.attn_output."),
              (r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.", r"blk.\1.attn_\2_norm."),
              (r"^model\.layers\.(\d+)\.input_layernorm\.", r"blk.\1.attn_norm."),
              (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"blk.\1.ffn_norm."),
              (r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.", r"blk.\1.ffn_\2.")]


def _llama_cpp(key: str, table) -> str:
    for pattern, repl in table:
        new, n = re.subn(pattern, repl, key)
        if n:
            return new
    raise AssertionError(f"no llama.cpp name for {key}")


def _write(root, name: str, sd: dict, table, arch: str, qt: T, extra: dict | None = None) -> None:
    """``<name>.gguf`` in llama.cpp names (plus ``extra`` tensors as named), ``<name>_deq.safetensors``
    its tensors dequantised by gguf-py under the Hugging Face names."""
    named = {_llama_cpp(k, table): k for k in sd}
    ref = write_gguf(root / f"{name}.gguf", {**{k: sd[hf] for k, hf in named.items()}, **(extra or {})}, qt, arch)
    save_file({named[k]: v.contiguous() for k, v in ref.items() if k in named}, str(root / f"{name}_deq.safetensors"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_te") / "models"
    te = root / "text_encoders"
    te.mkdir(parents=True)
    write_clip_l(te / "clip_l.safetensors", seed=4)
    t5 = tiny_t5_state_dict(seed=2)
    decoder = {"dec.blk.0.attn_q.weight": torch.randn(64, 64), "dec.output_norm.weight": torch.ones(64)}  # dropped
    _write(te, "t5_Q8_0", t5, T5_NAMES, "t5encoder", T.Q8_0, extra=decoder)
    _write(te, "t5_Q4_K", t5, T5_NAMES, "t5", T.Q4_K)
    _write(te, "qwen3_Q8_0", dict(qwen3_state_dict(seed=1)), QWEN_NAMES, "qwen3", T.Q8_0)
    return root


def _cond(models, loader_type: str, precision="f32", **inputs):
    g = api.Graph()
    clip = g.add(loader_type, **inputs)[0]
    enc = g.add("CLIPTextEncode", clip=clip, text="a red cube on a table")
    g.add("PreviewAny", source=enc[0])
    out = api.run(g, models=models, output=models.parent / "out", precision=precision).outputs
    (cond,) = out[enc.node_id][0]
    return cond


def test_llama_cpp_t5_names_read_as_hugging_face_names(models):
    c = contents(models / "text_encoders" / "t5_Q8_0.gguf")
    assert c.architecture == "t5encoder" and "shared.weight" in c.tensors
    assert "encoder.block.2.layer.1.DenseReluDense.wi_0.weight" in c.tensors
    assert not any(k.startswith(("enc.", "dec.", "token_embd")) for k in c.tensors)
    assert gguf_nodes.clip_problem(models / "text_encoders" / "t5_Q8_0.gguf", "clip_name2") is None


@pytest.mark.parametrize("name", ["t5_Q8_0", "t5_Q4_K"])
def test_t5_gguf_encodes_as_its_dequantised_safetensors(models, name):
    got = _cond(models, "DualCLIPLoaderGGUF", clip_name1="clip_l.safetensors", clip_name2=f"{name}.gguf", type="flux")
    want = _cond(models, "DualCLIPLoader", clip_name1="clip_l.safetensors", clip_name2=f"{name}_deq.safetensors",
                 type="flux")
    assert got.cross_attn.shape == want.cross_attn.shape and torch.isfinite(got.cross_attn).all()
    assert torch.equal(got.cross_attn, want.cross_attn) and torch.equal(got.pooled, want.pooled)


def test_qwen3_gguf_encodes_as_its_dequantised_safetensors(models):
    got = _cond(models, "CLIPLoaderGGUF", clip_name="qwen3_Q8_0.gguf", type="lumina2")
    want = _cond(models, "CLIPLoader", clip_name="qwen3_Q8_0_deq.safetensors", type="lumina2")
    assert torch.isfinite(got.cross_attn).all() and torch.equal(got.cross_attn, want.cross_attn)


def test_quantised_vocabulary_is_looked_up_row_by_row(models):
    handle = gguf_nodes.load_clip_gguf([models / "text_encoders" / "t5_Q8_0.gguf"], "sd3")
    entry = handle.encoder("t5xxl")
    table = contents(models / "text_encoders" / "t5_Q8_0.gguf").tensors["shared.weight"].read()
    assert is_quantized(table) and table.shape == (32128, 64)
    ids = torch.tensor([[5, 17, 32000, 0]])
    assert torch.equal(table.rows(ids), torch.nn.functional.embedding(ids, table.dequantize()))
    layer = CastEmbedding(32128, 64, device="meta")
    layer.weight = torch.nn.Parameter(table, requires_grad=False)
    layer.compute_dtype = torch.bfloat16
    assert torch.equal(layer(ids), torch.nn.functional.embedding(ids, table.dequantize()).to(torch.bfloat16))
    assert entry.build is T5EncoderModel and isinstance(table, QuantizedTensor)


def test_llama_files_are_refused_by_name(models, tmp_path):
    sd = dict(qwen3_state_dict(seed=1))
    write_gguf(tmp_path / "mistral.gguf", {_llama_cpp(k, QWEN_NAMES): v for k, v in list(sd.items())[:6]},
               T.Q8_0, "llama")
    with pytest.raises(NotImplementedError, match="mistral.gguf: a llama.cpp-converted text encoder .*'llama'.*"
                                                  "permutes the q / k rows"):
        gguf_nodes.load_clip_gguf([tmp_path / "mistral.gguf"], "lumina2")
