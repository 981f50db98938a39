"""The test custom node packs' dynamic nodes (tests/custom_packs: V1 and V3) through the real
server and its WebSocket in every cache mode, nested expansion loops, blocked nodes in the
report and the history, and precision regions around expanded and custom nodes."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from safetensors.torch import load_file, save_file

from mixgraph.graph.cache import make_cache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
from mixgraph.ui.comfy import custom_nodes
from mixgraph.ui.comfy.comfy_adapter import ENGINE_DYNAMIC
from mixgraph.ui.server.server import create_app
from tests.test_custom_nodes import PACKS, env, fresh_registry, loaded, pack_module  # noqa: F401
from tests.test_server import post_prompt, wait_history, ws_until_done

pytestmark = pytest.mark.skipif(not ENGINE_DYNAMIC, reason="needs the dynamic engine")

CACHE_MODES = {"default": {}, "--cache-lru": {"lru": 50}, "--cache-none": {"none": True},
               "--cache-ram": {"ram": 0.0}}


def v3_module():
    return sys.modules["custom_nodes.mg_v3_pack"]


def dynamic_prompt() -> dict:
    """Lists, a lazy mix, a V1 and a V3 expansion loop, a blocker with a message, two async
    sleeps, IS_CHANGED, and a V3 node whose fingerprint is NaN."""
    return {
        "1": {"class_type": "MgSplit", "inputs": {"text": "a b"}},
        "2": {"class_type": "MgAppendText", "inputs": {"text": ["1", 0], "suffix": "!"}},
        "3": {"class_type": "MgJoinList", "inputs": {"texts": ["2", 0], "sep": ","}},
        "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}},
        "5": {"class_type": "MgNumber", "inputs": {"value": 2.0, "tag": "mix_a"}},
        "6": {"class_type": "MgNumber", "inputs": {"value": 8.0, "tag": "mix_b"}},
        "7": {"class_type": "MgLazyMix", "inputs": {"ratio": 0.0, "a": ["5", 0], "b": ["6", 0]}},
        "8": {"class_type": "MgWhileAppend", "inputs": {"text": "w", "n": 3}},
        "9": {"class_type": "MgShowText", "inputs": {"text": ["8", 0]}},
        "10": {"class_type": "MgBlockIf", "inputs": {"text": ["8", 0], "block": True,
                                                     "message": "stop here"}},
        "11": {"class_type": "MgShowText", "inputs": {"text": ["10", 0]}},
        "12": {"class_type": "MgSleep", "inputs": {"tag": "s1", "seconds": 0.3}},
        "13": {"class_type": "MgSleep", "inputs": {"tag": "s2", "seconds": 0.3}},
        "14": {"class_type": "MgV3Loop", "inputs": {"text": "v", "n": 2}},
        "15": {"class_type": "MgShowText", "inputs": {"text": ["14", 0]}},
        "16": {"class_type": "MgV3Always", "inputs": {"value": 4}},
        "17": {"class_type": "MgChanged", "inputs": {"name": "a.txt"}},
        "18": {"class_type": "MgShowText", "inputs": {"text": ["17", 0]}},
    }


EXPECTED_UI = {"4": {"text": ["a!,b!"]}, "7": {"mix": [2.0]}, "9": {"text": ["w+++"]},
               "12": {"slept": ["s1"]}, "13": {"slept": ["s2"]}, "15": {"text": ["v++"]},
               "16": {"value": [5]}, "18": {"text": ["file"]}}


def spans(sleeps, tag):
    return next(t for g, k, t in sleeps if g == tag and k == "start"), \
        next(t for g, k, t in sleeps if g == tag and k == "end")


@pytest.mark.parametrize("mode", list(CACHE_MODES))
def test_custom_pack_dynamic_server_websocket_every_cache_mode(loaded, env, mode):
    reg, report = loaded
    (env.input / "a.txt").write_text("file")
    calls, sleeps = pack_module().CALLS, pack_module().SLEEPS
    prompt = dynamic_prompt()

    async def one_run(c, ws):
        sleeps.clear()
        status, r = await post_prompt(c, prompt, client_id="dyn")
        assert status == 200, r
        msgs = await ws_until_done(ws, r["prompt_id"], timeout=60.0)
        entry = await wait_history(c, r["prompt_id"], timeout=60.0)
        return [m for m in msgs if m["type"] != "status"], entry

    async def body(c):
        ws = await c.ws_connect("/ws?clientId=dyn")
        await ws.receive_json()
        b_before, always_before = calls.get("mix_b", 0), v3_module().CALLS["always"]
        msgs, entry = await one_run(c, ws)
        kinds = [m["type"] for m in msgs]
        # ComfyUI's order: start, cached, the nodes, success, then executing null
        assert kinds[:2] == ["execution_start", "execution_cached"]
        assert msgs[1]["data"]["nodes"] == []
        assert kinds[-2:] == ["execution_success", "executing"]
        assert msgs[-1]["data"]["node"] is None
        executing = [m["data"]["node"] for m in msgs if m["type"] == "executing"]
        executed = {m["data"]["node"]: m["data"]["output"] for m in msgs if m["type"] == "executed"}
        for i, m in enumerate(msgs):     # every UI comes after its node's executing
            if m["type"] == "executed":
                starts = [j for j, x in enumerate(msgs[:i]) if x["type"] == "executing"
                          and x["data"]["node"] == m["data"]["node"]]
                assert starts, m
        assert executed == EXPECTED_UI
        assert "11" not in executed and "11" not in entry["outputs"]     # blocked
        blocked = [m["data"] for m in msgs if m["type"] == "execution_error"]
        assert [(b["node_id"], b["exception_message"], b["exception_type"]) for b in blocked] == \
            [("11", "Execution Blocked: stop here", "ExecutionBlocked")]
        assert entry["status"]["status_str"] == "success"
        assert [t for t, _ in entry["status"]["messages"]] == \
            ["execution_start", "execution_cached", "execution_success"]   # ComfyUI: ws only
        assert entry["outputs"] == EXPECTED_UI
        assert calls.get("mix_b", 0) == b_before                          # lazy: b never ran
        assert v3_module().CALLS["always"] == always_before + 1
        # the loops ran as expanded nodes under their parents' ids
        assert {"8.0.0.1", "8.0.0.2", "8.0.0.2.0.0.1", "14.0.0.1"} <= set(executing)
        s1, s2 = spans(sleeps, "s1"), spans(sleeps, "s2")
        assert s1[0] < s2[1] and s2[0] < s1[1]                           # the sleeps overlapped
        progress = sorted((m["data"]["node"], m["data"]["value"]) for m in msgs
                          if m["type"] == "progress")
        assert progress == [("12", 1), ("12", 2), ("13", 1), ("13", 2)]  # each its own node

        msgs2, entry2 = await one_run(c, ws)
        cached = set(msgs2[1]["data"]["nodes"])
        executed2 = {m["data"]["node"]: m["data"]["output"] for m in msgs2
                     if m["type"] == "executed"}
        assert v3_module().CALLS["always"] == always_before + 2          # NaN: runs every time
        assert "16" not in cached and executed2["16"] == {"value": [5]}
        # same outputs in any mode (cached output nodes send their UI again, as ComfyUI)
        assert entry2["outputs"] == EXPECTED_UI and executed2 == EXPECTED_UI
        if mode == "--cache-none":
            assert cached == set()
            assert [t for t, _ in entry2["status"]["messages"]] == \
                ["execution_start", "execution_cached", "execution_success"]
        elif mode in ("default", "--cache-lru"):
            assert {"1", "2", "3", "4", "7", "8", "9", "12", "13", "14", "15", "17", "18"} <= cached
            ran2 = {m["data"]["node"] for m in msgs2 if m["type"] == "executing"}
            assert ran2 == {"16", None}                                   # only the NaN node ran

        (env.input / "a.txt").write_text("file2")       # IS_CHANGED: the mtime changes
        os.utime(env.input / "a.txt", (1, 1))
        msgs3, entry3 = await one_run(c, ws)
        assert entry3["outputs"]["18"] == {"text": ["file2"]}
        assert "17" not in set(msgs3[1]["data"]["nodes"])
        await ws.close()

    async def main():
        ex = Executor(reg, env, make_cache(**CACHE_MODES[mode]))
        app = create_app(env, registry=reg, executor=ex, user_dir=env.output.parent / "user",
                         custom_nodes=report)
        async with TestServer(app) as server, TestClient(server) as c:
            await body(c)
    asyncio.run(main())


def test_custom_pack_server_validation_hidden_inputs_and_failed_pack(loaded, env):
    """Custom validation with input_types and hidden inputs through POST /prompt and the
    WebSocket; the pack that failed to import is absent, the others serve their nodes."""
    reg, report = loaded
    bad = {"5": {"class_type": "MgEmptyLatent", "inputs": {"size": 64}},
           "1": {"class_type": "MgValidate", "inputs": {"mode": "a", "value": 1, "other": 1,
                                                        "thing": ["5", 0]}},
           "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    good = {"1": {"class_type": "MgHidden", "inputs": {"tag": "t"}},
            "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}},
            "3": {"class_type": "MgV3Multiply", "inputs": {"value": 2, "factor": 2.0,
                                                           "mode": "float"}}}

    async def body(c):
        ws = await c.ws_connect("/ws?clientId=val")
        await ws.receive_json()
        status, r = await post_prompt(c, bad, client_id="val")
        assert status == 400
        errors = r["node_errors"]["1"]["errors"]
        assert errors[0]["type"] == "custom_validation_failed"
        assert "thing must be INT or STRING, not LATENT" in errors[0]["details"]
        status, r = await post_prompt(c, good, client_id="val",
                                      extra_data={"extra_pnginfo": {"workflow": {"id": "w9"}}})
        assert status == 200, r
        msgs = await ws_until_done(ws, r["prompt_id"], timeout=60.0)
        executed = {m["data"]["node"]: m["data"]["output"] for m in msgs if m["type"] == "executed"}
        hidden = json.loads(executed["2"]["text"][0])
        assert hidden["unique_id"] == "1" and hidden["pnginfo"] == {"workflow": {"id": "w9"}}
        assert hidden["classes"] == ["MgHidden", "MgShowText", "MgV3Multiply"]
        assert list(executed["3"]["text"]) == ["3:4.0"]            # V3 hidden unique_id, ui
        info = await (await c.get("/object_info")).json()
        modules = {e["python_module"] for e in info.values()}
        assert "custom_nodes.mg_v1_pack" in modules and "custom_nodes.mg_broken_pack" not in modules
        await ws.close()

    async def main():
        app = create_app(env, registry=reg, executor=Executor(reg, env, make_cache()),
                         user_dir=env.output.parent / "user", custom_nodes=report)
        async with TestServer(app) as server, TestClient(server) as c:
            await body(c)
    asyncio.run(main())


def test_custom_pack_nested_loops_unique_ids(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgNestedLoop", "inputs": {"text": "o", "outer": 2, "inner": 2}},
              "2": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}},
              "3": {"class_type": "MgNestedLoop", "inputs": {"text": "p", "outer": 1, "inner": 3}},
              "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}}}
    events = []
    report = Executor(reg, env, make_cache()).run(prompt, on_event=events.append)
    assert report.ui["2"] == {"text": ["o++|++|"]} and report.ui["4"] == {"text": ["p+++|"]}
    ran = [e.node for e in events if type(e).__name__ == "Executing" and e.node is not None]
    appends = [n for n, r in report.nodes.items() if r.class_type == "MgAppendText"]
    assert len(appends) == 2 * 2 + 2 + 3 + 1                 # every round's step and bar ran
    assert all(n.startswith(("1.0.", "3.0.")) for n in appends)
    # PARENT.CALL.BUILDER.N: the builder adds its own index only, so ids grow by one level a round
    assert "1.0.0.1" in report.nodes and report.nodes["1.0.0.1"].class_type == "MgWhileAppend"
    assert "1.0.0.3.0.0.1" in report.nodes
    assert max(len(n.split(".")) for n in report.nodes) == 1 + 3 * 4
    assert len(ran) == len(set(ran))                         # each id ran once
    again = Executor(reg, env, make_cache()).run(prompt)
    assert sorted(again.nodes) == sorted(report.nodes)       # the same ids in every run


def test_custom_pack_blocked_node_status_in_report(loaded, env):
    reg, _ = loaded
    prompt = {"1": {"class_type": "MgAppendText", "inputs": {"text": "x"}},
              "2": {"class_type": "MgBlockIf", "inputs": {"text": ["1", 0], "block": True}},
              "3": {"class_type": "MgAppendText", "inputs": {"text": ["2", 0]}},
              "4": {"class_type": "MgShowText", "inputs": {"text": ["3", 0]}},
              "5": {"class_type": "MgShowText", "inputs": {"text": ["1", 0]}}}
    ex = Executor(reg, env, make_cache())
    report = ex.run(prompt)
    status = {n: v["status"] for n, v in report.to_json()["nodes"].items()}
    assert status == {"1": "executed", "2": "executed", "3": "blocked", "4": "blocked",
                      "5": "executed"}
    assert sorted(report.executed) == ["1", "2", "5"] and "4" not in report.ui
    again = ex.run(prompt)
    assert {n: v.status for n, v in again.nodes.items()} == dict.fromkeys(status, "cached")


def write_overflow_checkpoint(path):
    """A tiny SD1.5 checkpoint whose VAE decoder's first conv overflows f16 (|x| > 65504) but not
    f32 (the norm after it rescales), as tests/test_workflows.py does with its fixture."""
    write_sd15_checkpoint(path, "tiny")
    sd = load_file(str(path))
    key = "first_stage_model.decoder.conv_in.weight"
    sd[key] = sd[key] * 3e4
    save_file(sd, str(path))


def test_custom_pack_precision_expanded_sampler_bf16_and_nan_guard(tmp_path):
    models = tmp_path / "models"
    write_overflow_checkpoint(models / "checkpoints" / "tiny.safetensors")
    for d in ("in", "out", "temp"):
        (tmp_path / d).mkdir()
    env = Env(models=(models,), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    reg = fresh_registry()
    custom_nodes.load_packs([PACKS], reg, env)
    prompt = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 32, "height": 32,
                                                           "batch_size": 1}},
        "3": {"class_type": "MgSampleLoop", "inputs": {"model": ["4", 0], "positive": ["6", 0],
                                                       "negative": ["7", 0], "latent": ["5", 0],
                                                       "seed": 1, "steps": 2, "times": 2}},
        "8": {"class_type": "MgDecode", "inputs": {"vae": ["4", 2], "samples": ["3", 0]}},
        "9": {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}},
    }
    wf = load_workflow({"format": "mixgraph/1", "prompt": prompt, "precision": {
        "default": "f32", "regions": [{"name": "loop [bf16]", "nodes": ["3"], "precision": "bf16"},
                                      {"name": "decode", "nodes": ["8"], "precision": "f16"}]}},
        reg)
    events = []
    report = Executor(reg, env, make_cache()).run(wf, on_event=events.append)
    nodes = report.to_json()["nodes"]
    samplers = {n: v for n, v in nodes.items() if v["class_type"] == "KSampler"}
    assert sorted(samplers) == ["3.0.0.1", "3.0.0.2"]
    assert all(v["precision"] == "bf16" and v["status"] == "executed" for v in samplers.values())
    assert nodes["6"]["precision"] == "f32"                 # outside the region
    # the custom node decoding through the VAE in f16 overflowed and re-ran in f32
    assert nodes["8"]["nan_fallback"] is True and nodes["8"]["precision"] == "f16:f32"
    fallback = [e for e in events if type(e).__name__ == "NanFallback"]
    assert [e.node_id for e in fallback] == ["8"]
    assert torch.isfinite(report.values["8"][0]).all()
    assert json.dumps(nodes)                                # the report stays JSON
