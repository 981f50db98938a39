"""The schema of a node type: its inputs, hidden inputs, outputs and flags (`NodeSpec`).

What both the declaration decorator (`graph.node`) and the registry (`graph.registry`) read, kept
apart from either so neither imports the other's module to see it: `node` builds specs and adds
them to the registry, the registry stores and renders them. The socket types a declaration may
name with a meaning beyond "linked" (a widget, a model) live here too, registered by the node
library (`register_socket_type`): the engine itself knows only the generic ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class SocketType:
    """One registered socket type. `link_only`: a value arrives only over a link (False: a widget
    type, whose value may be a literal in the prompt); `model`: it holds a model, so a node
    consuming one gets a precision policy for it (`NodeSpec.precision_types`)."""

    name: str
    link_only: bool = True
    model: bool = False


class SocketTypes:
    """The registry of socket types the engine knows by name.

    The engine registers only the generic ones (ComfyUI's widget types INT, FLOAT, STRING,
    BOOLEAN, COMBO, and the wildcard `*`); a node library registers its own (the diffusion types,
    in nodes/socket_types.py) before it declares a node, because a declaration reads them: an
    input of a model type adds that type to the node's `precision_types`. A type never registered
    is a custom pack's own: it holds no model, and, as in ComfyUI, validation passes a literal
    given for it to the node unchanged (a registered link-only type refuses literals).
    """

    def __init__(self) -> None:
        self._types: dict[str, SocketType] = {}
        # plain sets, grown in place: `in` stays a C lookup on the hot paths, and the views
        # below (`WIDGET_TYPES`, ...) see what is registered after they were imported
        self._widgets: set[str] = set()
        self._links: set[str] = set()
        self._models: set[str] = set()

    def register(self, name: str, *, link_only: bool = True, model: bool = False) -> SocketType:
        """Register `name`; registering the same definition again is a no-op, a different one
        an error (two libraries disagreeing on what a type is)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a socket type name is a non-empty string, not {name!r}")
        if model and not link_only:
            raise ValueError(f"socket type {name!r}: a model type is link-only (a model is no "
                             f"literal a widget could hold)")
        new = SocketType(name, link_only, model)
        old = self._types.get(name)
        if old is not None and old != new:
            raise ValueError(f"socket type {name!r} is registered already as {old}; "
                             f"cannot register it again as {new}")
        self._types[name] = new
        (self._links if link_only else self._widgets).add(name)
        if model:
            self._models.add(name)
        return new

    def get(self, name: str) -> SocketType | None:
        return self._types.get(name)

    def is_widget(self, name: str) -> bool:
        return name in self._widgets

    def is_model(self, name: str) -> bool:
        return name in self._models

    def widgets(self) -> frozenset[str]:
        return frozenset(self._widgets)

    def models(self) -> frozenset[str]:
        return frozenset(self._models)

    def links(self) -> frozenset[str]:
        return frozenset(self._links)


#: The one registry (`register_socket_type` adds to it).
SOCKET_TYPES = SocketTypes()
register_socket_type = SOCKET_TYPES.register

#: ComfyUI's own widget types, which every node library shares; `*` takes any link or literal.
for _name in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"):
    register_socket_type(_name, link_only=False)
register_socket_type("*")


class _TypeView(AbstractSet):
    """A live, read-only view of one kind of registered socket type (`WIDGET_TYPES`, ...): code
    that imported the name sees what a library registers afterwards."""

    __slots__ = ("_names",)

    def __init__(self, names: set[str]):
        self._names = names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return "{" + ", ".join(sorted(self._names)) + "}"


#: Socket types whose value may be a literal in the prompt (a widget in the editor). A library's
#: own widget types (ComfyUI V3's BOUNDING_BOX, COLOR: the node library registers them) pass
#: through uncoerced, the consuming node checks their shape (`validate`).
WIDGET_TYPES: AbstractSet[str] = _TypeView(SOCKET_TYPES._widgets)
#: Registered socket types that carry no widget: they can only be linked.
LINK_TYPES: AbstractSet[str] = _TypeView(SOCKET_TYPES._links)
#: Socket types that hold a model: a node consuming one gets a precision policy for it.
MODEL_TYPES: AbstractSet[str] = _TypeView(SOCKET_TYPES._models)

REQUIRED = object()   # the default of an Input that has none


@dataclass(frozen=True)
class Input:
    """One declared input. `type` is a ComfyUI socket name; combos use type "COMBO" + options."""

    type: str
    default: Any = REQUIRED
    min: float | None = None
    max: float | None = None
    step: float | None = None
    round: float | None = None
    options: Sequence[str] | Callable[[Any], Sequence[str]] | None = None  # list, or fn(env)
    multiline: bool = False
    optional: bool = False
    tooltip: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # other object_info options (control_after_generate...)
    force_input: bool = False  # a widget type that must be linked (e.g. a STRING socket)
    # a linked lazy input is evaluated only when the node's `check_lazy_status` asks for it
    lazy: bool = False
    # dynamic sockets (graph/dynamic.py): `match`, a `MatchTemplate` this socket's type follows
    # (type "COMFY_MATCHTYPE_V3"); `grow`, a `Grow` (the auto-growing inputs this one stands for) or a `DynCombo` (a
    # DynamicCombo: the chosen option's sub-inputs)
    match: Any = None
    grow: Any = None
    # hooks a node library attaches to an input whose literal names something outside the graph
    # (a file in a folder): `fingerprint(env, value)`, that thing's state, joins the node's cache
    # key; `check(env, name, value) -> [problems]` runs with the node's validation. `graph.node`
    # folds them into the spec's `fingerprint` / `validate` (docs/subsystems.md, "Engine seam").
    fingerprint: Callable[[Any, Any], Any] | None = field(default=None, compare=False, repr=False)
    check: Callable[[Any, str, Any], Sequence[str]] | None = field(default=None, compare=False,
                                                                   repr=False)
    # `not_listed(env, value) -> str`: for a computed combo, where its options came from and how
    # to add one, appended to a `value_not_in_list` problem's details (a file not found says
    # which folders were searched); the problem's type and shape stay ComfyUI's
    not_listed: Callable[[Any, Any], str] | None = field(default=None, compare=False, repr=False)

    @property
    def has_default(self) -> bool:
        return self.default is not REQUIRED

    @property
    def is_widget(self) -> bool:
        return SOCKET_TYPES.is_widget(self.type) and not self.force_input

    def option_list(self, env: Any = None) -> list[str]:
        if self.options is None:
            return []
        opts = self.options(env) if callable(self.options) else self.options
        return list(opts)


@dataclass(frozen=True)
class Hidden:
    """A hidden input filled by the executor: PROMPT, EXTRA_PNGINFO, UNIQUE_ID, DYNPROMPT."""

    kind: str


@dataclass(frozen=True)
class Output:
    """One declared output. `is_list`: the body returns a list for it, and consumers are called
    once per element (ComfyUI's OUTPUT_IS_LIST)."""

    type: str
    name: str
    is_list: bool = False
    match: Any = None  # a `graph.dynamic.MatchTemplate`: the output has its inputs' resolved type


@dataclass(frozen=True)
class NodeSpec:
    """The whole schema of a node type, derived once from its function.

    The dynamic execution fields (`input_is_list`, `check_lazy_status`, `Input.lazy`,
    `Output.is_list`) are described in docs/subsystems.md, "Dynamic execution".

    `precision_types`: the model socket types whose resolved precision policy the node may ask
    for (`ctx.policy_for`), sorted. They are part of the node's cache key, so they come from the
    declaration alone: the model-typed inputs plus whatever the declaration adds."""

    name: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[str, Input], ...]
    hidden: tuple[tuple[str, Hidden], ...]
    outputs: tuple[Output, ...]
    category: str = ""
    display_name: str | None = None
    description: str = ""
    output_node: bool = False
    deterministic: bool = True
    version: int = 1
    wants_ctx: bool = False
    # fn(env, **literal_inputs) -> hashable: state outside the graph (files). None: no external state.
    fingerprint: Callable[..., Any] | None = None
    # fn(env, **literal_inputs) -> list[str] of problems (empty when valid).
    validate: Callable[..., list[str]] | None = None
    python_module: str = "nodes"
    precision_types: tuple[str, ...] = ()
    # ComfyUI custom nodes (mixgraph.ui.comfy.comfy_adapter): `extra_inputs` passes linked inputs the
    # spec does not declare to fn as keywords (a V1 FUNCTION with **kwargs, ComfyUI's rule: links
    # only, undeclared literals are dropped); `info_extra` holds object_info keys rendered as
    # given (output_tooltips, deprecated, experimental, ...).
    extra_inputs: bool = False
    info_extra: tuple[tuple[str, Any], ...] = ()
    # ComfyUI V3's `accept_all_inputs`: undeclared inputs, literals as well as links, reach fn
    # as keywords (CustomCombo's `index` and `option1..N`, which only its editor widget declares)
    accept_all_inputs: bool = False
    # Editor-only widget values a UI-format workflow saves after the declared widgets (CustomCombo's
    # index and options): an object with `read(rest, inputs) -> dict` (the API inputs they give;
    # `inputs` are the declared widgets' values), `read_named(values, inputs) -> dict` (the same
    # from `widgets_values` saved as an object keyed by widget name) and `write(inputs) -> list`
    # (UI export, always the editor's list form). None: none.
    ui_widgets: Any = None
    # ComfyUI's INPUT_IS_LIST: every input arrives as a list (literals as 1-element lists) and
    # the body is called once; otherwise list-valued inputs call it once per element.
    input_is_list: bool = False
    # fn(**inputs) -> names of lazy inputs still needed (unevaluated lazy inputs are None).
    check_lazy_status: Callable[..., Any] | None = None
    # ComfyUI's `loop_boundary` ("start" / "end" / None): graph/loops.py pairs the nodes and
    # marks the loop body between them (`_loop_body`, `_loop_end` in DYNPROMPT).
    loop_boundary: str | None = None

    @property
    def input_map(self) -> dict[str, Input]:
        return dict(self.inputs)

    @property
    def uses_precision(self) -> bool:
        return bool(self.precision_types)
