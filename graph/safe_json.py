"""JSON from outside the process, parsed safely: the one parser for workflow files, request
bodies, form fields and `--set` values.

    obj = loads(text, "wf.json")      # JsonError: "wf.json: not valid JSON: ..." on anything bad

Python's `json.loads` turns hostile input into exceptions that are not `JSONDecodeError`:
`[[[[...` 100,000 levels deep raises RecursionError, and an integer of more than 4,300 digits a
ValueError about `sys.set_int_max_str_digits`. Both escape handlers that catch JSONDecodeError and
end as HTTP 500s or tracebacks. Here nesting is measured on the text before parsing (strings cut
out by splitting at quotes, then a running sum over the brackets left, all at C speed), so
nothing recursive ever sees a structure deeper than `MAX_DEPTH`; real workflows nest about 10
levels (a UI workflow with nested subgraphs perhaps 30). Python's own `NaN`, `Infinity` and
`-Infinity` literals are still accepted, as ComfyUI accepts them; validation rejects them where a
finite number is needed.
"""

from __future__ import annotations

import json
import sys
from itertools import accumulate
from typing import Any

__all__ = ["JsonError", "loads", "nesting_depth", "MAX_DEPTH"]

MAX_DEPTH = 256

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonError(ValueError):
    """Text that is not acceptable JSON; the message names where it came from and what is wrong.
    `reason`: "syntax" (not JSON at all), "depth", "number" (an integer too long) or "encoding"."""

    def __init__(self, message: str, reason: str = "syntax"):
        super().__init__(message)
        self.reason = reason


def loads(data: str | bytes | bytearray, what: str) -> Any:
    """Parse `data` (text, or UTF-8 bytes); `what` names its origin in the error message (a file
    path, "the request body", "--set 3.cfg"). Raises JsonError, never anything else."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonError(f"{what}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                            f"{e.start})", "encoding") from None
    depth = nesting_depth(data) if data.count("[") + data.count("{") > MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        raise JsonError(f"{what}: JSON nested {depth} levels deep; at most {MAX_DEPTH} are allowed",
                        "depth")
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise JsonError(f"{what}: not valid JSON: {e.msg} at line {e.lineno}, column "
                        f"{e.colno}") from None
    except ValueError as e:  # an integer beyond Python's int-string conversion limit
        if "integer string conversion" not in str(e):
            raise JsonError(f"{what}: not valid JSON: {e}") from None
        raise JsonError(f"{what}: a number in the JSON is too long (more than "
                        f"{sys.get_int_max_str_digits()} digits)", "number") from None
    except RecursionError:  # a MAX_DEPTH above what this interpreter's stack allows
        raise JsonError(f"{what}: JSON nested too deeply", "depth") from None


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of JSON text, brackets inside strings not counted. Malformed
    text gives some number; the parser then reports what is wrong with it."""
    if "\\" in text:  # drop escape pairs first, so an escaped quote does not end a string
        text = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(text.split('"')[::2])          # even pieces lie between strings
    brackets = outside.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
