"""`create_sync_class`: the blocking twin of an async API class (ComfyUI's `ComfyAPISync`), so a
sync node body can call `api_sync.execution.set_progress(...)` where an async one awaits it."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_sync(awaitable: Any) -> Any:
    """Run a coroutine to completion from sync code. Outside an event loop it runs on a loop of
    its own in this thread; inside one (a sync call made on the engine's loop) it runs on a
    worker thread, with this thread's context variables (the running node) copied along."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, awaitable).result()


class _SyncProxy:
    """Forwards attribute access to `target`; coroutine methods come back blocking."""

    def __init__(self, target: Any):
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):
            def blocking(*args: Any, **kwargs: Any) -> Any:
                return run_sync(value(*args, **kwargs))
            blocking.__name__ = name
            blocking.__doc__ = value.__doc__
            return blocking
        return value


def create_sync_class(async_class: type) -> type:
    """A class whose instances hold, for each attribute of an `async_class()` instance (its
    `execution`, ...), a proxy whose async methods block until done."""

    def __init__(self: Any) -> None:
        inner = async_class()
        for name, value in vars(inner).items():
            setattr(self, name, _SyncProxy(value))

    return type(f"{async_class.__name__}Sync", (), {
        "__init__": __init__, "__doc__": f"The blocking form of {async_class.__name__}.",
        "VERSION": async_class.VERSION, "STABLE": async_class.STABLE,
        "__module__": async_class.__module__})
