"""Bad input: a clear error, never a 500, a traceback or a stall. The CLI runs
in-process through `main([...])`, the server on the loopback test server as in test_server.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph import safe_json
from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env, OutputFolderError, folder_problem, writable_folder
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Combo, Float, Int, Socket, node
from mixgraph.graph.registry import Registry
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import Link, NodeCall
from mixgraph.nodes.declare.image.image_nodes import SaveImage
from mixgraph.ui.cli import main
from mixgraph.ui.server.server import create_app
from tests import toy_nodes as toy
from tests.test_server import env, png_bytes, raw_upload, upload_form  # noqa: F401 (fixture)
from tests.toy_nodes import call, link

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"
DEEP = "[" * 100_000
LONG_INT = '{"1": {"class_type": "Const", "inputs": {"value": ' + "9" * 5000 + "}}}"


@node(outputs=["IMAGE"], register=False)
def Gray(level=Float(0.5, min=0.0, max=1.0), size=Int(4, min=1, max=64)):
    return torch.full((1, size, size, 3), level)


def _fixed_only(env, mode=None, **_):
    return [] if mode != "b" else ["mode b is not implemented yet"]


@node(outputs=["INT"], validate=_fixed_only, register=False)
def Modes(mode=Combo(["a", "b"])):
    return 1


REG = toy.registry()
for _spec in (Gray.spec, Modes.spec, SaveImage.spec):
    REG.add(_spec)


def write(tmp_path: Path, text: str | bytes, name: str = "wf.json") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def sd15(tmp_path):
    """txt2img_sd15.json and a models folder where its checkpoint exists (validation only looks
    for the file)."""
    (tmp_path / "models" / "checkpoints").mkdir(parents=True)
    (tmp_path / "models" / "checkpoints" / "sd15.safetensors").write_bytes(b"")
    return json.loads((WORKFLOWS / "txt2img_sd15.json").read_text()), ["--models", str(tmp_path / "models")]


# --- JSON: one safe parser ------------------------------------------------------------------------

def test_safe_json_depth_ignores_brackets_in_strings():
    assert safe_json.nesting_depth('{"a": "[[[[\\"[[[", "b": [[1]]}') == 3
    assert safe_json.nesting_depth('["\\\\", [[{}]]]') == 4
    assert safe_json.loads('{"t": "' + "[" * 1000 + '"}', "x") == {"t": "[" * 1000}
    assert safe_json.loads("[" * 256 + "]" * 256, "x") is not None


@pytest.mark.parametrize("text, reason, words", [
    (DEEP, "depth", "nested 100000 levels deep"),
    (LONG_INT, "number", "too long (more than 4300 digits)"),
    (b"\xff{}", "encoding", "not UTF-8 text (byte 0xff at offset 0)"),
    ("{1: 2}", "syntax", "not valid JSON: Expecting property name"),
])
def test_safe_json_errors_name_the_source_and_reason(text, reason, words):
    with pytest.raises(safe_json.JsonError) as e:
        safe_json.loads(text, "wf.json")
    assert e.value.reason == reason and str(e.value).startswith("wf.json: ") and words in str(e.value)


@pytest.mark.parametrize("text, words", [
    (DEEP, "JSON nested 100000 levels deep; at most 256 are allowed"),
    (LONG_INT, "a number in the JSON is too long (more than 4300 digits)"),
    (b"\xfe\xff{}", "not UTF-8 text (byte 0xfe at offset 0)"),
    ("[1, 2]", "a workflow is a JSON object, got list"),
    ('"just a string"', "a workflow is a JSON object, got str"),
])
def test_cli_validate_and_run_bad_json_exit_2_with_one_line(tmp_path, capsys, text, words):
    path = write(tmp_path, text)
    for command in ("validate", "run"):
        assert main([command, path, "--output", str(tmp_path / "out")] if command == "run"
                    else [command, path], registry=REG) == 2
        assert one_error_line(capsys) == f"error: {path}: {words}"


def test_cli_set_value_too_deep_or_too_long_exits_2(tmp_path, capsys):
    path = write(tmp_path, json.dumps({"1": call("Const", value=1), "2": call("Show", value=link(1))}))
    assert main(["run", path, "--set", "1.value=" + DEEP, "--quiet"], registry=REG) == 2
    assert "--set 1.value: JSON nested 100000 levels deep" in one_error_line(capsys)
    assert main(["run", path, "--set", "1.value=" + "9" * 5000, "--quiet"], registry=REG) == 2
    assert "--set 1.value: a number in the JSON is too long" in one_error_line(capsys)


def test_cli_bench_precision_invalid_workflow_exits_2_like_validate(tmp_path, capsys, sd15):
    wf, models = sd15
    wf["3"]["inputs"]["sampler_name"] = "no_such_sampler"
    path = write(tmp_path, json.dumps(wf))
    assert main(["bench", "precision", path, *models, "--precisions", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(f"invalid workflow {path}:\n")
    assert "node 3 (KSampler) input 'sampler_name'" in err and "[value_not_in_list]" in err
    assert main(["bench", "precision", write(tmp_path, DEEP, "deep.json")]) == 2
    assert "nested 100000 levels deep" in one_error_line(capsys)


# --- validation: option lists, finite floats --------------------------------------------------------

def test_cli_validate_unknown_sampler_name_is_value_not_in_list(tmp_path, capsys, sd15):
    wf, models = sd15
    wf["3"]["inputs"]["sampler_name"] = "no_such_sampler"
    path = write(tmp_path, json.dumps(wf))
    assert main(["validate", path, *models]) == 2
    assert capsys.readouterr().err.startswith(
        "node 3 (KSampler) input 'sampler_name': Value not in list: sampler_name: "
        "'no_such_sampler' not in (list of length")
    assert main(["validate", path, *models, "--json"]) == 2
    (err,) = json.loads(capsys.readouterr().out)["node_errors"]["3"]["errors"]
    assert err["type"] == "value_not_in_list" and err["extra_info"]["input_name"] == "sampler_name"
    assert err["extra_info"]["received_value"] == "no_such_sampler"


def test_validate_validator_narrows_a_fixed_option_list_but_never_widens_it():
    def check(mode):
        v = validate({"1": NodeCall("Modes", {"mode": mode}),
                      "2": NodeCall("Show", {"value": Link("1", 0)})}, REG)
        return [e["type"] for e in v.node_errors.get("1", {}).get("errors", [])]
    assert check("a") == []
    assert check("b") == ["custom_validation_failed"]         # narrowed by the validator
    assert check("zzz") == ["value_not_in_list"]               # the list still applies


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_cli_run_set_non_finite_float_exits_2(tmp_path, capsys, sd15, value):
    wf, models = sd15
    path = write(tmp_path, json.dumps(wf))
    code = main(["run", path, *models, "--output", str(tmp_path / "out"), "--set", f"3.cfg={value}",
                 "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    shown = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[value]
    assert f"node 3 (KSampler) input 'cfg': Value {shown} is not a finite number [invalid_input_type]" in err
    assert not (tmp_path / "out").exists()


def test_cli_validate_nan_literal_in_api_file(tmp_path, capsys, sd15):
    wf, models = sd15
    text = json.dumps(wf).replace('"cfg": 7.0', '"cfg": NaN')
    assert "NaN" in text
    assert main(["validate", write(tmp_path, text), *models, "--json"]) == 2
    out = capsys.readouterr().out
    assert "NaN" not in out                       # the error body is strict JSON
    (err,) = json.loads(out)["node_errors"]["3"]["errors"]
    assert err["message"] == "Value nan is not a finite number"
    assert err["extra_info"]["input_name"] == "cfg" and err["extra_info"]["received_value"] == "nan"


# --- output folder ------------------------------------------------------------------------------

def test_cli_run_output_folder_that_is_a_file_exits_2(tmp_path, capsys):
    path = write(tmp_path, json.dumps({"1": call("Const", value=1), "2": call("SaveNumber", value=link(1))}))
    runs = toy.CALLS["Const"]
    blocker = tmp_path / "out"
    blocker.write_text("not a folder")
    for output in (blocker, blocker / "sub"):
        assert main(["run", path, "--output", str(output), "--quiet"], registry=REG) == 2
        assert one_error_line(capsys) == (f"error: the output folder {output} cannot be used: "
                                          f"{blocker} is a file, not a folder")
    assert main(["run", path, "--output", str(tmp_path / "o"), "--report", str(blocker / "r.json"),
                 "--quiet"], registry=REG) == 2
    assert f"{blocker} is a file, not a folder" in one_error_line(capsys)
    assert toy.CALLS["Const"] == runs and blocker.read_text() == "not a folder"   # nothing ran


def test_writable_folder_names_the_blocking_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputFolderError, match=r"the output folder .*f/a/b cannot be used: .*f is a file"):
        writable_folder(tmp_path / "f" / "a" / "b")
    assert writable_folder(tmp_path / "new" / "dir").is_dir()
    assert folder_problem(tmp_path / "missing" / "x") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_writable_folder_without_permission(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert "not writable" in folder_problem(ro)
    with pytest.raises(OutputFolderError, match="cannot be created"):
        writable_folder(ro / "sub")


@contextlib.asynccontextmanager
async def client(env):
    app = create_app(env, registry=REG, executor=Executor(REG, env, OutputCache(2**24)),
                     user_dir=env.output.parent / "user")
    async with TestServer(app) as server, TestClient(server) as c:
        yield c


def run(coro_fn, env):
    async def go():
        async with client(env) as c:
            await coro_fn(c)
    asyncio.run(go())


async def finished(c, prompt_id, timeout=20.0):
    for _ in range(int(timeout / 0.02)):
        body = await (await c.get(f"/history/{prompt_id}")).json()
        if body:
            return body[prompt_id]
        await asyncio.sleep(0.02)
    raise AssertionError(f"prompt {prompt_id} did not finish")


def test_server_output_folder_replaced_by_a_file_is_an_execution_error(env):
    save = {"1": call("Gray", level=0.25, size=4), "2": call("SaveImage", images=link(1), filename_prefix="g")}

    async def body(c):
        ok = await (await c.post("/prompt", json={"prompt": save})).json()
        assert (await finished(c, ok["prompt_id"]))["status"]["status_str"] == "success"
        shutil.rmtree(env.output)
        env.output.write_text("a file where the output folder was")
        r = await (await c.post("/prompt", json={"prompt": {**save, "1": call("Gray", level=0.5, size=4)}})).json()
        entry = await finished(c, r["prompt_id"])
        err = dict(entry["status"]["messages"])["execution_error"]
        assert err["node_id"] == "2" and err["node_type"] == "SaveImage"
        assert err["exception_message"] == (f"the output folder {env.output} cannot be used: "
                                            f"{env.output} is a file, not a folder")
        env.output.unlink()                        # the queue kept running: the next one works
        r = await (await c.post("/prompt", json={"prompt": {**save, "1": call("Gray", level=0.75, size=4)}})).json()
        assert (await finished(c, r["prompt_id"]))["status"]["status_str"] == "success"
        assert [p.name for p in env.output.iterdir()] == ["g_00001_.png"]
    run(body, env)


# --- server: request bodies and uploads --------------------------------------------------------------

def test_server_bad_json_bodies_are_400_never_500(env):
    async def body(c):
        for data, words in ((DEEP, "JSON nested 100000 levels deep"),
                            (LONG_INT.replace('{"1"', '{"prompt": {"1"') + "}", "too long")):
            r = await c.post("/prompt", data=data)
            assert r.status == 400
            err = (await r.json())["error"]
            assert err["type"] == "invalid_prompt" and words in err["message"]
            assert err["message"].startswith("Invalid prompt: the request body: ")
        for route in ("/queue", "/history", "/interrupt", "/free", "/api/queue", "/settings"):
            r = await c.post(route, data=DEEP)
            assert r.status == 400 and "nested 100000 levels deep" in await r.text(), route
        r = await c.post("/prompt", json={"prompt": {"1": call("Const", value=1)}, "number": "nan"})
        assert r.status == 400 and "finite" in (await r.json())["error"]["message"]
    run(body, env)


def test_server_non_finite_float_literal_is_400(env):
    async def body(c):
        for literal in ("NaN", "Infinity", "-Infinity"):
            text = json.dumps({"prompt": {"1": call("Gray", level=0.5, size=4), "2": call("ShowImage", image=link(1))}})
            r = await c.post("/prompt", data=text.replace('"level": 0.5', f'"level": {literal}'))
            assert r.status == 400
            raw = await r.text()
            assert "NaN" not in raw and "Infinity" not in raw      # strict JSON for browsers
            (err,) = json.loads(raw)["node_errors"]["1"]["errors"]
            assert err["type"] == "invalid_input_type" and err["extra_info"]["input_name"] == "level"
            assert "is not a finite number" in err["message"]
            text = json.dumps({"prompt": {"2": call("ShowImage", image=0.5)}})
            r = await c.post("/prompt", data=text.replace("0.5", literal))   # a literal for a link
            assert r.status == 400 and "NaN" not in await r.text() and "Infinity" not in await r.text()
    run(body, env)


def test_server_upload_odd_file_names_are_400(env):
    async def body(c):
        for name, words in (("a\x00b.png", "control characters such as NUL"),
                            ("a.png\x00", "control characters such as NUL"),
                            ("...", "has no name part"), (".", "has no name part"),
                            ("  ", "has no name part"), ("x" * 300 + ".png", "at most 255")):
            for route in ("/upload/image", "/upload/mask"):
                data, headers = raw_upload(png_bytes(), name)
                r = await c.post(route, data=data, headers=headers)
                assert r.status == 400 and words in await r.text(), (route, name)
        for fields, words in (({"subfolder": "a\x00b"}, "contains a NUL character"),
                              ({"subfolder": "s" * 300}, "at most 255"),
                              ({"subfolder": "/".join(["d" * 200] * 8)}, "longer than 1024")):
            r = await c.post("/upload/image", data=upload_form(png_bytes(), **fields))
            assert r.status == 400 and words in await r.text(), fields
        (env.input / "taken").write_text("a file, not a folder")
        r = await c.post("/upload/image", data=upload_form(png_bytes(), subfolder="taken"))
        assert r.status == 400 and "cannot store the upload in 'input/taken'" in await r.text()
        r = await c.post("/upload/mask", data=upload_form(png_bytes(), original_ref=DEEP[:60000]))
        assert r.status == 400 and "original_ref" in await r.text()
        r = await c.get("/view", params={"filename": "v" * 300})
        assert r.status == 400
        assert sorted(p.name for p in env.input.iterdir()) == ["taken"]
    run(body, env)
