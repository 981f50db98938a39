"""Dynamic sockets (graph/dynamic.py) on toy nodes: MatchType templates and auto-growing inputs:
object_info shape, validation (accept / reject, naming node and input), type resolution through
chains, and how a body receives a group."""

from __future__ import annotations

import pytest

from mixgraph.graph.dynamic import (MatchTemplate, Option, TypeResolver, autogrow, dynamic_combo,
                                    match_input, match_output)
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.cache import OutputCache
from mixgraph.graph.node import Boolean, Combo, Float, Int, Output, Socket, String, node
from mixgraph.graph.prompt import Link
from mixgraph.graph.registry import Registry
from mixgraph.graph.validate import format_problems, validate
from mixgraph.graph.formats.workflow import load_workflow

T = MatchTemplate("t")
NUMERIC = MatchTemplate("n", ("INT", "FLOAT"))
SEEN: list = []


@node(outputs=["INT"], register=False)
def IntConst(value=Int(0, min=-10**9, max=10**9)):
    return (value,)


@node(outputs=["STRING"], register=False)
def StrConst(value=String("")):
    return (value,)


@node(outputs=[match_output(T, "output")], register=False)
def Pick(first=match_input(T), second=match_input(T, optional=True), take_second=Boolean(False, optional=True)):
    return (second if take_second else first,)


@node(outputs=[match_output(NUMERIC, "out")], register=False)
def Numeric(x=match_input(NUMERIC)):
    return (x,)


@node(outputs=["INT"], register=False)
def SumInts(values=autogrow(Socket("INT"), "value", prefix="value", min=2, max=4)):
    SEEN.append(values)
    return (sum(values.values()),)


@node(outputs=["STRING"], register=False)
def JoinNamed(values=autogrow(Socket("*"), "v", names=("x", "y", "z"), min=0),
              sep=String(",")):
    SEEN.append(values)
    return (sep.join(str(v) for v in values.values()),)


@node(outputs=[match_output(T, "first")], register=False)
def FirstOf(items=autogrow(match_input(T), "item", prefix="item", min=1, max=5)):
    return (next(iter(items.values())),)


@node(outputs=["INT"], register=False)
def Area(shape=dynamic_combo([
        Option("square", (("side", Int(2, min=1, max=100)),)),
        Option("rect", (("w", Int(2, min=1, max=100)), ("h", Socket("INT")),
                        ("round", Combo(["down", "up"], optional=True)))),
        Option("unit")]),
        scale=Float(1.0)):
    SEEN.append(shape)
    sides = {"square": ("side", "side"), "rect": ("w", "h"), "unit": ()}[shape["shape"]]
    area = shape[sides[0]] * shape[sides[1]] if sides else 1
    if shape.get("round") == "up":
        area += 1
    return (int(area * scale),)


@node(outputs=["INT"], output_node=True, register=False)
def ShowInt(value=Socket("INT")):
    return (value,)


@node(outputs=["STRING"], output_node=True, register=False)
def ShowStr(text=Socket("STRING")):
    return (text,)


@node(outputs=[Output("*", "any")], output_node=True, register=False)
def ShowAny(value=Socket("*")):
    return (value,)


def registry() -> Registry:
    reg = Registry()
    for fn in (IntConst, StrConst, Pick, Numeric, SumInts, JoinNamed, FirstOf, ShowInt, ShowStr,
               ShowAny, Area):
        reg.add(fn.spec)
    return reg


REG = registry()


def check(prompt):
    return validate(load_workflow(prompt, REG).prompt, REG)


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


@pytest.fixture
def ex(tmp_path):
    SEEN.clear()
    env = Env(models=(tmp_path / "models",), input=tmp_path, output=tmp_path / "out",
              temp=tmp_path / "temp")
    return Executor(REG, env, OutputCache(2**24))


# --- object_info -------------------------------------------------------------------------------

def test_object_info_matchtype_sockets_as_comfyui():
    info = REG.object_info()["Pick"]
    assert info["input"]["required"]["first"] == [
        "COMFY_MATCHTYPE_V3", {"template": {"template_id": "t", "allowed_types": "*"}}]
    assert info["input"]["optional"]["second"][0] == "COMFY_MATCHTYPE_V3"
    assert info["output"] == ["COMFY_MATCHTYPE_V3"]
    assert info["output_matchtypes"] == ["t"]
    assert REG.object_info()["Numeric"]["input"]["required"]["x"][1]["template"] == {
        "template_id": "n", "allowed_types": "INT,FLOAT"}
    assert "output_matchtypes" not in REG.object_info()["SumInts"]


def test_object_info_autogrow_prefix_and_names():
    grow = REG.object_info()["SumInts"]["input"]["required"]["values"]
    assert grow == ["COMFY_AUTOGROW_V3", {"template": {
        "input": {"required": {"value": ["INT", {"forceInput": True}]}}, "prefix": "value", "min": 2,
        "max": 4}}]
    named = REG.object_info()["JoinNamed"]["input"]["required"]["values"]
    assert named[1]["template"]["names"] == ["x", "y", "z"] and named[1]["template"]["min"] == 0
    assert REG.object_info()["JoinNamed"]["input_order"]["required"] == ["values", "sep"]


def test_autogrow_widget_template_becomes_a_socket():
    grown = autogrow(Int(3), "n", prefix="n")
    assert grown.grow.template.force_input and grown.grow.names[:2] == ("n0", "n1")
    with pytest.raises(TypeError):
        autogrow(Socket("INT"), "v", prefix="v", names=("a",))
    with pytest.raises(TypeError):
        autogrow(Socket("INT"), "v", prefix="v", max=101)


# --- autogrow validation and execution -------------------------------------------------------

def test_autogrow_accepts_members_and_passes_a_dict_in_order(ex):
    wf = {"1": call("IntConst", value=2), "2": call("IntConst", value=5),
          "3": call("SumInts", **{"values.value1": ["2", 0], "values.value0": ["1", 0],
                                  "values.value3": ["1", 0]}),
          "4": call("ShowInt", value=["3", 0])}
    assert check(wf).clean
    r = ex.run(wf)
    assert r.values["3"] == (9,)
    assert list(SEEN[-1]) == ["value0", "value1", "value3"]


def test_autogrow_missing_required_member_names_node_and_input():
    wf = {"1": call("IntConst", value=2), "3": call("SumInts", **{"values.value0": ["1", 0]}),
          "4": call("ShowInt", value=["3", 0])}
    v = check(wf)
    (p,) = v.errors
    assert (p.node_id, p.type, p.input_name) == ("3", "required_input_missing", "values.value1")
    assert "node 3 (SumInts) input 'values.value1'" in format_problems(v)


def test_autogrow_rejects_member_past_max_and_wrong_type():
    wf = {"1": call("IntConst", value=2), "2": call("StrConst", value="a"),
          "3": call("SumInts", **{"values.value0": ["1", 0], "values.value1": ["2", 0],
                                  "values.value4": ["1", 0]}),
          "4": call("ShowInt", value=["3", 0])}
    v = check(wf)
    got = {(p.input_name, p.type) for p in v.errors}
    assert got == {("values.value4", "invalid_input_type"), ("values.value1", "return_type_mismatch")}
    msg = next(p.message for p in v.errors if p.input_name == "values.value4")
    assert "values.value0 .. values.value3" in msg


def test_autogrow_names_take_literals_and_none_at_all(ex):
    wf = {"1": call("JoinNamed", **{"values.z": "last", "values.x": 1}, sep="-"),
          "2": call("ShowStr", text=["1", 0])}
    assert ex.run(wf).values["1"] == ("1-last",)
    wf["1"] = call("JoinNamed", sep="-")
    assert ex.run(wf).values["1"] == ("",) and SEEN[-1] == {}


def test_autogrow_members_change_the_cache_key(ex):
    wf = {"1": call("JoinNamed", **{"values.x": "a"}, sep=","), "2": call("ShowStr", text=["1", 0])}
    assert ex.run(wf).values["1"] == ("a",)
    wf["1"]["inputs"]["values.y"] = "b"
    r = ex.run(wf)
    assert r.values["1"] == ("a,b",) and r.nodes["1"].status == "executed"


# --- MatchType ----------------------------------------------------------------------------------

def test_matchtype_output_takes_the_resolved_type(ex):
    wf = {"1": call("IntConst", value=4), "2": call("Pick", first=["1", 0]),
          "3": call("ShowInt", value=["2", 0])}
    assert check(wf).clean
    assert ex.run(wf).values["3"] == (4,)
    wf["3"] = call("ShowStr", text=["2", 0])      # INT through the template into a STRING input
    (p,) = check(wf).errors
    assert (p.node_id, p.type, p.input_name) == ("3", "return_type_mismatch", "text")
    assert "received_type(INT)" in p.details


def test_matchtype_inputs_of_one_template_must_agree():
    wf = {"1": call("IntConst", value=4), "2": call("StrConst", value="s"),
          "3": call("Pick", first=["1", 0], second=["2", 0]), "4": call("ShowAny", value=["3", 0])}
    (p,) = check(wf).errors
    assert (p.node_id, p.type, p.input_name) == ("3", "return_type_mismatch", "second")
    assert "'first' receives INT" in p.details and "template 't'" in p.details


def test_matchtype_allowed_types_are_enforced():
    wf = {"1": call("StrConst", value="s"), "2": call("Numeric", x=["1", 0]),
          "3": call("ShowAny", value=["2", 0])}
    (p,) = check(wf).errors
    assert (p.node_id, p.input_name) == ("2", "x") and "allows INT, FLOAT" in p.details
    wf["2"] = call("Numeric", x=2.5)               # a literal counts with its own type
    assert check(wf).clean
    wf["2"] = call("Numeric", x="2.5")
    assert check(wf).errors[0].input_name == "x"


def test_matchtype_resolves_through_chains_and_grown_members():
    wf = {"1": call("StrConst", value="s"), "2": call("Pick", first=["1", 0]),
          "3": call("Pick", first=["2", 0]), "4": call("FirstOf", **{"items.item0": ["3", 0]}),
          "5": call("ShowInt", value=["4", 0])}
    v = check(wf)
    (p,) = v.errors
    assert (p.node_id, p.input_name, p.type) == ("5", "value", "return_type_mismatch")
    assert "received_type(STRING)" in p.details
    prompt = load_workflow(wf, REG).prompt
    res = TypeResolver(prompt, {n: REG.get(c.class_type) for n, c in prompt.items()}, Link)
    assert res.output_type("4", 0) == "STRING" and res.output_type("1", 0) == "STRING"


def test_matchtype_unconnected_template_is_any(ex):
    wf = {"1": call("FirstOf", **{"items.item0": 7}), "2": call("ShowInt", value=["1", 0])}
    assert check(wf).clean                         # a literal INT resolves the template
    wf = {"1": call("Pick", first=["2", 0]), "2": call("Pick", first=["1", 0]),
          "3": call("ShowInt", value=["1", 0])}
    v = check(wf)                                   # a cycle: no type, reported as a cycle only
    assert [p.type for p in v.errors] == ["dependency_cycle"]


def test_matchtype_long_chain_resolves_without_recursion():
    wf = {"0": call("IntConst", value=1)}
    for i in range(1, 3000):
        wf[str(i)] = call("Pick", first=[str(i - 1), 0])
    wf["end"] = call("ShowStr", text=["2999", 0])
    (p,) = check(wf).errors
    assert p.node_id == "end" and "received_type(INT)" in p.details


def test_ui_format_maps_grown_members_and_widgets():
    ui = {"nodes": [
        {"id": 1, "type": "IntConst", "mode": 0, "inputs": [], "widgets_values": [4],
         "outputs": [{"name": "INT", "type": "INT", "links": [1, 2]}]},
        {"id": 2, "type": "JoinNamed", "mode": 0, "widgets_values": ["+"],
         "inputs": [{"name": "values.x", "type": "*", "link": 1},
                    {"name": "values.y", "type": "*", "link": 2},
                    {"name": "values.z", "type": "*", "link": None}],
         "outputs": [{"name": "STRING", "type": "STRING", "links": [3]}]},
        {"id": 3, "type": "ShowStr", "mode": 0, "widgets_values": [],
         "inputs": [{"name": "text", "type": "STRING", "link": 3}], "outputs": []}],
        "links": [[1, 1, 0, 2, 0, "INT"], [2, 1, 0, 2, 1, "INT"], [3, 2, 0, 3, 0, "STRING"]]}
    prompt = load_workflow(ui, REG).prompt
    assert set(prompt["2"].inputs) == {"values.x", "values.y", "sep"}
    assert prompt["2"].inputs["sep"] == "+"
    assert validate(prompt, REG).clean


# --- DynamicCombo -------------------------------------------------------------------------------

def test_object_info_dynamic_combo_as_comfyui():
    entry = REG.object_info()["Area"]["input"]["required"]["shape"]
    assert entry[0] == "COMFY_DYNAMICCOMBO_V3"
    assert [o["key"] for o in entry[1]["options"]] == ["square", "rect", "unit"]
    rect = entry[1]["options"][1]["inputs"]
    assert rect["required"]["w"] == ["INT", {"default": 2, "min": 1, "max": 100}]
    assert rect["required"]["h"] == ["INT", {"forceInput": True}]
    assert rect["optional"]["round"] == [["down", "up"]]
    assert entry[1]["options"][2]["inputs"] == {}
    assert REG.object_info()["Area"]["input_order"]["required"] == ["shape", "scale"]


def test_dynamic_combo_body_gets_choice_and_sub_values(ex):
    wf = {"1": call("IntConst", value=3),
          "2": call("Area", shape="rect", **{"shape.w": 4, "shape.h": ["1", 0]}, scale=1.0),
          "3": call("ShowInt", value=["2", 0])}
    assert check(wf).clean
    assert ex.run(wf).values["2"] == (12,)
    assert SEEN[-1] == {"shape": "rect", "w": 4, "h": 3}
    wf["2"]["inputs"]["shape.round"] = "up"
    assert ex.run(wf).values["2"] == (13,)
    wf["2"] = call("Area", shape="unit", scale=2.0)
    assert ex.run(wf).values["2"] == (2,) and SEEN[-1] == {"shape": "unit"}


def test_dynamic_combo_ignores_other_options_sub_inputs(ex):
    wf = {"2": call("Area", shape="square", **{"shape.side": 5, "shape.w": 9}, scale=1.0),
          "3": call("ShowInt", value=["2", 0])}
    assert check(wf).clean
    assert ex.run(wf).values["2"] == (25,) and SEEN[-1] == {"shape": "square", "side": 5}


def test_dynamic_combo_checks_the_chosen_options_sub_inputs():
    wf = {"2": call("Area", shape="rect", **{"shape.w": 500, "shape.round": "sideways"},
                    scale=1.0),
          "3": call("ShowInt", value=["2", 0])}
    v = check(wf)
    got = {(p.node_id, p.input_name, p.type) for p in v.errors}
    assert got == {("2", "shape.w", "value_bigger_than_max"),
                   ("2", "shape.h", "required_input_missing"),
                   ("2", "shape.round", "value_not_in_list")}
    assert "node 2 (Area) input 'shape.h'" in format_problems(v)


def test_dynamic_combo_rejects_bad_choice_linked_choice_and_unknown_sub_input():
    wf = {"1": call("StrConst", value="rect"),
          "2": call("Area", shape="circle", scale=1.0), "3": call("ShowInt", value=["2", 0])}
    (p,) = check(wf).errors
    assert (p.node_id, p.input_name, p.type) == ("2", "shape", "value_not_in_list")
    assert "circle" in p.details and "rect" in p.details
    wf["2"] = call("Area", shape=["1", 0], scale=1.0)
    (p,) = check(wf).errors
    assert (p.input_name, p.type) == ("shape", "invalid_input_type") and "literal" in p.message
    wf["2"] = call("Area", shape="square", **{"shape.side": 2, "shape.radius": 1}, scale=1.0)
    (p,) = check(wf).errors
    assert (p.input_name, p.type) == ("shape.radius", "invalid_input_type")
    assert "option 'square' takes shape.side" in p.message
    wf["2"] = call("Area", scale=1.0)
    (p,) = check(wf).errors
    assert (p.input_name, p.type) == ("shape", "required_input_missing")


def test_dynamic_combo_sub_values_change_the_cache_key(ex):
    wf = {"2": call("Area", shape="square", **{"shape.side": 2}, scale=1.0),
          "3": call("ShowInt", value=["2", 0])}
    assert ex.run(wf).values["2"] == (4,)
    wf["2"]["inputs"]["shape.side"] = 3
    r = ex.run(wf)
    assert r.values["2"] == (9,) and r.nodes["2"].status == "executed"


def test_dynamic_combo_declaration_errors():
    with pytest.raises(TypeError):
        dynamic_combo([])
    with pytest.raises(TypeError):
        dynamic_combo([Option("a"), Option("a")])
    with pytest.raises(TypeError):
        dynamic_combo([Option("a", (("x", autogrow(Socket("INT"), "v", prefix="v")),))])
    with pytest.raises(TypeError):
        dynamic_combo([Option("a")], default="b")
