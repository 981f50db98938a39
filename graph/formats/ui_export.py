"""API prompt -> ComfyUI UI-format (LiteGraph) workflow: what the editor loads.

The inverse of `graph.formats.ui_format.convert_ui` for the parts an API prompt has: nodes, literal inputs
and links (no groups, no reroutes). Used to serve the workflows in `workflows/` as editor
templates and to give the editor its default graph. The layout is automatic: a column per
dependency depth, nodes stacked in each column; a long chain of columns is folded into bands
one under the other, as many columns per band as make the graph fit a 1180 x 700 canvas (a
1280 x 800 window less the editor's bars; larger windows show more) at the largest scale, and the
saved view (`extra.ds`) shows it whole at that scale, so the editor opens it readable (its nodes
lose their titles below 60 %).

Widget values follow `widget_slots` (object_info order; a seed's control value "fixed" after it);
a widget-type input fed by a link appears in `inputs` with a `widget` entry and keeps its default
(or the declared first option) in `widgets_values`, as the editor itself saves it. A DynamicGroup
is written as the editor saves it: its row count, then each row's field values (a linked row
field: an input `<group>.<row>.<field>` with a `widget` entry; a row the prompt skips: None
values). A node's
editor-only values (`NodeSpec.ui_widgets`: CustomCombo's index and options) come last. A file made
here converts back (`convert_ui`) to the same prompt.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.dynamic import DynCombo, Rows
from mixgraph.graph.prompt import Link, Workflow
from mixgraph.graph.formats.ui_format import widget_slots
from mixgraph.graph.formats.ui_graph import companions

__all__ = ["to_ui"]

COLUMN_WIDTH = 380
NODE_WIDTH = 320
ROW_HEIGHT = 24
TITLE_HEIGHT = 30
GAP = 40
#: The canvas area the saved view fits (a 1280 x 800 window less the editor's side and top bars).
VIEW_WIDTH, VIEW_HEIGHT = 1180.0, 700.0


def _node_id(node_id: str) -> int | str:
    return int(node_id) if node_id.isdigit() else node_id


def _depths(wf: Workflow) -> dict[str, int]:
    depth: dict[str, int] = {}

    def visit(nid: str, seen: frozenset) -> int:
        if nid in depth:
            return depth[nid]
        if nid in seen:  # a cycle: validation reports it; lay it out anyway
            return 0
        parents = [v.node_id for v in wf.prompt[nid].inputs.values() if isinstance(v, Link) and v.node_id in wf.prompt]
        d = 1 + max((visit(p, seen | {nid}) for p in parents), default=-1)
        depth[nid] = d
        return d

    for nid in wf.prompt:
        visit(nid, frozenset())
    return depth


def _placeholder(spec_input: Any, env: Any) -> Any:
    if spec_input.has_default:
        return spec_input.default
    options = spec_input.option_list(env) if spec_input.type == "COMBO" else []
    return options[0] if options else None


def to_ui(wf: Workflow, registry: Any, env: Any = None) -> dict:
    """The UI-format workflow (version 0.4) of `wf`; node ids kept (numeric ids as numbers)."""
    depth = _depths(wf)
    links: list[list[Any]] = []
    out_links: dict[tuple[str, int], list[int]] = {}
    nodes: list[dict] = []
    column_y: dict[int, float] = {}
    order = sorted(wf.prompt, key=lambda n: (depth[n], _sort_key(n)))
    for index, nid in enumerate(order):
        call = wf.prompt[nid]
        spec = registry.get(call.class_type)
        spec_inputs = spec.input_map
        inputs: list[dict] = []

        def link(name: str, inp: Any, value: Link) -> None:
            link_id = len(links) + 1
            origin_spec = registry.get(wf.prompt[value.node_id].class_type)
            out_type = origin_spec.outputs[value.slot].type
            entry = {"name": name, "type": inp.type if inp.type != "COMBO" else out_type, "link": link_id}
            if inp.is_widget:
                entry["widget"] = {"name": name}
            inputs.append(entry)
            links.append([link_id, _node_id(value.node_id), value.slot, _node_id(nid), len(inputs) - 1, out_type])
            out_links.setdefault((value.node_id, value.slot), []).append(link_id)

        for name, inp in _ordered(spec):
            value = call.inputs.get(name)
            if isinstance(value, Link):
                link(name, inp, value)
            elif isinstance(inp.grow, Rows):   # a DynamicGroup's linked row fields
                fields = dict(inp.grow.fields)
                for key in inp.grow.present(name, call.inputs):
                    if isinstance(call.inputs[key], Link):
                        link(key, fields[key.rsplit(".", 1)[1]], call.inputs[key])
        widgets: list[Any] = []
        for slot in widget_slots(spec):
            if slot is None:
                widgets.append("fixed" if widgets and isinstance(widgets[-1], int) else "")
                continue
            value = call.inputs.get(slot)
            if isinstance(spec_inputs[slot].grow, Rows):   # the row count, then the rows' fields
                widgets += _row_widgets(slot, spec_inputs[slot].grow, call.inputs, env)
                continue
            widgets.append(_placeholder(spec_inputs[slot], env) if value is None or isinstance(value, Link) else value)
            if isinstance(spec_inputs[slot].grow, DynCombo):   # its chosen option's widgets follow
                subs = [call.inputs.get(f"{slot}.{sub}") for sub in spec_inputs[slot].grow.widget_subs(value)]
                widgets += [None if isinstance(v, Link) else v for v in subs]
        if spec.ui_widgets is not None:   # editor-only values after the declared ones (CustomCombo)
            widgets += spec.ui_widgets.write(call.inputs)
        n_rows = max(len(inputs) + len([s for s in widget_slots(spec) if s is not None]), len(spec.outputs), 1)
        height = TITLE_HEIGHT + ROW_HEIGHT * n_rows + (120 if call.class_type in _TALL else 0)
        d = depth[nid]
        y = column_y.get(d, 0.0)
        column_y[d] = y + height + GAP
        node = {
            "id": _node_id(nid), "type": call.class_type, "pos": [d, y],  # column, offset: placed below
            "size": [NODE_WIDTH, height], "flags": {}, "order": index, "mode": 0,
            "inputs": inputs, "outputs": [],
            "properties": {"Node name for S&R": call.class_type}, "widgets_values": widgets,
        }
        if call.title:
            node["title"] = call.title
        nodes.append(node)
    _place(nodes, column_y)
    for node in nodes:
        spec = registry.get(node["type"])
        node["outputs"] = [
            {"name": o.name, "type": o.type, "links": out_links.get((str(node["id"]), k), []), "slot_index": k}
            for k, o in enumerate(spec.outputs)
        ]
    return {
        "last_node_id": max((n["id"] for n in nodes if isinstance(n["id"], int)), default=0),
        "last_link_id": len(links), "nodes": nodes, "links": links, "groups": _groups(wf, nodes), "config": {},
        "extra": {"ds": _view(nodes)}, "version": 0.4,
    }


def _row_widgets(name: str, rows: Rows, given: dict[str, Any], env: Any) -> list[Any]:
    """A DynamicGroup's `widgets_values` part as the editor saves it: the row count (up to the
    highest row given), then each row's fields (`Rows.widget_fields` order, each followed by its
    control values). A linked field keeps its default (the link is in `inputs`); a field or row
    the prompt does not give is None, which `ui_graph.widget_inputs` reads back as left out."""
    count = rows.last_row(name, given) + 1
    out: list[Any] = [count]
    fields = dict(rows.fields)
    for r in range(count):
        for f in rows.widget_fields():
            value = given.get(f"{name}.{r}.{f}")
            out.append(_placeholder(fields[f], env) if isinstance(value, Link) else value)
            extra = companions(f, fields[f])   # a control value ("fixed" after an INT), a filter
            if extra:
                out += ["fixed" if isinstance(out[-1], int) else ""] + [""] * (extra - 1)
    return out


def _place(nodes: list[dict], column_height: dict[int, float]) -> None:
    """Turn each node's (column, offset in column) into a canvas position: the columns in bands
    of the width that lets the whole graph fit ``VIEW_WIDTH`` x ``VIEW_HEIGHT`` at the largest
    scale (ties: fewer bands)."""
    columns = max(column_height, default=0) + 1

    def bands(per_band: int) -> list[float]:
        return [max((column_height.get(c, 0.0) for c in range(b, min(b + per_band, columns))), default=0.0)
                for b in range(0, columns, per_band)]

    def fit(per_band: int) -> float:
        width = 60 + (min(per_band, columns) - 1) * COLUMN_WIDTH + NODE_WIDTH + 60
        height = 60 + sum(bands(per_band)) + 60
        return min(1.0, VIEW_WIDTH / width, VIEW_HEIGHT / height)

    per_band = max(range(columns, 0, -1), key=fit)
    band_top = [60.0]
    for h in bands(per_band)[:-1]:
        band_top.append(band_top[-1] + h + GAP)
    for node in nodes:
        column, offset = node["pos"]
        node["pos"] = [60 + (column % per_band) * COLUMN_WIDTH, band_top[column // per_band] + offset]


def _view(nodes: list[dict], width: float = VIEW_WIDTH, height: float = VIEW_HEIGHT) -> dict:
    """A canvas view that shows the whole graph in a window of about width x height pixels."""
    if not nodes:
        return {"scale": 1.0, "offset": [0, 0]}
    right = max(n["pos"][0] + n["size"][0] for n in nodes) + 60
    bottom = max(n["pos"][1] + n["size"][1] for n in nodes) + 60
    scale = round(min(1.0, width / right, height / bottom), 3)
    return {"scale": scale, "offset": [0, 40 / scale]}


def _groups(wf: Workflow, nodes: list[dict]) -> list[dict]:
    """A tagged group ("name [SPEC]") around each precision region's nodes. The automatic layout
    does not keep other nodes out of the box, so a region's group may hold more nodes than the
    region did: the editor shows where the region is, the envelope file stays the exact source."""
    by_id = {str(n["id"]): n for n in nodes}
    groups = []
    for k, region in enumerate(wf.precision.regions):
        members = [by_id[n] for n in sorted(region.nodes) if n in by_id]
        if not members:
            continue
        x0 = min(n["pos"][0] for n in members) - 20
        y0 = min(n["pos"][1] for n in members) - 20 - TITLE_HEIGHT - 10 * k
        x1 = max(n["pos"][0] + n["size"][0] for n in members) + 20
        y1 = max(n["pos"][1] + n["size"][1] for n in members) + 20
        groups.append({"id": k + 1, "title": f"{region.name} [{region.precision}]",
                       "bounding": [x0, y0, x1 - x0, y1 - y0], "color": "#3f789e", "flags": {}})
    return groups


_TALL = frozenset({"SaveImage", "PreviewImage", "LoadImage", "LoadImageMask", "CLIPTextEncode"})


def _ordered(spec: Any) -> list[tuple[str, Any]]:
    return ([(n, i) for n, i in spec.inputs if not i.optional] + [(n, i) for n, i in spec.inputs if i.optional])


def _sort_key(nid: str) -> tuple:
    return (0, int(nid), "") if nid.isdigit() else (1, 0, nid)
