"""ComfyUI's pinned `comfy_api` versions (`v0_0_1`, `v0_0_2`, `v0_0_3`, `latest`): a pack that
imports any of them loads and runs, its progress calls (awaited and blocking) reach the run's
events, and each version keeps the public names ComfyUI's has. Also the pack-boundary rules
ComfyUI's own execution tests rely on: linked inputs are None in IS_CHANGED / VALIDATE_INPUTS,
and a hidden input of a pack's own kind takes the prompt's value or is left out."""

from __future__ import annotations

import textwrap

import pytest

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.events import Progress
from mixgraph.graph.executor import Executor
from mixgraph.ui.comfy import comfy_runtime, custom_nodes
from tests.test_custom_nodes import fresh_registry

VERSIONS = ("v0_0_1", "v0_0_2", "v0_0_3", "latest")

PACK = '''
import importlib

VERSIONS = {versions!r}
apis = {{v: importlib.import_module("comfy_api." + v) for v in VERSIONS}}


def node_for(version):
    mod = apis[version]

    class Progressing:
        @classmethod
        def INPUT_TYPES(cls):
            return {{"required": {{"steps": ("INT", {{"default": 3}})}}}}

        RETURN_TYPES = ("STRING",)
        FUNCTION = "run"
        CATEGORY = "testing"
        OUTPUT_NODE = True

        def run(self, steps):
            api = mod.ComfyAPISync()
            for i in range(steps):
                api.execution.set_progress(value=i + 1, max_value=steps)
            return (mod.ComfyAPI.VERSION,)

    class ProgressingAsync(Progressing):
        async def run(self, steps):
            api = mod.ComfyAPI()
            for i in range(steps):
                await api.execution.set_progress(value=i + 1, max_value=steps)
            return (mod.ComfyAPI.VERSION,)

    return Progressing, ProgressingAsync


NODE_CLASS_MAPPINGS = {{}}
for v in VERSIONS:
    sync_node, async_node = node_for(v)
    NODE_CLASS_MAPPINGS["MgApi_" + v] = sync_node
    NODE_CLASS_MAPPINGS["MgApiAsync_" + v] = async_node


class LinkedIsNone:
    """ComfyUI's IS_CHANGED / VALIDATE_INPUTS see a linked input as None."""

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"text": ("STRING",), "factor": ("FLOAT", {{"default": 1.0}})}}}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    SEEN = []

    def run(self, text, factor):
        return (text * int(factor),)

    @classmethod
    def IS_CHANGED(cls, text, factor):
        cls.SEEN.append(("IS_CHANGED", text, factor))
        return factor

    @classmethod
    def VALIDATE_INPUTS(cls, text, factor):
        cls.SEEN.append(("VALIDATE_INPUTS", text, factor))
        return True


class OwnHidden:
    """A hidden input of the pack's own kind: the prompt's value when given, else absent."""

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"start": ("INT", {{"default": 1}})}},
                "hidden": {{"override": ("*",)}}}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    OUTPUT_NODE = True

    def run(self, start, **kwargs):
        return (repr(kwargs.get("override", "absent")) + "/" + str(start),)


class Text:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"text": ("STRING", {{"default": "ab"}})}}}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"

    def run(self, text):
        return (text,)


NODE_CLASS_MAPPINGS.update(MgLinkedIsNone=LinkedIsNone, MgOwnHidden=OwnHidden, MgText=Text)
'''


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("packs")
    for d in ("in", "out", "temp", "models"):
        (root / d).mkdir()
    folder = root / "nodes" / "mg_api_versions_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(PACK.format(versions=VERSIONS)))
    env = Env(models=(root / "models",), input=root / "in", output=root / "out",
              temp=root / "temp")
    reg = fresh_registry()
    report = custom_nodes.load_packs([root / "nodes"], reg, env)
    assert not report.failed, report.failed
    return reg, env


def run(reg, env, prompt):
    events: list = []
    report = Executor(reg, env, OutputCache(2**24)).run(prompt, on_event=events.append)
    return report, events


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["MgApi_", "MgApiAsync_"])
def test_comfy_api_version_pack_loads_runs_and_reports_progress(pack, version, kind):
    reg, env = pack
    report, events = run(reg, env, {"1": {"class_type": kind + version, "inputs": {"steps": 3}}})
    assert report.status == "success"
    expected = "latest" if version == "latest" else version[1:].replace("_", ".")
    assert report.values["1"] == (expected,)
    assert [(e.value, e.max) for e in events if isinstance(e, Progress)] == [(1, 3), (2, 3), (3, 3)]


def test_comfy_api_versions_have_comfyui_public_names():
    with comfy_runtime.host_path():
        import comfy_api.latest as latest
        import comfy_api.v0_0_1 as v1
        import comfy_api.v0_0_2 as v2
        import comfy_api.v0_0_3 as v3
        from comfy_api.version_list import supported_versions
    for mod in (latest, v1, v2, v3):
        assert {"ComfyAPI", "ComfyAPISync", "Input", "InputImpl", "Types"} <= set(mod.__all__)
        assert mod.Input.Image is latest.Input.Image and issubclass(mod.Types, latest.Types)
        assert mod.ComfyAPISync.VERSION == mod.ComfyAPI.VERSION
    for mod in (latest, v2, v3):
        assert mod.io is latest.io and mod.ui is latest.ui
        assert mod.ComfyExtension is latest.ComfyExtension
    assert not hasattr(v1, "io")                                  # as in ComfyUI: no V3 schema
    assert v1.ComfyAPI.STABLE and not v2.ComfyAPI.STABLE
    assert [c.VERSION for c in supported_versions] == ["latest", "0.0.3", "0.0.2", "0.0.1"]
    assert latest.Types.VideoContainer.get_extension("auto") == "mp4"
    with pytest.raises(ValueError, match="not a readable video"):  # read with PyAV: no such file
        latest.InputImpl.VideoFromFile("clip.mp4")


def test_comfy_pack_linked_inputs_are_none_in_is_changed_and_validate_inputs(pack):
    reg, env = pack
    seen = custom_nodes_module().LinkedIsNone.SEEN
    seen.clear()
    prompt = {"1": {"class_type": "MgText", "inputs": {"text": "ab"}},
              "2": {"class_type": "MgLinkedIsNone", "inputs": {"text": ["1", 0], "factor": 2.0}}}
    report, _ = run(reg, env, prompt)
    assert report.status == "success" and report.values["2"] == ("abab",)
    assert ("IS_CHANGED", None, 2.0) in seen and ("VALIDATE_INPUTS", None, 2.0) in seen


def test_comfy_pack_own_hidden_input_takes_the_prompts_value_or_is_absent(pack):
    reg, env = pack
    prompt = {"1": {"class_type": "MgOwnHidden", "inputs": {"start": 1}},
              "2": {"class_type": "MgOwnHidden", "inputs": {"start": 1, "override": 7}},
              "3": {"class_type": "MgText", "inputs": {"text": "x"}},
              "4": {"class_type": "MgOwnHidden", "inputs": {"start": 1, "override": ["3", 0]}}}
    report, _ = run(reg, env, prompt)
    assert report.status == "success"
    assert report.values["1"] == ("'absent'/1",)
    assert report.values["2"] == ("7/1",)
    assert report.values["4"] == ("'x'/1",)


def custom_nodes_module():
    import sys
    return sys.modules["custom_nodes.mg_api_versions_pack"]
