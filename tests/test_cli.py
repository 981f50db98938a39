"""The command line in-process, on the toy registry: exit codes, report shape, bench keys."""

import json

import pytest

from mixgraph.ui.bench.bench_engine import run_bench
from mixgraph.ui.cli import main
from tests import toy_nodes as toy
from tests.toy_nodes import call, link

REG = toy.registry()


def write(tmp_path, prompt, name="wf.json"):
    path = tmp_path / name
    path.write_text(json.dumps(prompt))
    return str(path)


def dirs(tmp_path):
    (tmp_path / "models").mkdir(exist_ok=True)   # a --models folder must exist
    return ["--models", str(tmp_path / "models"), "--input", str(tmp_path), "--output", str(tmp_path / "out")]


GOOD = {"1": call("Const", value=5), "2": call("Mul", a=link(1), factor=3),
        "3": call("SaveNumber", value=link(2), filename_prefix="x")}


def test_cli_run_success_prints_files_and_writes_report(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(["run", write(tmp_path, GOOD), *dirs(tmp_path), "--report", str(report), "--quiet"],
                registry=REG)
    assert code == 0
    out_file = tmp_path / "out" / "x_3.txt"
    assert out_file.read_text() == "15"
    assert capsys.readouterr().out.strip().splitlines() == [str(out_file)]
    data = json.loads(report.read_text())
    assert {"prompt_id", "seconds", "nodes", "outputs"} <= data.keys()
    assert data["outputs"] == {"3": [str(out_file)]}
    assert data["nodes"]["2"].keys() >= {"class_type", "status", "seconds", "precision", "nan_fallback"}
    assert data["nodes"]["2"]["class_type"] == "Mul" and data["nodes"]["2"]["status"] == "executed"
    assert data["nodes"]["2"]["nan_fallback"] is False


def test_cli_run_set_overrides_input(tmp_path):
    code = main(["run", write(tmp_path, GOOD), *dirs(tmp_path), "--set", "1.value=7", "--quiet"],
                registry=REG)
    assert code == 0 and (tmp_path / "out" / "x_3.txt").read_text() == "21"


def test_cli_run_node_failure_exits_1_with_report(tmp_path, capsys):
    wf = {"1": call("Const", value=1), "2": call("Fail", x=link(1), message="kaput"),
          "3": call("Show", value=link(2))}
    report = tmp_path / "r.json"
    code = main(["run", write(tmp_path, wf), *dirs(tmp_path), "--report", str(report), "--quiet"],
                registry=REG)
    assert code == 1
    err = capsys.readouterr().err
    assert "node 2 (Fail)" in err and "kaput" in err
    assert json.loads(report.read_text())["nodes"]["1"]["status"] == "executed"


@pytest.mark.parametrize("extra", [["--precision", "f64"], ["--set", "1value=3"], ["--set", "9.x=1"],
                                   ["--device", "cuda:7"]])
def test_cli_run_bad_arguments_exit_2(tmp_path, extra):
    toy.CALLS.clear()
    assert main(["run", write(tmp_path, GOOD), *dirs(tmp_path), "--quiet", *extra], registry=REG) == 2
    assert not toy.CALLS


def test_cli_run_invalid_workflow_exit_2(tmp_path, capsys):
    wf = {"1": call("Const", value="not a number"), "2": call("Show", value=link(1))}
    assert main(["run", write(tmp_path, wf), *dirs(tmp_path), "--quiet"], registry=REG) == 2
    assert main(["run", str(tmp_path / "missing.json"), "--quiet"], registry=REG) == 2


def test_cli_validate_lists_problems_and_json_body(tmp_path, capsys):
    wf = {"1": call("Mul", factor=500), "2": call("Show", value=link(1)), "3": call("Nope")}
    path = write(tmp_path, wf)
    assert main(["validate", path], registry=REG) == 2
    text = capsys.readouterr().err
    assert "1" in text and "a" in text
    assert main(["validate", path, "--json"], registry=REG) == 2
    body = json.loads(capsys.readouterr().out)
    assert set(body) >= {"error", "node_errors"} and body["error"]["type"]
    assert main(["validate", write(tmp_path, GOOD, "ok.json")], registry=REG) == 0


def test_cli_nodes_json_lists_the_registry(capsys):
    assert main(["nodes", "--json"], registry=REG) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"Const", "Mul", "SaveNumber"} <= info.keys()
    assert info["SaveNumber"]["output_node"] is True


def test_cli_interrupted_exit_130(tmp_path):
    # A node that raises KeyboardInterrupt stands in for Ctrl-C.
    wf = {"1": call("Const", value=1), "2": call("CtrlC", x=link(1)), "3": call("Show", value=link(2))}
    assert main(["run", write(tmp_path, wf), *dirs(tmp_path), "--quiet"], registry=REG) == 130


def test_cli_version(capsys):
    import mixgraph
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mixgraph {mixgraph.__version__}"


def test_bench_engine_json_keys(capsys):
    result = run_bench(nodes=40, big=500, repeat=1)
    assert {"cold_us_per_node", "cached_us_per_node", "shapes", "chain_big"} <= result.keys()
    assert set(result["shapes"]) == {"chain", "fanout"} and result["chain_big"]["ok"] is True
    assert main(["bench", "engine", "--json", "--nodes", "30", "--big", "0", "--repeat", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cold_us_per_node"] > 0 and data["cached_us_per_node"] > 0


def test_bench_engine_scaling_sizes():
    result = run_bench(nodes=20, big=0, repeat=1, sizes=[10, 41])
    assert set(result["scaling"]) == {"10", "41"} and "chain_big" not in result
    fan = result["scaling"]["41"]["fanout"]
    assert fan["nodes"] == 41 and fan["cached_us_per_node"] > 0


def test_cli_run_precision_order_region_then_cli_then_file(tmp_path):
    prompt = {"1": call("ToyModelLoader", scale=1.0), "2": call("Const", value=3),
              "3": call("NanIfHalf", model=link(1), x=link(2)), "4": call("ShowImage", image=link(3)),
              "5": call("NanIfHalf", model=link(1), x=link(2)), "6": call("ShowImage", image=link(5))}
    env = {"format": "mixgraph/1", "prompt": prompt,
           "precision": {"default": "bf16", "regions": [{"name": "r", "nodes": ["3"], "precision": "f16:f32"}]}}
    report = tmp_path / "r.json"
    path = write(tmp_path, env)
    assert main(["run", path, *dirs(tmp_path), "--precision", "f32", "--report", str(report),
                 "--quiet"], registry=REG) == 0
    nodes = json.loads(report.read_text())["nodes"]
    assert nodes["3"]["precision"] == "f16:f32" and nodes["5"]["precision"] == "f32"
    assert main(["run", path, *dirs(tmp_path), "--report", str(report), "--quiet"], registry=REG) == 0
    nodes = json.loads(report.read_text())["nodes"]
    assert nodes["5"]["precision"] == "bf16:f32" and nodes["5"]["nan_fallback"] is True
    assert main(["run", path, *dirs(tmp_path), "--precision", "MODEL=f32", "--report", str(report),
                 "--quiet"], registry=REG) == 0
    assert json.loads(report.read_text())["nodes"]["5"]["precision"] == "f32"


@pytest.mark.parametrize("mode", [["--cache-none"], ["--cache-lru", "2"], ["--cache-ram"],
                                  ["--cache-ram", "0.5"]])
def test_cli_run_cache_modes(tmp_path, mode):
    assert main(["run", write(tmp_path, GOOD), *dirs(tmp_path), "--quiet", *mode], registry=REG) == 0
    assert (tmp_path / "out" / "x_3.txt").read_text() == "15"


@pytest.mark.parametrize("mode", [["--cache-lru", "-1"], ["--cache-none", "--cache-lru", "3"]])
def test_cli_run_bad_cache_flags_exit_2(tmp_path, mode):
    toy.CALLS.clear()
    assert main(["run", write(tmp_path, GOOD), *dirs(tmp_path), "--quiet", *mode], registry=REG) == 2
    assert not toy.CALLS
