"""The Ray worker of `mixgraph serve --ray` (ui/ray/ray_pool.py is the front server's side): an actor
holding a full mixgraph executor, its output cache and its process's weight store.

`build_executor(WorkerOptions)` is the one place a worker's executor is made, from the server's
environment, node registry (or the node library plus custom-node flags) and cache options; a
server option that changes executors (a persistent output cache directory, say) goes there.
`ExecutorWorker.run` is a Ray streaming generator: the run's `graph.events` in chunks as they
happen (with the `PromptServer.send_sync` messages of custom node packs among them, as
`ui.comfy.client_messages.PackMessage`), then a `WorkerResult`. The actor runs with `max_concurrency > 1`, so `interrupt`,
`info` and `free` answer while a prompt runs.
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.ui.comfy.client_messages import worker_sink
from mixgraph.ui.comfy.comfy_flags import budget_cache
from mixgraph.ui.server.queue import execute
from mixgraph.ui.ray.ray_fanout import add_nodes

__all__ = ["WorkerOptions", "build_executor", "ExecutorWorker", "WorkerResult", "RayUnavailable",
           "ray_module"]

log = logging.getLogger("mixgraph.ui")

#: Events per chunk a worker sends at most (chunks go as soon as an event is waiting).
_CHUNK = 64


class RayUnavailable(RuntimeError):
    """`--ray` without the ray package, or a Ray cluster that cannot be reached."""


def ray_module() -> Any:
    """The `ray` package, or RayUnavailable saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("mixgraph serve --ray needs the ray package: "
                             "pip install 'mixgraph[ray]'") from None
    return ray


# --- what a worker is built from ---------------------------------------------------------------

@dataclass(frozen=True)
class WorkerOptions:
    """Everything a worker needs to build its executor; pickled to each actor.

    env: the server's folders, device and settings. cache: keywords of `graph.cache.make_cache`
    (the server's `--cache-*` flags). output_cache: (directory, GB) of `--output-cache` /
    `--output-cache-gb`, or None: every worker opens the same persistent output cache
    (`graph.persist`, safe for several processes) behind its in-memory cache, so a prompt one
    worker ran is served from disk on another, and after a restart. registry: a picklable factory returning the node registry
    (tests pass their toy registry's); None: the node library plus the custom node packs the
    flags in `custom_nodes` name (`ui.comfy.custom_nodes.load_from_args`'s attributes).
    memory: the front server's memory budgets, ((device, bytes, origin, mode), ...) for the CPU
    and the env's device (`nodes/models/memory_budget.py`), set in the worker's process before
    its executor is made; None: the worker's own defaults."""

    env: Env
    cache: dict = field(default_factory=dict)
    registry: Callable[[], Any] | None = None
    custom_nodes: dict | None = None
    output_cache: tuple[str, float] | None = None
    memory: tuple[tuple[str, int, str, str], ...] | None = None


def set_worker_budget(options: WorkerOptions) -> Any:
    """Set the front server's memory budgets (`options.memory`) in this worker process; returns
    the CPU budget in force. Bytes / 2**30 is exact in floating point: the bytes are the front's."""
    from mixgraph.nodes.models import memory_budget
    for device, nbytes, origin, mode in options.memory or ():
        memory_budget.set_budget(device, nbytes / memory_budget.GIB, mode=mode, origin=origin)
    return memory_budget.budget("cpu")


def build_executor(options: WorkerOptions) -> Executor:
    """The executor of one worker: the single place worker executors are made. The memory
    budgets are set first: the output cache's default byte bound is a share of the CPU one."""
    budget = set_worker_budget(options)
    if options.registry is not None:
        registry = options.registry()
    else:
        from mixgraph.ui.api import default_registry
        registry = default_registry()
        if options.custom_nodes is not None:
            from mixgraph.ui.comfy.custom_nodes import load_from_args
            load_from_args(SimpleNamespace(**options.custom_nodes), registry, options.env)
    add_nodes(registry)                  # FanOutListPart, for the parts of a list prompt
    cache = budget_cache(budget, **options.cache)
    if options.output_cache is not None:
        from mixgraph.graph.persist import DiskCache, TieredCache
        directory, gb = options.output_cache
        cache = TieredCache(cache, DiskCache(directory, int(gb * 2**30)))
    return Executor(registry, options.env, cache)


# --- the actor ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerResult:
    """The last item a worker's `run` yields: how the prompt ended, its UI outputs (what the
    history entry records, as `RunReport.ui`), and the worker's state after it."""

    status: str
    ui: dict
    held: tuple
    reads: dict
    memory: dict | None = None      # the run's memory section (`streaming.memory_section`)


def _held() -> tuple:
    """(fingerprint digest, storage dtype name, file name) of each file in the weight store."""
    from mixgraph.graph.fingerprint import fingerprint_file
    from mixgraph.nodes.weights import store
    out = []
    for path, dtype in store.held():
        try:
            digest = fingerprint_file(path).digest
        except OSError:
            continue
        out.append((digest, str(dtype).replace("torch.", ""), os.path.basename(path)))
    return tuple(out)


def _reads() -> dict:
    """{file name: times it was loaded}: reads of its most-read part (UNet, VAE, encoders)."""
    from mixgraph.nodes.weights import store
    out: dict[str, int] = {}
    for ident, n in store.stats().reads_by_source.items():
        name = os.path.basename(ident[1]) if ident[0] == "file" else str(ident[1])
        out[name] = max(out.get(name, 0), n)
    return out


class ExecutorWorker:
    """One Ray worker (wrapped by `ray.remote` when the pool starts): an executor and its
    caches. `run` runs one prompt at a time; `interrupt`, `info` and `free` answer meanwhile."""

    def __init__(self, name: str, options: WorkerOptions):
        self.name = name
        self.device = options.env.device or "cpu"
        self.executor = build_executor(options)
        self._interrupts: dict[str, threading.Event] = {}
        self._lock = threading.Lock()          # one prompt (or /free) at a time
        self._guard = threading.Lock()         # the interrupt table
        self.current: str | None = None
        self.prompts = 0

    def info(self) -> dict:
        return {"name": self.name, "pid": os.getpid(), "host": os.uname().nodename,
                "held": _held(), "reads": _reads(), "running": self.current,
                "prompts": self.prompts, "memory_budget": self._budget()}

    def _budget(self) -> dict:
        """The memory budget in force in this process and the output cache's byte bound."""
        from mixgraph.nodes.models import memory_budget
        b = memory_budget.budget(self.device)
        cache = getattr(self.executor.cache, "memory", self.executor.cache)   # TieredCache
        return {"device": b.device, "bytes": b.nbytes, "origin": b.origin, "mode": b.mode,
                "output_cache_bytes": getattr(cache, "max_bytes", None)}

    def _event_for(self, prompt_id: str) -> threading.Event:
        with self._guard:
            return self._interrupts.setdefault(prompt_id, threading.Event())

    def interrupt(self, prompt_id: str) -> bool:
        """Stop `prompt_id` at its next node or sampler step (also when it has not started)."""
        self._event_for(prompt_id).set()
        return True

    def run(self, prompt_id: str, workflow: Any, outputs: list, extra_data: dict):
        """Run a prompt; yields lists of events as they happen, then [WorkerResult]."""
        interrupt = self._event_for(prompt_id)
        events: queue_mod.Queue = queue_mod.Queue()
        done = object()

        def work() -> None:
            with self._lock:
                self.current = prompt_id
                try:
                    from mixgraph.nodes.weights import streaming
                    before = streaming.snapshot()     # one prompt at a time: its own cost
                    with worker_sink(events.put, prompt_id):    # packs' send_sync, in order
                        report, status = execute(lambda emit: self.executor.run(
                            workflow, targets=outputs or None, on_event=emit,
                            interrupt=interrupt, prompt_id=prompt_id, extra_data=extra_data,
                            strict=False), prompt_id, events.put)
                    ui = dict(getattr(report, "ui", None) or {})
                    self.prompts += 1
                    memory = streaming.memory_section(self.device, streaming.since(before))
                    events.put(WorkerResult(status, ui, _held(), _reads(), memory))
                except BaseException as e:  # noqa: BLE001 - the front must hear of it
                    events.put(WorkerResult("error", {}, (), {}))
                    log.exception("worker %s: %s", self.name, e)
                finally:
                    self.current = None
                    with self._guard:
                        self._interrupts.pop(prompt_id, None)
                    events.put(done)

        threading.Thread(target=work, name=f"mixgraph-{self.name}", daemon=True).start()
        while True:
            chunk = [events.get()]
            while len(chunk) < _CHUNK:
                try:
                    chunk.append(events.get_nowait())
                except queue_mod.Empty:
                    break
            finished = chunk[-1] is done
            if finished:
                chunk.pop()
            if chunk:
                yield chunk
            if finished:
                return

    def free(self, unload_models: bool, free_memory: bool) -> dict:
        """`/free` on this worker, between prompts; its `info()` after."""
        with self._lock:
            if free_memory:
                self.executor.cache.clear()
            if unload_models or free_memory:
                from mixgraph.nodes.weights import store
                store.clear()
                import gc
                gc.collect()
        return self.info()
