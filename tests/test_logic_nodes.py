"""ComfyUI 0.38.1's dynamic-socket nodes (nodes_logic, nodes_toolkit, nodes_math, nodes_string,
the auto-growing batch nodes): specs, reference values, and graph-level runs (the lazy switch
runs only its chosen branch)."""

from __future__ import annotations

import math

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.report import NodeError
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers import text_ops
from mixgraph.nodes.helpers.batch_ops import batch_images, batch_latents, batch_masks
from mixgraph.nodes.helpers.expression import ExpressionError, evaluate, math_expression
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.ui import api

REG = api.default_registry()
INFO = REG.object_info()


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 22))


# --- specs -----------------------------------------------------------------------------------------

def test_logic_specs_match_comfyui():
    sw = INFO["ComfySwitchNode"]
    assert sw["input_order"] == {"required": ["switch"], "optional": ["on_false", "on_true"]}
    assert sw["input"]["optional"]["on_true"][1] == {
        "lazy": True, "template": {"template_id": "switch", "allowed_types": "*"}}
    assert (sw["output"], sw["output_name"], sw["output_matchtypes"]) == (
        ["COMFY_MATCHTYPE_V3"], ["output"], ["switch"])
    assert sw["category"] == "utilities/logic" and sw["display_name"] == "If/Else Switch"
    pon = INFO["ComfyPassOrNoneNode"]
    assert pon["output_name"] == ["output", "is_none"] and pon["output_matchtypes"] == ["value", None]
    assert INFO["ComfyNotNode"]["input"]["required"]["value"] == ["*"]
    for name in ("ComfyAndNode", "ComfyOrNode"):
        t = INFO[name]["input"]["required"]["values"][1]["template"]
        assert (t["prefix"], t["min"], t["max"]) == ("value", 1, 10)
    cl = INFO["CreateList"]
    assert cl["output"] == ["*"] and cl["output_is_list"] == [True] and cl["output_name"] == ["list"]


def test_math_string_batch_specs_match_comfyui():
    m = INFO["ComfyMathExpression"]
    assert m["input_order"]["required"] == ["expression", "values"]
    assert m["input"]["required"]["expression"] == ["STRING", {"default": "a + b", "multiline": True}]
    t = m["input"]["required"]["values"][1]["template"]
    assert t["input"] == {"optional": {"value": ["FLOAT,INT,BOOLEAN"]}} and len(t["names"]) == 26
    assert (m["output"], m["output_name"]) == (["FLOAT", "INT", "BOOLEAN"], ["FLOAT", "INT", "BOOL"])
    sf = INFO["StringFormat"]
    assert sf["input_order"]["required"] == ["values", "f_string"]
    assert sf["input"]["required"]["values"][1]["template"]["min"] == 0
    assert INFO["ConvertDictionaryToString"]["input"]["required"]["indent"][1]["max"] == 8
    for name, prefix in (("BatchImagesNode", "image"), ("BatchMasksNode", "mask"),
                         ("BatchLatentsNode", "latent")):
        t = INFO[name]["input"]["required"][f"{prefix}s"][1]["template"]
        assert (t["prefix"], t["min"], t["max"]) == (prefix, 1, 50)


# --- reference values ---------------------------------------------------------------------------

def test_math_expression_reference_values():
    assert math_expression("a + b", {"a": 2, "b": 3.5}) == (5.5, 5, True)
    assert math_expression("sum(values) / len", {"len": 4, "a": 1, "b": 2, "c": 3, "d": 6}) == (
        4.0, 4, True)                                   # `values` holds every input, len too
    assert math_expression("max(a, b) ** 2 - floor(c)", {"a": 1, "b": 3, "c": 2.7}) == (7.0, 7, True)
    assert math_expression("a if b > 1 else -a", {"a": 2.5, "b": 0}) == (-2.5, -2, True)
    assert math_expression("a and b", {"a": True, "b": False}) == (0.0, 0, False)
    assert math_expression("round(sqrt(a), 3) + values[1]", {"a": 2, "b": 10}) == (
        pytest.approx(11.414), 11, True)
    assert math.isclose(math_expression("sin(a) + cos(a) + log10(b)", {"a": 0.0, "b": 100})[0], 3.0)


@pytest.mark.parametrize("expr, why", [
    ("__import__('os')", "not allowed"), ("a.__class__", "Attribute"), ("open('x')", "not allowed"),
    ("[1, 2]", "List"), ("lambda: 1", "Lambda"), ("q + 1", "'q' is not defined"),
    ("2 ** 9999999", "evaluate"), ("pow(2, 5000)", "Exponent"), ("'x' * 10**6", "String longer"),
    ("1 <<", "invalid expression"),
])
def test_math_expression_refuses_unsafe_or_bad_expressions(expr, why):
    with pytest.raises(ExpressionError, match=why):
        evaluate(expr, {"a": 1})


def test_math_expression_result_must_be_finite_number():
    with pytest.raises(ExpressionError, match="numeric"):
        math_expression("'abc'", {})
    with pytest.raises(ExpressionError, match="too large"):
        math_expression("10 ** 400", {})
    with pytest.raises(ExpressionError, match="non-finite"):
        math_expression("a * 2", {"a": math.inf})
    with pytest.raises(ExpressionError, match="empty"):
        math_expression("  ", {})


def test_string_format_json_and_dump_reference_values():
    assert text_ops.format_string("{a}-{b:03d}-{c!r}-{d[1]}", {"a": "x", "b": 7, "c": "q",
                                                                "d": [1, 2]}) == "x-007-'q'-2"
    with pytest.raises(ValueError, match="'_'"):
        text_ops.format_string("{a.__class__}", {"a": 1})
    text = 'reply:\n```json\n{"name": "cat", "n": 3, "tags": ["a"], "none": null}\n```'
    assert text_ops.json_extract(text, "name") == "cat"
    assert text_ops.json_extract(text, "n") == "3"
    assert text_ops.json_extract(text, "tags") == "['a']"
    assert text_ops.json_extract(text, "none") == "" and text_ops.json_extract("no json", "x") == ""
    assert text_ops.json_extract("{bad {\"k\": true}", "k") == "True"
    assert text_ops.dump_json({"é": [1, 2]}, 0) == '{"é": [1, 2]}'
    assert text_ops.dump_json([1, {"a": 2}], 2) == '[\n  1,\n  {\n    "a": 2\n  }\n]'


def test_batch_images_fit_to_the_first():
    a = torch.rand(1, 8, 8, 3, generator=torch.Generator().manual_seed(0))
    b = torch.rand(2, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    out = batch_images([a, b])
    assert out.shape == (3, 8, 8, 4)
    assert torch.equal(out[0, ..., :3], a[0]) and torch.all(out[0, ..., 3] == 1.0)
    up = torch.nn.functional.interpolate(b.movedim(-1, 1), size=(8, 8), mode="bilinear")
    torch.testing.assert_close(out[1:], up.movedim(1, -1))
    assert batch_images([]) is None


def test_batch_masks_and_latents_fit_to_the_first():
    m = batch_masks([torch.ones(1, 6, 6), torch.zeros(2, 3, 3)])
    assert m.shape == (3, 6, 6) and m[1:].abs().sum() == 0
    la = Latent(torch.ones(2, 4, 8, 8))
    lb = Latent(torch.zeros(1, 4, 4, 4), batch_index=(5,))
    out = batch_latents([la, lb, la])
    assert out.samples.shape == (5, 4, 8, 8) and out.batch_index == (0, 1, 5, 0, 1)


# --- graph level --------------------------------------------------------------------------------

def _switch(flag: bool) -> dict:
    return {"1": call("ComfyMathExpression", expression="a + b", **{"values.a": 2, "values.b": 3}),
            "2": call("ComfyMathExpression", expression="a / b", **{"values.a": 1, "values.b": 0}),
            "3": call("ComfySwitchNode", switch=flag, on_true=["1", 1], on_false=["2", 1]),
            "4": call("PreviewAny", source=["3", 0])}


def test_switch_runs_only_the_chosen_branch(ex):
    result = api.run(_switch(True), executor=ex)
    assert result.outputs["3"] == (5,)
    assert "2" not in result.report.nodes            # the failing branch never ran
    with pytest.raises(NodeError) as e:
        api.run(_switch(False), executor=ex)
    assert e.value.node_id == "2" and "division by zero" in str(e.value)


def test_switch_branch_types_must_agree():
    wf = _switch(True)
    wf["5"] = call("PrimitiveString", value="s")
    wf["3"]["inputs"]["on_false"] = ["5", 0]
    v = validate(load_workflow(wf, REG).prompt, REG)
    (p,) = v.errors
    assert (p.node_id, p.input_name, p.type) == ("3", "on_true", "return_type_mismatch")
    assert "'on_false' receives STRING" in p.details


def test_logic_strings_and_lists_in_one_graph(ex):
    wf = {"1": call("PrimitiveInt", value=0), "2": call("PrimitiveString", value="hi"),
          "3": call("ComfyAndNode", **{"values.value0": ["2", 0], "values.value1": True}),
          "4": call("ComfyOrNode", **{"values.value0": ["1", 0], "values.value1": ["3", 0]}),
          "5": call("ComfyNotNode", value=["1", 0]),
          "6": call("ComfyPassOrNoneNode", default=["2", 0]),
          "7": call("StringFormat", f_string="{a}|{b}|{c}|{d:>4}",
                    **{"values.a": ["3", 0], "values.b": ["4", 0], "values.c": ["6", 0],
                       "values.d": ["6", 1]}),
          "8": call("PreviewAny", source=["7", 0]),
          "9": call("CreateList", **{"inputs.input0": ["2", 0], "inputs.input1": "x"}),
          "10": call("PreviewAny", source=["9", 0]), "11": call("PreviewAny", source=["5", 0])}
    r = api.run(wf, executor=ex)
    assert r.outputs["7"] == ("True|True|hi|   0",)
    assert r.outputs["11"] == ("True",) and r.outputs["6"] == ("hi", False)
    assert r.outputs["9"] == (["hi", "x"],)


def test_batch_nodes_in_a_graph(ex):
    wf = {"1": call("EmptyImage", width=8, height=8, batch_size=1, color=0),
          "2": call("EmptyImage", width=16, height=16, batch_size=2, color=0xFFFFFF),
          "3": call("BatchImagesNode", **{"images.image0": ["1", 0], "images.image1": ["2", 0]}),
          "4": call("EmptyLatentImage", width=64, height=64, batch_size=1),
          "5": call("BatchLatentsNode", **{"latents.latent0": ["4", 0], "latents.latent1": ["4", 0]}),
          "6": call("PreviewImage", images=["3", 0]), "7": call("PreviewAny", source=["5", 0])}
    r = api.run(wf, executor=ex)
    img = r.outputs["3"][0]
    assert img.shape == (3, 8, 8, 3) and img[0].max() == 0 and img[1:].min() == 1
    assert r.outputs["5"][0].samples.shape == (2, 4, 8, 8)


# --- CustomCombo: undeclared literals (accept_all_inputs) ------------------------------------------

def test_custom_combo_spec_matches_comfyui():
    cc = INFO["CustomCombo"]
    assert cc["input"] == {"required": {"choice": [[]]}} and cc["input_order"] == {"required": ["choice"]}
    assert (cc["output"], cc["output_name"]) == (["STRING", "INT"], ["STRING", "INDEX"])
    assert cc["category"] == "utils" and cc["display_name"] == "Custom Combo"


def test_custom_combo_keeps_undeclared_literals(ex):
    wf = {"1": call("CustomCombo", choice="blue", index=2, option1="red", option2="green",
                    option3="blue"),
          "2": call("PreviewAny", source=["1", 0]), "3": call("PreviewAny", source=["1", 1])}
    assert validate(load_workflow(wf, REG).prompt, REG).clean
    r = api.run(wf, executor=ex)
    assert r.outputs["1"] == ("blue", 2)
    wf["1"]["inputs"]["index"] = 0                  # an undeclared literal is part of the cache key
    r = api.run(wf, executor=ex)
    assert r.outputs["1"] == ("blue", 0)
    wf["1"]["inputs"] = {"choice": "anything"}      # no index: ComfyUI's default 0
    assert api.run(wf, executor=ex).outputs["1"] == ("anything", 0)


def test_custom_combo_rejects_a_non_integer_index():
    wf = {"1": call("CustomCombo", choice="a", index="two"), "2": call("PreviewAny", source=["1", 1])}
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.node_id, p.type, p.input_name) == ("1", "custom_validation_failed", "index")
    wf["1"]["inputs"] = {"index": 1}
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.input_name, p.type) == ("choice", "required_input_missing")


def test_undeclared_literals_are_dropped_without_accept_all_inputs(ex):
    wf = {"1": call("ComfyNotNode", value=True, extra=5), "2": call("PreviewAny", source=["1", 0])}
    assert validate(load_workflow(wf, REG).prompt, REG).clean
    assert api.run(wf, executor=ex).outputs["1"] == (False,)
