"""The editor's template browser and default graph, from the workflows in `workflows/`.

The web editor asks for `/templates/index.json` (a list of categories, each with `templates`:
name, title, description, mediaType, mediaSubtype), then `/templates/NAME-1.png` for each
thumbnail and `/templates/NAME.json` for the graph it opens. We answer with the workflows of the
checkout's `workflows/` folder (or `MIXGRAPH_WORKFLOWS`): titles and descriptions come from the
table in its README.md, thumbnails from `workflows/thumbnails/NAME.png` (made by
`tools/make_thumbnails.py`), and API-format files are converted to the editor's UI format
(`graph.formats.ui_export`). The default graph (`DEFAULT_TEMPLATE`, the demo's txt2img on the embedded
model) is always first, also when no workflows folder exists (an installed wheel).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["Templates", "template_routes", "DEFAULT_TEMPLATE", "workflows_dir", "read_index"]

DEFAULT_TEMPLATE = "txt2img_shapes"
_ROW = re.compile(r"^\|\s*`([^`]+)\.json`\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*(.+?)\s*\|\s*$")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_INDEX = re.compile(r"index(\.[A-Za-z_-]{2,10})?\.json")


def workflows_dir() -> Path | None:
    """`MIXGRAPH_WORKFLOWS`, else the checkout's `workflows/` (absent in an installed wheel)."""
    env = os.environ.get("MIXGRAPH_WORKFLOWS")
    folder = Path(env) if env else Path(__file__).resolve().parents[2] / "workflows"
    return folder if folder.is_dir() else None


def read_index(folder: Path) -> list[dict[str, str]]:
    """The rows of README.md's table: `| \\`NAME.json\\` | title | format | description |`."""
    readme = folder / "README.md"
    rows = []
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = _ROW.match(line)
            if m and (folder / f"{m.group(1)}.json").is_file():
                rows.append({"name": m.group(1), "title": m.group(2), "format": m.group(3),
                             "description": m.group(4).replace("`", "")})
    return rows


class Templates:
    def __init__(self, registry: Any, env: Any = None, folder: Path | None = None):
        self.registry = registry
        self.env = env
        self.folder = folder if folder is not None else workflows_dir()

    def entries(self) -> list[dict[str, str]]:
        rows = read_index(self.folder) if self.folder is not None else []
        if not any(r["name"] == DEFAULT_TEMPLATE for r in rows):
            rows.insert(0, {"name": DEFAULT_TEMPLATE, "title": "Text to image (embedded model)",
                            "format": "ComfyUI API", "description": "The demo: txt2img on the embedded "
                            "shapes model, 64x64 upscaled to 256x256."})
        rows.sort(key=lambda r: r["name"] != DEFAULT_TEMPLATE)
        return rows

    def index(self) -> list[dict]:
        templates = []
        for row in self.entries():
            templates.append({"name": row["name"], "title": row["title"], "description": row["description"],
                              "mediaType": "image", "mediaSubtype": "png", "tags": [row["format"]]})
        return [{"moduleName": "default", "title": "mixgraph", "type": "image", "category": "mixgraph",
                 "templates": templates}]

    def graph(self, name: str) -> dict:
        """The UI-format graph of one template; KeyError if there is no such template."""
        from mixgraph.graph.formats.ui_export import to_ui
        from mixgraph.ui.api import load

        if name == DEFAULT_TEMPLATE and (self.folder is None or not (self.folder / f"{name}.json").is_file()):
            from mixgraph.ui.demo import demo_workflow
            source: Any = demo_workflow()
        elif self.folder is not None and name in {r["name"] for r in self.entries()}:
            path = self.folder / f"{name}.json"
            raw = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(raw, dict) and isinstance(raw.get("nodes"), list):
                return raw  # already the editor's format
            source = path
        else:
            raise KeyError(name)
        return to_ui(load(source, self.registry), self.registry, self.env)

    def thumbnail(self, name: str) -> Path | None:
        if self.folder is None:
            return None
        path = self.folder / "thumbnails" / f"{name}.png"
        return path if path.is_file() else None


def template_routes(registry: Any, env: Any = None) -> list[tuple[str, str, Any]]:
    """`/templates/index*.json`, `/templates/NAME.json`, `/templates/NAME-1.png` (at the root,
    where the editor asks for them, not under `/api`)."""
    templates = Templates(registry, env)

    async def serve(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if not _NAME.fullmatch(name):
            raise web.HTTPNotFound(text="no such template")
        if name == "index_logo.json":
            return web.json_response({})
        if _INDEX.fullmatch(name):
            return web.json_response(templates.index())
        if name.endswith("-1.png"):
            path = templates.thumbnail(name[: -len("-1.png")])
            if path is None:
                raise web.HTTPNotFound(text=f"no thumbnail for template {name[:-6]!r}")
            return web.FileResponse(path)
        if name.endswith(".json"):
            try:
                graph = templates.graph(name[: -len(".json")])
            except KeyError:
                raise web.HTTPNotFound(text=f"no template {name[:-5]!r}") from None
            except Exception as e:  # noqa: BLE001 - a broken file: say which, no traceback
                raise web.HTTPInternalServerError(text=f"template {name}: {e}") from None
            return web.json_response(graph)
        raise web.HTTPNotFound(text="no such template")

    return [("GET", "/templates/{name}", serve)]
