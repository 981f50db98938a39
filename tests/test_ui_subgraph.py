"""Subgraphs in UI-format workflows (`definitions.subgraphs`), converted as ComfyUI's frontend
converts them: expected prompts below are derived by hand from the frontend's rules (inner ids
`"<instance>:<inner>"`, promoted widget values from the instance, boundaries followed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import Resolver
from mixgraph.graph.prompt import WorkflowError
from mixgraph.graph.formats.workflow import dump_api, load_workflow
from mixgraph.ui.api import default_registry
from tests import toy_nodes as toy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "subgraphs"
TOY = toy.registry()


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_ui_subgraph_txt2img_converts_like_the_frontend():
    wf = load_workflow(_fixture("txt2img_sampler_subgraph.json"), default_registry())
    assert dump_api(wf) == {
        "4": {"class_type": "CheckpointLoaderSimple",
              "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
        # promoted widget value from the instance; clip through the instance's input 1
        "10:1": {"class_type": "CLIPTextEncode", "inputs": {"text": "a photo of a cat", "clip": ["4", 1]}},
        # not promoted: keeps its own widget value
        "10:2": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, watermark", "clip": ["4", 1]}},
        "10:3": {"class_type": "KSampler",
                 "inputs": {"seed": 42, "steps": 20, "cfg": 8, "sampler_name": "euler", "scheduler": "normal",
                            "denoise": 1, "model": ["4", 0], "positive": ["10:1", 0],
                            "negative": ["10:2", 0], "latent_image": ["5", 0]}},
        # the instance output: through the inner Reroute and the bypassed LatentUpscale;
        # the muted LatentUpscaleBy and the Note are gone
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["10:3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    }
    assert [(r.name, sorted(r.nodes), r.precision, r.origin) for r in wf.precision.regions] == [
        ("Sampler (subgraph node 10)", ["10:1", "10:2", "10:3"], "bf16", "subgraph")]


def test_ui_subgraph_nested_and_several_instances_convert_node_by_node():
    wf = load_workflow(_fixture("toy_nested_instances.json"), TOY)
    mul = lambda a, f: {"class_type": "Mul", "inputs": {"factor": f, "a": a}}  # noqa: E731
    assert dump_api(wf) == {
        "1": {"class_type": "Const", "inputs": {"value": 2}},
        # instance 2 of "Pipeline": its promoted factor (5) reaches the nested Scale's Mul
        "2:5:1": mul(["1", 0], 5),
        "2:6:1": mul(["2:5:1", 0], 100),
        "2:7": {"class_type": "Add", "inputs": {"a": ["2:6:1", 0], "b": ["1", 0]}},
        # instance 3 of the same definition, fed through a root Reroute, its own factor (3)
        "3:5:1": mul(["1", 0], 3),
        "3:6:1": mul(["3:5:1", 0], 100),
        "3:7": {"class_type": "Add", "inputs": {"a": ["3:6:1", 0], "b": ["1", 0]}},
        "4:1": mul(["1", 0], 7),
        "5": {"class_type": "Add", "inputs": {"a": ["2:7", 0], "b": ["3:7", 0]}},
        "6": {"class_type": "Show", "inputs": {"value": ["5", 0]}},
        "7": {"class_type": "Show", "inputs": {"value": ["4:1", 0]}},
    }
    assert wf.precision.regions == ()


def test_ui_subgraph_runs_end_to_end_on_toy_nodes(tmp_path):
    env = Env(models=(tmp_path / "m",), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "t")
    r = Executor(TOY, env, OutputCache(2**24)).run(_fixture("toy_nested_instances.json"))
    assert r.status == "success"
    # Pipeline(x, f) = x*f*100 + x with x = 2: f = 5 -> 1002, f = 3 -> 602; Scale(2, 7) = 14
    assert r.values["2:7"] == (1002,) and r.values["3:7"] == (602,)
    assert r.ui["6"] == {"text": ["1604"]} and r.ui["7"] == {"text": ["14"]}


def test_ui_subgraph_precision_regions_innermost_wins():
    wf = load_workflow(_fixture("toy_precision_subgraphs.json"), TOY)
    resolver = Resolver(wf.precision, device="cpu")
    spec = {nid: resolver.policy(nid, "MODEL").spec for nid in wf.prompt}
    assert spec == {
        "1": "f32",                                        # outside every region: auto = f32 on CPU
        "2:1": "bf16", "2:2": "bf16", "2:3": "f32",       # name tag; group inside the subgraph wins
        "5:1": "f16", "5:2": "f16", "5:3": "f32",         # instance property beats its name tag
        "3": "f32", "4": "f32", "6": "bf16", "7": "bf16",  # the root group around instance 5
    }
    names = [r.name for r in wf.precision.regions]
    assert names == ["Outer", "Model block (subgraph node 2)", "Exact", "Second copy (subgraph node 5)",
                     "Exact"]


def test_ui_subgraph_precision_run_reports_region_precision(tmp_path):
    env = Env(models=(tmp_path / "m",), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "t")
    r = Executor(TOY, env, OutputCache(2**24)).run(_fixture("toy_precision_subgraphs.json"))
    assert r.status == "success"
    assert r.nodes["2:3"].precision == "f32" and not r.nodes["2:3"].nan_fallback
    assert r.nodes["2:2"].precision == "bf16:f32" and r.nodes["2:2"].nan_fallback   # NaN in bf16: guard
    assert r.nodes["5:2"].precision == "f16:f32" and r.nodes["5:2"].nan_fallback


def test_ui_subgraph_muted_instance_drops_contents_bypassed_passes_through():
    ui = _fixture("toy_nested_instances.json")
    muted = copy.deepcopy(ui)
    next(n for n in muted["nodes"] if n["id"] == 3)["mode"] = 2
    wf = load_workflow(muted, TOY)
    assert not any(k.startswith("3:") for k in wf.prompt)
    assert wf.prompt["5"].inputs == {"a": wf.prompt["5"].inputs["a"]}   # its link is dropped
    bypassed = copy.deepcopy(ui)
    next(n for n in bypassed["nodes"] if n["id"] == 4)["mode"] = 4
    wf = load_workflow(bypassed, TOY)
    assert not any(k.startswith("4:") for k in wf.prompt)
    assert dump_api(wf)["7"]["inputs"] == {"value": ["1", 0]}          # INT in -> INT out


def test_ui_subgraph_linked_promoted_input_wins_over_widget_value():
    ui = _fixture("toy_nested_instances.json")
    inst = next(n for n in ui["nodes"] if n["id"] == 4)
    inst["inputs"][1]["link"] = 9
    ui["links"].append([9, 1, 0, 4, 1, "INT"])
    assert dump_api(load_workflow(ui, TOY))["4:1"]["inputs"] == {"factor": ["1", 0], "a": ["1", 0]}


def test_ui_subgraph_older_saves_without_promoted_inputs_and_with_control_values():
    """Frontend 1.24 saves list only the linked inputs on the instance; the promoted values then
    follow the definition's input order, and a seed may carry its control value."""
    ui = _fixture("txt2img_sampler_subgraph.json")
    inst = next(n for n in ui["nodes"] if n["id"] == 10)
    inst["inputs"] = inst["inputs"][:3]
    inst["widgets_values"] = [7, "fixed", "older save"]
    sub = ui["definitions"]["subgraphs"][0]
    sub["inputs"][3], sub["inputs"][4] = sub["inputs"][4], sub["inputs"][3]   # seed before text
    for link in sub["links"]:
        if link["origin_id"] == -10 and link["origin_slot"] in (3, 4):
            link["origin_slot"] = 7 - link["origin_slot"]
    api = dump_api(load_workflow(ui, default_registry()))
    assert api["10:3"]["inputs"]["seed"] == 7 and api["10:1"]["inputs"]["text"] == "older save"


def test_ui_subgraph_self_containing_definition_is_a_clear_error():
    ui = _fixture("toy_nested_instances.json")
    scale = ui["definitions"]["subgraphs"][0]
    scale["nodes"].append(copy.deepcopy(next(n for n in ui["nodes"] if n["id"] == 4)))
    with pytest.raises(WorkflowError, match="contains an instance of itself"):
        load_workflow(ui, TOY)


def test_ui_subgraph_bad_definition_names_it():
    ui = _fixture("toy_nested_instances.json")
    del ui["definitions"]["subgraphs"][1]["id"]
    with pytest.raises(WorkflowError, match="subgraph definition 1 is not valid: id"):
        load_workflow(ui, TOY)


def test_ui_subgraph_txt2img_runs_on_a_tiny_checkpoint(tmp_path):
    from PIL import Image

    from mixgraph.ui import api
    from tests.fixtures.checkpoints import write_sd15
    write_sd15(tmp_path / "models" / "checkpoints" / "v1-5-pruned-emaonly.safetensors", seed=1)
    result = api.run(FIXTURES / "txt2img_sampler_subgraph.json", models=tmp_path / "models",
                     input=tmp_path / "input", output=tmp_path / "output",
                     set={"5.width": 32, "5.height": 32, "10:3.steps": 2})
    report = result.report.to_json()
    assert report["status"] == "success"
    assert report["nodes"]["10:3"]["precision"] == "bf16"        # the "[bf16]" subgraph
    assert report["nodes"]["8"]["precision"] == "f32"            # outside it: auto on CPU
    assert [Image.open(p).size for p in result.files] == [(32, 32)]


def test_ui_subgraph_regions_reach_prompts_queued_by_the_editor():
    """The editor queues the flat API prompt and sends the UI graph along; the subgraph's
    precision region applies to the prompt's `"2:1"`-style ids."""
    from mixgraph.ui.server.server import editor_regions
    ui = _fixture("toy_precision_subgraphs.json")
    ui["groups"] = []
    api = dump_api(load_workflow(ui, TOY))
    wf = editor_regions(load_workflow(api, TOY), {"extra_pnginfo": {"workflow": ui}}, TOY)
    assert Resolver(wf.precision, device="cpu").policy("2:2", "MODEL").spec == "bf16"
    assert Resolver(wf.precision, device="cpu").policy("5:3", "MODEL").spec == "f32"
