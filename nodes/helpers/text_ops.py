"""Plain string functions behind ComfyUI's text nodes (comfy_extras/nodes_string.py).

Regex nodes use Python's `re` with ComfyUI's flags; an invalid pattern makes RegexMatch false and
RegexExtract empty (as in ComfyUI), while RegexReplace lets the error through to the node report.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

CASES = ("UPPERCASE", "lowercase", "Capitalize", "Title Case")
TRIMS = ("Both", "Left", "Right")
COMPARISONS = ("Starts With", "Ends With", "Equal")
EXTRACTIONS = ("First Match", "All Matches", "First Group", "All Groups")


def concatenate(a: str, b: str, delimiter: str) -> str:
    return delimiter.join((a, b))


def substring(s: str, start: int, end: int) -> str:
    return s[start:end]


def convert_case(s: str, mode: str) -> str:
    return {"UPPERCASE": s.upper, "lowercase": s.lower, "Capitalize": s.capitalize,
            "Title Case": s.title}.get(mode, lambda: s)()


def trim(s: str, mode: str) -> str:
    return {"Both": s.strip, "Left": s.lstrip, "Right": s.rstrip}.get(mode, lambda: s)()


def contains(s: str, sub: str, case_sensitive: bool) -> bool:
    return sub in s if case_sensitive else sub.lower() in s.lower()


def compare(a: str, b: str, mode: str, case_sensitive: bool) -> bool:
    if not case_sensitive:
        a, b = a.lower(), b.lower()
    if mode == "Starts With":
        return a.startswith(b)
    if mode == "Ends With":
        return a.endswith(b)
    return a == b


def flags(case_insensitive: bool, multiline: bool, dotall: bool) -> int:
    return ((re.IGNORECASE if case_insensitive else 0) | (re.MULTILINE if multiline else 0)
            | (re.DOTALL if dotall else 0))


def regex_match(s: str, pattern: str, fl: int) -> bool:
    try:
        return re.search(pattern, s, fl) is not None
    except re.error:
        return False


def _group(m: re.Match, index: int) -> str | None:
    if m.groups() and len(m.groups()) >= index:
        return m.group(index)
    return None


def regex_extract(s: str, pattern: str, mode: str, fl: int, group_index: int) -> str:
    """"First Match": the whole first match; "All Matches": every match (a pattern with groups
    gives each match's first group), one per line; "First Group"/"All Groups": group
    `group_index` of the first/every match that has it."""
    try:
        if mode == "First Match":
            m = re.search(pattern, s, fl)
            return m.group(0) if m else ""
        if mode == "All Matches":
            found = re.findall(pattern, s, fl)
            return "\n".join(f[0] if isinstance(f, tuple) else f for f in found)
        if mode == "First Group":
            m = re.search(pattern, s, fl)
            if m and len(m.groups()) >= group_index and m.group(group_index) is not None:
                return m.group(group_index)
            return ""
        if mode == "All Groups":
            parts = [_group(m, group_index) for m in re.finditer(pattern, s, fl)]
            return "\n".join(p for p in parts if p is not None)
    except re.error:
        return ""
    return ""


def regex_replace(s: str, pattern: str, replacement: str, fl: int, count: int) -> str:
    return re.sub(pattern, replacement, s, count=count, flags=fl)


class _SafeFormatter(string.Formatter):
    """str.format without private attributes: `{a.__class__}`-style fields could reach module
    globals through a value's methods, so a field part starting with `_` is refused."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        parts = re.split(r"[.\[\]]", field_name)
        if any(p.startswith("_") for p in parts if p):
            raise ValueError(f"format field {{{field_name}}}: names starting with '_' are not allowed")
        return super().get_field(field_name, args, kwargs)


def format_string(f_string: str, values: dict[str, Any]) -> str:
    """StringFormat: Python's str.format with the named inputs (every format spec and
    conversion; attribute and index lookups, but no private names)."""
    return _SafeFormatter().vformat(f_string, (), values)


def json_extract(json_string: str, key: str) -> str:
    """JsonExtractString: `key` of the first JSON object found in the text (Markdown fences and
    prose around it are skipped); "" when there is none or the key is missing/null; other values
    as Python's str() shows them, as ComfyUI does."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", json_string):
        try:
            data, _ = decoder.raw_decode(json_string, match.start())
        except json.JSONDecodeError:
            continue
        value = data.get(key)
        return "" if value is None else str(value)
    return ""


def dump_json(value: Any, indent: int) -> str:
    """ConvertDictionaryToString / ConvertArrayToString: JSON, non-ASCII kept; indent 0 = one line."""
    return json.dumps(value, ensure_ascii=False, indent=indent or None)
