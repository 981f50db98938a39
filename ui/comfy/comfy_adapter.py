"""ComfyUI node classes (V1 and V3) as mixgraph `NodeSpec`s, unchanged.

`spec_for_class(name, cls, pack=...)` reads the class as ComfyUI's server does and declares the
same node to the engine:

* V1: `INPUT_TYPES()` (required / optional / hidden; input options `default`, `min`, `max`,
  `step`, `round`, `multiline`, `tooltip`, `forceInput`, `lazy`, `rawLink`, and every other
  option kept for object_info), `RETURN_TYPES`, `RETURN_NAMES`, `OUTPUT_TOOLTIPS`, `FUNCTION`
  (sync or `async def`), `CATEGORY`, `DESCRIPTION`, `OUTPUT_NODE`, `INPUT_IS_LIST`,
  `OUTPUT_IS_LIST`, `IS_CHANGED` (the fingerprint: its value joins the cache key),
  `VALIDATE_INPUTS` (the validator; its `input_types` argument gets the received link types; the
  inputs it names, or all of them when it takes `**kwargs`, skip the default min/max/option
  checks, ComfyUI's rule: such combos are declared with computed options), `check_lazy_status`,
  `DEPRECATED` / `EXPERIMENTAL`, `**kwargs` functions (undeclared links reach them).
* V3 (`comfy_api.latest.io.ComfyNode`): the host package's ComfyNode renders its `Schema` as the
  V1 attributes (as ComfyUI's does), so both go through one path; `execute` runs on a per-call
  class clone whose `hidden` holds the hidden inputs, `fingerprint_inputs`, `validate_inputs`
  and `check_lazy_status` are used when the class overrides them, and `NodeOutput` (values, `ui`,
  `expand`, `block_execution`) is unpacked. Its dynamic sockets (`io.MatchType`, `io.Autogrow`,
  `io.DynamicCombo`) become graph/dynamic.py's declarations (`_v3_input`), so they behave as
  mixgraph's built-in dynamic nodes do.

Running a node (`_Node.__call__`): inputs are converted to ComfyUI's plain payloads
(`comfy_payloads`), the call runs with the host modules on the path and `comfy_runtime.running()`
set (progress bars, interrupts, `PromptServer.client_id`), awaitables are awaited, and the
result (`tuple`, `{"ui", "result", "expand"}`, `NodeOutput`, `ExecutionBlocker`) becomes a
`graph.node.Result` with the outputs converted back. A ComfyUI internal the pack reaches for and
mixgraph lacks becomes `MissingHostAPI` naming the pack and node.

The dynamic parts (list mapping, lazy inputs, expansion, blockers, awaiting in the engine) are
the engine's: the adapter fills the spec fields for them when the engine has them
(`ENGINE_DYNAMIC`); without them, INPUT_IS_LIST nodes get each input as a one-item list and an
expansion is a clear "not supported yet" error.

Socket types are ComfyUI's strings as given: a pack's own types are link-only sockets; the types
the node library registered (`nodes.socket_types`, imported here so a pack loads without the rest
of the library) keep their meaning, so a pack's node taking a MODEL gets its precision policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import math
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable

from mixgraph.graph import dynamic
from mixgraph.graph.node import Result
from mixgraph.graph.spec import REQUIRED, SOCKET_TYPES, Hidden, Input, NodeSpec, Output
from mixgraph.nodes import socket_types  # noqa: F401  (ComfyUI's types: MODEL holds a model, ...)
from mixgraph.ui.comfy import comfy_payloads as payloads
from mixgraph.ui.comfy.comfy_runtime import (Interrupted, MissingHostAPI, Running, explain, host_path,
                                             running_node)

__all__ = ["spec_for_class", "AdapterError", "ENGINE_DYNAMIC", "is_v3"]

_SPEC_FIELDS = {f.name for f in dataclasses.fields(NodeSpec)}
_INPUT_FIELDS = {f.name for f in dataclasses.fields(Input)}
_RESULT_FIELDS = {f.name for f in dataclasses.fields(Result)}
#: The engine runs ComfyUI's dynamic model itself (branch `dyn`: list mapping, lazy inputs...).
ENGINE_DYNAMIC = "input_is_list" in _SPEC_FIELDS and "check_lazy_status" in _SPEC_FIELDS
_CONSUMED = {"default", "min", "max", "step", "round", "multiline", "tooltip", "forceInput"}
_OBJECTS_KEPT = 256      # V1 instances kept per class (ComfyUI keeps one per node id)


class AdapterError(TypeError):
    """A class that is not a usable ComfyUI node (bad INPUT_TYPES, missing FUNCTION...)."""


def is_v3(cls: Any) -> bool:
    return callable(getattr(cls, "define_schema", None)) and callable(getattr(cls, "execute", None)) \
        and callable(getattr(cls, "GET_SCHEMA", None))


def _text(t: Any) -> str:
    return t.value if isinstance(t, enum.Enum) else str(t)


def _overrides(cls: type, name: str) -> bool:
    """Whether a V3 class defines `name` itself rather than inheriting the ComfyNode default."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return not vars(klass).get("_COMFY_BASE", False)
    return False


def _maybe_await(value: Any) -> Any:
    """The value, or what an awaitable resolves to (run on a private loop: this thread runs
    no loop of its own, or one must not be blocked; then a helper thread runs it)."""
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    box: dict[str, Any] = {}

    def worker():
        try:
            box["value"] = asyncio.run(wait())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=worker, name="comfy-async")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _params(fn: Callable) -> tuple[list[str], bool]:
    """Keyword-usable parameter names of `fn` and whether it takes **kwargs."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [], True
    names = [p.name for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _filtered(fn: Callable, values: dict) -> dict:
    names, kw = _params(fn)
    return dict(values) if kw else {k: v for k, v in values.items() if k in names}


@dataclasses.dataclass
class _InputInfo:
    type: str
    optional: bool
    lazy: bool = False
    raw_link: bool = False
    nested: bool = False     # a V3 Autogrow / DynamicCombo: its value is a dict of members


def _input(name: str, entry: Any, optional: bool, claimed: bool, where: str) -> tuple[Input, _InputInfo]:
    if isinstance(entry, (str, enum.Enum, list)):
        entry = (entry,)
    if not isinstance(entry, (tuple, list)) or not entry:
        raise AdapterError(f"{where}: input {name!r} must be a (type, options) tuple, not {entry!r}")
    kind = entry[0]
    opts = dict(entry[1]) if len(entry) > 1 and isinstance(entry[1], dict) else {}
    options = None
    if isinstance(kind, (list, tuple)):
        type_, options = "COMBO", [_text(o) if isinstance(o, enum.Enum) else o for o in kind]
    else:
        type_ = _text(kind)
        if type_ == "COMBO":
            options = list(opts.pop("options", []) or [])
    if options is not None and claimed:
        fixed = list(options)
        options = lambda env, _o=fixed: _o  # noqa: E731 - the validator judges the value (ComfyUI)
    extra = tuple((k, v) for k, v in opts.items() if k not in _CONSUMED)
    force = bool(opts.get("forceInput") or opts.get("defaultInput"))
    kw: dict[str, Any] = dict(
        default=opts["default"] if "default" in opts else REQUIRED,
        min=opts.get("min"), max=opts.get("max"), step=opts.get("step"), round=opts.get("round"),
        options=options, multiline=bool(opts.get("multiline", False)), optional=optional,
        tooltip=opts.get("tooltip"), extra=extra, force_input=force)
    info = _InputInfo(type_, optional, bool(opts.get("lazy")), bool(opts.get("rawLink")))
    if "lazy" in _INPUT_FIELDS:
        kw["lazy"] = info.lazy
    if "raw_link" in _INPUT_FIELDS:
        kw["raw_link"] = info.raw_link
    try:
        return Input(type_, **kw), info
    except TypeError as e:
        raise AdapterError(f"{where}: input {name!r}: {e}") from None


# --- V3 dynamic sockets (io.MatchType / io.Autogrow / io.DynamicCombo) -------------------------


def _v3_plain(inp: Any, where: str) -> Input:
    """A V3 input object that is no group (an Autogrow template, a DynamicCombo sub-input)."""
    if getattr(inp, "dynamic_kind", "") == "autogrow":
        raise AdapterError(f"{where}: input {inp.id!r}: an Autogrow inside a group is not "
                           "supported yet")
    return _v3_input(inp, where)


def _v3_input(inp: Any, where: str) -> Input:
    """One V3 `io` input object as the engine's declaration; dynamic sockets become
    graph/dynamic.py's (MatchType, Autogrow, DynamicCombo), as mixgraph's own nodes declare them."""
    kind = getattr(inp, "dynamic_kind", "")
    try:
        if kind == "match":
            t = inp.template
            return dynamic.match_input(_template(t), optional=bool(inp.optional),
                                       lazy=bool(inp.lazy), tooltip=inp.tooltip)
        if kind == "autogrow":
            t = inp.template
            member = _v3_plain(t.input, where)
            if hasattr(t, "prefix"):
                return dynamic.autogrow(member, t.input.id, prefix=t.prefix, min=t.min, max=t.max,
                                        optional=bool(inp.optional), tooltip=inp.tooltip)
            return dynamic.autogrow(member, t.input.id, names=[str(n) for n in t.names],
                                    min=t.min, optional=bool(inp.optional), tooltip=inp.tooltip)
        if kind == "dynamic_combo":
            options = [dynamic.Option(str(o.key), tuple((i.id, _v3_plain(i, where))
                                                        for i in o.inputs)) for o in inp.options]
            return dynamic.dynamic_combo(options, optional=bool(inp.optional), tooltip=inp.tooltip)
    except TypeError as e:
        raise AdapterError(f"{where}: input {inp.id!r}: {e}") from None
    return _input(inp.id, (inp.get_io_type(), inp.as_dict()), bool(inp.optional), False, where)[0]


def _template(t: Any) -> dynamic.MatchTemplate:
    return dynamic.MatchTemplate(str(t.template_id), tuple(t.allowed_types) or ("*",))


def _v3_dynamic_inputs(schema: Any, inputs: list[tuple[str, Input]],
                       infos: dict[str, _InputInfo], where: str) -> list[tuple[str, Input]]:
    """The spec's inputs with each V3 dynamic socket replaced by its engine declaration."""
    by_id = {i.id: i for i in (getattr(schema, "inputs", None) or [])}
    out = []
    for name, inp in inputs:
        v3 = by_id.get(name)
        if v3 is not None and getattr(v3, "dynamic_kind", ""):
            inp = _v3_input(v3, where)
            infos[name].nested = inp.grow is not None
        out.append((name, inp))
    return out


def _v3_match_outputs(schema: Any, outputs: tuple[Output, ...]) -> tuple[Output, ...]:
    """`io.MatchType.Output`s as outputs carrying their template's resolved type."""
    v3_outs = list(getattr(schema, "outputs", None) or [])
    out = []
    for i, o in enumerate(outputs):
        t = getattr(v3_outs[i], "template", None) if i < len(v3_outs) else None
        out.append(dynamic.match_output(_template(t), o.name, is_list=o.is_list)
                   if t is not None else o)
    return tuple(out)


def _members_to_comfy(value: Any) -> Any:
    """An Autogrow / DynamicCombo dict with each member value as ComfyUI's payload."""
    if isinstance(value, dict):
        return {k: _members_to_comfy(v) for k, v in value.items()}
    return payloads.to_comfy("*", value)


def spec_for_class(name: str, cls: Any, *, pack: str, display_name: str | None = None,
                   python_module: str | None = None) -> NodeSpec:
    """The engine's spec of one ComfyUI node class. AdapterError when the class cannot be read."""
    where = f"custom node pack {pack!r}, node {name}"
    v3 = is_v3(cls)
    try:
        with host_path():
            if v3:
                cls.GET_SCHEMA()
            types = cls.INPUT_TYPES()
    except Exception as e:  # noqa: BLE001 - a broken class is reported, the pack goes on
        raise AdapterError(f"{where}: INPUT_TYPES failed: {type(e).__name__}: {e}") from e
    if not isinstance(types, dict):
        raise AdapterError(f"{where}: INPUT_TYPES() must return a dict, not {type(types).__name__}")
    func_name = getattr(cls, "FUNCTION", None)
    if not func_name or not hasattr(cls, func_name):
        raise AdapterError(f"{where}: FUNCTION {func_name!r} is not a method of the class")

    validator = _validator_of(cls, v3)
    v_names, v_kwargs = _params(validator) if validator is not None else ([], False)
    declared = [*(types.get("required") or {}), *(types.get("optional") or {})]
    claimed = set(declared) if v_kwargs else set(v_names)

    inputs: list[tuple[str, Input]] = []
    infos: dict[str, _InputInfo] = {}
    for group, optional in (("required", False), ("optional", True)):
        for iname, entry in (types.get(group) or {}).items():
            inp, info = _input(iname, entry, optional, iname in claimed, where)
            inputs.append((iname, inp))
            infos[iname] = info
    if v3:
        inputs = _v3_dynamic_inputs(cls.SCHEMA, inputs, infos, where)
    hidden = []
    for hname, kind in (types.get("hidden") or {}).items():
        kind = kind[0] if isinstance(kind, (tuple, list)) and kind else kind
        hidden.append((hname, Hidden(_text(kind))))

    rtypes = [_text(t) if not isinstance(t, (list, tuple)) else "COMBO"
              for t in (getattr(cls, "RETURN_TYPES", ()) or ())]
    rnames = list(getattr(cls, "RETURN_NAMES", None) or rtypes)
    is_list = list(getattr(cls, "OUTPUT_IS_LIST", None) or [False] * len(rtypes))
    outputs = tuple(Output(t, str(rnames[i]) if i < len(rnames) else t,
                           bool(is_list[i]) if i < len(is_list) else False)
                    for i, t in enumerate(rtypes))
    if v3:
        outputs = _v3_match_outputs(cls.SCHEMA, outputs)

    info_extra: list[tuple[str, Any]] = []
    tooltips = getattr(cls, "OUTPUT_TOOLTIPS", None)
    if tooltips is not None:
        info_extra.append(("output_tooltips", list(tooltips)))
    for attr, key in (("DEPRECATED", "deprecated"), ("EXPERIMENTAL", "experimental"),
                      ("API_NODE", "api_node")):
        if getattr(cls, attr, False):
            info_extra.append((key, True))

    func = getattr(cls, func_name)
    _, takes_kwargs = _params(func)
    required = tuple(n for n, i in inputs if not i.optional)
    node = _Node(name, cls, pack, v3, func_name, infos, outputs, hidden)
    input_is_list = bool(getattr(cls, "INPUT_IS_LIST", False))
    fields: dict[str, Any] = dict(
        name=name, fn=node, inputs=tuple(inputs), hidden=tuple(hidden), outputs=outputs,
        category=str(getattr(cls, "CATEGORY", "") or ""),
        display_name=display_name, description=str(getattr(cls, "DESCRIPTION", "") or ""),
        output_node=bool(getattr(cls, "OUTPUT_NODE", False)), wants_ctx=True,
        fingerprint=_fingerprint_of(cls, v3, where, required),
        validate=_validate_fn(validator, v_names, v_kwargs, declared, required),
        python_module=python_module or f"custom_nodes.{pack}",
        precision_types=tuple(sorted({i.type for _, i in inputs if SOCKET_TYPES.is_model(i.type)})),
        extra_inputs=takes_kwargs, info_extra=tuple(info_extra))
    if "input_is_list" in _SPEC_FIELDS:
        fields["input_is_list"] = input_is_list
    lazy = _lazy_of(cls, v3)
    if "check_lazy_status" in _SPEC_FIELDS and lazy is not None and any(i.lazy for i in infos.values()):
        fields["check_lazy_status"] = node.lazy_status
    node.list_fallback = input_is_list and "input_is_list" not in _SPEC_FIELDS
    return NodeSpec(**fields)


def _validator_of(cls: Any, v3: bool) -> Callable | None:
    if v3:
        return cls.validate_inputs if _overrides(cls, "validate_inputs") else None
    return getattr(cls, "VALIDATE_INPUTS", None)


def _lazy_of(cls: Any, v3: bool) -> Callable | None:
    if v3:
        return cls.check_lazy_status
    return getattr(cls, "check_lazy_status", None)


def _fingerprint_of(cls: Any, v3: bool, where: str, required: tuple[str, ...]) -> Callable | None:
    fn = (cls.fingerprint_inputs if _overrides(cls, "fingerprint_inputs") else None) if v3 \
        else getattr(cls, "IS_CHANGED", None)
    if fn is None:
        return None

    def fingerprint(env: Any, **literals: Any) -> Any:
        """IS_CHANGED / fingerprint_inputs over the literal inputs (links are not known before
        the run, as in ComfyUI, which passes None for a linked input: a required input that is
        no literal is a link); its value joins the cache key; a NaN means always re-run."""
        values = {name: None for name in required} | literals
        with host_path():
            value = _maybe_await(fn(**_filtered(fn, values)))
        if isinstance(value, float) and math.isnan(value):
            return value
        return ("IS_CHANGED", value)

    return fingerprint


def _validate_fn(validator: Callable | None, names: list[str], takes_kwargs: bool,
                 declared: list[str], required: tuple[str, ...] = ()) -> Callable | None:
    """The engine's validator hook for VALIDATE_INPUTS / validate_inputs. Its signature names
    what the engine passes and what skips the default checks: the names the validator takes,
    or every declared input when it takes **kwargs (ComfyUI's rule). A required input the engine
    passes no literal for is a link, whose value is not known yet: None, as ComfyUI passes."""
    if validator is None:
        return None
    wants_types = "input_types" in names
    named = [n for n in (declared if takes_kwargs else names) if n != "input_types"]

    def validate(env: Any, **literals: Any) -> list:
        values = {n: None for n in required if n in named} | literals
        call = _filtered(validator, values) if not takes_kwargs else values
        if not wants_types:
            call.pop("input_types", None)
        with host_path():
            result = _maybe_await(validator(**call))
        if result is True:
            return []
        text = "" if result is False or result is None else str(result)
        return [(n, text) for n in call] or [text or "VALIDATE_INPUTS returned False"]

    params = [inspect.Parameter("env", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
               for n in dict.fromkeys([*named, *(["input_types"] if wants_types else [])])]
    if takes_kwargs:
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    validate.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return validate


#: The hidden-input kinds ComfyUI fills itself. A V1 class's hidden input of another kind (its
#: own, e.g. ComfyUI's test pack's "*") gets a value only when the prompt gives one; otherwise it
#: is left out, so the node's own default applies, as in ComfyUI.
FILLED_HIDDEN = frozenset({"PROMPT", "DYNPROMPT", "EXTRA_PNGINFO", "UNIQUE_ID",
                           "AUTH_TOKEN_COMFY_ORG", "API_KEY_COMFY_ORG"})


class _Node:
    """The callable a custom node's spec runs: one per class."""

    def __init__(self, name: str, cls: Any, pack: str, v3: bool, func_name: str,
                 infos: dict[str, _InputInfo], outputs: tuple[Output, ...],
                 hidden: list[tuple[str, Hidden]]):
        self.name, self.cls, self.pack, self.v3, self.func_name = name, cls, pack, v3, func_name
        self.infos, self.outputs, self.hidden = infos, outputs, dict(hidden)
        self.list_fallback = False
        self._objects: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.__name__ = name
        self.__qualname__ = f"{pack}.{name}"
        self.__module__ = getattr(cls, "__module__", "custom_nodes")

    # --- the call ------------------------------------------------------------------------------

    def __call__(self, ctx: Any, **kwargs: Any) -> Any:
        hidden = {n: kwargs.pop(n) for n in list(kwargs) if n in self.hidden}
        given = _given_inputs(ctx)
        args: dict[str, Any] = {}
        for n, v in kwargs.items():
            info = self.infos.get(n)
            if info is not None and info.optional and given is not None and n not in given \
                    and not info.nested:     # a group's members arrive under dotted names
                continue     # absent optional input: the function's own default applies
            if info is not None and info.raw_link and given is not None and isinstance(given.get(n), list):
                v = list(given[n])
            elif info is not None and info.nested:
                v = _members_to_comfy(v)
            else:
                v = payloads.to_comfy(info.type if info else "*", v)
            args[n] = [v] if self.list_fallback else v
        with host_path(), running_node(Running(ctx, self.pack, self.name)):
            builder = sys.modules.get("comfy_execution.graph_utils")
            if builder is not None:      # ComfyUI's pre_execute_cb; the engine adds PARENT.CALL.
                builder.GraphBuilder.set_default_prefix("", 0, 0)
            try:
                target = self._target(ctx, hidden)
                if not self.v3:
                    args.update({n: v for n, v in hidden.items()
                                 if v is not None or self.hidden[n].kind in FILLED_HIDDEN})
                ret = getattr(target, self.func_name)(**args)
                if ENGINE_DYNAMIC and inspect.isawaitable(ret):
                    # the engine awaits it on its loop; other nodes run meanwhile
                    return self._finish_async(ret, ctx)
                return self._result(_maybe_await(ret))
            except (Interrupted, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - restated when a host API is missing
                better = explain(e, self.pack, self.name)
                if better is not None:
                    raise better from e
                raise

    async def _finish_async(self, pending: Any, ctx: Any) -> Result:
        """An async FUNCTION's body runs here, with the host modules and its running node."""
        with host_path(), running_node(Running(ctx, self.pack, self.name)):
            try:
                return self._result(await pending)
            except (Interrupted, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - restated when a host API is missing
                better = explain(e, self.pack, self.name)
                if better is not None:
                    raise better from e
                raise

    def _target(self, ctx: Any, hidden: dict[str, Any]) -> Any:
        if self.v3:     # a per-call clone whose `hidden` holds this call's hidden inputs
            holder = self.cls._HIDDEN_HOLDER.from_dict(
                {self.hidden[n].kind: v for n, v in hidden.items()})
            return type(self.cls.__name__, (self.cls,), {
                "hidden": holder, "SCHEMA": self.cls.__dict__.get("SCHEMA"),
                "__module__": self.cls.__module__})
        with self._lock:
            obj = self._objects.get(ctx.node_id)
            if obj is None:
                obj = self._objects[ctx.node_id] = self.cls()
                if len(self._objects) > _OBJECTS_KEPT:
                    self._objects.popitem(last=False)
            else:
                self._objects.move_to_end(ctx.node_id)
        return obj

    def _result(self, ret: Any) -> Result:
        ui = expand = block = None
        if hasattr(ret, "args") and hasattr(ret, "expand") and hasattr(ret, "block_execution"):
            values, ui, expand, block = tuple(ret.args), ret.ui, ret.expand, ret.block_execution
        elif isinstance(ret, dict):
            ui, expand = ret.get("ui"), ret.get("expand")
            values = ret.get("result", ())
        elif ret is None:
            values = ()
        else:
            values = ret
        if block is not None:
            values = tuple(_blocker(block) for _ in self.outputs)
        if hasattr(ui, "as_dict"):
            ui = ui.as_dict()
        if _is_blocker(values):
            values = tuple(values for _ in self.outputs)
        if not isinstance(values, (tuple, list)):
            raise TypeError(f"{self.name}.{self.func_name} returned {type(values).__name__}; "
                            f"a ComfyUI node returns a tuple of its {len(self.outputs)} output(s)")
        values = tuple(self._convert(i, v) for i, v in enumerate(values))
        if expand is not None:
            if "expand" not in _RESULT_FIELDS:
                raise NotImplementedError(
                    f"node {self.name} (custom node pack {self.pack!r}) expands into a subgraph; "
                    f"node expansion is not supported yet by this engine")
            return Result(values=values, ui=ui, expand=expand)  # type: ignore[call-arg]
        return Result(values=values, ui=ui)

    def _convert(self, i: int, v: Any) -> Any:
        if i >= len(self.outputs) or _is_blocker(v):
            return v
        out = self.outputs[i]
        kind = "*" if out.match is not None else out.type   # a MatchType output: any payload
        if out.is_list and isinstance(v, list):
            return [payloads.from_comfy(kind, x) for x in v]
        return payloads.from_comfy(kind, v)

    # --- lazy inputs (called by the engine) ----------------------------------------------------

    def lazy_status(self, ctx: Any = None, **kwargs: Any) -> list[str]:
        """check_lazy_status over the node's inputs (unevaluated lazy ones are None)."""
        args = {n: payloads.to_comfy(self.infos[n].type if n in self.infos else "*", v)
                for n, v in kwargs.items() if n not in self.hidden}
        with host_path():
            if self.v3:
                fn = self.cls.check_lazy_status
            else:
                target = self._target(ctx, {}) if ctx is not None else self.cls()
                fn = getattr(target, "check_lazy_status")
            needed = _maybe_await(fn(**_filtered(fn, args)))
        return list(needed or [])


def _given_inputs(ctx: Any) -> dict | None:
    """The inputs the prompt gives this node (ComfyUI passes only those), from the run's dynamic
    prompt, so an expanded node's are known too (its raw links included); None when there is
    no prompt to look at."""
    try:
        node = ctx.dynprompt.get_node(ctx.node_id)
    except Exception:  # noqa: BLE001 - no prompt to look at
        return None
    inputs = node.get("inputs") if isinstance(node, dict) else None
    return inputs if isinstance(inputs, dict) else None


def _is_blocker(v: Any) -> bool:
    return type(v).__name__ == "ExecutionBlocker" and hasattr(v, "message")


def _blocker(message: Any) -> Any:
    from comfy_execution.graph_utils import ExecutionBlocker  # the host module: on the path here
    return ExecutionBlocker(message)
