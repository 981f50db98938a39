"""The executor: validate, plan, look up the cache, run what is missing (DESIGN §4, §5).

    report = Executor(registry, env).run(workflow, precision="bf16,VAE=f32", on_event=print)

Planning is linear and recursion-free, so a 100,000-node chain runs: the order is the one
validation found (`graph.plan`: topological, ties broken by the prompt's node order, first ready
first run), and per node the rest is a digest, one batched cache lookup and the call itself. A
fully cached re-run makes no Context and sends no per-node event (one `execution_cached` lists
them all). Only ancestors of the valid output nodes run, and of those only the ones not cached
and needed by something uncached (an evicted ancestor of a cached node is not re-run).

A node's cache key depends on the graph and the declarations only, never on earlier runs: its
precision part is the resolved policy of each socket type in the spec's `precision_types`, and
`ctx.policy_for` refuses a type the node did not declare. ComfyUI stops a prompt at its first failing node; so does this, and
everything computed before the failure stays cached.

NaN guard: a node that ran under a half-precision compute policy (what it reported through
`ctx.used_precision`, else the policy resolved for its model inputs) and returned a non-finite
float tensor anywhere in its outputs is re-run once, alone, with `ctx.fallback_f32` set and f32
compute; a warning event is sent and the report says `nan_fallback: true`. Still non-finite: an
error naming the node.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from mixgraph.graph import events as ev
from mixgraph.graph.cache import OutputCache, key_header, node_key, walk_tensors
from mixgraph.graph.context import Context, Interrupted
from mixgraph.graph.env import Env
from mixgraph.graph.node import Result
from mixgraph.graph.plan import links_of, walk
from mixgraph.graph.precision import Resolver, parse_precision_arg, resolve
from mixgraph.graph.prompt import Link, Workflow, WorkflowError
from mixgraph.graph.spec import NodeSpec
from mixgraph.graph.validate import Validation, format_problems, gc_paused, validate
from mixgraph.graph.workflow import dump_api, load_workflow

__all__ = ["Executor", "RunReport", "NodeReport", "ExecutionFailed", "ValidationFailed",
           "NodeError", "Interrupted"]

log = logging.getLogger("mixgraph")
_MISSING = object()


class ExecutionFailed(Exception):
    """Base of run failures; `.report` holds the partial RunReport."""

    report: "RunReport | None" = None


class ValidationFailed(ExecutionFailed):
    def __init__(self, validation: Validation | None, message: str | None = None):
        self.validation = validation
        if message is None:
            message = format_problems(validation)
        super().__init__(message)


class NodeError(ExecutionFailed):
    """A node failed. The original exception is `__cause__`."""

    def __init__(self, node_id: str, class_type: str, cause: BaseException | str):
        self.node_id = node_id
        self.class_type = class_type
        text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"node {node_id} ({class_type}) failed: {text}")


class NonFiniteOutput(ArithmeticError):
    """A node's float outputs hold NaN or Inf even with f32 compute."""


@dataclass(slots=True)
class NodeReport:
    class_type: str
    status: str                  # "executed" | "cached"
    seconds: float = 0.0
    precision: str | None = None
    nan_fallback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"class_type": self.class_type, "status": self.status,
                "seconds": round(self.seconds, 6), "precision": self.precision,
                "nan_fallback": self.nan_fallback}


@dataclass
class RunReport:
    """DESIGN §2's --report JSON (`to_json()`), plus the node outputs in memory (`values`)."""

    prompt_id: str
    seconds: float = 0.0
    status: str = "running"      # "success" | "error" | "interrupted"
    nodes: dict[str, NodeReport] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)   # files written, per node
    values: dict[str, tuple] = field(default_factory=dict)        # node id -> output tuple
    ui: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_id": self.prompt_id, "seconds": round(self.seconds, 6), "status": self.status,
            "nodes": {k: v.to_json() for k, v in self.nodes.items()},
            "outputs": self.outputs, "warnings": self.warnings}
        if self.error is not None:
            out["error"] = self.error
        return out

    @property
    def executed(self) -> list[str]:
        return [k for k, v in self.nodes.items() if v.status == "executed"]

    @property
    def cached(self) -> list[str]:
        return [k for k, v in self.nodes.items() if v.status == "cached"]

    @property
    def files(self) -> list[str]:
        return [p for paths in self.outputs.values() for p in paths]


class _NodePlan:
    """What the executor needs about a node type, computed once per spec."""

    __slots__ = ("spec", "fn", "names", "defaults", "hidden", "model_types", "n_out", "unique_id",
                 "wants_ctx", "deterministic", "fingerprint", "version", "class_type", "key_header")

    def __init__(self, spec: NodeSpec):
        self.spec = spec
        self.fn = spec.fn
        self.class_type = spec.name
        self.names = tuple(n for n, _ in spec.inputs)
        # An absent input gets its declared default (optional sockets: None).
        self.defaults = {n: (i.default if i.has_default else None) for n, i in spec.inputs}
        self.hidden = tuple((n, h.kind) for n, h in spec.hidden)
        self.unique_id = any(k == "UNIQUE_ID" for _, k in self.hidden)
        self.model_types = spec.precision_types   # sorted; the precision part of the cache key
        self.n_out = len(spec.outputs)
        self.wants_ctx = spec.wants_ctx
        self.deterministic = spec.deterministic
        self.fingerprint = spec.fingerprint
        self.version = spec.version
        self.key_header = key_header(spec.name, spec.version)


class _Run:
    """Per-run state shared with the nodes' Contexts."""

    __slots__ = ("prompt_id", "on_event", "interrupt", "report", "workflow", "extra_data",
                 "_api_prompt")

    def __init__(self, prompt_id, on_event, interrupt, report, workflow, extra_data):
        self.prompt_id = prompt_id
        self.on_event = on_event
        self.interrupt = interrupt
        self.report = report
        self.workflow = workflow
        self.extra_data = extra_data
        self._api_prompt = _MISSING

    def progress(self, node_id: str, value: int, total: int, preview: Any = None) -> None:
        if self.on_event is not None:
            self.on_event(ev.Progress(self.prompt_id, node_id, int(value), int(total), preview))

    def warn(self, message: str, node_id: str | None = None) -> None:
        text = f"node {node_id}: {message}" if node_id else message
        log.warning(text)
        self.report.warnings.append(text)
        if self.on_event is not None:
            self.on_event(ev.Warning(self.prompt_id, message, node_id))

    def api_prompt(self) -> dict:
        if self._api_prompt is _MISSING:
            self._api_prompt = dump_api(self.workflow)
        return self._api_prompt

    def hidden(self, kind: str, node_id: str) -> Any:
        if kind == "UNIQUE_ID":
            return node_id
        if kind == "PROMPT":
            return self.api_prompt()
        if kind == "EXTRA_PNGINFO":
            return self.extra_data.get("extra_pnginfo")
        return None


def _nonfinite(values: Any) -> bool:
    for t in walk_tensors(values):
        if (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t).all()):
            return True
    return False


def _ui_files(ui: dict | None, env: Env) -> list[str]:
    files: list[str] = []
    if not ui:
        return files
    for items in ui.values():
        if not isinstance(items, (list, tuple)):
            continue
        for item in items:
            if isinstance(item, dict) and "filename" in item:
                roots = {"output": env.output, "temp": env.temp, "input": env.input}
                root = Path(roots.get(item.get("type") or "output", env.output))
                files.append(str(root / (item.get("subfolder") or "") / item["filename"]))
    return files


def _short(v: Any) -> Any:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, torch.Tensor):
        return f"Tensor{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}"
    return type(v).__name__


class Executor:
    """Runs workflows against one registry, one output cache and one environment.

    One run at a time (runs from several threads queue on a lock). `interrupt()` stops the
    current run at the next node boundary or the next `ctx.check_interrupt()` / `ctx.progress()`.
    """

    def __init__(self, registry: Any, env: Env | None = None, cache: OutputCache | None = None):
        self.registry = registry
        self.env = env or Env()
        self.cache = cache if cache is not None else OutputCache()
        self.interrupt_event = threading.Event()
        self._plans: dict[str, _NodePlan] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def interrupt(self) -> None:
        self.interrupt_event.set()

    def _plan_for(self, class_type: str) -> _NodePlan:
        spec = self.registry.get(class_type)
        plan = self._plans.get(class_type)
        if plan is None or plan.spec is not spec:
            plan = self._plans[class_type] = _NodePlan(spec)
        return plan

    def load(self, workflow: Any) -> Workflow:
        return workflow if isinstance(workflow, Workflow) else load_workflow(workflow, self.registry)

    # --- the run ----------------------------------------------------------------------------

    def run(self, workflow: Any, *, targets: Iterable[str] | None = None,
            precision: str | None = None, type_precision: dict[str, str] | None = None,
            env: Env | None = None, on_event: Callable[[ev.Event], None] | None = None,
            interrupt: threading.Event | None = None, prompt_id: str | None = None,
            extra_data: dict | None = None, validation: Validation | None = None,
            strict: bool = True) -> RunReport:
        """Validate and execute. Raises ValidationFailed, NodeError or Interrupted (each with
        `.report`). `precision` is the run's default and per-type defaults (`"bf16,VAE=f32"`);
        it beats the workflow file's default, regions beat both. With `strict=False`, invalid
        outputs are dropped and the valid ones run (ComfyUI's server behaviour)."""
        with self._lock:
            own_interrupt = interrupt is None
            interrupt = self.interrupt_event if own_interrupt else interrupt
            if own_interrupt:
                interrupt.clear()
            try:
                return self._run(workflow, targets, precision, type_precision, env or self.env,
                                 on_event, interrupt, prompt_id, extra_data, validation, strict)
            finally:
                if own_interrupt:
                    interrupt.clear()

    def _run(self, workflow, targets, precision, type_precision, env, on_event, interrupt,
             prompt_id, extra_data, validation, strict) -> RunReport:
        t_start = time.perf_counter()
        report = RunReport(prompt_id or str(uuid.uuid4()))
        try:
            wf = self.load(workflow)
            default_spec, types = parse_precision_arg(precision, env.device)
            if type_precision:
                types.update({k.upper(): v for k, v in type_precision.items()})
            resolver = Resolver(wf.precision, types, default_spec, env.device, self._warned)
        except (WorkflowError, ValueError) as e:
            report.status, report.error = "error", str(e)
            err = ValidationFailed(None, str(e))
            err.report = report
            raise err from e
        v = validation or validate(wf.prompt, self.registry, env, targets)
        if not v.ok or (strict and v.errors):
            report.status, report.error = "error", "validation failed"
            err = ValidationFailed(v)
            err.report = report
            raise err
        extra = dict(extra_data or {})
        if "extra_pnginfo" not in extra and wf.ui is not None:
            extra["extra_pnginfo"] = {"workflow": wf.ui}
        run = _Run(report.prompt_id, on_event, interrupt, report, wf, extra)
        for msg in resolver.warnings:
            run.warn(msg)

        inputs = v.inputs
        prompt = wf.prompt
        emit = on_event
        values = report.values
        nodes = report.nodes
        with gc_paused():
            order = v.order
            by_class: dict[str, _NodePlan] = {}
            plans = {}
            for nid in order:
                ct = prompt[nid].class_type
                plan = by_class.get(ct)
                if plan is None:
                    plan = by_class[ct] = self._plan_for(ct)
                plans[nid] = plan
            keys = self._keys(order, inputs, plans, resolver, env, run)
            hits, needed = self._lookup(keys, v.outputs, inputs)
            to_run = [n for n in order if n in needed and n not in hits]

            if emit is not None:
                emit(ev.ExecutionStart(report.prompt_id, tuple(to_run)))
                emit(ev.ExecutionCached(report.prompt_id, tuple(hits)))
            for nid, entry in hits.items():
                values[nid] = entry.outputs
                meta = entry.meta
                nodes[nid] = NodeReport(plans[nid].class_type, "cached", 0.0, meta.get("precision"),
                                        meta.get("nan_fallback", False))
                if entry.ui:
                    report.ui[nid] = entry.ui
                    files = _ui_files(entry.ui, env)
                    if files:
                        report.outputs[nid] = files
                    if emit is not None and nid in needed:
                        emit(ev.Executed(report.prompt_id, nid, entry.ui))

        current = None
        try:
            with torch.inference_mode():
                for nid in to_run:
                    current = nid
                    if interrupt.is_set():
                        raise Interrupted(f"interrupted before node {nid}", nid, plans[nid].class_type)
                    self._execute(nid, plans[nid], inputs[nid], keys[nid], values, resolver, env,
                                  run)
        except (Interrupted, KeyboardInterrupt) as e:
            report.status, report.error = "interrupted", "interrupted"
            report.seconds = time.perf_counter() - t_start
            if emit is not None:
                emit(ev.ExecutionInterrupted(
                    report.prompt_id, current, plans[current].class_type if current else None,
                    tuple(nodes)))
                emit(ev.Executing(report.prompt_id, None))
            err = e if isinstance(e, Interrupted) else Interrupted("interrupted", current)
            err.report = report
            if err is e:
                raise
            raise err from e
        except NodeError as e:
            report.status, report.error = "error", str(e)
            report.seconds = time.perf_counter() - t_start
            cause = e.__cause__ or e
            if emit is not None:
                call = inputs[current]
                emit(ev.ExecutionError(
                    report.prompt_id, current, plans[current].class_type, str(cause),
                    type(cause).__name__,
                    tuple(traceback.format_exception(type(cause), cause, cause.__traceback__)),
                    tuple(nodes),
                    {k: [_short(x)] for k, x in call.items() if type(x) is not Link},
                    tuple(n for n in nodes if nodes[n].status == "executed")))
                emit(ev.Executing(report.prompt_id, None))
            e.report = report
            raise
        report.status = "success"
        report.seconds = time.perf_counter() - t_start
        if emit is not None:
            emit(ev.ExecutionSuccess(report.prompt_id))
            emit(ev.Executing(report.prompt_id, None))
        return report

    def _lookup(self, keys, outputs, inputs) -> tuple[dict, dict]:
        """Cache hits (one batched lookup), and the nodes needed: walk back from the outputs,
        stopping at hits."""
        hits = self.cache.get_many(keys)
        return hits, walk(outputs, lambda n: links_of(inputs[n]), hits)

    def _keys(self, order, inputs, plans, resolver, env, run) -> dict[str, bytes | None]:
        """Every node's structural key, in topological order (an upstream key is ready when its
        consumer needs it). O(inputs) per node: keys are fixed-size digests."""
        keys: dict[str, bytes | None] = {}
        policy = resolver.policy
        for nid in order:
            plan = plans[nid]
            if not plan.deterministic:
                keys[nid] = None
                continue
            lits = {}
            links = []
            for name, x in inputs[nid].items():
                if type(x) is Link:
                    k = keys[x.node_id]
                    if k is None:
                        break
                    links.append((name, k, x.slot))
                else:
                    lits[name] = x
            else:
                types = plan.model_types
                prec = ";".join(f"{t}={policy(nid, t).spec}" for t in types) if types else ""
                if plan.fingerprint is None and not plan.unique_id:
                    keys[nid] = node_key(plan.key_header, lits, links, prec)
                    continue
                external = None
                if plan.fingerprint is not None:
                    try:
                        external = plan.fingerprint(env, **lits)
                    except Exception as e:  # noqa: BLE001 - no fingerprint: always re-run, say why
                        run.warn(f"fingerprint failed ({type(e).__name__}: {e}); not cached", nid)
                        keys[nid] = None
                        continue
                if plan.unique_id:
                    external = (external, nid)
                keys[nid] = node_key(plan.key_header, lits, links, prec, external)
                continue
            keys[nid] = None   # an upstream node has no key
        return keys

    def _call(self, nid, plan, call, values, resolver, env, run, fallback: bool):
        kwargs = {}
        for name in plan.names:
            x = call.get(name, _MISSING)
            if x is _MISSING:
                kwargs[name] = plan.defaults[name]
            elif type(x) is Link:
                kwargs[name] = values[x.node_id][x.slot]
            else:
                kwargs[name] = x
        if plan.spec.extra_inputs:   # undeclared links, validated, for a **kwargs function
            for name, x in call.items():
                if name not in kwargs and type(x) is Link:
                    kwargs[name] = values[x.node_id][x.slot]
        for pname, kind in plan.hidden:
            kwargs[pname] = run.hidden(kind, nid)
        ctx = None
        if plan.wants_ctx:
            ctx = Context(nid, plan.class_type, env, resolver.resolve(nid), run,
                          extra_data=run.extra_data, fallback_f32=fallback,
                          precision_types=plan.model_types)
            kwargs["ctx"] = ctx
        ret = plan.fn(**kwargs)
        ui = None
        if type(ret) is Result:
            ui, ret = ret.ui, ret.values
        if type(ret) is not tuple:
            ret = () if ret is None and plan.n_out == 0 else (ret,)
        if len(ret) != plan.n_out:
            raise TypeError(f"returned {len(ret)} value(s); the node declares {plan.n_out} output(s)")
        return ret, ui, ctx

    def _execute(self, nid, plan, call, key, values, resolver, env, run) -> None:
        emit = run.on_event
        if emit is not None:
            emit(ev.Executing(run.prompt_id, nid, plan.class_type))
        t0 = time.perf_counter()
        fell_back = False
        try:
            out, ui, ctx = self._call(nid, plan, call, values, resolver, env, run, False)
            used = _used_policies(ctx, plan, resolver, nid)
            if any(p.is_half for p in used) and _nonfinite(out):
                half = ",".join(p.spec for p in used if p.is_half)
                f32 = ",".join(resolve(p, f32_compute=True).spec for p in used)
                msg = (f"node {nid} ({plan.class_type}) produced NaN/Inf under {half}; "
                       f"re-running it with f32 compute ({f32})")
                log.warning(msg)
                run.report.warnings.append(msg)
                if emit is not None:
                    emit(ev.NanFallback(run.prompt_id, nid, plan.class_type, half, f32, msg))
                fell_back = True
                out, ui, ctx = self._call(nid, plan, call, values, resolver, env, run, True)
                used = _used_policies(ctx, plan, resolver, nid, fallback=True)
                if _nonfinite(out):
                    raise NonFiniteOutput(
                        f"outputs hold NaN/Inf even with f32 compute (after {half} gave NaN/Inf); "
                        f"the inputs or the model weights are likely broken")
        except (Interrupted, KeyboardInterrupt, NodeError):
            raise
        except Exception as e:  # noqa: BLE001 - any node failure becomes a NodeError
            raise NodeError(nid, plan.class_type, e) from e
        seconds = time.perf_counter() - t0
        precision = ",".join(dict.fromkeys(p.spec for p in used)) or None
        values[nid] = out
        report = run.report
        report.nodes[nid] = NodeReport(plan.class_type, "executed", seconds, precision, fell_back)
        if ui:
            report.ui[nid] = ui
            files = _ui_files(ui, env)
            if files:
                report.outputs[nid] = files
        if key is not None:
            self.cache.put(key, out, ui, {"precision": precision, "nan_fallback": fell_back})
        if emit is not None and ui:
            emit(ev.Executed(run.prompt_id, nid, ui))


def _used_policies(ctx: Context | None, plan: _NodePlan, resolver: Resolver, nid: str,
                   fallback: bool = False) -> list:
    """What the node ran under: its reports, else the policies resolved for its model inputs."""
    if ctx is None:
        return []
    if ctx.used:
        return list(ctx.used)
    return [resolve(resolver.policy(nid, t), f32_compute=fallback) for t in plan.model_types]
