"""ESRGAN-family upscalers: RRDBNet configs read from tiny seeded state dicts in the Real-ESRGAN
and original ESRGAN key layouts, the ×2 pixel-unshuffle variant, tiled upscaling that blends
seamlessly, the UPSCALE_MODEL precision, and the two nodes through the engine."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import parse_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.image import upscale_nodes  # noqa: F401  (registers the nodes)
from mixgraph.nodes.image_models.esrgan import RRDBConfig, RRDBNet, UpscaleModelError
from mixgraph.nodes.image_models.upscale import load_upscale_model, upscale_image
from mixgraph.ui import api

TINY = RRDBConfig(features=8, growth=4, blocks=2, upsamples=2)
F32 = parse_spec("f32")


def tiny_state_dict(config: RRDBConfig = TINY, seed: int = 0, local: bool = False) -> dict:
    """Seeded random weights; ``local``: the RRDB trunk and conv_body zeroed, so the network is
    a short conv stack with a small receptive field (a few pixels), narrower than the overlap."""
    torch.manual_seed(seed)
    sd = {}
    for k, v in RRDBNet(config).state_dict().items():
        t = torch.randn_like(v) * (0.1 if k.endswith("weight") else 0.01)
        if local and (k.startswith("body.") or k.startswith("conv_body.")):
            t = torch.zeros_like(v)
        sd[k] = t.contiguous()
    return sd


def to_old_layout(sd: dict, config: RRDBConfig = TINY) -> dict:
    """Real-ESRGAN keys → the original ESRGAN layout (model.0, model.1.sub.N.RDBk.convj.0, ...)."""
    tail = {"conv_up1": 3, "conv_up2": 6, "conv_hr": 8, "conv_last": 10}
    out = {}
    for k, v in sd.items():
        name, param = k.rsplit(".", 1)
        if name == "conv_first":
            new = f"model.0.{param}"
        elif name == "conv_body":
            new = f"model.1.sub.{config.blocks}.{param}"
        elif m := re.fullmatch(r"body\.(\d+)\.rdb(\d)\.conv(\d)", name):
            new = f"model.1.sub.{m.group(1)}.RDB{m.group(2)}.conv{m.group(3)}.0.{param}"
        else:
            new = f"model.{tail[name]}.{param}"
        out[new] = v
    return out


def image(h=20, w=28, b=1, seed=1) -> torch.Tensor:
    return torch.rand(b, h, w, 3, generator=torch.Generator().manual_seed(seed))


def test_rrdb_config_from_real_esrgan_file(tmp_path):
    path = tmp_path / "x4.safetensors"
    save_file(tiny_state_dict(), str(path))
    handle = load_upscale_model(path)
    assert handle.config == TINY and handle.scale == 4
    out = upscale_image(handle.runner(F32), handle.config, image())
    assert out.shape == (1, 80, 112, 3)
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_rrdb_old_esrgan_layout_gives_the_same_image(tmp_path):
    sd = tiny_state_dict(seed=3)
    new, old = tmp_path / "new.safetensors", tmp_path / "old.pth"
    save_file(sd, str(new))
    torch.save(to_old_layout(sd), str(old))
    a, b = load_upscale_model(new), load_upscale_model(old)
    assert b.config.old_layout and b.scale == 4
    x = image(12, 10)
    assert torch.allclose(upscale_image(a.runner(F32), a.config, x),
                          upscale_image(b.runner(F32), b.config, x), atol=1e-6)


def test_rrdb_x2_pixel_unshuffle_model_odd_sizes(tmp_path):
    cfg = RRDBConfig(features=8, growth=4, blocks=1, upsamples=2, unshuffle=2)
    sd = tiny_state_dict(cfg)
    assert sd["conv_first.weight"].shape[1] == 12
    path = tmp_path / "x2.safetensors"
    save_file(sd, str(path))
    handle = load_upscale_model(path)
    assert handle.config == cfg and handle.scale == 2
    out = upscale_image(handle.runner(F32), handle.config, image(11, 13))
    assert out.shape == (1, 22, 26, 3)


def test_upscale_tiles_blend_seamlessly():
    cfg = TINY
    model = RRDBNet(cfg)
    model.load_state_dict(tiny_state_dict(local=True, seed=5))
    x = image(40, 52, b=2)
    whole = upscale_image(model, cfg, x)                       # one tile: 512 > size
    tiled = upscale_image(model, cfg, x, tile=16, overlap=8)   # many overlapping tiles
    butted = upscale_image(model, cfg, x, tile=16, overlap=0)   # tiles side by side, no blend
    assert tiled.shape == whole.shape == butted.shape == (2, 160, 208, 3)
    blended_err = (tiled - whole).abs()
    butted_err = (butted - whole).abs()
    # Only the few pixels whose receptive field crosses a tile edge differ, and the feathered
    # overlap keeps them close; without overlap the edges show.
    assert float(blended_err.mean()) < 0.005 and float(blended_err.max()) < 0.05
    assert float(blended_err.mean()) < 0.5 * float(butted_err.mean())


def test_upscale_model_precision_runs_in_bf16(tmp_path):
    path = tmp_path / "x4.safetensors"
    save_file(tiny_state_dict(seed=7), str(path))
    handle = load_upscale_model(path)
    x = image(8, 8)
    ref = upscale_image(handle.runner(F32), handle.config, x)
    half = upscale_image(handle.runner(parse_spec("bf16")), handle.config, x)
    assert not torch.equal(ref, half)
    assert (ref - half).abs().mean() < 0.02


def test_upscale_loader_refuses_other_files(tmp_path):
    path = tmp_path / "nope.safetensors"
    save_file({"layer.weight": torch.zeros(4, 4)}, str(path))
    with pytest.raises(UpscaleModelError, match="nope.safetensors.*not an ESRGAN"):
        load_upscale_model(path)


def test_upscale_nodes_specs():
    loader = REGISTRY.get("UpscaleModelLoader")
    assert [n for n, _ in loader.inputs] == ["model_name"]
    assert [o.type for o in loader.outputs] == ["UPSCALE_MODEL"]
    up = REGISTRY.get("ImageUpscaleWithModel")
    assert [(n, i.type) for n, i in up.inputs] == [("upscale_model", "UPSCALE_MODEL"),
                                                   ("image", "IMAGE")]
    assert [o.type for o in up.outputs] == ["IMAGE"]
    assert "UPSCALE_MODEL" in up.precision_types


def test_upscale_nodes_through_the_engine(tmp_path):
    models = tmp_path / "models"
    (models / "upscale_models").mkdir(parents=True)
    save_file(tiny_state_dict(seed=2), str(models / "upscale_models" / "tiny_x4.safetensors"))
    (tmp_path / "in").mkdir()
    arr = (image(6, 9)[0].numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).save(tmp_path / "in" / "small.png")
    env = Env(models=(models,), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "t")
    ex = Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 26))
    prompt = {
        "1": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "tiny_x4.safetensors"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "small.png"}},
        "3": {"class_type": "ImageUpscaleWithModel",
              "inputs": {"upscale_model": ["1", 0], "image": ["2", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "up"}},
    }
    ex.run(prompt)
    [saved] = list((tmp_path / "out").glob("up_*.png"))
    with Image.open(saved) as im:
        assert im.size == (36, 24)
