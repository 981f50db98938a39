"""Terminal progress for runs: sampler steps with a time estimate, and what runs between them.

`ProgressBar` consumes the engine's events (`graph.events`). Most of a run's time is spent in
sampler steps, so the bar counts those: a node that reports `Progress` (KSampler and friends)
gets a bar of its steps with rate and remaining time; a node that does not (loaders, VAE decode)
shows as a one-line status with its elapsed time. Warnings are printed above the bar. Writes to
stderr; `disable=True` keeps only the warnings.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["ProgressBar"]


class _PrintedByTheBar(logging.Filter):
    """The engine logs each run warning and sends it as an event, which the bar prints. Where no
    logging is configured, Python's last-resort handler would print the log record as well, so
    the same warning showed twice; the record is dropped then (a configured handler keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "mixgraph_event", False) or bool(logging.getLogger().handlers)


_FILTER = _PrintedByTheBar()


class ProgressBar:
    def __init__(self, disable: bool = False, file: TextIO | None = None, prefix: str = ""):
        engine_log = logging.getLogger("mixgraph")
        if _FILTER not in engine_log.filters:
            engine_log.addFilter(_FILTER)
        self.disable = disable
        self.file = file or sys.stderr
        self.prefix = prefix
        self.bar = None
        self._node: str | None = None
        self._label = ""
        self._bar_node: str | None = None
        self._last = 0.0
        self._planned = 0
        self._done = 0

    def __call__(self, event: Any) -> None:
        from mixgraph.graph import events as ev
        if isinstance(event, (ev.Warning, ev.NanFallback)):
            self._write(f"warning: {event.message}")
            return
        if self.disable:
            return
        if isinstance(event, ev.ExecutionStart):
            self._planned, self._done = len(event.planned), 0
        elif isinstance(event, ev.Executing):
            if self._node is not None:
                self._done += 1
            self._node = event.node
            if event.node is None:
                self.close()
                return
            self._label = f"{self.prefix}[{self._done + 1}/{max(self._planned, 1)}] {event.class_type} (node {event.node})"
            self._status(self._label)
        elif isinstance(event, ev.Progress):
            self._step(event)

    def _bar_for(self, node: str, total: int):
        from tqdm import tqdm
        if self.bar is not None and self._bar_node == node and self.bar.total == total:
            return self.bar
        self.close()
        self.bar = tqdm(total=total, unit="step", file=self.file, leave=False, dynamic_ncols=True,
                        desc=self._label, bar_format="{desc}: {n_fmt}/{total_fmt} steps "
                        "[{elapsed}<{remaining}, {rate_fmt}] {bar}")
        self._bar_node = node
        return self.bar

    def _step(self, event: Any) -> None:
        bar = self._bar_for(event.node, max(int(event.max), 1))
        now = time.monotonic()
        if now - self._last > 0.1 or event.value >= event.max:
            self._last = now
            bar.update(max(0, int(event.value) - bar.n))

    def _status(self, text: str) -> None:
        if self.bar is not None and self._bar_node != self._node:
            self.close()
        if self.bar is None and self._isatty():
            self.file.write("\r\033[K" + text)
            self.file.flush()

    def _isatty(self) -> bool:
        try:
            return self.file.isatty()
        except (AttributeError, ValueError):
            return False

    def _write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.file)
        else:
            if self._isatty() and self._node is not None:
                self.file.write("\r\033[K")
            print(text, file=self.file)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            self._bar_node = None
        elif self._isatty():
            self.file.write("\r\033[K")
            self.file.flush()
