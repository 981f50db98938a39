"""Node declarations: a node is a plain function whose signature is its whole schema.

    @node(category="latent", outputs=["LATENT"])
    def EmptyLatentImage(width=Int(512, min=16, max=MAX_RESOLUTION, step=8),
                         height=Int(512, min=16, max=MAX_RESOLUTION, step=8),
                         batch_size=Int(1, min=1, max=4096)):
        return empty_latent(width, height, batch_size)

Every parameter except `ctx` has an `Input` descriptor as its default; the parameter order is the
input order ComfyUI clients see. A body that declares `ctx` receives the run `Context`.
A body returns its outputs as a tuple (a single output may be returned bare), or a `Result` to
attach a UI payload (output nodes) or a graph to expand into. A body may be `async def`; any
output value may be an `ExecutionBlocker` (`graph.blocker`). docs/subsystems.md, "Dynamic
execution", has the list, lazy, expansion and async rules.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import REQUIRED, SOCKET_TYPES, Hidden, Input, NodeSpec, Output

MAX_RESOLUTION = 16384


def _extra(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in kw.items() if v is not None and v is not False)


def Int(default: int = 0, *, min: int | None = None, max: int | None = None, step: int | None = None,
        control_after_generate: bool = False, optional: bool = False, tooltip: str | None = None,
        lazy: bool = False) -> Input:
    return Input("INT", default, min=min, max=max, step=step, optional=optional, tooltip=tooltip,
                 extra=_extra(control_after_generate=control_after_generate), lazy=lazy)


def Float(default: float = 0.0, *, min: float | None = None, max: float | None = None,
          step: float | None = None, round: float | None = None, optional: bool = False,
          tooltip: str | None = None, lazy: bool = False) -> Input:
    return Input("FLOAT", default, min=min, max=max, step=step, round=round, optional=optional,
                 tooltip=tooltip, lazy=lazy)


def String(default: str = "", *, multiline: bool = False, dynamic_prompts: bool = False,
           optional: bool = False, force_input: bool = False, tooltip: str | None = None,
           lazy: bool = False) -> Input:
    return Input("STRING", default, multiline=multiline, optional=optional, tooltip=tooltip,
                 force_input=force_input, extra=_extra(dynamicPrompts=dynamic_prompts), lazy=lazy)


def Boolean(default: bool = False, *, optional: bool = False, tooltip: str | None = None,
            lazy: bool = False) -> Input:
    return Input("BOOLEAN", default, optional=optional, tooltip=tooltip, lazy=lazy)


def Combo(options: Sequence[str] | Callable[[Any], Sequence[str]], default: str | None = None, *,
          optional: bool = False, tooltip: str | None = None, **extra: Any) -> Input:
    """A choice among strings. `options` may be a callable of the environment (model file lists)."""
    if default is None and not callable(options) and options:
        default = options[0]
    return Input("COMBO", REQUIRED if default is None else default, options=options,
                 optional=optional, tooltip=tooltip, extra=_extra(**extra))


def Widget(type: str, default: Any, *, optional: bool = False, tooltip: str | None = None,
           socketless: bool | None = None, **extra: Any) -> Input:
    """A widget of a widget type a node library registered (ComfyUI V3's BOUNDING_BOX, COLOR:
    `spec.register_socket_type(name, link_only=False)`): its literal reaches the body as given
    (no coercion); `extra` keys render in object_info (`component="ImageCrop"`)."""
    if not SOCKET_TYPES.is_widget(type) or type in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"):
        raise TypeError(f"Widget: {type!r} is not a registered custom widget type; use "
                        f"Int/Float/String/..., or register it first "
                        f"(graph.spec.register_socket_type({type!r}, link_only=False))")
    return Input(type, default, optional=optional, tooltip=tooltip,
                 extra=_extra(socketless=socketless, **extra))


def Socket(type: str, *, optional: bool = False, tooltip: str | None = None,
           lazy: bool = False) -> Input:
    """A linked-only input (MODEL, LATENT, ...; or a widget type forced to be a socket).
    Declare it after the library registered its socket types: a model type joins the node's
    `precision_types` (`graph.spec.register_socket_type`).
    `lazy`: evaluated only when the node's `check_lazy_status` asks for it."""
    return Input(type, optional=optional, tooltip=tooltip, force_input=SOCKET_TYPES.is_widget(type),
                 lazy=lazy)


@dataclass(frozen=True)
class Result:
    """What an output node (or any node that shows something) returns: values + a UI payload.

    `expand`: node expansion (ComfyUI's `{"result", "expand"}`): an API-format prompt
    `{id: {"class_type", "inputs": {name: literal | [id, slot]}}}` that runs in place of the
    node; `values` entries may then be links `[id, slot]` into it (or to existing nodes). Ids are
    made unique by the engine (`graph.expand`)."""

    values: tuple = ()
    ui: dict[str, Any] | None = None
    expand: dict[str, Any] | None = None


def node(_fn: Callable | None = None, *, name: str | None = None, category: str = "",
         outputs: Sequence[str | Output | tuple[str, str]] = (), output_names: Sequence[str] | None = None,
         display_name: str | None = None, description: str = "", output_node: bool = False,
         deterministic: bool = True, version: int = 1, fingerprint: Callable | None = None,
         validate: Callable | None = None, precision_types: Sequence[str] = (),
         input_is_list: bool = False, check_lazy_status: Callable | None = None,
         accept_all_inputs: bool = False, ui_widgets: Any = None, register: bool = True,
         loop_boundary: str | None = None):
    """Declare a node from a function. Returns the function, with its `NodeSpec` at `fn.spec`.

    `input_is_list`: every input arrives as a list and the body runs once (INPUT_IS_LIST);
    `check_lazy_status(**inputs) -> [names]`: the lazy inputs (`lazy=True`) still needed.

    `precision_types`: model socket types the body asks a policy for (`ctx.policy_for`) beyond
    those of its own inputs; they join the node's cache key."""

    def wrap(fn: Callable) -> Callable:
        spec = spec_from_function(
            fn, name=name, category=category, outputs=outputs, output_names=output_names,
            display_name=display_name, description=description or (inspect.getdoc(fn) or ""),
            output_node=output_node, deterministic=deterministic, version=version,
            fingerprint=fingerprint, validate=validate, precision_types=precision_types,
            input_is_list=input_is_list, check_lazy_status=check_lazy_status,
            accept_all_inputs=accept_all_inputs, ui_widgets=ui_widgets,
            loop_boundary=loop_boundary)
        fn.spec = spec  # type: ignore[attr-defined]
        if register:
            REGISTRY.add(spec)
        return fn

    return wrap(_fn) if _fn is not None else wrap


def spec_from_function(fn: Callable, *, name: str | None = None, outputs: Sequence = (),
                       output_names: Sequence[str] | None = None,
                       precision_types: Sequence[str] = (), **kw: Any) -> NodeSpec:
    inputs: list[tuple[str, Input]] = []
    hidden: list[tuple[str, Hidden]] = []
    wants_ctx = False
    for pname, p in inspect.signature(fn).parameters.items():
        if pname == "ctx":
            wants_ctx = True
        elif p.kind is p.VAR_KEYWORD:   # **kwargs: undeclared inputs (`accept_all_inputs`)
            continue
        elif isinstance(p.default, Input):
            inputs.append((pname, p.default))
        elif isinstance(p.default, Hidden):
            hidden.append((pname, p.default))
        else:
            raise TypeError(f"node {fn.__name__}: parameter {pname!r} needs an Input descriptor "
                            f"as its default (Int(...), Combo(...), Socket('MODEL'), ...)")
    outs: list[Output] = []
    for i, o in enumerate(outputs):
        if isinstance(o, Output):
            outs.append(o)
        elif isinstance(o, tuple):
            outs.append(Output(o[0], o[1]))
        else:
            outs.append(Output(o, output_names[i] if output_names else o))
    is_model = SOCKET_TYPES.is_model
    unknown = sorted(t for t in precision_types if not is_model(t))
    if unknown:
        raise TypeError(f"node {fn.__name__}: precision_types {unknown} are not registered model "
                        f"socket types ({', '.join(sorted(SOCKET_TYPES.models())) or 'none yet'}; "
                        f"a node library registers them: graph.spec.register_socket_type(name, "
                        f"model=True))")
    types = sorted({*precision_types, *(i.type for _, i in inputs if is_model(i.type))})
    hooked = [(n, i.fingerprint) for n, i in inputs if i.fingerprint is not None]
    if hooked:
        kw["fingerprint"] = with_input_fingerprints(kw.get("fingerprint"), hooked)
    checked = [(n, i.check) for n, i in inputs if i.check is not None]
    if checked:
        kw["validate"] = with_input_checks(kw.get("validate"), checked)
    return NodeSpec(name=name or fn.__name__, fn=fn, inputs=tuple(inputs), hidden=tuple(hidden),
                    outputs=tuple(outs), wants_ctx=wants_ctx, precision_types=tuple(types), **kw)


def with_input_fingerprints(own: Callable | None, hooked: Sequence[tuple[str, Callable]]) -> Callable:
    """A node's fingerprint from its inputs' `Input.fingerprint` hooks: one print per hooked
    input, in declaration order (None for an input given no literal), after the node's own
    fingerprint if it has one. A NaN from the node's own means "never cached", as it did alone."""
    hooked = tuple(hooked)

    def fingerprint(env: Any, **literals: Any) -> Any:
        prints = tuple(hook(env, literals[n]) if n in literals else None for n, hook in hooked)
        if own is None:
            return prints
        mine = own(env, **literals)
        if isinstance(mine, float) and mine != mine:
            return mine
        return (mine, *prints)

    return fingerprint


def with_input_checks(own: Callable | None, checked: Sequence[tuple[str, Callable]]) -> Callable:
    """A node's validate from its inputs' `Input.check` hooks, after the node's own validate.

    The result takes `**literals` (so it sees the hooked inputs' values) and keeps the node's own
    named parameters in its signature: the inputs those claim stay claimed (`graph.validate`), and
    the node's own validate gets the literals it asked for, as before."""
    checked = tuple(checked)
    params = list(inspect.signature(own).parameters.values()) if own is not None else []
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
    named = frozenset(p.name for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def validate(env: Any, **literals: Any) -> list:
        found: list = []
        if own is not None:
            mine = literals if takes_all else {k: v for k, v in literals.items() if k in named}
            found += own(env, **mine) or []
        for n, check in checked:
            if n in literals:
                found += check(env, n, literals[n])
        return found

    signature = [inspect.Parameter("env", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    signature += [p for p in params[1:] if p.kind is not p.VAR_KEYWORD]
    signature.append(inspect.Parameter("literals", inspect.Parameter.VAR_KEYWORD))
    validate.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    return validate


def replace_spec(spec: NodeSpec, **changes: Any) -> NodeSpec:
    return dataclasses.replace(spec, **changes)
