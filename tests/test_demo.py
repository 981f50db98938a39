"""`mixgraph demo` and `--version` on the command line."""

import os
import subprocess
import sys
from pathlib import Path

from mixgraph import __version__
from mixgraph.ui.cli import main


def test_demo_help_says_what_the_model_knows(capsys):
    assert main(["demo", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for word in ("circle", "square", "triangle", "purple", "at the bottom right", "on a COLOR background",
                 "a blue circle on a yellow background"):
        assert word in out, word


def test_demo_refuses_an_unusable_device(tmp_path, capsys):
    assert main(["demo", "--device", "nonsense", "--output", str(tmp_path)]) == 2
    assert "--device 'nonsense'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mixgraph {__version__}"


def test_demo_twice_in_one_process_writes_into_each_output_folder(tmp_path):
    """An output node's cache key includes the run's output folder: the same prompt run again
    for another folder writes its file there (not the first run's path from the cache)."""
    from mixgraph.ui import api
    from mixgraph.ui.demo import demo_workflow

    ex = api.default_executor()
    wf = demo_workflow("a red square on a green background", seed=3)
    first = api.run(wf, executor=ex, models=tmp_path / "m", output=tmp_path / "a")
    second = api.run(wf, executor=ex, models=tmp_path / "m", output=tmp_path / "b")
    again = api.run(wf, executor=ex, models=tmp_path / "m", output=tmp_path / "b")
    assert [p.parent for p in map(Path, first.files)] == [tmp_path / "a"]
    assert [p.parent for p in map(Path, second.files)] == [tmp_path / "b"]
    assert again.report.to_json()["nodes"]["9"]["status"] == "cached"


def test_demo_says_once_on_the_terminal_which_words_the_model_does_not_know(tmp_path):
    """As a user runs it: the warning shows once (not again through Python's last-resort log
    handler), and the picture is still written (exit 0)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "mixgraph", "demo", "--prompt",
                           "a photo of a cat sitting on a sofa", "--output", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("does not know the word(s) 'photo', 'of', 'cat', 'sitting', 'sofa'") == 1, done.stderr
    assert "warning: the embedded model (mixgraph-shapes) does not know" in done.stderr
    assert Path(done.stdout.strip().splitlines()[-1]).is_file()
