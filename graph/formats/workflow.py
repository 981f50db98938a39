"""Workflow files: the three accepted formats (DESIGN §3), read into `graph.prompt`'s types.

    wf = load_workflow("workflows/txt2img.json", REGISTRY)   # path, JSON text, bytes or dict
    wf.prompt["3"]            # NodeCall("KSampler", {"seed": 5, "model": Link("4", 0), ...})
    dump_api(wf)              # back to ComfyUI API JSON

The file formats are pydantic models (shape checks with readable errors); what the engine sees is
the frozen dataclasses of `graph.prompt`. The format is detected by shape: a `"format"` key →
mixgraph envelope; `nodes` + `links` → ComfyUI UI (LiteGraph) format, converted in
`graph.formats.ui_format`; a dict of `{id: {"class_type", "inputs"}}` → ComfyUI API format.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from mixgraph.graph import safe_json
from mixgraph.graph.precision import PrecisionError, parse_config
from mixgraph.graph.prompt import (BadLink, InvalidPrecision, Link, NodeCall, PrecisionConfig, Region,
                                   Workflow, WorkflowError, pydantic_message)
from mixgraph.graph.formats.ui_format import convert_ui

ENVELOPE_FORMAT = "mixgraph/1"


# --- file-format models ---------------------------------------------------------------------------

class ApiNode(BaseModel):
    """One node of a ComfyUI API prompt. Extra keys are ignored, as the backend does."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    class_type: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class EnvelopeRegion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    nodes: list[str | int]
    precision: str


class EnvelopePrecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: str | None = None
    regions: list[EnvelopeRegion] = Field(default_factory=list)


class Envelope(BaseModel):
    """`{"format": "mixgraph/1", "prompt": {...}, "precision": {...}, "workflow": {...}}`, with an
    optional human `description`."""

    model_config = ConfigDict(extra="forbid")
    format: str
    description: str | None = None
    prompt: dict[str, ApiNode]
    precision: EnvelopePrecision = Field(default_factory=EnvelopePrecision)
    workflow: dict[str, Any] | None = None


_API_PROMPT = TypeAdapter(dict[str, ApiNode])


# --- loading -----------------------------------------------------------------------------------

def load_workflow(obj_or_path: Any, registry: Any) -> Workflow:
    """Read a workflow in any of the three formats. `obj_or_path`: a path, JSON text, bytes, or
    an already parsed dict. `registry` supplies the widget order the UI format needs.
    Raises `WorkflowError` naming the file and the problem."""
    obj, name = _read(obj_or_path)
    if not isinstance(obj, dict):
        raise WorkflowError(f"{name}: a workflow is a JSON object, got {type(obj).__name__}")
    if "format" in obj:
        return checked_precision(_from_envelope(obj, name), name)
    if isinstance(obj.get("nodes"), list) and "links" in obj:
        return checked_precision(convert_ui(obj, registry, name), name)
    if all(isinstance(v, dict) for v in obj.values()) and (
            not obj or any("class_type" in v or "inputs" in v for v in obj.values())):
        return Workflow(prompt=_parse_api(obj, name), source="api")
    hint = ("; this looks like a POST /prompt body, pass its 'prompt' value"
            if isinstance(obj.get("prompt"), dict) else "")
    raise WorkflowError(
        f"{name}: not a recognised workflow. Expected a ComfyUI API prompt ({{id: {{class_type, "
        f"inputs}}}}), a ComfyUI UI workflow (nodes, links, groups) or a mixgraph envelope "
        f"(format: {ENVELOPE_FORMAT!r}); got an object with keys {_keys(obj)}{hint}")


def checked_precision(workflow: Workflow, name: str = "<workflow>") -> Workflow:
    """`workflow`, once every precision SPEC in it parses (`graph.precision.parse_config`, the
    check the Resolver repeats); else `InvalidPrecision` naming each bad SPEC and where it is."""
    try:
        parse_config(workflow.precision)
    except PrecisionError as e:
        raise InvalidPrecision(f"{name}: invalid precision: {e}", e.problems) from None
    return workflow


def _read(src: Any) -> tuple[Any, str]:
    if isinstance(src, dict):
        return src, "<workflow>"
    if isinstance(src, (bytes, bytearray)) or (isinstance(src, str)
                                               and src.lstrip().startswith(("{", "["))):
        return _parse_json(src, "<workflow>"), "<workflow>"
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise WorkflowError(f"{path}: no such file") from None
        except OSError as e:
            raise WorkflowError(f"{path}: cannot read: {e.strerror or e}") from None
        return _parse_json(data, str(path)), str(path)
    raise WorkflowError(f"cannot load a workflow from a {type(src).__name__}")


def _parse_json(data: str | bytes, name: str) -> Any:
    try:
        return safe_json.loads(data, name)
    except safe_json.JsonError as e:
        raise WorkflowError(str(e)) from None


def _keys(obj: dict) -> str:
    keys = list(obj)[:8]
    return ", ".join(repr(k) for k in keys) + (", ..." if len(obj) > 8 else "") if keys else "none"


def _parse_api(obj: dict, name: str, what: str = "ComfyUI API prompt") -> dict[str, NodeCall]:
    try:
        nodes = _API_PROMPT.validate_python(obj)
    except ValidationError as e:
        raise WorkflowError(f"{name}: not a valid {what}: {pydantic_message(e)}") from None
    return {str(nid): api_node_call(n) for nid, n in nodes.items()}


def api_node_call(n: ApiNode) -> NodeCall:
    title = n.meta.get("title") if n.meta else None
    return NodeCall(class_type=n.class_type or "",
                    inputs={k: api_value(v) for k, v in n.inputs.items()},
                    title=title if isinstance(title, str) else None)


def api_value(v: Any) -> Any:
    """An API-format input value: a list is a link (ComfyUI's rule), `{"__value__": x}` is x."""
    if isinstance(v, list):
        if (len(v) == 2 and isinstance(v[0], (str, int)) and not isinstance(v[0], bool)
                and isinstance(v[1], int) and not isinstance(v[1], bool)):
            return Link(str(v[0]), v[1])
        return BadLink(tuple(v))
    if isinstance(v, dict) and "__value__" in v:
        return v["__value__"]
    return v


def _from_envelope(obj: dict, name: str) -> Workflow:
    if obj.get("format") != ENVELOPE_FORMAT:
        raise WorkflowError(f"{name}: unknown format {obj.get('format')!r}; this version reads "
                            f"{ENVELOPE_FORMAT!r}")
    try:
        env = Envelope.model_validate(obj)
    except ValidationError as e:
        raise WorkflowError(f"{name}: not a valid {ENVELOPE_FORMAT} envelope: "
                            f"{pydantic_message(e)}") from None
    prompt = {str(nid): api_node_call(n) for nid, n in env.prompt.items()}
    regions = []
    for r in env.precision.regions:
        ids = frozenset(str(x) for x in r.nodes)
        missing = sorted(ids - prompt.keys())
        if missing:
            raise WorkflowError(f"{name}: precision region {r.name!r} names node(s) "
                                f"{', '.join(missing)}, which are not in the prompt")
        regions.append(Region(r.name, ids, r.precision))
    return Workflow(prompt=prompt, precision=PrecisionConfig(env.precision.default, tuple(regions)),
                    ui=env.workflow, source="mixgraph")


# --- writing ---------------------------------------------------------------------------------

def dump_value(v: Any) -> Any:
    if type(v) is Link:
        return [v.node_id, v.slot]
    if type(v) is BadLink:
        return list(v.raw)
    if isinstance(v, (list, tuple)):
        return {"__value__": list(v)}
    return v


def dump_api(workflow: Workflow | dict[str, NodeCall]) -> dict:
    """ComfyUI API JSON: links as `[id, slot]`, literal lists wrapped in `{"__value__": ...}`."""
    prompt = workflow.prompt if isinstance(workflow, Workflow) else workflow
    out = {}
    for nid, call in prompt.items():
        entry: dict[str, Any] = {"inputs": {k: dump_value(v) for k, v in call.inputs.items()},
                                 "class_type": call.class_type}
        if call.title is not None:
            entry["_meta"] = {"title": call.title}
        out[nid] = entry
    return out


def dump_envelope(workflow: Workflow) -> dict:
    """The mixgraph/1 envelope: the API prompt plus precision settings and the UI layout."""
    precision: dict[str, Any] = {}
    if workflow.precision.default is not None:
        precision["default"] = workflow.precision.default
    precision["regions"] = [{"name": r.name, "nodes": sorted(r.nodes), "precision": r.precision}
                            for r in workflow.precision.regions]
    out: dict[str, Any] = {"format": ENVELOPE_FORMAT, "prompt": dump_api(workflow),
                           "precision": precision}
    if workflow.ui is not None:
        out["workflow"] = workflow.ui
    return out
