"""What ComfyUI custom node packs see of the running mixgraph: the shared state behind the host
modules of `ui/comfy/comfy_host` (`folder_paths`, `comfy.*`, `server`, `nodes`, ...) and the adapter
(`ui.comfy.comfy_adapter`) that runs pack nodes.

* `host_path()`: puts `ui/comfy/comfy_host` at the front of `sys.path` while packs load and while their
  nodes and routes run (reference-counted, so nested and concurrent uses are fine). The host
  modules are never installed as top-level packages; once a pack has imported one it stays in
  `sys.modules`, as any import does.
* `running()`: the pack node the current thread is executing (its run `Context`, pack and class),
  so `comfy.utils.ProgressBar`, `comfy.model_management` and `PromptServer.instance.client_id`
  reach the engine's progress events, interrupt flag and the prompt's client.
* `STATE`: the environment (model folders, input/output/temp), the registry, and the sink that
  `PromptServer.send_sync` writes to (the server's WebSocket hub; none under `mixgraph run`).
* `MissingHostAPI`: the one error for a ComfyUI internal that mixgraph does not provide, naming
  the pack, the node and what was missing; `explain()` turns the raw Python error into it.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from mixgraph.graph.context import Context, Interrupted
from mixgraph.graph.env import Env

__all__ = ["HOST_DIR", "HOST_NAMES", "STATE", "host_path", "running", "running_node", "Running",
           "MissingHostAPI", "explain", "current_env", "Interrupted"]

HOST_DIR = Path(__file__).with_name("comfy_host")
#: Top-level import names the host folder provides (ComfyUI's own module names).
HOST_NAMES = ("folder_paths", "nodes", "server", "node_helpers", "latent_preview", "comfy",
              "comfy_execution", "comfy_api", "comfy_extras")

_path_lock = threading.Lock()
_path_users = 0


@contextlib.contextmanager
def host_path() -> Iterator[None]:
    """`ui/comfy/comfy_host` first on `sys.path` for the duration (what ComfyUI's root folder is to a
    pack: `import folder_paths`, `import comfy.utils`, `from server import PromptServer`)."""
    global _path_users
    entry = str(HOST_DIR)
    with _path_lock:
        _path_users += 1
        if _path_users == 1:
            sys.path.insert(0, entry)
    try:
        yield
    finally:
        with _path_lock:
            _path_users -= 1
            if _path_users == 0:
                with contextlib.suppress(ValueError):
                    sys.path.remove(entry)


@dataclass
class Running:
    """The pack node a thread is executing."""

    ctx: Context
    pack: str
    class_type: str

    @property
    def node_id(self) -> str:
        return self.ctx.node_id

    @property
    def prompt_id(self) -> str | None:
        return getattr(getattr(self.ctx, "_run", None), "prompt_id", None)


# The running pack node: a context variable, so each thread and each asyncio task (an async
# pack node awaited on the engine's loop while others run) sees its own.
_running: contextvars.ContextVar[tuple[Running, ...]] = contextvars.ContextVar(
    "mixgraph_comfy_running", default=())


def running() -> Running | None:
    stack = _running.get()
    return stack[-1] if stack else None


@contextlib.contextmanager
def running_node(info: Running) -> Iterator[Running]:
    token = _running.set(_running.get() + (info,))
    try:
        yield info
    finally:
        _running.reset(token)


@dataclass
class _State:
    env: Env = field(default_factory=Env)
    registry: Any = None
    # send_sync's destination: fn(event, data, client_id); the server's hub.send when serving
    sink: Callable[[Any, Any, str | None], None] | None = None
    base_directory: Path = field(default_factory=Path)        # `--base-directory` (cwd)
    user_directory: Path = field(default_factory=lambda: Path("user"))
    custom_node_dirs: tuple[Path, ...] = ()


STATE = _State()


def current_env() -> Env:
    """The running node's environment, else the configured one."""
    now = running()
    return now.ctx.env if now is not None else STATE.env


class MissingHostAPI(RuntimeError):
    """A custom node reached a ComfyUI internal that mixgraph does not provide."""

    def __init__(self, what: str, pack: str | None = None, node: str | None = None,
                 cause: str | None = None):
        self.what, self.pack, self.node = what, pack, node
        where = []
        if pack:
            where.append(f"custom node pack {pack!r}")
        if node:
            where.append(f"node {node}")
        text = f"{', '.join(where)}: " if where else ""
        text += f"needs ComfyUI internal {what}, not provided by mixgraph"
        if cause:
            text += f" ({cause})"
        super().__init__(text)


def missing(what: str) -> MissingHostAPI:
    """The error a host module raises for something it does not provide, naming the pack and
    node that is running (if any)."""
    now = running()
    return MissingHostAPI(what, now.pack if now else None, now.class_type if now else None)


def explain(exc: BaseException, pack: str, node: str | None) -> BaseException | None:
    """`exc` restated as a MissingHostAPI when it is a pack reaching a ComfyUI internal: an import
    of a host module mixgraph lacks (`comfy.sd`, `comfy.model_patcher`...), or an attribute of one
    of mixgraph's objects that only ComfyUI's have (`MODEL.model_options`, `VAE.first_stage_model`).
    None when it is an ordinary error."""
    if isinstance(exc, MissingHostAPI):
        if exc.pack is None or exc.node is None:
            return MissingHostAPI(exc.what, exc.pack or pack, exc.node or node)
        return None
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top in HOST_NAMES:
            return MissingHostAPI(f"module {exc.name}", pack, node)
    if isinstance(exc, ImportError) and exc.name and exc.name.split(".")[0] in HOST_NAMES \
            and not isinstance(exc, ModuleNotFoundError):
        return MissingHostAPI(f"{exc.name}: {exc}", pack, node)
    if isinstance(exc, AttributeError):
        obj = getattr(exc, "obj", None)
        module = getattr(type(obj), "__module__", "") or ""
        if obj is not None and module.startswith("mixgraph."):
            return MissingHostAPI(f"{type(obj).__name__}.{exc.name} (a ComfyUI "
                                  f"{_comfy_kind(obj)} attribute)", pack, node)
        if isinstance(obj, type(sys)) and obj.__name__.split(".")[0] in HOST_NAMES:
            return MissingHostAPI(f"{obj.__name__}.{exc.name}", pack, node)
    return None


def _comfy_kind(obj: Any) -> str:
    name = type(obj).__name__
    return {"ModelHandle": "ModelPatcher", "ClipHandle": "CLIP", "VaeHandle": "VAE", "TaesdVaeHandle": "VAE",
            "ControlNetHandle": "ControlNet", "ControlLoraHandle": "ControlNet"}.get(name, name)
