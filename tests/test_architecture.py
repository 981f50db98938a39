"""The layering of DESIGN §1 and STYLE rule 2, read from the source with `ast`.

Layers, top to bottom: `mixgraph.ui` (every user-facing entry point) -> the node declarations
(`nodes/declare/`, the helpers they call in `nodes/helpers/`, and the modules directly in nodes/,
such as `library.py`) -> the engine `mixgraph.graph`; the other subpackages of nodes/ (`families`,
`encoders`, `vae`, `adapters`, `weights`, `models`, `sampling`, `payloads`, ...) are the runtime:
plain PyTorch that imports only itself. Every import is counted, function-local ones too, so a
circle cannot hide behind a late import. Beside the layers: a model family folder imports no other
family (DESIGN §11), and no folder holds more than `MAX_MODULES` modules directly (issue 21).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"mixgraph": "mixgraph", "graph": "mixgraph.graph", "nodes": "mixgraph.nodes",
           "ui": "mixgraph.ui"}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([package, *parts])] = path
    return mods


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in module `name`, relative ones
    resolved; "module level" counts imports under module-level if/try, which run at import."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, True)]
    while todo:
        node, top = todo.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            if isinstance(child, ast.Import):
                found += [(a.name, child.lineno, top) for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import submodule` needs the submodule; the package's __init__ runs
                # for every import below it, so it is no edge of its own unless a name comes from it.
                subs = [f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in MODULES]
                found += [(s, child.lineno, top) for s in subs]
                if len(subs) < len(child.names):
                    found.append((base, child.lineno, top))
            todo.append((child, top and isinstance(child, (ast.If, ast.Try, ast.ExceptHandler))))
    return found


#: The subpackages of nodes/ that belong to the declarations layer; every other one is runtime.
DECLARATION_PACKAGES = ("declare", "helpers")


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "mixgraph":
        return "external"
    if len(parts) == 1:
        return "top"
    if parts[1] == "nodes" and len(parts) > 2 and parts[2] not in DECLARATION_PACKAGES \
            and _is_package(".".join(parts[:3])):
        return "runtime"
    return {"graph": "engine", "nodes": "declarations", "ui": "ui"}.get(parts[1], "top")


ALLOWED = {
    "top": {"top", "ui"},                     # mixgraph/__main__ starts the CLI
    "ui": {"top", "ui", "declarations", "runtime", "engine"},
    "declarations": {"declarations", "runtime", "engine"},
    "runtime": {"runtime"},
    "engine": {"engine"},
}


def test_architecture_imports_point_down():
    wrong = []
    for name in MODULES:
        for target, line, _ in _imports(name):
            if _layer(target) == "external":
                continue
            if _layer(target) not in ALLOWED[_layer(name)]:
                wrong.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {_layer(name)} "
                             f"module {name} imports {_layer(target)} module {target}")
    assert not wrong, "imports that point up a layer:\n" + "\n".join(wrong)


def test_architecture_no_top_level_graph_nodes_ui_imports():
    """Nothing imports the old top-level names: they are ComfyUI host-module names. Except
    ComfyUI custom node packs (tests/custom_packs), where `import nodes` means ComfyUI's host
    module, which mixgraph provides from ui/comfy/comfy_host."""
    wrong = []
    packs = ROOT / "tests" / "custom_packs"
    for path in [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py")),
                 *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        if path.is_relative_to(packs):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                      if n and n.split(".")[0] in ("graph", "nodes", "ui")]
    assert not wrong, "\n".join(wrong)


def test_architecture_no_reaching_up_by_module_name_strings():
    """A lower layer never names a higher one in a string (import_module, `-m` children, ...)."""
    higher = {"engine": ("mixgraph.nodes", "mixgraph.ui", "nodes.", "ui."),
              "declarations": ("mixgraph.ui", "ui."), "runtime": ("mixgraph.graph", "mixgraph.ui",
                                                                  "graph.", "ui.")}
    wrong = []
    for name, path in MODULES.items():
        banned = higher.get(_layer(name), ())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(banned) and " " not in node.value:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not wrong, "\n".join(wrong)


def test_architecture_no_import_cycles():
    """Module imports form no circle, counting late (function-local) imports as well, and counting
    the package `__init__`s an import runs: importing `a.b.c` runs `a/b/__init__.py` first, so a
    package whose `__init__` imports mixgraph modules is an edge of every import below it (a
    circle through a registry in an `__init__` once hid there)."""
    g = nx.DiGraph()
    heavy = {n for n in MODULES if _is_package(n) and any(t.startswith("mixgraph") for t, _, _ in _imports(n))}
    for name in MODULES:
        g.add_node(name)
        own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
        for target, _, _ in _imports(name):
            if target in MODULES and target != name:
                g.add_edge(name, target)
            parts = target.split(".")
            for i in range(2, len(parts)):
                package = ".".join(parts[:i])
                if package in heavy and package not in own:
                    g.add_edge(name, package)
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles[:10])
    # The three circles that once were, now one way each.
    for a, b in (("graph.node", "graph.registry"), ("graph.formats.workflow", "graph.formats.ui_format"),
                 ("nodes.models.loader", "nodes.models.handles"),
                 ("nodes.models.handles", "nodes.weights.store")):
        assert g.has_edge(f"mixgraph.{a}", f"mixgraph.{b}") and not g.has_edge(f"mixgraph.{b}",
                                                                                 f"mixgraph.{a}")


#: Where a late import once dodged an import circle: these import everything at module level.
NO_LATE_IMPORTS = ("graph/", "nodes/sampling/", "nodes/payloads/", "nodes/models/handles.py",
                   "nodes/models/loader.py", "nodes/weights/store.py", "nodes/weights/layouts.py")


def test_architecture_no_late_imports_where_circles_were():
    late = []
    for name, path in MODULES.items():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(NO_LATE_IMPORTS):
            late += [f"{rel}:{line}: {target}" for target, line, top in _imports(name)
                     if not top and target.startswith("mixgraph")]
    assert not late, "imports inside functions:\n" + "\n".join(late)


@pytest.mark.parametrize("layer,example", [("engine", "mixgraph.graph.executor"),
                                           ("runtime", "mixgraph.nodes.families.sd.unet"),
                                           ("declarations", "mixgraph.nodes.declare.loaders.loading"),
                                           ("declarations", "mixgraph.nodes.helpers.folders"),
                                           ("declarations", "mixgraph.nodes.library"),
                                           ("ui", "mixgraph.ui.server.server")])
def test_architecture_layers_are_classified(layer, example):
    assert example in MODULES and _layer(example) == layer


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_private_module(importer: str, module: str) -> bool:
    """A package importing its own private submodule (`from . import _io as io` in
    ui/comfy/comfy_host/comfy_api/latest: ComfyUI's own module layout, which custom packs import):
    the package is that module's public face, so this is no reach into another module."""
    return importer in MODULES and _is_package(importer) and module.rpartition(".")[0] == importer


def test_architecture_no_module_uses_another_modules_private_names():
    """No module imports a private (leading underscore, not dunder) name from another mixgraph
    module, nor reads `other_module._name`: what two modules share gets a public name in one home.
    Function-local imports count too, and so do the tests, benchmarks and tools: they use the
    public names as any caller would."""
    wrong = []
    callers = {f"{p.parent.name}.{p.stem}": p for folder in ("tests", "benchmarks", "tools")
               for p in sorted((ROOT / folder).rglob("*.py")) if not p.is_relative_to(ROOT / "tests" / "custom_packs")}
    for name, path in [*MODULES.items(), *callers.items()]:
        tree = ast.parse(path.read_text(), str(path))
        package = name if name in MODULES and _is_package(name) else name.rpartition(".")[0]
        modules: dict[str, str] = {}   # local name -> the mixgraph module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("mixgraph"):
                        modules[a.asname or a.name] = a.name
                        if any(_private(p) for p in a.name.split(".")):
                            wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                if not base.startswith("mixgraph"):
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in MODULES:
                        modules[a.asname or a.name] = full
                    if _private(a.name) and full != name and not _own_private_module(name, full):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {base} import {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = ast.unparse(node.value)
                target = modules.get(owner, owner if owner in MODULES else None)
                if target is not None and target != name:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{node.attr}")
    assert not wrong, "private names used across modules:\n" + "\n".join(wrong)


#: Words of the diffusion domain the engine must not name in code: ComfyUI's socket types for
#: models and their payloads, and the node library's precision roles (nodes/socket_types.py
#: registers them). IMAGE and MASK are on the list too: the engine's ComfyUI formats (UI
#: workflows, object_info, the payload codec) handle them as any other type, by registration.
DIFFUSION_WORDS = frozenset({
    "MODEL", "CLIP", "VAE", "CONDITIONING", "LATENT", "CONTROL_NET", "CLIP_VISION",
    "CLIP_VISION_OUTPUT", "STYLE_MODEL", "UPSCALE_MODEL", "GLIGEN", "NOISE", "SAMPLER", "SIGMAS",
    "GUIDER", "IMAGE", "MASK", "UNET", "unet", "vae", "text", "text_large", "diffusion",
})


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in a module (which may use examples)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def test_architecture_engine_names_no_diffusion_socket_type():
    """graph/ holds no diffusion socket type or precision role as a string constant (docstrings
    aside): the node library registers them (`register_socket_type`, `register_role`)."""
    wrong = []
    for path in sorted((ROOT / "graph").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docs and node.value in DIFFUSION_WORDS]
    assert not wrong, "diffusion words in the engine (register them from nodes/):\n" + "\n".join(wrong)


ENGINE_ALONE = """
import sys
from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import DeviceCaps, Resolver, preset_spec, preset_table
from tests import toy_nodes as toy

env = Env(models=(), input=sys.argv[1], output=sys.argv[1], temp=sys.argv[1])
prompt = {"1": toy.call("ToyModelLoader", scale=1.0), "2": toy.call("Const", value=3),
          "3": toy.call("NanIfHalf", model=toy.link(1), x=toy.link(2)),
          "4": toy.call("ShowImage", image=toy.link(3))}
report = Executor(toy.registry(), env, OutputCache(2**20)).run(prompt, precision="memory")
assert report.status == "success", report
assert not [m for m in sys.modules if m.startswith(("mixgraph.nodes", "mixgraph.ui"))]
cuda = DeviceCaps("cuda", native_bf16=True, native_f16=True)
cpu_bf16 = DeviceCaps("cpu", native_bf16=True, native_f16=False)
# no roles registered: every socket type gets the careful default
assert [preset_spec(p, "MODEL", cuda) for p in ("quality", "balanced", "memory", "fast")] == \\
    ["f32", "bf16", "bf16:f32", "f16"]
assert preset_spec("balanced", "MODEL", cpu_bf16) == "f32"
assert preset_table(caps=cuda) == {p: {} for p in ("quality", "balanced", "memory", "fast")}
assert Resolver(None, caps=cuda).describe()["default"] == "bf16"
print("engine alone: ok")
"""


def test_architecture_engine_runs_without_the_node_library(tmp_path):
    """The engine with no node library loaded: toy nodes register their own model socket types,
    a run with a preset resolves (each type gets the careful default), nothing under nodes/ or
    ui/ is imported."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [
        os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", ENGINE_ALONE, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "engine alone: ok" in done.stdout, done.stderr[-3000:]


def _family_folder(module: str) -> str | None:
    """The family folder under nodes/families/ that `module` belongs to; None for the seam's shared
    modules directly in nodes/families/ (base.py, the registry in __init__.py, ...) and for the rest."""
    parts = module.split(".")
    if parts[:3] != ["mixgraph", "nodes", "families"] or len(parts) < 4:
        return None
    folder = ".".join(parts[:4])
    return parts[3] if folder in MODULES and _is_package(folder) else None


def test_architecture_no_family_folder_imports_another_family():
    """A new family is a folder plus a registry line: it never reaches into another family's folder
    (what two families share goes to the seam or to a runtime package beside nodes/families/)."""
    wrong = []
    for name in MODULES:
        own = _family_folder(name)
        if own is None:
            continue
        for target, line, _ in _imports(name):
            other = _family_folder(target)
            if other is not None and other != own:
                wrong.append(f"{MODULES[name].relative_to(ROOT)}:{line}: family {own!r} imports {target}")
    assert not wrong, "family folders that import another family:\n" + "\n".join(wrong)


#: Folders are sorted by concept; a folder past this many modules holds more than one concept.
MAX_MODULES = 30


def test_architecture_no_folder_holds_more_than_max_modules():
    crowded = []
    for folder in FOLDERS:
        for d in sorted(p for p in [ROOT / folder, *(ROOT / folder).rglob("*")]
                        if p.is_dir() and p.name != "__pycache__"):
            count = sum(1 for f in d.glob("*.py") if f.name != "__init__.py")
            if count > MAX_MODULES:
                crowded.append(f"{d.relative_to(ROOT)}/: {count} modules")
    assert not crowded, (f"folders with more than {MAX_MODULES} modules (split them by concept):\n"
                         + "\n".join(crowded))
