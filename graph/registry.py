"""The node registry and its ComfyUI `object_info` rendering.

`object_info` reproduces what ComfyUI 0.3.64's `server.py: node_info` returns for a v1 node: the raw
`INPUT_TYPES()` dict, `input_order` built from every key of it (so `hidden` appears there too),
outputs, names and flags. An input renders as `[type, {options}]`, or `[type]` when it has no
options (ComfyUI's `("MODEL",)`); a combo's "type" is its option list. Two places where a
declaration cannot say what ComfyUI's dict literally says, and the rendering that results:

* a combo whose default is its first option renders without `default` (what core ComfyUI nodes
  send, and what the frontend assumes when `default` is absent);
* a STRING always carries its default (`""` when none was given).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from mixgraph.graph.dynamic import output_types
from mixgraph.graph.spec import Input, NodeSpec


class RegistryError(ValueError):
    """A node declared twice under one name."""


def option_keys(inp: Input, env: Any = None) -> dict[str, Any]:
    """The options dict of one input, without combo options and in ComfyUI's usual key order
    (`env` lists the combos inside a dynamic group's template)."""
    opts: dict[str, Any] = {}
    if inp.has_default and not _default_is_implicit(inp):
        opts["default"] = inp.default
    for key in ("min", "max", "step", "round"):
        value = getattr(inp, key)
        if value is not None:
            opts[key] = value
    if inp.multiline:
        opts["multiline"] = True
    opts.update(dict(inp.extra))
    if inp.force_input:
        opts["forceInput"] = True
    if inp.tooltip:
        opts["tooltip"] = inp.tooltip
    if inp.lazy:
        opts["lazy"] = True
    if inp.match is not None:   # dynamic sockets: graph/dynamic.py
        opts["template"] = inp.match.info()
    if inp.grow is not None:
        # autogrow template / DynamicCombo options / dynamic group template
        opts.update(inp.grow.info_keys(lambda i: input_entry(i, env)))
    return opts


def _default_is_implicit(inp: Input) -> bool:
    if inp.type != "COMBO" or callable(inp.options) or not inp.options:
        return False
    return inp.default == list(inp.options)[0]


def input_entry(inp: Input, env: Any = None, options: list[str] | None = None) -> list:
    """`[type_or_option_list, {options}]` as ComfyUI's object_info shows it. `options`: a combo's
    already evaluated option list (saves re-listing model folders)."""
    if inp.type == "COMBO":
        kind: Any = list(options) if options is not None else inp.option_list(env)
    else:
        kind = inp.type
    opts = option_keys(inp, env)
    return [kind, opts] if opts else [kind]


class Registry:
    """Node specs by class name. `graph.node.node` adds to the module-level `REGISTRY`."""

    def __init__(self) -> None:
        self._specs: dict[str, NodeSpec] = {}
        self._refused: dict[str, str] = {}

    def add(self, spec: NodeSpec) -> NodeSpec:
        if spec.name in self._specs:
            old = self._specs[spec.name]
            raise RegistryError(f"node {spec.name!r} is declared twice: in {_where(old)} and in "
                                f"{_where(spec)}; rename one of them")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> NodeSpec | None:
        return self._specs.get(name)

    def refuse(self, names: Iterable[str], reason: str) -> None:
        """Node types known by name that this registry does not run, and why (one sentence).
        Validation names the reason instead of "does not exist"; a node registered under one of
        the names (a custom pack's) takes precedence."""
        for name in names:
            self._refused[name] = reason

    def refusal(self, name: str) -> str | None:
        """Why `name` is not run (see `refuse`), or None when it is registered or unknown."""
        return None if name in self._specs else self._refused.get(name)

    def names(self) -> list[str]:
        return list(self._specs)

    def specs(self) -> list[NodeSpec]:
        return list(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def object_info(self, env: Any = None) -> dict[str, dict]:
        """`GET /object_info`: every class, in registration order."""
        return {name: render_spec(spec, env) for name, spec in self._specs.items()}

    def object_info_for(self, name: str, env: Any = None) -> dict[str, dict]:
        """`GET /object_info/{class}`: `{class: info}`, or `{}` for an unknown class."""
        spec = self._specs.get(name)
        return {name: render_spec(spec, env)} if spec is not None else {}


def render_spec(spec: NodeSpec, env: Any = None) -> dict:
    """One class's object_info entry (ComfyUI's v1 `node_info` shape)."""
    required = {n: input_entry(i, env) for n, i in spec.inputs if not i.optional}
    optional = {n: input_entry(i, env) for n, i in spec.inputs if i.optional}
    hidden = {n: h.kind for n, h in spec.hidden}
    inputs: dict[str, dict] = {"required": required}
    if optional:
        inputs["optional"] = optional
    if hidden:
        inputs["hidden"] = hidden
    return {
        "input": inputs,
        "input_order": {group: list(entries) for group, entries in inputs.items()},
        "output": [o.type for o in spec.outputs],
        "output_is_list": [o.is_list for o in spec.outputs],
        "output_name": [o.name for o in spec.outputs],
        **({"output_matchtypes": matchtypes} if (matchtypes := output_types(spec)) else {}),
        "name": spec.name,
        "display_name": spec.display_name or spec.name,
        "description": spec.description,
        "python_module": spec.python_module,
        "category": spec.category,
        "output_node": spec.output_node,
        **dict(spec.info_extra),
    }


def widget_order(spec: NodeSpec) -> list[tuple[str, Input]]:
    """Inputs in the order ComfyUI clients list them: required, then optional."""
    return ([(n, i) for n, i in spec.inputs if not i.optional]
            + [(n, i) for n, i in spec.inputs if i.optional])


def _where(spec: NodeSpec) -> str:
    fn = spec.fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


REGISTRY = Registry()
