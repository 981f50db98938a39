"""T2I-Adapters through ControlNetLoader: detection and sizes from the header, the features against
diffusers' T2IAdapter (SD and SDXL layouts), where they enter the UNet (main path after input
block k, SDXL's last one after the middle block), and ControlNetApplyAdvanced sampling with one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models.loader import load_controlnet
from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict
from mixgraph.nodes.adapters.t2i_adapter import T2IAdapter, T2IAdapterHandle, T2IConfig
from mixgraph.nodes.families.sd.unet import UNetConfig, UNetModel, timestep_embedding
from mixgraph.nodes.payloads.conditioning import Control
from mixgraph.ui import api

F32 = parse_spec("f32")
# an SD1-shaped tiny UNet: 4 levels of 2 ResBlocks, so input blocks 2, 5, 8, 11 end each level
UNET = UNetConfig(model_channels=32, channel_mult=(1, 2, 4, 4), num_res_blocks=(2, 2, 2, 2),
                  transformer_depth=(1, 1, 0, 0, 0, 0, 0, 0), transformer_depth_output=(0,) * 9 + (1, 1, 1),
                  transformer_depth_middle=0, context_dim=32, num_heads=8)


def _diffusers_adapter(kind: str, seed: int):
    from diffusers import T2IAdapter as Ref

    torch.manual_seed(seed)
    factor = 16 if kind == "full_adapter_xl" else 8
    ref = Ref(in_channels=3, channels=[32, 64, 128, 128], num_res_blocks=2, downscale_factor=factor,
              adapter_type=kind).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))  # no zero-initialised layers
    return ref


@pytest.mark.parametrize("kind", ["full_adapter", "full_adapter_xl"])
def test_t2i_adapter_features_match_diffusers(kind, tmp_path):
    ref = _diffusers_adapter(kind, seed=1)
    path = tmp_path / "adapter.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    handle = load_controlnet(path)
    assert isinstance(handle, T2IAdapterHandle) and handle.diffusers
    xl = kind == "full_adapter_xl"
    assert handle.config.xl == xl and handle.config.channels == (32, 64, 128, 128) and handle.config.ksize == 1
    size = 128 if xl else 64
    hint = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats, mid = handle.runner(F32)(hint)
        expected = ref(hint)
    got = [f for f in feats if f is not None] + ([mid] if mid is not None else [])
    assert len(got) == 4
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    slots = [i for i, f in enumerate(feats) if f is not None]
    assert slots == ([3, 5, 8] if xl else [2, 5, 8, 11]) and (mid is not None) == xl


def test_t2i_light_adapter_loads_from_its_own_layout(tmp_path):
    cfg = T2IConfig("light", cin=192, channels=(32, 64, 128, 128), nums_rb=2)
    save_file(random_state_dict(module_shapes(lambda: T2IAdapter(cfg)), 3), str(tmp_path / "light.safetensors"))
    handle = load_controlnet(tmp_path / "light.safetensors")
    assert handle.config == cfg and handle.config.input_channels == 3
    feats, mid = handle.runner(F32)(torch.rand(1, 3, 64, 64))
    assert [tuple(f.shape[1:]) for f in feats if f is not None] == [(32, 8, 8), (64, 4, 4), (128, 2, 2), (128, 1, 1)]


def test_unet_adds_input_path_features_after_their_block():
    with torch.device("meta"):
        model = UNetModel(UNET)
    model.load_state_dict(random_state_dict(module_shapes(lambda: UNetModel(UNET)), 4), assign=True)
    model.eval()
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    t, ctx = torch.tensor([500.0]), torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(6))
    feat = torch.randn(1, 64, 4, 4, generator=torch.Generator().manual_seed(7))
    path = [None] * 12
    path[5] = feat
    with torch.no_grad():
        got = model(x, t, ctx, control=Control(input=[], input_path=path))
        # the same as adding it to input block 5's output by hand: run the blocks up to 5 ...
        emb = model.time_embed(timestep_embedding(t, 32))
        h, hs = x, []
        for i, block in enumerate(model.input_blocks):
            h = block(h, emb, ctx)
            if i == 5:
                h = h + feat
            hs.append(h)
        h = model.middle_block(h, emb, ctx)
        for i, block in enumerate(model.output_blocks):
            h = torch.cat([h, hs.pop()], dim=1)
            h = block(h, emb, ctx, hs[-1].shape[-2:] if hs else None)
        expected = model.out(h)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import UNET_PREFIX, VAE_PREFIX, with_prefix, save_state_dict, tiny_vae_state_dict
    from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
    root = tmp_path_factory.mktemp("t2i_models")
    sd = with_prefix(UNET_PREFIX, random_state_dict(module_shapes(lambda: UNetModel(UNET)), 8))
    sd |= with_prefix(VAE_PREFIX, tiny_vae_state_dict(9))
    sd |= with_prefix("cond_stage_model.transformer.", tiny_clip_l_state_dict(10, width=32))
    save_state_dict(root / "checkpoints" / "sd1_4level.safetensors", sd)
    cfg = T2IConfig("full", cin=192, channels=(32, 64, 128, 128), nums_rb=2, ksize=3, use_conv=True)
    save_state_dict(root / "controlnet" / "t2i_tiny.safetensors", random_state_dict(module_shapes(lambda: T2IAdapter(cfg)), 11))
    return root


def _sample(models, tmp_path, strength):
    from PIL import Image
    (tmp_path / "in").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 30, 90)).save(tmp_path / "in" / "hint.png")
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd1_4level.safetensors")
    cn = g.add("ControlNetLoader", control_net_name="t2i_tiny.safetensors")
    pos = g.add("CLIPTextEncode", text="a road", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    ap = g.add("ControlNetApplyAdvanced", positive=pos, negative=neg, control_net=cn,
               image=g.add("LoadImage", image="hint.png"), strength=strength, start_percent=0.0, end_percent=1.0)
    ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=ap[0], negative=ap[1], latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1),
               denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    return out[cn.node_id][0], out[ks.node_id][0].samples


def test_controlnet_loader_and_apply_sample_with_a_t2i_adapter(models, tmp_path):
    handle, steered = _sample(models, tmp_path, 1.0)
    assert isinstance(handle, T2IAdapterHandle) and handle.config.use_conv
    _, plain = _sample(models, tmp_path, 0.0)
    assert torch.isfinite(steered).all() and (steered - plain).abs().max() > 1e-4
