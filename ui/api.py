"""Python API for scripts and notebooks: same engine, same cache, same precision rules as the CLI.

    from mixgraph.ui import api
    result = api.run("workflows/txt2img.json", models="models", precision="bf16,VAE=f32",
                     set={"3.seed": 7})
    image = result["8"][0]           # node 8's first output, in memory
    print(result.report.to_json())

    g = api.Graph()                   # or build a graph in code
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    text = g.add("CLIPTextEncode", text="a cat", clip=ckpt[1])
    ...
    g.region("sampling", [sampler], "bf16")
    result = api.run(g.build())

One default `Executor` per process (one output cache), created on first use with the node
library registered; pass `executor=` to use another. `enable_output_cache(DIR)` adds the
persistent output cache behind it (off by default, as `--output-cache DIR` on the CLI). This is
the top layer (ui/): it may import both the engine (mixgraph.graph) and the node library
(mixgraph.nodes).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from mixgraph.graph import safe_json
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor, RunReport
from mixgraph.graph.persist import DEFAULT_BYTES, DiskCache, TieredCache
from mixgraph.graph.prompt import Link, NodeCall, PrecisionConfig, Region, Workflow, WorkflowError
from mixgraph.graph.validate import Validation, validate
from mixgraph.graph.formats.workflow import load_workflow

__all__ = ["load", "run", "RunResult", "Graph", "NodeRef", "set_inputs", "parse_set", "set_memory_budget",
           "default_executor", "default_registry", "load_node_library", "enable_output_cache"]

_lock = threading.Lock()
_default: Executor | None = None
_library_loaded = False


def load_node_library() -> None:
    """Register the node library's `@node` declarations into the engine's registry (once)."""
    global _library_loaded
    if not _library_loaded:
        from mixgraph.nodes import register_all
        register_all()
        _library_loaded = True


def default_registry() -> Any:
    from mixgraph.graph.registry import REGISTRY
    load_node_library()
    return REGISTRY


def default_executor(registry: Any = None) -> Executor:
    """The process-wide executor (created once; `registry` only matters on first use)."""
    global _default
    with _lock:
        if _default is None:
            _default = Executor(registry if registry is not None else default_registry(), Env.from_args())
        return _default


def enable_output_cache(directory: str | os.PathLike, gb: float = DEFAULT_BYTES / 2**30,
                        executor: Executor | None = None) -> TieredCache:
    """Put the persistent output cache (graph.persist) behind an executor's in-memory cache
    (the default executor's unless given): what it computes is kept in `directory`, up to `gb`
    GB, and reused after a restart or by other processes using the same directory. Returns the
    executor's new cache; `cache.disk.stats()` says what it holds."""
    ex = executor or default_executor()
    memory = ex.cache.memory if isinstance(ex.cache, TieredCache) else ex.cache
    ex.cache = TieredCache(memory, DiskCache(directory, int(gb * 2**30)))
    return ex.cache


def load(src: Any, registry: Any = None) -> Workflow:
    """A workflow from a path, JSON text, or a dict in any of the three formats (DESIGN §3)."""
    if isinstance(src, Workflow):
        return src
    return load_workflow(src, registry if registry is not None else default_executor().registry)


def load_file(path: str | os.PathLike, registry: Any = None) -> Workflow:
    """A workflow file in any of the three formats; WorkflowError (a missing file, bad JSON or
    structure, a bad precision SPEC) says what is wrong with it."""
    if not Path(path).is_file():
        raise WorkflowError(f"{path}: no such file")
    return load_workflow(Path(path), registry if registry is not None else default_registry())


def validate_file(path: str | os.PathLike, registry: Any = None,
                  env: Env | None = None) -> tuple[Workflow, Validation]:
    """Load and check a workflow file as `mixgraph validate` does. Raises WorkflowError or
    OSError when it cannot be read; `Validation.clean` says whether it may run."""
    registry = registry if registry is not None else default_registry()
    wf = load_file(path, registry)
    return wf, validate(wf.prompt, registry, env)


# --- overrides (`--set ID.INPUT=VALUE`) ------------------------------------------------------------

def parse_set(text: str) -> tuple[str, str, Any]:
    """`"3.seed=42"` -> ("3", "seed", 42). The value is JSON when it parses, else a string."""
    target, sep, raw = text.partition("=")
    node_id, dot, name = target.strip().rpartition(".")
    if not sep or not dot or not node_id or not name:
        raise ValueError(f"--set {text!r}: expected NODE_ID.INPUT=VALUE, e.g. 3.seed=42")
    try:
        value = safe_json.loads(raw, f"--set {target.strip()}")
    except safe_json.JsonError as e:
        if e.reason != "syntax":   # JSON, but too deep or too long to take: say so
            raise ValueError(str(e)) from None
        value = raw
    return node_id, name, value


def set_inputs(workflow: Workflow, sets: Mapping[str, Any] | Iterable[str]) -> Workflow:
    """A copy of `workflow` with inputs replaced: {"3.seed": 42} or ["3.seed=42", ...]."""
    if isinstance(sets, Mapping):
        items = []
        for k, v in sets.items():
            node_id, _, name = str(k).rpartition(".")
            if not node_id or not name:
                raise ValueError(f"set {k!r}: expected 'NODE_ID.INPUT'")
            items.append((node_id, name, v))
    else:
        items = [parse_set(s) for s in sets]
    if not items:
        return workflow
    prompt = dict(workflow.prompt)
    for node_id, name, value in items:
        call = prompt.get(node_id)
        if call is None:
            raise ValueError(f"set {node_id}.{name}: the workflow has no node {node_id!r}")
        prompt[node_id] = replace(call, inputs={**call.inputs, name: value})
    return replace(workflow, prompt=prompt)


# --- running -------------------------------------------------------------------------------------

@dataclass
class RunResult:
    """`outputs[node_id]` is the node's output tuple; `report` the run report (DESIGN §2)."""

    outputs: dict[str, tuple]
    report: RunReport
    ui: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, node_id: str) -> tuple:
        return self.outputs[str(node_id)]

    @property
    def files(self) -> list[str]:
        return self.report.files


def run(workflow: Any, *, models: str | os.PathLike | None = None, input: str | os.PathLike | None = None,
        output: str | os.PathLike | None = None, precision: str | None = None,
        set: Mapping[str, Any] | Iterable[str] | None = None, executor: Executor | None = None,
        device: str | None = None, targets: Iterable[str] | None = None,
        on_event: Callable | None = None, memory_budget: float | None = None) -> RunResult:
    """Run a workflow (path, dict, Workflow, or a `Graph`). Raises ValidationFailed, NodeError or
    Interrupted (mixgraph.graph.executor), each carrying `.report`. `memory_budget`: GiB the run
    may hold on its device (sets the process's budget, as `set_memory_budget`; models that do not
    fit stream their blocks)."""
    ex = executor or default_executor()
    if memory_budget is not None:
        set_memory_budget(memory_budget, device=device or ex.env.device or "cpu")
    if isinstance(workflow, Graph):
        workflow = workflow.build()
    wf = load(workflow, ex.registry)
    if set:
        wf = set_inputs(wf, set)
    base = ex.env
    env = replace(
        base,
        models=Env.from_args(models=models).models if models else base.models,
        input=Env.from_args(input=input).input if input else base.input,
        output=Env.from_args(output=output).output if output else base.output,
        device=device or base.device)
    report = ex.run(wf, targets=targets, precision=precision, env=env, on_event=on_event)
    return RunResult(report.values, report, report.ui)


def set_memory_budget(gib: float | None, device: str = "cpu", *, reserve_gib: float | None = None,
                      mode: str = "normal") -> Any:
    """Set the memory budget of `device` for this process (`--memory-budget GIB`; None: the
    default, keeping `reserve_gib` free); `mode` is ComfyUI's VRAM mode ("normal", "low", "none":
    stream every block, "high" / "gpu_only": never stream). Returns the budget in force."""
    from mixgraph.nodes.models.memory_budget import set_budget
    return set_budget(device, gib, reserve_gib=reserve_gib, mode=mode)


# --- building a graph in code --------------------------------------------------------------------

@dataclass(frozen=True)
class NodeRef:
    """A node added to a `Graph`; `ref[i]` is a link to its output i."""

    node_id: str

    def __getitem__(self, slot: int) -> Link:
        return Link(self.node_id, int(slot))

    @property
    def out(self) -> Link:
        return Link(self.node_id, 0)


class Graph:
    """Build a workflow in code: `add(class_type, **inputs)` returns a NodeRef; inputs are
    literals, `Link`s (`ref[slot]`) or NodeRefs (meaning output 0)."""

    def __init__(self, precision: str | None = None):
        self._nodes: dict[str, NodeCall] = {}
        self._regions: list[Region] = []
        self.precision = precision

    def add(self, class_type: str, *, node_id: str | None = None, title: str | None = None,
            **inputs: Any) -> NodeRef:
        nid = str(node_id) if node_id is not None else str(len(self._nodes) + 1)
        if nid in self._nodes:
            raise ValueError(f"node id {nid!r} is already used")
        ins = {k: (Link(v.node_id, 0) if isinstance(v, NodeRef) else v) for k, v in inputs.items()}
        self._nodes[nid] = NodeCall(class_type, ins, title)
        return NodeRef(nid)

    def region(self, name: str, nodes: Iterable[NodeRef | str], precision: str) -> None:
        ids = frozenset(n.node_id if isinstance(n, NodeRef) else str(n) for n in nodes)
        self._regions.append(Region(name, ids, precision))

    def build(self) -> Workflow:
        if not self._nodes:
            raise WorkflowError("the graph has no nodes")
        return Workflow(prompt=dict(self._nodes),
                        precision=PrecisionConfig(self.precision, tuple(self._regions)),
                        source="api")
