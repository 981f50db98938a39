"""`nodes.helpers.model_files.ModelFile` (one declaration for "a file of models folder X") and the generic
`Input.fingerprint` / `Input.check` hooks `graph.node` folds into a node's spec."""

import dataclasses
import inspect
import math
from pathlib import Path

from mixgraph.graph.env import Env
from mixgraph.graph.node import Combo, Int, node
from mixgraph.nodes.helpers.model_files import LORA, ModelFile
from mixgraph.ui import api


def _hooked(options, fingerprint=None, check=None):
    return dataclasses.replace(Combo(options), fingerprint=fingerprint, check=check)


def test_input_fingerprints_fold_into_the_node_fingerprint_in_declaration_order():
    @node(outputs=["INT"], register=False)
    def Two(a=_hooked(("x", "y"), fingerprint=lambda env, v: f"A:{v}"), n=Int(1),
            b=_hooked(("x", "y"), fingerprint=lambda env, v: f"B:{v}")):
        return (n,)

    assert Two.spec.fingerprint(None, a="x", n=3, b="y") == ("A:x", "B:y")
    assert Two.spec.fingerprint(None, n=3, b="y") == (None, "B:y")   # a linked, not a literal


def test_a_node_fingerprint_comes_first_and_its_nan_still_means_never_cached():
    own = {"value": 1.0}

    @node(outputs=["INT"], register=False, fingerprint=lambda env, **lits: own["value"])
    def Both(a=_hooked(("x",), fingerprint=lambda env, v: f"A:{v}")):
        return (1,)

    assert Both.spec.fingerprint(None, a="x") == (1.0, "A:x")
    own["value"] = float("nan")
    assert math.isnan(Both.spec.fingerprint(None, a="x"))


def test_input_checks_run_after_the_node_validate_and_keep_its_claims():
    seen = {}

    def validate(env, n=None):
        seen["n"] = n
        return [f"n={n}"] if n == 0 else []

    @node(outputs=["INT"], register=False, validate=validate)
    def Checked(a=_hooked(("x", "y"), check=lambda env, name, v: [f"{name}={v}"] if v == "y" else []),
                n=Int(1)):
        return (n,)

    params = inspect.signature(Checked.spec.validate).parameters
    assert list(params) == ["env", "n", "literals"]   # `n` stays claimed, the rest are passed along
    assert Checked.spec.validate(None, a="y", n=0) == ["n=0", "a=y"]
    assert seen["n"] == 0
    assert Checked.spec.validate(None, a="x", n=1) == []


def test_a_node_without_hooks_keeps_its_own_fingerprint_and_validate():
    def fp(env, **lits):
        return 7

    @node(outputs=["INT"], register=False, fingerprint=fp)
    def Plain(n=Int(1)):
        return (n,)

    assert Plain.spec.fingerprint is fp and Plain.spec.validate is None


def test_model_file_lists_fingerprints_resolves_and_checks(tmp_path):
    env = Env.from_args(models=tmp_path)
    (tmp_path / "loras").mkdir()
    lora = tmp_path / "loras" / "a.safetensors"
    lora.write_bytes(b"one")
    refusing = ModelFile("loras", refuse=lambda path, where: f"{where}: {path.name} refused")
    inp = refusing.input(tooltip="t")
    assert inp.type == "COMBO" and inp.tooltip == "t" and "a.safetensors" in inp.option_list(env)
    assert inp.option_list(None) == []
    assert refusing.path(env, "a.safetensors") == lora
    first = inp.fingerprint(env, "a.safetensors")
    lora.write_bytes(b"two")
    assert inp.fingerprint(env, "a.safetensors") != first   # a replaced file is another key
    assert inp.fingerprint(env, "missing.safetensors") is None
    assert inp.check(env, "lora_name", "a.safetensors") == [
        "lora_name 'a.safetensors': a.safetensors refused"]
    assert inp.check(env, "lora_name", "missing.safetensors") == []   # the combo check reports it
    assert LORA.input().check is None   # no refusal declared: no check attached


# every loader's file input, declared the one way
FILE_INPUTS = {
    "CheckpointLoaderSimple": "ckpt_name", "CheckpointLoader": "ckpt_name", "UNETLoader": "unet_name",
    "CLIPLoader": "clip_name", "DualCLIPLoader": "clip_name2", "VAELoader": "vae_name",
    "LoraLoader": "lora_name", "LoraLoaderModelOnly": "lora_name", "ControlNetLoader": "control_net_name",
    "DiffControlNetLoader": "control_net_name", "DiffusersLoader": "model_path",
    "ImageOnlyCheckpointLoader": "ckpt_name", "ImageOnlyCheckpointLoaderDevice": "ckpt_name",
    "unCLIPCheckpointLoader": "ckpt_name", "CLIPVisionLoader": "clip_name",
    "StyleModelLoader": "style_model_name", "UpscaleModelLoader": "model_name", "GLIGENLoader": "gligen_name",
    "HypernetworkLoader": "hypernetwork_name", "PhotoMakerLoader": "photomaker_model_name",
    "ModelPatchLoader": "name", "LoadBackgroundRemovalModel": "bg_removal_name",
    "ConditioningLoader": "conditioning_name", "CreateHookLora": "lora_name",
    "CreateHookModelAsLora": "ckpt_name", "LoraLoaderBypass": "lora_name", "TextOverlay": "font",
}


def test_every_loader_declares_its_file_input_with_model_file():
    registry = api.default_registry()
    for name, input_name in FILE_INPUTS.items():
        inp = registry.get(name).input_map[input_name]
        assert isinstance(getattr(inp.options, "__self__", None), ModelFile), name
        assert inp.fingerprint is not None, name
        assert registry.get(name).fingerprint is not None, name


def test_loader_cache_key_prints_the_file(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    Path(tmp_path / "checkpoints" / "m.safetensors").write_bytes(b"x")
    env = Env.from_args(models=tmp_path)
    spec = api.default_registry().get("CheckpointLoaderSimple")
    (only,) = spec.fingerprint(env, ckpt_name="m.safetensors")
    assert only is not None and spec.validate(env, ckpt_name="m.safetensors") == []
