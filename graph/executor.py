"""The executor: validate, plan, look up the cache, run what is missing (DESIGN §4, §5).

    report = Executor(registry, env).run(workflow, precision="bf16,VAE=f32", on_event=print)

Planning is linear and recursion-free, so a 100,000-node chain runs: the order is the one
validation found (`graph.plan`: topological, ties broken by the prompt's node order, first ready
first run), and per node the rest is a digest, one batched cache lookup and the call itself. A
fully cached re-run makes no Context and sends no per-node event (one `execution_cached` lists
them all). Only ancestors of the valid output nodes run, and of those only the ones not cached
and needed by something uncached (an evicted ancestor of a cached node is not re-run).

A node's cache key depends on the graph and the declarations only, never on earlier runs: its
precision part is the resolved policy of each socket type in the spec's `precision_types` (and of
each further role registered for it: `Resolver.key_spec`), and `ctx.policy_for` refuses a type
the node did not declare. ComfyUI stops a prompt at its first failing node; so does this, and
everything computed before the failure stays cached.

NaN guard: a node that ran under a half-precision compute policy (what it reported through
`ctx.used_precision`, else the policy resolved for its model inputs) and returned a non-finite
float tensor anywhere in its outputs is re-run once, alone, with `ctx.fallback_f32` set and f32
compute; a warning event is sent and the report says `nan_fallback: true`. Still non-finite: an
error naming the node.

ComfyUI's dynamic execution model (list mapping, lazy inputs, node expansion, blockers, async
nodes) lives in `graph.scheduler`, which runs the planned nodes; docs/subsystems.md, "Dynamic
execution", has the rules. Expanded nodes get keys here like any other node.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
import uuid
from typing import Any, Callable, Iterable

import torch

from mixgraph.graph import events as ev
from mixgraph.graph.aio import AsyncRunner
from mixgraph.graph.cache import OutputCache, key_header, node_key
from mixgraph.graph.context import Interrupted
from mixgraph.graph.dynprompt import DynamicPrompt
from mixgraph.graph.env import Env
from mixgraph.graph.precision import Resolver, parse_precision_arg
from mixgraph.graph.prompt import Link, Workflow, WorkflowError
from mixgraph.graph.report import (DependencyCycleError, ExecutionFailed, NodeError, NodeReport,
                                   NonFiniteOutput, RunReport, ValidationFailed)
from mixgraph.graph.scheduler import NodePlan, Scheduler, ui_files
from mixgraph.graph.validate import Validation, gc_paused, validate
from mixgraph.graph.formats.workflow import dump_api, load_workflow

__all__ = ["Executor", "RunReport", "NodeReport", "ExecutionFailed", "ValidationFailed",
           "NodeError", "Interrupted", "DependencyCycleError"]

log = logging.getLogger("mixgraph")
_MISSING = object()


class _Run:
    """Per-run state shared with the nodes' Contexts and the scheduler. `display` and `real`
    map expanded node ids to the node a client shows and to the original node they descend
    from (whose precision region they inherit)."""

    __slots__ = ("prompt_id", "on_event", "interrupt", "report", "workflow", "extra_data",
                 "_api_prompt", "display", "real", "_dynprompt", "execution_list")

    def __init__(self, prompt_id, on_event, interrupt, report, workflow, extra_data):
        self.prompt_id = prompt_id
        self.on_event = on_event
        self.interrupt = interrupt
        self.report = report
        self.workflow = workflow
        self.extra_data = extra_data
        self._api_prompt = _MISSING
        self.display: dict[str, str] = {}
        self.real: dict[str, str] = {}
        self._dynprompt: DynamicPrompt | None = None
        self.execution_list: Any = None   # graph.loops.ExecutionList, set by the scheduler

    def progress(self, node_id: str, value: int, total: int, preview: Any = None) -> None:
        if self.on_event is not None:
            node = self.display.get(node_id, node_id) if self.display else node_id
            self.on_event(ev.Progress(self.prompt_id, node, int(value), int(total), preview))

    def warn(self, message: str, node_id: str | None = None) -> None:
        text = f"node {node_id}: {message}" if node_id else message
        # marked when an event carries it too: a consumer that prints the event (the terminal's
        # progress bar) keeps Python's last-resort handler from printing it a second time
        log.warning(text, extra={"mixgraph_event": self.on_event is not None})
        self.report.warnings.append(text)
        if self.on_event is not None:
            self.on_event(ev.Warning(self.prompt_id, message, node_id))

    def api_prompt(self) -> dict:
        if self._api_prompt is _MISSING:
            self._api_prompt = dump_api(self.workflow)
        return self._api_prompt

    @property
    def dynprompt(self) -> DynamicPrompt:
        if self._dynprompt is None:
            self._dynprompt = DynamicPrompt(self.api_prompt, self.workflow.prompt)
        return self._dynprompt

    def hidden(self, kind: str, node_id: str) -> Any:
        if kind == "UNIQUE_ID":
            return node_id
        if kind == "PROMPT":
            return self.api_prompt()
        if kind == "EXTRA_PNGINFO":
            return self.extra_data.get("extra_pnginfo")
        if kind == "DYNPROMPT":
            return self.dynprompt
        if kind == "EXECUTION_LIST":
            return self.execution_list
        return None


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
    `cache` picks the cache mode (`graph.cache.make_cache`: default, LRU by count, none, RAM
    pressure). Async node bodies run on `aio`, a loop thread of this executor.
    """

    #: Nodes node expansion may add to one prompt before the run fails (an endless loop).
    max_expanded_nodes = 1_000_000

    def __init__(self, registry: Any, env: Env | None = None, cache: OutputCache | None = None):
        self.registry = registry
        self.env = env or Env()
        self.cache = cache if cache is not None else OutputCache()
        self.interrupt_event = threading.Event()
        self.aio = AsyncRunner()
        self._plans: dict[str, NodePlan] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def interrupt(self) -> None:
        self.interrupt_event.set()

    def plan_for(self, class_type: str) -> NodePlan:
        spec = self.registry.get(class_type)
        plan = self._plans.get(class_type)
        if plan is None or plan.spec is not spec:
            plan = self._plans[class_type] = NodePlan(spec, key_header(spec.name, spec.version))
        return plan

    _plan_for = plan_for

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
        outputs are dropped and the valid ones run (ComfyUI's server behaviour). `targets`:
        the output nodes to run (ComfyUI's partial_execution_targets), with what they need."""
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

        inputs = dict(v.inputs)     # grows with expanded nodes
        prompt = wf.prompt
        emit = on_event
        values = report.values
        nodes = report.nodes
        with gc_paused():
            order = v.order
            by_class: dict[str, NodePlan] = {}
            plans = {}
            for nid in order:
                ct = prompt[nid].class_type
                plan = by_class.get(ct)
                if plan is None:
                    plan = by_class[ct] = self.plan_for(ct)
                plans[nid] = plan
            keys = self._keys(order, inputs, plans, resolver, env, run)
            hits, needed = self._lookup(keys, v.outputs, inputs, plans)
            to_run = [n for n in order if n in needed and n not in hits]

            if emit is not None:
                emit(ev.ExecutionStart(report.prompt_id, tuple(to_run)))
                emit(ev.ExecutionCached(report.prompt_id, tuple(hits)))
            for nid, entry in hits.items():
                values[nid] = entry.outputs
                meta = entry.meta
                if meta.get("list"):
                    report.lists.add(nid)
                nodes[nid] = NodeReport(plans[nid].class_type, "cached", 0.0, meta.get("precision"),
                                        meta.get("nan_fallback", False))
                if entry.ui:
                    report.ui[nid] = entry.ui
                    files = ui_files(entry.ui, env)
                    if files:
                        report.outputs[nid] = files
                    if emit is not None and nid in needed:
                        emit(ev.Executed(report.prompt_id, nid, entry.ui))

        sched = Scheduler(self, run, resolver, env, inputs, plans, keys, to_run)
        try:
            with torch.inference_mode():
                sched.drive()
        except (Interrupted, KeyboardInterrupt) as e:
            current = sched.current
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
            current = e.node_id
            report.status, report.error = "error", str(e)
            report.seconds = time.perf_counter() - t_start
            cause = e.__cause__ or e
            if emit is not None:
                call = inputs.get(current, {})
                emit(ev.ExecutionError(
                    report.prompt_id, current, e.class_type, str(cause),
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

    def _lookup(self, keys, outputs, inputs, plans) -> tuple[dict, dict]:
        """Cache hits (one batched lookup), and the nodes needed: walk back from the outputs
        along the links of non-lazy inputs, stopping at hits (`OutputCache.lookup`; with a
        persistent second level, only the stored hits the walk reaches are loaded)."""

        def upstream(n: str) -> list[str]:
            lazy = plans[n].lazy
            if lazy:
                return [x.node_id for name, x in inputs[n].items()
                        if type(x) is Link and name not in lazy]
            return [x.node_id for x in inputs[n].values() if type(x) is Link]

        return self.cache.lookup(keys, outputs, upstream)

    def _keys(self, order, inputs, plans, resolver, env, run) -> dict[str, bytes | None]:
        """Every node's structural key, in topological order (an upstream key is ready when its
        consumer needs it). O(inputs) per node: keys are fixed-size digests."""
        keys: dict[str, bytes | None] = {}
        self.keys_into(keys, order, inputs, plans, resolver, env, run)
        return keys

    def keys_into(self, keys, order, inputs, plans, resolver, env, run, real=None) -> None:
        """`_keys` into an existing dict (expanded nodes join the run's keys). `real` maps
        expanded ids to the original node whose precision region they inherit. A fingerprint
        (IS_CHANGED) is computed here, once per node per prompt; a NaN fingerprint means the
        node is never a cache hit (nor anything downstream)."""
        key_spec = resolver.key_spec
        for nid in order:
            plan = plans[nid]
            if not plan.deterministic:
                keys[nid] = None
                continue
            lits = {}
            links = []
            for name, x in inputs[nid].items():
                if type(x) is Link:
                    k = keys.get(x.node_id)
                    if k is None:
                        break
                    links.append((name, k, x.slot))
                else:
                    lits[name] = x
            else:
                types = plan.model_types
                if types:
                    where = real.get(nid, nid) if real else nid
                    prec = ";".join(f"{t}={key_spec(where, t)}" for t in types)
                else:
                    prec = ""
                if plan.output_node:     # its results name files in this run's output folder:
                    prec += f";output={getattr(env, 'output', '')}"  # another folder: another result
                if plan.fingerprint is None and not plan.unique_id:
                    keys[nid] = node_key(plan.key_header, lits, links, prec)
                    continue
                external = None
                if plan.fingerprint is not None:
                    try:
                        external = plan.fingerprint(env, **lits)
                    except Exception as e:  # noqa: BLE001 - no fingerprint: always re-run, say why
                        if run is not None:
                            run.warn(f"fingerprint failed ({type(e).__name__}: {e}); not cached",
                                     nid)
                        keys[nid] = None
                        continue
                    if isinstance(external, float) and math.isnan(external):
                        keys[nid] = None     # ComfyUI's IS_CHANGED NaN: never equal, always run
                        continue
                if plan.unique_id:
                    external = (external, nid)
                keys[nid] = node_key(plan.key_header, lits, links, prec, external)
                continue
            keys[nid] = None   # an upstream node has no key
