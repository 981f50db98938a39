"""CustomCombo in UI-format workflows: the editor saves `[choice, index, option1..N, ""]` in
`widgets_values`; import gives the API inputs the editor queues (`index`, `option1..N`), export
writes them back."""

from __future__ import annotations

import json

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.ui_export import to_ui
from mixgraph.graph.formats.ui_format import convert_ui
from mixgraph.ui import api

REG = api.default_registry()


def ui_workflow(widgets_values):
    """A CustomCombo (node 4) whose STRING feeds PreviewAny 5 and whose INDEX feeds PreviewAny 6."""
    return {
        "last_node_id": 6, "last_link_id": 2, "version": 0.4, "groups": [], "config": {}, "extra": {},
        "nodes": [
            {"id": 4, "type": "CustomCombo", "pos": [0, 0], "size": [300, 200], "flags": {}, "order": 0,
             "mode": 0, "inputs": [],
             "outputs": [{"name": "STRING", "type": "STRING", "links": [1], "slot_index": 0},
                         {"name": "INDEX", "type": "INT", "links": [2], "slot_index": 1}],
             "properties": {"Node name for S&R": "CustomCombo"}, "widgets_values": widgets_values},
            {"id": 5, "type": "PreviewAny", "pos": [400, 0], "size": [200, 100], "flags": {}, "order": 1,
             "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 1}], "outputs": [],
             "properties": {}, "widgets_values": []},
            {"id": 6, "type": "PreviewAny", "pos": [400, 200], "size": [200, 100], "flags": {}, "order": 2,
             "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 2}], "outputs": [],
             "properties": {}, "widgets_values": []},
        ],
        "links": [[1, 4, 0, 5, 0, "STRING"], [2, 4, 1, 6, 0, "INT"]],
    }


@pytest.fixture
def ex(tmp_path):
    env = Env.from_args(output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(REG, env, cache=OutputCache(max_bytes=1 << 22))


def test_custom_combo_ui_import_gives_the_editors_api_inputs():
    wf = convert_ui(ui_workflow(["green", 1, "red", "green", "blue", ""]), REG)
    assert wf.prompt["4"].inputs == {"choice": "green", "index": 1, "option1": "red",
                                     "option2": "green", "option3": "blue", "option4": ""}


def test_custom_combo_ui_runs_with_string_and_index(ex):
    r = api.run(ui_workflow(["blue", 2, "red", "green", "blue", ""]), executor=ex)
    assert r.outputs["4"] == ("blue", 2)
    assert r.ui["5"] == {"text": ("blue",)} and r.ui["6"] == {"text": ("2",)}   # PreviewAny shows them


def test_custom_combo_ui_index_is_recomputed_from_the_options(ex):
    # the editor queues the position of the chosen string among the options, not the saved number
    r = api.run(ui_workflow(["green", 0, "red", "green", ""]), executor=ex)
    assert r.outputs["4"] == ("green", 1)
    r = api.run(ui_workflow(["gone", 1, "red", "green", ""]), executor=ex)   # not among them: -1
    assert r.outputs["4"] == ("gone", -1)


def test_custom_combo_ui_without_an_index_value_reads_options():
    wf = convert_ui(ui_workflow(["b", "a", "b", ""]), REG)
    assert wf.prompt["4"].inputs == {"choice": "b", "index": 1, "option1": "a", "option2": "b",
                                     "option3": ""}
    assert convert_ui(ui_workflow(["b"]), REG).prompt["4"].inputs == {"choice": "b"}


def test_custom_combo_ui_round_trip_keeps_the_options():
    first = convert_ui(ui_workflow(["blue", 2, "red", "green", "blue", ""]), REG)
    ui = json.loads(json.dumps(to_ui(first, REG, Env.from_args())))
    (node,) = [n for n in ui["nodes"] if n["type"] == "CustomCombo"]
    assert node["widgets_values"] == ["blue", 2, "red", "green", "blue", ""]
    back = convert_ui(ui, REG)
    assert back.prompt["4"].inputs == first.prompt["4"].inputs


def test_custom_combo_ui_export_of_an_api_prompt():
    wf = api.load({"1": {"class_type": "CustomCombo",
                         "inputs": {"choice": "y", "option2": "y", "option1": "x"}},
                   "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}}, REG)
    ui = to_ui(wf, REG, Env.from_args())
    (node,) = [n for n in ui["nodes"] if n["type"] == "CustomCombo"]
    assert node["widgets_values"] == ["y", 1, "x", "y", ""]   # index from the options, a blank last
    assert convert_ui(ui, REG).prompt["1"].inputs == {"choice": "y", "index": 1, "option1": "x",
                                                      "option2": "y", "option3": ""}


def test_custom_combo_ui_object_widgets_values_keep_the_options(ex):
    """`widgets_values` saved as an object keyed by the editor's widget names (`choice`, the hidden
    `index`, `option1..N`): the options are read, renumbered in order, `index` recomputed."""
    values = {"choice": "blue", "index": 0, "option2": "green", "option1": "red", "option3": "blue",
              "option4": ""}
    wf = convert_ui(ui_workflow(values), REG)
    assert wf.prompt["4"].inputs == {"choice": "blue", "index": 2, "option1": "red",
                                     "option2": "green", "option3": "blue", "option4": ""}
    r = api.run(ui_workflow(values), executor=ex)
    assert r.outputs["4"] == ("blue", 2)
    # only the choice saved: no options, as for the list form
    assert convert_ui(ui_workflow({"choice": "b"}), REG).prompt["4"].inputs == {"choice": "b"}


def test_custom_combo_ui_object_widgets_values_export_as_the_editors_list():
    wf = convert_ui(ui_workflow({"choice": "y", "option1": "x", "option2": "y", "option3": ""}), REG)
    node = next(n for n in to_ui(wf, REG, Env.from_args())["nodes"] if n["type"] == "CustomCombo")
    assert node["widgets_values"] == ["y", 1, "x", "y", ""]
