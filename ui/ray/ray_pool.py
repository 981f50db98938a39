"""Prompts on Ray workers: `mixgraph serve --ray [ADDRESS] [--workers N]` (DESIGN §10).

The front server keeps everything a client talks to (ComfyUI's HTTP/WebSocket API, the queue and
history in the job store, the editor); only execution moves. `RayPromptQueue` is a `PromptQueue`
whose prompts run through its `_run_item` seam on Ray actors instead of the local executor:

- **Workers.** Each is an `ExecutorWorker` actor (ui/ray/ray_worker.py): a full mixgraph executor
  with its own output cache and its own (process-wide) weight store, built by
  `build_executor(WorkerOptions)` from the server's environment (models folders...), node
  library or registry factory, custom-node flags and cache options: the one factory every worker
  goes through, so a server option that changes executors (a persistent output cache, say) is
  added in one place. The front server's memory budget (bytes, origin, mode) is set in each
  worker's process before its executor is made; a worker's row in `/system_stats` shows it, and
  a prompt's history entry has its run's `memory` section (budget, streaming cost) as a local run.
- **Events.** `ExecutorWorker.run` is a Ray streaming generator: it yields the run's events
  (`graph.events`, previews as tensors) in chunks as they happen, then one `WorkerResult`; the
  front hands each event to the same `on_event` the local path uses, so WebSocket clients and
  the history see what a local run would send. What custom node packs send with
  `PromptServer.instance.send_sync` on a worker comes in the same stream
  (`ui.comfy.client_messages.PackMessage`) and goes to the clients through the front's own sink.
- **Interrupt.** Actors run with `max_concurrency > 1`: `interrupt(prompt_id)` sets the running
  prompt's event while `run` is busy, so a sampler stops at its next step.
- **Model affinity.** Each worker reports what its weight store holds, as (file fingerprint,
  storage dtype); a prompt needs what `ui.estimate.weights_needed` finds. A prompt goes to a free
  worker that holds (or is about to hold) everything it needs, else to the holder with the
  shortest wait (at most `AFFINITY_WAIT` prompts ahead), else to the least loaded worker. The
  decision and its reason are the history entry's `status["mixgraph"]`.
- **Failover.** A worker that dies (process killed, node lost) is replaced by a new actor; the
  prompt it ran goes on on another worker (or the replacement), with one `execution_start` and a
  `mixgraph.warning` noting the retry, so the client sees one story; its queued prompts are
  placed again. Finished outputs stay: they are files.
- **Fan-out.** A prompt asking for it (`extra_data["mixgraph_fan_out"]`, or `--fan-out`) has its
  KSampler batch, or the items of its list (a list of seeds or of prompts, OUTPUT_IS_LIST),
  split over the idle workers when that gives the same images (`ui.ray.ray_fanout`); the parts'
  outputs come back in order under the one prompt id, in one `executed` per output node.

Models and output folders are paths: on a cluster every machine must see the same paths (a shared
mount), as the front server validates against its own folders.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from mixgraph.graph import events as ev
from mixgraph.graph.env import Env
from mixgraph.ui.comfy.client_messages import PackMessage, deliver
from mixgraph.ui.server.queue import PromptQueue, QueueItem, execute
from mixgraph.ui.ray.ray_worker import ExecutorWorker, RayUnavailable, WorkerOptions, WorkerResult, ray_module

__all__ = ["RayConfig", "RayPromptQueue", "RayUnavailable", "config_from_args", "AFFINITY_WAIT",
           "MAX_RETRIES", "START_TIMEOUT"]

log = logging.getLogger("mixgraph.ui")

#: A holder of a prompt's weights takes it while it has fewer than this many prompts ahead;
#: beyond that a less busy worker loads the weights instead.
AFFINITY_WAIT = 4
#: How often one prompt is re-run after the worker running it died.
MAX_RETRIES = 2
#: Seconds a worker may take to start (import torch and the node library, build its executor).
START_TIMEOUT = 300


@dataclass(frozen=True)
class RayConfig:
    """`--ray [ADDRESS]`, `--workers N`, `--fan-out`: address None or "" starts a local Ray
    instance; workers None: one per GPU of the cluster, else one per machine; fan_out: split
    every prompt's batch that can be (else only those whose extra_data has
    `"mixgraph_fan_out": true`). `cache`, `registry`, `custom_nodes`, `memory` as in
    WorkerOptions (the env comes from the server; `memory` None: the front server's budget in
    force when the workers are made, so `--memory-budget` and ComfyUI's memory flags reach
    them)."""

    address: str | None = None
    workers: int | None = None
    fan_out: bool = False
    cache: dict = field(default_factory=dict)
    registry: Callable[[], Any] | None = None
    custom_nodes: dict | None = None
    output_cache: tuple[str, float] | None = None
    memory: tuple[tuple[str, int, str, str], ...] | None = None

    def worker_options(self, env: Env) -> WorkerOptions:
        return WorkerOptions(env, dict(self.cache), self.registry, self.custom_nodes,
                             self.output_cache, self.memory or _front_budget(env))


def _front_budget(env: Env) -> tuple[tuple[str, int, str, str], ...]:
    """(device, bytes, origin, mode) of this process's memory budgets for the CPU and the env's
    device (`WorkerOptions.memory`)."""
    from mixgraph.nodes.models import memory_budget
    budgets = {b.device: b for b in map(memory_budget.budget, ("cpu", env.device or "cpu"))}
    return tuple((b.device, b.nbytes, b.origin, b.mode) for b in budgets.values())


def config_from_args(args: Any) -> RayConfig:
    """The RayConfig of `mixgraph serve`'s flags (RayUnavailable without the ray package)."""
    ray_module()
    keys = ("custom_nodes", "disable_all_custom_nodes", "base_directory",
            "extra_model_paths_config")
    workers = getattr(args, "workers", None)
    if workers is not None and workers < 1:
        raise ValueError(f"--workers needs 1 or more, not {workers}")
    return RayConfig(address=getattr(args, "ray", None) or None, workers=workers,
                     fan_out=bool(getattr(args, "fan_out", False)),
                     cache={"lru": getattr(args, "cache_lru", None),
                            "none": bool(getattr(args, "cache_none", False)),
                            "ram": getattr(args, "cache_ram", None)},
                     custom_nodes={k: getattr(args, k, None) for k in keys},
                     output_cache=_output_cache(args))


def _output_cache(args: Any) -> tuple[str, float] | None:
    """(directory, GB) of `--output-cache` for the workers (the flags checked as the server's)."""
    from mixgraph.ui.comfy.comfy_flags import DISK_DEFAULT_GB
    directory = getattr(args, "output_cache", None)
    if directory is None:
        return None
    gb = getattr(args, "output_cache_gb", None)
    return (str(directory), DISK_DEFAULT_GB if gb is None else float(gb))


# --- the front server's side -------------------------------------------------------------------

@dataclass
class _Worker:
    name: str
    handle: Any = None
    state: str = "starting"            # starting | ready | dead
    held: frozenset = frozenset()      # {(digest, dtype)} reported after its last prompt
    held_names: tuple = ()             # [(digest, dtype, file name)] as reported
    reads: dict = field(default_factory=dict)
    running: QueueItem | None = None
    node: str | None = None
    pid: int | None = None
    host: str = ""
    prompts: int = 0
    restarts: int = 0
    memory_budget: dict = field(default_factory=dict)   # as the worker reports it (`info`)


class RayPromptQueue(PromptQueue):
    """A PromptQueue whose prompts run on Ray workers (module docstring). Same queue, history,
    events and job store as the local queue; `workers()` describes the workers for
    `/system_stats` and `/queue`."""

    def __init__(self, executor: Any, *, config: RayConfig, env: Env, **kw: Any):
        super().__init__(executor, **kw)
        self.config = config
        self.options = config.worker_options(env)
        self._workers: list[_Worker] = []
        self._place: dict[str, tuple[str, str]] = {}      # prompt id -> (worker name, reason)
        self._needs: dict[str, frozenset] = {}
        self._notes: dict[str, dict] = {}
        self._runs: dict[str, tuple[QueueItem, _Worker]] = {}
        self._claims = 0                                   # retries waiting for a worker
        self._parts: dict[str, list[_Worker]] = {}          # fan-out: the workers of a prompt
        self._names: dict[str, str] = {}                   # digest -> file name
        self._owns_ray = False
        self._actor_class: Any = None

    # --- starting and stopping -----------------------------------------------------------------

    def open(self) -> None:
        """Open the job store (PromptQueue.open) and start the workers: connect to Ray (or start
        a local instance) and wait until every worker has built its executor. Raises
        RayUnavailable (`mixgraph serve` calls this before it listens: a clear error, exit 2)."""
        super().open()
        if not self._workers:
            self._start_workers()

    def _start_workers(self) -> None:
        ray = ray_module()
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                                  "log_to_driver": False}
            try:
                if self.config.address:
                    ray.init(address=self.config.address, **kw)
                else:
                    ray.init(num_cpus=self.config.workers or os.cpu_count() or 1, **kw)
            except Exception as e:  # noqa: BLE001 - ConnectionError, ValueError, RuntimeError...
                where = f"the Ray cluster at {self.config.address}" if self.config.address \
                    else "a local Ray instance"
                raise RayUnavailable(f"cannot start or reach {where}: {e}") from None
            self._owns_ray = True
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        count = self.config.workers or gpus or max(nodes, 1)
        cpus = float(resources.get("CPU", 1))       # shared out, so every worker is placed
        per_cpu = 0 if gpus else (cpus // count if cpus >= count else round(cpus / count, 2))
        self._actor_class = ray.remote(ExecutorWorker).options(
            max_concurrency=4, num_gpus=min(1.0, gpus / count) if gpus else 0,
            num_cpus=per_cpu)
        self._workers = [_Worker(f"w{i}") for i in range(count)]
        for w in self._workers:
            self._spawn(w)
        for w in self._workers:
            self._await_ready(w)

    def _spawn(self, w: _Worker) -> None:
        w.handle = self._actor_class.remote(w.name, self.options)
        w.state = "starting"

    def _await_ready(self, w: _Worker) -> None:
        ray = ray_module()
        try:
            info = ray.get(w.handle.info.remote(), timeout=START_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise RayUnavailable(f"Ray worker {w.name} did not start within {START_TIMEOUT} s "
                                 "(does the cluster have the resources for every worker?)"
                                 ) from None
        with self._cv:
            w.pid, w.host, w.state = info["pid"], info["host"], "ready"
            w.memory_budget = dict(info.get("memory_budget") or {})
            self._update(w, info["held"], info["reads"])
            self._assign()
            self._cv.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            runs = [(i, x) for i, w in self._runs.values()
                    for x in self._parts.get(i.prompt_id, [w])]
        for item, w in runs:
            item.interrupt.set()
            self._interrupt_on(w, item)
        deadline = time.monotonic() + timeout
        with self._cv:                   # let the interrupted prompts record their history
            while self._runs and time.monotonic() < deadline:
                self._cv.wait(0.05)
        super().stop(timeout)
        ray = ray_module()
        for w in self._workers:
            try:
                ray.kill(w.handle)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._workers = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # --- placement ------------------------------------------------------------------------------

    def _needs_of(self, item: QueueItem) -> frozenset:
        """{(fingerprint digest, storage dtype)} the prompt's models are held as."""
        from mixgraph.graph.fingerprint import fingerprint_file
        from mixgraph.ui.estimate import weights_needed
        try:
            if item.workflow is None:
                item.workflow = self.prepare(item)
            order = getattr(item.validation, "order", None)
            pairs = weights_needed(item.workflow, self.executor.registry, self.executor.env,
                                   order)
            needs = set()
            for path, dtype in pairs:
                digest = fingerprint_file(path).digest
                self._names[digest] = os.path.basename(path)
                needs.add((digest, str(dtype).replace("torch.", "")))
            return frozenset(needs)
        except Exception:  # noqa: BLE001 - the worker's validation reports a broken prompt
            return frozenset()

    def put(self, item: QueueItem) -> None:
        super().put(item)            # placed by the dispatcher: finding its needs may hash files
        with self._cv:
            self._cv.notify_all()

    def _load(self, w: _Worker) -> int:
        queued = sum(1 for pid, (name, _) in self._place.items()
                     if name == w.name and pid not in self._runs)
        return queued + (w.running is not None)

    def _expected(self, w: _Worker) -> frozenset:
        """What `w` will hold once the prompts placed on it have run."""
        held = set(w.held)
        for pid, (name, _) in self._place.items():
            if name == w.name:
                held |= self._needs.get(pid, frozenset())
        return frozenset(held)

    def _choose(self, needs: frozenset) -> tuple[_Worker | None, str]:
        ready = [w for w in self._workers if w.state == "ready"]
        if not ready:
            return None, "no worker is ready"
        names = ", ".join(sorted(n for _d, _p, n in self._described(needs))) or "nothing"
        if not needs:
            w = min(ready, key=self._load)
            return w, (f"least loaded ({self._load(w)} ahead); its models are not known before "
                       "it runs")
        holders = [w for w in ready if needs <= self._expected(w)]
        free = [w for w in holders if self._load(w) == 0]
        if free:
            return free[0], f"free and holds {names}"
        near = [w for w in holders if self._load(w) < AFFINITY_WAIT]
        if near:
            w = min(near, key=self._load)
            return w, f"holds {names}; shortest wait among holders ({self._load(w)} ahead)"
        w = min(ready, key=lambda w: (self._load(w), -len(needs & self._expected(w))))
        why = "holders busy" if holders else "no worker holds them"
        return w, f"least loaded ({self._load(w)} ahead); {why}, so it loads {names}"

    def _described(self, needs: frozenset) -> list[tuple[str, str, str]]:
        """(digest, dtype, "file (dtype)") of each need, named by the file when it is known."""
        return [(d, p, f"{self._names.get(d, d[:12])} ({p})") for d, p in needs]

    def _assign(self) -> None:
        """Place every queued prompt that has no worker yet, in run order (under the lock)."""
        queued = {e[2].prompt_id for e in self._heap}
        for pid in [p for p in self._place if p not in queued and p not in self._runs]:
            del self._place[pid]
        for pid in [p for p in self._needs if p not in queued and p not in self._runs]:
            del self._needs[pid]                  # deleted from the queue
        for _, _, item in sorted(self._heap):
            if item.prompt_id in self._place:
                continue
            needs = self._needs.get(item.prompt_id)
            if needs is None:                # `_find_needs` has not seen it yet
                return
            w, reason = self._choose(needs)
            if w is None:
                return
            self._place[item.prompt_id] = (w.name, reason)

    def _update(self, w: _Worker, held: tuple, reads: dict) -> None:
        w.held = frozenset((d, p) for d, p, _n in held)
        w.held_names = tuple(held)
        w.reads = dict(reads)
        self._names.update((d, n) for d, _p, n in held)

    # --- the dispatcher (replaces the local worker thread) -------------------------------------

    def _find_needs(self) -> None:
        """The needs of queued prompts not yet known, found outside the lock (file hashing)."""
        with self._cv:
            todo = [e[2] for e in sorted(self._heap) if e[2].prompt_id not in self._needs]
        found = {item.prompt_id: self._needs_of(item) for item in todo}
        with self._cv:
            self._needs.update(found)

    def _work(self) -> None:
        while True:
            self._find_needs()
            with self._cv:
                self._assign()
                start = self._dispatch()
                if not start and not self._stop and not any(self._free.values()):
                    self._cv.wait(0.5)
                if self._stop:
                    return
            for item, w in start:
                threading.Thread(target=self._run_thread, args=(item, w), daemon=True,
                                 name=f"mixgraph-prompt-{w.name}").start()
            if any(self._free.values()):
                self._handle_free()

    def _dispatch(self) -> list[tuple[QueueItem, _Worker]]:
        """Pop, for each idle ready worker, the first prompt placed on it (under the lock)."""
        started = []
        if self._claims:                 # a retried prompt gets the next idle worker first
            return started
        for w in self._workers:
            if w.state != "ready" or w.running is not None:
                continue
            for i, (_, _, item) in enumerate(sorted(self._heap)):
                if self._place.get(item.prompt_id, ("",))[0] == w.name:
                    self._heap.remove(next(e for e in self._heap if e[2] is item))
                    heapq.heapify(self._heap)
                    self._start_run(item, w)
                    started.append((item, w))
                    break
        return started

    def _start_run(self, item: QueueItem, w: _Worker) -> None:
        w.running, w.node = item, None
        self._runs[item.prompt_id] = (item, w)
        name, reason = self._place.get(item.prompt_id, (w.name, "the only choice"))
        self._notes.setdefault(item.prompt_id, {"worker": w.name, "reason": reason,
                                                "retries": []})
        try:
            self.store.set_running(item.prompt_id, ev.now_ms())
        except Exception:  # noqa: BLE001 - JobStoreError: the run goes on
            log.exception("prompt %s: could not mark it running", item.prompt_id)

    def _run_thread(self, item: QueueItem, w: _Worker) -> None:
        self.on_change()
        try:
            self._execute(item)
        except Exception:  # noqa: BLE001 - last line of defence: the queue lives on
            log.exception("prompt %s: unexpected failure in the dispatcher", item.prompt_id)
        with self._cv:
            _, w = self._runs.pop(item.prompt_id, (None, w))
            if w.running is item:
                w.running, w.node = None, None
            self._place.pop(item.prompt_id, None)
            self._needs.pop(item.prompt_id, None)
            self._notes.pop(item.prompt_id, None)
            self._cv.notify_all()
        self.on_change()

    def _note(self, item: QueueItem) -> dict | None:
        return self._notes.get(item.prompt_id)

    def _run_item(self, item: QueueItem, on_event: Callable[[ev.Event], None]) -> tuple[Any, str]:
        ray = ray_module()
        started = False
        note = self._notes[item.prompt_id]
        _, w = self._runs[item.prompt_id]
        lock = threading.Lock()           # fan-out parts forward from several threads

        def forward(event: ev.Event) -> None:
            nonlocal started
            with lock:
                if isinstance(event, ev.ExecutionStart):
                    if started:                # a retry: the client already has its start
                        return
                    started = True
                on_event(event)

        def prepared(emit: Any) -> Any:
            return item.workflow if item.workflow is not None else self.prepare(item)
        workflow, status = execute(prepared, item.prompt_id, forward)
        if status != "success":          # a stored prompt that no longer loads: reported
            return None, status
        if item.extra_data.get("mixgraph_fan_out", self.config.fan_out):
            done = self._fan_out(item, workflow, w, note, forward)
            if done is not None:
                return done
        while True:
            try:
                result = self._stream(w, item, workflow, forward)
            except ray.exceptions.RayActorError as e:
                retry = self._failover(item, w, e, note, forward)
                if retry is None:
                    return None, "error"
                w = retry
                continue
            if result is None:
                return None, "error"
            if result.memory is not None:          # the history entry's `memory`
                self._memory[item.prompt_id] = result.memory
            return result, result.status

    def _stream(self, w: _Worker, item: QueueItem, workflow: Any,
                forward: Callable[[ev.Event], None]) -> WorkerResult | None:
        """Run `workflow` as `item` on `w`, its events to `forward`; the worker's result (None if
        it sent none). Raises RayActorError when the worker dies."""
        ray = ray_module()
        result, asked = None, False
        for ref in w.handle.run.remote(item.prompt_id, workflow, item.outputs, item.extra_data):
            for event in ray.get(ref):
                if isinstance(event, WorkerResult):
                    result = event
                    continue
                if isinstance(event, PackMessage):       # a pack's send_sync on the worker
                    deliver(event)
                    continue
                if isinstance(event, ev.Executing):
                    w.node = event.node
                forward(event)
            if item.interrupt.is_set() and not asked:
                self._interrupt_on(w, item)
                asked = True
        if result is not None:
            with self._cv:
                self._update(w, result.held, result.reads)
                w.prompts += 1
        return result

    def _fan_out(self, item: QueueItem, workflow: Any, w: _Worker, note: dict,
                 forward: Callable[[ev.Event], None]) -> tuple[Any, str] | None:
        """Split the prompt's batch or list over `w` and the workers idle now (ui/ray/ray_fanout.py)
        and gather the outputs in order; None: it does not split (a warning says why), run it
        whole."""
        ray = ray_module()
        from mixgraph.ui.ray.ray_fanout import merged_events, plan
        pid = item.prompt_id
        with self._cv:
            needs = self._needs.get(pid, frozenset())
            idle = sorted((x for x in self._workers
                           if x is not w and x.state == "ready" and x.running is None),
                          key=lambda x: (self._load(x) > 0, -len(needs & self._expected(x))))
            split, why = plan(workflow, item.outputs, 1 + len(idle), self.executor.registry,
                              pid)
            workers = [w, *idle[:max(split.count - 1, 0)]] if split else [w]
            held = [bool(needs) and needs <= self._expected(x) for x in workers]
            for x in workers[1:]:
                x.running, x.node = item, None          # claimed: the dispatcher leaves them
            self._parts[pid] = workers
        if split is None:
            log.info("prompt %s: not split over workers: %s", pid, why)
            forward(ev.Warning(pid, message=f"not split over workers: {why}"))
            with self._cv:
                self._parts.pop(pid, None)
            return None
        results: list[WorkerResult | None] = [None] * split.count
        failed: list[tuple[int, _Worker, Exception]] = []
        attempts = [0] * split.count
        stopped = threading.Event()
        announced: set = set()

        def part_events(j: int) -> Callable[[ev.Event], None]:
            def send(event: ev.Event) -> None:
                if isinstance(event, (ev.ExecutionSuccess, ev.Executed)) \
                        or (isinstance(event, ev.ExecutionCached) and j):
                    return                 # one success, merged outputs, sent at the end
                if isinstance(event, ev.Executing):
                    if event.node is None or split.hidden(event.node) \
                            or event.node in announced:
                        return             # each node announced once, as on one machine
                    announced.add(event.node)
                if isinstance(event, ev.ExecutionCached):
                    event = dataclasses.replace(event, nodes=tuple(
                        n for n in event.nodes if not split.hidden(n)))
                forward(event)
                if isinstance(event, (ev.ExecutionError, ev.ExecutionInterrupted)) \
                        and not stopped.is_set():
                    stopped.set()          # one part failed: stop the others
                    item.interrupt.set()
                    for x in workers:
                        self._interrupt_on(x, item)
            return send

        def run_part(j: int, x: _Worker) -> None:
            try:
                results[j] = self._stream(x, item, split.part(j, attempts[j]), part_events(j))
            except ray.exceptions.RayActorError as e:
                failed.append((j, x, e))

        threads = [threading.Thread(target=run_part, args=(j, x), daemon=True)
                   for j, x in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        names = [x.name for x in workers]
        for j, x, e in failed:             # a dead worker's part: again on a live one of ours
            self._mark_dead(x, e, note)
            live = [y for y in workers if y.state == "ready"]
            if not live or item.interrupt.is_set():
                forward(ev.ExecutionError(pid, exception_message=(
                    f"worker {x.name} died while running {split.describe(j)} of this "
                    "prompt; no worker of this prompt is left to run them"),
                    exception_type="WorkerDied"))
                break
            forward(ev.Warning(pid, message=f"worker {x.name} died while running "
                                            f"{split.describe(j)}; running it again on "
                                            f"{live[0].name}"))
            split.discard(j, attempts[j], self.executor.env)
            attempts[j] += 1
            names[j] = live[0].name
            run_part(j, live[0])
        with self._cv:
            for x in workers[1:]:
                if x.running is item:
                    x.running, x.node = None, None
            self._parts.pop(pid, None)
            self._cv.notify_all()
        ui, note["fan_out"], problem = split.gather(
            [r.ui if r is not None else None for r in results], self.executor.env, names)
        for part, had, r in zip(note["fan_out"], held, results):
            part["held_weights"] = had       # affinity: did it hold the weights when split
            if r is not None and r.memory is not None:
                part["memory"] = r.memory    # each part's budget and streaming cost
        ok = all(r is not None and r.status == "success" for r in results)
        if ok and problem:
            forward(ev.ExecutionError(pid, exception_message=problem,
                                      exception_type="FanOutMismatch"))
            ok = False
        if ok:
            for event in merged_events(pid, ui):
                forward(event)
            forward(ev.ExecutionSuccess(pid))
        forward(ev.Executing(pid, None))
        return WorkerResult("success" if ok else "error", ui, (), {}), \
            "success" if ok else "error"

    def _mark_dead(self, dead: _Worker, error: Exception, note: dict) -> None:
        """Book `dead` as dead (once), start its replacement, place its queued prompts again,
        and note the retry on the prompt it ran."""
        with self._cv:
            at_node = dead.node
            if dead.state != "dead":
                dead.state, dead.running, dead.node = "dead", None, None
                dead.restarts += 1
                for pid, (name, _) in list(self._place.items()):
                    if name == dead.name and pid not in self._runs:
                        del self._place[pid]          # placed again once workers are known
                threading.Thread(target=self._restart, args=(dead,), daemon=True).start()
            note["retries"].append({"worker": dead.name, "error": type(error).__name__,
                                    "at_node": at_node})

    def _failover(self, item: QueueItem, dead: _Worker, error: Exception, note: dict,
                  forward: Callable[[ev.Event], None]) -> _Worker | None:
        """`dead` died running `item`: replace it, and claim a worker to run `item` again
        (None: retries used up or the server stops; then the prompt has ended in an error)."""
        self._mark_dead(dead, error, note)
        with self._cv:
            self._claims += 1
        retries = len(note["retries"])
        if retries > MAX_RETRIES or item.interrupt.is_set():
            with self._cv:
                self._claims -= 1
                self._cv.notify_all()
            forward(ev.ExecutionError(item.prompt_id, exception_message=(
                f"worker {dead.name} died while running this prompt ({retries} time(s)); "
                "not retried again"), exception_type="WorkerDied"))
            forward(ev.Executing(item.prompt_id, None))
            return None
        with self._cv:
            while not self._stop:
                idle = [w for w in self._workers if w.state == "ready" and w.running is None]
                if idle:
                    needs = self._needs.get(item.prompt_id, frozenset())
                    w = max(idle, key=lambda w: len(needs & w.held))
                    self._claims -= 1
                    w.running, w.node = item, None
                    self._runs[item.prompt_id] = (item, w)
                    self._place[item.prompt_id] = (w.name, "retry")
                    note.update(worker=w.name, reason=f"retry {retries}: worker {dead.name} "
                                f"died; {w.name} was idle ({note['reason']} before)")
                    self._cv.notify_all()
                    break
                self._cv.wait(0.2)
            else:
                self._claims -= 1
                return None
        forward(ev.Warning(item.prompt_id, message=(
            f"worker {dead.name} died while running this prompt; running it again on {w.name}")))
        return w

    def _restart(self, w: _Worker) -> None:
        try:
            self._spawn(w)
            self._await_ready(w)
        except Exception:  # noqa: BLE001 - the others carry on
            log.exception("could not restart Ray worker %s", w.name)
        with self._cv:
            self._cv.notify_all()

    # --- what the routes see ----------------------------------------------------------------------

    def _interrupt_on(self, w: _Worker, item: QueueItem) -> None:
        try:
            w.handle.interrupt.remote(item.prompt_id)
        except Exception:  # noqa: BLE001 - a dead worker: failover handles it
            pass

    def interrupt(self, prompt_id: str | None = None) -> bool:
        with self._cv:
            runs = [(i, x) for i, w in self._runs.values()
                    if prompt_id is None or i.prompt_id == prompt_id
                    for x in self._parts.get(i.prompt_id, [w])]
            for item, w in runs:
                item.interrupt.set()
        for item, w in runs:
            self._interrupt_on(w, item)
        return bool(runs)

    def _handle_free(self) -> None:
        with self._cv:
            flags = dict(self._free)
        super()._handle_free()
        if flags["unload_models"] or flags["free_memory"]:
            for w in list(self._workers):
                threading.Thread(target=self._free_worker, args=(w, flags), daemon=True).start()

    def _free_worker(self, w: _Worker, flags: dict) -> None:
        """`/free` on one worker (after the prompt it runs); what it holds then."""
        try:
            info = ray_module().get(w.handle.free.remote(flags["unload_models"],
                                                         flags["free_memory"]))
        except Exception:  # noqa: BLE001 - a dead worker: failover handles it
            return
        with self._cv:
            self._update(w, info["held"], info["reads"])

    def remaining(self) -> int:
        with self._cv:
            return len(self._heap) + len(self._runs)

    def running(self) -> tuple[QueueItem | None, str | None]:
        with self._cv:
            for item, w in self._runs.values():
                return item, w.node
        return None, None

    def snapshot(self) -> tuple[list[list], list[list]]:
        with self._cv:
            running = [i.as_list() for i, _ in sorted(self._runs.values(),
                                                      key=lambda r: r[0].number)]
            pending = [entry[2].as_list() for entry in sorted(self._heap)]
        return running, pending

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._heap or self._runs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def workers(self) -> list[dict]:
        """Each worker: state, process, what it holds (fingerprint + storage precision), weight
        reads (loads per file since it started or was last freed), the prompt it runs (and node),
        the prompts placed on it, and its memory budget (device, bytes, origin, mode, the output
        cache's byte bound)."""
        with self._cv:
            out = []
            for w in self._workers:
                queued = [pid for _, _, i in sorted(self._heap)
                          for pid in [i.prompt_id] if self._place.get(pid, ("",))[0] == w.name]
                out.append({
                    "name": w.name, "state": w.state, "pid": w.pid, "host": w.host,
                    "held": [{"file": n, "fingerprint": d, "precision": p}
                             for d, p, n in w.held_names],
                    "weight_reads": dict(w.reads),
                    "running": w.running.prompt_id if w.running is not None else None,
                    "node": w.node, "queued": queued, "prompts": w.prompts,
                    "restarts": w.restarts, "memory_budget": dict(w.memory_budget)})
            return out

