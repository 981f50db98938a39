"""The distribution installs one import name, `mixgraph` (DESIGN §1): the wheel, installed into a
fresh virtual environment, imports as mixgraph.graph/.nodes/.ui, carries every module and data
file of the three folders, installs no top-level graph/nodes/ui, and its console script runs."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"graph": "mixgraph/graph", "nodes": "mixgraph/nodes", "ui": "mixgraph/ui",
           "mixgraph": "mixgraph"}


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: a checkout on the path (its build leaves mixgraph.egg-info there) would make
    pip think mixgraph is installed already, and the venv must see only its own install."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools>=68 (the test extra)")
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300,
        cwd=tmp_path_factory.mktemp("cwd"), env=_clean_env())
    assert build.returncode == 0, build.stderr[-3000:]
    (whl,) = out.glob("mixgraph-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with only the wheel installed; the test venv's site-packages is appended to its
    path (a .pth line) for torch and the other dependencies, whose own .pth files (this checkout's
    editable install among them) are not processed there."""
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300, capture_output=True,
                   env=_clean_env())
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip()
    deps = [sysconfig.get_path("purelib"), *site.getsitepackages()]
    Path(purelib, "zz_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    return env_dir


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd, env=_clean_env())


def test_packaging_wheel_holds_only_mixgraph(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"mixgraph", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).as_posix()
            assert f"{package}/{rel}" in names, f"{folder}/{rel} is missing from the wheel"
    assert "mixgraph/nodes/encoders/data/bpe_simple_vocab_16e6.txt.gz" in names
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "NOTICE.md"):  # Z-Image's Qwen3
        assert f"mixgraph/nodes/encoders/data/qwen2.5/{name}" in names
    assert "mixgraph/nodes/encoders/data/t5_v1_1/tokenizer.json" in names  # the T5 tokenizer
    assert "mixgraph/nodes/encoders/data/t5_v1_1/NOTICE.md" in names
    assert "mixgraph/nodes/families/sd/data/lotus_null_prompt.safetensors" in names  # LotusConditioning
    assert "mixgraph/ui/server/web/mixgraph.js" in names
    assert "mixgraph/ui/comfy/comfy_host/comfy_api/latest/_io.py" in names   # package data, not a package


def test_packaging_fresh_venv_import_names(venv, tmp_path):
    py = str(venv / "bin" / "python")
    probe = ("import json, importlib.util, mixgraph, mixgraph.graph.executor, mixgraph.nodes.library, "
             "mixgraph.ui.server.server\n"
             "print(json.dumps({'files': [m.__file__ for m in (mixgraph, mixgraph.graph.executor, "
             "mixgraph.nodes.library, mixgraph.ui.server.server)], 'version': mixgraph.__version__, "
             "'top': {n: importlib.util.find_spec(n) is not None for n in ('graph', 'nodes', 'ui')},\n"
             "'host': [n for n in ('folder_paths', 'comfy', 'comfy_api', 'server', 'node_helpers') "
             "if importlib.util.find_spec(n) is not None]}))")
    r = _run(py, "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert all(f.startswith(str(venv)) for f in got["files"]), got["files"]
    assert got["top"] == {"graph": False, "nodes": False, "ui": False}
    assert got["host"] == []      # ComfyUI host modules are never installed top-level
    assert got["version"] != "0.0.0+unknown"


def test_packaging_console_script_and_module_entry(venv, tmp_path):
    r = _run(str(venv / "bin" / "mixgraph"), "--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("mixgraph "), r.stderr[-2000:]
    r = _run(str(venv / "bin" / "python"), "-m", "mixgraph", "nodes", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout)
    assert {"KSampler", "CheckpointLoaderSimple", "SaveImage"} <= info.keys()


def test_packaging_checkout_imports_its_own_folders():
    import mixgraph.graph
    import mixgraph.nodes
    import mixgraph.ui
    for module, folder in ((mixgraph.graph, "graph"), (mixgraph.nodes, "nodes"), (mixgraph.ui, "ui")):
        assert Path(module.__file__).resolve() == ROOT / folder / "__init__.py"
