"""ModelAttentionBackend: ComfyUI's options either map onto mixgraph's attention (the same
algorithm) or are refused at validation, naming the option (nodes/declare/model_patches/attention_backend_nodes.py)."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.env import Env
from mixgraph.graph.precision import parse_spec
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.declare.model_patches.attention_backend_nodes import ModelAttentionBackend
from mixgraph.nodes.models import loader
from mixgraph.nodes.models.attention import attention
from mixgraph.nodes.families.sd.unet_patches import attention_with_probs
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_unet

F32 = parse_spec("f32")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("attn_backend")
    write_unet(root / "diffusion_models" / "sd2.safetensors", kind="sd2", seed=11)
    return root


def test_model_attention_backend_spec_is_comfyuis():
    spec = api.default_registry().get("ModelAttentionBackend")
    assert spec.category == "model/patch" and dict(spec.info_extra).get("experimental") is True
    (name, inp), = [(n, i) for n, i in spec.inputs if n != "model"]
    assert name == "attention" and inp.default == "pytorch attention"
    assert tuple(inp.options) == ("pytorch attention", "comfy kitchen attention")
    assert [(o.type, o.name) for o in spec.outputs] == [("MODEL", "model")]


def test_model_attention_backend_patches_a_clone(models):
    model = loader.load_unet(models / "diffusion_models" / "sd2.safetensors")
    (patched,) = ModelAttentionBackend(model, "pytorch attention")
    assert patched is not model and patched.attention_backend == "pytorch"
    assert model.attention_backend is None   # the input handle is unchanged
    assert patched.source == model.source and patched.config == model.config


def test_model_attention_backend_pytorch_computes_mixgraphs_attention(models):
    model = loader.load_unet(models / "diffusion_models" / "sd2.safetensors")
    (patched,) = ModelAttentionBackend(model, "pytorch attention")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 8, 8, generator=gen)
    t = torch.tensor([500.0, 20.0])
    ctx = torch.randn(2, 5, model.config.context_dim, generator=gen)
    with torch.no_grad():
        base = model.runner(F32).unet(x, t, ctx)
        pinned = patched.runner(F32).unet(x, t, ctx)
    assert torch.allclose(pinned, base, atol=1e-6)
    # and that kernel is exact softmax(q kᵀ/√d) v, against an explicit float32 implementation
    q, k, v = (torch.randn(2, n, 128, generator=gen) for n in (16, 7, 7))
    reference, _ = attention_with_probs(q, k, v, heads=2)
    assert torch.allclose(attention(q, k, v, heads=2), reference, atol=1e-5)


def test_model_attention_backend_refuses_comfy_kitchen_at_validation(models, tmp_path):
    registry = api.default_registry()
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "sd2.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "ModelAttentionBackend", "inputs": {"model": ["1", 0],
                                                                 "attention": "comfy kitchen attention"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }
    env = Env.from_args(models=models, input=tmp_path, output=tmp_path / "out")
    v = validate(load_workflow(prompt, registry).prompt, registry, env)
    assert not v.ok
    text = " ".join(f"{p.node_id} {p.message} {p.details}" for p in v.errors)
    assert "2" in text and "'comfy kitchen attention'" in text and "not supported yet" in text, text
    prompt["2"]["inputs"]["attention"] = "pytorch attention"
    ok = validate(load_workflow(prompt, registry).prompt, registry, env)
    assert ok.ok, [p.message for p in ok.errors]
    with pytest.raises(NotImplementedError, match="comfy kitchen attention"):
        ModelAttentionBackend(loader.load_unet(models / "diffusion_models" / "sd2.safetensors"),
                              "comfy kitchen attention")


def test_model_attention_backend_unknown_name_is_refused_on_the_handle(models):
    model = loader.load_unet(models / "diffusion_models" / "sd2.safetensors")
    with pytest.raises(NotImplementedError, match="'sage'"):
        model.with_attention_backend("sage")
