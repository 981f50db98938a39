"""Dynamic sockets: ComfyUI's MatchType sockets and auto-growing inputs (V3 `io.MatchType`,
`io.Autogrow`).

* **MatchType** (`MatchTemplate`, `match_input`, `match_output`): sockets that share a template
  take whatever type is connected to them. Validation resolves the template per node: every input
  of one template must receive one type (a literal counts as INT / FLOAT / STRING / BOOLEAN), that
  type must be among the template's allowed types (`*`: any), and an output of the template then
  carries it, so the consumer's input is checked against the real type, through any chain of
  MatchType nodes (`TypeResolver`). ComfyUI leaves this check to its editor; mixgraph makes it on
  the server as well, so an API prompt gets the same answer as the editor.
* **Autogrow** (`autogrow`, `Grow`): one declared input stands for a group of inputs named
  `<input>.<name>`, where the names are `<prefix>0 .. <prefix>{max-1}` or a fixed list (ComfyUI's
  `TemplatePrefix` / `TemplateNames`); the first `min` are required unless the template input is
  optional. API prompts carry the dotted names (`"values.value0": [...]`), as ComfyUI's do; the
  node body gets one dict `{name: value}` in template order, holding the inputs that were given.

* **DynamicCombo** (`dynamic_combo`, `Option`, `DynCombo`): a combo whose chosen option brings its
  own sub-inputs (V3 `io.DynamicCombo`). API prompts carry the choice under the input's name and
  the chosen option's sub-inputs under `<input>.<sub>` (`"resize_type": "scale by multiplier",
  "resize_type.multiplier": 2.0`); validation checks the choice against the option keys and then
  the chosen option's sub-inputs as ordinary inputs (other options' sub-inputs are ignored, as in
  ComfyUI; a dotted name no option has is an error). The node body gets one dict, ComfyUI's
  nested shape: `{<input>: key, <sub>: value, ...}`. The choice must be a literal.

object_info shows them as ComfyUI 0.38.1 does, so its web editor draws them: a MatchType input
is `["COMFY_MATCHTYPE_V3", {..., "template": {"template_id", "allowed_types"}}]`, its output's
type is `COMFY_MATCHTYPE_V3` with the template id in `output_matchtypes`; an autogrow input is
`["COMFY_AUTOGROW_V3", {"template": {"input": {"required"|"optional": {name: entry}}, "prefix",
"min", "max"}}]` (or `"names"`, `"min"`); a DynamicCombo input is `["COMFY_DYNAMICCOMBO_V3", {"options": [{"key", "inputs":
{"required"|"optional": {sub: entry}}}, ...]}]`.

* **DynamicGroup** (`dynamic_group`, `Rows`): rows of a template of widgets, repeated (V3
  `_DynamicGroup`, ComfyUI 0.38 `comfy_api/latest/_io.py` 04e2a91). API prompts carry
  `<input>.<row>.<field>` (`"loras.0.lora_name"`), the row a decimal without leading zeros below
  `max`; the number of rows given must lie in [min, max]; each given row is validated against the
  template (its required fields must be there), rows missing in between are not. The body gets a
  list of row dicts up to the highest row given; a missing row, or a missing field of a given one,
  is None (no widget defaults are filled in), and no rows at all is `[]`. object_info:
  `["COMFY_DYNAMICGROUP_V3", {"template": {"required"|"optional": {field: entry}}, "min", "max",
  "group_name"}]`. In a UI-format workflow the editor (ComfyUI_frontend
  `src/core/graph/widgets/dynamicGroupWidget.ts`, 2bdf0e5) saves the group in `widgets_values`
  at the input's place as its hidden row-count widget's value followed by each row's field values
  (`Rows.widget_fields` order, each field's control value after it); its add/remove buttons and
  notice are not saved. `graph.formats.ui_graph.widget_inputs` reads that, `graph.formats.ui_export` writes it.

`Input.grow` holds a `Grow`, a `DynCombo` or `Rows`: each stands for a group of dotted inputs, and
the scheduler asks them the same three questions (`member_names`, `group`, object_info keys).

Imports only `graph.spec`; the registry, validation and scheduler call in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from mixgraph.graph.spec import SOCKET_TYPES, Input, NodeSpec, Output

MATCH_TYPE = "COMFY_MATCHTYPE_V3"
AUTOGROW_TYPE = "COMFY_AUTOGROW_V3"
DYNAMIC_COMBO_TYPE = "COMFY_DYNAMICCOMBO_V3"
DYNAMIC_GROUP_TYPE = "COMFY_DYNAMICGROUP_V3"
MAX_ROWS = 20     # ComfyUI's _DynamicGroup._MaxRows
MAX_NAMES = 100   # ComfyUI's Autogrow._MaxNames


@dataclass(frozen=True)
class MatchTemplate:
    """A MatchType template: the sockets declared with it share one type, among `allowed`."""

    id: str
    allowed: tuple[str, ...] = ("*",)

    def info(self) -> dict:
        return {"template_id": self.id, "allowed_types": ",".join(self.allowed)}

    def allows(self, kind: str) -> bool:
        return "*" in self.allowed or kind == "*" or any(
            _overlap(kind, a) for a in self.allowed)


@dataclass(frozen=True)
class Grow:
    """An auto-growing group: `template` is the input each member is, shown under
    `template_name`; `names` the possible member names, in order; the first `min` are required
    unless the template is optional. `prefix` is None for a fixed name list."""

    template: Input
    template_name: str
    names: tuple[str, ...]
    min: int
    prefix: str | None = None

    def info(self, template_entry: list) -> dict:
        group = "optional" if self.template.optional else "required"
        out: dict[str, Any] = {"input": {group: {self.template_name: template_entry}}}
        if self.prefix is not None:
            out.update(prefix=self.prefix, min=self.min, max=len(self.names))
        else:
            out.update(names=list(self.names), min=self.min)
        return out

    def required(self, i: int) -> bool:
        return i < self.min and not self.template.optional

    def info_keys(self, entry: Any) -> dict:
        return {"template": self.info(entry(self.template))}

    def present(self, name: str, call: dict[str, Any]) -> list[str]:
        return [f"{name}.{m}" for m in self.names if f"{name}.{m}" in call]

    def gather(self, name: str, kw: dict[str, Any]) -> dict[str, Any]:
        values = {}
        for m in self.names:
            full = f"{name}.{m}"
            if full in kw:
                values[m] = kw.pop(full)
        return values


@dataclass(frozen=True)
class Option:
    """One choice of a DynamicCombo: its key and the sub-inputs it brings, in order."""

    key: str
    inputs: tuple[tuple[str, Input], ...] = ()


@dataclass(frozen=True)
class DynCombo:
    """A DynamicCombo's options. The combo's own value is the chosen key; the chosen option's
    sub-inputs arrive as `<name>.<sub>`."""

    options: tuple[Option, ...]

    @property
    def keys(self) -> list[str]:
        return [o.key for o in self.options]

    def option(self, key: Any) -> Option | None:
        return next((o for o in self.options if o.key == key), None)

    def info_keys(self, entry: Any) -> dict:
        out = []
        for o in self.options:
            groups: dict[str, dict] = {}
            for sub, inp in o.inputs:
                groups.setdefault("optional" if inp.optional else "required", {})[sub] = entry(inp)
            out.append({"key": o.key, "inputs": {g: groups[g] for g in ("required", "optional")
                                                 if g in groups}})
        return {"options": out}

    def widget_subs(self, key: Any) -> list[str]:
        """The chosen option's widget sub-inputs in the editor's `widgets_values` order (right
        after the combo's own value: required ones, then optional ones)."""
        chosen = self.option(key)
        if chosen is None:
            return []
        subs = [(i.optional, sub) for sub, i in chosen.inputs if i.is_widget]
        return [sub for opt, sub in subs if not opt] + [sub for opt, sub in subs if opt]

    def present(self, name: str, call: dict[str, Any]) -> list[str]:
        chosen = self.option(call.get(name))
        out = [name] if name in call else []
        for sub, inp in (chosen.inputs if chosen is not None else ()):
            full = f"{name}.{sub}"
            if isinstance(inp.grow, DynCombo):   # a nested DynamicCombo: its own members
                out += inp.grow.present(full, call)
            elif full in call:
                out.append(full)
        return out

    def gather(self, name: str, kw: dict[str, Any], label: str | None = None) -> dict[str, Any]:
        """The node body's dict `{label: choice, <sub>: value, ...}`; `label` is the input's own
        name (default `name`), the last part of a nested one's dotted `name`."""
        key = kw.get(name)
        # an input_is_list node gets the key as a 1-element list; the body gets it as given
        chosen = self.option(key[0] if isinstance(key, list) and len(key) == 1 else key)
        values = {name if label is None else label: key}
        for sub, inp in (chosen.inputs if chosen is not None else ()):
            full = f"{name}.{sub}"
            if isinstance(inp.grow, DynCombo):   # nested: one dict keyed by its own name, ComfyUI's shape
                values[sub] = inp.grow.gather(full, kw, label=sub)
                kw.pop(full, None)
            elif full in kw:
                values[sub] = kw.pop(full)
        return values

    def names(self, name: str) -> set[str]:
        """Every dotted name any option can bring, nested DynamicCombos included."""
        out: set[str] = set()
        for o in self.options:
            for sub, inp in o.inputs:
                out.add(f"{name}.{sub}")
                if isinstance(inp.grow, DynCombo):
                    out |= inp.grow.names(f"{name}.{sub}")
        return out


@dataclass(frozen=True)
class Rows:
    """A DynamicGroup: rows of `fields` (widget inputs), between `min` and `max` rows given."""

    fields: tuple[tuple[str, Input], ...]
    min: int
    max: int
    group_name: str = "Group"

    def info_keys(self, entry: Any) -> dict:
        groups: dict[str, dict] = {}
        for f, inp in self.fields:
            groups.setdefault("optional" if inp.optional else "required", {})[f] = entry(inp)
        return {"template": {g: groups[g] for g in ("required", "optional") if g in groups},
                "min": self.min, "max": self.max, "group_name": self.group_name}

    def widget_fields(self) -> list[str]:
        """The fields in the editor's order within a row (required ones, then optional ones, as
        the frontend's `dynamicGroupWidget` adds them)."""
        return ([f for f, i in self.fields if not i.optional]
                + [f for f, i in self.fields if i.optional])

    def editor_count(self, value: Any) -> int:
        """How many rows the editor shows for a saved row count (its hidden count widget): a
        finite number truncated, at least `min`; anything else leaves `min` rows. Like the
        editor, a count past `max` is kept (validation reports the extra rows)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                or value in (float("inf"), float("-inf")):
            return self.min
        return max(self.min, int(value), 0)

    def last_row(self, name: str, call: dict[str, Any]) -> int:
        """The highest row given in `call` (-1 when none)."""
        return max(self.rows(name, call), default=-1)

    def parse(self, name: str, key: str) -> tuple[int, str] | str:
        """(row, field) of a dotted key under `name`, or why it is not one."""
        index, sep, field = key[len(name) + 1:].partition(".")
        if (not sep or not index.isascii() or not index.isdecimal()
                or (len(index) > 1 and index.startswith("0"))
                or field not in dict(self.fields)):
            return (f"Input '{key}' is not a row field of '{name}': expected "
                    f"'{name}.<row>.<field>', field one of {[f for f, _ in self.fields]}")
        if int(index) >= self.max:
            return f"Input '{key}' is past the last row of '{name}' (row {self.max - 1}, max={self.max})"
        return int(index), field

    def rows(self, name: str, call: dict[str, Any]) -> set[int]:
        out = set()
        for key in call:
            if key.startswith(name + "."):
                got = self.parse(name, key)
                if not isinstance(got, str):
                    out.add(got[0])
        return out

    def present(self, name: str, call: dict[str, Any]) -> list[str]:
        rows = sorted(self.rows(name, call))
        return [f"{name}.{r}.{f}" for r in rows for f, _ in self.fields if f"{name}.{r}.{f}" in call]

    def gather(self, name: str, kw: dict[str, Any]) -> list[dict[str, Any]]:
        last = max(self.rows(name, kw), default=-1)
        out = []
        for r in range(last + 1):
            out.append({f: kw.pop(f"{name}.{r}.{f}", None) for f, _ in self.fields})
        kw.pop(name, None)
        return out


def match_input(template: MatchTemplate, *, optional: bool = False, lazy: bool = False,
                tooltip: str | None = None) -> Input:
    """A socket whose type is whatever its template resolves to (`io.MatchType.Input`)."""
    return Input(MATCH_TYPE, optional=optional, lazy=lazy, tooltip=tooltip, match=template)


def match_output(template: MatchTemplate, name: str = "MATCHTYPE", *, is_list: bool = False) -> Output:
    """An output carrying its template's resolved type (`io.MatchType.Output`)."""
    return Output(MATCH_TYPE, name, is_list=is_list, match=template)


def autogrow(template: Input, name: str, *, prefix: str | None = None,
             names: Sequence[str] | None = None, min: int = 1, max: int = 10,
             optional: bool = False, tooltip: str | None = None) -> Input:
    """An auto-growing input group (`io.Autogrow.Input` with `TemplatePrefix(prefix, min, max)`
    or `TemplateNames(names, min)`). `template` is the socket each member is (a widget type is
    made a socket, as in ComfyUI); `name` is its name inside the object_info template."""
    if (prefix is None) == (names is None):
        raise TypeError("autogrow: give exactly one of prefix= or names=")
    if template.grow is not None:
        raise TypeError("autogrow: the template cannot itself grow")
    if template.lazy:
        raise TypeError("autogrow: lazy members are not supported yet")
    if SOCKET_TYPES.is_widget(template.type):
        template = replace(template, force_input=True)
    if prefix is not None:
        if not 1 <= max <= MAX_NAMES or min < 0:
            raise TypeError(f"autogrow: need 0 <= min and 1 <= max <= {MAX_NAMES}")
        member_names = tuple(f"{prefix}{i}" for i in range(max))
    else:
        member_names = tuple(names)[:MAX_NAMES]
        if min < 0:
            raise TypeError("autogrow: need 0 <= min")
    grow = Grow(template, name, member_names, min, prefix)
    return Input(AUTOGROW_TYPE, optional=optional, tooltip=tooltip, grow=grow)


def dynamic_combo(options: Sequence[Option], *, default: str | None = None,
                  optional: bool = False, tooltip: str | None = None) -> Input:
    """A combo whose chosen option brings its own sub-inputs (`io.DynamicCombo.Input`). The body
    receives `{<input name>: chosen key, <sub>: value, ...}`."""
    options = tuple(options)
    if not options:
        raise TypeError("dynamic_combo: give at least one Option")
    keys = [o.key for o in options]
    if len(set(keys)) != len(keys):
        raise TypeError(f"dynamic_combo: option keys must be unique, got {keys}")
    for o in options:
        subs = [s for s, _ in o.inputs]
        if len(set(subs)) != len(subs) or any("." in s for s in subs):
            raise TypeError(f"dynamic_combo: option {o.key!r} needs unique sub-input names "
                            f"without dots, got {subs}")
        for sub, inp in o.inputs:
            nested = isinstance(inp.grow, DynCombo)   # a DynamicCombo inside an option is fine
            # a MatchType sub-input is rendered and passed; its template is not type-checked
            if (inp.grow is not None and not nested) or inp.lazy:
                raise TypeError(f"dynamic_combo: option {o.key!r} input {sub!r}: autogrow "
                                "or lazy sub-inputs are not supported yet")
    if default is not None and default not in keys:
        raise TypeError(f"dynamic_combo: default {default!r} is not one of {keys}")
    extra = (("default", default),) if default is not None else ()
    return Input(DYNAMIC_COMBO_TYPE, optional=optional, tooltip=tooltip, extra=extra,
                 grow=DynCombo(options))


def dynamic_group(fields: Sequence[tuple[str, Input]], *, min: int = 0, max: int = MAX_ROWS,
                  group_name: str = "Group", optional: bool = False,
                  tooltip: str | None = None) -> Input:
    """Repeated rows of widget inputs (V3 `_DynamicGroup.Input`); the body gets a list of row
    dicts `{field: value or None}`."""
    fields = tuple(fields)
    names = [f for f, _ in fields]
    if not fields or len(set(names)) != len(names) or any(not f or "." in f for f in names):
        raise TypeError(f"dynamic_group: need unique field names without dots, got {names}")
    for f, inp in fields:
        if not inp.is_widget or inp.grow is not None or inp.match is not None or inp.force_input:
            raise TypeError(f"dynamic_group: field {f!r} must be a plain widget input")
    if not 1 <= max <= MAX_ROWS or not 0 <= min <= max:
        raise TypeError(f"dynamic_group: need 1 <= max <= {MAX_ROWS} and 0 <= min <= max")
    return Input(DYNAMIC_GROUP_TYPE, optional=optional, tooltip=tooltip,
                 grow=Rows(fields, min, max, group_name))


# --- the members of a node's groups ------------------------------------------------------------


def grows_of(spec: NodeSpec) -> tuple[tuple[str, Grow], ...]:
    return tuple((n, i.grow) for n, i in spec.inputs if i.grow is not None)


def is_dynamic(spec: NodeSpec) -> bool:
    return any(i.grow is not None or i.match is not None for _, i in spec.inputs) or any(
        o.match is not None for o in spec.outputs)


def expand_inputs(spec: NodeSpec, given: dict[str, Any]
                  ) -> tuple[list[tuple[str, Input]], list[tuple[str, str]]]:
    """The node's inputs with each group replaced by its members that are given or required, in
    declaration order, and (name, why) for each given dotted name no group has."""
    pairs: list[tuple[str, Input]] = []
    unknown: list[tuple[str, str]] = []
    for name, inp in spec.inputs:
        grow = inp.grow
        if grow is None:
            pairs.append((name, inp))
            continue
        dot = name + "."
        if isinstance(grow, DynCombo):
            _expand_combo(name, inp, grow, given, pairs, unknown)
            continue
        if isinstance(grow, Rows):
            _expand_rows(name, grow, given, pairs, unknown)
            continue
        for i, member in enumerate(grow.names):
            full = dot + member
            if full in given or grow.required(i):
                pairs.append((full, grow.template))
        known = {dot + m for m in grow.names}
        for key in given:
            if key.startswith(dot) and key not in known:
                shown = (f"{dot}{grow.names[0]} .. {dot}{grow.names[-1]}" if grow.prefix
                         else ", ".join(dot + m for m in grow.names))
                unknown.append((key, f"Input '{key}' is not one of this node's inputs: '{name}' "
                                     f"grows through {shown}"))
    return pairs, unknown


def _expand_combo(name: str, inp: Input, combo: DynCombo, given: dict[str, Any],
                  pairs: list[tuple[str, Input]], unknown: list[tuple[str, str]]) -> None:
    """A DynamicCombo's part of `expand_inputs`: the choice as a combo, then the chosen option's
    sub-inputs that are given or required."""
    dot = name + "."
    key = given.get(name)
    if name in given and not isinstance(key, str):
        unknown.append((name, f"Input '{name}' chooses an option of a dynamic combo: it must be "
                              f"a literal, one of {combo.keys}"))
    else:
        pairs.append((name, Input("COMBO", options=tuple(combo.keys), optional=inp.optional,
                                  tooltip=inp.tooltip)))
    chosen = combo.option(key)
    if chosen is not None:
        for sub, sub_inp in chosen.inputs:
            if isinstance(sub_inp.grow, DynCombo):   # nested: its choice and sub-inputs
                if dot + sub in given or not sub_inp.optional:
                    _expand_combo(dot + sub, sub_inp, sub_inp.grow, given, pairs, unknown)
            elif dot + sub in given or not sub_inp.optional:
                pairs.append((dot + sub, sub_inp))
    anywhere = combo.names(name)
    for k in given:
        if k.startswith(dot) and k not in anywhere:
            where = (f"option '{chosen.key}' takes " + (", ".join(dot + s for s, _ in chosen.inputs)
                                                        or "no sub-inputs")) if chosen else \
                f"its options are {combo.keys}"
            unknown.append((k, f"Input '{k}' is not a sub-input of any option of '{name}'; "
                               f"{where}"))


def _expand_rows(name: str, rows: Rows, given: dict[str, Any],
                 pairs: list[tuple[str, Input]], unknown: list[tuple[str, str]]) -> None:
    """A DynamicGroup's part of `expand_inputs`: every field of every given row (gaps are not
    validated); a bad key or a row count outside [min, max] is reported."""
    present: set[int] = set()
    for key in given:
        if key.startswith(name + "."):
            got = rows.parse(name, key)
            if isinstance(got, str):
                unknown.append((key, got))
            else:
                present.add(got[0])
    if name in given:
        unknown.append((name, f"Input '{name}' is a group of rows: give '{name}.<row>.<field>'"))
    if not rows.min <= len(present) <= rows.max:
        unknown.append((name, f"Input '{name}' received {len(present)} rows; expected between "
                              f"{rows.min} and {rows.max} ('{name}.<row>.<field>' keys)"))
    for r in sorted(present):
        pairs += [(f"{name}.{r}.{f}", inp) for f, inp in rows.fields]


def member_names(grows: Iterable[tuple[str, Any]], call: dict[str, Any]) -> list[str]:
    """The names of the group members present in `call`, in template order (a DynamicCombo:
    its choice, then the chosen option's sub-inputs)."""
    out: list[str] = []
    for name, grow in grows:
        out += grow.present(name, call)
    return out


def group(kw: dict[str, Any], grows: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A body's keywords with the dotted member values gathered into one dict per group."""
    out = dict(kw)
    for name, grow in grows:
        out[name] = grow.gather(name, out)
    return out


# --- types ---------------------------------------------------------------------------------------


def literal_type(v: Any) -> str:
    """The socket type a literal value stands for (bool before int: bool is an int in Python)."""
    if isinstance(v, bool):
        return "BOOLEAN"
    if isinstance(v, int):
        return "INT"
    if isinstance(v, float):
        return "FLOAT"
    if isinstance(v, str):
        return "STRING"
    return "*"


def check_literal(v: Any, inp: Input) -> str | None:
    """None when a literal may go to a MatchType or union-typed (`FLOAT,INT`) input, else why not."""
    if inp.match is not None:
        return None   # its type joins the template's; `check_templates` judges it
    kinds = [k.strip() for k in inp.type.split(",")]
    got = literal_type(v)
    if got in kinds or "*" in kinds:
        return None
    return f"a literal {got} cannot go to an input of type {inp.type}"


def _overlap(a: str, b: str) -> bool:
    if a == b or a == "*" or b == "*":
        return True
    return bool({t.strip() for t in a.split(",")} & {t.strip() for t in b.split(",")})


class TypeResolver:
    """Resolved types of outputs in one prompt: a MatchType output has the type its template
    resolves to on that node, the first concrete type among the inputs of the template (`*` when
    none), followed through chains of MatchType nodes without recursion."""

    def __init__(self, prompt: dict[str, Any], specs: dict[str, NodeSpec], link_type: type):
        self.prompt, self.specs, self.link_type = prompt, specs, link_type
        self._memo: dict[tuple[str, str], str] = {}

    def output_type(self, nid: str, slot: int) -> str | None:
        spec = self.specs.get(nid)
        if spec is None or not 0 <= slot < len(spec.outputs):
            return None
        out = spec.outputs[slot]
        return out.type if out.match is None else self.template_type(nid, out.match.id)

    def sources(self, nid: str, tid: str) -> list[tuple[str, Any]]:
        """(input name, value) of the inputs of template `tid` given on node `nid`."""
        spec, given = self.specs[nid], self.prompt[nid].inputs
        out = []
        for name, inp in spec.inputs:
            if inp.match is not None and inp.match.id == tid and name in given:
                out.append((name, given[name]))
            elif isinstance(inp.grow, Grow) and inp.grow.template.match is not None \
                    and inp.grow.template.match.id == tid:
                out += [(f"{name}.{m}", given[f"{name}.{m}"]) for m in inp.grow.names
                        if f"{name}.{m}" in given]
        return out

    def value_type(self, v: Any) -> str | tuple[str, str] | None:
        """A concrete type, an upstream (node, template) still to resolve, or None (bad link)."""
        if type(v) is not self.link_type:
            return literal_type(v)
        spec = self.specs.get(v.node_id)
        if spec is None or not 0 <= v.slot < len(spec.outputs):
            return None
        out = spec.outputs[v.slot]
        return out.type if out.match is None else (v.node_id, out.match.id)

    def template_type(self, nid: str, tid: str) -> str:
        memo = self._memo
        start = (nid, tid)
        if start in memo:
            return memo[start]
        stack, visiting = [start], set()
        while stack:
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            found = [self.value_type(v) for _, v in self.sources(*key)]
            if key not in visiting:
                visiting.add(key)
                todo = [f for f in found if isinstance(f, tuple) and f not in memo
                        and f not in visiting]
                if todo:
                    stack.extend(todo)
                    continue
            kinds = [memo.get(f, "*") if isinstance(f, tuple) else f for f in found]
            memo[key] = next((k for k in kinds if k and k != "*"), "*")
            stack.pop()
        return memo[start]


def check_templates(nid: str, spec: NodeSpec, got: dict[str, Any], resolver: TypeResolver
                    ) -> list[tuple[str, str, str, str, str]]:
    """Per template on one node: every received type allowed, and all of them one type.
    Returns (input name, template id, received type, expected type, why) per problem."""
    templates: dict[str, MatchTemplate] = {}
    for _, inp in spec.inputs:
        t = inp.match or (inp.grow.template.match if isinstance(inp.grow, Grow) else None)
        if t is not None:
            templates.setdefault(t.id, t)
    problems = []
    for tid, template in templates.items():
        first: tuple[str, str] | None = None
        for name, _ in resolver.sources(nid, tid):
            if name not in got:
                continue   # its own problem is already reported
            v = got[name]
            kind = (resolver.output_type(v.node_id, v.slot) if type(v) is resolver.link_type
                    else literal_type(v))
            if kind is None or kind == "*":
                continue
            if not template.allows(kind):
                problems.append((name, tid, kind, ",".join(template.allowed),
                                 f"input '{name}' receives {kind}; template '{tid}' allows "
                                 f"{', '.join(template.allowed)}"))
            elif first is None:
                first = (name, kind)
            elif not _overlap(kind, first[1]):
                problems.append((name, tid, kind, first[1],
                                 f"input '{name}' receives {kind} but '{first[0]}' receives "
                                 f"{first[1]}; the inputs of template '{tid}' must share one type"))
    return problems


def output_types(spec: NodeSpec) -> list[str | None] | None:
    """object_info's `output_matchtypes`: the template id per output, None when no output has one."""
    ids = [o.match.id if o.match is not None else None for o in spec.outputs]
    return ids if any(i is not None for i in ids) else None


__all__ = ["AUTOGROW_TYPE", "DYNAMIC_COMBO_TYPE", "DYNAMIC_GROUP_TYPE", "MATCH_TYPE", "DynCombo", "Grow", "Option", "MatchTemplate", "Rows", "TypeResolver", "autogrow",
           "check_literal", "check_templates", "dynamic_combo", "dynamic_group", "expand_inputs", "group", "grows_of", "is_dynamic",
           "literal_type", "match_input", "match_output", "member_names", "output_types"]
