"""graph/formats/ui_export.py: API prompt -> the editor's UI format, which converts back unchanged."""

import json
from pathlib import Path

import pytest

from mixgraph.graph.env import Env
from mixgraph.graph.formats.ui_export import to_ui
from mixgraph.graph.formats.ui_format import convert_ui
from mixgraph.ui.api import default_registry, load

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.json")))
def test_ui_export_round_trips_every_example_workflow(name):
    registry = default_registry()
    wf = load(WORKFLOWS / name, registry)
    ui = json.loads(json.dumps(to_ui(wf, registry, Env.from_args())))  # plain JSON, as served
    back = convert_ui(ui, registry)
    assert {k: (v.class_type, v.inputs) for k, v in back.prompt.items()} == \
        {k: (v.class_type, v.inputs) for k, v in wf.prompt.items()}
    assert ui["version"] == 0.4 and ui["last_link_id"] == len(ui["links"])
    ids = [n["id"] for n in ui["nodes"]]
    assert len(set(map(str, ids))) == len(ids)
    for a in ui["nodes"]:  # laid out without overlaps
        for b in ui["nodes"]:
            if a is not b:
                ax, ay, bx, by = *a["pos"], *b["pos"]
                assert ax + a["size"][0] <= bx or bx + b["size"][0] <= ax \
                    or ay + a["size"][1] <= by or by + b["size"][1] <= ay, (a["id"], b["id"])


def test_ui_export_links_and_seed_control_value():
    registry = default_registry()
    wf = load({"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
               "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "hi", "clip": ["1", 1]}},
               "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
               "4": {"class_type": "KSampler", "inputs": {
                   "seed": 5, "steps": 3, "cfg": 2.0, "sampler_name": "euler", "scheduler": "normal",
                   "denoise": 1.0, "model": ["1", 0], "positive": ["2", 0], "negative": ["2", 0],
                   "latent_image": ["3", 0]}}}, registry)
    ui = to_ui(wf, registry)
    ks = next(n for n in ui["nodes"] if n["id"] == 4)
    assert ks["widgets_values"] == [5, "fixed", 3, 2.0, "euler", "normal", 1.0]
    assert [i["name"] for i in ks["inputs"]] == ["model", "positive", "negative", "latent_image"]
    clip_out = next(n for n in ui["nodes"] if n["id"] == 2)["outputs"][0]
    assert len(clip_out["links"]) == 2  # positive and negative
    for link_id, origin, slot, target, target_slot, kind in ui["links"]:
        assert next(n for n in ui["nodes"] if n["id"] == target)["inputs"][target_slot]["link"] == link_id
    assert ks["pos"][0] > next(n for n in ui["nodes"] if n["id"] == 1)["pos"][0]  # left to right
