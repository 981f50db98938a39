"""VAELoader "taesd" / "taesdxl" (ComfyUI nodes.py VAELoader.vae_list / load_taesd and
comfy/taesd/taesd.py): options only when both halves sit in vae_approx, encode/decode against a
reference built here from the same modules and the scale formula, the lone-file refusal, and an
end-to-end txt2img with the taesd VAE on a tiny SD1.5 checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.env import Env
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.loaders.loading import VAELoader
from mixgraph.nodes.models.loader import load_vae
from mixgraph.nodes.vae.taesd import TAESDConfig, TAESDDecoder, TAESDEncoder
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15

F32 = parse_spec("f32")
W = 8  # tiny width; the real files are 64 wide with the same keys


def _random(model: torch.nn.Module, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=g) * 0.2).contiguous() for k, v in model.state_dict().items()}


def write_halves(folder, prefix="taesd", seed=0, encoder=True, decoder=True):
    folder.mkdir(parents=True, exist_ok=True)
    enc = _random(TAESDEncoder(4, W), seed) if encoder else None
    dec = _random(TAESDDecoder(TAESDConfig(4, W)), seed + 1) if decoder else None
    if enc is not None:
        save_file(enc, str(folder / f"{prefix}_encoder.safetensors"))
    if dec is not None:
        save_file(dec, str(folder / f"{prefix}_decoder.safetensors"))
    return enc, dec


def test_encoder_keys_are_the_file_layout():
    keys = set(TAESDEncoder().state_dict())
    assert {"0.weight", "0.bias", "1.conv.0.weight", "2.weight", "6.weight", "10.weight",
            "13.conv.4.bias", "14.weight", "14.bias"} <= keys
    assert "2.bias" not in keys and "15.weight" not in keys
    assert TAESDEncoder().state_dict()["14.weight"].shape == (4, 64, 3, 3)
    assert TAESDEncoder().state_dict()["2.weight"].shape == (64, 64, 3, 3)


def test_vae_options_list_taesd_only_when_both_halves_exist(tmp_path):
    models = tmp_path / "models"
    (models / "vae").mkdir(parents=True)
    approx = models / "vae_approx"
    write_halves(approx, "taesd", encoder=False)
    write_halves(approx, "taesdxl")
    env = Env.from_args(models=models)
    info = api.default_registry().object_info(env)["VAELoader"]
    options = info["input"]["required"]["vae_name"][0]
    assert "taesd" not in options and "taesdxl" in options
    assert options[-1] == "pixel_space"
    write_halves(approx, "taesd")
    options = api.default_registry().object_info(env)["VAELoader"]["input"]["required"]["vae_name"][0]
    assert options[-3:] == ["taesd", "taesdxl", "pixel_space"]
    assert info["output"] == ["VAE"] and info["category"] == "loaders"


def test_lone_taesd_file_as_a_vae_file_is_refused(tmp_path):
    write_halves(tmp_path, "taesd", encoder=False)
    sd = {f"taesd_decoder.{k}": v for k, v in _random(TAESDDecoder(TAESDConfig(4, W)), 0).items()}
    save_file(sd, str(tmp_path / "lone.safetensors"))
    with pytest.raises(NotImplementedError, match="single TAESD .*not supported yet"):
        load_vae(tmp_path / "lone.safetensors")


@pytest.mark.parametrize("name,scale", [("taesd", 0.18215), ("taesdxl", 0.13025)])
def test_vae_encode_decode_match_comfyui_formula(tmp_path, name, scale):
    models = tmp_path / "models"
    enc_sd, dec_sd = write_halves(models / "vae_approx", name, seed=3)
    encoder, decoder = TAESDEncoder(4, W), TAESDDecoder(TAESDConfig(4, W))
    encoder.load_state_dict(enc_sd)
    decoder.load_state_dict(dec_sd)
    g = torch.Generator().manual_seed(7)
    pixels = torch.rand(1, 32, 40, 3, generator=g)
    latent = torch.randn(1, 4, 4, 5, generator=g) * 3

    class Ctx:
        env = Env.from_args(models=models)

    (vae,) = VAELoader(Ctx(), name)
    assert vae.latent_scale == scale
    got_latent = vae.encode(pixels, F32)
    got_image = vae.decode(latent, F32)
    with torch.no_grad():
        # ComfyUI: process_input 2x-1, TAESD.encode enc(x/2+1/2)/scale + shift (shift 0)
        want_latent = encoder((pixels.movedim(-1, 1) * 2 - 1) * 0.5 + 0.5) / scale
        # TAESD.decode (dec((z - shift)·scale) - 1/2)·2, process_output clamp((x+1)/2, 0, 1)
        want_image = ((decoder(latent * scale) - 0.5) * 2 + 1).div(2).clamp(0, 1).movedim(1, -1)
    assert got_latent.shape == (1, 4, 4, 5)
    assert torch.allclose(got_latent, want_latent, atol=1e-5)
    assert got_image.shape == (1, 32, 40, 3)
    assert torch.allclose(got_image, want_image, atol=1e-5)


def test_txt2img_with_the_taesd_vae(tmp_path):
    models = tmp_path / "models"
    (models / "checkpoints").mkdir(parents=True)
    write_sd15(models / "checkpoints" / "sd15.safetensors", seed=1)
    write_halves(models / "vae_approx", "taesd", seed=5)
    prompt = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
        "8": {"class_type": "VAELoader", "inputs": {"vae_name": "taesd"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": 1, "steps": 2, "cfg": 6.0, "sampler_name": "euler",
            "scheduler": "normal", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["8", 0]}},
        "10": {"class_type": "VAEEncode", "inputs": {"pixels": ["9", 0], "vae": ["8", 0]}},
        "11": {"class_type": "PreviewImage", "inputs": {"images": ["9", 0]}},
        "12": {"class_type": "SaveLatent", "inputs": {"samples": ["10", 0], "filename_prefix": "t"}},
    }
    from mixgraph.ui.cli import main

    (tmp_path / "wf.json").write_text(json.dumps(prompt))  # the memory estimate names no vae file
    assert main(["estimate", str(tmp_path / "wf.json"), "--json", "--models", str(models)]) in (0, 1)
    assert main(["validate", str(tmp_path / "wf.json"), "--models", str(models)]) == 0
    res = api.run(prompt, models=models, output=tmp_path / "out")
    image = res.outputs["9"][0]
    assert image.shape == (1, 64, 64, 3) and torch.isfinite(image).all()
    assert res.outputs["10"][0].samples.shape == (1, 4, 8, 8)


def test_pixel_space_is_listed_but_refused_as_not_supported_yet(tmp_path):
    class Ctx:
        env = Env.from_args(models=tmp_path)

    with pytest.raises(NotImplementedError, match="pixel_space.*not supported yet"):
        VAELoader(Ctx(), "pixel_space")
