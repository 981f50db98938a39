"""Loading ComfyUI custom node packs (DESIGN §9), as ComfyUI does.

Where packs come from, in order: `custom_nodes/` under the base directory (`--base-directory`,
default the working directory), each `--custom-nodes DIR`, and the `custom_nodes:` entries of
the extra_model_paths.yaml files (paths relative to the yaml file's folder or its `base_path`).
`--disable-all-custom-nodes` loads none.

A pack is a folder with `__init__.py` or a single `.py` file in one of those folders (entries
ending in `.disabled`, `__pycache__` and other files are skipped). It is imported under its own
module name with the host modules (`ui/comfy/comfy_host`) on the import path, then:

* V3: `comfy_entrypoint()` (sync or async) returns a `ComfyExtension`; `on_load()` is awaited and
  `get_node_list()` gives the node classes (their schema's `node_id` is the class name);
* V1: `NODE_CLASS_MAPPINGS` and `NODE_DISPLAY_NAME_MAPPINGS`;
* `WEB_DIRECTORY`: a folder, relative to the pack, whose `.js` files the editor loads from
  `/extensions/<pack>/...` (`GET /extensions` lists them).

Every class becomes an ordinary node (`ui.comfy.comfy_adapter.spec_for_class`). A pack that fails to
import, or defines no nodes, is reported with its name and the error, registers nothing, and
the others still load; a class that cannot be read is reported and skipped. A class name taken
already (a core node, or an earlier pack's) is skipped with a warning: core nodes keep their
names as in ComfyUI. Packs are imported once per process; loading the same folders for another
registry registers the same classes there.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import inspect
import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from aiohttp import web

from mixgraph.graph.env import Env
from mixgraph.nodes.helpers import folders
from mixgraph.ui.comfy import comfy_runtime as rt
from mixgraph.ui.comfy.comfy_adapter import AdapterError, spec_for_class

__all__ = ["PackResult", "LoadReport", "pack_folders", "discover", "load_packs", "configure",
           "attach_to_app", "on_prompt", "load_from_args"]

log = logging.getLogger("mixgraph.custom_nodes")


@dataclass
class PackResult:
    name: str
    path: Path
    ok: bool
    error: str | None = None
    nodes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # "Name: why"
    seconds: float = 0.0
    web_dir: Path | None = None
    version: str = ""                                   # "V1" | "V3"

    def line(self) -> str:
        """One start-up line, ComfyUI's import-times format."""
        state = "" if self.ok else " (IMPORT FAILED)"
        return f"{self.seconds:6.1f} seconds{state}: {self.path}"


@dataclass
class LoadReport:
    packs: list[PackResult] = field(default_factory=list)
    disabled: bool = False

    @property
    def failed(self) -> list[PackResult]:
        return [p for p in self.packs if not p.ok]

    @property
    def web_dirs(self) -> dict[str, Path]:
        return {p.name: p.web_dir for p in self.packs if p.ok and p.web_dir is not None}

    def messages(self) -> list[str]:
        """What start-up prints: each failed pack with its error, each skipped class."""
        out = []
        for p in self.packs:
            if not p.ok:
                out.append(f"custom node pack {p.name!r} ({p.path}) failed to import: {p.error}")
            out += [f"custom node pack {p.name!r}: node {s}" for s in p.skipped]
        return out

    def extension_urls(self) -> list[str]:
        urls = []
        for name, root in self.web_dirs.items():
            urls += sorted(f"/extensions/{name}/" + p.relative_to(root).as_posix()
                           for p in root.rglob("*.js"))
        return urls


# --- where packs are ---------------------------------------------------------------------------

def pack_folders(base_directory: str | Path | None = None, extra: Iterable[str | Path] = (),
                 yaml_files: Iterable[str | Path] = ()) -> list[Path]:
    """The folders packs are loaded from, in order, without duplicates."""
    base = Path(base_directory) if base_directory else Path.cwd()
    found = [base / "custom_nodes", *map(Path, extra)]
    for y in yaml_files:
        found += folders.read_extra_model_paths(Path(y)).get("custom_nodes", [])
    out: list[Path] = []
    for p in found:
        p = p.resolve()
        if p not in out:
            out.append(p)
    return out


def discover(folder: Path) -> list[Path]:
    """The packs in one folder, sorted by name (ComfyUI's rules)."""
    if not folder.is_dir():
        return []
    packs = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name == "__pycache__" or entry.name.endswith(".disabled") or entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".py":
            packs.append(entry)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            packs.append(entry)
    return packs


# --- loading -----------------------------------------------------------------------------------

@dataclass
class _Imported:
    result: PackResult
    classes: list[tuple[str, Any, str | None]]     # (name, class, display name)


_IMPORTED: dict[Path, _Imported] = {}


def configure(env: Env | None = None, registry: Any = None, *, base_directory: Path | None = None,
              user_directory: Path | None = None, dirs: Iterable[Path] | None = None) -> None:
    """Point the host modules at this process's environment and registry."""
    if env is not None:
        rt.STATE.env = env
    if registry is not None:
        rt.STATE.registry = registry
    if base_directory is not None:
        rt.STATE.base_directory = Path(base_directory)
    if user_directory is not None:
        rt.STATE.user_directory = Path(user_directory)
    if dirs is not None:
        rt.STATE.custom_node_dirs = tuple(dirs)


def load_packs(dirs: Iterable[str | Path], registry: Any, env: Env | None = None) -> LoadReport:
    """Import every pack in `dirs` (once per process) and register its nodes into `registry`."""
    dirs = [Path(d) for d in dirs]
    configure(env, registry, dirs=dirs)
    report = LoadReport()
    with rt.host_path():
        for folder in dirs:
            for path in discover(folder):
                key = path.resolve()
                imported = _IMPORTED.get(key)
                if imported is None:
                    imported = _IMPORTED[key] = _import_pack(path)
                report.packs.append(_register(imported, registry))
        _sync_nodes_module(registry)
    for line in report.messages():
        log.warning(line)
    return report


def _module_name(path: Path) -> str:
    return path.stem if path.is_file() else path.name


def _import_pack(path: Path) -> _Imported:
    name = _module_name(path)
    result = PackResult(name, path, ok=False)
    t0 = time.perf_counter()
    module_name = "custom_nodes." + name if name.isidentifier() else "custom_nodes._" + \
        "".join(c if c.isalnum() else "_" for c in name)
    init = path if path.is_file() else path / "__init__.py"
    classes: list[tuple[str, Any, str | None]] = []
    try:
        spec = importlib.util.spec_from_file_location(
            module_name, init, submodule_search_locations=None if path.is_file() else [str(path)])
        if spec is None or spec.loader is None:
            raise ImportError(f"{init} cannot be imported")
        _ensure_parent()
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        web_dir = getattr(module, "WEB_DIRECTORY", None)
        if web_dir is not None:
            d = (Path(path if path.is_dir() else path.parent) / str(web_dir)).resolve()
            if d.is_dir():
                result.web_dir = d
        if hasattr(module, "comfy_entrypoint"):
            result.version = "V3"
            classes = _v3_classes(module)
        elif isinstance(getattr(module, "NODE_CLASS_MAPPINGS", None), dict):
            result.version = "V1"
            display = getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None) or {}
            classes = [(str(n), c, display.get(n)) for n, c in module.NODE_CLASS_MAPPINGS.items()]
        else:
            raise ImportError("the pack defines neither NODE_CLASS_MAPPINGS nor comfy_entrypoint")
        result.ok = True
    except Exception as e:  # noqa: BLE001 - any failure of a pack is reported; the rest load
        better = rt.explain(e, name, None)
        err = better if better is not None else e
        result.error = f"{type(err).__name__}: {err}"
        log.debug("custom node pack %s failed:\n%s", name, traceback.format_exc())
    result.seconds = time.perf_counter() - t0
    return _Imported(result, classes)


def _ensure_parent() -> None:
    """A `custom_nodes` namespace for the packs' module names (ComfyUI's `custom_nodes.<pack>`)."""
    if "custom_nodes" not in sys.modules:
        parent = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("custom_nodes", None,
                                                                                is_package=True))
        parent.__path__ = []
        sys.modules["custom_nodes"] = parent


def _v3_classes(module: Any) -> list[tuple[str, Any, str | None]]:
    async def entry():
        ext = module.comfy_entrypoint()
        if inspect.isawaitable(ext):
            ext = await ext
        await ext.on_load()
        return list(await ext.get_node_list())

    node_list = asyncio.run(entry())
    out = []
    for cls in node_list:
        schema = cls.GET_SCHEMA()
        out.append((schema.node_id, cls, schema.display_name))
    return out


def _register(imported: _Imported, registry: Any) -> PackResult:
    base = imported.result
    result = PackResult(base.name, base.path, base.ok, base.error, [], [], base.seconds,
                        base.web_dir, base.version)
    for name, cls, display in imported.classes:
        if name in registry:
            if getattr(registry.get(name).fn, "cls", None) is cls:   # this pack, loaded before
                result.nodes.append(name)
                continue
            result.skipped.append(f"{name}: the name is taken by "
                                  f"{registry.get(name).python_module}; skipped")
            continue
        try:
            spec = spec_for_class(name, cls, pack=result.name, display_name=display,
                                  python_module=f"custom_nodes.{result.name}")
        except AdapterError as e:
            result.skipped.append(f"{name}: {e}; skipped")
            continue
        registry.add(spec)
        result.nodes.append(name)
    return result


def _sync_nodes_module(registry: Any) -> None:
    """The host `nodes` module's mappings, once packs may have imported it."""
    module = sys.modules.get("nodes")
    if module is not None and str(getattr(module, "__file__", "")).startswith(str(rt.HOST_DIR)):
        module.sync(registry)


# --- the server side ---------------------------------------------------------------------------

def _host_module(name: str) -> Any:
    with rt.host_path():
        return importlib.import_module(name)


def _wrap(handler: Any) -> Any:
    async def run(request: web.Request) -> web.StreamResponse:
        with rt.host_path():
            return await handler(request)

    return run


def attach_to_app(app: web.Application, report: LoadReport | None, send: Any) -> None:
    """Serve what packs add: the routes on `PromptServer.instance.routes` (also under /api) and
    each WEB_DIRECTORY under /extensions/<pack>. `send(event, data, client_id)` becomes where
    `PromptServer.send_sync` writes (set on start-up, cleared on clean-up)."""
    server = _host_module("server").PromptServer.instance
    for route in server.routes:
        if isinstance(route, web.RouteDef):
            for prefix in ("", "/api"):
                app.router.add_route(route.method, prefix + route.path, _wrap(route.handler),
                                     **route.kwargs)
        elif isinstance(route, web.StaticDef):
            app.router.add_static(route.prefix, route.path, **route.kwargs)
    for name, root in (report.web_dirs.items() if report else ()):
        app.router.add_static(f"/extensions/{name}", root)

    async def on_startup(app: web.Application) -> None:
        rt.STATE.sink = send
        server.loop = asyncio.get_running_loop()

    async def on_cleanup(app: web.Application) -> None:
        if rt.STATE.sink is send:
            rt.STATE.sink = None

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)


def on_prompt(body: dict) -> dict:
    """`POST /prompt` bodies through the packs' `add_on_prompt_handler` handlers (if any pack
    loaded the host `server` module)."""
    module = sys.modules.get("server")
    if module is None or not str(getattr(module, "__file__", "")).startswith(str(rt.HOST_DIR)):
        return body
    with rt.host_path():
        return module.PromptServer.instance.trigger_on_prompt(body)


# --- from command-line arguments -------------------------------------------------------------

def load_from_args(args: Any, registry: Any, env: Env) -> LoadReport:
    """Packs as `--custom-nodes`, `--disable-all-custom-nodes`, `--base-directory` and the
    extra_model_paths.yaml files (those `nodes.helpers.folders` reads for the models folder, the one in
    the base directory, and `--extra-model-paths-config`) say."""
    base = Path(getattr(args, "base_directory", None) or Path.cwd())
    configure(env, registry, base_directory=base)
    if getattr(args, "disable_all_custom_nodes", False):
        return LoadReport(disabled=True)
    given = []
    for item in getattr(args, "extra_model_paths_config", None) or []:   # ComfyUI: append + nargs
        given += item if isinstance(item, list) else [item]
    yamls = [*folders.extra_model_paths_files(env), base / "extra_model_paths.yaml", *given]
    yamls = [Path(y) for y in dict.fromkeys(map(str, yamls)) if Path(y).is_file()]
    dirs = pack_folders(base, getattr(args, "custom_nodes", None) or [], yamls)
    return load_packs(dirs, registry, env)
