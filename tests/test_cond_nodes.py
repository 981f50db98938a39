"""comfy_extras/nodes_cond.py: CLIPTextEncodeControlnet (a text only the ControlNet reads),
SaveConditioning / ConditioningLoader (ComfyUI's safetensors conditioning files), on tiny models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.weights import cond_file
from mixgraph.nodes.models import loader
from mixgraph.nodes.adapters.controlnet import ControlNetChain
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.workflow_models import write_controlnet

F32 = parse_spec("f32")
INFO = api.default_registry().object_info()


def rand_tensor(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    write_controlnet(root / "controlnet" / "cn.safetensors", seed=6)
    return root


def test_cond_nodes_specs_match_comfyui():
    te = INFO["CLIPTextEncodeControlnet"]
    assert te["input_order"] == {"required": ["clip", "conditioning", "text"]}
    assert te["input"]["required"]["text"] == ["STRING", {"default": "", "multiline": True, "dynamicPrompts": True}]
    assert te["output"] == ["CONDITIONING"] and te["category"] == "model/conditioning"
    assert te["display_name"] == "CLIP Text Encode (Controlnet)"
    sc = INFO["SaveConditioning"]
    assert sc["input_order"] == {"required": ["conditioning", "filename_prefix"]}
    assert sc["input"]["required"]["filename_prefix"] == ["STRING", {"default": "conditioning/ComfyUI"}]
    assert sc["output"] == ["CONDITIONING"] and sc["output_name"] == ["conditioning"] and sc["output_node"]
    cl = INFO["ConditioningLoader"]
    assert cl["input_order"] == {"required": ["conditioning_name"]}
    assert cl["output"] == ["CONDITIONING"] and cl["category"] == "model/loaders"
    assert cl["display_name"] == "Load Conditioning"


# --- CLIPTextEncodeControlnet: the ControlNet's context -------------------------------------------

class _Recording:
    """A real ControlNet that remembers the context it was called with."""

    def __init__(self, net):
        self.net, self.contexts = net, []

    def __call__(self, x, hint, t, context, y):
        self.contexts.append(context.clone())
        return self.net(x, hint, t, context, y)


@pytest.fixture(scope="module")
def unet_and_net(models):
    model, _, _ = loader.load_checkpoint(models / "checkpoints" / "sd15.safetensors")
    net = loader.load_controlnet(models / "controlnet" / "cn.safetensors").runner(F32)
    return model.runner(F32), net


def _denoise(runner, positive, negative, cfg=3.0):
    x = rand_tensor(1, 4, 8, 8, seed=1) * 3.0
    den = CFGDenoiser(runner, positive, negative, cfg, torch.zeros(1, 4, 8, 8))
    with torch.no_grad():
        return den(x, torch.tensor([3.0]))


def test_controlnet_text_is_the_context_the_controlnet_reads(unet_and_net):
    runner, net = unet_and_net
    text, cn_text, neg = rand_tensor(1, 77, 32, seed=2), rand_tensor(1, 77, 32, seed=3), rand_tensor(1, 77, 32, seed=4)
    rec = _Recording(net)
    chain = ControlNetChain(rec, torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(5)))
    plain = (Cond(text, control=chain),), (Cond(neg, control=chain),)
    with_cn = (Cond(text, control=chain, controlnet_cross_attn=cn_text),), (Cond(neg, control=chain),)
    base = _denoise(runner, *plain)
    rec.contexts.clear()
    steered = _denoise(runner, *with_cn)
    # the positive (own ControlNet text) and the negative (its cross_attn) run as two UNet batches
    assert len(rec.contexts) == 2
    assert any(torch.equal(c, cn_text) for c in rec.contexts)
    assert any(torch.equal(c, neg) for c in rec.contexts)
    assert not any(torch.equal(c, text) for c in rec.contexts)
    assert (steered - base).abs().max() > 1e-4
    # the same text for the ControlNet as for the UNet is the plain cond (up to the rounding of
    # running the two sides as separate batches)
    same = (Cond(text, control=chain, controlnet_cross_attn=text),), (Cond(neg, control=chain),)
    torch.testing.assert_close(_denoise(runner, *same), base, rtol=0, atol=1e-4)


def test_controlnet_text_changes_nothing_without_a_controlnet(unet_and_net):
    runner, _ = unet_and_net
    text, cn_text, neg = rand_tensor(1, 77, 32, seed=2), rand_tensor(1, 77, 32, seed=3), rand_tensor(1, 77, 32, seed=4)
    base = _denoise(runner, (Cond(text),), (Cond(neg),))
    got = _denoise(runner, (Cond(text, controlnet_cross_attn=cn_text),), (Cond(neg),))
    assert torch.equal(got, base)


def _controlnet_graph(models, tmp_path, *, cn_text: str | None, with_controlnet: bool = True):
    (tmp_path / "in").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 30, 90)).save(tmp_path / "in" / "hint.png")
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    pos = g.add("CLIPTextEncode", text="a red cube", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="blurry", clip=ck[1])
    if with_controlnet:
        cn = g.add("ControlNetLoader", control_net_name="cn.safetensors")
        ap = g.add("ControlNetApplyAdvanced", positive=pos, negative=neg, control_net=cn,
                   image=g.add("LoadImage", image="hint.png"), strength=1.0, start_percent=0.0, end_percent=1.0)
        pos, neg = ap[0], ap[1]
    if cn_text is not None:
        pos = g.add("CLIPTextEncodeControlnet", clip=ck[1], conditioning=pos, text=cn_text)
    ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=4.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1),
               denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=ck[2])
    g.add("PreviewImage", images=dec)
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    return out[ks.node_id][0].samples, out[dec.node_id][0]


def test_clip_text_encode_controlnet_end_to_end(models, tmp_path):
    plain, _ = _controlnet_graph(models, tmp_path, cn_text=None)
    steered, image = _controlnet_graph(models, tmp_path, cn_text="a blue sphere")
    assert torch.isfinite(image).all()
    assert (steered - plain).abs().max() > 1e-4
    # the prompt's own text for the ControlNet: the plain result
    same, _ = _controlnet_graph(models, tmp_path, cn_text="a red cube")
    torch.testing.assert_close(same, plain, rtol=0, atol=1e-5)
    # no ControlNet: the ControlNet text changes nothing
    no_cn, _ = _controlnet_graph(models, tmp_path, cn_text=None, with_controlnet=False)
    no_cn_text, _ = _controlnet_graph(models, tmp_path, cn_text="a blue sphere", with_controlnet=False)
    assert torch.equal(no_cn, no_cn_text)


# --- SaveConditioning / ConditioningLoader --------------------------------------------------------

def test_save_conditioning_writes_comfyui_format(tmp_path):
    c = Cond(rand_tensor(1, 77, 32, seed=1), pooled=rand_tensor(1, 32, seed=2), mask=torch.rand(1, 8, 8), mask_strength=0.5,
             timestep_range=(0.25, 0.75), size=SizeCond(width=1024, height=768, crop_w=8),
             controlnet_cross_attn=rand_tensor(1, 77, 32, seed=3), controlnet_pooled=rand_tensor(1, 32, seed=4))
    path = tmp_path / "c.safetensors"
    cond_file.save_conditioning(path, (c,))
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
        assert torch.equal(f.get_tensor("conditioning"), c.cross_attn)
        assert torch.equal(f.get_tensor("pooled_output"), c.pooled)
    assert keys == {"conditioning", "pooled_output", "mask", "cross_attn_controlnet", "pooled_output_controlnet"}
    assert set(meta) == {"conditioning_options"}
    assert json.loads(meta["conditioning_options"]) == {
        "mask_strength": 0.5, "set_area_to_bounds": False, "start_percent": 0.25, "end_percent": 0.75,
        "width": 1024, "height": 768, "crop_w": 8, "crop_h": 0}
    (back,), ignored = cond_file.load_conditioning(path)
    assert ignored == []
    for field in ("cross_attn", "pooled", "mask", "controlnet_cross_attn", "controlnet_pooled"):
        assert torch.equal(getattr(back, field), getattr(c, field)), field
    assert (back.mask_strength, back.timestep_range, back.size) == (0.5, (0.25, 0.75), c.size)


def test_conditioning_loader_reads_a_comfyui_file_with_lists_and_foreign_options(tmp_path):
    cross = rand_tensor(1, 154, 32, seed=1)
    path = tmp_path / "foreign.safetensors"
    save_file({"conditioning": cross, "pooled_output": rand_tensor(1, 32, seed=2), "reference_latents.0": torch.ones(1, 4, 2, 2),
               "reference_latents.1": torch.zeros(1, 4, 2, 2)}, str(path),
              metadata={"conditioning_options": json.dumps({"strength": 0.8, "guidance": 3.5})})
    (c,), ignored = cond_file.load_conditioning(path)
    assert torch.equal(c.cross_attn, cross) and c.strength == 0.8 and c.pooled.shape == (1, 32)
    assert ignored == ["guidance", "reference_latents"]


def test_save_conditioning_refuses_what_comfyui_cannot_save(tmp_path):
    one = Cond(rand_tensor(1, 77, 32))
    with pytest.raises(cond_file.CondFileError, match="single conditioning entry"):
        cond_file.save_conditioning(tmp_path / "x.safetensors", (one, one))
    with pytest.raises(cond_file.CondFileError, match="'area'"):
        cond_file.save_conditioning(tmp_path / "x.safetensors", (Cond(one.cross_attn, area=(8, 8, 0, 0)),))
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("content, why", [(b"not a safetensors file at all", "not a readable safetensors"),
                                          (None, "no 'conditioning' tensor")])
def test_conditioning_loader_bad_file_names_the_file(tmp_path, content, why):
    path = tmp_path / "bad.safetensors"
    if content is None:
        save_file({"emb_params": torch.zeros(2, 32)}, str(path))  # a textual-inversion embedding
    else:
        path.write_bytes(content)
    with pytest.raises(cond_file.CondFileError, match=why) as err:
        cond_file.load_conditioning(path)
    assert str(path) in str(err.value)


def test_save_and_load_conditioning_round_trip_through_the_engine(models, tmp_path):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    enc = g.add("CLIPTextEncode", text="a red cube", clip=ck[1])
    rng = g.add("ConditioningSetTimestepRange", conditioning=enc, start=0.1, end=0.9)
    save = g.add("SaveConditioning", conditioning=rng, filename_prefix="conditioning/cube")
    out = api.run(g, models=models, output=tmp_path / "out")
    written = tmp_path / "out" / "conditioning" / "cube_00001_.safetensors"
    assert written.is_file()
    (encoded,) = out[save.node_id][0]

    models2 = tmp_path / "models2"
    shutil.copytree(models, models2)
    (models2 / "embeddings").mkdir()
    shutil.copy(written, models2 / "embeddings" / "cube.safetensors")
    (models2 / "embeddings" / "broken.safetensors").write_bytes(b"\x00" * 20)
    g2 = api.Graph(precision="f32")
    load = g2.add("ConditioningLoader", conditioning_name="cube.safetensors")
    g2.add("PreviewAny", source=load)
    (loaded,) = api.run(g2, models=models2, output=tmp_path / "out")[load.node_id][0]
    assert torch.equal(loaded.cross_attn, encoded.cross_attn) and torch.equal(loaded.pooled, encoded.pooled)
    assert loaded.timestep_range == pytest.approx((0.1, 0.9))

    # sampling from the loaded conditioning is sampling from the encoded one
    def sample(cond_node, graph):
        ck2 = graph.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
        neg = graph.add("CLIPTextEncode", text="", clip=ck2[1])
        ks = graph.add("KSampler", model=ck2[0], seed=1, steps=2, cfg=3.0, sampler_name="euler",
                       scheduler="normal", positive=cond_node, negative=neg,
                       latent_image=graph.add("EmptyLatentImage", width=64, height=64, batch_size=1), denoise=1.0)
        graph.add("PreviewImage", images=graph.add("VAEDecode", samples=ks, vae=ck2[2]))
        return ks
    ga = api.Graph(precision="f32")
    ka = sample(ga.add("ConditioningSetTimestepRange", conditioning=ga.add(
        "CLIPTextEncode", text="a red cube", clip=ga.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")[1]),
        start=0.1, end=0.9), ga)
    gb = api.Graph(precision="f32")
    kb = sample(gb.add("ConditioningLoader", conditioning_name="cube.safetensors"), gb)
    a = api.run(ga, models=models2, output=tmp_path / "out")[ka.node_id][0].samples
    b = api.run(gb, models=models2, output=tmp_path / "out")[kb.node_id][0].samples
    assert torch.equal(a, b)

    g3 = api.Graph(precision="f32")
    g3.add("PreviewAny", source=g3.add("ConditioningLoader", conditioning_name="broken.safetensors"))
    with pytest.raises(Exception, match="broken.safetensors"):
        api.run(g3, models=models2, output=tmp_path / "out")
