"""Validation: every ComfyUI error type and JSON shape, partial failures, cycles, big graphs."""

from __future__ import annotations

import time

from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, String, node
from mixgraph.graph.prompt import BadLink, Link, NodeCall
from mixgraph.graph.registry import Registry
from mixgraph.graph.validate import Problem, format_problems, validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes import socket_types  # noqa: F401 - registers MODEL, link-only


@node(outputs=["INT"], register=False)
def Num(value=Int(5, min=0, max=10)):
    pass


@node(outputs=["FLOAT", "STRING", "BOOLEAN"], register=False)
def Lits(x=Float(0.5, min=0.0, max=1.0), s=String(""), b=Boolean(False)):
    pass


@node(outputs=["STRING"], register=False)
def Pick(choice=Combo(["a", "b", "c"])):
    pass


@node(outputs=["STRING"], register=False)
def BigPick(choice=Combo(lambda env: [f"m{i}" for i in range(25)])):
    pass


@node(outputs=["INT"], register=False)
def Sum(a=Socket("INT"), b=Socket("INT", optional=True)):
    pass


@node(outputs=["INT"], register=False)
def AnyIn(x=Socket("*"), y=Socket("INT,FLOAT", optional=True)):
    pass


@node(outputs=["MODEL"], register=False)
def ModelSrc():
    pass


@node(outputs=[], output_node=True, register=False)
def Sink(value=Socket("INT"), label=String("x", optional=True)):
    pass


@node(outputs=[], output_node=True, register=False)
def UseModel(model=Socket("MODEL")):
    pass


def _file_check(env, path):
    return [] if path == "ok.txt" else [f"file {path} not found in input/"]


@node(outputs=["INT"], validate=_file_check, register=False)
def ReadFile(path=Combo(lambda env: ["listed.txt"]), count=Int(1, min=1)):
    pass


REG = Registry()
for _f in (Num, Lits, Pick, BigPick, Sum, AnyIn, ModelSrc, Sink, UseModel, ReadFile):
    REG.add(_f.spec)


def C(class_type, **inputs):
    return NodeCall(class_type, inputs)


def _only(v, nid):
    (err,) = v.node_errors[nid]["errors"]
    return err


def test_validate_valid_prompt_coerces_literals_and_keeps_links():
    prompt = {"1": C("Num", value="7"), "2": C("Lits", x=1, s=3, b=0, junk="ignored"),
              "3": C("Sum", a=Link("1", 0)), "4": C("Sink", value=Link("3", 0), label=12),
              "9": C("Pick", choice="zzz")}  # not an ancestor of an output: not validated
    v = validate(prompt, REG)
    assert v.ok and v.clean and v.error is None and v.node_errors == {}
    assert v.outputs == ("4",)
    assert v.inputs == {"4": {"value": Link("3", 0), "label": "12"}, "3": {"a": Link("1", 0)},
                        "1": {"value": 7}}
    assert type(v.inputs["1"]["value"]) is int
    v2 = validate({"2": C("Lits", x=1, s=3, b="false", junk=1), "5": C("Sink", value=Link("6", 0), label="y"),
                   "6": C("AnyIn", x=Link("2", 1), y=Link("2", 0))}, REG)
    # ComfyUI coerces with bool(): the string "false" is True
    assert v2.clean and v2.inputs["2"] == {"x": 1.0, "s": "3", "b": True}


def test_validate_invalid_prompt_missing_and_unknown_class():
    v = validate({"1": NodeCall("", {}), "2": C("Nope"), "3": C("Sink", value=Link("2", 0), label="z")}, REG)
    assert not v.ok and v.outputs == ()
    assert v.error == {"type": "invalid_prompt", "message": "Cannot execute because a node is missing "
                       "the class_type property.", "details": "Node ID '#1'", "extra_info": {}}
    assert [p.type for p in v.errors] == ["invalid_prompt", "invalid_prompt"]
    assert v.errors[1].message == "Cannot execute because node Nope does not exist."
    assert v.node_errors["2"]["dependent_outputs"] == ["3"]


def test_validate_names_the_reason_of_a_class_refused_by_name():
    reg = Registry()
    for spec in REG.specs():
        reg.add(spec)
    reg.refuse(["Nope", "Sink"], "it needs a thing this engine lacks")
    v = validate({"2": C("Nope"), "3": C("Sink", value=Link("2", 0), label="z")}, reg)
    assert v.error["type"] == "invalid_prompt"
    assert v.error["message"] == ("Cannot execute because node Nope is not supported yet: it needs a "
                                  "thing this engine lacks")
    assert v.error["details"] == "Node ID '#2'"
    assert reg.refusal("Sink") is None and "3" not in v.node_errors    # registered wins
    assert validate({"2": C("Nope")}, REG).error["message"].endswith("does not exist.")


def test_validate_prompt_no_outputs():
    v = validate({"1": C("Num", value=1)}, REG)
    assert v.error == {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "",
                       "extra_info": {}}
    assert v.node_errors == {} and not v.ok
    assert validate({"1": C("Sink", value=Link("2", 0)), "2": C("Num", value=1)}, REG,
                    targets=["2"]).error["type"] == "prompt_no_outputs"


def test_validate_required_input_missing_exact_json():
    v = validate({"5": C("Sink", label="x")}, REG)
    assert v.error == {"type": "prompt_outputs_failed_validation",
                       "message": "Prompt outputs failed validation",
                       "details": "Required input is missing: value", "extra_info": {}}
    assert v.node_errors == {"5": {"errors": [{"type": "required_input_missing",
                                               "message": "Required input is missing",
                                               "details": "value",
                                               "extra_info": {"input_name": "value"}}],
                                   "dependent_outputs": ["5"], "class_type": "Sink"}}


def test_validate_bad_links():
    v = validate({"1": C("Sink", value=BadLink((1, 2, 3))), "2": C("Sink", value=Link("99", 0)),
                  "3": C("Sink", value=Link("4", 2)), "4": C("Num", value=1)}, REG)
    e1, e2, e3 = _only(v, "1"), _only(v, "2"), _only(v, "3")
    assert e1["type"] == "bad_linked_input" and e1["extra_info"]["received_value"] == [1, 2, 3]
    assert e1["message"] == "Bad linked input, must be a length-2 list of [node_id, slot_index]"
    assert e2["type"] == "bad_linked_input"
    assert e2["message"] == "Input 'value' is linked to node 99, which is not in the prompt"
    assert e3["message"] == "Input 'value' is linked to output 2 of node 4 (Num), which has 1 output(s)"
    assert e3["extra_info"]["linked_node"] == ["4", 2]


def test_validate_bad_link_from_api_json():
    wf = load_workflow({"1": {"class_type": "Sink", "inputs": {"value": ["2"]}}}, REG)
    assert _only(validate(wf.prompt, REG), "1")["type"] == "bad_linked_input"


def test_validate_return_type_mismatch_star_and_unions():
    v = validate({"1": C("ModelSrc"), "2": C("Sink", value=Link("1", 0)),
                  "3": C("AnyIn", x=Link("1", 0), y=Link("4", 0)), "4": C("Lits", x=0.1, s="", b=True),
                  "5": C("Sink", value=Link("3", 0))}, REG)
    e = _only(v, "2")
    assert e == {"type": "return_type_mismatch", "message": "Return type mismatch between linked nodes",
                 "details": "value, received_type(MODEL) mismatch input_type(INT)",
                 "extra_info": {"input_name": "value", "input_config": ["INT", {"forceInput": True}],
                                "received_type": "MODEL", "linked_node": ["1", 0]}}
    assert set(v.node_errors) == {"2"}  # "*" takes MODEL, "INT,FLOAT" takes FLOAT
    assert v.ok and v.outputs == ("5",)


def test_validate_invalid_input_type():
    v = validate({"1": C("Num", value="abc"), "2": C("Sink", value=Link("1", 0)),
                  "3": C("UseModel", model="model.safetensors")}, REG)
    e = _only(v, "1")
    assert e["type"] == "invalid_input_type"
    assert e["message"] == "Failed to convert an input value to a INT value"
    assert e["details"] == "value, abc, invalid literal for int() with base 10: 'abc'"
    assert e["extra_info"]["input_config"] == ["INT", {"default": 5, "min": 0, "max": 10}]
    e3 = _only(v, "3")
    assert e3["type"] == "invalid_input_type" and "takes a MODEL from another node's output" in e3["message"]



@node(outputs=[], output_node=True, register=False)
def PackTypeSink(flag=Socket("MG_TEST_PACK_ONLY_TYPE")):
    return ()


def test_validate_literal_for_a_type_nobody_registered_passes_unchanged():
    """ComfyUI passes a literal for a type of a pack's own (its test pack's "BOOL") to the node
    as it is; only registered link types (MODEL...) refuse literals."""
    reg = Registry()
    reg.add(PackTypeSink.spec)
    v = validate({"1": C("PackTypeSink", flag=False)}, reg)
    assert v.ok and v.inputs["1"] == {"flag": False}


def test_validate_min_max():
    v = validate({"1": C("Num", value=-1), "2": C("Sink", value=Link("1", 0)),
                  "3": C("Num", value=11.9), "4": C("Sink", value=Link("3", 0)),
                  "5": C("Lits", x="1.5", s="", b=False), "6": C("AnyIn", x=Link("5", 0)), "7": C("Sink", value=Link("6", 0))},
                 REG)
    assert _only(v, "1")["type"] == "value_smaller_than_min"
    assert _only(v, "1")["message"] == "Value -1 smaller than min of 0"
    assert _only(v, "3")["message"] == "Value 11 bigger than max of 10"  # int(11.9) == 11, as ComfyUI
    assert _only(v, "5") == {"type": "value_bigger_than_max", "message": "Value 1.5 bigger than max of 1.0",
                             "details": "x", "extra_info": {"input_name": "x", "input_config":
                                                            ["FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0}],
                                                            "received_value": 1.5}}


def test_validate_value_not_in_list_short_and_long():
    v = validate({"1": C("Pick", choice="d"), "2": C("BigPick", choice="m99"),
                  "3": C("AnyIn", x=Link("1", 0)), "4": C("Sink", value=Link("3", 0)),
                  "5": C("AnyIn", x=Link("2", 0)), "6": C("Sink", value=Link("5", 0))}, REG)
    assert _only(v, "1") == {"type": "value_not_in_list", "message": "Value not in list",
                             "details": "choice: 'd' not in ['a', 'b', 'c']",
                             "extra_info": {"input_name": "choice", "input_config": [["a", "b", "c"]],
                                            "received_value": "d"}}
    e2 = _only(v, "2")
    assert e2["details"] == "choice: 'm99' not in (list of length 25)"
    assert e2["extra_info"]["input_config"] is None
    # "3" and "5" only fail because their upstream nodes do: they are not in node_errors
    assert set(v.node_errors) == {"1", "2"} and v.node_errors["1"]["dependent_outputs"] == ["4"]


def test_validate_value_not_in_list_details_say_where_the_options_came_from():
    """`Input.not_listed` (a models folder's searched folders) is appended to the details; the
    problem keeps ComfyUI's type, message and extra_info."""
    import dataclasses

    said = []
    combo = dataclasses.replace(Combo(lambda env: ["m1"]),
                                not_listed=lambda env, v: said.append((env, v)) or f"looked in {env}")

    @node(outputs=["STRING"], register=False)
    def Where(choice=combo):
        pass

    reg = Registry()
    for spec in (Where.spec, Sink.spec, AnyIn.spec):
        reg.add(spec)
    v = validate({"1": C("Where", choice="m2"), "2": C("AnyIn", x=Link("1", 0)),
                  "3": C("Sink", value=Link("2", 0))}, reg, env="/models")
    assert _only(v, "1") == {"type": "value_not_in_list", "message": "Value not in list",
                             "details": "choice: 'm2' not in ['m1']; looked in /models",
                             "extra_info": {"input_name": "choice", "input_config": [["m1"]],
                                            "received_value": "m2"}}
    assert said == [("/models", "m2")]
    assert validate({"1": C("Where", choice="m1"), "2": C("AnyIn", x=Link("1", 0)),
                     "3": C("Sink", value=Link("2", 0))}, reg, env="/models").clean
    assert said == [("/models", "m2")]     # asked only for a value not listed


def test_validate_custom_validation_and_claimed_inputs():
    v = validate({"1": C("ReadFile", path="ok.txt", count=0), "2": C("Sink", value=Link("1", 0)),
                  "3": C("ReadFile", path="gone.txt", count=1), "4": C("Sink", value=Link("3", 0))}, REG)
    # the validator names `path`, so its computed option list is its own; `count` is still range-checked
    assert _only(v, "1")["type"] == "value_smaller_than_min"
    assert _only(v, "3") == {"type": "custom_validation_failed", "message": "Custom validation failed for node",
                             "details": "file gone.txt not found in input/", "extra_info": {}}


def test_validate_extra_checks():
    def no_sevens(node_id, call, spec, inputs):
        if inputs.get("value") == 7:
            yield "seven is not allowed"
        if node_id == "2":
            yield Problem(node_id, call.class_type, "custom_validation_failed", "Custom validation failed for node",
                          "labelled", "label")
    v = validate({"1": C("Num", value=7), "2": C("Sink", value=Link("1", 0))}, REG, extra_checks=no_sevens)
    assert _only(v, "1")["details"] == "seven is not allowed"
    assert _only(v, "2")["extra_info"] == {"input_name": "label"}


def test_validate_dependency_cycle_lists_nodes():
    v = validate({"1": C("Sum", a=Link("3", 0)), "2": C("Sum", a=Link("1", 0)), "3": C("Sum", a=Link("2", 0)),
                  "4": C("Sum", a=Link("3", 0)), "5": C("Sink", value=Link("4", 0))}, REG)
    assert not v.ok and v.error["type"] == "prompt_outputs_failed_validation"
    assert set(v.node_errors) == {"1"}     # one problem per cycle, on its first node in the prompt
    e = _only(v, "1")
    assert e["type"] == "dependency_cycle"
    assert sorted(e["extra_info"]["cycle"]) == ["1", "2", "3"]
    assert e["extra_info"]["cycle_length"] == 3
    cycle = e["extra_info"]["cycle"]
    assert cycle == ["1", "2", "3"]          # in link order: 1 feeds 2 feeds 3 feeds 1
    assert e["message"] == "Dependency cycle: " + " -> ".join(cycle + [cycle[0]])
    assert v.node_errors["1"]["dependent_outputs"] == ["5"]
    self_loop = validate({"1": C("Sum", a=Link("1", 0)), "2": C("Sink", value=Link("1", 0))}, REG)
    assert _only(self_loop, "1")["message"] == "Dependency cycle: 1 -> 1"


def _chain_with_cycle(n: int) -> dict:
    """Num -> Sum x (n-2) -> Sink, where Sum 1 also links back to the last Sum: every Sum is on
    one cycle of n-2 nodes, and the Sink hangs behind it."""
    prompt = {"0": C("Num", value=1)}
    for i in range(1, n - 1):
        prompt[str(i)] = C("Sum", a=Link(str(i - 1), 0))
    prompt["1"] = C("Sum", a=Link("0", 0), b=Link(str(n - 2), 0))
    prompt["out"] = C("Sink", value=Link(str(n - 2), 0))
    return prompt


def test_validate_cycle_in_long_chain_reported_once_and_bounded():
    import json

    v = validate(_chain_with_cycle(20_000), REG)
    assert not v.ok and v.error["type"] == "prompt_outputs_failed_validation"
    assert list(v.node_errors) == ["1"]                  # once, not on every node of the cycle
    e = _only(v, "1")
    assert e["type"] == "dependency_cycle"
    assert e["extra_info"]["cycle_length"] == 19_998
    assert e["extra_info"]["cycle"] == [str(i) for i in range(1, 11)]
    assert e["message"] == ("Dependency cycle: 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 9 -> 10"
                            " -> ... (19988 more) -> 1")
    assert v.node_errors["1"]["dependent_outputs"] == ["out"]
    assert len(json.dumps(v.error_body())) < 10_000
    assert len(format_problems(v)) < 1_000


def test_validate_cycle_error_size_does_not_grow_with_the_cycle():
    import json

    small, big = (len(json.dumps(validate(_chain_with_cycle(n), REG).error_body()))
                  for n in (2_000, 20_000))
    assert small < 10_000 and big < 10_000
    assert big - small < 100                             # only the digits of the counts differ


def test_validate_failed_outputs_dropped_valid_ones_still_run():
    v = validate({"1": C("Num", value=3), "2": C("Num", value=50),
                  "3": C("Sink", value=Link("1", 0)), "4": C("Sink", value=Link("2", 0)),
                  "5": C("Sum", a=Link("1", 0), b=Link("2", 0)), "6": C("Sink", value=Link("5", 0))}, REG)
    assert v.ok and not v.clean and v.error is None
    assert v.outputs == ("3",)
    assert v.node_errors == {"2": {"errors": [{"type": "value_bigger_than_max",
                                               "message": "Value 50 bigger than max of 10", "details": "value",
                                               "extra_info": {"input_name": "value",
                                                              "input_config": ["INT", {"default": 5, "min": 0,
                                                                                       "max": 10}],
                                                              "received_value": 50}}],
                                   "dependent_outputs": ["4", "6"], "class_type": "Num"}}
    assert v.error_body() == {"error": None, "node_errors": v.node_errors}


def test_validate_targets_limit_outputs():
    prompt = {"1": C("Num", value=50), "2": C("Sink", value=Link("1", 0)),
              "3": C("Num", value=1), "4": C("Sink", value=Link("3", 0))}
    v = validate(prompt, REG, targets=["4"])
    assert v.clean and v.outputs == ("4",) and set(v.inputs) == {"3", "4"}


def test_validate_format_problems_for_humans():
    v = validate({"1": C("Num", value=50), "2": C("Sink", label="x"), "3": C("Sink", value=Link("1", 0))}, REG)
    text = format_problems(v)
    assert text.splitlines() == [
        "node 1 (Num) input 'value': Value 50 bigger than max of 10 [value_bigger_than_max]; "
        "lower the value to the maximum or below",
        "node 2 (Sink) input 'value': Required input is missing [required_input_missing]; "
        "connect a node to it or give it a value"]
    assert format_problems(validate({}, REG)).startswith("prompt: Prompt has no outputs [prompt_no_outputs]")


def test_validate_100000_node_chain_without_recursion():
    n = 100_000
    prompt = {"0": C("Num", value=1)}
    for i in range(1, n):
        prompt[str(i)] = C("Sum", a=Link(str(i - 1), 0))
    prompt["out"] = C("Sink", value=Link(str(n - 1), 0))
    t = time.perf_counter()
    v = validate(prompt, REG)
    seconds = time.perf_counter() - t
    assert v.clean and v.outputs == ("out",) and len(v.inputs) == n + 1
    print(f"validated a {n}-node chain in {seconds:.2f} s")
    # a problem at the far end still reaches the output's dependent_outputs
    prompt["0"] = C("Num", value=-5)
    v = validate(prompt, REG)
    assert set(v.node_errors) == {"0"} and v.node_errors["0"]["dependent_outputs"] == ["out"]


def test_validate_order_is_topological_with_prompt_order_ties():
    v = validate({"4": C("Sink", value=Link("3", 0)), "1": C("Num", value=1),
                  "3": C("Sum", a=Link("1", 0), b=Link("2", 0)), "2": C("Num", value=2),
                  "9": C("Num", value=3)}, REG)
    assert v.clean and v.order == ("1", "2", "3", "4")   # "9" feeds no output
    v = validate({"1": C("Num", value=1), "2": C("Sum", a=Link("1", 0)), "3": C("Num", value=2),
                  "4": C("Sink", value=Link("2", 0)), "5": C("Sink", value=Link("3", 0))}, REG)
    assert v.order == ("1", "3", "2", "5", "4")          # Kahn, first ready first out


def test_validate_order_leaves_out_what_only_failed_outputs_need():
    v = validate({"1": C("Num", value=3), "2": C("Num", value=50),
                  "3": C("Sink", value=Link("1", 0)), "4": C("Sink", value=Link("2", 0)),
                  "5": C("Sum", a=Link("1", 0), b=Link("2", 0)), "6": C("Sink", value=Link("5", 0))}, REG)
    assert v.outputs == ("3",) and v.order == ("1", "3")
    cyclic = validate({"1": C("Sum", a=Link("2", 0)), "2": C("Sum", a=Link("1", 0)),
                       "3": C("Sink", value=Link("2", 0)), "4": C("Num", value=1),
                       "5": C("Sink", value=Link("4", 0))}, REG)
    assert cyclic.outputs == ("5",) and cyclic.order == ("4", "5")


def test_validate_changed_literal_after_clean_validation_reports_new_problem():
    call = C("Num", value=3)
    prompt = {"1": call, "2": C("Sink", value=Link("1", 0))}
    assert validate(prompt, REG).clean and validate(prompt, REG).clean
    call.inputs["value"] = 11                            # the same objects, changed in place
    v = validate(prompt, REG)
    assert not v.ok and _only(v, "1")["type"] == "value_bigger_than_max"
    prompt["1"] = C("Num", value=-1)                     # a new node object, same id
    assert _only(validate(prompt, REG), "1")["type"] == "value_smaller_than_min"
    prompt["1"] = C("Num", value=4)
    assert validate(prompt, REG).clean


def test_validate_node_validator_runs_on_every_validation():
    seen = []

    def extra(nid, call, spec, inputs):
        seen.append(nid)
        return []
    prompt = {"1": C("ReadFile", path="ok.txt", count=1), "2": C("Sink", value=Link("1", 0))}
    assert validate(prompt, REG, extra_checks=extra).clean
    assert validate(prompt, REG, extra_checks=extra).clean
    assert sorted(seen) == ["1", "1", "2", "2"]
    prompt["1"].inputs["path"] = "gone.txt"
    assert _only(validate(prompt, REG), "1")["type"] == "custom_validation_failed"


def _reference_order(outputs, inputs, prompt):
    """Kahn's algorithm written the naive way (quadratic), for comparison: the ancestors of the
    outputs by repeated closure, then ready nodes taken first ready, first out."""
    need = set(outputs)
    while True:
        more = {x.node_id for n in need for x in inputs[n].values() if isinstance(x, Link)} - need
        if not more:
            break
        need |= more
    nodes = [n for n in prompt if n in need]
    ups = {n: [x.node_id for x in inputs[n].values() if isinstance(x, Link)] for n in nodes}
    queue = [n for n in nodes if not ups[n]]
    order = []
    while queue:
        n = queue.pop(0)
        order.append(n)
        for d in nodes:
            if n in ups[d] and all(u in order for u in ups[d]):
                if d not in order and d not in queue:
                    queue.append(d)
    return tuple(order)


def test_validate_order_equals_reference_order_on_random_graphs():
    import random

    rng = random.Random(0)
    for _ in range(300):
        ids = [str(i) for i in range(rng.randint(1, 10))]
        rng.shuffle(ids)
        prompt = {}
        for nid in ids:
            r = rng.random()
            if r < 0.3:
                prompt[nid] = C("Num", value=rng.choice([1, 5, 50]))
            elif r < 0.7:
                extra = {"b": Link(rng.choice(ids), 0)} if rng.random() < 0.5 else {}
                prompt[nid] = C("Sum", a=Link(rng.choice(ids + ["zz"]), rng.choice([0, 0, 1])), **extra)
            else:
                prompt[nid] = C("Sink", value=Link(rng.choice(ids), 0))
        v = validate(prompt, REG)
        expected = _reference_order(v.outputs, v.inputs, prompt) if v.outputs else ()
        assert v.order == expected, prompt
