"""The event loop async node bodies run on: one daemon thread per executor, started on first use.

An `async def` node body (or one that returns an awaitable) is submitted here and the
scheduler goes on with other ready nodes; independent async nodes therefore overlap. The loop
has its own thread, so the executor works the same when called from a plain thread, from the
server's worker thread, or from inside a running event loop (which it blocks, as any synchronous
call does). The thread runs in `torch.inference_mode`, like the synchronous nodes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Any, Awaitable

import torch

__all__ = ["AsyncRunner", "gather_calls"]


class AsyncRunner:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def submit(self, awaitable: Awaitable) -> concurrent.futures.Future:
        loop = self._loop
        if loop is None:
            with self._lock:
                if self._loop is None:
                    self._loop = self._start()
                loop = self._loop
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), loop)

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            with torch.inference_mode():
                loop.call_soon(ready.set)
                loop.run_forever()

        threading.Thread(target=main, name="mixgraph-async-nodes", daemon=True).start()
        ready.wait()
        return loop


async def _as_coroutine(awaitable: Awaitable) -> Any:
    return await awaitable


async def gather_calls(raws: list) -> list:
    """`raws` with every awaitable replaced by its result; the awaitables run concurrently."""
    pending = [(i, r) for i, r in enumerate(raws) if inspect.isawaitable(r)]
    done = await asyncio.gather(*(r for _, r in pending))
    out = list(raws)
    for (i, _), value in zip(pending, done):
        out[i] = value
    return out
