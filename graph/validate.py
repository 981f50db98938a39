"""Prompt validation: every problem, collected before anything runs (DESIGN §5).

Follows ComfyUI 0.3.64's `validate_prompt` (comfy-conventions §1.2): same error `type` strings,
same JSON shape, same coercions, and the same rule that outputs failing validation are dropped
while the valid ones still run. Where ComfyUI stops at the first problem or crashes, we go on and
report; the differences:

* a link to a node that is not in the prompt, or to an output slot the node does not have, is a
  `bad_linked_input` whose message names the node (ComfyUI raises a KeyError/IndexError that
  surfaces as `exception_during_validation`);
* a literal given to a registered link-only input (MODEL, LATENT, ...) is an `invalid_input_type`
  (one for a type nobody registered, a pack's own, passes unchanged, as in ComfyUI);
* a dependency cycle is one `dependency_cycle` problem, on the cycle's node first in prompt
  order, found here rather than at execution; it names at most `plan.CYCLE_LISTED` nodes of the
  cycle (`extra_info`: `cycle`, `cycle_length`), so a 20,000-node cycle gives a small error body;
* the upstream nodes of a mismatched link are still validated, so their problems show too;
* unknown classes and nodes without `class_type` abort the prompt (`invalid_prompt`, as ComfyUI)
  but are listed in `node_errors` too, so an editor can highlight them; a class the registry
  refuses by name (`Registry.refuse`: a ComfyUI node mixgraph knows of but does not run) says
  why instead of "does not exist".

Coercion is ComfyUI's: `int()`, `float()`, `str()`, `bool()` on the literal. So `int(3.9) == 3`,
`int("3.5")` fails, and `bool("false")` is True (Python truthiness; the frontend always sends JSON
booleans). `step` and `round` are not checked. A FLOAT must be finite (ComfyUI lets NaN through).
A node's own `validate(env, ...)` function takes over some default checks of the inputs it names
(ComfyUI's VALIDATE_INPUTS rule, narrowed: a fixed option list always applies); the precise rule
is `_NodeChecker.claims`'s. A validator that takes `input_types` gets the received types of the
linked inputs and judges them itself (no `return_type_mismatch` for that node), as ComfyUI's
VALIDATE_INPUTS; a spec with `extra_inputs` keeps its undeclared links (checked to exist), one
with `accept_all_inputs` its undeclared literals as well (unchecked: the node judges them).

Linear time without recursion: the ancestors of the outputs, their order and the cycles come from
`graph.plan` (one walk that also checks each node once, Kahn's algorithm, and strongly connected
components of only what Kahn leaves over); validity and `dependent_outputs` then flow along the
order.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from mixgraph.graph.dynamic import TypeResolver, check_literal, check_templates, expand_inputs, is_dynamic
from mixgraph.graph.plan import components, links_of, needed_in_order, topological, walk
from mixgraph.graph.prompt import BadLink, Link, NodeCall
from mixgraph.graph.registry import input_entry
from mixgraph.graph.spec import SOCKET_TYPES, Input, NodeSpec

_MISSING = object()
COERCE: dict[str, Callable[[Any], Any]] = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}


@dataclass(frozen=True)
class Problem:
    node_id: str | None
    class_type: str | None
    type: str
    message: str
    details: str = ""
    input_name: str | None = None
    extra_info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """One entry of ComfyUI's `node_errors[id]["errors"]` (or a top-level `error`)."""
        extra = dict(self.extra_info)
        if self.input_name is not None:
            extra = {"input_name": self.input_name, **extra}
        return {"type": self.type, "message": self.message, "details": self.details,
                "extra_info": extra}


@dataclass
class Validation:
    """`outputs`: output node ids that will run. `inputs`: per validated node, its declared
    inputs (literals coerced, links as `Link`). `error`: ComfyUI's top-level error JSON when
    nothing can run. `order`: the nodes the valid outputs need, in topological order (ties in
    prompt order), following only the links that passed. `ok` is ComfyUI's verdict (something
    runs: `error is None`); `clean` means no problem at all."""

    outputs: tuple[str, ...]
    inputs: dict[str, dict[str, Any]]
    errors: list[Problem]
    node_errors: dict[str, dict]
    error: dict | None
    order: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def clean(self) -> bool:
        return self.error is None and not self.errors

    def error_body(self) -> dict:
        """The HTTP 400 body of `POST /prompt`."""
        return {"error": self.error, "node_errors": self.node_errors}


def validate(prompt: dict[str, NodeCall], registry: Any, env: Any = None,
             targets: Iterable[str] | None = None, extra_checks: Callable | None = None) -> Validation:
    """Check a prompt against the registry. `targets` limits the output nodes (partial execution);
    `extra_checks(node_id, call, spec, inputs) -> iterable of Problem | str` adds checks of its
    own for every validated node (a str becomes a `custom_validation_failed`)."""
    with gc_paused():
        return _validate(prompt, registry, env, targets, extra_checks)


def _validate(prompt, registry, env, targets, extra_checks) -> Validation:
    fatal: list[Problem] = []
    specs: dict[str, NodeSpec] = {}
    by_class: dict[str, NodeSpec | None] = {}
    for nid, call in prompt.items():
        ct = call.class_type
        if not ct:
            fatal.append(Problem(nid, None, "invalid_prompt", "Cannot execute because a node is "
                                 "missing the class_type property.", f"Node ID '#{nid}'"))
            continue
        spec = by_class.get(ct, _MISSING)
        if spec is _MISSING:
            spec = by_class[ct] = registry.get(ct)
        if spec is None:
            refusal = getattr(registry, "refusal", None)
            why = refusal(ct) if refusal is not None else None
            said = f"node {ct} is not supported yet: {why}" if why else f"node {ct} does not exist."
            fatal.append(Problem(nid, ct, "invalid_prompt", f"Cannot execute because {said}",
                                 f"Node ID '#{nid}'"))
        else:
            specs[nid] = spec
    wanted = None if targets is None else {str(t) for t in targets}
    outputs = [nid for nid, s in specs.items() if s.output_node and (wanted is None or nid in wanted)]

    # One walk back from the outputs finds the ancestors and checks each of them once.
    checker = _NodeChecker(prompt, specs, env, extra_checks)
    check = checker.check
    own: dict[str, list[Problem]] = {p.node_id: [p] for p in fatal}
    inputs: dict[str, dict[str, Any]] = {}
    ups: dict[str, list[str]] = {}

    def upstream(nid: str) -> list[str]:
        spec = specs.get(nid)
        if spec is None:
            linked = [v.node_id for v in prompt[nid].inputs.values()
                      if type(v) is Link and v.node_id in prompt]
        else:
            inputs[nid], problems, linked = check(nid, prompt[nid], spec)
            if problems:
                own.setdefault(nid, []).extend(problems)
        ups[nid] = linked
        return linked

    walk(outputs, upstream)
    order, stuck = topological(ups, prompt)
    if not own and outputs and not stuck:
        # the common case: no problem, no cycle; nothing to report, nothing to propagate
        return Validation(outputs=tuple(outputs), inputs=inputs, errors=[], node_errors={},
                          error=None, order=tuple(order))
    units, unit_of = _units(order, stuck, ups, own, prompt)
    bad, masks = _propagate(units, unit_of, ups, own, outputs)
    good = tuple(o for o in outputs if not bad[unit_of[o]])
    failed_bits = {i: o for i, o in enumerate(outputs)}

    errors: list[Problem] = []
    node_errors: dict[str, dict] = {}
    for nid in prompt:
        problems = own.get(nid)
        if not problems:
            continue
        errors.extend(problems)
        mask = masks[unit_of[nid]] if nid in unit_of else 0
        dependent = [failed_bits[i] for i in _bits(mask)]
        node_errors[nid] = {"errors": [p.to_json() for p in problems],
                            "dependent_outputs": dependent,
                            "class_type": prompt[nid].class_type}

    error = None
    if fatal:
        error = fatal[0].to_json()
        good = ()
    elif not outputs:
        p, error = _no_outputs()
        errors.insert(0, p)
    elif not good:
        error = {"type": "prompt_outputs_failed_validation",
                 "message": "Prompt outputs failed validation",
                 "details": "\n".join(f"{p.message}: {p.details}" for p in errors),
                 "extra_info": {}}
    if fatal:  # the abort reasons first, then the rest in prompt order
        first = {id(p) for p in fatal}
        errors = fatal + [p for p in errors if id(p) not in first]
    runnable = needed_in_order(order, good, lambda n: links_of(inputs[n])) if good else ()
    return Validation(outputs=good, inputs=inputs, errors=errors, node_errors=node_errors,
                      error=error, order=runnable)


def _no_outputs() -> tuple[Problem, dict]:
    p = Problem(None, None, "prompt_no_outputs", "Prompt has no outputs")
    return p, p.to_json()


@contextlib.contextmanager
def gc_paused():
    """Validation, planning and cache-hit bookkeeping allocate only acyclic objects; pausing the
    cycle collector keeps its passes over everything alive (a big output cache, a 100,000-node
    prompt) out of their cost."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _units(order: list[str], stuck: list[str], ups: dict[str, list[str]],
           own: dict[str, list[Problem]], prompt: dict) -> tuple[list[tuple[str, ...]], dict[str, int]]:
    """Topological units: singletons in Kahn's order, then the strongly connected components of
    what is stuck (cycles and what hangs behind them). Each cycle is one `dependency_cycle`
    problem, on its node first in prompt order, naming at most `CYCLE_LISTED` nodes."""
    units = [(n,) for n in order]
    more, cycles = components(stuck, ups, prompt)
    units += more
    for cycle in cycles:
        first = cycle.nodes[0]
        own.setdefault(first, []).append(Problem(
            first, prompt[first].class_type, "dependency_cycle",
            f"Dependency cycle: {cycle.describe()}",
            f"Node ID '#{first}' is on a cycle of {len(cycle.nodes)} linked node(s)",
            extra_info={"cycle": cycle.listed(), "cycle_length": len(cycle.nodes)}))
    unit_of = {m: i for i, u in enumerate(units) for m in u}
    return units, unit_of


def _propagate(units, unit_of, ups, own, outputs) -> tuple[list[bool], list[int]]:
    """bad[u]: the unit or anything upstream has a problem. masks[u]: bit i set when output i
    depends on the unit."""
    bad = [False] * len(units)
    for i, unit in enumerate(units):
        bad[i] = any(m in own for m in unit) or any(
            bad[unit_of[u]] for m in unit for u in ups[m] if unit_of[u] != i)
    masks = [0] * len(units)
    consumers: dict[str, list[str]] = {}
    for unit in units:
        for m in unit:
            for u in ups[m]:
                consumers.setdefault(u, []).append(m)
    bit = {o: 1 << i for i, o in enumerate(outputs)}
    for i in range(len(units) - 1, -1, -1):
        mask = 0
        for m in units[i]:
            mask |= bit.get(m, 0)
            for d in consumers.get(m, ()):
                if unit_of[d] != i:
                    mask |= masks[unit_of[d]]
        masks[i] = mask
    return bad, masks


def _bits(mask: int) -> list[int]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


class _NodeChecker:
    """Checks one node's declared inputs; caches option lists and validator signatures."""

    def __init__(self, prompt: dict, specs: dict, env: Any, extra_checks: Callable | None):
        self.prompt, self.specs, self.env, self.extra_checks = prompt, specs, env, extra_checks
        self._options: dict[tuple[str, str], list] = {}
        self._claims: dict[str, tuple[frozenset[str], bool]] = {}
        # validators taking `input_types` (ComfyUI's VALIDATE_INPUTS rule): they get the linked
        # inputs' received types, and judge link types themselves
        self._typed: set[str] = set()
        self._dynamic: dict[str, bool] = {}   # per class: has MatchType / autogrow sockets
        self._resolver: TypeResolver | None = None

    @property
    def resolver(self) -> TypeResolver:
        if self._resolver is None:
            self._resolver = TypeResolver(self.prompt, self.specs, Link)
        return self._resolver

    def options(self, spec: NodeSpec, name: str, inp: Input) -> list:
        # the options object too: a DynamicCombo's options may each give one dotted sub-input
        # name its own list (`format.bit_depth`: png's and exr's)
        key = (spec.name, name, id(inp.options))
        if key not in self._options:
            self._options[key] = inp.option_list(self.env)
        return self._options[key]

    def claims(self, spec: NodeSpec) -> tuple[frozenset[str], bool]:
        """Inputs the node's own validate() names, and whether it takes **kwargs.

        The rule for a named ("claimed") input, ComfyUI's VALIDATE_INPUTS rule narrowed by one
        thing: the validator takes over the input's min/max check and, for a combo whose options
        are computed from the environment (a callable: the files in a folder), its option check;
        LoadImage looks for its file itself. A combo with a *fixed* option list (a sequence in
        the declaration: sampler names, CLIP types) is checked against it all the same: that list
        is the node's schema, the one `object_info` gives clients, and a validator may narrow it
        (KSampler refuses samplers not implemented yet) but never widen it. So a value outside
        a fixed list is always `value_not_in_list`, before the validator runs. Coercion and
        the finiteness of floats are checked for every input. A `**kwargs` parameter claims
        nothing: it only receives the other literals. (A node that really accepts values beyond
        its declared list, as some ComfyUI custom nodes do, declares the list as a callable.)"""
        if spec.name not in self._claims:
            params = list(inspect.signature(spec.validate).parameters.values())[1:]
            named = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
            self._claims[spec.name] = (named - {"input_types"},
                                       any(p.kind == p.VAR_KEYWORD for p in params))
            if "input_types" in named:
                self._typed.add(spec.name)
        return self._claims[spec.name]

    def config(self, spec: NodeSpec, name: str, inp: Input) -> list:
        opts = self.options(spec, name, inp) if inp.type == "COMBO" else None
        return input_entry(inp, self.env, opts)

    def check(self, nid: str, call: NodeCall, spec: NodeSpec
              ) -> tuple[dict[str, Any], list[Problem], list[str]]:
        """The node's checked inputs, its problems, and the ids of the prompt's nodes its declared
        inputs link to (also the links that failed a check: they still order the graph)."""
        claimed, kwargs = self.claims(spec) if spec.validate is not None else (frozenset(), False)
        typed = spec.name in self._typed
        received: dict[str, str] = {}
        got: dict[str, Any] = {}
        problems: list[Problem] = []
        linked: list[str] = []
        prompt, specs, given = self.prompt, self.specs, call.inputs
        dynamic = self._dynamic.get(spec.name)
        if dynamic is None:
            dynamic = self._dynamic[spec.name] = is_dynamic(spec)
        declared = spec.inputs
        if dynamic:   # autogrow groups become their given (and required) members
            declared, unknown = expand_inputs(spec, given)
            for name, why in unknown:
                problems.append(_problem(nid, call, _fail(
                    "invalid_input_type", why, name, name)))

        for name, inp in declared:
            v = given.get(name, _MISSING)
            if v is _MISSING:
                if not inp.optional:
                    problems.append(_problem(nid, call, _fail(
                        "required_input_missing", "Required input is missing", name, name)))
                continue
            tv = type(v)
            if tv is Link:
                up_id = v.node_id
                if up_id in prompt:
                    linked.append(up_id)
                    up = specs.get(up_id)
                    # the usual case inline: a link to an existing slot of the declared type
                    if up is not None and 0 <= v.slot < len(up.outputs) and \
                            (typed or up.outputs[v.slot].type == inp.type):
                        got[name] = v
                        received[name] = up.outputs[v.slot].type
                        continue
                failed = self._check_link(v, name, inp, spec)
                if failed is None:
                    got[name] = v
                else:
                    problems.append(_problem(nid, call, failed))
            elif tv is BadLink:
                problems.append(_problem(nid, call, _fail(
                    "bad_linked_input", "Bad linked input, must be a length-2 list of "
                    "[node_id, slot_index]", name, name, input_config=self.config(spec, name, inp),
                    received_value=list(v.raw))))
            else:
                ok, value = self._check_literal(v, name, inp, spec, name in claimed)
                if ok:
                    got[name] = value
                else:
                    problems.append(_problem(nid, call, value))

        if dynamic:   # each MatchType template: allowed types, one type for all its inputs
            for name, tid, kind, expected, why in check_templates(nid, spec, got, self.resolver):
                problems.append(_problem(nid, call, _fail(
                    "return_type_mismatch", "Return type mismatch between linked nodes",
                    f"{why} (received_type({kind}) mismatch input_type({expected}))", name,
                    received_type=kind, template_id=tid)))
        if spec.extra_inputs or spec.accept_all_inputs:   # undeclared links reach **kwargs;
            declared = spec.input_map                        # literals only with accept_all_inputs
            hidden = {n for n, _ in spec.hidden}   # a value the prompt gives a hidden input
            for name, v in given.items():          # reaches the node too, as in ComfyUI
                if name in declared or name in got:
                    continue
                if type(v) is not Link and (spec.accept_all_inputs or name in hidden) \
                        and type(v) is not BadLink:
                    got[name] = v
                elif type(v) is Link:
                    if v.node_id in prompt:
                        linked.append(v.node_id)
                    failed = self._check_link(v, name, Input("*"), spec)
                    if failed is None:
                        got[name] = v
                    else:
                        problems.append(_problem(nid, call, failed))
        if spec.validate is not None and not problems:
            literals = {k: x for k, x in got.items() if type(x) is not Link}
            if not kwargs:
                literals = {k: x for k, x in literals.items() if k in claimed}
            if typed:
                literals["input_types"] = received
            try:
                found = spec.validate(self.env, **literals) or []
            except Exception as e:  # a validator's crash is reported, not raised
                found = []
                problems.append(_problem(nid, call, _fail(
                    "exception_during_validation", "Exception when validating node", str(e), None,
                    exception_type=f"{type(e).__module__}.{type(e).__qualname__}")))
            for item in found:
                name, text = item if isinstance(item, tuple) else (None, str(item))
                problems.append(_problem(nid, call, _fail(
                    "custom_validation_failed", "Custom validation failed for node",
                    f"{name} - {text}" if name and text else name or text, name)))
        if self.extra_checks is not None:
            for item in self.extra_checks(nid, call, spec, got) or ():
                if isinstance(item, Problem):
                    problems.append(item)
                else:
                    problems.append(_problem(nid, call, _fail(
                        "custom_validation_failed", "Custom validation failed for node", str(item),
                        None)))
        return got, problems, linked

    def _check_link(self, v: Link, name: str, inp: Input, spec: NodeSpec) -> tuple | None:
        """None when the link is fine, else the problem (`_fail`)."""
        if v.node_id not in self.prompt:
            return _fail("bad_linked_input", f"Input '{name}' is linked to node {v.node_id}, "
                         f"which is not in the prompt", name, name, linked_node=[v.node_id, v.slot])
        up = self.specs.get(v.node_id)
        if up is None:
            return None  # the upstream node's own invalid_prompt says what is wrong
        if not 0 <= v.slot < len(up.outputs):
            return _fail("bad_linked_input", f"Input '{name}' is linked to output {v.slot} of "
                         f"node {v.node_id} ({up.name}), which has {len(up.outputs)} output(s)",
                         name, name, linked_node=[v.node_id, v.slot])
        received = up.outputs[v.slot].type
        if up.outputs[v.slot].match is not None:   # a MatchType output: its resolved type
            received = self.resolver.output_type(v.node_id, v.slot)
        if not types_match(received, "*" if inp.match is not None else inp.type) \
                and spec.name not in self._typed:
            return _fail("return_type_mismatch", "Return type mismatch between linked nodes",
                         f"{name}, received_type({received}) mismatch input_type({inp.type})", name,
                         input_config=self.config(spec, name, inp), received_type=received,
                         linked_node=[v.node_id, v.slot])
        return None

    def _check_literal(self, v, name, inp, spec, claimed) -> tuple[bool, Any]:
        """(True, coerced value), or (False, the problem (`_fail`))."""
        kind = inp.type
        if inp.match is not None or "," in kind:   # MatchType / union sockets (graph.dynamic)
            why = check_literal(v, inp)
            if why is None:
                return True, v
            return False, _fail("invalid_input_type", f"Input '{name}': {why}",
                                f"{name}, {_shown(v)!r}", name, received_value=_shown(v))
        if SOCKET_TYPES.get(kind) is None:
            # a type nobody registered (a custom pack's own, e.g. "BOOL"): as in ComfyUI, the
            # literal goes to the node unchanged; the node that declared the type reads it
            return True, v
        if not SOCKET_TYPES.is_widget(kind) and kind != "*":
            return False, _fail("invalid_input_type", f"Input '{name}' takes a {kind} from another "
                                f"node's output, not a literal value", f"{name}, {_shown(v)!r}",
                                name, received_value=_shown(v))
        if kind in COERCE:
            try:
                v = COERCE[kind](v)
            except Exception as e:
                why = str(e)
                if "integer string conversion" in why:  # not Python's advice on sys settings
                    why = f"more than {sys.get_int_max_str_digits()} digits"
                return False, _fail("invalid_input_type",
                                    f"Failed to convert an input value to a {kind} value",
                                    f"{name}, {_shown(v)}, {why}", name,
                                    input_config=self.config(spec, name, inp),
                                    received_value=_shown(v), exception_message=why)
            if kind == "FLOAT" and not math.isfinite(v):
                # NaN passes every comparison below and would reach the sampler as a NaN image
                return False, _fail("invalid_input_type", f"Value {v} is not a finite number",
                                    name, name,
                                    input_config=self.config(spec, name, inp),
                                    received_value=str(v))
        if not claimed:
            if inp.min is not None and v < inp.min:
                return False, _fail("value_smaller_than_min",
                                    f"Value {v} smaller than min of {inp.min}", name, name,
                                    input_config=self.config(spec, name, inp), received_value=v)
            if inp.max is not None and v > inp.max:
                return False, _fail("value_bigger_than_max",
                                    f"Value {v} bigger than max of {inp.max}", name, name,
                                    input_config=self.config(spec, name, inp), received_value=v)
        # a claimed combo keeps its fixed option list; only a computed one is the validator's
        if kind == "COMBO" and not (claimed and callable(inp.options)):
            options = self.options(spec, name, inp)
            if v not in options:
                big = len(options) > 20
                listed = f"(list of length {len(options)})" if big else str(options)
                details = f"{name}: '{_shown(v)}' not in {listed}"
                if inp.not_listed is not None:   # where the options came from, how to add one
                    details += f"; {inp.not_listed(self.env, v)}"
                return False, _fail("value_not_in_list", "Value not in list", details, name,
                                    input_config=None if big else self.config(spec, name, inp),
                                    received_value=_shown(v))
        return True, v


def _shown(v: Any) -> Any:
    """A rejected literal as an error body carries it: JSON has no NaN or Infinity, and a
    megabyte string need not be echoed whole."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, str) and len(v) > 200:
        return v[:200] + f"... ({len(v)} characters)"
    return v


def _fail(kind: str, message: str, details: str, name: str | None, **extra: Any) -> tuple:
    """A problem found by a check, before it is tied to its node."""
    return kind, message, details, name, extra


def _problem(nid: str, call: NodeCall, failed: tuple) -> Problem:
    kind, message, details, name, extra = failed
    return Problem(nid, call.class_type, kind, message, details, name, extra)


def types_match(received: str, expected: str) -> bool:
    """ComfyUI's `validate_node_input`: equal, `*` on either side, or overlapping unions."""
    if received == expected or received == "*" or expected == "*":
        return True
    got = {t.strip() for t in received.split(",")}
    want = {t.strip() for t in expected.split(",")}
    return bool(got & want)


_HINTS = {
    "invalid_prompt": "check the class name (`mixgraph nodes` lists the installed ones)",
    "prompt_no_outputs": "add an output node such as SaveImage or PreviewImage",
    "required_input_missing": "connect a node to it or give it a value",
    "bad_linked_input": "link it as [node_id, output_index] to an output that exists",
    "return_type_mismatch": "connect an output of the input's type",
    "invalid_input_type": "give a value of the input's type",
    "value_smaller_than_min": "raise the value to the minimum or above",
    "value_bigger_than_max": "lower the value to the maximum or below",
    "value_not_in_list": "choose one of the listed options (`mixgraph nodes` shows them)",
    "custom_validation_failed": "fix the value the node rejected",
    "exception_during_validation": "the node's validator crashed; report it with the details",
    "dependency_cycle": "remove one of the links on the cycle",
}


def format_problems(validation: Validation) -> str:
    """One line per problem for humans: node id, class, input, what is wrong, what to do."""
    lines = []
    for p in validation.errors:
        where = f"node {p.node_id} ({p.class_type or 'no class_type'})" if p.node_id else "prompt"
        if p.input_name:
            where += f" input '{p.input_name}'"
        what = p.message
        if p.details and p.details != p.input_name and p.type != "invalid_prompt":
            what += f": {p.details}"
        hint = _HINTS.get(p.type)
        lines.append(f"{where}: {what} [{p.type}]" + (f"; {hint}" if hint else ""))
    if not lines and validation.error is not None:
        e = validation.error
        lines.append(f"prompt: {e.get('message')}: {e.get('details')} [{e.get('type')}]")
    return "\n".join(lines)
