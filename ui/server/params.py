"""Parameters from clients, parsed in one place: numeric query parameters with bounds, and the
typed fields of the JSON bodies of `POST /prompt`, `/queue`, `/history`, `/interrupt`, `/free`.

    max_items = query_int(request, "max_items", None, 0, MAX_COUNT)    # 400 names max_items
    req = prompt_request(body, limits)                                 # BadField names the field

ComfyUI's types (server.py of 0.3.64): `prompt` an object, `client_id` a string, `extra_data` an
object, `front` a boolean, `number` a number, `prompt_id` a string, `partial_execution_targets`
a list of node ids (strings); `/queue` and `/history` take `{"clear": bool, "delete": [ids]}`.
ComfyUI is lax about them (`front: "yes"` counts as true, `extra_data: [..]` is dropped);
here a value of the wrong type is a 400 naming the field, so a client's mistake shows at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mixgraph.ui.server.limits import Limits

__all__ = ["MAX_COUNT", "BadField", "query_int", "PromptRequest", "prompt_request", "QueueEdit",
           "queue_edit", "flag", "optional_str"]

#: The largest count or offset a query parameter may give (SQLite's integers are 64-bit).
MAX_COUNT = 1_000_000_000
#: The longest prompt or client id.
MAX_ID = 256


class BadField(ValueError):
    """A body field of the wrong type or size; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def query_int(request: web.Request, name: str, default: int | None, low: int,
              high: int = MAX_COUNT) -> int | None:
    """The integer query parameter `name` within [low, high]; `default` when absent or empty;
    otherwise a 400 that names it."""
    text = request.query.get(name)
    if text is None or text == "":
        return default
    text = text.strip()
    if not (text.lstrip("+-").isdigit() and text.isascii() and len(text) <= 20):
        raise web.HTTPBadRequest(text=f"query parameter {name} must be an integer from {low} to "
                                      f"{high}, not {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"query parameter {name} must be an integer from {low} to "
                                      f"{high}, not {value}")
    return value


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)


def _want(field: str, value: Any, what: str) -> BadField:
    return BadField(field, f"'{field}' must be {what}, not {_type_name(value)}")


def flag(body: dict, field: str) -> bool:
    """A boolean field (absent or null: False)."""
    value = body.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _want(field, value, "true or false")
    return value


def optional_str(body: dict, field: str, longest: int = MAX_ID) -> str | None:
    """A string field of at most `longest` characters (absent or null: None)."""
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _want(field, value, "a string")
    if len(value) > longest:
        raise BadField(field, f"'{field}' is {len(value)} characters long; at most {longest} "
                              f"are allowed")
    return value


def _str_list(body: dict, field: str, limits: Limits) -> list[str] | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _want(field, value, "a list of id strings")
    odd = next((x for x in value if not isinstance(x, str)), "")
    if not isinstance(odd, str):
        raise BadField(field, f"'{field}' must be a list of id strings, not a list holding "
                              f"{_type_name(odd)}")
    if len(value) > limits.max_list:
        raise BadField(field, f"'{field}' lists {len(value)} ids; at most {limits.max_list} are "
                              f"allowed")
    return value


@dataclass(frozen=True)
class PromptRequest:
    """The fields of a `POST /prompt` body, checked. `number` None: the server picks it."""

    prompt: dict
    client_id: str | None
    extra_data: dict
    front: bool
    number: float | None
    prompt_id: str | None
    targets: list[str] | None


def prompt_request(body: dict, limits: Limits) -> PromptRequest:
    """Check a `POST /prompt` body's fields (raises BadField); `prompt` must be present."""
    prompt = body["prompt"]
    if not isinstance(prompt, dict):
        raise _want("prompt", prompt, "a JSON object")
    extra = body.get("extra_data")
    if extra is not None and not isinstance(extra, dict):
        raise _want("extra_data", extra, "a JSON object")
    number = None
    if "number" in body:
        raw = body["number"]
        try:
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise TypeError(raw)
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError(raw)
        except (TypeError, ValueError, OverflowError):
            raise BadField("number", "'number' must be a finite number") from None
    return PromptRequest(prompt, optional_str(body, "client_id"), dict(extra or {}),
                         flag(body, "front"), number, optional_str(body, "prompt_id"),
                         _str_list(body, "partial_execution_targets", limits))


@dataclass(frozen=True)
class QueueEdit:
    """`POST /queue` or `/history`: clear everything, and/or delete these ids."""

    clear: bool
    delete: list[str] | None


def queue_edit(body: dict, limits: Limits) -> QueueEdit:
    return QueueEdit(flag(body, "clear"), _str_list(body, "delete", limits))
