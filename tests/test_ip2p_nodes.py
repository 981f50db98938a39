"""InstructPixToPixConditioning: ComfyUI's spec, the crop, the concat an 8-channel
instruct-pix2pix model gets, and a tiny 8-channel model sampling end to end."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.conditioning.ip2p_nodes import crop_to_multiple_of_8
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.ui import api


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("ip2p_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "ip2p.safetensors", seed=4, instruct=True)
    return root


def test_instruct_pix2pix_conditioning_spec_matches_comfyui():
    info = api.default_registry().object_info()["InstructPixToPixConditioning"]
    assert list(info["input"]["required"]) == ["positive", "negative", "vae", "pixels"]
    assert info["category"] == "conditioning/instructpix2pix"
    assert info["output"] == ["CONDITIONING", "CONDITIONING", "LATENT"]
    assert info["output_name"] == ["positive", "negative", "latent"]


def test_crop_to_multiple_of_8_keeps_the_centre():
    pixels = torch.arange(21 * 19, dtype=torch.float32).reshape(1, 21, 19, 1)
    out = crop_to_multiple_of_8(pixels)
    # H 21 -> 16 from row (21 % 8) // 2 = 2; W 19 -> 16 from column (19 % 8) // 2 = 1
    assert out.shape == (1, 16, 16, 1)
    assert torch.equal(out, pixels[:, 2:18, 1:17])
    same = torch.zeros(1, 16, 24, 3)
    assert crop_to_multiple_of_8(same) is same


def _runner(models, tmp_path):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="ip2p.safetensors")
    empty = g.add("EmptyLatentImage", width=16, height=16, batch_size=1)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=empty, vae=ckpt[2]))
    handle = api.run(g, models=models, output=tmp_path)[ckpt.node_id][0]
    assert handle.config.in_channels == 8
    return handle.runner(parse_spec("f32"))


def test_ip2p_concat_is_the_raw_image_latent_resized_to_the_sample(models, tmp_path):
    runner = _runner(models, tmp_path)
    image = torch.arange(32, dtype=torch.float32).reshape(1, 4, 2, 4)
    latent = torch.randn(2, 4, 2, 2)
    cond = Cond(torch.zeros(1, 77, 32), concat_latent=image)
    plain = Cond(torch.zeros(1, 77, 32))
    d = CFGDenoiser(runner, (cond,), (plain,), 2.0, latent)
    # aspect 2:1 -> 1:1 centre crop keeps columns 1..2; same size, so no resize; batch repeated;
    # SD1.x ip2p takes the latent as encoded (no 0.18215 scale)
    want = image[..., 1:3].repeat(2, 1, 1, 1)
    assert torch.equal(d.lists[0][0].concat, want)
    assert torch.equal(d.lists[1][0].concat, torch.zeros_like(latent))  # no image: zeros
    resized = CFGDenoiser(runner, (cond,), (plain,), 2.0, torch.randn(1, 4, 4, 4)).lists[0][0].concat
    # 2x2 centre crop upscaled bilinearly (align_corners=False) to 4x4: corners keep the values
    crop = image[..., 1:3]
    assert resized.shape == (1, 4, 4, 4)
    assert torch.allclose(resized[..., 0, 0], crop[..., 0, 0])
    assert torch.allclose(resized[..., 3, 3], crop[..., 1, 1])
    assert torch.allclose(resized[0, 0, 0, 1], crop[0, 0, 0, 0] * 0.75 + crop[0, 0, 0, 1] * 0.25)


def _graph(instruct: bool):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="ip2p.safetensors")
    img = g.add("EmptyImage", width=36, height=30, batch_size=1, color=0x3366CC)
    pos = g.add("CLIPTextEncode", text="make it blue", clip=ckpt[1])
    neg = g.add("CLIPTextEncode", text="", clip=ckpt[1])
    ip = g.add("InstructPixToPixConditioning", positive=pos, negative=neg, vae=ckpt[2], pixels=img)
    enc = g.add("VAEEncode", pixels=g.add("EmptyImage", width=32, height=24, batch_size=1,
                                          color=0x3366CC), vae=ckpt[2])
    g.add("PreviewImage", images=g.add("VAEDecode", samples=enc, vae=ckpt[2]))
    p, n = (ip[0], ip[1]) if instruct else (pos, neg)
    ks = g.add("KSampler", model=ckpt[0], seed=5, steps=2, cfg=3.0, sampler_name="euler",
               scheduler="normal", positive=p, negative=n, latent_image=ip[2], denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ckpt[2]))
    return g, ip, enc, ks


def test_instruct_pix2pix_conditioning_samples_an_8_channel_model(models, tmp_path):
    g, ip, enc, ks = _graph(instruct=True)
    out = api.run(g, models=models, output=tmp_path)
    (p,), (n,), lat = out[ip.node_id]
    want = out[enc.node_id][0].samples          # the same colour, cropped 36x30 -> 32x24
    assert lat.samples.shape == (1, 4, 3, 4) and not lat.samples.any()
    assert torch.allclose(p.concat_latent, want, atol=1e-5) and p.concat_latent is n.concat_latent
    assert p.concat_mask is None
    sampled = out[ks.node_id][0].samples
    assert torch.isfinite(sampled).all()
    g2, _, _, ks2 = _graph(instruct=False)      # without the image the model sees zeros
    other = api.run(g2, models=models, output=tmp_path)[ks2.node_id][0].samples
    assert not torch.allclose(sampled, other, atol=1e-4)
