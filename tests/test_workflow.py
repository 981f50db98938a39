"""Workflow files: API format, UI (LiteGraph) format conversion, mixgraph envelope."""

from __future__ import annotations

import json

import pytest

from mixgraph.graph.node import Combo, Float, Int, Socket, String, node
from mixgraph.graph.prompt import BadLink, Link, NodeCall, PrecisionConfig, Region, Workflow, WorkflowError
from mixgraph.graph.registry import Registry
from mixgraph.graph.formats.ui_format import group_precision, widget_slots, UiGroup
from mixgraph.graph.formats.workflow import dump_api, dump_envelope, load_workflow


@node(outputs=["MODEL", "CLIP"], register=False)
def Loader(ckpt=Combo(["a.safetensors", "b.safetensors"])):
    pass


@node(outputs=["MODEL"], register=False)
def Patch(model=Socket("MODEL"), strength=Float(1.0)):
    pass


@node(outputs=["MODEL"], register=False)
def LatentThenModel(latent=Socket("LATENT"), model=Socket("MODEL")):
    pass


@node(outputs=["LATENT"], register=False)
def Sampler(model=Socket("MODEL"), seed=Int(0, control_after_generate=True), steps=Int(20, min=1),
            sampler_name=Combo(["euler", "heun"]), latent=Socket("LATENT"), denoise=Float(1.0)):
    pass


@node(outputs=["LATENT"], register=False)
def Empty(width=Int(512), height=Int(512)):
    pass


@node(outputs=[], output_node=True, register=False)
def Save(images=Socket("LATENT"), prefix=String("out")):
    pass


@node(outputs=["IMAGE"], register=False)
def LoadImg(image=Combo(["x.png", "y.png"], image_upload=True), channel=Combo(["rgb", "a"])):
    pass


@node(outputs=["STRING"], register=False)
def Widgets(noise_seed=Int(1), pick=Combo(["p", "q"], control_after_generate=True),
            text=String("t"), opt=Int(3, optional=True)):
    pass


REG = Registry()
for _f in (Loader, Patch, LatentThenModel, Sampler, Empty, Save, LoadImg, Widgets):
    REG.add(_f.spec)


def _inp(name, type_, link, widget=False):
    d = {"name": name, "type": type_, "link": link}
    if widget:
        d["widget"] = {"name": name}
    return d


def _n(id_, type_, pos=(0, 0), mode=0, inputs=(), outputs=(), widgets=None, title=None):
    d = {"id": id_, "type": type_, "pos": list(pos), "size": [200, 100], "flags": {}, "order": 0,
         "mode": mode, "inputs": list(inputs),
         "outputs": [{"name": t, "type": t, "links": [], "slot_index": i} for i, t in enumerate(outputs)],
         "properties": {"Node name for S&R": type_}}
    if widgets is not None:
        d["widgets_values"] = widgets
    if title:
        d["title"] = title
    return d


def _ui(nodes, links, groups=()):
    return {"id": "wf", "revision": 0, "last_node_id": 99, "last_link_id": 99, "nodes": nodes,
            "links": links, "groups": list(groups), "config": {}, "extra": {}, "version": 0.4}


def _graph():
    nodes = [
        _n(1, "Loader", (0, 0), outputs=["MODEL", "CLIP"], widgets=["b.safetensors"]),
        _n(2, "Patch", (300, 0), mode=4, inputs=[_inp("model", "MODEL", 1), _inp("strength", "FLOAT", None, True)],
           outputs=["MODEL"], widgets=[0.5]),
        _n(3, "Reroute", (500, 0), inputs=[_inp("", "*", 2)], outputs=["MODEL"]),
        _n(4, "Reroute", (550, 0), inputs=[_inp("", "*", 3)], outputs=["MODEL"]),
        _n(5, "Sampler", (700, 100), title="My sampler",
           inputs=[_inp("model", "MODEL", 4), _inp("latent", "LATENT", 5), _inp("seed", "INT", 6, True)],
           outputs=["LATENT"], widgets=[7, "randomize", 30, "heun", 0.75]),
        _n(6, "Empty", (720, 300), outputs=["LATENT"], widgets=[640, 768]),
        _n(7, "PrimitiveNode", (400, 400), outputs=["INT"], widgets=[1234, "fixed"]),
        _n(8, "Save", (1000, 100), inputs=[_inp("images", "LATENT", 7)], widgets=["pic"]),
        _n(9, "Note", (0, 500), widgets=["remember the milk"]),
        _n(10, "Save", (1000, 400), mode=2, inputs=[_inp("images", "LATENT", 8)], widgets=["muted"]),
        _n(11, "Empty", (0, 700), mode=2, outputs=["LATENT"], widgets=[64, 64]),
        _n(12, "Save", (300, 700), inputs=[_inp("images", "LATENT", 9)], widgets=["orphan"]),
    ]
    links = [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 3, 0, 4, 0, "MODEL"],
             [4, 4, 0, 5, 0, "MODEL"], [5, 6, 0, 5, 1, "LATENT"], [6, 7, 0, 5, 2, "INT"],
             [7, 5, 0, 8, 0, "LATENT"], [8, 5, 0, 10, 0, "LATENT"], [9, 11, 0, 12, 0, "LATENT"]]
    groups = [
        {"title": "Sampling [bf16]", "bounding": [650, 50, 400, 400], "color": "#3f789e"},
        {"title": "Latent [f32]", "bounding": [700, 280, 100, 100]},
        {"title": "Misc", "bounding": [-50, -50, 5000, 5000]},
        {"title": "Output", "bounding": [950, 50, 200, 100], "properties": {"precision": "f16+upcast"}},
    ]
    return _ui(nodes, links, groups)


def test_workflow_ui_conversion_mute_bypass_reroute_primitive():
    wf = load_workflow(_graph(), REG)
    assert wf.source == "ui" and wf.ui["id"] == "wf"
    assert wf.prompt == {
        "1": NodeCall("Loader", {"ckpt": "b.safetensors"}),
        # model: through two Reroutes and the bypassed Patch to the Loader; seed from the
        # PrimitiveNode; the control value "randomize" is skipped
        "5": NodeCall("Sampler", {"model": Link("1", 0), "seed": 1234, "steps": 30,
                                  "sampler_name": "heun", "latent": Link("6", 0), "denoise": 0.75},
                      "My sampler"),
        "6": NodeCall("Empty", {"width": 640, "height": 768}),
        "8": NodeCall("Save", {"images": Link("5", 0), "prefix": "pic"}),
        "12": NodeCall("Save", {"prefix": "orphan"}),  # its source was muted: the link is dropped
    }


def test_workflow_ui_tagged_and_nested_groups_become_regions():
    wf = load_workflow(_graph(), REG)
    assert wf.precision == PrecisionConfig(None, (
        Region("Sampling", frozenset({"5", "6", "8"}), "bf16"),
        Region("Output", frozenset({"8"}), "f16+upcast"),
        Region("Latent", frozenset({"6"}), "f32"),
    ))


def test_workflow_group_precision_tags():
    assert group_precision(UiGroup(title="[f16+upcast]", bounding=[0, 0, 1, 1])) == ("[f16+upcast]", "f16+upcast")
    assert group_precision(UiGroup(title="UNet [fp8_e4m3fn:bf16]", bounding=[0, 0, 1, 1])) == (
        "UNet", "fp8_e4m3fn:bf16")
    assert group_precision(UiGroup(title="[WIP] upscaling", bounding=[0, 0, 1, 1])) is None
    assert group_precision(UiGroup(title="Plain", bounding=[0, 0, 1, 1])) is None


def test_workflow_ui_bypass_picks_first_input_of_matching_type():
    nodes = [_n(1, "Loader", outputs=["MODEL", "CLIP"], widgets=["a.safetensors"]),
             _n(2, "Empty", outputs=["LATENT"], widgets=[8, 8]),
             _n(3, "LatentThenModel", mode=4, inputs=[_inp("latent", "LATENT", 2), _inp("model", "MODEL", 1)],
                outputs=["MODEL"]),
             _n(4, "Sampler", inputs=[_inp("model", "MODEL", 3), _inp("latent", "LATENT", 4)],
                outputs=["LATENT"], widgets=[1, "fixed", 2, "euler", 1.0])]
    links = [[1, 1, 0, 3, 1, "MODEL"], [2, 2, 0, 3, 0, "LATENT"], [3, 3, 0, 4, 0, "MODEL"],
             [4, 2, 0, 4, 1, "LATENT"]]
    wf = load_workflow(_ui(nodes, links), REG)
    assert wf.prompt["4"].inputs["model"] == Link("1", 0)
    assert "3" not in wf.prompt


def test_workflow_widget_slots_follow_frontend_rules():
    # INT named noise_seed gets a control value; a COMBO with control_after_generate gets a control
    # value and a filter string; optional inputs come after required ones
    assert widget_slots(Widgets.spec) == ["noise_seed", None, "pick", None, None, "text", "opt"]
    assert widget_slots(LoadImg.spec) == ["image", None, "channel"]
    assert widget_slots(Sampler.spec) == ["seed", None, "steps", "sampler_name", "denoise"]


def test_workflow_ui_widget_values_control_upload_defaults_and_dict():
    nodes = [_n(1, "Widgets", widgets=[9, "increment", "q", "fixed", "", "hello", 4]),
             _n(2, "LoadImg", widgets=["y.png", "image", "a"]),
             _n(3, "Widgets", widgets=[5]),  # short: the rest take their declared defaults
             _n(4, "Widgets", widgets={"noise_seed": 8, "text": "named", "bogus": 1})]
    wf = load_workflow(_ui(nodes, []), REG)
    assert wf.prompt["1"].inputs == {"noise_seed": 9, "pick": "q", "text": "hello", "opt": 4}
    assert wf.prompt["2"].inputs == {"image": "y.png", "channel": "a"}
    assert wf.prompt["3"].inputs == {"noise_seed": 5, "pick": "p", "text": "t", "opt": 3}
    assert wf.prompt["4"].inputs == {"noise_seed": 8, "text": "named"}


def test_workflow_ui_converted_widget_keeps_its_slot():
    nodes = [_n(1, "Empty", outputs=["LATENT"], widgets=[64, 64]),
             _n(2, "Loader", outputs=["MODEL", "CLIP"], widgets=["a.safetensors"]),
             _n(3, "Sampler", inputs=[_inp("model", "MODEL", 2), _inp("latent", "LATENT", 1),
                                      _inp("steps", "INT", None, True)],
                outputs=["LATENT"], widgets=[3, "fixed", 25, "euler", 0.5])]
    links = [{"id": 1, "origin_id": 1, "origin_slot": 0, "target_id": 3, "target_slot": 1, "type": "LATENT"},
             {"id": 2, "origin_id": 2, "origin_slot": 0, "target_id": 3, "target_slot": 0, "type": "MODEL"}]
    wf = load_workflow(_ui(nodes, links), REG)
    assert wf.prompt["3"].inputs == {"model": Link("2", 0), "seed": 3, "steps": 25,
                                     "sampler_name": "euler", "latent": Link("1", 0), "denoise": 0.5}


def test_workflow_ui_group_node_without_definition_is_an_error():
    ui = _ui([_n(1, "workflow>My group")], [])
    ui["extra"] = {"groupNodes": {"Other group": {"nodes": [], "links": [], "external": []}}}
    with pytest.raises(WorkflowError, match="'My group'.*no definition"):
        load_workflow(ui, REG)


def test_workflow_api_format_links_value_unwrap_and_meta():
    api = {"3": {"class_type": "Sampler", "_meta": {"title": "KS"}, "extra": 1,
                 "inputs": {"model": ["4", 0], "seed": 5, "latent": [7, 1], "denoise": {"__value__": [1, 2]},
                            "bad": [1, 2, 3]}},
           "4": {"class_type": "Loader", "inputs": {"ckpt": "a.safetensors"}}}
    wf = load_workflow(api, REG)
    assert wf.source == "api" and wf.ui is None and wf.precision == PrecisionConfig()
    assert wf.prompt["3"] == NodeCall("Sampler", {"model": Link("4", 0), "seed": 5, "latent": Link("7", 1),
                                                  "denoise": [1, 2], "bad": BadLink((1, 2, 3))}, "KS")
    assert wf.prompt["4"] == NodeCall("Loader", {"ckpt": "a.safetensors"})
    assert dump_api(wf) == {
        "3": {"inputs": {"model": ["4", 0], "seed": 5, "latent": ["7", 1], "denoise": {"__value__": [1, 2]},
                         "bad": [1, 2, 3]}, "class_type": "Sampler", "_meta": {"title": "KS"}},
        "4": {"inputs": {"ckpt": "a.safetensors"}, "class_type": "Loader"}}
    assert load_workflow(json.dumps(dump_api(wf)), REG).prompt == wf.prompt


def test_workflow_api_missing_class_type_is_left_to_validation():
    wf = load_workflow({"1": {"inputs": {}}}, REG)
    assert wf.prompt["1"].class_type == ""


def test_workflow_envelope_with_regions(tmp_path):
    env = {"format": "mixgraph/1",
           "prompt": {"1": {"class_type": "Loader", "inputs": {"ckpt": "a.safetensors"}},
                      "2": {"class_type": "Empty", "inputs": {"width": 8, "height": 8}}},
           "precision": {"default": "bf16", "regions": [{"name": "vae", "nodes": ["2", 1], "precision": "f32"}]},
           "workflow": {"nodes": []}}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(env))
    wf = load_workflow(path, REG)
    assert wf.source == "mixgraph" and wf.ui == {"nodes": []}
    assert wf.precision == PrecisionConfig("bf16", (Region("vae", frozenset({"1", "2"}), "f32"),))
    assert wf.prompt["2"] == NodeCall("Empty", {"width": 8, "height": 8})
    again = load_workflow(dump_envelope(wf), REG)
    assert again == wf


def test_workflow_envelope_errors():
    base = {"format": "mixgraph/1", "prompt": {"1": {"class_type": "Loader", "inputs": {}}}}
    with pytest.raises(WorkflowError, match="region 'r' names node.*9.*not in the prompt"):
        load_workflow({**base, "precision": {"regions": [{"name": "r", "nodes": ["9"], "precision": "f32"}]}}, REG)
    with pytest.raises(WorkflowError, match="unknown format 'mixgraph/9'"):
        load_workflow({**base, "format": "mixgraph/9"}, REG)
    with pytest.raises(WorkflowError, match=r"precision\.regions\.0\.precision: Field required"):
        load_workflow({**base, "precision": {"regions": [{"name": "r", "nodes": []}]}}, REG)


def test_workflow_bad_json_and_unknown_shape_name_the_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"1": {"class_type": ')
    with pytest.raises(WorkflowError, match=r"broken\.json: not valid JSON.*line 1"):
        load_workflow(bad, REG)
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": 1}')
    with pytest.raises(WorkflowError, match=r"odd\.json: not a recognised workflow.*'hello'"):
        load_workflow(str(odd), REG)
    with pytest.raises(WorkflowError, match="no such file"):
        load_workflow(tmp_path / "missing.json", REG)
    with pytest.raises(WorkflowError, match="a workflow is a JSON object, got list"):
        load_workflow("[1, 2]", REG)
    with pytest.raises(WorkflowError, match=r"UI workflow: nodes\.0\.type"):
        load_workflow({"nodes": [{"id": 1}], "links": []}, REG)
    with pytest.raises(WorkflowError, match="POST /prompt body"):
        load_workflow({"prompt": {"1": {"class_type": "Loader"}}, "client_id": "x"}, REG)


def test_workflow_dump_api_from_code_built_workflow():
    wf = Workflow({"1": NodeCall("Empty", {"width": 8, "height": 8}),
                   "2": NodeCall("Save", {"images": Link("1", 0)}, "out")})
    assert dump_api(wf) == {"1": {"inputs": {"width": 8, "height": 8}, "class_type": "Empty"},
                            "2": {"inputs": {"images": ["1", 0]}, "class_type": "Save",
                                  "_meta": {"title": "out"}}}
