"""The prompt queue and its single worker thread (comfy-conventions §1.1, §1.5).

Pending prompts sit in a heap ordered by `number` (a server counter; `front` makes it negative).
One worker thread takes the lowest number and runs it through the `Executor`; its events go to
`emit(type, data, client_id)` (the WebSocket hub). Finished prompts land in the history, in
ComfyUI's entry shape, capped at `max_history` entries. A prompt that fails, whatever the cause,
ends in an `execution_error` and `executing {node: null}`; the worker carries on with the next one.

Persistence: the `JobStore` (ui/server/jobstore.py) is the source of truth for queue and history; the
heap is a cache of its pending rows that also holds what only lives in memory (the parsed
workflow, the validation, the interrupt flag). Every change to the heap is written to the store
under the same lock. `start()` first recovers what a previous process left: pending prompts are
queued again in their order (parsed again by `prepare` when the worker takes them) and a prompt
that was running becomes an interrupted history entry (`recovered_entry`).

Interrupt: every running prompt has its own `threading.Event`, handed to `Executor.run`; nodes
check it before they start and at every `ctx.progress` (every sampler step). Interrupting stops
only the running prompt; the queue keeps going.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import logging
import math
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from mixgraph.graph import events as ev
from mixgraph.graph.context import Interrupted
from mixgraph.graph.executor import ExecutionFailed, NodeError, ValidationFailed
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.weights import store, streaming
from mixgraph.ui.server.jobstore import MAX_HISTORY, JobStore, JobStoreError
from mixgraph.ui.server.progress_state import ProgressStates

__all__ = ["QueueItem", "PromptQueue", "MAX_HISTORY", "SENSITIVE_KEYS", "STOPPED_MESSAGE",
           "recovered_entry", "execute"]

log = logging.getLogger("mixgraph.ui")

#: The error of a prompt that was running when the server process ended (crash, kill -9).
STOPPED_MESSAGE = ("the server stopped while this prompt was running; queue it again with "
                   "POST /history/{prompt_id}/requeue")
SENSITIVE_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
#: Events recorded in a history entry's `status.messages`, as ComfyUI does.
_RECORDED = ("execution_start", "execution_cached", "execution_success", "execution_error",
             "execution_interrupted")

Emit = Callable[[str, Any, "str | None"], None]


@dataclass
class QueueItem:
    """One queued prompt. `prompt` is the API prompt (as the client sent it, or converted from
    the `source` it sent in UI or envelope format); `targets` its partial_execution_targets;
    `workflow` and `validation` are what the executor runs (parsed and validated when it was
    queued; None for a prompt taken over from the job store, which `prepare` parses again)."""

    number: float
    prompt_id: str
    prompt: dict
    extra_data: dict
    outputs: list[str]
    workflow: Any = None
    validation: Any = None
    source: dict | None = None
    targets: list[str] | None = None
    created: int = field(default_factory=ev.now_ms)          # ms since the epoch
    interrupt: threading.Event = field(default_factory=threading.Event)

    def _public_extra(self) -> dict:
        return {k: v for k, v in self.extra_data.items() if k not in SENSITIVE_KEYS}

    def as_list(self) -> list:
        """ComfyUI's queue/history form: [number, prompt_id, prompt, extra_data, outputs]."""
        return [self.number, self.prompt_id, self.prompt, self._public_extra(), list(self.outputs)]

    def record(self) -> dict:
        """What the job store keeps to run this prompt again (secrets stripped, as in history)."""
        rec = {"number": self.number, "prompt": self.prompt, "extra_data": self._public_extra(),
               "outputs": list(self.outputs)}
        if self.source is not None:
            rec["source"] = self.source
        if self.targets is not None:
            rec["targets"] = list(self.targets)
        return rec

    @classmethod
    def from_record(cls, prompt_id: str, record: dict, created: int) -> "QueueItem":
        return cls(record["number"], prompt_id, record["prompt"],
                   dict(record.get("extra_data") or {}), list(record.get("outputs") or ()),
                   source=record.get("source"), targets=record.get("targets"), created=created)


class PromptQueue:
    """Heap of pending prompts + one worker thread, over a `JobStore` (queue rows and history).
    `store` defaults to an in-memory one; `prepare(item) -> Workflow` parses a prompt taken over
    from the store (default: `load_workflow` of what the client sent)."""

    def __init__(self, executor: Any, emit: Emit | None = None,
                 emit_preview: Callable[[bytes, dict, "str | None"], None] | None = None,
                 on_change: Callable[[], None] | None = None,
                 unload_hooks: tuple[Callable[[], Any], ...] = (), max_history: int = MAX_HISTORY,
                 store: JobStore | None = None,
                 prepare: Callable[[QueueItem], Any] | None = None):
        self.executor = executor
        self.emit: Emit = emit or (lambda type_, data, client_id: None)
        self.emit_preview = emit_preview or (lambda jpeg, meta, client_id: None)
        self.on_change = on_change or (lambda: None)
        self.unload_hooks = tuple(unload_hooks)
        self.store = store if store is not None else JobStore(None, max_history)
        self.prepare = prepare or self._load
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, QueueItem]] = []
        self._seq = itertools.count()
        self._counter = 0
        self._opened = False
        self._running: QueueItem | None = None
        self._running_node: str | None = None
        self._free = {"unload_models": False, "free_memory": False}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._last_gc = time.monotonic()
        self._memory: dict[str, dict] = {}     # prompt id -> its run's memory section

    @property
    def max_history(self) -> int:
        return self.store.max_history

    # --- the store: opening and recovery ---------------------------------------------------------

    def open(self) -> None:
        """Open the store and take over what an earlier process left in it: pending prompts are
        queued again in their order, a prompt that was running becomes an interrupted history
        entry. Once; `start()` calls it. Raises JobStoreError (naming the file)."""
        with self._cv:
            if self._opened:
                return
            self.store.open()
            running, pending = self.store.queued()
            for row in running:
                item = QueueItem.from_record(row.prompt_id, row.request, row.created_ms)
                log.warning("prompt %s was running when the server stopped; it is in the "
                            "history as interrupted", row.prompt_id)
                self.store.finish(row.prompt_id, recovered_entry(item, row.started_ms),
                                  row.request, row.created_ms, ev.now_ms())
            for row in pending:
                item = QueueItem.from_record(row.prompt_id, row.request, row.created_ms)
                heapq.heappush(self._heap, (item.number, next(self._seq), item))
            if pending:
                log.warning("%d prompt(s) queued before the server stopped are queued again",
                            len(pending))
            highest = self.store.max_number()
            if highest is not None:        # numbers go on after the ones already used
                self._counter = max(self._counter, math.floor(highest) + 1)
            self._opened = True
            self._cv.notify_all()

    def _load(self, item: QueueItem) -> Any:
        return load_workflow(item.source if item.source is not None else item.prompt,
                             self.executor.registry)

    # --- queueing --------------------------------------------------------------------------------

    def next_number(self, front: bool = False) -> int:
        with self._cv:
            n = self._counter
            self._counter += 1
        return -n if front else n

    def put(self, item: QueueItem) -> None:
        """Queue a prompt (replacing a pending one with the same id). Raises JobStoreError if
        the store cannot record it; then nothing is queued."""
        with self._cv:
            self.store.add(item.prompt_id, item.number, item.record(), item.created)
            if any(e[2].prompt_id == item.prompt_id for e in self._heap):
                self._heap = [e for e in self._heap if e[2].prompt_id != item.prompt_id]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (item.number, next(self._seq), item))
            self._cv.notify_all()
        self.on_change()

    def remaining(self) -> int:
        with self._cv:
            return len(self._heap) + (self._running is not None)

    def snapshot(self) -> tuple[list[list], list[list]]:
        """(running, pending) in ComfyUI's item form; pending in run order."""
        with self._cv:
            running = [self._running.as_list()] if self._running is not None else []
            pending = [entry[2].as_list() for entry in sorted(self._heap)]
        return running, pending

    def delete(self, prompt_ids: list[str]) -> int:
        ids = set(prompt_ids)
        with self._cv:
            before = len(self._heap)
            self._heap = [e for e in self._heap if e[2].prompt_id not in ids]
            heapq.heapify(self._heap)
            removed = before - len(self._heap)
            self.store.remove_pending(list(ids))
        if removed:
            self.on_change()
        return removed

    def clear(self) -> None:
        with self._cv:
            self._heap.clear()
            self.store.remove_pending(None)
        self.on_change()

    def running(self) -> tuple[QueueItem | None, str | None]:
        with self._cv:
            return self._running, self._running_node

    # --- interrupt and /free --------------------------------------------------------------------

    def interrupt(self, prompt_id: str | None = None) -> bool:
        """Stop the running prompt (only if it is `prompt_id`, when given). True if one was asked."""
        with self._cv:
            item = self._running
            if item is None or (prompt_id is not None and item.prompt_id != prompt_id):
                return False
            item.interrupt.set()
        return True

    def request_free(self, unload_models: bool = False, free_memory: bool = False) -> None:
        """Handled after the running prompt (at once when idle)."""
        with self._cv:
            self._free["unload_models"] |= bool(unload_models)
            self._free["free_memory"] |= bool(free_memory)
            self._cv.notify_all()

    def _handle_free(self) -> None:
        with self._cv:
            flags, self._free = self._free, {"unload_models": False, "free_memory": False}
        if flags["free_memory"]:
            self.executor.cache.clear()
        if flags["unload_models"] or flags["free_memory"]:
            for hook in self.unload_hooks:
                try:
                    hook()
                except Exception:  # noqa: BLE001 - freeing memory must never stop the worker
                    log.exception("unload hook failed")
            gc.collect()
            _empty_device_cache()

    # --- history (in the store) ------------------------------------------------------------------

    def history(self, max_items: int | None = None, offset: int = -1) -> dict[str, dict]:
        """ComfyUI's get_history: by default everything; `max_items` alone gives the newest."""
        return self.store.history(max_items, offset)

    def history_item(self, prompt_id: str) -> dict[str, dict]:
        entry = self.store.history_item(prompt_id)
        return {prompt_id: entry} if entry is not None else {}

    def history_request(self, prompt_id: str) -> dict | None:
        """What a finished prompt was queued with (`QueueItem.record()`), for re-queueing."""
        return self.store.history_request(prompt_id)

    def delete_history(self, prompt_ids: list[str]) -> None:
        self.store.delete_history(list(prompt_ids))

    def clear_history(self) -> None:
        self.store.delete_history(None)

    def created_times(self) -> dict[str, int]:
        """When each queued or finished prompt was queued (ms since the epoch)."""
        return self.store.created_times()

    def _store(self, item: QueueItem, report: Any, messages: list, status: str,
               note: dict | None = None) -> None:
        ui = dict(getattr(report, "ui", None) or {})
        entry = {
            "prompt": item.as_list(),
            "outputs": ui,
            "meta": {nid: {"node_id": nid, "display_node": nid, "parent_node": None,
                           "real_node_id": nid} for nid in ui},
            "status": {"status_str": status, "completed": status == "success",
                       "messages": messages},
        }
        if note:
            entry["status"]["mixgraph"] = note
        try:
            self.store.finish(item.prompt_id, entry, item.record(), item.created, ev.now_ms())
        except JobStoreError:     # the worker lives on; a restart shows it interrupted
            log.exception("prompt %s: could not record its history entry", item.prompt_id)

    # --- the worker ------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store (taking over its queue) and start the worker."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.open()
        self._stop = False
        self._thread = threading.Thread(target=self._work, name="mixgraph-prompt-worker",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            if self._running is not None:
                self._running.interrupt.set()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():      # still finishing a node: it may yet record it
                return
            self._thread = None
        with self._cv:
            self.store.close()
            self._opened = False

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until nothing is queued or running (tests, shutdown). False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._heap or self._running is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stop and not any(self._free.values()):
                    self._cv.wait(1.0)
                if self._stop:
                    return
                item = heapq.heappop(self._heap)[2] if self._heap else None
                self._running = item
                self._running_node = None
                if item is not None:
                    try:
                        self.store.set_running(item.prompt_id, ev.now_ms())
                    except JobStoreError:
                        log.exception("prompt %s: could not mark it running", item.prompt_id)
            if item is not None:
                self.on_change()
                try:
                    self._execute(item)
                except Exception:  # noqa: BLE001 - last line of defence: the worker lives on
                    log.exception("prompt %s: unexpected failure in the worker", item.prompt_id)
                with self._cv:
                    self._running = None
                    self._running_node = None
                    self._cv.notify_all()
                self.on_change()
            self._handle_free()
            if time.monotonic() - self._last_gc > 10.0:
                gc.collect()
                _empty_device_cache()
                self._last_gc = time.monotonic()

    def _execute(self, item: QueueItem) -> None:
        client_id = item.extra_data.get("client_id")
        messages: list = []
        # The prompt's last event, `executing {node: null}`, is what a client waits for before it
        # reads /history/{prompt_id}: it (and anything after it) is sent once the entry is stored.
        held: list[ev.Event] = []
        states = ProgressStates(item.prompt_id)      # today's editor's `progress_state` messages

        def on_event(event: ev.Event) -> None:
            type_, data = event.to_comfy()
            # an ExecutionBlocker's message goes to the client only: ComfyUI sends it with
            # send_sync, not add_message, so the history stays a plain success
            if type_ in _RECORDED and not (isinstance(event, ev.ExecutionError)
                                           and event.exception_type == "ExecutionBlocked"):
                messages.append([type_, data])
            if isinstance(event, ev.Executing):
                self._running_node = event.node
            if held or (isinstance(event, ev.Executing) and event.node is None):
                held.append(event)
            else:
                send(event)

        def send(event: ev.Event) -> None:
            type_, data = event.to_comfy()
            try:       # a client that cannot be told must never fail the run
                for state_type, state in states.before(event):
                    self.emit(state_type, state, client_id)
                if isinstance(event, ev.Progress) and event.preview is not None:
                    self._preview(event, item.prompt_id, client_id)
                target = None if isinstance(event, ev.ExecutionInterrupted) else client_id
                self.emit(type_, data, target)
                for state_type, state in states.after(event):
                    self.emit(state_type, state, client_id)
            except Exception:  # noqa: BLE001
                log.exception("could not send %s for prompt %s", type_, item.prompt_id)

        report, status = self._run_item(item, on_event)
        if dict(getattr(self.executor.env, "settings", ()) or ()).get("release_models"):
            store.clear()   # --disable-smart-memory: models released after each prompt
        note = self._note(item)
        memory = self._memory.pop(item.prompt_id, None)
        if memory is not None:     # the budget and what streaming cost, as `run --report`'s
            note = {**(note or {}), "memory": memory}
        self._store(item, report, messages, status, note)
        for event in held:
            send(event)

    def _run_item(self, item: QueueItem, on_event: Callable[[ev.Event], None]) -> tuple[Any, str]:
        """Run one prompt, its events to `on_event`: here, on this process's executor. The seam
        where `ui.ray.ray_pool.RayPromptQueue` runs it on a Ray worker instead. The run's memory
        section (`streaming.memory_section`) is kept for its history entry: one prompt runs at a
        time here, so the streaming counters' change is this prompt's."""
        def run(emit: Callable[[ev.Event], None]) -> Any:
            if item.workflow is None:
                item.workflow = self.prepare(item)
            return self.executor.run(
                item.workflow, targets=item.outputs or None, on_event=emit,
                interrupt=item.interrupt, prompt_id=item.prompt_id, extra_data=item.extra_data,
                validation=item.validation, strict=False)
        before = streaming.snapshot()
        try:
            return execute(run, item.prompt_id, on_event)
        finally:
            device = getattr(getattr(self.executor, "env", None), "device", None) or "cpu"
            self._memory[item.prompt_id] = streaming.memory_section(device,
                                                                    streaming.since(before))

    def _note(self, item: QueueItem) -> dict | None:
        """mixgraph's own facts for the history entry's `status["mixgraph"]` (None: nothing)."""
        return None

    def _preview(self, event: ev.Progress, prompt_id: str, client_id: str | None) -> None:
        from mixgraph.ui.server.ws import encode_preview
        jpeg = encode_preview(event.preview)
        if jpeg is not None:
            self.emit_preview(jpeg, {"node_id": event.node, "prompt_id": prompt_id,
                                     "display_node_id": event.node, "parent_node_id": None,
                                     "real_node_id": event.node}, client_id)


def execute(run: Callable[[Callable[[ev.Event], None]], Any], prompt_id: str,
            on_event: Callable[[ev.Event], None]) -> tuple[Any, str]:
    """`run(emit)` (an `Executor.run` sending its events to `emit`) -> (report, "success" |
    "error"). Whatever it raises ends as events, as ComfyUI ends a failed prompt: an interrupt or a
    node error has sent its own; anything else (ValidationFailed, a bug) becomes an
    `execution_error` (after an `execution_start` if nothing was sent) and `executing {node:
    null}`. The queue's worker and a Ray worker (ui/ray/ray_pool.py) both run prompts through it."""
    sent = []

    def emit(event: ev.Event) -> None:
        sent.append(True)
        on_event(event)

    report, status = None, "error"
    try:
        report = run(emit)
        status = "success"
    except Interrupted as e:
        report = getattr(e, "report", None)
    except NodeError as e:
        report = e.report
    except Exception as e:  # noqa: BLE001 - ValidationFailed, or a bug: report, carry on
        report = getattr(e, "report", None) if isinstance(e, ExecutionFailed) else None
        if not sent:
            emit(ev.ExecutionStart(prompt_id))
        emit(ev.ExecutionError(
            prompt_id, "", "", str(e) if isinstance(e, ValidationFailed)
            else f"{type(e).__name__}: {e}", type(e).__name__,
            tuple(traceback.format_exception(type(e), e, e.__traceback__))))
        emit(ev.Executing(prompt_id, None))
    return report, status


def recovered_entry(item: QueueItem, started_ms: int | None) -> dict:
    """The history entry of a prompt that was running when the server process ended: an error,
    interrupted, with STOPPED_MESSAGE. Its outputs were never recorded."""
    pid = item.prompt_id
    events = (ev.ExecutionStart(pid, timestamp=started_ms or item.created),
              ev.ExecutionError(pid, exception_message=STOPPED_MESSAGE,
                                exception_type="ServerStopped"),
              ev.ExecutionInterrupted(pid))
    return {"prompt": item.as_list(), "outputs": {}, "meta": {},
            "status": {"status_str": "error", "completed": False,
                       "messages": [list(e.to_comfy()) for e in events]}}


def _empty_device_cache() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass
