"""The parsed prompt the engine sees: nodes, links, precision regions (frozen dataclasses).

Every workflow file format (`graph.formats.workflow`: API and envelope; `graph.formats.ui_format`: the UI
format) is read into these types, and validation, planning and execution take nothing else.
`WorkflowError` (with `pydantic_message` for its text) is what a file that cannot be read raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError


class WorkflowError(ValueError):
    """A workflow file that cannot be read: bad JSON or an unrecognised shape. `error_type` is
    the type string of ComfyUI's error body (DESIGN §5)."""

    error_type = "invalid_prompt"


class InvalidPrecision(WorkflowError):
    """A workflow whose precision SPECs do not parse; `problems` names each one and where it is."""

    error_type = "invalid_precision"

    def __init__(self, message: str, problems: tuple[str, ...]):
        super().__init__(message)
        self.problems = problems


# --- engine-facing types ------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """An input fed by output `slot` of node `node_id`."""

    node_id: str
    slot: int


@dataclass(frozen=True)
class BadLink:
    """A list-valued input that is not a well-formed `[node_id, slot]` link. ComfyUI treats every
    list as a link, so validation reports it as `bad_linked_input`."""

    raw: tuple


@dataclass(frozen=True)
class NodeCall:
    """One node of a prompt. `inputs` values are literals, `Link`s or `BadLink`s; a literal list
    is already unwrapped from `{"__value__": [...]}`. `class_type` is "" when the file gave none
    (validation reports `invalid_prompt`)."""

    class_type: str
    inputs: dict[str, Any]
    title: str | None = None


@dataclass(frozen=True)
class Region:
    """A precision region: the nodes of a tagged group (UI format) or an envelope region.
    `origin` ("region" | "group") only says where it came from, for error messages."""

    name: str
    nodes: frozenset[str]
    precision: str
    origin: str = field(default="region", compare=False)


@dataclass(frozen=True)
class PrecisionConfig:
    """Precision SPEC strings, parsed by graph.precision. Regions are ordered outermost first
    (from UI groups: by decreasing area), so of two regions holding a node the later is the
    inner one."""

    default: str | None = None
    regions: tuple[Region, ...] = ()


@dataclass(frozen=True)
class Workflow:
    prompt: dict[str, NodeCall]
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    ui: dict | None = None
    source: str = "api"  # "api" | "ui" | "mixgraph"


def pydantic_message(err: ValidationError, limit: int = 5) -> str:
    parts = []
    for e in err.errors()[:limit]:
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
