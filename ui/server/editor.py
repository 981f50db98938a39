"""The rest of what the web editor asks for at startup (comfy-conventions §2.3), beside
`ui.server.frontend` (settings, user data) and `ui.server.jobs` (queue and history panels):

* `GET /global_subgraphs`: subgraph blueprints shipped by the server; mixgraph has none (`{}`).
* `GET /experiment/models[/{folder}]`: the model library panel: folders with their roots, then the
  files of one folder `[{name, pathIndex, modified, size}]` (pathIndex: which root holds it).
* `/internal/logs`, `/internal/logs/raw`, `PATCH /internal/logs/subscribe`: the log panel, fed by
  the `mixgraph` loggers (the last `LOG_LINES` records; subscribers get `logs` WS messages).
* `/internal/folder_paths`, `/internal/files/{output|input|temp}` (newest first, not recursive).
The template browser (`/templates/...`) is `ui.server.templates`.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from mixgraph.graph.safe_json import JsonError
from mixgraph.ui.server.security import read_json

__all__ = ["EditorRoutes", "LogBuffer", "LOG_LINES"]

LOG_LINES = 1000
_TERMINAL = {"cols": 120, "rows": 40}


class LogBuffer(logging.Handler):
    """The last `LOG_LINES` log records as ComfyUI's `{t, m}` entries; forwards new ones to
    `send(entries)` while someone is subscribed."""

    def __init__(self, capacity: int = LOG_LINES):
        super().__init__(logging.INFO)
        self.entries: collections.deque = collections.deque(maxlen=capacity)
        self.subscribers: set[str] = set()
        self.send: Callable[[str, dict, str], None] | None = None
        self._guard = threading.Lock()
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = {"t": datetime.datetime.fromtimestamp(record.created).isoformat(),
                     "m": self.format(record) + "\n"}
        except Exception:  # noqa: BLE001 - logging must never raise
            return
        with self._guard:
            self.entries.append(entry)
            targets = list(self.subscribers)
        if self.send is not None:
            for client_id in targets:
                self.send("logs", {"entries": [entry], "size": _TERMINAL}, client_id)

    def subscribe(self, client_id: str, enabled: bool) -> None:
        with self._guard:
            (self.subscribers.add if enabled else self.subscribers.discard)(client_id)

    def raw(self) -> dict:
        with self._guard:
            return {"entries": list(self.entries), "size": _TERMINAL}


class EditorRoutes:
    """Model library, log panel, folder listings and blueprint stubs for one server."""

    def __init__(self, env: Any, logs: LogBuffer):
        self.env = env
        self.logs = logs

    def routes(self) -> list[tuple[str, str, Any]]:
        return [
            ("GET", "/global_subgraphs", self.global_subgraphs),
            ("GET", "/experiment/models", self.model_folders),
            ("GET", "/experiment/models/{folder}", self.model_files),
            ("GET", "/internal/logs", self.log_text),
            ("GET", "/internal/logs/raw", self.log_raw),
            ("PATCH", "/internal/logs/subscribe", self.log_subscribe),
            ("GET", "/internal/folder_paths", self.folder_paths),
            ("GET", "/internal/files/{directory_type}", self.files),
        ]

    async def global_subgraphs(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def model_folders(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        return web.json_response([{"name": key,
                                   "folders": [str(r) for r in folders.roots(self.env, key)]}
                                  for key in folders.FOLDERS])

    async def model_files(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        folder = request.match_info["folder"]
        if folder not in folders.FOLDERS and folder not in folders.ALIASES:
            raise web.HTTPNotFound(text=f"unknown model folder {folder!r}")
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(None, _model_files, self.env, folder))

    async def log_text(self, request: web.Request) -> web.Response:
        return web.json_response("".join(e["m"] for e in self.logs.raw()["entries"]))

    async def log_raw(self, request: web.Request) -> web.Response:
        return web.json_response(self.logs.raw())

    async def log_subscribe(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
        except JsonError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if not isinstance(body, dict) or not isinstance(body.get("clientId"), str):
            raise web.HTTPBadRequest(text="expected {\"enabled\": bool, \"clientId\": str}")
        self.logs.subscribe(body["clientId"], bool(body.get("enabled")))
        return web.Response(status=200)

    async def folder_paths(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        paths = {key: [str(Path(r).resolve()) for r in folders.roots(self.env, key)]
                 for key in folders.FOLDERS}
        return web.json_response(paths)

    async def files(self, request: web.Request) -> web.Response:
        kind = request.match_info["directory_type"]
        roots = {"output": self.env.output, "input": self.env.input, "temp": self.env.temp}
        if kind not in roots:
            raise web.HTTPBadRequest(text="directory_type must be output, input or temp")
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(None, _newest_first, Path(roots[kind])))


def _model_files(env: Any, folder: str) -> list[dict]:
    from mixgraph.nodes.helpers import folders
    out, seen = [], set()
    for index, root in enumerate(folders.roots(env, folder)):
        if not root.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(root, followlinks=True):
            for f in sorted(files):
                path = Path(dirpath) / f
                name = path.relative_to(root).as_posix()
                if not f.lower().endswith(folders.MODEL_EXTENSIONS) or name in seen:
                    continue
                seen.add(name)
                st = path.stat()
                out.append({"name": name, "pathIndex": index, "modified": st.st_mtime,
                            "size": st.st_size})
    return sorted(out, key=lambda m: m["name"])


def _newest_first(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    entries = [e for e in os.scandir(folder) if e.is_file()]
    return [e.name for e in sorted(entries, key=lambda e: e.stat().st_mtime, reverse=True)]

