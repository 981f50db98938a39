"""SaveLatent / LoadLatent (ComfyUI's .latent format), VAEEncodeTiled, DiffusersLoader and the
CLIP-vision loaders' refusal: specs as ComfyUI's, file round trips and end-to-end runs."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mixgraph.graph.report import ValidationFailed
from mixgraph.nodes.weights.latent_file import load_latent
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_latent_and_loader_specs_match_comfyui():
    assert INFO["SaveLatent"]["input_order"]["required"] == ["samples", "filename_prefix"]
    assert INFO["SaveLatent"]["input"]["required"]["filename_prefix"] == ["STRING", {"default": "latents/ComfyUI"}]
    assert INFO["SaveLatent"]["output_node"] is True and INFO["SaveLatent"]["category"] == "_for_testing"
    assert INFO["LoadLatent"]["input_order"]["required"] == ["latent"]
    assert INFO["LoadLatent"]["output"] == ["LATENT"] and INFO["LoadLatent"]["category"] == "_for_testing"
    enc = INFO["VAEEncodeTiled"]
    assert enc["input_order"]["required"] == ["pixels", "vae", "tile_size", "overlap", "temporal_size",
                                              "temporal_overlap"]
    req = enc["input"]["required"]
    assert req["tile_size"] == ["INT", {"default": 512, "min": 64, "max": 4096, "step": 64}]
    assert req["overlap"] == ["INT", {"default": 64, "min": 0, "max": 4096, "step": 32}]
    assert req["temporal_size"] == ["INT", {"default": 64, "min": 8, "max": 4096, "step": 4}]
    assert req["temporal_overlap"] == ["INT", {"default": 8, "min": 4, "max": 4096, "step": 4}]
    assert enc["output"] == ["LATENT"] and enc["category"] == "_for_testing"
    assert INFO["DiffusersLoader"]["input_order"]["required"] == ["model_path"]
    assert INFO["DiffusersLoader"]["output"] == ["MODEL", "CLIP", "VAE"]
    assert INFO["DiffusersLoader"]["category"] == "advanced/loaders/deprecated"
    assert INFO["unCLIPCheckpointLoader"]["output"] == ["MODEL", "CLIP", "VAE", "CLIP_VISION"]
    assert INFO["ImageOnlyCheckpointLoader"]["output"] == ["MODEL", "CLIP_VISION", "VAE"]


def test_load_latent_version_0_as_stored_and_legacy_divided_by_sd1_scale(tmp_path):
    t = torch.arange(8, dtype=torch.float32).reshape(1, 2, 2, 2)
    save_file({"latent_tensor": t, "latent_format_version_0": torch.tensor([])}, str(tmp_path / "new.latent"))
    save_file({"latent_tensor": t}, str(tmp_path / "old.latent"))
    assert torch.equal(load_latent(tmp_path / "new.latent"), t)
    assert torch.allclose(load_latent(tmp_path / "old.latent"), t / 0.18215)
    save_file({"x": t}, str(tmp_path / "bad.latent"))
    with pytest.raises(ValueError, match="no 'latent_tensor'"):
        load_latent(tmp_path / "bad.latent")
    (tmp_path / "junk.latent").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable .latent"):
        load_latent(tmp_path / "junk.latent")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_diffusers_folder, write_sd15
    root = tmp_path_factory.mktemp("latent_io_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=2)
    write_diffusers_folder(root / "diffusers" / "tiny", kind="sd15", seed=2)
    return root


def test_save_latent_then_load_latent_round_trip(models, tmp_path):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    img = g.add("EmptyImage", width=48, height=40, batch_size=2, color=0x3366CC)
    lat = g.add("VAEEncode", pixels=img, vae=ck[2])
    g.add("SaveLatent", samples=lat, filename_prefix="latents/test")
    out = api.run(g, models=models, output=tmp_path / "out")
    path = tmp_path / "out" / "latents" / "test_00001_.latent"
    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == {"latent_tensor", "latent_format_version_0"}
        assert "prompt" in f.metadata()
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "test.latent").write_bytes(path.read_bytes())
    g2 = api.Graph(precision="f32")
    back = g2.add("LoadLatent", latent="test.latent")
    g2.add("SaveLatent", samples=back, filename_prefix="latents/again")
    out2 = api.run(g2, models=models, input=inp, output=tmp_path / "out")
    assert torch.equal(out2[back.node_id][0].samples, out[lat.node_id][0].samples)
    with pytest.raises(ValidationFailed, match="Invalid latent file"):
        g3 = api.Graph()
        g3.add("SaveLatent", samples=g3.add("LoadLatent", latent="missing.latent"), filename_prefix="x")
        api.run(g3, models=models, input=inp, output=tmp_path / "out")


def test_vae_encode_tiled_matches_plain_encode_when_one_tile_covers_the_image(models, tmp_path):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    img = g.add("EmptyImage", width=64, height=64, batch_size=1, color=0x808040)
    plain = g.add("VAEEncode", pixels=img, vae=ck[2])
    tiled = g.add("VAEEncodeTiled", pixels=img, vae=ck[2], tile_size=512, overlap=64, temporal_size=64,
                  temporal_overlap=8)
    small = g.add("VAEEncodeTiled", pixels=img, vae=ck[2], tile_size=64, overlap=16, temporal_size=64,
                  temporal_overlap=8)
    g.add("SaveLatent", samples=tiled, filename_prefix="a")
    g.add("SaveLatent", samples=small, filename_prefix="b")
    g.add("SaveLatent", samples=plain, filename_prefix="c")
    out = api.run(g, models=models, output=tmp_path)
    a, b, c = (out[n.node_id][0].samples for n in (plain, tiled, small))
    assert a.shape == b.shape == c.shape == (1, 4, 8, 8)
    assert torch.allclose(a, b, atol=1e-5)  # a tile larger than the image is a plain encode
    assert torch.isfinite(c).all()
    assert float((c - a).abs().mean()) < float(a.abs().mean())  # tiles blend into the same latent
    g2 = api.Graph(precision="f32")
    ck = g2.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    img = g2.add("EmptyImage", width=64, height=64, batch_size=1, color=0)
    bad = g2.add("VAEEncodeTiled", pixels=img, vae=ck[2], tile_size=64, overlap=32, temporal_size=64,
                 temporal_overlap=8)
    g2.add("SaveLatent", samples=bad, filename_prefix="d")
    with pytest.raises(Exception, match="overlap 32 must be smaller than half the tile_size 64"):
        api.run(g2, models=models, output=tmp_path)


def test_diffusers_loader_lists_and_loads_a_diffusers_folder(models, tmp_path):
    from mixgraph.nodes.declare.loaders.extra_loader_nodes import list_diffusers
    from mixgraph.graph.env import Env
    assert list_diffusers(Env.from_args(models=str(models))) == ["tiny"]
    g = api.Graph(precision="f32")
    d = g.add("DiffusersLoader", model_path="tiny")
    pos = g.add("CLIPTextEncode", text="a cube", clip=d[1])
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=d[0], seed=1, steps=2, cfg=3.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=pos, latent_image=lat, denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=d[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=models, output=tmp_path)
    model = out[d.node_id][0]
    assert model.kind == "sd1" and model.source.layout == "diffusers_unet"
    assert torch.isfinite(out[dec.node_id][0]).all()


def test_clip_vision_checkpoint_loaders_refuse_at_validation(models, tmp_path):
    # unCLIPCheckpointLoader works now (tests/test_clip_vision.py); the img2vid loader still refuses
    for name in ("ImageOnlyCheckpointLoader",):
        g = api.Graph()
        ck = g.add(name, ckpt_name="sd15.safetensors")
        dec = g.add("VAEDecode", samples=g.add("EmptyLatentImage", width=32, height=32, batch_size=1), vae=ck[2])
        g.add("PreviewImage", images=dec)
        with pytest.raises(ValidationFailed, match="image-only checkpoints .* are not supported yet"):
            api.run(g, models=models, output=tmp_path)


def test_diff_controlnet_loader_adds_the_model_weights_back(models, tmp_path):
    from safetensors.torch import load_file

    from mixgraph.nodes.weights import store
    from mixgraph.nodes.adapters.controlnet import ControlNetModel
    from tests.fixtures.tiny_lora import tiny_controlnet_state_dict
    spec = INFO["DiffControlNetLoader"]
    assert spec["input_order"]["required"] == ["model", "control_net_name"]
    assert spec["output"] == ["CONTROL_NET"] and spec["category"] == "loaders"

    ckpt = load_file(str(models / "checkpoints" / "sd15.safetensors"))
    unet = {k[len("model.diffusion_model."):]: v for k, v in ckpt.items() if k.startswith("model.diffusion_model.")}
    cn = {k[len("control_model."):]: v for k, v in tiny_controlnet_state_dict("sd15", seed=9).items()}
    shared = [k for k in cn if k in unet and unet[k].shape == cn[k].shape]
    assert any(k.startswith("input_blocks.") for k in shared) and "time_embed.0.weight" in shared
    diff = {"control_model." + k: (v - unet[k] if k in shared else v).contiguous() for k, v in cn.items()}
    (models / "controlnet").mkdir(exist_ok=True)
    save_file({**diff, "difference": torch.tensor([])}, str(models / "controlnet" / "diff.safetensors"))
    save_file({"control_model." + k: v for k, v in cn.items()}, str(models / "controlnet" / "plain.safetensors"))

    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    d = g.add("DiffControlNetLoader", model=ck[0], control_net_name="diff.safetensors")
    p = g.add("DiffControlNetLoader", model=ck[0], control_net_name="plain.safetensors")
    pos = g.add("CLIPTextEncode", text="a cube", clip=ck[1])
    img = g.add("EmptyImage", width=32, height=32, batch_size=1, color=0xFFFFFF)
    c1 = g.add("ControlNetApply", conditioning=pos, control_net=d, image=img, strength=1.0)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=ck[0], seed=1, steps=1, cfg=1.0, sampler_name="euler", scheduler="normal",
               positive=c1, negative=pos, latent_image=lat, denoise=1.0)
    g.add("SaveLatent", samples=ks, filename_prefix="cn")
    c2 = g.add("ControlNetApply", conditioning=pos, control_net=p, image=img, strength=1.0)
    ks2 = g.add("KSampler", model=ck[0], seed=1, steps=1, cfg=1.0, sampler_name="euler", scheduler="normal",
                positive=c2, negative=pos, latent_image=lat, denoise=1.0)
    g.add("SaveLatent", samples=ks2, filename_prefix="cn2")
    out = api.run(g, models=models, output=tmp_path)
    with torch.inference_mode():
        for node, want in ((d, cn), (p, cn)):
            h = out[node.node_id][0]
            m = store.materialize("controlnet", h.source, h.config, torch.float32, h.patches, ControlNetModel)
            got = m.state_dict()
            for k in want:
                assert torch.allclose(got[k], want[k], atol=1e-6), k
    # the diff ControlNet on its base model steers sampling exactly as the full ControlNet
    assert torch.allclose(out[ks.node_id][0].samples, out[ks2.node_id][0].samples, rtol=1e-5, atol=1e-3)
