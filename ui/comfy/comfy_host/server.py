"""ComfyUI's `server` module for custom node packs: `PromptServer.instance`.

* `routes`: an aiohttp `RouteTableDef`; what packs add to it is served by `mixgraph serve`
  (also under `/api`, as ComfyUI does), run with the host modules on the import path.
* `send_sync(event, data, sid)` / `await send(...)`: a WebSocket message to client `sid`, or to
  every client when `sid` is None (`bytes` data with an int event: a binary frame; previews as
  ComfyUI frames them, `ui.comfy.client_messages`). On a Ray worker they reach the front server's
  clients in order with the prompt's events. Under `mixgraph run` there is no client and
  messages go nowhere, as in a headless ComfyUI.
* `client_id`, `last_node_id`, `last_prompt_id`: the running prompt's client, node and id.
* `add_on_prompt_handler(fn)`: `fn(json_data) -> json_data` on every `POST /prompt` body.
"""

from __future__ import annotations

from typing import Any, Callable

from aiohttp import web

import mixgraph.ui.comfy.comfy_runtime as _rt
from mixgraph.ui.comfy.client_messages import progress_text


class BinaryEventTypes:
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3
    PREVIEW_IMAGE_WITH_METADATA = 4


class PromptServer:
    instance: "PromptServer"

    def __init__(self) -> None:
        self.routes = web.RouteTableDef()
        self.on_prompt_handlers: list[Callable[[dict], dict]] = []
        self.supports = ["custom_nodes_from_web"]
        self.app = None
        self.loop = None
        self.prompt_queue = None

    @property
    def client_id(self) -> str | None:
        now = _rt.running()
        return now.ctx.extra_data.get("client_id") if now is not None else None

    @property
    def last_node_id(self) -> str | None:
        now = _rt.running()
        return now.node_id if now is not None else None

    @property
    def last_prompt_id(self) -> str | None:
        now = _rt.running()
        return now.prompt_id if now is not None else None

    def send_sync(self, event: Any, data: Any, sid: str | None = None) -> None:
        sink = _rt.STATE.sink
        if sink is not None:
            sink(event, data, sid)

    async def send(self, event: Any, data: Any, sid: str | None = None) -> None:
        self.send_sync(event, data, sid)

    async def send_json(self, event: Any, data: Any, sid: str | None = None) -> None:
        self.send_sync(event, data, sid)

    def send_progress_text(self, text: str | bytes, node_id: str, sid: str | None = None) -> None:
        self.send_sync(BinaryEventTypes.TEXT, progress_text(text, node_id), sid)

    def add_on_prompt_handler(self, handler: Callable[[dict], dict]) -> None:
        self.on_prompt_handlers.append(handler)

    def trigger_on_prompt(self, json_data: dict) -> dict:
        for handler in self.on_prompt_handlers:
            json_data = handler(json_data)
        return json_data


PromptServer.instance = PromptServer()
