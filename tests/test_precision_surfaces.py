"""One precision check for every way in: `mixgraph validate`, `mixgraph run`, `POST /prompt` (also
an editor graph's tagged groups) and `mixgraph bench precision` accept and reject the same specs;
and the int8 + UNETLoader `weight_dtype` case runs what it reports."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Socket, node
from mixgraph.graph.registry import Registry
from mixgraph.nodes.declare.loaders.loading import UNETLoader
from mixgraph.nodes.weights.cast import Int8Linear
from mixgraph.nodes.helpers.precision import effective
from mixgraph.ui.cli import main
from mixgraph.ui.server.server import create_app
from tests import toy_nodes as toy
from tests.fixtures.checkpoints import write_unet
from tests.toy_nodes import call, link

REG = toy.registry()
PROMPT = {"1": call("Const", value=2), "2": call("Mul", a=link(1), factor=3),
          "3": call("Show", value=link(2))}


def envelope(default="bf16", regions=()):
    return {"format": "mixgraph/1", "prompt": PROMPT,
            "precision": {"default": default, "regions": list(regions)}}


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp", "models"):
        (tmp_path / d).mkdir(parents=True)
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


def write(tmp_path, obj) -> str:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(obj))
    return str(path)


def dirs(env, output: bool = True) -> list[str]:
    out = ["--output", str(env.output)] if output else []
    return ["--models", str(env.models[0]), "--input", str(env.input), *out]


def cli_validate(tmp_path, env, obj, capsys) -> tuple[int, dict]:
    code = main(["validate", write(tmp_path, obj), "--json", *dirs(env, output=False)], registry=REG)
    return code, json.loads(capsys.readouterr().out)


def cli_run(tmp_path, env, obj, capsys, *extra) -> tuple[int, str]:
    toy.CALLS.clear()
    code = main(["run", write(tmp_path, obj), "--quiet", *dirs(env), *extra], registry=REG)
    return code, capsys.readouterr().err


def post(env, body: dict) -> tuple[int, dict]:
    async def go():
        app = create_app(env, registry=REG, executor=Executor(REG, env, OutputCache(2**24)),
                         user_dir=env.output.parent / "user")
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/prompt", json=body)
            return r.status, await r.json()
    return asyncio.run(go())


BAD_DEFAULT = "precision default is 'f99': unknown storage dtype 'f99'"


def test_cli_validate_rejects_envelope_bad_default_naming_it(tmp_path, env, capsys):
    code, body = cli_validate(tmp_path, env, envelope("f99"), capsys)
    assert code == 2 and body["error"]["type"] == "invalid_precision"
    assert BAD_DEFAULT in body["error"]["message"] and body["node_errors"] == {}
    assert main(["validate", write(tmp_path, envelope("f99")), *dirs(env, output=False)], registry=REG) == 2
    assert BAD_DEFAULT in capsys.readouterr().err


def test_cli_run_rejects_envelope_bad_default_running_nothing(tmp_path, env, capsys):
    code, err = cli_run(tmp_path, env, envelope("f99"), capsys)
    assert code == 2 and BAD_DEFAULT in err and not toy.CALLS
    code, err = cli_run(tmp_path, env, envelope("f99"), capsys, "--precision", "f32")  # still the file's error
    assert code == 2 and BAD_DEFAULT in err and not toy.CALLS


def test_server_post_prompt_rejects_envelope_bad_default_with_400(env):
    status, body = post(env, {"prompt": envelope("f99")})
    assert status == 400 and body["node_errors"] == {}
    assert body["error"]["type"] == "invalid_precision" and BAD_DEFAULT in body["error"]["message"]


def test_cli_bench_precision_rejects_envelope_bad_default_before_running(tmp_path, env, capsys):
    code = main(["bench", "precision", write(tmp_path, envelope("f99")), "--precisions", "f32", *dirs(env)])
    assert code == 2 and BAD_DEFAULT in capsys.readouterr().err


def test_precision_surfaces_name_the_bad_region_alike(tmp_path, env, capsys):
    wf = envelope("bf16", [{"name": "upscale", "nodes": ["2"], "precision": "f16:fp8_e5m2"}])
    where = "precision of region 'upscale' is 'f16:fp8_e5m2': compute dtype must be f32, bf16 or f16"
    code, body = cli_validate(tmp_path, env, wf, capsys)
    assert code == 2 and where in body["error"]["message"]
    code, err = cli_run(tmp_path, env, wf, capsys)
    assert code == 2 and where in err and not toy.CALLS
    status, body = post(env, {"prompt": wf})
    assert status == 400 and where in body["error"]["message"]


def test_precision_surfaces_accept_a_valid_envelope_alike(tmp_path, env, capsys):
    wf = envelope("bf16:f32", [{"name": "r", "nodes": ["2"], "precision": "f16+upcast"}])
    code, body = cli_validate(tmp_path, env, wf, capsys)
    assert code == 0 and body == {"outputs": ["3"], "node_errors": {}}
    code, err = cli_run(tmp_path, env, wf, capsys)
    assert code == 0 and toy.CALLS["Show"] == 1
    status, body = post(env, {"prompt": wf})
    assert status == 200 and body["node_errors"] == {} and body["prompt_id"]


def test_server_post_prompt_rejects_editor_group_with_bad_precision(env):
    """The editor queues an API prompt with its UI graph in extra_pnginfo; a tagged group of that
    graph is a region, so a bad tag is rejected as `mixgraph validate` rejects the UI file."""
    ui = {"nodes": [{"id": 1, "type": "Const", "pos": [10, 10], "size": [100, 50], "mode": 0,
                     "inputs": [], "outputs": [{"name": "INT", "type": "INT", "links": [1]}],
                     "widgets_values": [2]},
                    {"id": 2, "type": "Show", "pos": [300, 10], "size": [100, 50], "mode": 0,
                     "inputs": [{"name": "value", "type": "INT", "link": 1}], "outputs": []}],
          "links": [[1, 1, 0, 2, 0, "INT"]],
          "groups": [{"title": "Numbers [bf16:f64]", "bounding": [0, 0, 200, 100]}]}
    prompt = {"1": call("Const", value=2), "2": call("Show", value=link(1))}
    status, body = post(env, {"prompt": prompt, "extra_data": {"extra_pnginfo": {"workflow": ui}}})
    assert status == 400 and body["error"]["type"] == "invalid_precision"
    assert "precision of group 'Numbers' is 'bf16:f64'" in body["error"]["message"]
    ui["groups"][0]["title"] = "Numbers [bf16:f32]"
    status, body = post(env, {"prompt": prompt, "extra_data": {"extra_pnginfo": {"workflow": ui}}})
    assert status == 200


def test_cli_run_bad_precision_option_names_it(tmp_path, env, capsys):
    code, err = cli_run(tmp_path, env, PROMPT, capsys, "--precision", "VAE=f99")
    assert code == 2 and "--precision" in err and "'f99'" in err and not toy.CALLS


# --- int8 with UNETLoader's fp8 weight_dtype -------------------------------------------------

@node(outputs=["STRING"], register=False)
def StoredAs(model=Socket("MODEL"), ctx=None):
    """What the UNet is stored and computed in, once materialized under the resolved policy."""
    policy = effective(ctx, model, "MODEL")
    unet = model.runner(policy).model
    int8 = sum(isinstance(m, Int8Linear) for m in unet.modules())
    fp8 = sum(p.dtype == torch.float8_e4m3fn for p in unet.parameters())
    return f"{policy.spec}|fp8_tensors={'yes' if fp8 else 'no'}|int8_layers={int8}"


@pytest.mark.parametrize("spec, pinned", [("int8", "fp8_e4m3fn:f32"), ("int8:bf16", "fp8_e4m3fn:bf16")])
def test_int8_with_fp8_weight_dtype_reports_what_it_stores_and_computes(env, spec, pinned):
    """The int8 policies through the executor; a UNETLoader fp8 pin turns int8 off and keeps the
    compute dtype of the rest (f32 for `int8`, bf16 for `int8:bf16`)."""
    (env.models[0] / "diffusion_models").mkdir()
    write_unet(env.models[0] / "diffusion_models" / "u.safetensors", "sd15", seed=3)
    reg = Registry()
    for fn in (UNETLoader, StoredAs, toy.ShowText):
        reg.add(fn.spec)
    wf = {"1": call("UNETLoader", unet_name="u.safetensors", weight_dtype="fp8_e4m3fn"),
          "2": call("StoredAs", model=link(1)), "3": call("ShowText", text=link(2))}
    ex = Executor(reg, env, OutputCache(2**26))
    r = ex.run(wf, precision=spec)
    assert r.values["2"][0] == f"{pinned}|fp8_tensors=yes|int8_layers=0"
    assert r.nodes["2"].precision == pinned
    assert any("int8 does not combine" in w for w in r.warnings)
    wf["1"]["inputs"]["weight_dtype"] = "default"          # no pin: int8 is what runs
    r = ex.run(wf, precision=spec)
    ran, storage, layers = r.values["2"][0].split("|")
    assert ran == spec and r.nodes["2"].precision == spec and layers != "int8_layers=0"
    assert storage == "fp8_tensors=no"
