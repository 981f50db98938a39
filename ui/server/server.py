"""The HTTP/WebSocket server: ComfyUI's API (comfy-conventions §2), so existing clients and the
ComfyUI web editor work unchanged. Every route is also served under `/api`.

    app = create_app(Env(), token=None)          # aiohttp Application
    serve("127.0.0.1", 8188, models="models")    # or: mixgraph serve

Parts: `ui.server.queue` (prompt queue, worker thread, history), `ui.server.jobstore` (queue and history in
SQLite under the user directory, so they survive a crash), `ui.server.ws` (WebSocket hub),
`ui.server.security` (bind/token/Origin rules, safe paths, upload checks), `ui.server.frontend` (the editor's
static files and its settings/user-data endpoints).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import json
import logging
import math
import mimetypes
import os
import platform
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from mixgraph.graph.env import Env, OutputFolderError, writable_folder
from mixgraph.graph.executor import Executor
from mixgraph.graph.prompt import InvalidPrecision, Workflow, WorkflowError
from mixgraph.graph.safe_json import JsonError, loads as json_loads
from mixgraph.graph.validate import gc_paused, validate
from mixgraph.graph.formats.workflow import dump_api, load_workflow
from mixgraph.ui.server.editor import EditorRoutes, LogBuffer
from mixgraph.ui.server.files import convert_image, header_safe, safetensors_metadata, store_upload
from mixgraph.ui.server.frontend import UserData, frontend_root, index_handler, user_css
from mixgraph.ui.server.templates import template_routes
from mixgraph.ui.server.jobs import JobRoutes
from mixgraph.ui.server.jobstore import DB_NAME, MAX_HISTORY, JobStore, JobStoreError
from mixgraph.ui.server.limits import (LIMITS_KEY, Limits, OverLimit, body_deadline_middleware,
                                       check_prompt, check_sent, read_json, read_part)
from mixgraph.ui.server.params import (BadField, flag, optional_str, prompt_request, query_int,
                                       queue_edit)
from mixgraph.ui.server.queue import PromptQueue, QueueItem
from mixgraph.ui.server.security import (BadFileName, SecurityError, bind_is_loopback, check_bind, check_cors,
                                         check_upload_name, safe_path, security_middleware)
from mixgraph.ui.server.ws import Hub
from mixgraph.ui.comfy import custom_nodes as custom_node_packs
from mixgraph.ui.comfy.custom_nodes import LoadReport

__all__ = ["create_app", "serve", "cli_main", "Server", "SERVER_KEY", "DEFAULT_MAX_UPLOAD"]

DEFAULT_MAX_UPLOAD = 50 * 1024 * 1024
COMFYUI_API_VERSION = "0.3.64"      # the ComfyUI release whose API this server speaks
_UNSAFE_TYPES = ("text/html", "text/javascript", "application/javascript", "text/css",
                 "image/svg+xml", "application/xhtml+xml", "text/xml", "application/xml")


def _error(type_: str, message: str, details: str = "", status: int = 400) -> web.Response:
    return web.json_response({"error": {"type": type_, "message": message, "details": details,
                                        "extra_info": {}}, "node_errors": {}}, status=status)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


async def _off_loop(fn: Callable, *args: Any) -> Any:
    """`fn(*args)` in a worker thread: the event loop stays free for other requests while it
    waits on the job store's lock or the queue's, or renders a large answer."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _json_off_loop(fn: Callable, *args: Any) -> web.Response:
    """A JSON answer built and rendered in a worker thread (`_off_loop`)."""
    text = await _off_loop(lambda: _dumps(fn(*args)))
    return web.Response(text=text, content_type="application/json")


class Server:
    """The state behind the routes: environment, registry, executor, queue (over the job store
    at `jobs_db`), hub."""

    def __init__(self, env: Env, registry: Any, executor: Executor, max_upload: int,
                 user_dir: Path, unload_hooks: tuple[Callable[[], Any], ...] = (),
                 jobs_db: Path | None = None, max_history: int = MAX_HISTORY,
                 custom_nodes: LoadReport | None = None, ray: Any = None,
                 limits: Limits | None = None):
        self.env = env
        self.limits = limits or Limits()
        self.custom_nodes = custom_nodes
        self.registry = registry
        self.executor = executor
        self.max_upload = max_upload
        self.hub = Hub(status=self.status, on_connect=self._replay, max_upload=max_upload)
        queue_class, ray_kw = PromptQueue, {}
        if ray is not None:        # prompts run on Ray workers (ui/ray/ray_pool.py, DESIGN §10)
            from mixgraph.ui.ray.ray_pool import RayPromptQueue
            queue_class, ray_kw = RayPromptQueue, {"config": ray, "env": env}
        self.queue = queue_class(executor, emit=self.hub.send, emit_preview=self.hub.send_preview,
                                 on_change=self.hub.broadcast_status, unload_hooks=unload_hooks,
                                 store=JobStore(jobs_db, max_history), prepare=self._prepare,
                                 **ray_kw)
        self.user = UserData(user_dir)
        self.jobs = JobRoutes(self.queue)
        self.logs = LogBuffer()
        self.logs.send = self.hub.send
        self.editor = EditorRoutes(env, self.logs)

    def status(self) -> dict:
        return {"exec_info": {"queue_remaining": self.queue.remaining()}}

    def _replay(self, client_id: str) -> list[tuple[str, dict]]:
        item, node = self.queue.running()
        if item is not None and node is not None and item.extra_data.get("client_id") == client_id:
            return [("executing", {"node": node, "display_node": node, "prompt_id": item.prompt_id})]
        return []

    def roots(self) -> dict[str, Path]:
        return {"output": Path(self.env.output), "input": Path(self.env.input),
                "temp": Path(self.env.temp)}

    def routes(self) -> list[tuple[str, str, Callable]]:
        return [
            ("POST", "/prompt", self.post_prompt), ("GET", "/prompt", self.get_prompt),
            ("GET", "/queue", self.get_queue), ("POST", "/queue", self.post_queue),
            ("GET", "/history", self.get_history), ("POST", "/history", self.post_history),
            ("GET", "/history/{prompt_id}", self.get_history_item),
            ("POST", "/history/{prompt_id}/requeue", self.requeue),
            ("GET", "/view", self.view), ("POST", "/upload/image", self.upload_image),
            ("POST", "/upload/mask", self.upload_mask),
            ("GET", "/object_info", self.object_info),
            ("GET", "/object_info/{node_class}", self.object_info_class),
            ("POST", "/interrupt", self.interrupt), ("POST", "/free", self.free),
            ("GET", "/system_stats", self.system_stats), ("GET", "/embeddings", self.embeddings),
            ("GET", "/models", self.models), ("GET", "/models/{folder}", self.models_in),
            ("GET", "/view_metadata/{folder}", self.view_metadata),
            ("GET", "/features", self.features), ("GET", "/extensions", self.extensions),
            ("POST", "/mixgraph/estimate", self.estimate),
            ("GET", "/ws", self.hub.handle),
            *self.user.routes(), *self.jobs.routes(), *self.editor.routes(),
        ]

    # --- prompts and queue ---------------------------------------------------------------------

    async def post_prompt(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
        except JsonError as e:
            return _error("invalid_prompt", f"Invalid prompt: {e}", str(e))
        if isinstance(body, dict) and self.custom_nodes is not None:
            body = custom_node_packs.on_prompt(body)     # the packs' on-prompt handlers
        if not isinstance(body, dict) or "prompt" not in body:
            return _error("no_prompt", "No prompt provided", "No prompt provided")
        try:
            req = prompt_request(body, self.limits)
        except BadField as e:
            return _error("invalid_prompt", f"Invalid prompt: {e}", e.field)
        number = req.number if req.number is not None else self.queue.next_number(front=req.front)
        extra = dict(req.extra_data)
        try:
            wf, v = await _off_loop(self._check, req.prompt, req.targets, extra)
        except OverLimit as e:
            return web.json_response(e.body, status=400, dumps=_dumps)
        except WorkflowError as e:   # also a bad precision SPEC (InvalidPrecision), as `validate`
            return _error(e.error_type, f"Invalid prompt: {e}", str(e))
        if not v.ok:
            return web.json_response({"error": v.error, "node_errors": v.node_errors}, status=400,
                                     dumps=_dumps)
        prompt_id = req.prompt_id or str(uuid.uuid4())
        if req.client_id is not None:
            extra["client_id"] = req.client_id
        source, prompt = None, req.prompt
        if wf.source != "api":       # keep ComfyUI's item shape: the API prompt in slot 2
            source, prompt = prompt, dump_api(wf)
        try:                         # the job store writes the prompt: off the event loop
            await _off_loop(self.queue.put, QueueItem(number, prompt_id, prompt, extra,
                                                      list(v.outputs), wf, v, source, req.targets))
        except JobStoreError as e:
            return _error("server_error", f"the prompt could not be queued: {e}", status=500)
        return web.json_response({"prompt_id": prompt_id, "number": number,
                                  "node_errors": v.node_errors}, dumps=_dumps)

    def _check(self, prompt: dict, targets: list[str] | None, extra: dict | None = None):
        check_sent(prompt, self.limits)
        wf = editor_regions(load_workflow(prompt, self.registry), extra or {}, self.registry)
        check_prompt(wf.prompt, self.registry, self.limits)     # OverLimit: before any work
        v = validate(wf.prompt, self.registry, self.env, targets)
        if v.ok:        # refuse, with the estimate and a preset that fits, what cannot fit
            from mixgraph.nodes.weights import store
            from mixgraph.ui.estimate import InsufficientMemory, refusal, size_refusal
            # a tensor alone over the memory budget first: milliseconds, no tracing
            problem = size_refusal(wf, self.registry, self.env, order=v.order) or \
                refusal(wf, self.registry, self.env, order=v.order, held_bytes=store.stats().bytes)
            if problem:
                raise InsufficientMemory(problem)
        return wf, v

    async def estimate(self, request: web.Request) -> web.Response:
        """`POST /mixgraph/estimate` {"prompt": workflow, "precision": SPEC?}: the predicted peak
        memory (`ui.estimate.memory_section`), or ComfyUI's error body for an invalid prompt."""
        from mixgraph.ui.estimate import memory_section
        try:
            body = await read_json(request)
        except JsonError as e:
            return _error("invalid_prompt", f"Invalid prompt: {e}", str(e))
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), dict):
            return _error("no_prompt", "No prompt provided: send {\"prompt\": {...}}")
        spec = body.get("precision")

        def run() -> Any:
            check_sent(body["prompt"], self.limits)
            wf = load_workflow(body["prompt"], self.registry)
            check_prompt(wf.prompt, self.registry, self.limits)
            v = validate(wf.prompt, self.registry, self.env)
            return v, (memory_section(wf, self.registry, self.env, spec, v.order) if v.ok else None)
        try:
            v, section = await _off_loop(run)
        except OverLimit as e:
            return web.json_response(e.body, status=400, dumps=_dumps)
        except WorkflowError as e:
            return _error(e.error_type, f"Invalid prompt: {e}", str(e))
        if section is None:
            return web.json_response({"error": v.error, "node_errors": v.node_errors}, status=400,
                                     dumps=_dumps)
        if "error" in section:
            return _error("invalid_prompt", section["error"])
        return web.json_response(section, dumps=_dumps)

    def _prepare(self, item: QueueItem) -> Workflow:
        """The workflow of a prompt taken over from the job store after a restart (the executor
        validates it again when it runs)."""
        sent = item.source if item.source is not None else item.prompt
        return editor_regions(load_workflow(sent, self.registry), item.extra_data, self.registry)

    async def requeue(self, request: web.Request) -> web.Response:
        """`POST /history/{prompt_id}/requeue` (mixgraph's own; ComfyUI has none): queue a
        finished prompt again (one interrupted by a crash, say) as it was first submitted, under
        a new prompt id. Body (optional): `{"front": bool, "prompt_id": str}`. Answers as
        `POST /prompt` does, including its 400 when the prompt no longer validates."""
        old = request.match_info["prompt_id"]
        record = await _off_loop(self.queue.history_request, old)
        if record is None:
            raise web.HTTPNotFound(text=f"no prompt {old!r} in the history")
        body = await self._flags(request)
        front, new_id = self._field(flag, body, "front"), self._field(optional_str, body, "prompt_id")
        extra, source, targets = dict(record["extra_data"]), record.get("source"), \
            record.get("targets")
        try:
            wf, v = await _off_loop(self._check, source if source is not None else
                                    record["prompt"], targets, extra)
        except OverLimit as e:
            return web.json_response(e.body, status=400, dumps=_dumps)
        except WorkflowError as e:
            return _error("invalid_prompt", f"Invalid prompt: {e}", str(e))
        if not v.ok:
            return web.json_response({"error": v.error, "node_errors": v.node_errors}, status=400,
                                     dumps=_dumps)
        number = self.queue.next_number(front=front)
        prompt_id = new_id or str(uuid.uuid4())
        try:
            await _off_loop(self.queue.put, QueueItem(number, prompt_id, record["prompt"], extra,
                                                      list(v.outputs), wf, v, source, targets))
        except JobStoreError as e:
            return _error("server_error", f"the prompt could not be queued: {e}", status=500)
        return web.json_response({"prompt_id": prompt_id, "number": number,
                                  "node_errors": v.node_errors}, dumps=_dumps)

    async def get_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def get_queue(self, request: web.Request) -> web.Response:
        def body() -> dict:
            running, pending = self.queue.snapshot()
            out = {"queue_running": running, "queue_pending": pending}
            if hasattr(self.queue, "workers"):       # --ray: each worker, what it holds and runs
                out["mixgraph_workers"] = self.queue.workers()
            return out
        return await _json_off_loop(body)

    async def _flags(self, request: web.Request) -> dict:
        """The JSON object body of a small POST (none or null: {}); 400 for anything else."""
        if not request.body_exists:
            return {}
        try:
            body = await read_json(request)
        except JsonError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="the request body must be a JSON object")
        return body

    @staticmethod
    def _field(parse: Callable, body: dict, name: str) -> Any:
        """`parse(body, name)` (`ui.server.params`), a BadField answered 400 naming the field."""
        try:
            return parse(body, name)
        except BadField as e:
            raise web.HTTPBadRequest(text=str(e)) from None

    async def _edit(self, request: web.Request) -> Any:
        try:
            return queue_edit(await self._flags(request), self.limits)
        except BadField as e:
            raise web.HTTPBadRequest(text=str(e)) from None

    async def post_queue(self, request: web.Request) -> web.Response:
        edit = await self._edit(request)
        if edit.clear:
            await _off_loop(self.queue.clear)
        if edit.delete:
            await _off_loop(self.queue.delete, edit.delete)
        return web.Response(status=200)

    async def get_history(self, request: web.Request) -> web.Response:
        max_items = query_int(request, "max_items", None, 0)
        offset = query_int(request, "offset", -1, -1)
        return await _json_off_loop(self.queue.history, max_items, offset)   # up to max_history

    async def get_history_item(self, request: web.Request) -> web.Response:
        return await _json_off_loop(self.queue.history_item, request.match_info["prompt_id"])

    async def post_history(self, request: web.Request) -> web.Response:
        edit = await self._edit(request)
        if edit.clear:
            await _off_loop(self.queue.clear_history)
        if edit.delete:
            await _off_loop(self.queue.delete_history, edit.delete)
        return web.Response(status=200)

    async def interrupt(self, request: web.Request) -> web.Response:
        body = await self._flags(request)
        self.queue.interrupt(self._field(optional_str, body, "prompt_id"))
        return web.Response(status=200)

    async def free(self, request: web.Request) -> web.Response:
        body = await self._flags(request)
        self.queue.request_free(self._field(flag, body, "unload_models"),
                                self._field(flag, body, "free_memory"))
        return web.Response(status=200)

    # --- files ---------------------------------------------------------------------------------

    def _resolve(self, filename: str, subfolder: str, type_: str) -> Path:
        root = self.roots().get(type_ or "output")
        if root is None:
            raise web.HTTPBadRequest(text=f"type must be output, input or temp, not {type_!r}")
        try:
            return safe_path(root, filename, subfolder)
        except BadFileName as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        except SecurityError as e:
            raise web.HTTPForbidden(text=str(e)) from None

    async def view(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        if not q.get("filename"):
            raise web.HTTPNotFound(text="no filename given")
        path = self._resolve(q["filename"], q.get("subfolder", ""), q.get("type", "output"))
        if not path.is_file():
            raise web.HTTPNotFound(text="no such file")
        headers = {"Content-Disposition": f'filename="{header_safe(path.name)}"',
                   "X-Content-Type-Options": "nosniff"}
        channel, preview = q.get("channel", "rgba"), preview_option(q.get("preview"))
        if channel in ("rgb", "a") or preview:
            converted = await _off_loop(convert_image, path, channel, preview)
            if converted is not None:
                data, ctype = converted
                return web.Response(body=data, content_type=ctype, headers=headers)
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if ctype in _UNSAFE_TYPES:
            ctype = "application/octet-stream"
        headers["Content-Type"] = ctype
        return web.FileResponse(path, headers=headers)

    async def _read_upload(self, request: web.Request) -> tuple[bytes | None, str | None, dict]:
        try:
            reader = await request.multipart()
        except (AssertionError, ValueError, KeyError) as e:
            raise web.HTTPBadRequest(text=f"expected a multipart/form-data upload ({e})") from None
        data = filename = None
        fields: dict[str, str] = {}
        try:
            while True:
                part = await asyncio.wait_for(reader.next(), self.limits.body_timeout)
                if part is None:
                    break
                if part.name == "image" and part.filename is not None:
                    filename = part.filename
                    data = await read_part(part, self.max_upload, self.limits.body_timeout)
                elif part.name in ("type", "subfolder", "overwrite", "original_ref"):
                    fields[part.name] = (await read_part(part, 1 << 16, self.limits.body_timeout)
                                         ).decode("utf-8", "replace")
                else:
                    await part.release()
        except asyncio.TimeoutError:
            raise web.HTTPRequestTimeout(
                text=f"the upload stalled: no part header for {self.limits.body_timeout:g} s "
                     f"(--body-timeout sets the limit)", headers={"Connection": "close"}) from None
        except (HttpProcessingError, ValueError) as e:
            # a part header aiohttp refuses: a NUL, CR or LF in the file name, say
            detail = getattr(e, "message", "") or str(e)
            raise web.HTTPBadRequest(text=f"malformed multipart upload: {detail.strip()} (file "
                                          f"names may not contain control characters such as "
                                          f"NUL or line breaks)") from None
        return data, filename, fields

    async def upload_image(self, request: web.Request) -> web.Response:
        return await self._upload(request, mask=False)

    async def upload_mask(self, request: web.Request) -> web.Response:
        return await self._upload(request, mask=True)

    async def _upload(self, request: web.Request, mask: bool) -> web.Response:
        data, filename, fields = await self._read_upload(request)
        if data is None or not filename:
            raise web.HTTPBadRequest(text="no image file in the 'image' field")
        if "/" in filename or "\\" in filename:
            raise web.HTTPForbidden(text="an upload's file name may not contain a path; use the "
                                         "'subfolder' field")
        try:
            check_upload_name(filename)
        except BadFileName as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        type_, subfolder = fields.get("type") or "input", fields.get("subfolder", "")
        path = self._resolve(filename, subfolder, type_)
        original = None
        if mask:
            try:
                ref = json_loads(fields.get("original_ref") or "", "original_ref")
                original = self._resolve(str(ref["filename"]), str(ref.get("subfolder") or ""),
                                         str(ref.get("type") or "output"))
            except (ValueError, KeyError, TypeError):
                raise web.HTTPBadRequest(text="original_ref must be JSON {filename, subfolder, "
                                              "type}") from None
            if not original.is_file():
                raise web.HTTPNotFound(text="the original image of the mask does not exist")
        overwrite = fields.get("overwrite", "").lower() in ("true", "1")
        try:
            name = await asyncio.get_running_loop().run_in_executor(
                None, store_upload, path, data, original, overwrite)
        except SecurityError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        except OSError as e:  # the folder cannot hold it: a file in the way, full, read-only
            where = "/".join(x for x in (type_, subfolder) if x)
            raise web.HTTPBadRequest(text=f"cannot store the upload in {where!r}: "
                                          f"{e.strerror or e}") from None
        return web.json_response({"name": name, "subfolder": subfolder, "type": type_})

    # --- catalogue and system ------------------------------------------------------------------

    async def object_info(self, request: web.Request) -> web.Response:
        info = await asyncio.get_running_loop().run_in_executor(
            None, self.registry.object_info, self.env)
        return web.json_response(info, dumps=_dumps)

    async def object_info_class(self, request: web.Request) -> web.Response:
        name = request.match_info["node_class"]
        info = await asyncio.get_running_loop().run_in_executor(
            None, self.registry.object_info_for, name, self.env)
        return web.json_response(info, dumps=_dumps)

    async def system_stats(self, request: web.Request) -> web.Response:
        def stats() -> dict:
            out = system_stats(self.env)
            if hasattr(self.queue, "workers"):
                out["mixgraph_workers"] = self.queue.workers()
            return out
        return await _json_off_loop(stats)

    async def embeddings(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        names = folders.list_files(self.env, "embeddings")
        return web.json_response(sorted({n.rsplit(".", 1)[0] for n in names}))

    async def models(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        return web.json_response(list(folders.FOLDERS))

    async def models_in(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        folder = request.match_info["folder"]
        if folder not in folders.FOLDERS and folder not in folders.ALIASES:
            raise web.HTTPNotFound(text=f"unknown model folder {folder!r}")
        files = await asyncio.get_running_loop().run_in_executor(
            None, folders.list_files, self.env, folder)
        return web.json_response(files)

    async def view_metadata(self, request: web.Request) -> web.Response:
        from mixgraph.nodes.helpers import folders
        folder, name = request.match_info["folder"], request.query.get("filename", "")
        if not name.endswith((".safetensors", ".sft")):
            raise web.HTTPNotFound(text="only safetensors files carry metadata")
        try:
            path = folders.resolve(self.env, folder, name)
        except folders.FolderError as e:
            raise web.HTTPNotFound(text=str(e)) from None
        return web.json_response(safetensors_metadata(path))

    async def features(self, request: web.Request) -> web.Response:
        return web.json_response(self.hub.features)

    async def extensions(self, request: web.Request) -> web.Response:
        packs = self.custom_nodes.extension_urls() if self.custom_nodes is not None else []
        return web.json_response(extension_urls(frontend_root()) + packs)


# --- helpers used by the handlers ---------------------------------------------------------------

def preview_option(text: str | None) -> str | None:
    """`/view`'s `preview=FORMAT;QUALITY` ("webp;90"): 400 naming it for a quality that is not
    a whole number from 0 to 100."""
    if not text:
        return None
    quality = text.partition(";")[2]
    if quality and not (quality.isascii() and quality.isdigit() and len(quality) <= 3
                        and int(quality) <= 100):
        raise web.HTTPBadRequest(text=f"query parameter preview must be FORMAT;QUALITY with a "
                                      f"quality from 0 to 100, not {text[:40]!r}")
    return text


def editor_regions(wf: Workflow, extra: dict, registry: Any) -> Workflow:
    """The editor queues an API prompt and sends its UI graph along in
    `extra_data.extra_pnginfo.workflow`; ComfyUI ignores groups, but here a precision-tagged group
    of that graph (DESIGN §3) is a region of the prompt: its node ids are the prompt's ids.
    Subgraph regions count too (the prompt's ids are the frontend's `"10:3"` execution ids).
    A UI graph that does not convert (legacy group nodes...) leaves the prompt without regions; one whose
    precision tags do not parse is rejected (`InvalidPrecision`), as `mixgraph validate` would."""
    pnginfo = extra.get("extra_pnginfo")
    ui = pnginfo.get("workflow") if isinstance(pnginfo, dict) else None
    if wf.source != "api" or wf.precision.regions or not isinstance(ui, dict) \
            or not (ui.get("groups") or (ui.get("definitions") or {}).get("subgraphs")):
        return wf
    try:
        regions = load_workflow(ui, registry).precision.regions
    except InvalidPrecision:
        raise
    except (WorkflowError, NotImplementedError, ValueError, TypeError, KeyError):
        return wf
    ids = frozenset(wf.prompt)
    kept = tuple(dataclasses.replace(r, nodes=r.nodes & ids) for r in regions if r.nodes & ids)
    if not kept:
        return wf
    return dataclasses.replace(wf, precision=dataclasses.replace(wf.precision, regions=kept))


def extension_urls(web_root: Path | None) -> list[str]:
    """JS extension URLs: the frontend's own `extensions/**.js` plus ours (ui/server/web/*.js)."""
    urls = []
    if web_root is not None:
        urls += sorted("/" + p.relative_to(web_root).as_posix()
                       for p in (web_root / "extensions").rglob("*.js"))
    ours = Path(__file__).with_name("web")
    if ours.is_dir():
        urls += sorted("/extensions/mixgraph/" + p.relative_to(ours).as_posix()
                       for p in ours.rglob("*.js"))
    return urls


def _memory() -> tuple[int, int]:
    total = free = 0
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        total, free = info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    return total, free


def system_stats(env: Env) -> dict:
    import torch
    try:
        from importlib.metadata import version
        ours = version("mixgraph")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        ours = "0.0.0"
    try:
        from importlib.metadata import version
        frontend = version("comfyui-frontend-package")
    except Exception:  # noqa: BLE001
        frontend = ""
    ram_total, ram_free = _memory()
    devices = []
    device = torch.device(env.device or "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index or 0
        free, total = torch.cuda.mem_get_info(index)
        reserved = torch.cuda.memory_reserved(index)
        devices.append({"name": f"cuda:{index} {torch.cuda.get_device_name(index)}", "type": "cuda",
                        "index": index, "vram_total": total, "vram_free": free,
                        "torch_vram_total": reserved,
                        "torch_vram_free": reserved - torch.cuda.memory_allocated(index)})
    else:
        devices.append({"name": str(device), "type": device.type, "index": device.index,
                        "vram_total": ram_total, "vram_free": ram_free,
                        "torch_vram_total": ram_total, "torch_vram_free": ram_free})
    from mixgraph.graph.precision import hardware_section
    devices[0]["mixgraph_precision"] = hardware_section(str(device))  # native bf16/f16/int8
    return {"system": {"os": os.name, "ram_total": ram_total, "ram_free": ram_free,
                       "comfyui_version": COMFYUI_API_VERSION, "mixgraph_version": ours,
                       "required_frontend_version": frontend,
                       "installed_templates_version": "", "required_templates_version": "",
                       "python_version": sys.version, "pytorch_version": torch.__version__,
                       "embedded_python": False,
                       # mixgraph has no api.comfy.org nodes; ComfyUI's flag for that also stops
                       # the editor from asking api.comfy.org about ComfyUI releases.
                       "argv": [*sys.argv, "--disable-api-nodes"],
                       "platform": platform.platform()},
            "devices": devices}


# --- the application ------------------------------------------------------------------------------

SERVER_KEY = web.AppKey("mixgraph_server", Server)


def create_app(env: Env, *, registry: Any = None, token: str | None = None, insecure: bool = False,
               host: str = "127.0.0.1", executor: Executor | None = None,
               max_upload: int = DEFAULT_MAX_UPLOAD, user_dir: str | os.PathLike | None = None,
               unload_hooks: tuple[Callable[[], Any], ...] | None = None,
               jobs_db: str | os.PathLike | None = None,
               max_history: int = MAX_HISTORY, cors_origin: str | None = None,
               custom_nodes: LoadReport | None = None, cache: Any = None,
               ray: Any = None, limits: Limits | None = None) -> web.Application:
    """The aiohttp application. Raises SecurityError for a non-loopback `host` without a token
    (unless `insecure`). `registry` defaults to the node library; `executor` to a new one.
    `user_dir` is the user's folder (settings), `./user/default` by default, inside the user
    directory that also holds the job store: `jobs_db` defaults to
    `<user_dir>/../mixgraph/jobs.sqlite3`; it is opened (and its queue taken over) at startup.
    `cors_origin`: the origin `--enable-cors-header` trusts (`ui.server.security.check_cors`).
    `custom_nodes`: the loaded custom node packs (ui.comfy.custom_nodes.load_packs), whose routes,
    WEB_DIRECTORY files and WebSocket messages the app serves.

    `cache`: the new executor's output cache (`graph.cache.make_cache`; default mode if None).
    `ray`: a `ui.ray.ray_pool.RayConfig`: prompts run on Ray workers, started with the app.
    `limits`: what one request may ask (`ui.server.limits.Limits`; its defaults if None)."""
    check_bind(host, token, insecure)
    check_cors(cors_origin, token, insecure)
    hooks = tuple(unload_hooks) if unload_hooks is not None else ()
    if registry is None and executor is None:
        from mixgraph.ui.api import default_registry
        registry = default_registry()
        if unload_hooks is None:
            from mixgraph.nodes.weights import store
            hooks = (store.clear,)
    if executor is None:
        executor = Executor(registry, env, cache)
    registry = executor.registry if registry is None else registry
    user = Path(user_dir) if user_dir is not None else Path("user") / "default"
    server = Server(env, registry, executor, max_upload, user, hooks,
                    Path(jobs_db) if jobs_db is not None else user.parent / "mixgraph" / DB_NAME,
                    max_history, custom_nodes, ray, limits)

    app = web.Application(client_max_size=max(max_upload + (1 << 20), server.limits.max_body),
                          middlewares=[
        security_middleware(token=token, loopback_only=bind_is_loopback(host) and token is None
                            and not insecure, cors_origin=cors_origin),
        body_deadline_middleware()])
    app[SERVER_KEY] = server
    app[LIMITS_KEY] = server.limits
    for method, path, handler in server.routes():
        app.router.add_route(method, path, handler)
        app.router.add_route(method, "/api" + path, handler)
    if custom_nodes is not None:
        from mixgraph.ui.comfy.client_messages import hub_sink
        custom_node_packs.attach_to_app(app, custom_nodes, hub_sink(server.hub))
    ours = Path(__file__).with_name("web")
    if ours.is_dir():
        app.router.add_static("/extensions/mixgraph", ours)
    web_root = frontend_root()
    app.router.add_get("/", index_handler(web_root))
    app.router.add_get("/user.css", user_css)
    for method, path, handler in template_routes(registry, env):
        app.router.add_route(method, path, handler)
    if web_root is not None:
        app.router.add_static("/", web_root)

    async def on_startup(app: web.Application) -> None:
        server.hub.attach(asyncio.get_running_loop())
        server.user.prepare()
        logging.getLogger().addHandler(server.logs)        # the editor's log panel
        server.queue.start()

    async def on_shutdown(app: web.Application) -> None:
        await server.hub.close_all()

    async def on_cleanup(app: web.Application) -> None:
        logging.getLogger().removeHandler(server.logs)
        await asyncio.get_running_loop().run_in_executor(None, server.queue.stop)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def serve(host: str = "127.0.0.1", port: int = 8188, models: str | None = None,
          input: str | None = None, output: str | None = None, token: str | None = None,
          insecure: bool = False, device: str | None = None,
          max_upload: int = DEFAULT_MAX_UPLOAD, max_history: int = MAX_HISTORY,
          temp: str | None = None, user_dir: str | None = None, cors_origin: str | None = None,
          extra_model_paths: dict[str, tuple] | None = None, settings: dict | None = None,
          custom_nodes_args: Any = None, cache: Any = None, ray: Any = None,
          limits: Limits | None = None) -> int:
    """Run the server until Ctrl-C. Returns an exit code (2: refused configuration, or a job
    store that cannot be used). `host` may list several addresses, comma-separated; the other
    keywords come from ComfyUI's flags (`ui.comfy.comfy_flags`)."""
    try:
        check_bind(host, token, insecure)
        check_cors(cors_origin, token, insecure)
    except SecurityError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from mixgraph.graph.env import check_device
    problem = check_device(device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    env = dataclasses.replace(Env.from_args(models=models, input=input, output=output, temp=temp,
                                            device=device),
                              extra_model_paths=tuple((extra_model_paths or {}).items()),
                              settings=tuple((settings or {}).items()))
    try:
        for folder, what in ((env.input, "input folder"), (env.output, "output folder"),
                             (env.temp, "temp folder")):
            writable_folder(folder, what)
    except OutputFolderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:     # keep warnings on stderr once the log panel's
        logging.basicConfig(format="%(message)s")    # handler stops Python's last-resort one
    # Start-up allocates hundreds of thousands of long-lived objects (the node library, torch's
    # registrations, the packs); the cycle collector's passes over them are wasted work before
    # the first connection (about a fifth of the start-up on a busy machine), and once frozen
    # they stay out of every later collection too.
    with gc_paused():
        from mixgraph.ui.api import default_registry
        packs = custom_node_packs.load_from_args(custom_nodes_args, default_registry(), env)
        for line in packs.messages():                        # each failed pack, with its error
            print(f"warning: {line}", file=sys.stderr)
        app = create_app(env, token=token, insecure=insecure, host=host, max_upload=max_upload,
                         max_history=max_history, user_dir=user_dir, cors_origin=cors_origin,
                         custom_nodes=packs, cache=cache, ray=ray, limits=limits)
        try:            # before listening: a damaged job store is a clear error, not a traceback
            app[SERVER_KEY].queue.open()       # (with --ray: also Ray and its workers, ui/ray_pool)
        except (JobStoreError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    gc.freeze()
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    shown = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    if token is None and not bind_is_loopback(host):
        print("warning: listening beyond localhost without a token (--insecure)", file=sys.stderr)
    try:
        web.run_app(app, host=hosts if len(hosts) > 1 else hosts[0], port=port,
                    print=lambda _: print(f"mixgraph serving on {url}", file=sys.stderr))
    except OSError as e:    # the listening socket: port in use, address not here, unknown host
        print(f"error: cannot listen on {host} port {port}: {e.strerror or e}"
              + (" (another server runs there: stop it or give another --port)"
                 if e.errno == errno.EADDRINUSE else ""), file=sys.stderr)
        return 2
    return 0


def cli_main(args: Any) -> int:
    """`mixgraph serve` (ui/cli.py calls this with its parsed arguments, ComfyUI's flags
    included: `ui.comfy.comfy_flags.serve_options` maps them; the cache flags pick the cache mode)."""
    from mixgraph.ui.comfy.comfy_flags import FlagError, apply_memory, cache_from_args, memory_from_args, serve_options
    try:
        options, notes = serve_options(args)
        memory, memory_notes = memory_from_args(args)
        notes += memory_notes
        budget = apply_memory(memory, options.get("device"))
        cache = cache_from_args(args)      # after apply_memory: its bound is a share of the budget
        limits = limits_from_args(args)
        ray = None
        if getattr(args, "ray", None) is not None:
            from mixgraph.ui.ray.ray_pool import RayUnavailable, config_from_args
            try:
                ray = config_from_args(args)
            except RayUnavailable as e:
                raise ValueError(str(e)) from None
    except (FlagError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    print(f"memory budget: {budget.gib:.2f} GiB on {budget.device} ({budget.origin}; mode {budget.mode})",
          file=sys.stderr)
    return serve(**options, cache=cache, token=getattr(args, "token", None),
                 insecure=bool(getattr(args, "insecure", False)),
                 max_history=getattr(args, "max_history", None) or MAX_HISTORY,
                 custom_nodes_args=args, ray=ray, limits=limits)


def limits_from_args(args: Any) -> Limits:
    """`Limits` from serve's flags (`--max-request-mb` ...); ValueError naming a bad one."""
    given = {"max_text": "max_text_length", "max_nodes": "max_nodes",
             "max_batch_pixels": "max_batch_pixels", "body_timeout": "body_timeout"}
    kw: dict[str, Any] = {}
    for field, attr in given.items():
        value = getattr(args, attr, None)
        if value is not None:
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{attr.replace('_', '-')} {value}: give a number above 0")
            kw[field] = value
    mb = getattr(args, "max_request_mb", None)
    if mb is not None:
        if not (math.isfinite(mb) and 0 < mb < 1 << 20):
            raise ValueError(f"--max-request-mb {mb}: give a size in MB above 0")
        kw["max_body"] = max(1, round(mb * 1024 * 1024))
    return Limits(**kw)
