"""Running a prompt's nodes: the ready queue, waits, lazy inputs, expansion, async nodes.

`Scheduler.drive()` starts from the nodes the outputs need (validation's topological order,
cache hits left out) and runs them first-ready first. What ComfyUI's execution model adds
(docs/subsystems.md, "Dynamic execution") is handled where it happens:

* a node whose input is not computed yet (an async node still running, an expansion not yet
  resolved) waits on it and is woken when it completes;
* lazy inputs: links of `Input.lazy` inputs are not followed when planning; before the node
  runs, its `check_lazy_status` gets the inputs (unevaluated lazy ones None) and names those it
  needs; their branches are scheduled in front of the node, which waits and is asked again;
* expansion: a body returning `Result(expand=GRAPH)` adds GRAPH's nodes (renamed, keyed and
  looked up in the cache like any other node), schedules what its result links need and
  resolves its outputs from them when they are done;
* async bodies run on the executor's loop thread (`graph.aio`) while ready nodes continue;
* list mapping (`graph.lists`) and `ExecutionBlocker` (`graph.blocker`) act per call.

When nothing is ready, nothing runs and something still waits, the waits form a cycle made at
run time: an execution error naming the waiting nodes, never a hang. So is an expansion chain
longer than `Executor.max_expanded_nodes` (a loop whose condition never holds).

Single-valued synchronous nodes go the short way: gather, call, store, wake.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from mixgraph.graph import events as ev
from mixgraph.graph.aio import gather_calls
from mixgraph.graph.blocker import ExecutionBlocker
from mixgraph.graph.cache import walk_tensors
from mixgraph.graph.context import Context, Interrupted
from mixgraph.graph.dynamic import group, grows_of, member_names
from mixgraph.graph.expand import expansion, is_link
from mixgraph.graph.loops import ExecutionList, loop_bodies
from mixgraph.graph.lists import Elements, call_kwargs, find_blocker, merge_results, merge_ui
from mixgraph.graph.node import Result
from mixgraph.graph.plan import CYCLE_LISTED, topological
from mixgraph.graph.precision import resolve
from mixgraph.graph.prompt import Link
from mixgraph.graph.report import DependencyCycleError, NodeError, NodeReport, NonFiniteOutput
from mixgraph.graph.spec import NodeSpec

__all__ = ["NodePlan", "Scheduler", "ui_files"]

log = logging.getLogger("mixgraph")
_MISSING = object()


class NodePlan:
    """What the executor needs about a node type, computed once per spec."""

    __slots__ = ("spec", "fn", "names", "defaults", "hidden", "model_types", "n_out", "unique_id",
                 "wants_ctx", "deterministic", "fingerprint", "version", "class_type",
                 "key_header", "lazy", "check_lazy", "input_is_list", "list_out", "any_list_out",
                 "output_node", "required", "out_types", "grows")

    def __init__(self, spec: NodeSpec, key_header: str):
        self.spec = spec
        self.fn = spec.fn
        self.class_type = spec.name
        self.names = tuple(n for n, _ in spec.inputs)
        # An absent input gets its declared default (optional sockets: None).
        self.defaults = {n: (i.default if i.has_default else None) for n, i in spec.inputs}
        self.required = tuple(n for n, i in spec.inputs
                              if not i.optional and not i.has_default and i.grow is None)
        # autogrow groups (graph.dynamic): members arrive as `<name>.<member>`, the body gets a dict
        self.grows = grows_of(spec)
        self.hidden = tuple((n, h.kind) for n, h in spec.hidden)
        self.unique_id = any(k == "UNIQUE_ID" for _, k in self.hidden)
        self.model_types = spec.precision_types   # sorted; the precision part of the cache key
        self.n_out = len(spec.outputs)
        self.out_types = tuple(o.type for o in spec.outputs)   # what a persistent cache may keep
        self.wants_ctx = spec.wants_ctx
        self.deterministic = spec.deterministic
        self.fingerprint = spec.fingerprint
        self.version = spec.version
        self.key_header = key_header
        self.lazy = frozenset(n for n, i in spec.inputs if i.lazy)
        self.check_lazy = spec.check_lazy_status
        self.input_is_list = spec.input_is_list
        self.list_out = tuple(o.is_list for o in spec.outputs)
        self.any_list_out = any(self.list_out)
        self.output_node = spec.output_node


def nonfinite(values: Any) -> bool:
    for t in walk_tensors(values):
        if (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t).all()):
            return True
    return False


def ui_files(ui: dict | None, env: Any) -> list[str]:
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


def _awaiting(raws: list) -> bool:
    for r in raws:
        if inspect.isawaitable(r):
            return True
    return False


class Scheduler:
    """One run's execution state. `calls`: node id -> inputs (literals and `Link`s), `plans`,
    `keys`: per node; `to_run`: the planned nodes in topological order."""

    def __init__(self, ex: Any, run: Any, resolver: Any, env: Any, calls: dict, plans: dict,
                 keys: dict, to_run: list[str]):
        self.ex, self.run, self.resolver, self.env = ex, run, resolver, env
        self.calls, self.plans, self.keys = calls, plans, keys
        self.values: dict[str, tuple] = run.report.values
        self.lists: set[str] = run.report.lists
        self.ready = deque(to_run)
        self.queued = set(to_run)            # scheduled, not done
        self.waiting: dict[str, int] = {}    # node -> inputs it still waits for
        self.waiters: dict[str, list[str]] = {}
        self.pending: dict[str, tuple] = {}  # expanded node -> its results awaiting their links
        self.running: dict[str, tuple] = {}  # async node -> (future, what finishing needs)
        self.current: str | None = None
        self.expanded = 0
        self.blocked: set[str] = set()       # nodes every call of which an ExecutionBlocker stopped
        if any(p.spec.loop_boundary for p in plans.values()):
            self._mark_loops(list(calls))

    # --- the loop ------------------------------------------------------------------------------

    def drive(self) -> None:
        try:
            self._drive()
        finally:
            for fut, *_ in self.running.values():
                fut.cancel()

    def _drive(self) -> None:
        ready, values, waiting, running = self.ready, self.values, self.waiting, self.running
        interrupt = self.run.interrupt
        step = self.step
        while True:
            while ready:
                nid = ready.popleft()
                if nid in values or nid in waiting or nid in running:
                    continue
                self.current = nid
                if interrupt.is_set():
                    raise Interrupted(f"interrupted before node {nid}", nid,
                                      self.plans[nid].class_type)
                step(nid)
            if running:
                self._wait_async()
            elif waiting:
                self._deadlock()
            else:
                return

    def _deadlock(self) -> None:
        stuck = list(self.waiting)
        shown = ", ".join(stuck[:CYCLE_LISTED]) + (
            f" and {len(stuck) - CYCLE_LISTED} more" if len(stuck) > CYCLE_LISTED else "")
        first = stuck[0]
        self.current = first
        cause = DependencyCycleError(
            f"Dependency cycle detected: node(s) {shown} wait on each other's outputs (links "
            f"made while running, by node expansion or lazy inputs)")
        raise NodeError(first, self.plans[first].class_type, cause) from cause

    def wait(self, waiter: str, dep: str) -> None:
        self.waiting[waiter] = self.waiting.get(waiter, 0) + 1
        w = self.waiters.get(dep)
        if w is None:
            self.waiters[dep] = [waiter]
        else:
            w.append(waiter)

    def strong_ups(self, nid: str) -> list[str]:
        lazy = self.plans[nid].lazy
        return [x.node_id for name, x in self.calls[nid].items()
                if type(x) is Link and name not in lazy]

    def schedule(self, roots: list[str], waiter: str | None) -> None:
        """Queue what `roots` need that is neither done nor queued (in front, in topological
        order); `waiter` waits for the roots not done yet (and is queued again when none)."""
        values, queued = self.values, self.queued
        new: list[str] = []
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in seen or n in values or n in queued:
                continue
            if n not in self.calls:
                raise NodeError(waiter or n, self.plans[waiter].class_type if waiter else "?",
                                f"needs node {n}, which is not part of this run")
            seen.add(n)
            new.append(n)
            stack.extend(self.strong_ups(n))
        if new:
            ups = {n: [u for u in self.strong_ups(n) if u in seen] for n in new}
            order, stuck = topological(ups, new[::-1])
            if stuck:
                cause = DependencyCycleError(f"Dependency cycle detected among node(s) "
                                             f"{', '.join(stuck[:CYCLE_LISTED])}")
                raise NodeError(stuck[0], self.plans[stuck[0]].class_type, cause) from cause
            queued.update(new)
            self.ready.extendleft(reversed(order))
        if waiter is not None:
            for r in dict.fromkeys(roots):
                if r not in values:
                    self.wait(waiter, r)
            if waiter not in self.waiting:
                self.ready.appendleft(waiter)

    def _wake(self, nid: str) -> None:
        ws = self.waiters.pop(nid, None)
        if ws:
            woken = []
            waiting = self.waiting
            for w in ws:
                c = waiting[w] - 1
                if c:
                    waiting[w] = c
                else:
                    del waiting[w]
                    woken.append(w)
            self.ready.extendleft(reversed(woken))

    # --- one node ------------------------------------------------------------------------------

    def step(self, nid: str) -> None:
        plan = self.plans[nid]
        pend = self.pending.pop(nid, None)
        if pend is not None:
            self._resolve_expansion(nid, plan, pend)
            return
        call = self.calls[nid]
        values, lists = self.values, self.lists
        kwargs: dict[str, Any] = {}
        missing = unevaluated = listed = None
        blocker = None
        names = plan.names
        if plan.spec.extra_inputs:   # undeclared links, validated, for a **kwargs function,
            hidden = {p for p, _ in plan.hidden}       # and what the prompt gives a hidden input
            names = names + tuple(n for n, x in call.items()
                                  if (type(x) is Link or n in hidden) and n not in names)
        elif plan.spec.accept_all_inputs:   # undeclared literals as well
            names = names + tuple(n for n in call if n not in names)
        if plan.grows:
            grown = dict(plan.grows)
            names = tuple(n for n in names if n not in grown) + tuple(member_names(plan.grows, call))
        for name in names:
            x = call.get(name, _MISSING)
            if x is _MISSING:
                kwargs[name] = plan.defaults[name]
            elif type(x) is Link:
                out = values.get(x.node_id)
                if out is None:
                    if name in plan.lazy:
                        kwargs[name] = None
                        unevaluated = [name] if unevaluated is None else [*unevaluated, name]
                    elif missing is None:
                        missing = [x.node_id]
                    else:
                        missing.append(x.node_id)
                    continue
                v = out[x.slot]
                if lists and x.node_id in lists:
                    listed = [name] if listed is None else [*listed, name]
                elif type(v) is ExecutionBlocker:
                    blocker = blocker or v
                kwargs[name] = v
            else:
                kwargs[name] = x
        if missing is not None:
            self.schedule(missing, nid)
            return
        run = self.run
        emit = run.on_event
        if emit is not None:
            emit(ev.Executing(run.prompt_id, nid, plan.class_type, run.display.get(nid)))
        if plan.check_lazy is not None:
            need = self._lazy_needs(nid, plan, kwargs, listed, unevaluated or ())
            if need:
                self.schedule([call[n].node_id for n in need], nid)
                return
        if listed is None and not plan.input_is_list:
            self._execute(nid, plan, [kwargs], plan.any_list_out, blocker)
        else:
            # an input_is_list node is called once: list-valued only through its list outputs
            listy = plan.any_list_out or (listed is not None and not plan.input_is_list)
            self._execute(nid, plan, call_kwargs(kwargs, listed or (), plan.input_is_list),
                          listy, _MISSING)

    def _lazy_needs(self, nid, plan, kwargs, listed, unevaluated) -> list[str]:
        if not unevaluated:
            return []
        asked: list = []
        try:
            for kw in call_kwargs(self._with_hidden(nid, plan, dict(kwargs)), listed or (),
                                  plan.input_is_list):
                r = plan.check_lazy(**(group(kw, plan.grows) if plan.grows else kw))
                if inspect.isawaitable(r):
                    r = self.ex.aio.submit(r).result()
                if isinstance(r, (list, tuple)):
                    asked.extend(r)
        except (Interrupted, KeyboardInterrupt, NodeError):
            raise
        except Exception as e:  # noqa: BLE001 - a failing check is the node's failure
            raise NodeError(nid, plan.class_type, e) from e
        return [n for n in dict.fromkeys(asked) if isinstance(n, str) and n in unevaluated]

    def _with_hidden(self, nid: str, plan: NodePlan, kw: dict) -> dict:
        if plan.hidden:
            hidden = self.run.hidden
            for pname, kind in plan.hidden:
                value = hidden(kind, nid)
                if value is not None or pname not in kw:   # see _invoke
                    kw[pname] = value
        return kw

    def _execute(self, nid, plan, kw_list, listy, blocker) -> None:
        t0 = time.perf_counter()
        try:
            raws, ctx = self._invoke(nid, plan, kw_list, False, blocker)
        except (Interrupted, KeyboardInterrupt, NodeError):
            raise
        except Exception as e:  # noqa: BLE001 - any node failure becomes a NodeError
            raise NodeError(nid, plan.class_type, e) from e
        if _awaiting(raws):
            fut = self.ex.aio.submit(gather_calls(raws))
            self.running[nid] = (fut, plan, kw_list, listy, ctx, t0)
            return
        self._finish(nid, plan, kw_list, listy, raws, ctx, t0, False)

    def _invoke(self, nid, plan, kw_list, fallback, blocker) -> tuple[list, Context | None]:
        run = self.run
        ctx = None
        if plan.wants_ctx:
            real = run.real.get(nid, nid) if run.real else nid
            ctx = Context(nid, plan.class_type, self.env, self.resolver.resolve(real), run,
                          extra_data=run.extra_data, fallback_f32=fallback,
                          precision_types=plan.model_types)
        hidden = [(p, run.hidden(k, nid)) for p, k in plan.hidden] if plan.hidden else ()
        single = blocker is not _MISSING     # one call, its blocker (or None) already found
        fn = plan.fn
        raws = []
        n_blocked = 0
        for kw in kw_list:
            b = blocker if single else find_blocker(kw, plan.input_is_list)
            if b is not None:
                raws.append(self._blocked(nid, plan, b))
                n_blocked += 1
                continue
            for p, value in hidden:
                # a hidden input of a kind the run does not fill (a pack's own, ComfyUI's test
                # pack's "*") that the prompt gives keeps the prompt's value, as in ComfyUI
                if value is None and p in kw:
                    continue
                kw[p] = [value] if plan.input_is_list else value
            if ctx is not None:
                kw["ctx"] = ctx
            raws.append(fn(**(group(kw, plan.grows) if plan.grows else kw)))
        if n_blocked and n_blocked == len(kw_list):
            self.blocked.add(nid)
        return raws, ctx

    def _blocked(self, nid: str, plan: NodePlan, b: ExecutionBlocker) -> ExecutionBlocker:
        """ComfyUI's execution_block_cb: a message is reported once, as an execution_error of
        the first node it stops; the prompt goes on."""
        if b.message is None:
            return b
        run = self.run
        text = f"Execution Blocked: {b.message}"
        log.warning("node %s (%s): %s", nid, plan.class_type, text)
        run.report.warnings.append(f"node {nid}: {text}")
        if run.on_event is not None:
            nodes = run.report.nodes
            run.on_event(ev.ExecutionError(
                run.prompt_id, nid, plan.class_type, text, "ExecutionBlocked", (),
                tuple(n for n in nodes if nodes[n].status == "executed"), [], ()))
        return ExecutionBlocker(None)

    def _wait_async(self) -> None:
        running = self.running
        futs = {entry[0]: nid for nid, entry in running.items()}
        interrupt = self.run.interrupt
        while True:
            done, _ = concurrent.futures.wait(futs, timeout=0.05,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            if done:
                break
            if interrupt.is_set():
                nid = next(iter(running))
                raise Interrupted(f"interrupted while node {nid} ran", nid,
                                  self.plans[nid].class_type)
        for nid in [futs[f] for f in futs if f in done]:
            fut, plan, kw_list, listy, ctx, t0 = running.pop(nid)
            self.current = nid
            try:
                raws = fut.result()
            except (Interrupted, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - any node failure becomes a NodeError
                raise NodeError(nid, plan.class_type, e) from e
            self._finish(nid, plan, kw_list, listy, raws, ctx, t0, False)

    def _finish(self, nid, plan, kw_list, listy, raws, ctx, t0, fell_back) -> None:
        """A node's calls returned `raws`: results, UI, expansion, NaN guard, store."""
        n_out = plan.n_out
        if not listy and len(raws) == 1 and not fell_back and ctx is None:
            # the common case: one call, a plain result, no model policy to guard
            ret = raws[0]
            t = type(ret)
            ui = None
            if t is Result and ret.expand is None:
                ui, ret = ret.ui or None, ret.values
                t = type(ret)
            if t is not tuple and t is not Result and not isinstance(ret, ExecutionBlocker) and \
                    not (ret is None and n_out == 0):
                ret, t = (ret,), tuple
            if t is tuple and len(ret) == n_out:
                self.complete(nid, plan, ret, False, ui, None, False,
                              time.perf_counter() - t0, True)
                return
        results: list = []
        uis: list = []
        expands: list = []
        try:
            for i, ret in enumerate(raws):
                expand = None
                if type(ret) is Result:
                    if ret.ui:
                        uis.append(ret.ui)
                    expand, ret = ret.expand, ret.values
                if isinstance(ret, ExecutionBlocker):
                    ret = (ret,) * n_out
                elif type(ret) is not tuple:
                    ret = () if ret is None and n_out == 0 else \
                        tuple(ret) if isinstance(ret, tuple) else (ret,)
                if len(ret) != n_out:
                    raise TypeError(f"returned {len(ret)} value(s); the node declares {n_out} "
                                    f"output(s)")
                if expand is not None:
                    expands.append((i, expand, ret))
                results.append(ret)
            ui = merge_ui(uis)
            if expands:
                self._expand(nid, plan, results, expands, ui, listy, t0)
                return
            outs = results[0] if not listy and len(results) == 1 else \
                merge_results(results, plan.list_out, n_out)
            used = self._used(ctx, plan, nid, fell_back)
            if not fell_back and any(p.is_half for p in used) and nonfinite(outs):
                self._nan_fallback(nid, plan, kw_list, listy, used, t0)
                return
            if fell_back and nonfinite(outs):
                raise NonFiniteOutput(
                    "outputs hold NaN/Inf even with f32 compute (after half precision gave "
                    "NaN/Inf); the inputs or the model weights are likely broken")
        except (Interrupted, KeyboardInterrupt, NodeError):
            raise
        except Exception as e:  # noqa: BLE001 - any node failure becomes a NodeError
            raise NodeError(nid, plan.class_type, e) from e
        precision = ",".join(dict.fromkeys(p.spec for p in used)) or None
        self.complete(nid, plan, outs, listy, ui, precision, fell_back,
                      time.perf_counter() - t0, True)

    def _used(self, ctx, plan, nid, fallback) -> list:
        """What the node ran under: its reports, else the policies resolved for its model inputs."""
        if ctx is None:
            return []
        if ctx.used:
            return list(ctx.used)
        real = self.run.real.get(nid, nid) if self.run.real else nid
        return [resolve(self.resolver.policy(real, t), f32_compute=fallback)
                for t in plan.model_types]

    def _nan_fallback(self, nid, plan, kw_list, listy, used, t0) -> None:
        run = self.run
        half = ",".join(p.spec for p in used if p.is_half)
        f32 = ",".join(resolve(p, f32_compute=True).spec for p in used)
        msg = (f"node {nid} ({plan.class_type}) produced NaN/Inf under {half}; "
               f"re-running it with f32 compute ({f32})")
        log.warning(msg)
        run.report.warnings.append(msg)
        if run.on_event is not None:
            run.on_event(ev.NanFallback(run.prompt_id, nid, plan.class_type, half, f32, msg))
        raws, ctx = self._invoke(nid, plan, kw_list, True, _MISSING)
        if _awaiting(raws):
            raws = self.ex.aio.submit(gather_calls(raws)).result()
        self._finish(nid, plan, kw_list, listy, raws, ctx, t0, True)

    def complete(self, nid, plan, outs, listy, ui, precision, fell_back, seconds,
                 emit_ui: bool) -> None:
        run = self.run
        self.values[nid] = outs
        if listy:
            self.lists.add(nid)
        report = run.report
        status = "blocked" if self.blocked and nid in self.blocked else "executed"
        report.nodes[nid] = NodeReport(plan.class_type, status, seconds, precision, fell_back)
        if ui:
            report.ui[nid] = ui
            files = ui_files(ui, self.env)
            if files:
                report.outputs[nid] = files
            if emit_ui and run.on_event is not None:
                run.on_event(ev.Executed(run.prompt_id, nid, ui, run.display.get(nid)))
        key = self.keys.get(nid)
        if key is not None:
            self.ex.cache.put(key, outs, ui, {"precision": precision, "nan_fallback": fell_back,
                                              "list": listy, "types": plan.out_types})
        if self.waiters:
            self._wake(nid)

    # --- loops (graph/loops.py) ------------------------------------------------------------------

    def _mark_loops(self, ids: list[str]) -> None:
        calls, plans = self.calls, self.plans
        marks = loop_bodies(
            ids, lambda n: [x.node_id for x in calls[n].values() if type(x) is Link] if n in calls else [],
            lambda n: plans[n].spec.loop_boundary if n in plans else None)
        if marks:
            dyn = self.run.dynprompt
            for start, (body, end) in marks.items():
                dyn.loop_marks[start] = {"_loop_body": body, "_loop_end": end}
        if self.run.execution_list is None:
            self.run.execution_list = ExecutionList(self)

    def hold(self, nid: str) -> None:
        """An external block: `nid` waits until `release(nid)`."""
        self.waiting[nid] = self.waiting.get(nid, 0) + 1

    def release(self, nid: str) -> None:
        c = self.waiting.get(nid, 0) - 1
        if c > 0:
            self.waiting[nid] = c
        else:
            self.waiting.pop(nid, None)
            if nid not in self.values:
                self.ready.appendleft(nid)

    def inhibit(self, ids: set[str]) -> None:
        """Drop pending nodes: they never run; what waited on them waits no more for them."""
        ids = {n for n in ids if n not in self.values and n != self.current}
        if not ids:
            return
        waiting, waiters = self.waiting, self.waiters
        for n in ids:
            waiting.pop(n, None)
            self.queued.discard(n)
        for dep in list(waiters):
            kept = [w for w in waiters[dep] if w not in ids]
            if kept:
                waiters[dep] = kept
            else:
                del waiters[dep]
        woken = []
        for n in ids:
            for w in waiters.pop(n, ()):
                c = waiting.get(w, 0) - 1
                if c > 0:
                    waiting[w] = c
                elif w in waiting:
                    del waiting[w]
                    woken.append(w)
        kept = [n for n in self.ready if n not in ids]
        self.ready.clear()
        self.ready.extend(kept)
        self.ready.extendleft(reversed(woken))

    def override(self, nid: str, inputs: dict) -> None:
        """Replace a pending node's inputs (API form) in the run and in DYNPROMPT."""
        if nid in self.values:
            raise RuntimeError(f"node {nid} already ran; its inputs cannot be replaced")
        dyn = self.run.dynprompt
        dyn.override_node(nid, {"class_type": self.plans[nid].class_type, "inputs": dict(inputs)})
        self.calls[nid] = {k: Link(str(v[0]), v[1]) if is_link(v) else v for k, v in inputs.items()}

    # --- expansion -----------------------------------------------------------------------------

    def _expand(self, nid, plan, results, expands, ui, listy, t0) -> None:
        run = self.run
        if ui:
            run.report.ui[nid] = ui
            if run.on_event is not None:
                run.on_event(ev.Executed(run.prompt_id, nid, ui, run.display.get(nid)))
        links: list[str] = []
        outputs: list[str] = []
        for i, graph, values in expands:
            try:
                e = expansion(graph, values, nid, i)
            except ValueError as err:
                raise NodeError(nid, plan.class_type, err) from err
            self._add_nodes(nid, plan, e)
            results[i] = e.values
            links += [v.node_id for v in e.values if type(v) is Link]
            outputs += [n for n in e.calls if self.plans[n].output_node]
        self.pending[nid] = (results, ui, listy, t0)
        if outputs:
            self.schedule(outputs, None)
        self.schedule(links, nid)

    def _add_nodes(self, parent: str, parent_plan: NodePlan, e: Any) -> None:
        run, calls, plans = self.run, self.calls, self.plans
        self.expanded += len(e.calls)
        limit = self.ex.max_expanded_nodes
        if self.expanded > limit:
            raise NodeError(parent, parent_plan.class_type,
                            f"node expansion made more than {limit} nodes in this prompt (a loop "
                            f"whose end condition never holds?)")
        dyn = run.dynprompt
        real = run.real.get(parent, parent)
        for nid, call in e.calls.items():
            if nid in calls or dyn.has_node(nid):
                raise NodeError(parent, parent_plan.class_type,
                                f"expanded node id {nid} is already in the prompt")
            spec = self.ex.registry.get(call.class_type)
            if spec is None:
                raise NodeError(parent, parent_plan.class_type, f"expanded node {nid}: node "
                                f"class {call.class_type} does not exist")
            plan = self.ex.plan_for(call.class_type)
            gone = [n for n in plan.required if n not in call.inputs]
            if gone:
                raise NodeError(parent, parent_plan.class_type, f"expanded node {nid} "
                                f"({call.class_type}): required input(s) {', '.join(gone)} missing")
            plans[nid] = plan
        for nid, call in e.calls.items():
            for name, x in call.inputs.items():
                if type(x) is Link:
                    src = plans.get(x.node_id)
                    if src is None or (x.node_id not in calls and x.node_id not in e.calls):
                        raise NodeError(parent, parent_plan.class_type, f"expanded node {nid} "
                                        f"input {name} links to node {x.node_id}, which is not "
                                        f"in this run")
                    if not 0 <= x.slot < src.n_out:
                        raise NodeError(parent, parent_plan.class_type, f"expanded node {nid} "
                                        f"input {name} links to output {x.slot} of node "
                                        f"{x.node_id}, which has {src.n_out} output(s)")
            calls[nid] = call.inputs
            run.real[nid] = real
            shown = e.display[nid]
            run.display[nid] = run.display.get(shown, shown)
            dyn.add_ephemeral_node(nid, e.raw[nid], parent, shown)
        ups = {n: [x.node_id for x in c.inputs.values() if type(x) is Link and x.node_id in e.calls]
               for n, c in e.calls.items()}
        order, stuck = topological(ups, list(e.calls))
        if stuck:
            cause = DependencyCycleError(f"Dependency cycle detected in the graph node {parent} "
                                         f"expanded into: {', '.join(stuck[:CYCLE_LISTED])}")
            raise NodeError(parent, parent_plan.class_type, cause) from cause
        self.ex.keys_into(self.keys, order, calls, plans, self.resolver, self.env, run, run.real)
        if any(plans[n].spec.loop_boundary for n in order):
            self._mark_loops(order)
        self._cached(order)

    def _cached(self, ids: list[str]) -> None:
        """Expanded nodes found in the cache: done at once, as at the start of a run."""
        keys = {n: self.keys[n] for n in ids if self.keys.get(n) is not None}
        if not keys:
            return
        run = self.run
        for nid, entry in self.ex.cache.get_many(keys).items():
            self.values[nid] = entry.outputs
            meta = entry.meta
            if meta.get("list"):
                self.lists.add(nid)
            run.report.nodes[nid] = NodeReport(self.plans[nid].class_type, "cached", 0.0,
                                               meta.get("precision"), meta.get("nan_fallback", False))
            if entry.ui:
                run.report.ui[nid] = entry.ui
                files = ui_files(entry.ui, self.env)
                if files:
                    run.report.outputs[nid] = files
                if run.on_event is not None:
                    run.on_event(ev.Executed(run.prompt_id, nid, entry.ui, run.display.get(nid)))

    def _resolve_expansion(self, nid, plan, pend) -> None:
        results, ui, listy, t0 = pend
        values, lists = self.values, self.lists
        resolved = []
        for ret in results:
            row = []
            for v in ret:
                if type(v) is Link:
                    src = v.node_id
                    value = values[src][v.slot]
                    if src in lists:
                        value = Elements(value)
                        listy = True
                    row.append(value)
                else:
                    row.append(v)
            resolved.append(tuple(row))
        try:
            outs = resolved[0] if not listy and len(resolved) == 1 else \
                merge_results(resolved, plan.list_out, plan.n_out)
        except TypeError as e:
            raise NodeError(nid, plan.class_type, e) from e
        self.complete(nid, plan, outs, listy, ui, None, False, time.perf_counter() - t0, False)
