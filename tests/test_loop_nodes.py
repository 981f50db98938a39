"""ComfyUI's loop nodes (comfy_extras/nodes_loop.py 023f153): specs, the carried value and the
per-iteration list through ComfyMathExpression, For and List modes, step 0, nesting,
re-execution across prompts, and the engine's loop-body pairing (graph/loops.py)."""

from __future__ import annotations

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.loops import loop_bodies
from mixgraph.graph.report import NodeError
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.ui import api

REG = api.default_registry()
INFO = REG.object_info()


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 22))


def _sum_loop(mode: dict, accumulate=True, initial=0) -> dict:
    start = {"mode": "simple", "cache_iterations": False, **mode}
    if initial is not None:
        start["initial_iteration_value"] = initial
    return {"1": call("StartLoop", **start),
            "2": call("ComfyMathExpression", expression="a + b",
                      **{"values.a": ["1", 4], "values.b": ["1", 0]}),
            "3": call("EndLoop", output_value=["2", 1], next_iteration_value=["2", 1],
                      accumulate=accumulate),
            "4": call("PreviewAny", source=["3", 0])}


# --- specs ---------------------------------------------------------------------------------------

def test_loop_specs_match_comfyui():
    s = INFO["StartLoop"]
    assert (s["display_name"], s["category"]) == ("Start Loop", "utilities/looping")
    assert s["output"] == ["INT", "BOOLEAN", "BOOLEAN", "COMFY_MATCHTYPE_V3", "COMFY_MATCHTYPE_V3"]
    assert s["output_name"] == ["iteration_index", "is_first", "is_last", "list_item",
                                "current_iteration_value"]
    assert s["output_is_list"] == [False] * 5
    req, opt = s["input"]["required"], s["input"]["optional"]
    assert list(req) == ["mode", "cache_iterations"] and list(opt) == ["parent_iteration",
                                                                       "initial_iteration_value"]
    mode = req["mode"]
    assert mode[0] == "COMFY_DYNAMICCOMBO_V3"
    opts = {o["key"]: o["inputs"]["required"] for o in mode[1]["options"]}
    assert list(opts) == ["simple", "For", "List"]
    assert opts["simple"]["num_iterations"][1]["default"] == 4
    assert opts["simple"]["num_iterations"][1]["min"] == 0
    assert opts["For"]["max_iteration"][1]["max"] == 0xffffffffffffffff
    assert opts["For"]["step"][1]["default"] == 1 and opts["For"]["step"][1]["min"] == 1
    assert opts["List"]["list"][0] == "COMFY_MATCHTYPE_V3"
    assert opts["List"]["list"][1]["template"]["template_id"] == "list_item"
    assert req["cache_iterations"][1]["default"] is False
    assert opt["parent_iteration"][0] == "INT" and opt["parent_iteration"][1]["forceInput"] is True
    assert opt["initial_iteration_value"][1]["template"]["template_id"] == "carried_value"
    assert set(s["input"]["hidden"]) == {"dynprompt", "execution_list", "unique_id"}

    e = INFO["EndLoop"]
    assert (e["display_name"], e["category"]) == ("End Loop", "utilities/looping")
    assert e["output"] == ["COMFY_MATCHTYPE_V3"] and e["output_name"] == ["outputs"]
    assert e["output_is_list"] == [True]
    assert list(e["input"]["required"]) == ["accumulate"]
    eo = e["input"]["optional"]
    assert list(eo) == ["output_value", "next_iteration_value", "terminations"]
    assert eo["terminations"][0] == "COMFY_AUTOGROW_V3"
    assert (eo["terminations"][1]["template"]["prefix"], eo["terminations"][1]["template"]["max"],
            eo["terminations"][1]["template"]["min"]) == ("termination", 50, 0)
    assert INFO["LoopIteration"]["output_is_list"] == [False, False, False, False, True]
    assert INFO["LoopProgress"]["output_node"] and INFO["LoopResult"]["output"] == []
    assert all(INFO[n]["dev_only"] for n in ("LoopIteration", "LoopProgress", "LoopResult"))


# --- runs ----------------------------------------------------------------------------------------

def test_loop_sum_carries_value_and_accumulates_each_iteration(ex):
    r = api.run(_sum_loop({"mode.num_iterations": 4}), executor=ex)
    assert r.outputs["3"] == ([0, 1, 3, 6],)        # carried: 0+0, 0+1, 1+2, 3+3
    assert "2" not in r.report.nodes                  # the original body never ran
    copies = [n for n in r.report.nodes if r.report.nodes[n].class_type == "ComfyMathExpression"]
    assert len(copies) == 4


def test_loop_without_accumulate_returns_last_value(ex):
    r = api.run(_sum_loop({"mode.num_iterations": 5}, accumulate=False, initial=10), executor=ex)
    assert r.outputs["3"] == ([20],)                  # 10 + 0+1+2+3+4


def test_loop_for_mode_range_with_step(ex):
    wf = _sum_loop({"mode": "For", "mode.start_iteration_index": 2, "mode.max_iteration": 9,
                    "mode.step": 3})
    r = api.run(wf, executor=ex)
    assert r.outputs["3"] == ([2, 7, 15],)            # indices 2, 5, 8


def test_loop_zero_iterations_gives_empty_list(ex):
    r = api.run(_sum_loop({"mode.num_iterations": 0}), executor=ex)
    assert r.report.elements("3") == []


def test_loop_step_zero_is_rejected_naming_node_and_input():
    wf = _sum_loop({"mode": "For", "mode.start_iteration_index": 0, "mode.max_iteration": 4,
                    "mode.step": 0})
    v = validate(load_workflow(wf, REG).prompt, REG)
    assert any(p.node_id == "1" and p.input_name == "mode.step" for p in v.errors), v.errors


def test_loop_step_zero_from_a_link_fails_naming_node_and_input(ex):
    wf = _sum_loop({"mode": "For", "mode.start_iteration_index": 0, "mode.max_iteration": 4,
                    "mode.step": ["9", 0]})
    wf["9"] = call("PrimitiveInt", value=0)
    with pytest.raises(NodeError) as e:
        api.run(wf, executor=ex)
    assert e.value.node_id == "1" and "mode.step must not be 0" in str(e.value)


def test_loop_over_a_list_input(ex):
    wf = {"9": call("CreateList", **{"inputs.input0": 5, "inputs.input1": 7, "inputs.input2": 11}),
          "1": call("StartLoop", **{"mode": "List", "mode.list": ["9", 0],
                                    "cache_iterations": False}),
          "2": call("ComfyMathExpression", expression="a * 10 + b",
                    **{"values.a": ["1", 3], "values.b": ["1", 0]}),
          "3": call("EndLoop", output_value=["2", 1], accumulate=True),
          "4": call("PreviewAny", source=["3", 0])}
    r = api.run(wf, executor=ex)
    assert r.outputs["3"] == ([50, 71, 112],)         # item*10 + index


def test_loop_reruns_every_prompt(ex):
    wf = _sum_loop({"mode.num_iterations": 3})
    api.run(wf, executor=ex)
    r = api.run(wf, executor=ex)
    assert r.outputs["3"] == ([0, 1, 3],)
    assert r.report.nodes["1"].status == "executed" and r.report.nodes["3"].status == "executed"


def test_loop_nested_loops_unroll_in_every_outer_iteration(ex):
    wf = {"1": call("StartLoop", **{"mode": "simple", "mode.num_iterations": 3,
                                    "cache_iterations": False, "initial_iteration_value": 0}),
          "5": call("StartLoop", **{"mode": "simple", "mode.num_iterations": 2,
                                    "cache_iterations": False, "parent_iteration": ["1", 0],
                                    "initial_iteration_value": ["1", 4]}),
          "6": call("ComfyMathExpression", expression="a + b",
                    **{"values.a": ["5", 4], "values.b": ["1", 0]}),
          "7": call("EndLoop", output_value=["6", 1], next_iteration_value=["6", 1],
                    accumulate=False),
          "3": call("EndLoop", output_value=["7", 0], next_iteration_value=["7", 0],
                    accumulate=True),
          "4": call("PreviewAny", source=["3", 0])}
    r = api.run(wf, executor=ex)
    assert r.outputs["3"] == ([0, 2, 6],)             # the inner loop adds 2 * i each round


def test_loop_start_without_end_is_an_error(ex):
    wf = {"1": call("StartLoop", **{"mode": "simple", "mode.num_iterations": 2,
                                    "cache_iterations": False}),
          "4": call("PreviewAny", source=["1", 0])}
    with pytest.raises(NodeError) as e:
        api.run(wf, executor=ex)
    assert e.value.node_id == "1" and "no End Loop" in str(e.value)


def test_loops_pairing_marks_innermost_first():
    ups = {"s1": [], "s2": ["s1"], "b": ["s2", "s1"], "e2": ["b"], "c": ["e2"], "e1": ["c"],
           "out": ["e1"]}
    kinds = {"s1": "start", "s2": "start", "e1": "end", "e2": "end"}
    marks = loop_bodies(list(ups), lambda n: ups.get(n, []), kinds.get)
    assert marks["s2"] == (["b"], "e2")
    assert marks["s1"] == (["s2", "b", "e2", "c"], "e1")
    assert loop_bodies(["s1", "b"], lambda n: ups.get(n, []), kinds.get) == {}
