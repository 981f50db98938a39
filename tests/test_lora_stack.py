"""ComfyUI nodes_lora_stack.py (0e5d418): LoadLoraModel / LoadLoraTextEncoder and the
DynamicGroup input they use (comfy_api `_io.py` 04e2a91 `_DynamicGroup`): object_info, API key
rules, row lists with gaps, and results equal to LoraLoader's on a tiny SD1.5 checkpoint."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.dynamic import Rows
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.node import Float, String
from mixgraph.graph.report import ValidationFailed
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.workflow_models import write_lora

REG = api.default_registry()
LORA = "sd15_lora.safetensors"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lorastack") / "models"
    ckpt = root / "checkpoints" / "sd15.safetensors"
    ckpt.parent.mkdir(parents=True)
    write_sd15(ckpt, seed=1)
    write_lora(root / "loras" / LORA, ckpt, seed=5)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(REG, Env.from_args(models=models, output=models.parent / "out"),
                    cache=OutputCache(max_bytes=1 << 30))


def test_lora_stack_specs_match_comfyui(models):
    info = REG.object_info(Env.from_args(models=models))
    for cls, first, out, tip in (("LoadLoraModel", "model", "MODEL", "model"),
                                 ("LoadLoraTextEncoder", "clip", "CLIP", "text encoder")):
        n = info[cls]
        assert n["category"] == "model/loaders" and n["output"] == [out]
        assert list(n["input"]["required"]) == [first, "loras"]
        kind, opts = n["input"]["required"]["loras"]
        assert kind == "COMFY_DYNAMICGROUP_V3"
        assert (opts["min"], opts["max"], opts["group_name"]) == (1, 20, "LoRA")
        assert opts["tooltip"] == f"Each row applies one LoRA to the {tip}."
        tmpl = opts["template"]
        assert list(tmpl) == ["required"] and list(tmpl["required"]) == ["lora_name", "strength"]
        assert LORA in tmpl["required"]["lora_name"][0]   # the loras folder, listed for the env
        assert {k: tmpl["required"]["strength"][1][k] for k in ("default", "min", "max", "step")} == \
            {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01}
    assert info["LoadLoraModel"]["display_name"] == "Load LoRA (Model)"
    assert info["LoadLoraTextEncoder"]["display_name"] == "Load LoRA (Text Encoder)"


def test_dynamic_group_rows_gather_gaps_as_none():
    rows = Rows((("name", String("")), ("strength", Float(1.0))), min=0, max=4)
    kw = {"x": 1, "g.2.name": "b", "g.0.name": "a", "g.0.strength": 0.5}
    assert rows.present("g", kw) == ["g.0.name", "g.0.strength", "g.2.name"]
    assert rows.gather("g", kw) == [{"name": "a", "strength": 0.5}, {"name": None, "strength": None},
                                    {"name": "b", "strength": None}]
    assert kw == {"x": 1}
    assert rows.gather("g", {}) == []
    assert isinstance(rows.parse("g", "g.01.name"), str) and isinstance(rows.parse("g", "g.4.name"), str)
    assert rows.parse("g", "g.3.strength") == (3, "strength")


def _model_graph(rows: dict) -> dict:
    return {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
            "9": {"class_type": "LoadLoraModel", "inputs": {"model": ["1", 0], **rows}}}


def _problems(models, graph):
    env = Env.from_args(models=models)
    graph = {**graph, "99": {"class_type": "PreviewAny", "inputs": {"source": ["9", 0]}}}
    errors = validate(load_workflow(graph, REG).prompt, REG, env=env).errors
    return {(p.node_id, p.input_name, p.type): p.message for p in errors}


def test_lora_stack_validation_follows_comfyui_key_rules(models):
    got = _problems(models, _model_graph({}))
    assert any(k[1] == "loras" and "received 0 rows" in v for k, v in got.items())
    for bad, why in (("loras.01.lora_name", "not a row field"), ("loras.0.name", "not a row field"),
                     ("loras.20.lora_name", "past the last row")):
        got = _problems(models, _model_graph({bad: LORA, "loras.0.strength": 1.0, "loras.0.lora_name": LORA}))
        assert any(k[1] == bad and why in v for k, v in got.items()), (bad, got)
    got = _problems(models, _model_graph({"loras.3.lora_name": LORA}))   # a given row lacks strength
    assert ("9", "loras.3.strength", "required_input_missing") in got
    got = _problems(models, _model_graph({"loras.0.lora_name": "missing.safetensors", "loras.0.strength": 1.0}))
    assert any(k[1] == "loras.0.lora_name" for k in got)
    assert _problems(models, _model_graph({"loras.5.lora_name": LORA, "loras.5.strength": 1.0})) == {}


def _sample(executor, models, model_node: dict, model=("9", 0)) -> torch.Tensor:
    g = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
         **model_node,
         "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["1", 1]}},
         "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
         "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
         "5": {"class_type": "KSampler", "inputs": {
             "model": list(model), "seed": 3, "steps": 2, "cfg": 5.0, "sampler_name": "euler",
             "scheduler": "normal", "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
             "denoise": 1.0}},
         "99": {"class_type": "PreviewAny", "inputs": {"source": ["5", 0]}}}
    return api.run(g, executor=executor, models=models)["5"][0].samples


def test_load_lora_model_equals_lora_loader_model_only(executor, models):
    plain = _sample(executor, models, {}, model=("1", 0))
    loader = _sample(executor, models, {"9": {"class_type": "LoraLoaderModelOnly", "inputs": {
        "model": ["1", 0], "lora_name": LORA, "strength_model": 1.0}}})
    stack = _sample(executor, models, {"9": {"class_type": "LoadLoraModel", "inputs": {
        "model": ["1", 0], "loras.0.lora_name": LORA, "loras.0.strength": 1.0}}})
    assert (loader - plain).abs().max() > 1e-3
    torch.testing.assert_close(stack, loader)
    # two half-strength rows with a gap between them: the full LoRA (up to rounding)
    halves = _sample(executor, models, {"9": {"class_type": "LoadLoraModel", "inputs": {
        "model": ["1", 0], "loras.0.lora_name": LORA, "loras.0.strength": 0.5,
        "loras.2.lora_name": LORA, "loras.2.strength": 0.5}}})
    torch.testing.assert_close(halves, loader, atol=1e-3, rtol=1e-3)
    # a row at strength 0 is skipped
    off = _sample(executor, models, {"9": {"class_type": "LoadLoraModel", "inputs": {
        "model": ["1", 0], "loras.0.lora_name": LORA, "loras.0.strength": 0.0}}})
    torch.testing.assert_close(off, plain)


def test_load_lora_text_encoder_equals_lora_loader_clip(executor, models):
    def encode(clip_nodes, clip):
        g = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
             **clip_nodes, "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": list(clip)}},
             "99": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
        return api.run(g, executor=executor, models=models)["2"][0][0].cross_attn
    plain = encode({}, ("1", 1))
    loader = encode({"9": {"class_type": "LoraLoader", "inputs": {
        "model": ["1", 0], "clip": ["1", 1], "lora_name": LORA, "strength_model": 0.0,
        "strength_clip": 0.7}}}, ("9", 1))
    stack = encode({"9": {"class_type": "LoadLoraTextEncoder", "inputs": {
        "clip": ["1", 1], "loras.0.lora_name": LORA, "loras.0.strength": 0.7}}}, ("9", 0))
    assert (loader - plain).abs().max() > 1e-4
    torch.testing.assert_close(stack, loader)


def test_lora_stack_without_rows_fails_validation(executor, models):
    g = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
         "9": {"class_type": "LoadLoraTextEncoder", "inputs": {"clip": ["1", 1]}},
         "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": ["9", 0]}},
         "99": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    with pytest.raises(ValidationFailed, match="rows"):
        api.run(g, executor=executor, models=models)


def test_lora_stack_ui_widgets_saved_by_name_give_the_rows():
    from mixgraph.graph.formats.ui_format import convert_ui
    ui = {"last_node_id": 2, "last_link_id": 1, "version": 0.4, "groups": [], "config": {}, "extra": {},
          "nodes": [
              {"id": 1, "type": "CheckpointLoaderSimple", "pos": [0, 0], "size": [300, 100], "flags": {},
               "order": 0, "mode": 0, "inputs": [],
               "outputs": [{"name": "MODEL", "type": "MODEL", "links": [1], "slot_index": 0}],
               "properties": {}, "widgets_values": ["sd15.safetensors"]},
              {"id": 2, "type": "LoadLoraModel", "pos": [400, 0], "size": [300, 100], "flags": {},
               "order": 1, "mode": 0, "inputs": [{"name": "model", "type": "MODEL", "link": 1}],
               "outputs": [], "properties": {},
               "widgets_values": {"loras.0.lora_name": LORA, "loras.0.strength": 0.5}}],
          "links": [[1, 1, 0, 2, 0, "MODEL"]]}
    wf = convert_ui(ui, REG)
    assert {k: v for k, v in wf.prompt["2"].inputs.items() if k != "model"} == \
        {"loras.0.lora_name": LORA, "loras.0.strength": 0.5}
