"""`mixgraph demo` and `--version` on the command line."""

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
