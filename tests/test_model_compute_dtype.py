"""ModelComputeDtype: ComfyUI's spec, and the compute dtype it pins is what runs and is reported."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Socket, node
from mixgraph.graph.precision import parse_spec, resolve
from mixgraph.graph.registry import Registry
from mixgraph.nodes.declare.loaders.loading import UNETLoader
from mixgraph.nodes.helpers.precision import effective
from mixgraph.nodes.declare.model_patches.precision_nodes import ModelComputeDtype, SetModelPrecision
from tests import toy_nodes as toy
from tests.fixtures.checkpoints import write_unet
from tests.toy_nodes import call, link


@node(outputs=["STRING"], register=False)
def ComputesIn(model=Socket("MODEL"), ctx=None):
    """The resolved policy and the dtype the materialized UNet's output really has."""
    policy = effective(ctx, model, "MODEL")
    unet = model.runner(policy).model
    conv = unet.input_blocks[0][0]
    x = torch.zeros(1, conv.in_channels, 8, 8)
    return f"{policy.spec}|{conv(x).dtype}"


@pytest.fixture
def executor(tmp_path):
    for d in ("in", "out", "temp", "models/diffusion_models"):
        (tmp_path / d).mkdir(parents=True)
    write_unet(tmp_path / "models" / "diffusion_models" / "u.safetensors", "sd15", seed=3)
    env = Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    reg = Registry()
    for fn in (UNETLoader, ModelComputeDtype, SetModelPrecision, ComputesIn, toy.ShowText):
        reg.add(fn.spec)
    return Executor(reg, env, OutputCache(2**26))


def workflow(dtype, weight_dtype="default"):
    return {"1": call("UNETLoader", unet_name="u.safetensors", weight_dtype=weight_dtype),
            "2": call("ModelComputeDtype", model=link(1), dtype=dtype),
            "3": call("ComputesIn", model=link(2)), "4": call("ShowText", text=link(3))}


def test_model_compute_dtype_spec_matches_comfyui():
    spec = ModelComputeDtype.spec
    assert spec.name == "ModelComputeDtype"
    assert spec.category == "advanced/debug/model"
    reg = Registry()
    reg.add(spec)
    info = reg.object_info_for("ModelComputeDtype")["ModelComputeDtype"]
    assert info["input"]["required"]["dtype"][0] == ["default", "fp32", "fp16", "bf16"]
    assert list(info["input"]["required"]) == ["model", "dtype"]
    assert info["output"] == ["MODEL"]


def test_model_compute_dtype_pins_compute_in_run_report(executor):
    r = executor.run(workflow("fp16"), precision="bf16")
    assert r.values["3"][0] == "bf16:f16|torch.float16"      # storage from the run, compute pinned
    assert r.nodes["3"].precision == "bf16:f16"
    r = executor.run(workflow("fp32"), precision="bf16")
    assert r.values["3"][0] == "bf16:f32|torch.float32"
    assert r.nodes["3"].precision == "bf16:f32"


def test_model_compute_dtype_default_is_no_pin(executor):
    r = executor.run(workflow("default"), precision="bf16")
    assert r.values["3"][0] == "bf16|torch.bfloat16"
    assert r.nodes["3"].precision == "bf16"


def test_model_compute_dtype_keeps_loader_storage_pin(executor):
    r = executor.run(workflow("bf16", weight_dtype="fp8_e4m3fn"), precision="f32")
    assert r.values["3"][0] == "fp8_e4m3fn:bf16|torch.bfloat16"
    assert r.nodes["3"].precision == "fp8_e4m3fn:bf16"


def test_model_compute_dtype_later_node_wins_over_set_model_precision(executor):
    wf = workflow("fp16")
    wf["5"] = call("SetModelPrecision", model=link(1), storage="f32", compute="bf16",
                   upcast_attention=False, f32_norms=False)
    wf["2"]["inputs"]["model"] = link(5)                      # SetModelPrecision -> ComputeDtype
    r = executor.run(wf, precision="bf16")
    assert r.nodes["3"].precision == "f32:f16"
    wf = workflow("fp16")                                      # ComputeDtype -> SetModelPrecision
    wf["5"] = call("SetModelPrecision", model=link(2), storage="f32", compute="bf16",
                   upcast_attention=False, f32_norms=False)
    wf["3"]["inputs"]["model"] = link(5)
    r = executor.run(wf, precision="bf16")
    assert r.nodes["3"].precision == "f32:bf16"


def test_resolve_compute_pin_rules():
    assert resolve(parse_spec("bf16"), compute=torch.float32).spec == "bf16:f32"
    assert resolve(parse_spec("bf16"), compute=torch.float16, f32_compute=True).spec == "bf16:f32"
    warnings = []
    assert resolve(parse_spec("int8"), compute=torch.float16, warn=warnings.append).spec == "int8"
    assert warnings and "does not apply" in warnings[0]
