"""What a new user hits first (issue 26): errors that say where mixgraph looked and what to do,
start-up refusals on the terminal, and validation before the memory estimate. The real node
library on the embedded model; no fixture models."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mixgraph.ui.cli import main
from mixgraph.ui.demo import demo_workflow

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, prompt: dict, name: str = "wf.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(prompt))
    return str(path)


def _missing_checkpoint(tmp_path: Path) -> str:
    wf = demo_workflow()
    wf["4"]["inputs"]["ckpt_name"] = "sd15.safetensors"
    return _write(tmp_path, wf)


def test_new_user_missing_model_names_the_folders_searched_and_how_to_add_one(tmp_path, capsys):
    models, comfy = tmp_path / "models", tmp_path / "ComfyUI"
    (models / "checkpoints").mkdir(parents=True)
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    (tmp_path / "extra_model_paths.yaml").write_text(
        f"comfyui:\n  base_path: {comfy}\n  checkpoints: models/checkpoints\n")
    path = _missing_checkpoint(tmp_path)
    assert main(["validate", path, "--models", str(models)]) == 2
    text = " ".join(capsys.readouterr().err.split())
    for expected in (f"{models.resolve() / 'checkpoints'},", f"{models.resolve() / 'Stable-diffusion'} (no such folder)",
                     str(comfy.resolve() / "models" / "checkpoints"), "embedded models",
                     "--models DIR", "MIXGRAPH_MODELS", "extra_model_paths.yaml", "[value_not_in_list]"):
        assert expected in text, (expected, text)

    # ComfyUI's error body keeps its type, message and the start of its details
    assert main(["validate", path, "--models", str(models), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["node_errors"]["4"]["errors"][0]
    assert error["type"] == "value_not_in_list" and error["message"] == "Value not in list"
    assert error["details"].startswith("ckpt_name: 'sd15.safetensors' not in ['mixgraph-shapes.safetensors']; looked in ")
    assert error["extra_info"]["input_name"] == "ckpt_name"
    assert error["extra_info"]["received_value"] == "sd15.safetensors"


def test_new_user_default_graph_without_its_models_says_which_files_to_put_where(tmp_path, capsys):
    """The editor's built-in default graph (Z-Image Turbo, tests/fixtures/comfy_templates) in an
    empty models folder: one error per missing file, each naming the file and the folder it goes
    in (diffusion_models/, text_encoders/, vae/)."""
    facts = ROOT / "tests" / "fixtures" / "comfy_templates" / "facts_frontend_1.58.1_default_graph.json"
    graph = json.loads(facts.read_text())["frontend_default_z_image_turbo"]
    models = tmp_path / "models"
    models.mkdir()
    path = _write(tmp_path, graph)
    assert main(["validate", path, "--models", str(models)]) == 2
    text = " ".join(capsys.readouterr().err.split())
    for node, folder, name in (("66 (UNETLoader)", "diffusion_models", "z_image_turbo_bf16.safetensors"),
                               ("62 (CLIPLoader)", "text_encoders", "qwen_3_4b.safetensors"),
                               ("63 (VAELoader)", "vae", "ae.safetensors")):
        assert f"node {node}" in text, (node, text)
        assert f"put {name} in {models.resolve() / folder}{os.sep}" in text, (name, text)


def test_new_user_missing_input_image_says_it_is_missing_and_where(tmp_path, capsys):
    (tmp_path / "input").mkdir()
    wf = {"1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
          "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}
    assert main(["validate", _write(tmp_path, wf), "--input", str(tmp_path / "input")]) == 2
    text = " ".join(capsys.readouterr().err.split())
    assert "Invalid image file: photo.png is missing" in text, text
    assert str(tmp_path.resolve() / "input" / "photo.png") in text
    assert "--input DIR" in text and "upload it" in text


@pytest.mark.parametrize("command", ["run", "validate", "estimate", "nodes", "demo", "serve"])
def test_new_user_a_models_folder_that_does_not_exist_is_refused(command, tmp_path, capsys):
    missing = tmp_path / "no-such-models"
    args = [command, *([_write(tmp_path, demo_workflow())] if command in ("run", "validate", "estimate") else []),
            "--models", str(missing)]
    if command in ("run", "demo"):
        args += ["--output", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--models {missing}: no such folder" in err, err
    assert not (tmp_path / "out").exists()


def test_new_user_mixgraph_models_env_that_does_not_exist_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIXGRAPH_MODELS", str(tmp_path / "gone"))
    assert main(["validate", _write(tmp_path, demo_workflow())]) == 2
    assert f"MIXGRAPH_MODELS={tmp_path / 'gone'}: no such folder" in capsys.readouterr().err
    (tmp_path / "gone").mkdir()                    # an existing folder is fine (and empty)
    assert main(["validate", _write(tmp_path, demo_workflow())]) == 0


def test_new_user_run_validates_before_it_estimates_memory(tmp_path, capsys):
    """`--set 5.width=1000000` is out of range: said at once, not "not enough memory" after the
    estimate traced a million-pixel-wide picture."""
    path = _write(tmp_path, demo_workflow())
    code = main(["run", path, "--set", "5.width=1000000", "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "bigger than max of 16384" in err, err
    assert "not enough memory" not in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_new_user_server_validates_before_it_estimates_memory(tmp_path):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from mixgraph.graph.env import Env
    from mixgraph.ui.server.server import create_app

    env = Env.from_args(models=str(tmp_path / "models"), input=str(tmp_path / "in"),
                        output=str(tmp_path / "out"), temp=str(tmp_path / "temp"))
    prompt = demo_workflow()
    prompt["5"]["inputs"]["width"] = 1000000

    async def post():
        app = create_app(env, user_dir=tmp_path / "user")
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/prompt", json={"prompt": prompt})
            return r.status, await r.json()
    status, body = asyncio.run(post())
    assert status == 400
    assert body["error"]["type"] == "prompt_outputs_failed_validation", body
    assert body["node_errors"]["5"]["errors"][0]["type"] == "value_bigger_than_max"


def test_new_user_serve_host_and_port_have_help(capsys):
    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--host ADDR address(es) to listen on" in text
    assert "--port N TCP port to listen on (default 8188" in text


def test_new_user_serve_refuses_a_port_out_of_range(capsys):
    assert main(["serve", "--port", "99999"]) == 2
    assert "expected a TCP port from 1 to 65535" in capsys.readouterr().err


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m mixgraph serve FLAGS` as a user starts it; it must exit on its own (a refusal)."""
    (tmp_path / "models").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mixgraph", "serve", "--models", str(tmp_path / "models"),
                           *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_new_user_serve_missing_user_directory_is_said_on_the_terminal(tmp_path):
    done = _serve(tmp_path, "--user-directory", str(tmp_path / "missing"), "--port", "1")
    assert done.returncode == 2
    assert f"--user-directory {tmp_path / 'missing'}: no such folder" in done.stderr
    assert "Traceback" not in done.stderr


def test_new_user_serve_port_in_use_is_said_on_the_terminal(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"error: cannot listen on 127.0.0.1 port {port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_resolution_selector_matches_comfyui_rounding():
    """ComfyUI's ResolutionSelector (comfy_extras/nodes_resolution.py): width/height from an
    aspect ratio and megapixels, multiples of 8 (values worked out by hand from its formula)."""
    from mixgraph.ui import api
    cases = {("1:1 (Square)", 1.0): (1024, 1024), ("16:9 (Widescreen)", 1.0): (1368, 768),
             ("2:3 (Portrait Photo)", 0.5): (592, 888), ("21:9 (Ultrawide)", 2.0): (2216, 952)}
    for (ratio, mp), expected in cases.items():
        g = api.Graph()
        sel = g.add("ResolutionSelector", node_id="1", aspect_ratio=ratio, megapixels=mp)
        g.add("PreviewAny", node_id="2", source=sel[0])
        g.add("PreviewAny", node_id="3", source=sel[1])
        res = api.run(g)
        assert tuple(res.outputs["1"]) == expected, (ratio, mp)


def test_number_convert_matches_comfyui():
    """ComfyUI's ComfyNumberConvert: INT / FLOAT / STRING / BOOLEAN -> (FLOAT, INT), bad strings refused."""
    import pytest
    from mixgraph.nodes.helpers.expression import number_convert
    from mixgraph.ui import api

    assert number_convert(True) == (1.0, 1) and number_convert(7) == (7.0, 7)
    assert number_convert(-2.7) == (-2.7, -2) and number_convert(" 3 ") == (3.0, 3)
    assert number_convert("2.5e1") == (25.0, 25) and number_convert("-0.5") == (-0.5, 0)
    for bad in ("", "abc", "inf", float("nan")):
        with pytest.raises(ValueError):
            number_convert(bad)
    g = api.Graph()
    prim = g.add("PrimitiveString", node_id="1", value="41.9")
    conv = g.add("ComfyNumberConvert", node_id="2", value=prim[0])
    g.add("PreviewAny", node_id="3", source=conv[1])
    res = api.run(g)
    assert tuple(res.outputs["2"]) == (41.9, 41)
