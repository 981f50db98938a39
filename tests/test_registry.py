"""Registry and object_info: the exact JSON ComfyUI 0.3.64 gives for equivalent INPUT_TYPES."""

from __future__ import annotations

import json

import pytest

from mixgraph.graph.env import Env
from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, String, node
from mixgraph.graph.registry import Registry, RegistryError
from mixgraph.graph.spec import Hidden

SAMPLERS = ["euler", "euler_ancestral", "heun"]
SCHEDULERS = ["simple", "sgm_uniform", "karras"]


@node(category="sampling", outputs=["LATENT"], register=False,
      description="Uses the provided model, positive and negative conditioning to denoise the latent image.")
def KSampler(model=Socket("MODEL", tooltip="The model used for denoising the input latent."),
             seed=Int(0, min=0, max=0xffffffffffffffff, control_after_generate=True,
                      tooltip="The random seed used for creating the noise."),
             steps=Int(20, min=1, max=10000, tooltip="The number of steps used in the denoising process."),
             cfg=Float(8.0, min=0.0, max=100.0, step=0.1, round=0.01, tooltip="The CFG scale."),
             sampler_name=Combo(SAMPLERS, tooltip="The algorithm used when sampling."),
             scheduler=Combo(SCHEDULERS, tooltip="The scheduler controls how noise is removed."),
             positive=Socket("CONDITIONING", tooltip="Positive conditioning."),
             negative=Socket("CONDITIONING", tooltip="Negative conditioning."),
             latent_image=Socket("LATENT", tooltip="The latent image to denoise."),
             denoise=Float(1.0, min=0.0, max=1.0, step=0.01, tooltip="The amount of denoising applied.")):
    raise AssertionError("never run")


# What ComfyUI's GET /object_info/KSampler returns for the INPUT_TYPES written above (JSON turns
# tuples into lists; ComfyUI also sends output_tooltips, which a declaration here does not carry).
KSAMPLER_JSON = """
{"input": {"required": {
   "model": ["MODEL", {"tooltip": "The model used for denoising the input latent."}],
   "seed": ["INT", {"default": 0, "min": 0, "max": 18446744073709551615,
                    "control_after_generate": true, "tooltip": "The random seed used for creating the noise."}],
   "steps": ["INT", {"default": 20, "min": 1, "max": 10000,
                     "tooltip": "The number of steps used in the denoising process."}],
   "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                     "tooltip": "The CFG scale."}],
   "sampler_name": [["euler", "euler_ancestral", "heun"], {"tooltip": "The algorithm used when sampling."}],
   "scheduler": [["simple", "sgm_uniform", "karras"], {"tooltip": "The scheduler controls how noise is removed."}],
   "positive": ["CONDITIONING", {"tooltip": "Positive conditioning."}],
   "negative": ["CONDITIONING", {"tooltip": "Negative conditioning."}],
   "latent_image": ["LATENT", {"tooltip": "The latent image to denoise."}],
   "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01,
                         "tooltip": "The amount of denoising applied."}]}},
 "input_order": {"required": ["model", "seed", "steps", "cfg", "sampler_name", "scheduler",
                              "positive", "negative", "latent_image", "denoise"]},
 "output": ["LATENT"], "output_is_list": [false], "output_name": ["LATENT"],
 "name": "KSampler", "display_name": "KSampler",
 "description": "Uses the provided model, positive and negative conditioning to denoise the latent image.",
 "python_module": "nodes", "category": "sampling", "output_node": false}
"""


def _files(env):
    return sorted(p.name for p in env.models[0].glob("*.safetensors"))


@node(category="loaders", outputs=["MODEL", "CLIP", "VAE"], register=False)
def CheckpointLoaderSimple(ckpt_name=Combo(_files, tooltip="The checkpoint to load.")):
    raise AssertionError("never run")


@node(category="image", outputs=[], output_node=True, register=False, display_name="Save Image")
def SaveImage(images=Socket("IMAGE"), filename_prefix=String("ComfyUI"),
              prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    raise AssertionError("never run")


@node(outputs=[("CONDITIONING", "cond")], register=False)
def Mixed(text=String(multiline=True, dynamic_prompts=True), clip=Socket("CLIP"),
          flag=Boolean(True), add_noise=Combo(["enable", "disable"]),
          mode=Combo(["a", "b"], default="b"), extra_text=Socket("STRING"),
          vae=Socket("VAE", optional=True), strength=Float(1.0, optional=True)):
    raise AssertionError("never run")


def _registry(*fns):
    r = Registry()
    for f in fns:
        r.add(f.spec)
    return r


def test_registry_object_info_matches_comfyui_ksampler():
    info = _registry(KSampler).object_info_for("KSampler")
    assert info == {"KSampler": json.loads(KSAMPLER_JSON)}
    # key order of the options dict is ComfyUI's too (it shows in the frontend's JSON)
    assert list(info["KSampler"]["input"]["required"]["cfg"][1]) == ["default", "min", "max", "step",
                                                                       "round", "tooltip"]


def test_registry_object_info_hidden_optional_and_input_order():
    r = _registry(SaveImage, Mixed)
    save = r.object_info()["SaveImage"]
    assert save["input"] == {"required": {"images": ["IMAGE"],
                                          "filename_prefix": ["STRING", {"default": "ComfyUI"}]},
                             "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}
    # ComfyUI builds input_order from every INPUT_TYPES key, hidden included
    assert save["input_order"] == {"required": ["images", "filename_prefix"],
                                   "hidden": ["prompt", "extra_pnginfo"]}
    assert (save["output"], save["output_is_list"], save["output_name"]) == ([], [], [])
    assert save["output_node"] is True and save["display_name"] == "Save Image"

    mixed = r.object_info()["Mixed"]
    assert mixed["input"] == {
        "required": {"text": ["STRING", {"default": "", "multiline": True, "dynamicPrompts": True}],
                     "clip": ["CLIP"],
                     "flag": ["BOOLEAN", {"default": True}],
                     "add_noise": [["enable", "disable"]],
                     "mode": [["a", "b"], {"default": "b"}],
                     "extra_text": ["STRING", {"forceInput": True}]},
        "optional": {"vae": ["VAE"], "strength": ["FLOAT", {"default": 1.0}]}}
    assert mixed["input_order"] == {"required": ["text", "clip", "flag", "add_noise", "mode", "extra_text"],
                                    "optional": ["vae", "strength"]}
    assert mixed["output"] == ["CONDITIONING"] and mixed["output_name"] == ["cond"]


def test_registry_combo_options_evaluated_with_env(tmp_path):
    (tmp_path / "b.safetensors").write_bytes(b"")
    (tmp_path / "a.safetensors").write_bytes(b"")
    r = _registry(CheckpointLoaderSimple)
    info = r.object_info_for("CheckpointLoaderSimple", Env(models=(tmp_path,)))
    assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] == [
        ["a.safetensors", "b.safetensors"], {"tooltip": "The checkpoint to load."}]


def test_registry_lookup_and_duplicates():
    r = _registry(KSampler, SaveImage)
    assert "KSampler" in r and "Nope" not in r
    assert r.get("SaveImage") is SaveImage.spec and r.get("Nope") is None
    assert r.names() == ["KSampler", "SaveImage"] and len(r) == 2
    assert r.object_info_for("Nope") == {}
    with pytest.raises(RegistryError, match="declared twice"):
        r.add(KSampler.spec)


def test_registry_object_info_is_json_serialisable():
    r = _registry(KSampler, SaveImage, Mixed)
    assert json.loads(json.dumps(r.object_info())) == r.object_info()
