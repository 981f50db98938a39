"""ComfyUI's loop nodes (comfy_extras/nodes_loop.py, Comfy-Org/ComfyUI 023f153): `StartLoop`,
`EndLoop` and the dev-only `LoopIteration`, `LoopProgress`, `LoopResult` StartLoop's expansion
creates. Names, inputs, defaults, outputs and behaviour are ComfyUI's; the code is mixgraph's.

How a loop runs (the engine side is graph/loops.py): the engine pairs StartLoop with the EndLoop
downstream of it and marks the body between them. StartLoop computes its iteration values
(`simple`: range(num_iterations); `For`: range(start, max, step), step 0 an error; `List`: one
per list item) and expands into the body unrolled: per iteration a `LoopIteration` (index,
is_first / is_last, the list item, the carried value, and links to the previous iteration's
results so iterations run in order), copies of the body nodes with their links to StartLoop
rewired to it, and a `LoopProgress`; then one `LoopResult`, which hands EndLoop the
`output_value` of every iteration (`accumulate`) or of the last, and lets it run. The original
body never runs; EndLoop waits for LoopResult (an external block) with its body inputs removed.
Each iteration's `next_iteration_value` is the next one's `current_iteration_value`. StartLoop
re-runs on every prompt (fingerprint NaN); iterations are cached only with `cache_iterations`.
A loop nested in a body is unrolled again in every copy of the outer body.
"""

from __future__ import annotations

import math

from mixgraph.graph.dynamic import MatchTemplate, Option, autogrow, dynamic_combo, match_input, match_output
from mixgraph.graph.expand import is_link
from mixgraph.graph.node import Boolean, Int, Output, Result, Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Hidden, Input

LIST_ITEM = MatchTemplate("list_item")
CARRIED = MatchTemplate("carried_value")
OUTPUT_VALUE = MatchTemplate("output_value")
_NAN = float("nan")


def _first(value):
    return value[0] if isinstance(value, list) else value


def _never_cached(env, **kw):
    return _NAN


def _iteration_fingerprint(env, reuse_cache=False, **kw):
    return None if _first(reuse_cache) else _NAN


def _dev_node(**kw):
    """ComfyUI's `is_dev_only` nodes (object_info `dev_only`): made by the loop expansion."""
    def wrap(fn):
        fn = node(register=False, **kw)(fn)
        fn.spec = REGISTRY.add(replace_spec(fn.spec, info_extra=(("dev_only", True),)))
        return fn
    return wrap


def _tip(text: str, inp: Input) -> Input:
    from dataclasses import replace
    return replace(inp, tooltip=text)


_MODE = dynamic_combo([
    Option("simple", (("num_iterations", Int(4, min=0, tooltip="Number of times to execute the loop body.")),)),
    Option("For", (
        ("start_iteration_index", Int(0, tooltip="Index of the first iteration when using For loop mode.")),
        ("max_iteration", Int(4, max=0xffffffffffffffff,
                              tooltip="The exclusive stopping value for iteration_index in For mode.")),
        ("step", Int(1, min=1, tooltip="The index step size between each iteration when using For loop mode.")),
    )),
    Option("List", (("list", match_input(LIST_ITEM, tooltip="List of items the loop iterates on. "
                                         "The loop body executes once per item.")),)),
], tooltip="The loop iteration mode.")


def _iteration_values(nid: str, mode: dict) -> tuple[list, list | None]:
    chosen = _first(mode.get("mode", ["simple"]))
    if chosen == "simple":
        return list(range(_first(mode.get("num_iterations", [4])))), None
    if chosen == "For":
        step = _first(mode.get("step", [1]))
        if step == 0:
            raise ValueError(f"Start Loop {nid}: input mode.step must not be 0")
        return list(range(_first(mode.get("start_iteration_index", [0])),
                          _first(mode.get("max_iteration", [4])), step)), None
    items = mode.get("list")
    if items is None:
        raise ValueError(f"Start Loop {nid}: mode 'List' needs its input mode.list linked")
    items = list(items)
    return list(range(len(items))), items


def _literal(value):
    """A literal for the expanded graph: wrapped when it could be read as a link."""
    return {"__value__": value} if is_link(value) or isinstance(value, dict) else value


def _unroll(dyn, start: str, body: list[str], end: str, values: list, items: list | None,
            initial, reuse: bool) -> dict:
    """The API-format graph of the unrolled loop (ids local to the expansion)."""
    graph: dict[str, dict] = {}
    end_inputs = dyn.get_node(end)["inputs"]
    output_src = end_inputs.get("output_value")
    next_src = end_inputs.get("next_iteration_value")
    terminations = [v for k, v in end_inputs.items() if k.startswith("terminations.") and is_link(v)]
    accumulate = bool(_first(end_inputs.get("accumulate", False)))
    used = {v[1] for n in (*body, end) for v in dyn.get_node(n).get("inputs", {}).values()
            if is_link(v) and str(v[0]) == start}
    carry = initial
    deps: list = []
    progress = None
    result: dict = {"close_id": end}
    last = len(values) - 1
    for pos, value in enumerate(values):
        it = f"iteration_{pos}"
        graph[it] = {"class_type": "LoopIteration", "override_display_id": start, "inputs": {
            "iteration_index": value, "is_first": 1 in used and pos == 0,
            "is_last": 2 in used and pos == last,
            "list_item": _literal(items[pos]) if items is not None else None,
            "current_iteration_value": carry, "reuse_cache": reuse,
            **{f"dependency{i}": d for i, d in enumerate(deps)}}}
        copies = {n: f"{pos}_{n}" for n in body}

        def rewire(v, it=it, copies=copies):
            if not is_link(v):
                return v
            src = str(v[0])
            if src == start:
                return [it, v[1]]
            if src in copies:
                return [copies[src], v[1]]
            return v

        for n, cid in copies.items():
            original = dyn.get_node(n)
            graph[cid] = {"class_type": original["class_type"], "override_display_id": n,
                          "inputs": {k: rewire(v) for k, v in original.get("inputs", {}).items()}}
        deps = []
        if is_link(output_src):
            out = rewire(output_src)
            if accumulate:
                result[f"output{pos}"] = out
            elif pos == last:
                result["output0"] = out
            deps.append(out)
        if is_link(next_src):
            carry = rewire(next_src)
            deps.append(carry)
        deps += [rewire(t) for t in terminations]
        inputs = {"start_id": start, "position": pos + 1, "total": len(values),
                  **{f"dependency{i}": d for i, d in enumerate(deps)}}
        if progress is not None:
            inputs["previous_progress"] = progress
        graph[f"progress_{pos}"] = {"class_type": "LoopProgress", "inputs": inputs}
        progress = [f"progress_{pos}", 0]
    if progress is not None:
        result["progress"] = progress
    result.update({f"dependency{i}": d for i, d in enumerate(deps)})
    graph["result"] = {"class_type": "LoopResult", "inputs": result}
    return graph


@node(category="utilities/looping", display_name="Start Loop", input_is_list=True,
      loop_boundary="start", fingerprint=_never_cached,
      outputs=(Output("INT", "iteration_index"), Output("BOOLEAN", "is_first"),
               Output("BOOLEAN", "is_last"), match_output(LIST_ITEM, "list_item"),
               match_output(CARRIED, "current_iteration_value")))
def StartLoop(mode=_MODE,
              cache_iterations=_tip("Reuse unchanged iteration results from previous executions. "
                                    "Disable to execute every iteration again.", Boolean(False)),
              parent_iteration=Input("INT", optional=True, force_input=True,
                                     tooltip="Connect iteration_index from an outer Start Loop to nest this loop."),
              initial_iteration_value=match_input(CARRIED, optional=True,
                                                  tooltip="Value exposed as current_iteration_value on the first iteration."),
              dynprompt=Hidden("DYNPROMPT"), execution_list=Hidden("EXECUTION_LIST"),
              unique_id=Hidden("UNIQUE_ID")):
    nid = str(_first(unique_id))
    dyn, control = _first(dynprompt), _first(execution_list)
    values, items = _iteration_values(nid, mode)
    loop = dyn.get_node(nid)
    if "_loop_end" not in loop or control is None:
        raise ValueError(f"Start Loop {nid} has no End Loop downstream of it (link the loop "
                         f"body's result to an End Loop)")
    body, end = list(loop["_loop_body"]), loop["_loop_end"]
    graph = _unroll(dyn, nid, body, end, values, items, loop["inputs"].get("initial_iteration_value"),
                    bool(_first(cache_iterations)))
    end_node = dyn.get_node(end)
    kept = {k: v for k, v in end_node["inputs"].items()
            if k not in ("output_value", "next_iteration_value") and not k.startswith("terminations")}
    control.add_node(end)
    control.add_external_block(end)
    control.inhibit_nodes(body)
    control.override_inputs(end, kept)
    return Result((None, False, not values, None, None), expand=graph)


@_dev_node(category="sd", input_is_list=True, accept_all_inputs=True,
      fingerprint=_iteration_fingerprint,
      outputs=("INT", "BOOLEAN", "BOOLEAN", "*", Output("*", "*", is_list=True)))
def LoopIteration(iteration_index=Int(0), is_first=Boolean(False), is_last=Boolean(False),
                  list_item=Socket("*", optional=True), current_iteration_value=Socket("*", optional=True),
                  reuse_cache=Boolean(False), **kwargs):
    # Dev-only: one iteration's StartLoop outputs.
    return (iteration_index[0], is_first[0], is_last[0], list_item[0] if list_item else None,
            list(current_iteration_value) if current_iteration_value is not None else [None])


@_dev_node(category="sd", input_is_list=True, accept_all_inputs=True, output_node=True,
      fingerprint=_never_cached, outputs=("INT",))
def LoopProgress(ctx, start_id=String(), position=Int(0), total=Int(0), **kwargs):
    # Dev-only: reports "Iteration i / n" on the Start Loop.
    ctx.progress(position[0], total[0])
    return (position[0],)


@_dev_node(category="sd", input_is_list=True, accept_all_inputs=True, output_node=True,
      fingerprint=_never_cached)
def LoopResult(close_id=String(), execution_list=Hidden("EXECUTION_LIST"), **kwargs):
    # Dev-only: hands End Loop the iterations' output values and lets it run.
    outputs = []
    while f"output{len(outputs)}" in kwargs:
        outputs.append(kwargs[f"output{len(outputs)}"])
    _first(execution_list).release_external_block(close_id[0], outputs)
    return ()


@node(category="utilities/looping", display_name="End Loop", input_is_list=True, loop_boundary="end",
      outputs=(match_output(OUTPUT_VALUE, "outputs", is_list=True),))
def EndLoop(output_value=match_input(OUTPUT_VALUE, optional=True,
                                     tooltip="Value returned by End Loop. It returns the final iteration or all iterations according to accumulate."),
            next_iteration_value=match_input(CARRIED, optional=True,
                                             tooltip="Value sent from End Loop back to Start Loop for the next iteration."),
            accumulate=Boolean(False, tooltip="Return output_value from every iteration when enabled; "
                               "otherwise return only the final iteration."),
            terminations=autogrow(Socket("*", tooltip="Connect a preview or side-effect output that must "
                                         "execute on every iteration. Its value is not returned."),
                                  "termination", prefix="termination", min=0, max=50, optional=True,
                                  tooltip="Connect outputs that must execute on every iteration. "
                                  "Their values are not returned."),
            execution_list=Hidden("EXECUTION_LIST"), unique_id=Hidden("UNIQUE_ID")):
    nid = str(_first(unique_id))
    control = _first(execution_list)
    outputs = control.get_external_block_result(nid) if control is not None else None
    if outputs is None:
        raise ValueError(f"End Loop {nid} is not paired with a Start Loop upstream of it (link "
                         f"the loop body to a Start Loop's outputs)")
    return ([v for out in outputs for v in out],)
