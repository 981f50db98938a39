"""ComfyUI custom node packs (DESIGN §9) on the test packs in tests/custom_packs: a V1 package
with a WEB_DIRECTORY and a route, a single-file V1 pack, a V3 pack, a pack whose import fails,
one that needs a ComfyUI internal, and a `.disabled` file. Run through the engine, the server
and its WebSocket, and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor, NodeError, ValidationFailed
from mixgraph.graph.registry import Registry
from mixgraph.graph.spec import NodeSpec
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.ui.comfy import comfy_runtime, custom_nodes
from mixgraph.ui.api import default_registry
from mixgraph.ui.cli import main
from mixgraph.ui.comfy.comfy_adapter import ENGINE_DYNAMIC
from mixgraph.ui.server.server import create_app
from tests.test_server import post_prompt, wait_history, ws_until_done

ROOT = Path(__file__).resolve().parents[1]
PACKS = ROOT / "tests" / "custom_packs"
DYNAMIC = pytest.mark.skipif(not ENGINE_DYNAMIC, reason="needs the dynamic engine (branch dyn)")


def fresh_registry() -> Registry:
    """The core node library in a registry of its own (packs never touch the global one)."""
    reg = Registry()
    for spec in default_registry().specs():
        if not spec.python_module.startswith("custom_nodes."):
            reg.add(spec)
    return reg


@pytest.fixture
def env(tmp_path):
    for d in ("in", "out", "temp", "models/checkpoints"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "models/checkpoints/tiny.safetensors").write_bytes(b"")
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


@pytest.fixture
def loaded(env):
    reg = fresh_registry()
    report = custom_nodes.load_packs([PACKS], reg, env)
    return reg, report


def pack_module():
    return sys.modules["custom_nodes.mg_v1_pack"]


def run(reg, env, prompt, **kw):
    return Executor(reg, env, OutputCache(2**24)).run(prompt, **kw)


# --- loading -------------------------------------------------------------------------------------

def test_custom_nodes_failed_pack_reported_rest_loaded(loaded, env):
    reg, report = loaded
    by = {p.name: p for p in report.packs}
    assert set(by) == {"mg_broken_pack", "mg_internals", "mg_single", "mg_v1_pack", "mg_v3_pack"}
    assert not by["mg_broken_pack"].ok
    assert "mg_dependency_that_does_not_exist" in by["mg_broken_pack"].error
    assert not by["mg_internals"].ok
    assert "needs ComfyUI internal module comfy.sd, not provided" in by["mg_internals"].error
    assert by["mg_v1_pack"].ok and by["mg_v1_pack"].version == "V1"
    assert by["mg_v3_pack"].ok and by["mg_v3_pack"].version == "V3"
    assert by["mg_single"].nodes == ["MgSingleAdd", "MgIntToString"]
    lines = report.messages()
    assert any("'mg_broken_pack'" in line and "failed to import" in line for line in lines)
    info = reg.object_info(env)
    assert {"MgAppendText", "MgSingleAdd", "MgV3Multiply", "KSampler"} <= info.keys()
    assert not [n for n, e in info.items() if e["python_module"] in
                ("custom_nodes.mg_broken_pack", "custom_nodes.mg_internals", "custom_nodes.mg_old")]
    assert str(comfy_runtime.HOST_DIR) not in sys.path     # only while packs load and run


def test_custom_nodes_object_info_v1_shape(loaded, env):
    reg, _ = loaded
    info = reg.object_info(env)
    e = info["MgAppendText"]
    assert e["input"] == {"required": {"text": ["STRING", {"default": "hi", "multiline": True,
                                                           "tooltip": "the text"}]},
                          "optional": {"suffix": ["STRING", {"default": "!"}]}}
    assert e["output"] == ["STRING"] and e["output_name"] == ["joined"]
    assert e["output_tooltips"] == ["text + suffix"]
    assert e["display_name"] == "Append Text (mg)" and e["category"] == "mg/text"
    assert e["python_module"] == "custom_nodes.mg_v1_pack" and e["description"] == "Appends a suffix."
    assert info["MgHidden"]["input"]["hidden"] == {"unique_id": "UNIQUE_ID", "prompt": "PROMPT",
                                                   "extra_pnginfo": "EXTRA_PNGINFO"}
    assert info["MgValidate"]["input"]["required"]["mode"] == [["a", "b"]]
    assert info["MgLazyPick"]["input"]["required"]["a"] == ["STRING", {"lazy": True,
                                                                       "forceInput": True}]
    assert info["MgSplit"]["output_is_list"] == [True]
    assert info["MgCountB"]["experimental"] is True and "deprecated" not in info["MgCountB"]
    assert info["MgFolders"]["input"]["required"]["ckpt"] == [["mixgraph-shapes.safetensors",
                                                                "tiny.safetensors"]]


def test_custom_nodes_object_info_v3_shape(loaded, env):
    reg, _ = loaded
    e = reg.object_info(env)["MgV3Multiply"]
    assert e["display_name"] == "Multiply (mg V3)" and e["category"] == "mg/v3"
    assert e["output_node"] is True and e["output"] == ["FLOAT", "STRING"]
    assert e["output_name"] == ["product", "STRING"]
    assert e["input"]["required"]["value"] == ["INT", {"default": 2, "min": 0, "max": 100,
                                                       "tooltip": "the value"}]
    assert e["input"]["hidden"] == {"unique_id": "UNIQUE_ID", "prompt": "PROMPT",
                                    "extra_pnginfo": "EXTRA_PNGINFO"}


def test_custom_nodes_pack_folders_base_directory_and_yaml(tmp_path, env):
    (tmp_path / "base/custom_nodes").mkdir(parents=True)
    (tmp_path / "base/custom_nodes/mg_single.py").symlink_to(PACKS / "mg_single.py")
    (tmp_path / "cfg/more").mkdir(parents=True)
    (tmp_path / "cfg/more/mg_v3_pack").symlink_to(PACKS / "mg_v3_pack")
    yaml_file = tmp_path / "cfg/extra_model_paths.yaml"
    yaml_file.write_text("mine:\n  custom_nodes: more\n")
    folders = custom_nodes.pack_folders(tmp_path / "base", [PACKS], [yaml_file])
    assert folders == [(tmp_path / "base/custom_nodes").resolve(), PACKS.resolve(),
                       (tmp_path / "cfg/more").resolve()]
    reg = fresh_registry()
    report = custom_nodes.load_packs(folders[:1] + folders[2:], reg, env)
    assert [p.name for p in report.packs] == ["mg_single", "mg_v3_pack"]
    assert "MgSingleAdd" in reg and "MgV3Multiply" in reg and "MgAppendText" not in reg


# --- running through the engine ------------------------------------------------------------------

def test_custom_nodes_v1_run_ui_result_hidden_kwargs_async(loaded, env):
    reg, _ = loaded
    prompt = {
        "1": {"class_type": "MgAppendText", "inputs": {"text": "hello"}},
        "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}},
        "3": {"class_type": "MgHidden", "inputs": {"tag": "t"}},
        "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}},
        "5": {"class_type": "MgAsync", "inputs": {"value": 4}},
        "6": {"class_type": "MgAnyCount", "inputs": {"first": ["5", 0], "extra": ["1", 0],
                                                     "literal": 5}},
        "7": {"class_type": "MgIntToString", "inputs": {"value": ["6", 0]}},
        "8": {"class_type": "MgShowText", "inputs": {"text": ["7", 0]}},
        "9": {"class_type": "MgIntToString", "inputs": {"value": ["5", 0]}},
        "10": {"class_type": "MgShowText", "inputs": {"text": ["9", 0]}},
    }
    report = run(reg, env, prompt, extra_data={"extra_pnginfo": {"workflow": {"id": "w"}}})
    assert report.status == "success"
    assert report.ui["2"] == {"text": ["hello?"]}     # absent optional: the function's default
    hidden = json.loads(report.ui["4"]["text"][0])
    assert hidden["unique_id"] == "3" and hidden["pnginfo"] == {"workflow": {"id": "w"}}
    assert hidden["classes"].count("MgShowText") == 4
    assert report.ui["10"] == {"text": ["40"]}         # async def FUNCTION, awaited
    assert report.ui["8"] == {"text": ["2"]}           # one undeclared link in **kwargs; literal dropped
    assert report.values["2"] == ("hello?",)


def test_custom_nodes_latents_convert_both_ways_through_core_nodes(loaded, env):
    reg, _ = loaded
    prompt = {
        "1": {"class_type": "MgEmptyLatent", "inputs": {"size": 64}},      # calls EmptyLatentImage
        "2": {"class_type": "MgScaleLatent", "inputs": {"samples": ["1", 0], "factor": 2.0}},
        "3": {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["2", 0],
                                                          "upscale_method": "nearest-exact",
                                                          "scale_by": 2.0}},
        "4": {"class_type": "MgV3Latent", "inputs": {"latent": ["3", 0]}},
        "5": {"class_type": "MgLatentStats", "inputs": {"samples": ["4", 0]}},
    }
    events = []
    report = run(reg, env, prompt, on_event=events.append)
    assert report.ui["5"]["shape"] == [[1, 4, 16, 16]]
    assert report.ui["5"]["mean"][0] == pytest.approx(1.0)          # (0 + 1) * 2 * 0.5
    progress = [(e.node, e.value, e.max) for e in events if type(e).__name__ == "Progress"]
    assert progress == [("2", 1, 3), ("2", 2, 3), ("2", 3, 3)]      # comfy.utils.ProgressBar


def test_custom_nodes_is_changed_joins_the_cache_key(loaded, env):
    reg, _ = loaded
    ex = Executor(reg, env, OutputCache(2**24))
    (env.input / "a.txt").write_text("one")
    prompt = {"1": {"class_type": "MgChanged", "inputs": {"name": "a.txt"}},
              "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    calls = pack_module().CALLS
    before = calls["changed"]
    assert ex.run(prompt).ui["2"] == {"text": ["one"]}
    assert ex.run(prompt).nodes["1"].status == "cached" and calls["changed"] == before + 1
    (env.input / "a.txt").write_text("two")
    os.utime(env.input / "a.txt", (1, 1))
    assert ex.run(prompt).ui["2"] == {"text": ["two"]} and calls["changed"] == before + 2


def test_custom_nodes_validate_inputs_claims_and_input_types(loaded, env):
    reg, _ = loaded

    def check(mode="a", value=1, other=1, thing=("5", 0)):
        prompt = {"5": {"class_type": "MgSingleAdd", "inputs": {"a": 1, "b": 2}},
                  "6": {"class_type": "MgEmptyLatent", "inputs": {"size": 64}},
                  "1": {"class_type": "MgValidate", "inputs": {"mode": mode, "value": value,
                                                               "other": other, "thing": list(thing)}},
                  "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
        v = validate(load_workflow(prompt, reg).prompt, reg, env)
        return [(p.type, p.input_name, p.details) for p in v.errors if p.node_id == "1"]

    assert check() == []
    assert check(mode="c") == []                 # a claimed combo: the validator judges it
    assert check(value=11) == []                 # a claimed INT: no default max check
    assert check(other=11)[0][:2] == ("value_bigger_than_max", "other")
    errs = check(mode="d")
    assert ("custom_validation_failed", "mode", "mode - mode d is not a, b or c") in errs
    assert {e[1] for e in errs} == {"mode", "value", "input_types"}     # ComfyUI: one per input
    assert check(value=7)[0][2] == "mode - seven is not allowed"
    errs = check(thing=("6", 0))                 # a LATENT: input_types decides, no type mismatch
    assert errs and all(e[0] == "custom_validation_failed" for e in errs)
    assert "thing must be INT or STRING, not LATENT" in errs[0][2]


def test_custom_nodes_star_and_multi_type_links(loaded, env):
    reg, _ = loaded

    def errors(num_from):
        prompt = {"1": {"class_type": "MgSingleAdd", "inputs": {"a": 1, "b": 2}},
                  "2": {"class_type": "MgAppendText", "inputs": {"text": "x"}},
                  "3": {"class_type": "MgAnyCount", "inputs": {"first": ["2", 0],
                                                               "num": [num_from, 0]}},
                  "4": {"class_type": "MgIntToString", "inputs": {"value": ["3", 0]}},
                  "5": {"class_type": "MgShowText", "inputs": {"text": ["4", 0]}}}
        return [p.type for p in validate(load_workflow(prompt, reg).prompt, reg, env).errors]

    assert errors("1") == []                           # INT into "FLOAT,INT"; STRING into "*"
    assert errors("2") == ["return_type_mismatch"]     # STRING into "FLOAT,INT"


def test_custom_nodes_v3_validate_fingerprint_hidden_ui(loaded, env):
    reg, _ = loaded
    ex = Executor(reg, env, OutputCache(2**24))
    prompt = {"7": {"class_type": "MgV3Multiply", "inputs": {"value": 4, "factor": 2.5,
                                                             "mode": "int"}}}
    report = ex.run(prompt)
    assert report.values["7"] == (10.0, "7:10.0") and list(report.ui["7"]["text"]) == ["7:10.0"]
    assert ex.run(prompt).nodes["7"].status == "cached"
    with pytest.raises(ValidationFailed, match="13 is unlucky"):
        ex.run({"7": {"class_type": "MgV3Multiply", "inputs": {"value": 13, "factor": 1.0,
                                                               "mode": "int"}}})


def test_custom_nodes_missing_internal_names_pack_and_node(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgLazyInternal", "inputs": {"text": "x"}},
              "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    with pytest.raises(NodeError) as e:
        run(reg, env, prompt)
    assert "custom node pack 'mg_v1_pack', node MgLazyInternal: needs ComfyUI internal module " \
           "comfy.model_patcher, not provided by mixgraph" in str(e.value)


def test_custom_nodes_folder_paths_backed_by_env(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgFolders", "inputs": {"ckpt": "tiny.safetensors"}},
              "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    got = json.loads(run(reg, env, prompt).ui["2"]["text"][0])
    assert got["path"] == str((env.models[0] / "checkpoints/tiny.safetensors").resolve())
    assert got["out"] == str(env.output.resolve()) and got["save"] == ["img", 1, "mg"]


@pytest.mark.skipif(ENGINE_DYNAMIC, reason="the dynamic engine maps lists itself")
def test_custom_nodes_input_is_list_without_list_engine_gets_one_item_lists(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgAppendText", "inputs": {"text": "x", "suffix": ""}},
              "2": {"class_type": "MgJoinList", "inputs": {"texts": ["1", 0], "sep": "-"}},
              "3": {"class_type": "MgShowText", "inputs": {"text": ["2", 0]}}}
    assert run(reg, env, prompt).ui["3"] == {"text": ["x"]}


def test_custom_nodes_graph_builder_builds_api_prompts():
    with comfy_runtime.host_path():
        from comfy_execution.graph_utils import GraphBuilder, is_link
    g = GraphBuilder(prefix="p.")
    a = g.node("MgAppendText", text="x")
    b = g.node("MgAppendText", text=a.out(0), suffix="!")
    assert g.finalize() == {"p.1": {"class_type": "MgAppendText", "inputs": {"text": "x"}},
                            "p.2": {"class_type": "MgAppendText",
                                    "inputs": {"text": ["p.1", 0], "suffix": "!"}}}
    assert is_link(b.out(0)) and not is_link(["a", True]) and not is_link("a")


def test_custom_nodes_graph_builder_default_prefix():
    """ComfyUI's `ROOT.CALL.GRAPH.` prefix; while a pack node runs the root is "" and the engine
    adds `PARENT.CALL.`, so the builder's prefix is its index in the call."""
    with comfy_runtime.host_path():
        from comfy_execution.graph_utils import GraphBuilder
    try:
        GraphBuilder.set_default_prefix("5", 2, 0)
        assert GraphBuilder().prefix == "5.2.0." and GraphBuilder().prefix == "5.2.1."
        assert GraphBuilder.alloc_prefix("7", 1, 4) == "7.1.4."
        GraphBuilder.set_default_prefix("", 0, 0)
        assert [GraphBuilder().prefix for _ in range(3)] == ["0.", "1.", "2."]
    finally:
        GraphBuilder.set_default_prefix("", 0, 0)


# --- the dynamic engine (branch dyn) -------------------------------------------------------------

@DYNAMIC
def test_custom_nodes_lazy_inputs_skip_the_unneeded_branch(loaded, env):
    reg, _ = loaded
    calls = pack_module().CALLS
    before = calls["lazy_b"]
    prompt = {"1": {"class_type": "MgAppendText", "inputs": {"text": "a", "suffix": ""}},
              "2": {"class_type": "MgCountB", "inputs": {"text": "b"}},
              "3": {"class_type": "MgLazyPick", "inputs": {"use_a": True, "a": ["1", 0],
                                                           "b": ["2", 0]}},
              "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}}}
    assert run(reg, env, prompt).ui["4"] == {"text": ["a"]}
    assert calls["lazy_b"] == before


@DYNAMIC
def test_custom_nodes_output_and_input_lists(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgSplit", "inputs": {"text": "x y z"}},
              "2": {"class_type": "MgAppendText", "inputs": {"text": ["1", 0], "suffix": "!"}},
              "3": {"class_type": "MgJoinList", "inputs": {"texts": ["2", 0], "sep": ","}},
              "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}}}
    assert run(reg, env, prompt).ui["4"] == {"text": ["x!,y!,z!"]}


@DYNAMIC
def test_custom_nodes_expansion_with_graph_builder(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgExpandAppend", "inputs": {"text": "e", "times": 3}},
              "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    assert run(reg, env, prompt).ui["2"] == {"text": ["e+++"]}


@DYNAMIC
def test_custom_nodes_execution_blocker_stops_consumers(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgAppendText", "inputs": {"text": "x"}},
              "2": {"class_type": "MgBlockIf", "inputs": {"text": ["1", 0], "block": True}},
              "3": {"class_type": "MgShowText", "inputs": {"text": ["2", 0]}}}
    report = run(reg, env, prompt)
    assert "3" not in report.ui


# --- the server ----------------------------------------------------------------------------------

def serve_run(env, reg, report, body):
    async def main():
        app = create_app(env, registry=reg, executor=Executor(reg, env, OutputCache(2**24)),
                         user_dir=env.output.parent / "user", custom_nodes=report)
        async with TestServer(app) as server, TestClient(server) as c:
            await body(c)
    asyncio.run(main())


def test_custom_nodes_server_websocket_progress_send_sync_and_history(loaded, env):
    reg, report = loaded
    prompt = {"1": {"class_type": "MgEmptyLatent", "inputs": {"size": 64}},
              "2": {"class_type": "MgScaleLatent", "inputs": {"samples": ["1", 0], "factor": 1.0}},
              "3": {"class_type": "MgLatentStats", "inputs": {"samples": ["2", 0]}},
              "4": {"class_type": "MgAppendText", "inputs": {"text": "hi", "suffix": "!"}},
              "5": {"class_type": "MgShowText", "inputs": {"text": ["4", 0]}}}

    async def body(c):
        ws = await c.ws_connect("/ws?clientId=cn")
        await ws.receive_json()
        status, r = await post_prompt(c, prompt, client_id="cn")
        assert status == 200, r
        msgs = await ws_until_done(ws, r["prompt_id"])
        kinds = [m["type"] for m in msgs]
        assert [m["data"]["value"] for m in msgs if m["type"] == "progress"] == [1, 2, 3]
        assert {"type": "mg.shown", "data": {"node": "5", "text": "hi!"}} in msgs
        executed = {m["data"]["node"]: m["data"]["output"] for m in msgs if m["type"] == "executed"}
        assert executed["5"] == {"text": ["hi!"]} and executed["3"]["shape"] == [[1, 4, 8, 8]]
        assert kinds[-2:] == ["execution_success", "executing"]
        entry = await wait_history(c, r["prompt_id"])
        assert entry["outputs"]["5"] == {"text": ["hi!"]}
        info = await (await c.get("/object_info/MgV3Multiply")).json()
        assert info["MgV3Multiply"]["display_name"] == "Multiply (mg V3)"
        broken = await (await c.get("/object_info")).json()
        assert "MgAppendText" in broken and not any(
            e["python_module"] == "custom_nodes.mg_broken_pack" for e in broken.values())
        await ws.close()

    serve_run(env, reg, report, body)


def test_custom_nodes_server_routes_and_web_directory(loaded, env):
    reg, report = loaded

    async def body(c):
        for path in ("/mg_pack/hello", "/api/mg_pack/hello"):
            r = await c.get(path)
            assert r.status == 200 and await r.json() == {"hello": "from mg_v1_pack",
                                                          "max": 16384}
        urls = await (await c.get("/extensions")).json()
        assert "/extensions/mg_v1_pack/js/hello.js" in urls
        r = await c.get("/extensions/mg_v1_pack/js/hello.js")
        assert r.status == 200 and "mg.hello" in await r.text()

    serve_run(env, reg, report, body)


# --- the command line ----------------------------------------------------------------------------

def test_custom_nodes_cli_validate_nodes_and_disable(tmp_path, env, capsys):
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"1": {"class_type": "MgSingleAdd", "inputs": {"a": 1, "b": 200}},
                              "2": {"class_type": "MgIntToString", "inputs": {"value": ["1", 0]}},
                              "3": {"class_type": "MgShowText", "inputs": {"text": ["2", 0]}}}))
    args = ["--custom-nodes", str(PACKS), "--base-directory", str(tmp_path)]
    assert main(["validate", str(wf), *args], registry=fresh_registry()) == 2
    err = capsys.readouterr().err
    assert "node 1 (MgSingleAdd) input 'b': Value 200 bigger than max of 100" in err
    assert "'mg_broken_pack'" in err and "failed to import" in err
    assert main(["nodes", "--json", *args], registry=fresh_registry()) == 0
    assert "MgV3Multiply" in json.loads(capsys.readouterr().out)
    assert main(["validate", str(wf), *args, "--disable-all-custom-nodes"],
                registry=fresh_registry()) == 2
    assert "node MgSingleAdd does not exist" in capsys.readouterr().err


def test_custom_nodes_mixgraph_run_subprocess(tmp_path):
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({
        "1": {"class_type": "MgV3Multiply", "inputs": {"value": 3, "factor": 2.0, "mode": "int"}},
        "2": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
                                                           "batch_size": 1}},
        "3": {"class_type": "MgScaleLatent", "inputs": {"samples": ["2", 0], "factor": 3.0}},
        "4": {"class_type": "MgLatentStats", "inputs": {"samples": ["3", 0]}}}))
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "mixgraph", "run", str(wf), "--quiet",
                        "--custom-nodes", str(PACKS), "--output", str(tmp_path / "out"),
                        "--report", str(report), "--base-directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    nodes = json.loads(report.read_text())["nodes"]
    assert {n: v["status"] for n, v in nodes.items()} == {"1": "executed", "2": "executed",
                                                          "3": "executed", "4": "executed"}
    assert "mg_broken_pack" in r.stderr


def test_custom_nodes_spec_fields_follow_the_engine():
    """The adapter fills the dynamic-engine fields exactly when the engine has them."""
    names = {f for f in NodeSpec.__dataclass_fields__}
    assert ENGINE_DYNAMIC == ({"input_is_list", "check_lazy_status"} <= names)


def test_custom_nodes_explain_names_the_comfy_internal():
    from mixgraph.nodes.payloads.latent import Latent
    import torch
    err = AttributeError("no clone", name="clone", obj=Latent(torch.zeros(1, 4, 2, 2)))
    better = comfy_runtime.explain(err, "some_pack", "SomeNode")
    assert isinstance(better, comfy_runtime.MissingHostAPI)
    assert str(better) == ("custom node pack 'some_pack', node SomeNode: needs ComfyUI internal "
                           "Latent.clone (a ComfyUI Latent attribute), not provided by mixgraph")
    assert comfy_runtime.explain(ValueError("plain"), "p", "n") is None
