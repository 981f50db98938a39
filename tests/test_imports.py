"""Import structure: no module of the engine or the node library imports itself back in a
circle, and the modules that used to sit on circles import everything at module level."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"graph": "mixgraph.graph", "nodes": "mixgraph.nodes"}
#: Modules that once dodged an import circle with an import inside a function.
NO_LOCAL_IMPORTS = ("graph", "nodes/sampling", "nodes/payloads", "nodes/models/handles.py",
                    "nodes/models/loader.py", "nodes/models/store.py", "nodes/models/layouts.py")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The mixgraph modules one import statement names (`from a import b` may name a.b)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names]


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Import statements that run at import time (also inside module-level if/try)."""
    out, stack = [], list(tree.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.append(n)
        elif isinstance(n, (ast.If, ast.Try)):
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(n, field, []))
        elif isinstance(n, ast.ExceptHandler):
            stack.extend(n.body)
    return out


def test_imports_module_graph_has_no_cycle():
    modules = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for stmt in _module_level(tree):
            for target in _imported(stmt, name, path.name == "__init__.py"):
                if target in modules and target != name:
                    g.add_edge(name, target)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import circles: {cycles[:5]}"
    assert g.has_edge("mixgraph.graph.node", "mixgraph.graph.registry")        # one way only
    assert g.has_edge("mixgraph.graph.workflow", "mixgraph.graph.ui_format")
    assert g.has_edge("mixgraph.nodes.models.loader", "mixgraph.nodes.models.handles")
    assert g.has_edge("mixgraph.nodes.models.handles", "mixgraph.nodes.models.store")


def test_imports_no_function_local_mixgraph_imports_where_circles_were():
    found = []
    for name, path in _modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel == p or rel.startswith(p + "/") for p in NO_LOCAL_IMPORTS):
            continue
        tree = ast.parse(path.read_text())
        top = {id(n) for n in _module_level(tree)}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top:
                targets = _imported(n, name, path.name == "__init__.py")
                if any(t.startswith("mixgraph") for t in targets):
                    found.append(f"{rel}:{n.lineno}")
    assert not found, f"imports inside functions: {found}"


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_imports_runtime_and_payloads_never_import_the_engine():
    runtime = ("mixgraph.nodes.models", "mixgraph.nodes.sampling", "mixgraph.nodes.payloads")
    for name, path in _modules().items():
        if not _within(name, runtime):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            for target in _imported(n, name, path.name == "__init__.py"):
                if target.startswith("mixgraph"):
                    assert _within(target, runtime), (name, target)
