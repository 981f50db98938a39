"""A V3 custom node pack declaring ComfyUI's dynamic sockets (`io.MatchType`, `io.Autogrow`,
`io.DynamicCombo`), written into a tmp custom_nodes folder: it loads, shows in object_info as
ComfyUI's own nodes do, validates (MatchType mismatches name node and input) and runs, with
`execute` getting ComfyUI's value shapes (Autogrow's dict, DynamicCombo's nested dict)."""

from __future__ import annotations

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.executor import Executor, ValidationFailed
from mixgraph.ui.comfy import custom_nodes
from tests.test_custom_nodes import env, fresh_registry  # noqa: F401

PACK = '''
from comfy_api.latest import ComfyExtension, io

SEEN = {}


class MgDynSwitch(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        t = io.MatchType.Template("switch", allowed_types=[io.Float, io.String])
        return io.Schema(node_id="MgDynSwitch", category="mg/dyn", is_output_node=True, inputs=[
            io.Boolean.Input("pick_a", default=True),
            io.MatchType.Input("a", template=t),
            io.MatchType.Input("b", template=t),
        ], outputs=[io.MatchType.Output(template=t, display_name="out")])

    @classmethod
    def execute(cls, pick_a, a, b):
        SEEN["switch"] = (pick_a, a, b)
        return io.NodeOutput(a if pick_a else b)


class MgDynSum(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        member = io.Float.Input("value")
        return io.Schema(node_id="MgDynSum", category="mg/dyn", is_output_node=True, inputs=[
            io.Autogrow.Input("values", template=io.Autogrow.TemplatePrefix(
                member, prefix="value", min=1, max=4)),
            io.Autogrow.Input("tags", optional=True, template=io.Autogrow.TemplateNames(
                io.String.Input("tag"), names=["first", "second"], min=0)),
        ], outputs=[io.Float.Output(display_name="sum"), io.String.Output()])

    @classmethod
    def execute(cls, values: io.Autogrow.Type, tags: io.Autogrow.Type = None):
        SEEN["sum"] = (dict(values), None if tags is None else dict(tags))
        return io.NodeOutput(float(sum(values.values())), ",".join((tags or {}).values()))


class MgDynScale(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="MgDynScale", category="mg/dyn", is_output_node=True, inputs=[
            io.Float.Input("x"),
            io.DynamicCombo.Input("mode", options=[
                io.DynamicCombo.Option("multiply", [io.Float.Input("factor", default=2.0)]),
                io.DynamicCombo.Option("add", [io.Float.Input("offset", default=1.0),
                                               io.Int.Input("times", default=1, min=1)]),
            ]),
        ], outputs=[io.Float.Output()])

    @classmethod
    def execute(cls, x, mode: io.DynamicCombo.Type):
        SEEN["scale"] = dict(mode)
        if mode["mode"] == "multiply":
            return io.NodeOutput(x * mode["factor"])
        return io.NodeOutput(x + mode["offset"] * mode["times"])


class Ext(ComfyExtension):
    async def get_node_list(self):
        return [MgDynSwitch, MgDynSum, MgDynScale]


async def comfy_entrypoint():
    return Ext()
'''


@pytest.fixture
def dyn(tmp_path, env):  # noqa: F811
    folder = tmp_path / "custom_nodes"
    (folder / "mg_v3dyn").mkdir(parents=True)
    (folder / "mg_v3dyn" / "__init__.py").write_text(PACK)
    reg = fresh_registry()
    report = custom_nodes.load_packs([folder], reg, env)
    assert [p.ok for p in report.packs] == [True], report.messages()
    import sys
    return reg, sys.modules["custom_nodes.mg_v3dyn"].SEEN


def test_v3_dynamic_object_info_matches_comfyui(dyn, env):  # noqa: F811
    reg, _ = dyn
    info = reg.object_info(env)
    sw = info["MgDynSwitch"]
    a = sw["input"]["required"]["a"]
    assert a[0] == "COMFY_MATCHTYPE_V3"
    assert a[1]["template"] == {"template_id": "switch", "allowed_types": "FLOAT,STRING"}
    assert sw["output"] == ["COMFY_MATCHTYPE_V3"]
    assert sw["output_matchtypes"] == ["switch"]
    vals = info["MgDynSum"]["input"]["required"]["values"]
    assert vals[0] == "COMFY_AUTOGROW_V3"
    assert vals[1]["template"]["prefix"] == "value"
    assert vals[1]["template"]["min"] == 1 and vals[1]["template"]["max"] == 4
    assert vals[1]["template"]["input"]["required"]["value"][0] == "FLOAT"
    tags = info["MgDynSum"]["input"]["optional"]["tags"]
    assert tags[1]["template"]["names"] == ["first", "second"]
    mode = info["MgDynScale"]["input"]["required"]["mode"]
    assert mode[0] == "COMFY_DYNAMICCOMBO_V3"
    assert [o["key"] for o in mode[1]["options"]] == ["multiply", "add"]
    assert mode[1]["options"][1]["inputs"]["required"]["times"][1]["min"] == 1


def test_v3_dynamic_runs_with_comfyui_value_shapes(dyn, env):  # noqa: F811
    reg, seen = dyn
    prompt = {
        "1": {"class_type": "MgDynSum", "inputs": {"values.value0": 1.5, "values.value1": 2.0,
                                                   "tags.second": "b"}},
        "2": {"class_type": "MgDynScale", "inputs": {"x": ["1", 0], "mode": "add",
                                                     "mode.offset": 0.5, "mode.times": 3}},
        "3": {"class_type": "MgDynSwitch", "inputs": {"pick_a": False, "a": ["1", 0],
                                                      "b": ["2", 0]}},
    }
    report = Executor(reg, env, OutputCache(2**24)).run(prompt)
    assert seen["sum"] == ({"value0": 1.5, "value1": 2.0}, {"second": "b"})
    assert seen["scale"] == {"mode": "add", "offset": 0.5, "times": 3}
    assert report.values["2"][0] == pytest.approx(5.0)
    assert seen["switch"] == (False, pytest.approx(3.5), pytest.approx(5.0))
    assert report.values["3"][0] == pytest.approx(5.0)
    report = Executor(reg, env, OutputCache(2**24)).run(
        {"2": {"class_type": "MgDynScale", "inputs": {"x": 2.0, "mode": "multiply",
                                                      "mode.factor": 4.0}}})
    assert seen["scale"] == {"mode": "multiply", "factor": 4.0}
    assert report.values["2"][0] == pytest.approx(8.0)


def test_v3_dynamic_validation_names_node_and_input(dyn, env):  # noqa: F811
    reg, _ = dyn
    ex = Executor(reg, env, OutputCache(2**24))
    with pytest.raises(ValidationFailed) as e:     # a FLOAT and a STRING on one template
        ex.run({"1": {"class_type": "MgDynSwitch", "inputs": {"pick_a": True, "a": 1.0,
                                                              "b": "text"}}})
    assert "node 1 (MgDynSwitch) input 'b'" in str(e.value)
    assert "template 'switch' must share one type" in str(e.value)
    with pytest.raises(ValidationFailed, match="node 1 \\(MgDynSwitch\\) input 'a'.*allows FLOAT, STRING"):
        ex.run({"1": {"class_type": "MgDynSwitch", "inputs": {"pick_a": True, "a": 1, "b": 2.0}}})
    with pytest.raises(ValidationFailed, match="mode"):
        ex.run({"2": {"class_type": "MgDynScale", "inputs": {"x": 1.0, "mode": "divide"}}})
    with pytest.raises(ValidationFailed, match="values.value7"):
        ex.run({"3": {"class_type": "MgDynSum", "inputs": {"values.value0": 1.0,
                                                           "values.value7": 2.0}}})
    with pytest.raises(ValidationFailed, match="values.value0"):   # the required first member
        ex.run({"4": {"class_type": "MgDynSum", "inputs": {}}})
