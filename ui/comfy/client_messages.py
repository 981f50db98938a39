"""What custom node packs send to WebSocket clients through `PromptServer.instance.send_sync`
(and `send`, `send_json`, `send_progress_text`, ui/comfy/comfy_host/server.py), framed as ComfyUI's
server frames it, the same whether the pack runs in the server process or on a Ray worker.

ComfyUI's `PromptServer.send` picks the frame from the message: event UNENCODED_PREVIEW_IMAGE
(2) with `(image type, PIL image, max size)` becomes a binary PREVIEW_IMAGE frame (4-byte image
type, 1 JPEG / 2 PNG, then the image); PREVIEW_IMAGE_WITH_METADATA (4) with `((type, image, max
size), metadata)` a binary frame of the JSON length, the JSON (with `image_type`) and the image;
bytes data a binary frame (4-byte event, then the bytes); anything else a text frame
`{"type": event, "data": data}`. `sid` None sends to every client, else to that client only.

`normalize(event, data)` does that encoding where the pack runs, so what travels is JSON-able
data or bytes, never a PIL image; normalizing twice changes nothing.

- In the server process `hub_sink(hub)` is the sink (`comfy_runtime.STATE.sink`, set by
  `ui.comfy.custom_nodes.attach_to_app`).
- On a Ray worker `worker_sink(put, prompt_id)` is the sink while a prompt runs: every message
  becomes a `PackMessage` in the run's event stream (the queue that carries its `executing`,
  `progress` and `executed` events), so it travels in order with them; the front
  (`ui.ray.ray_pool.RayPromptQueue._stream`) hands it to its own sink with `deliver`, as if the pack
  had called `send_sync` there. A message a pack sends on a worker while no prompt runs there (a
  background thread of its own) goes nowhere, as under `mixgraph run`.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import logging
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from mixgraph.graph import events as ev
from mixgraph.ui.comfy import comfy_runtime as rt

__all__ = ["PREVIEW_IMAGE", "UNENCODED_PREVIEW_IMAGE", "TEXT", "PREVIEW_IMAGE_WITH_METADATA",
           "normalize", "progress_text", "hub_sink", "PackMessage", "worker_sink", "deliver"]

log = logging.getLogger("mixgraph.ui")

# ComfyUI's BinaryEventTypes
PREVIEW_IMAGE, UNENCODED_PREVIEW_IMAGE, TEXT, PREVIEW_IMAGE_WITH_METADATA = 1, 2, 3, 4


def _encode_image(image_data: Any) -> tuple[str, bytes]:
    """(mime type, bytes) of `(image type, PIL image, max size)`: scaled to fit max size, saved
    as JPEG (quality 95) or PNG (fast compression), as ComfyUI sends previews."""
    from PIL import Image, ImageOps
    kind, image, max_size = image_data
    if max_size is not None:
        image = ImageOps.contain(image, (max_size, max_size), Image.Resampling.BILINEAR)
    kind = "PNG" if str(kind).upper() == "PNG" else "JPEG"
    if kind == "JPEG" and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format=kind, quality=95, compress_level=1)
    return ("image/png" if kind == "PNG" else "image/jpeg"), buf.getvalue()


def normalize(event: Any, data: Any) -> tuple[Any, Any]:
    """(event, data) with previews encoded and byte strings as `bytes`: data is then bytes (a
    binary frame; event an int) or what a text frame carries. Raises ValueError for a binary
    message whose event is not an int (ComfyUI refuses it too)."""
    if isinstance(event, int) and not isinstance(event, bool):
        if event == UNENCODED_PREVIEW_IMAGE and not isinstance(data, (bytes, bytearray)):
            mime, image = _encode_image(data)
            return PREVIEW_IMAGE, struct.pack(">I", 2 if mime == "image/png" else 1) + image
        if event == PREVIEW_IMAGE_WITH_METADATA and not isinstance(data, (bytes, bytearray)):
            image_data, metadata = data
            mime, image = _encode_image(image_data)
            head = json.dumps(dict(metadata or {}, image_type=mime)).encode()
            return event, struct.pack(">I", len(head)) + head + image
    if isinstance(data, (bytes, bytearray, memoryview)):
        if not isinstance(event, int) or isinstance(event, bool):
            raise ValueError(f"a binary WebSocket message needs an int event type, not {event!r}")
        return event, bytes(data)
    return event, data


def progress_text(text: str | bytes, node_id: str, prompt_id: str | None = None) -> bytes:
    """The payload of ComfyUI's TEXT frame: 4-byte node id length, the node id, the text; with a
    `prompt_id`, newer ComfyUI's form for clients whose feature flags say
    `supports_progress_text_metadata`: 4-byte prompt id length and the prompt id in front."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    node = str(node_id).encode()
    plain = struct.pack(">I", len(node)) + node + raw
    return plain if prompt_id is None else with_prompt_id(plain, prompt_id)


def with_prompt_id(plain: bytes, prompt_id: str) -> bytes:
    """A plain TEXT payload with the prompt id in front (the metadata form)."""
    pid = str(prompt_id).encode()
    return struct.pack(">I", len(pid)) + pid + plain


# the prompt whose worker message `deliver` is handing to the front's sink (Ray)
_delivering: contextvars.ContextVar[str | None] = contextvars.ContextVar("mixgraph_delivering",
                                                                         default=None)


def _prompt_now() -> str | None:
    """The prompt a pack's message belongs to: the one delivered from a worker, else the
    running pack node's."""
    pid = _delivering.get()
    if pid is None:
        now = rt.running()
        pid = now.prompt_id if now is not None else None
    return pid


def hub_sink(hub: Any) -> Callable[[Any, Any, str | None], None]:
    """`send_sync`'s destination in the server: frames each message onto the WebSocket hub
    (`ui.server.ws.Hub`). A message that cannot be framed is logged and dropped; the pack never fails
    for it (ComfyUI sends from a queue, so its `send_sync` never raises either)."""
    def sink(event: Any, data: Any, sid: str | None = None) -> None:
        try:
            event, data = normalize(event, data)
            text_sender = getattr(hub, "send_progress_text", None)
            pid = _prompt_now() if event == TEXT and isinstance(data, bytes) else None
            if pid is not None and text_sender is not None:   # each client in its flags' form
                text_sender(data, pid, sid)
            elif isinstance(data, bytes):
                hub.send_bytes(event, data, sid)
            else:
                hub.send(event, data, sid)
        except Exception as e:  # noqa: BLE001 - a pack's bad message must not fail its node
            log.warning("custom node message %r not sent: %s: %s", event, type(e).__name__, e)
    return sink


@dataclass(frozen=True)
class PackMessage(ev.Event):
    """A pack's `send_sync` on a Ray worker, on its way to the front server in the run's event
    stream (normalized: `data` is bytes or JSON-able)."""

    event: Any = None
    data: Any = None
    sid: str | None = None

    def to_comfy(self):
        return str(self.event), self.data


@contextlib.contextmanager
def worker_sink(put: Callable[[Any], None], prompt_id: str) -> Iterator[None]:
    """For the duration: packs' messages become `PackMessage`s handed to `put` (the worker's
    event queue). One prompt runs on a worker at a time, so the process-wide sink is this
    prompt's; the previous sink comes back after."""
    def sink(event: Any, data: Any, sid: str | None = None) -> None:
        try:
            event, data = normalize(event, data)
        except Exception as e:  # noqa: BLE001 - as hub_sink
            log.warning("custom node message %r not sent: %s: %s", event, type(e).__name__, e)
            return
        put(PackMessage(prompt_id, event, data, sid))

    before = rt.STATE.sink
    rt.STATE.sink = sink
    try:
        yield
    finally:
        if rt.STATE.sink is sink:
            rt.STATE.sink = before


def deliver(message: PackMessage) -> None:
    """On the front server: a worker's message to the clients, through this process's sink
    (none when the server serves no custom nodes: then it goes nowhere, as a local run's)."""
    sink = rt.STATE.sink
    if sink is not None:
        token = _delivering.set(message.prompt_id)
        try:
            sink(message.event, message.data, message.sid)
        finally:
            _delivering.reset(token)
