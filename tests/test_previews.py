"""Sampler step previews: latent2rgb against ComfyUI's factor formula, the TAESD decoder from a
file in its real key layout, the method choice, and binary preview frames on the websocket during
a KSampler run on a tiny SD1.5 checkpoint (`--preview-method` none sends none)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from types import SimpleNamespace

import pytest
import torch
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.vae.taesd import TAESDConfig, TAESDDecoder, TAESDFileError, load_taesd_decoder
from mixgraph.nodes.families.sd.family import SD
from mixgraph.nodes.sampling.preview import (Latent2RGBPreviewer, TAESDPreviewer, latent_to_rgb, make_previewer,
                                             preview_format)
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.ui import api
from mixgraph.ui.server.server import create_app
from tests.fixtures.checkpoints import write_sd15

STEPS = 3


def tiny_taesd_state_dict(seed: int = 0, latent_channels: int = 4, width: int = 8) -> dict:
    torch.manual_seed(seed)
    model = TAESDDecoder(TAESDConfig(latent_channels=latent_channels, width=width))
    return {k: (torch.randn_like(v) * 0.2).contiguous() for k, v in model.state_dict().items()}


def test_latent_to_rgb_matches_factor_formula():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 5, 7, generator=g)
    for kind, bias in (("sd1", (0.0, 0.0, 0.0)), ("sdxl", (0.1084, -0.0175, -0.0011))):
        fmt = SD.latent_format(kind)
        f = fmt.latent_rgb_factors
        rgb = latent_to_rgb(x0, fmt)
        assert rgb.shape == (5, 7, 3)
        for y, x in ((0, 0), (4, 6), (2, 3)):
            for c in range(3):
                value = sum(float(x0[0, k, y, x]) * f[k][c] for k in range(4)) + bias[c]
                want = min(max((value + 1.0) / 2.0, 0.0), 1.0)
                assert abs(float(rgb[y, x, c]) - want) < 1e-5


def test_latent_to_rgb_sd1_factor_first_row():
    x0 = torch.zeros(1, 4, 1, 1)
    x0[0, 0] = 1.0                                         # only channel 0: rgb = row 0
    rgb = latent_to_rgb(x0, SD.latent_format("sd1"))[0, 0]
    assert torch.allclose(rgb, (torch.tensor([0.3512, 0.2297, 0.3227]) + 1) / 2, atol=1e-6)


def test_taesd_decoder_keys_are_the_file_layout():
    keys = set(TAESDDecoder().state_dict())
    assert {"1.weight", "1.bias", "3.conv.0.weight", "3.conv.4.bias", "7.weight",
            "18.conv.2.weight", "19.weight", "19.bias"} <= keys
    assert "7.bias" not in keys and "3.skip.weight" not in keys
    assert TAESDDecoder().state_dict()["1.weight"].shape == (64, 4, 3, 3)


def test_taesd_decoder_loads_by_shape_and_decodes_8x(tmp_path):
    sd = tiny_taesd_state_dict(seed=3)
    path = tmp_path / "taesd_decoder.safetensors"
    save_file(sd, str(path))
    model = load_taesd_decoder(path)
    assert model.config == TAESDConfig(latent_channels=4, width=8)
    x = torch.randn(1, 4, 3, 5, generator=torch.Generator().manual_seed(1))
    out = model(x)
    assert out.shape == (1, 3, 24, 40)
    reference = TAESDDecoder(TAESDConfig(4, 8))
    reference.load_state_dict(sd)
    assert torch.allclose(out, reference(x), atol=1e-6)
    image = TAESDPreviewer(model, max_size=16)(x)
    assert image.size == (16, 10)                       # thumbnail keeps the aspect ratio


def test_taesd_decoder_wrong_file_names_the_file(tmp_path):
    path = tmp_path / "taesd_decoder.safetensors"
    save_file({"weight": torch.zeros(3, 3)}, str(path))
    with pytest.raises(TAESDFileError, match="taesd_decoder.safetensors"):
        load_taesd_decoder(path)


def test_make_previewer_methods(tmp_path):
    path = tmp_path / "taesd_decoder.safetensors"
    save_file(tiny_taesd_state_dict(), str(path))
    found = {"taesd_decoder": path}
    find = found.get
    none = {}.get
    sd1, sdxl = SD.latent_format("sd1"), SD.latent_format("sdxl")
    assert make_previewer("none", sd1, find) is None
    assert isinstance(make_previewer("auto", sd1, find), TAESDPreviewer)
    assert isinstance(make_previewer("auto", sd1, none), Latent2RGBPreviewer)
    assert isinstance(make_previewer("taesd", sd1, none), Latent2RGBPreviewer)
    assert isinstance(make_previewer("latent2rgb", sd1, find), Latent2RGBPreviewer)
    # SDXL looks for its own decoder only
    assert isinstance(make_previewer("auto", sdxl, find), Latent2RGBPreviewer)
    with pytest.raises(ValueError, match="preview method"):
        make_previewer("fancy", sd1, find)


def test_a_latent_format_without_factors_gets_no_preview():
    """As ComfyUI: a latent format with no ``latent_rgb_factors`` is not previewed (no error),
    whatever the method; one without a TAESD decoder name falls back to latent2rgb."""
    bare = LatentFormat(1.0, channels=16)
    asked = []
    for method in ("auto", "latent2rgb", "taesd"):
        assert make_previewer(method, bare, asked.append) is None
    assert make_previewer("auto", None, asked.append) is None
    assert asked == []
    assert preview_format(SimpleNamespace(latent_format=bare)) is None
    assert preview_format(SimpleNamespace(kind="sd1")) is None
    two = LatentFormat(1.0, channels=2, latent_rgb_factors=((1.0, 0.0, 0.0), (0.0, 1.0, 0.0)))
    assert preview_format(SimpleNamespace(latent_format=two)) is two
    previewer = make_previewer("taesd", two, asked.append)
    assert isinstance(previewer, Latent2RGBPreviewer) and asked == []
    x0 = torch.zeros(1, 2, 1, 1)
    x0[0, 1] = 1.0
    assert torch.allclose(latent_to_rgb(x0, two)[0, 0], torch.tensor([0.5, 1.0, 0.5]))
    with pytest.raises(ValueError, match="rows of 3"):
        LatentFormat(1.0, channels=2, latent_rgb_factors=((1.0, 0.0, 0.0),))


# --- websocket frames during a KSampler run ---------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview_models")
    (root / "checkpoints").mkdir()
    (root / "vae_approx").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


def prompt(seed: int) -> dict:
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 48,
                                                           "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": seed, "steps": STEPS, "cfg": 6.0, "sampler_name": "euler",
            "scheduler": "normal", "positive": ["6", 0], "negative": ["7", 0],
            "latent_image": ["5", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}},
    }


def run_frames(tmp_path, models, settings: dict) -> list[bytes]:
    env = Env(models=(models,), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp", settings=tuple(settings.items()))
    for d in (env.input, env.output, env.temp):
        d.mkdir(parents=True, exist_ok=True)
    registry = api.default_registry()

    async def main():
        app = create_app(env, registry=registry, user_dir=tmp_path / "user",
                         executor=Executor(registry, env, OutputCache(1 << 28)))
        async with TestServer(app) as server, TestClient(server) as c:
            ws = await c.ws_connect("/ws?clientId=p")
            await ws.receive_json()
            r = await c.post("/prompt", json={"prompt": prompt(7), "client_id": "p"})
            assert r.status == 200, await r.text()
            pid = (await r.json())["prompt_id"]
            frames, errors = [], []
            while True:
                msg = await asyncio.wait_for(ws.receive(), 60)
                if msg.type == WSMsgType.BINARY:
                    frames.append(msg.data)
                    continue
                data = json.loads(msg.data)
                if data["type"] == "execution_error":
                    errors.append(data["data"]["exception_message"])
                if data["type"] == "executing" and data["data"]["node"] is None \
                        and data["data"]["prompt_id"] == pid:
                    break
            await ws.close()
            assert not errors
            return frames

    return asyncio.run(main())


def jpeg_of(frame: bytes) -> Image.Image:
    assert int.from_bytes(frame[:4], "big") == 1            # PREVIEW_IMAGE
    assert int.from_bytes(frame[4:8], "big") == 1           # JPEG
    image = Image.open(io.BytesIO(frame[8:]))
    assert image.format == "JPEG"
    return image


def test_preview_frames_latent2rgb_each_step(tmp_path, models):
    frames = run_frames(tmp_path, models, {"preview_method": "latent2rgb"})
    assert len(frames) == STEPS
    for frame in frames:
        assert jpeg_of(frame).size == (8, 6)                # the latent's size: 64x48 / 8


def test_preview_frames_taesd_when_decoder_present(tmp_path, models):
    path = models / "vae_approx" / "taesd_decoder.safetensors"
    save_file(tiny_taesd_state_dict(seed=2), str(path))
    try:
        frames = run_frames(tmp_path, models, {"preview_method": "auto", "preview_size": 32})
    finally:
        path.unlink()
    assert len(frames) == STEPS
    for frame in frames:
        assert jpeg_of(frame).size == (32, 24)              # 64x48 decoded, shrunk to 32


def test_preview_frames_none_sends_none(tmp_path, models):
    assert run_frames(tmp_path, models, {"preview_method": "none"}) == []
    assert run_frames(tmp_path, models, {}) == []           # ComfyUI's default is none
