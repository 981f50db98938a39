"""mixgraph: a node-graph workflow engine for Stable-Diffusion-family image generation.

The distribution installs one import name, `mixgraph`, whose subpackages live in the repository's
top-level folders: `mixgraph.graph` (graph/, the engine), `mixgraph.nodes` (nodes/, the node library
and the model runtime) and `mixgraph.ui` (ui/, every way a person uses mixgraph: CLI, server, editor,
demo, benchmarks, the Python API). The mapping is declared once, in pyproject.toml.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("mixgraph")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+unknown"

# From a source checkout (`PYTHONPATH=CHECKOUT python -m mixgraph`, or a second work tree beside an
# editable install), the subpackages are the checkout's own top-level folders: the same mapping as
# pyproject.toml's package-dir, so that checkout's code runs, not another install's.
from pathlib import Path as _Path

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "graph" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 - a package's __path__
