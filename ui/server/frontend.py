"""The browser editor: ComfyUI's web frontend (PyPI `comfyui-frontend-package`) and the cheap
endpoints it calls at startup (comfy-conventions §2.3): users, settings, user data, i18n,
workflow templates.

Settings live in `<user_dir>/comfy.settings.json`; user files (saved workflows...) under
`<user_dir>`, with the same path safety as `/view`. Single user: the `comfy-user` header is
ignored.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from aiohttp import web

from mixgraph.graph.safe_json import JsonError
from mixgraph.ui.server.security import SecurityError, read_json, safe_path

__all__ = ["frontend_root", "UserData", "index_handler", "user_css", "NOT_INSTALLED_HTML",
           "EMPTY_USER_FILES"]

SETTINGS_FILE = "comfy.settings.json"
#: User files the editor always asks for, served empty while the user has none (ComfyUI answers
#: 404, which the editor tolerates but logs as a console error on every start).
EMPTY_USER_FILES = {"user.css": ("", "text/css"),
                    "comfy.templates.json": ("[]", "application/json")}
NO_CACHE = {"Cache-Control": "no-cache, no-store, must-revalidate", "Pragma": "no-cache",
            "Expires": "0"}

NOT_INSTALLED_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>mixgraph</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>mixgraph server</h1>
<p>The HTTP/WebSocket API is running, but the browser editor is not installed.</p>
<p>Install the ComfyUI web editor into this Python environment and restart the server:</p>
<pre>pip install comfyui-frontend-package</pre>
<p>API clients can already use <code>/prompt</code>, <code>/queue</code>, <code>/history</code>,
<code>/object_info</code> and <code>/ws</code>.</p>
</body></html>
"""


def frontend_root() -> Path | None:
    """`comfyui_frontend_package/static`, if the package is installed."""
    try:
        spec = importlib.util.find_spec("comfyui_frontend_package")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        static = Path(location) / "static"
        if (static / "index.html").is_file():
            return static
    return None


async def user_css(request: web.Request) -> web.Response:
    """`/user.css`, which the editor's index.html links: empty (user styles live in the user
    data file `user.css`, served by `/api/userdata/user.css`)."""
    return web.Response(text="", content_type="text/css", headers=NO_CACHE)


def index_handler(web_root: Path | None):
    async def index(request: web.Request) -> web.StreamResponse:
        if web_root is None:
            return web.Response(text=NOT_INSTALLED_HTML, content_type="text/html", headers=NO_CACHE)
        return web.FileResponse(web_root / "index.html", headers=NO_CACHE)
    return index


def _bool(value: str | None, default: bool = False) -> bool:
    return default if value is None else value.lower() in ("true", "1", "yes")


def _safe(root: Path, rel: str) -> Path:
    try:
        return safe_path(root, rel)
    except SecurityError as e:
        raise web.HTTPForbidden(text=str(e)) from None


class UserData:
    """Settings and user files of the single local user."""

    #: Folders the editor lists at startup (a missing folder is a 404, as in ComfyUI).
    FOLDERS = ("workflows", "subgraphs")

    def __init__(self, user_dir: Path):
        self.root = Path(user_dir)

    def prepare(self) -> None:
        """Create the user folder and the folders the editor lists at startup."""
        for name in self.FOLDERS:
            (self.root / name).mkdir(parents=True, exist_ok=True)

    def routes(self) -> list[tuple[str, str, object]]:
        return [
            ("GET", "/users", self.users),
            ("GET", "/settings", self.get_settings),
            ("POST", "/settings", self.post_settings),
            ("GET", "/settings/{id}", self.get_setting),
            ("POST", "/settings/{id}", self.post_setting),
            ("GET", "/userdata", self.list_files),
            ("GET", "/userdata/{file}", self.get_file),
            ("POST", "/userdata/{file}", self.post_file),
            ("DELETE", "/userdata/{file}", self.delete_file),
            ("POST", "/userdata/{file}/move/{dest}", self.move_file),
            ("GET", "/i18n", self.empty),
            ("GET", "/workflow_templates", self.empty),
        ]

    async def users(self, request: web.Request) -> web.Response:
        return web.json_response({"storage": "server", "migrated": True})

    async def empty(self, request: web.Request) -> web.Response:
        return web.json_response({})

    # --- settings ------------------------------------------------------------------------------

    def _read_settings(self) -> dict:
        path = self.root / SETTINGS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_settings(self, settings: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (SETTINGS_FILE + ".tmp")
        tmp.write_text(json.dumps(settings, indent=4), encoding="utf-8")
        os.replace(tmp, self.root / SETTINGS_FILE)

    async def _json_body(self, request: web.Request):
        try:
            return await read_json(request)
        except JsonError as e:
            raise web.HTTPBadRequest(text=str(e)) from None

    async def get_settings(self, request: web.Request) -> web.Response:
        return web.json_response(self._read_settings())

    async def post_settings(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="settings must be a JSON object")
        self._write_settings({**self._read_settings(), **body})
        return web.Response(status=200)

    async def get_setting(self, request: web.Request) -> web.Response:
        return web.json_response(self._read_settings().get(request.match_info["id"]))

    async def post_setting(self, request: web.Request) -> web.Response:
        value = await self._json_body(request)
        self._write_settings({**self._read_settings(), request.match_info["id"]: value})
        return web.Response(status=200)

    # --- user files ----------------------------------------------------------------------------

    @staticmethod
    def _info(path: Path, rel: str) -> dict:
        st = path.stat()
        return {"path": rel, "size": st.st_size, "modified": st.st_mtime}

    async def list_files(self, request: web.Request) -> web.Response:
        q = request.query
        if not q.get("dir"):
            raise web.HTTPBadRequest(text="the 'dir' query parameter is required")
        folder = _safe(self.root, q["dir"])
        if not folder.is_dir():
            raise web.HTTPNotFound(text=f"no user data folder {q['dir']!r}")
        recurse, split, full = _bool(q.get("recurse")), _bool(q.get("split")), _bool(q.get("full_info"))
        found = []
        for dirpath, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                rel = (Path(dirpath) / name).relative_to(folder).as_posix()
                found.append((Path(dirpath) / name, rel))
            if not recurse:
                break
        if full:
            out: list = [self._info(p, rel) for p, rel in found]
        elif split:
            out = [[rel, *rel.split("/")] for _, rel in found]
        else:
            out = [rel for _, rel in found]
        return web.json_response(out)

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        rel = request.match_info["file"]
        path = _safe(self.root, rel)
        if not path.is_file() and rel in EMPTY_USER_FILES:
            text, ctype = EMPTY_USER_FILES[rel]
            return web.Response(text=text, content_type=ctype, headers=NO_CACHE)
        if not path.is_file():
            raise web.HTTPNotFound(text="no such user file")
        return web.FileResponse(path, headers={"X-Content-Type-Options": "nosniff"})

    async def post_file(self, request: web.Request) -> web.Response:
        rel = request.match_info["file"]
        path = _safe(self.root, rel)
        if path.exists() and not _bool(request.query.get("overwrite"), True):
            raise web.HTTPConflict(text=f"{rel!r} exists; pass overwrite=true to replace it")
        if path.is_dir():
            raise web.HTTPBadRequest(text=f"{rel!r} is a folder")
        data = await request.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        name = path.relative_to(self.root).as_posix()
        if _bool(request.query.get("full_info")):
            return web.json_response(self._info(path, name))
        return web.json_response(name)

    async def delete_file(self, request: web.Request) -> web.Response:
        path = _safe(self.root, request.match_info["file"])
        if not path.is_file():
            raise web.HTTPNotFound(text="no such user file")
        path.unlink()
        return web.Response(status=204)

    async def move_file(self, request: web.Request) -> web.Response:
        src = _safe(self.root, request.match_info["file"])
        dest = _safe(self.root, request.match_info["dest"])
        if not src.is_file():
            raise web.HTTPNotFound(text="no such user file")
        if dest.exists() and not _bool(request.query.get("overwrite"), True):
            raise web.HTTPConflict(text="the destination exists; pass overwrite=true")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)
        name = dest.relative_to(self.root).as_posix()
        if _bool(request.query.get("full_info")):
            return web.json_response(self._info(dest, name))
        return web.json_response(name)
