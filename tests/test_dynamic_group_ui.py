"""DynamicGroup inputs in UI-format workflows. ComfyUI's editor (ComfyUI_frontend
`src/core/graph/widgets/dynamicGroupWidget.ts` 2bdf0e5 and its test `dynamicGroupWidget.test.ts`)
saves a group in `widgets_values` at the input's place as its hidden row count, then each row's
fields (required, then optional; control values after their field); the row headers, the add
button and the notice are not saved. Import gives the `<group>.<row>.<field>` inputs the editor
queues; export writes the editor's list back."""

from __future__ import annotations

import json

import pytest

from mixgraph.graph.dynamic import dynamic_group
from mixgraph.graph.env import Env
from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, String, node
from mixgraph.graph.prompt import Link
from mixgraph.graph.registry import Registry
from mixgraph.graph.formats.ui_export import to_ui
from mixgraph.graph.formats.ui_format import convert_ui
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.ui import api


@node(outputs=["STRING"], output_node=True, register=False)
def GroupTest(before=String("first"),
              loras=dynamic_group((("lora_name", Combo(["A", "B", "C"])),
                                   ("enabled", Boolean(True, optional=True)),
                                   ("strength", Float(1.0))), min=0, max=3, group_name="LoRA"),
              after=String("last")):
    return (repr(loras),)


@node(outputs=["STRING"], output_node=True, register=False)
def SeedRows(seeds=dynamic_group((("seed", Int(1, control_after_generate=True)),
                                  ("label", String("x"))), min=0, max=3)):
    return (repr(seeds),)


@node(outputs=["FLOAT"], register=False)
def FloatConst(value=Float(0.0)):
    return (value,)


def registry() -> Registry:
    reg = Registry()
    for fn in (GroupTest, SeedRows, FloatConst):
        reg.add(fn.spec)
    return reg


REG = registry()
CORE = api.default_registry()


def ui_node(widgets_values, type_="GroupTest", inputs=()):
    return {"nodes": [{"id": 1, "type": type_, "mode": 0, "inputs": list(inputs), "outputs": [],
                       "widgets_values": widgets_values}], "links": []}


def round_trip(prompt: dict, reg=REG, env=None) -> tuple[dict, dict]:
    wf = load_workflow(prompt, reg)
    ui = json.loads(json.dumps(to_ui(wf, reg, env)))
    return ui, convert_ui(ui, reg).prompt


def test_dynamic_group_ui_reads_the_editors_saved_list():
    # the frontend test's node: ['head', 2, row 0, row 1, 'tail'], the optional field last in a row
    prompt = convert_ui(ui_node(["head", 2, "A", 1, True, "B", 0.6, False, "tail"]), REG).prompt
    assert prompt["1"].inputs == {
        "before": "head", "after": "tail",
        "loras.0.lora_name": "A", "loras.0.strength": 1, "loras.0.enabled": True,
        "loras.1.lora_name": "B", "loras.1.strength": 0.6, "loras.1.enabled": False}
    assert validate(prompt, REG).clean


def test_dynamic_group_ui_zero_rows_gives_no_group_inputs():
    prompt = convert_ui(ui_node(["head", 0, "tail"]), REG).prompt
    assert prompt["1"].inputs == {"before": "head", "after": "tail"}
    assert validate(prompt, REG).clean


@pytest.mark.parametrize("rows", [0, 1, 3])
def test_dynamic_group_ui_round_trip_keeps_the_rows(rows):
    given = {"before": "b", "after": "a"}
    for r in range(rows):
        given.update({f"loras.{r}.lora_name": "ABC"[r], f"loras.{r}.strength": 0.25 * (r + 1),
                      f"loras.{r}.enabled": r % 2 == 0})
    ui, back = round_trip({"1": {"class_type": "GroupTest", "inputs": given}})
    (saved,) = ui["nodes"]
    expected = ["b", rows]
    for r in range(rows):
        expected += ["ABC"[r], 0.25 * (r + 1), r % 2 == 0]
    assert saved["widgets_values"] == expected + ["a"]
    assert back["1"].inputs == given


def test_dynamic_group_ui_round_trip_keeps_a_gap_row():
    given = {"before": "b", "after": "a", "loras.0.lora_name": "B", "loras.0.strength": 0.5,
             "loras.2.lora_name": "C", "loras.2.strength": 0.7}
    ui, back = round_trip({"1": {"class_type": "GroupTest", "inputs": given}})
    # the editor has no gaps: row 1 is saved with its values left out (None), read back as absent
    assert ui["nodes"][0]["widgets_values"] == ["b", 3, "B", 0.5, None, None, None, None,
                                                "C", 0.7, None, "a"]
    assert back["1"].inputs == given
    assert validate(back, REG).clean


def test_dynamic_group_ui_round_trip_keeps_a_linked_row_field():
    given = {"before": "b", "after": "a", "loras.0.lora_name": "A", "loras.0.strength": 0.5,
             "loras.1.lora_name": "B", "loras.1.strength": ["2", 0]}
    ui, back = round_trip({"2": {"class_type": "FloatConst", "inputs": {"value": 0.3}},
                           "1": {"class_type": "GroupTest", "inputs": given}})
    (saved,) = [n for n in ui["nodes"] if n["type"] == "GroupTest"]
    # the editor keeps a linked field's widget (its value stays saved) and adds a socket for it
    assert saved["inputs"] == [{"name": "loras.1.strength", "type": "FLOAT", "link": 1,
                                "widget": {"name": "loras.1.strength"}}]
    assert saved["widgets_values"] == ["b", 2, "A", 0.5, None, "B", 1.0, None, "a"]
    assert back["1"].inputs["loras.1.strength"] == Link("2", 0)
    assert {k: v for k, v in back["1"].inputs.items() if k != "loras.1.strength"} == \
        {k: v for k, v in given.items() if k != "loras.1.strength"}
    assert validate(back, REG).clean


def test_dynamic_group_ui_link_wins_over_the_saved_field_value():
    ui = {"nodes": [
        {"id": 2, "type": "FloatConst", "mode": 0, "inputs": [], "widgets_values": [0.3],
         "outputs": [{"name": "FLOAT", "type": "FLOAT", "links": [1]}]},
        {"id": 1, "type": "GroupTest", "mode": 0, "outputs": [],
         "inputs": [{"name": "loras.0.strength", "type": "FLOAT", "link": 1,
                     "widget": {"name": "loras.0.strength"}}],
         "widgets_values": ["b", 1, "C", 0.9, True, "a"]}],
        "links": [[1, 2, 0, 1, 0, "FLOAT"]]}
    inputs = convert_ui(ui, REG).prompt["1"].inputs
    assert inputs["loras.0.strength"] == Link("2", 0) and inputs["loras.0.lora_name"] == "C"


def test_dynamic_group_ui_control_values_follow_their_field():
    # an INT with control_after_generate is followed by its control value inside each row
    prompt = convert_ui(ui_node([2, 5, "fixed", "p", 6, "randomize", "q"], "SeedRows"), REG).prompt
    assert prompt["1"].inputs == {"seeds.0.seed": 5, "seeds.0.label": "p",
                                  "seeds.1.seed": 6, "seeds.1.label": "q"}
    ui, back = round_trip({"1": {"class_type": "SeedRows", "inputs": dict(prompt["1"].inputs)}})
    assert ui["nodes"][0]["widgets_values"] == [2, 5, "fixed", "p", 6, "fixed", "q"]
    assert back["1"].inputs == prompt["1"].inputs


def test_dynamic_group_ui_count_follows_the_editors_rules():
    # below min: the editor shows min rows, new rows take their defaults (no default: left out)
    assert convert_ui(ui_node([0], "LoadLoraModel"), CORE).prompt["1"].inputs == \
        {"loras.0.strength": 1.0}
    # missing values past the end of the list: the fields' defaults
    assert convert_ui(ui_node(["b", 1]), REG).prompt["1"].inputs == \
        {"before": "b", "after": "last", "loras.0.lora_name": "A", "loras.0.enabled": True,
         "loras.0.strength": 1.0}
    # a fractional count is truncated; a count that is not a number leaves min rows
    assert convert_ui(ui_node(["b", 1.9, "B", 0.5, False, "a"]), REG).prompt["1"].inputs == \
        {"before": "b", "after": "a", "loras.0.lora_name": "B", "loras.0.strength": 0.5,
         "loras.0.enabled": False}
    assert convert_ui(ui_node(["b", "two", "a"]), REG).prompt["1"].inputs == {"before": "b",
                                                                              "after": "a"}


def test_dynamic_group_ui_count_past_max_is_reported():
    # the editor keeps restored rows past max; validation then names the extra row
    values = ["b", 4] + ["A", 1.0, True] * 4 + ["a"]
    prompt = convert_ui(ui_node(values), REG).prompt
    assert "loras.3.lora_name" in prompt["1"].inputs
    report = validate(prompt, REG)
    assert not report.clean and "past the last row" in str(report.errors)


def test_dynamic_group_ui_named_values_skip_the_row_count():
    # newer editors also save by name; the group's own name there is its row count, not an input
    inputs = convert_ui(ui_node({"before": "b", "loras": 1, "loras.0.lora_name": "B",
                                 "loras.0.strength": 0.5, "after": "a"}), REG).prompt["1"].inputs
    assert inputs == {"before": "b", "after": "a", "loras.0.lora_name": "B", "loras.0.strength": 0.5}


def test_load_lora_model_ui_positional_rows_round_trip(tmp_path):
    lora = tmp_path / "models" / "loras" / "a.safetensors"
    lora.parent.mkdir(parents=True)
    lora.write_bytes(b"")
    env = Env.from_args(models=tmp_path / "models")
    given = {"model": ["1", 0], "loras.0.lora_name": "a.safetensors", "loras.0.strength": 0.5,
             "loras.1.lora_name": "a.safetensors", "loras.1.strength": -0.25,
             "loras.2.lora_name": "a.safetensors", "loras.2.strength": 1.0}
    ui, back = round_trip({"1": {"class_type": "CheckpointLoaderSimple",
                                 "inputs": {"ckpt_name": "m.safetensors"}},
                           "2": {"class_type": "LoadLoraModel", "inputs": given}}, CORE, env)
    (saved,) = [n for n in ui["nodes"] if n["type"] == "LoadLoraModel"]
    assert saved["widgets_values"] == [3, "a.safetensors", 0.5, "a.safetensors", -0.25,
                                       "a.safetensors", 1.0]
    assert {k: v for k, v in back["2"].inputs.items() if k != "model"} == \
        {k: v for k, v in given.items() if k != "model"}
    assert back["2"].inputs["model"] == Link("1", 0)
