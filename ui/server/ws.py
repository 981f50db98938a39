"""The WebSocket hub: ComfyUI's `/ws?clientId=` messages (comfy-conventions §2.2).

Text frames are `{"type", "data"}`; binary frames start with a 4-byte big-endian event type
(1: preview image, then a 4-byte image type, 1 = JPEG, 2 = PNG, then the bytes; 4: preview with
metadata, then a 4-byte JSON length, the JSON, the bytes, for clients whose `feature_flags`
say `supports_preview_metadata`; 3: a node's progress text, the node id's length and the node id,
then the text, with the prompt id's length and the prompt id in front for clients whose flags say
`supports_progress_text_metadata`). Messages go to
the client that submitted the prompt; a prompt without a client id, `status` and
`execution_interrupted` go to everyone.

The worker thread calls `send`/`send_bytes` from outside the event loop; they hand the message
to the loop with `call_soon_threadsafe`. Each connection has its own FIFO queue and one writer
task, so a client sees its messages in exactly the order they were sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import uuid
from typing import Any, Callable

from aiohttp import WSMsgType, web

from mixgraph.graph import safe_json

__all__ = ["Hub", "PREVIEW_IMAGE", "PREVIEW_IMAGE_WITH_METADATA", "JPEG", "PNG", "encode_preview"]

log = logging.getLogger("mixgraph.ui")

PREVIEW_IMAGE, TEXT, PREVIEW_IMAGE_WITH_METADATA = 1, 3, 4
JPEG, PNG = 1, 2
_CLOSE = object()

#: Feature flags sent in reply to a client's `feature_flags` message.
SERVER_FEATURES = {"supports_preview_metadata": True, "supports_progress_text_metadata": True}


class _Client:
    __slots__ = ("ws", "queue", "task", "features")

    def __init__(self, ws: web.WebSocketResponse):
        self.ws = ws
        self.features: dict = {}
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None


class Hub:
    """Connected clients by client id; thread-safe sending."""

    def __init__(self, status: Callable[[], dict] | None = None,
                 on_connect: Callable[[str], list[tuple[str, dict]]] | None = None,
                 max_upload: int = 0):
        self.status = status or (lambda: {"exec_info": {"queue_remaining": 0}})
        self.on_connect = on_connect          # messages to replay to a (re)connecting client
        self.features = dict(SERVER_FEATURES, max_upload_size=max_upload)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._clients: dict[str, _Client] = {}

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @property
    def client_ids(self) -> list[str]:
        return list(self._clients)

    # --- sending (any thread) ------------------------------------------------------------------

    def send(self, type_: str, data: Any, client_id: str | None = None) -> None:
        """Text message to `client_id`, or to everyone when it is None."""
        self._dispatch(json.dumps({"type": type_, "data": data}, default=str), client_id)

    def send_bytes(self, event: int, payload: bytes, client_id: str | None = None) -> None:
        self._dispatch(struct.pack(">I", event) + payload, client_id)

    def send_preview(self, jpeg: bytes, meta: dict, client_id: str | None = None) -> None:
        """A JPEG preview: with metadata (event 4) to clients that announced
        `supports_preview_metadata`, as a plain PREVIEW_IMAGE (event 1) to the others."""
        meta = dict(meta, image_type="image/jpeg")
        head = json.dumps(meta).encode()
        plain = struct.pack(">II", PREVIEW_IMAGE, JPEG) + jpeg
        rich = struct.pack(">II", PREVIEW_IMAGE_WITH_METADATA, len(head)) + head + jpeg
        self._dispatch((plain, rich, "supports_preview_metadata"), client_id)

    def send_progress_text(self, plain: bytes, prompt_id: str, client_id: str | None = None) -> None:
        """A TEXT frame (event 3; `plain`: node id length, node id, text): with the prompt id
        in front to clients whose feature flags say `supports_progress_text_metadata` (today's
        editor reads it so only when the server's flags say so too), plain to the others."""
        pid = str(prompt_id).encode()
        plain_frame = struct.pack(">I", TEXT) + plain
        rich = struct.pack(">II", TEXT, len(pid)) + pid + plain
        self._dispatch((plain_frame, rich, "supports_progress_text_metadata"), client_id)

    def broadcast_status(self) -> None:
        self.send("status", {"status": self.status()})

    def _dispatch(self, message: str | bytes | tuple, client_id: str | None) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._enqueue(message, client_id)
        else:
            try:
                loop.call_soon_threadsafe(self._enqueue, message, client_id)
            except RuntimeError:   # the loop closed meanwhile (shutdown)
                pass

    def _enqueue(self, message: str | bytes | tuple, client_id: str | None) -> None:
        if client_id is None:
            targets = list(self._clients.values())
        else:
            client = self._clients.get(client_id)
            targets = [client] if client is not None else []
        for client in targets:
            if isinstance(message, tuple):        # (plain, with metadata, the flag that picks it)
                rich = client.features.get(message[2])
                client.queue.put_nowait(message[1] if rich else message[0])
            else:
                client.queue.put_nowait(message)

    # --- the connection handler ----------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=1 << 20)
        await ws.prepare(request)
        sid = request.query.get("clientId") or uuid.uuid4().hex
        old = self._clients.pop(sid, None)
        if old is not None:               # a reconnect under the same id replaces the old socket
            old.queue.put_nowait(_CLOSE)
        client = _Client(ws)
        self._clients[sid] = client
        client.queue.put_nowait(json.dumps({"type": "status",
                                            "data": {"status": self.status(), "sid": sid}}))
        if self.on_connect is not None:
            for type_, data in self.on_connect(sid):
                client.queue.put_nowait(json.dumps({"type": type_, "data": data}, default=str))
        client.task = asyncio.ensure_future(self._writer(client))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_text(client, msg.data)
                elif msg.type == WSMsgType.ERROR:
                    log.debug("websocket %s closed with %s", sid, ws.exception())
        finally:
            if self._clients.get(sid) is client:
                del self._clients[sid]
            client.queue.put_nowait(_CLOSE)
            await asyncio.gather(client.task, return_exceptions=True)
        return ws

    def _on_text(self, client: _Client, text: str) -> None:
        try:
            msg = safe_json.loads(text, "a WebSocket message")
        except safe_json.JsonError:
            return
        if isinstance(msg, dict) and msg.get("type") == "feature_flags":
            if isinstance(msg.get("data"), dict):
                client.features = msg["data"]
            client.queue.put_nowait(json.dumps({"type": "feature_flags", "data": self.features}))

    async def _writer(self, client: _Client) -> None:
        while True:
            message = await client.queue.get()
            if message is _CLOSE:
                if not client.ws.closed:
                    await client.ws.close()
                return
            if client.ws.closed:
                continue
            try:
                if isinstance(message, bytes):
                    await client.ws.send_bytes(message)
                else:
                    await client.ws.send_str(message)
            except (ConnectionError, RuntimeError) as e:
                log.debug("websocket send failed: %s", e)

    async def close_all(self) -> None:
        for client in list(self._clients.values()):
            client.queue.put_nowait(_CLOSE)
        self._clients.clear()


def encode_preview(image: Any, max_side: int = 512) -> bytes | None:
    """A preview (PIL image, or float tensor/array [H,W,3] / [1,H,W,3] in 0..1) as JPEG bytes;
    None if it is not an image. Arrays are shrunk to `max_side`; a PIL image is sent at its own
    size (the sampler previewer already sized it by `--preview-size`)."""
    import io

    import numpy as np
    from PIL import Image
    if not isinstance(image, Image.Image):
        try:
            arr = np.asarray(image.detach().float().cpu() if hasattr(image, "detach") else image,
                             dtype=np.float32)
        except (TypeError, ValueError):
            return None
        if arr.ndim == 4:
            arr = arr[0]
        if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
            return None
        arr = np.clip(arr * 255.0, 0, 255).astype(np.uint8)
        image = Image.fromarray(arr[..., :3] if arr.shape[-1] != 1 else arr[..., 0])
        image.thumbnail((max_side, max_side))
    image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=85)
    return buf.getvalue()
