"""What one request may ask of the server: body size and arrival time, and the size of a prompt.

    limits = Limits(max_text=200_000)             # `mixgraph serve --max-text-length 200000`
    create_app(env, limits=limits)

A client that is wrong or hostile must get a clear 4xx at once, never hold the one prompt worker
for minutes or a connection forever. The bounds are generous for real use (a long prompt is a
few thousand characters, a big graph a few hundred nodes, a UI workflow JSON a few MB) and each
refusal names the limit and the flag that raises it:

* a JSON request body of more than `max_body` bytes (`read_json`, 413);
* a request body that does not arrive in full within `body_timeout` seconds: shorter than its
  Content-Length, or dripped in (`body_deadline_middleware`, 408, the connection closed);
* a prompt of more than `max_nodes` nodes, a STRING literal of more than `max_text` characters,
  a list literal of more than `max_list` items, a node whose literal batch_size x width x height
  exceeds `max_batch_pixels`, an input name no node declares that holds a control character or
  is not in Unicode normal form NFKC (fullwidth letters, a NUL: a look-alike of a real input
  that would otherwise be ignored silently) (`check_prompt`, 400 in ComfyUI's error body).
"""

from __future__ import annotations

import asyncio
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterator

from aiohttp import web

from mixgraph.graph.prompt import BadLink, Link, NodeCall
from mixgraph.graph.safe_json import loads as json_loads
from mixgraph.graph.spec import REQUIRED
from mixgraph.graph.validate import Problem

__all__ = ["Limits", "LIMITS_KEY", "OverLimit", "check_sent", "check_prompt", "read_json",
           "read_part", "body_deadline_middleware"]

MB = 1024 * 1024
#: Bodies at least this long are parsed in a worker thread (parsing 30 MB takes ~0.3 s).
_PARSE_OFF_LOOP = 256 * 1024
_SIZE_INPUTS = ("batch_size", "width", "height")


@dataclass(frozen=True)
class Limits:
    """Bounds on one request (see the module docstring); the serve flag of each in brackets."""

    max_body: int = 32 * MB            # bytes of a JSON request body (--max-request-mb)
    max_text: int = 100_000            # characters of one STRING literal (--max-text-length)
    max_list: int = 10_000             # items of one list: a literal, targets, ids to delete
    max_nodes: int = 10_000            # nodes of one prompt (--max-nodes)
    max_batch_pixels: int = 1 << 30    # batch_size x width x height of one node (--max-batch-pixels)
    body_timeout: float = 30.0         # seconds a request body may take to arrive (--body-timeout)

    def __post_init__(self) -> None:
        for name in ("max_body", "max_text", "max_list", "max_nodes", "max_batch_pixels",
                     "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"limit {name} must be a number above 0, not {value!r}")


LIMITS_KEY = web.AppKey("mixgraph_limits", Limits)


def limits_of(request: web.Request) -> Limits:
    return request.app.get(LIMITS_KEY) or Limits()


# --- request bodies ---------------------------------------------------------------------------------

async def read_body(request: web.Request) -> bytes:
    """The whole body, or 408 when it does not arrive within `body_timeout` (a Content-Length
    longer than what is sent, a client that drips). aiohttp keeps it: a second call is free."""
    timeout = limits_of(request).body_timeout
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {timeout:g} s (Content-Length "
                 f"{request.content_length}); send the whole body at once "
                 f"(--body-timeout sets the limit)", headers={"Connection": "close"}) from None


async def read_json(request: web.Request) -> Any:
    """A request's body as JSON, parsed by `graph.safe_json`: JsonError (the handler answers
    400) for bad JSON, 413 beyond `max_body`, 408 for a body that does not arrive."""
    limit = limits_of(request).max_body
    size = request.content_length
    if size is not None and size > limit:
        raise _too_large(size, limit)
    data = await read_body(request)
    if len(data) > limit:
        raise _too_large(len(data), limit)
    if len(data) < _PARSE_OFF_LOOP:
        return json_loads(data, "the request body")
    return await asyncio.get_running_loop().run_in_executor(None, json_loads, data,
                                                            "the request body")


def _too_large(size: int, limit: int) -> web.HTTPRequestEntityTooLarge:
    return web.HTTPRequestEntityTooLarge(
        max_size=limit, actual_size=size,
        text=f"the request body is {size} bytes; at most {limit} ({limit / MB:g} MB) are "
             f"allowed (--max-request-mb sets the limit)")


def body_deadline_middleware() -> Any:
    """Reads every request body (but a multipart upload's, which its handler reads in parts under
    the same deadline) before the handler runs, within `body_timeout`; else 408, and the
    connection closes at once. Without it a body shorter than its Content-Length holds the
    connection until the client gives up."""
    @web.middleware
    async def middleware(request: web.Request, handler):
        try:
            if request.body_exists and not request.content_type.startswith("multipart/"):
                await read_body(request)
            return await handler(request)
        except web.HTTPRequestTimeout as e:
            return await _answer_and_close(request, e)
    return middleware


async def _answer_and_close(request: web.Request, error: web.HTTPException) -> web.Response:
    """Send `error` and close the connection: aiohttp would otherwise linger up to 10 s reading
    the rest of a body that is not coming."""
    response = web.Response(status=error.status, text=error.text, headers={"Connection": "close"})
    await response.prepare(request)
    await response.write_eof()
    if request.transport is not None:
        request.transport.close()          # flushes the answer first
    return response


async def read_part(part: Any, limit: int, timeout: float) -> bytes:
    """A multipart part (anything with `read_chunk`), refusing more than `limit` bytes (413) and
    a chunk that does not come within `timeout` seconds (408): an upload may be slow, not stuck."""
    buf = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(part.read_chunk(1 << 16), timeout)
        except asyncio.TimeoutError:
            raise web.HTTPRequestTimeout(
                text=f"the upload stalled: no data for {timeout:g} s after {len(buf)} bytes "
                     f"(--body-timeout sets the limit)", headers={"Connection": "close"}) from None
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(buf))


# --- the size of a prompt ----------------------------------------------------------------------------

class OverLimit(Exception):
    """A prompt beyond the limits; `body` is the 400 answer in ComfyUI's error shape."""

    def __init__(self, body: dict):
        super().__init__(body["error"]["message"])
        self.body = body


def check_sent(sent: dict, limits: Limits) -> None:
    """The node count of a workflow as sent (API: its keys; UI: its `nodes` list), checked
    before it is parsed, so parsing never meets a million nodes; `check_prompt` checks the
    parsed prompt again (subgraphs expanded)."""
    nodes = sent.get("nodes")
    count = len(nodes) if isinstance(nodes, list) else len(sent)
    if count > limits.max_nodes:
        raise OverLimit(_too_many(count, limits))


def _too_many(count: int, limits: Limits) -> dict:
    return _body("prompt_too_large", f"the prompt has {count} nodes; at most {limits.max_nodes} "
                 f"are allowed (--max-nodes sets the limit)", {})


def check_prompt(prompt: dict[str, NodeCall], registry: Any, limits: Limits) -> None:
    """Raise OverLimit naming every node and input beyond `limits` (module docstring). Linear in
    the prompt's size; runs before validation, so nothing costly looks at an oversized prompt."""
    if len(prompt) > limits.max_nodes:
        raise OverLimit(_too_many(len(prompt), limits))
    node_errors: dict[str, dict] = {}
    for nid, call in prompt.items():
        spec = registry.get(call.class_type) if call.class_type else None
        problems = list(_node_problems(nid, call, spec, limits))
        if problems:
            node_errors[nid] = {"errors": [p.to_json() for p in problems],
                                "dependent_outputs": [], "class_type": call.class_type}
    if node_errors:
        errors = [e for entry in node_errors.values() for e in entry["errors"]]
        first = errors[0]["message"]
        if all(e["type"] == "invalid_input_name" for e in errors):
            raise OverLimit(_body("invalid_prompt", f"Invalid prompt: {first}", node_errors))
        raise OverLimit(_body("prompt_too_large", f"the prompt asks for more than one request "
                              f"may: {first}", node_errors))


def _body(type_: str, message: str, node_errors: dict) -> dict:
    return {"error": {"type": type_, "message": message, "details": "", "extra_info": {}},
            "node_errors": node_errors}


def _node_problems(nid: str, call: NodeCall, spec: Any, limits: Limits) -> Iterator[Problem]:
    declared = {name: inp for name, inp in spec.inputs} if spec is not None else {}
    ct = call.class_type

    def problem(type_: str, name: str, message: str, **extra: Any) -> Problem:
        return Problem(nid, ct, type_, message, f"{name}: {message}", name, extra)

    for name, value in call.inputs.items():
        if name not in declared and not _plain_name(name):
            yield problem("invalid_input_name", name,
                          f"node {nid} ({ct}) has an input named {name!r}, which no node "
                          f"declares: it holds a control character or look-alike letters "
                          f"(not in Unicode form NFKC)")
            continue
        if isinstance(value, str) and len(value) > limits.max_text:
            yield problem("value_too_long", name,
                          f"input '{name}' of node {nid} ({ct}) is a text of {len(value)} "
                          f"characters; at most {limits.max_text} are allowed "
                          f"(--max-text-length sets the limit)",
                          length=len(value), limit=limits.max_text)
        longest = _longest_list(value)
        if longest > limits.max_list:
            yield problem("value_too_long", name,
                          f"input '{name}' of node {nid} ({ct}) holds a list of {longest} "
                          f"items; at most {limits.max_list} are allowed",
                          length=longest, limit=limits.max_list)
    sizes = [_int_literal(call.inputs.get(n, _default(declared.get(n)))) for n in _SIZE_INPUTS]
    if spec is not None and None not in sizes[1:]:
        batch, width, height = sizes[0] or 1, sizes[1], sizes[2]
        if batch * width * height > limits.max_batch_pixels:
            yield problem("value_too_large", "batch_size" if "batch_size" in declared else "width",
                          f"node {nid} ({ct}) asks for {batch} x {width} x {height} = "
                          f"{batch * width * height} pixels (batch_size x width x height); at "
                          f"most {limits.max_batch_pixels} are allowed (--max-batch-pixels "
                          f"sets the limit)", limit=limits.max_batch_pixels)


def _plain_name(name: str) -> bool:
    return (unicodedata.normalize("NFKC", name) == name
            and not any(unicodedata.category(c).startswith("C") for c in name))


def _default(inp: Any) -> Any:
    return None if inp is None or inp.default is REQUIRED else inp.default


def _int_literal(value: Any) -> int | None:
    """A positive whole-number literal (bounded by the prompt's own text), else None."""
    if isinstance(value, bool) or isinstance(value, (Link, BadLink)):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    return None


def _longest_list(value: Any) -> int:
    """The most items of any list or tuple inside `value` (0 for none), without recursion."""
    longest, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            longest = max(longest, len(item))
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return longest
