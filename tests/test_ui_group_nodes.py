"""Legacy group nodes (`extra.groupNodes`, instances of type `workflow>NAME`) in UI-format
workflows: converted as today's ComfyUI editor migrates them (unpacked into their inner nodes
with the instance's widget values and links, then run as a subgraph). Expected prompts are
derived by hand from the editor's rules (graph/formats/ui_group_nodes.py's docstring)."""

from __future__ import annotations

import copy

import pytest

from mixgraph.graph.prompt import WorkflowError
from mixgraph.graph.formats.workflow import dump_api, load_workflow
from mixgraph.ui.api import default_registry


def _node(i, type_, inputs=(), outputs=(), widgets=None, **kw):
    return {"id": i, "type": type_, "pos": [0, 0], "mode": kw.get("mode", 0),
            "inputs": [{"name": n, "type": t, "link": lk, **({"widget": {"name": n}} if w else {})}
                       for n, t, lk, *w in inputs],
            "outputs": [{"name": t, "type": t, "links": []} for t in outputs],
            "widgets_values": widgets if widgets is not None else [], "properties": {}}


def _inner(index, type_, inputs=(), outputs=(), widgets=None):
    n = _node(index, type_, inputs, outputs, widgets)
    n.pop("id")
    n["index"] = index
    return n


SAMPLER_GROUP = {
    "nodes": [
        _inner(0, "CLIPTextEncode", [("clip", "CLIP", None)], ["CONDITIONING"], ["old positive"]),
        _inner(1, "CLIPTextEncode", [("clip", "CLIP", None)], ["CONDITIONING"], ["old negative"]),
        _inner(2, "KSampler", [("model", "MODEL", None), ("positive", "CONDITIONING", 10),
                               ("negative", "CONDITIONING", 11), ("latent_image", "LATENT", None)],
               ["LATENT"], [1, "fixed", 10, 7.0, "euler", "normal", 1.0]),
    ],
    "links": [[0, 0, 2, 1, 10, "CONDITIONING"], [1, 0, 2, 2, 11, "CONDITIONING"]],
    "external": [],
}


def _workflow(group_type="workflow>Sampler group", extra_values=None):
    nodes = [
        _node(4, "CheckpointLoaderSimple", outputs=["MODEL", "CLIP", "VAE"], widgets=["v1-5.safetensors"]),
        _node(5, "EmptyLatentImage", outputs=["LATENT"], widgets=[512, 512, 1]),
        # the instance: sockets positional over the group's interface (clip, clip, model, latent_image)
        _node(10, group_type, [("clip", "CLIP", 1), ("CLIPTextEncode clip", "CLIP", 2), ("model", "MODEL", 3),
                               ("latent_image", "LATENT", 4)], ["LATENT"],
              extra_values or ["a cat", "blurry", 42, "fixed", 20, 8, "dpmpp_2m", "karras", 1]),
        _node(8, "VAEDecode", [("samples", "LATENT", 5), ("vae", "VAE", 6)], ["IMAGE"]),
    ]
    links = [[1, 4, 1, 10, 0, "CLIP"], [2, 4, 1, 10, 1, "CLIP"], [3, 4, 0, 10, 2, "MODEL"],
             [4, 5, 0, 10, 3, "LATENT"], [5, 10, 0, 8, 0, "LATENT"], [6, 4, 2, 8, 1, "VAE"]]
    return {"last_node_id": 10, "last_link_id": 6, "nodes": nodes, "links": links, "groups": [],
            "config": {}, "extra": {"groupNodes": {"Sampler group": copy.deepcopy(SAMPLER_GROUP)}}, "version": 0.4}


EXPECTED = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
    "10:0": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
    "10:1": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
    "10:2": {"class_type": "KSampler",
             "inputs": {"seed": 42, "steps": 20, "cfg": 8, "sampler_name": "dpmpp_2m", "scheduler": "karras",
                        "denoise": 1, "model": ["4", 0], "positive": ["10:0", 0], "negative": ["10:1", 0],
                        "latent_image": ["5", 0]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["10:2", 0], "vae": ["4", 2]}},
}


@pytest.mark.parametrize("group_type", ["workflow>Sampler group", "workflow/Sampler group"])
def test_legacy_group_node_unpacks_with_the_instance_values_and_links(group_type):
    wf = load_workflow(_workflow(group_type), default_registry())
    assert dump_api(wf) == EXPECTED


def test_legacy_group_node_without_instance_values_keeps_the_inner_ones():
    ui = _workflow()
    ui["nodes"][2]["widgets_values"] = []
    got = dump_api(load_workflow(ui, default_registry()))
    assert got["10:0"]["inputs"]["text"] == "old positive"
    assert got["10:2"]["inputs"]["steps"] == 10 and got["10:2"]["inputs"]["seed"] == 1


def test_legacy_group_node_primitive_inside_feeds_its_targets():
    ui = _workflow()
    group = ui["extra"]["groupNodes"]["Sampler group"]
    # a PrimitiveNode (index 3) drives KSampler's steps, converted to a socket
    group["nodes"][2]["inputs"].append({"name": "steps", "type": "INT", "link": 12, "widget": {"name": "steps"}})
    group["nodes"].append(_inner(3, "PrimitiveNode", [], ["INT"], [5, "fixed"]))
    group["links"].append([3, 0, 2, 4, 12, "INT"])
    # interface widgets: text, text, seed(+control), cfg, sampler, scheduler, denoise, then the primitive's value
    ui["nodes"][2]["widgets_values"] = ["a cat", "blurry", 42, "fixed", 8, "dpmpp_2m", "karras", 1, 33, "fixed"]
    got = dump_api(load_workflow(ui, default_registry()))
    assert got["10:2"]["inputs"]["steps"] == 33
    assert got["10:2"]["inputs"]["cfg"] == 8 and got["10:2"]["inputs"]["denoise"] == 1


def test_legacy_group_node_missing_definition_is_a_clear_error():
    ui = _workflow()
    ui["extra"] = {}
    with pytest.raises(WorkflowError, match="'Sampler group'.*no definition"):
        load_workflow(ui, default_registry())


def test_legacy_group_node_unknown_inner_type_is_a_clear_error():
    ui = _workflow()
    ui["extra"]["groupNodes"]["Sampler group"]["nodes"][1]["type"] = "NoSuchNode"
    with pytest.raises(WorkflowError, match="inner node 1 has type 'NoSuchNode'"):
        load_workflow(ui, default_registry())


def test_legacy_group_node_bypassed_instance_passes_through():
    ui = _workflow()
    ui["nodes"][2]["mode"] = 4
    got = dump_api(load_workflow(ui, default_registry()))
    assert not any(k.startswith("10:") for k in got)
    assert got["8"]["inputs"]["samples"] == ["5", 0]  # the LATENT input wired through
