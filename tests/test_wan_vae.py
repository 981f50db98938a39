"""The Wan video VAEs (nodes/vae/wan_vae.py, wan_arch.py): parity with diffusers' AutoencoderKLWan
(Wan 2.1 and 2.2 configs) and AutoencoderKLQwenImage on tiny seeded weights in the original Wan key
layout, ComfyUI's shapes and frame handling (comfy/sd.py VAE with latent_dim 3), loading by keys
and shapes, VAELoader -> VAEEncode -> VAEDecode (and the tiled nodes) through the engine, bounded
memory over frames, and the memory estimate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families.refused import detect_family
from mixgraph.nodes.models.loader import load_vae
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT, WAN22_LATENT
from mixgraph.nodes.vae.wan_arch import WAN_ARCH, wan_latent_format
from mixgraph.nodes.vae.tiled_nd import tiled_nd
from mixgraph.nodes.vae.wan_vae import WanVAE, WanVAEConfig, decoded_frames
from mixgraph.nodes.weights.safetensors_io import inspect_file
from mixgraph.ui import api
from tests.fixtures.tiny_wan_vae import (WAN21_TINY, WAN22_TINY, diffusers_kwargs, to_diffusers_key,
                                        wan_vae_state_dict, write_wan_vae)

F32 = parse_spec("f32")
CONFIGS = {"wan21": WAN21_TINY, "wan22": WAN22_TINY}


def _ours(cfg: WanVAEConfig, seed: int = 0) -> WanVAE:
    m = WanVAE(cfg)
    m.load_state_dict(wan_vae_state_dict(cfg, seed))
    return m.eval()


def _diffusers(cfg: WanVAEConfig, seed: int = 0, qwen: bool = False):
    from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan

    if qwen:
        ref = AutoencoderKLQwenImage(base_dim=cfg.dim, z_dim=cfg.z_dim, dim_mult=list(cfg.dim_mult),
                                     num_res_blocks=cfg.num_res_blocks, temperal_downsample=list(cfg.temporal_down),
                                     latents_mean=[0.0] * cfg.z_dim, latents_std=[1.0] * cfg.z_dim)
    else:
        ref = AutoencoderKLWan(**diffusers_kwargs(cfg))
    sd = {to_diffusers_key(k, cfg): v for k, v in wan_vae_state_dict(cfg, seed).items()}
    assert set(sd) == set(ref.state_dict())   # the test-side key map covers every tensor
    ref.load_state_dict(sd)
    return ref.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# --------------------------------------------------------------------------------------------
# parity with diffusers


@pytest.mark.parametrize("name,qwen", [("wan21", False), ("wan22", False), ("wan21", True)])
def test_encode_and_decode_match_diffusers_over_several_chunks(name, qwen):
    cfg = CONFIGS[name]
    ours, ref = _ours(cfg), _diffusers(cfg, qwen=qwen)
    side = 2 * cfg.downscale
    x = torch.rand(1, 3, 9, side, side, generator=torch.Generator().manual_seed(1)) * 2 - 1  # 1 + 4 + 4 frames
    with torch.no_grad():
        mean = ours.encode(x)
        want = ref.encode(x).latent_dist.mean
        assert mean.shape == want.shape == (1, cfg.z_dim, 3, 2, 2)
        assert _rel(mean, want) < 1e-4
        z = torch.randn(1, cfg.z_dim, 3, 2, 2, generator=torch.Generator().manual_seed(2))
        pixels = ours.decode(z)
        want = ref.decode(z).sample          # diffusers clamps to [-1, 1]
        assert pixels.shape == want.shape == (1, 3, 9, side, side)
        assert _rel(pixels.clamp(-1, 1), want) < 1e-4


def test_config_from_shapes_and_latent_formats():
    for cfg in CONFIGS.values():
        assert WanVAEConfig.from_state_dict(wan_vae_state_dict(cfg)) == cfg
    with torch.device("meta"):  # the full-size layouts ComfyUI builds (dim 96 / 160, dec_dim 256)
        full21 = {k: v for k, v in WanVAE(WanVAEConfig()).state_dict().items()}
        cfg22 = WanVAEConfig(dim=160, dec_dim=256, z_dim=48, residual=True, patch=2)
        full22 = {k: v for k, v in WanVAE(cfg22).state_dict().items()}
    assert WanVAEConfig.from_state_dict(full21) == WanVAEConfig()
    assert WanVAEConfig.from_state_dict(full22) == cfg22
    assert "decoder.upsamples.0.upsamples.0.residual.2.weight" in full22   # ComfyUI's 2.2 marker
    assert wan_latent_format(WanVAEConfig()) is WAN21_LATENT
    assert wan_latent_format(cfg22) is WAN22_LATENT
    assert (WanVAEConfig().downscale, cfg22.downscale) == (8, 16)


# --------------------------------------------------------------------------------------------
# handle: ComfyUI's shapes


@pytest.fixture(scope="module")
def vae_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("wanvae")
    return {name: write_wan_vae(root / f"{name}.safetensors", cfg, seed=3) for name, cfg in CONFIGS.items()}


def test_loader_detects_the_wan_files_by_keys_and_shapes(vae_files):
    for name, path in vae_files.items():
        vae = load_vae(path)
        assert vae.arch == "wan" and vae.config == CONFIGS[name]
        assert vae.latent_channels == CONFIGS[name].z_dim and vae.downscale == CONFIGS[name].downscale
        assert detect_family(inspect_file(path)) is None   # no longer refused as "Wan"


def test_encode_frames_as_comfyui(vae_files):
    """[N, H, W, 3] is one video [1, 3, N, H, W]; frames past 1 + 4k are dropped; H, W cropped."""
    vae = load_vae(vae_files["wan21"])
    g = torch.Generator().manual_seed(4)
    frames = torch.rand(7, 20, 18, 3, generator=g)          # 7 frames: 1 + 4 used, 2 dropped
    latent = vae.encode(frames, F32)
    assert latent.shape == (1, 4, 2, 2, 2)
    want = _ours(WAN21_TINY, 3).encode(frames[:5, 2:18, 1:17].permute(3, 0, 1, 2)[None] * 2 - 1)
    assert torch.allclose(latent, want, atol=1e-6)
    single = vae.encode(frames[:1], F32)                    # Qwen-Image: one image, one latent frame
    assert single.shape == (1, 4, 1, 2, 2)
    assert torch.allclose(single, latent[:, :, :1], atol=1e-6)  # causal: the first frame alone


def test_decode_joins_batch_and_frames_and_takes_4d_latents(vae_files):
    vae = load_vae(vae_files["wan22"])
    z = torch.randn(2, 6, 3, 2, 2, generator=torch.Generator().manual_seed(5))
    image = vae.decode(z, F32)
    assert image.shape == (2 * 9, 32, 32, 3)
    with torch.no_grad():
        want = ((_ours(WAN22_TINY, 3).decode(z[1:]) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)
    assert torch.allclose(image[9:], want, atol=1e-6)
    flat = vae.decode(z[:, :, 0], F32)                      # [B, C, h, w]: B one-frame videos
    assert flat.shape == (2, 32, 32, 3)
    assert torch.allclose(flat, image[::9], atol=1e-6)


def test_tiled_decode_and_encode_follow_comfyui(vae_files):
    vae = load_vae(vae_files["wan21"])
    z = torch.randn(1, 4, 5, 6, 6, generator=torch.Generator().manual_seed(6))
    whole = vae.decode(z, F32)
    one_tile = vae.decode_tiled(z, F32, tile_size=64, overlap=0, temporal_size=64, temporal_overlap=8)
    assert torch.allclose(one_tile, whole, atol=1e-6)
    tiled = vae.decode_tiled(z, F32, tile_size=32, overlap=8, temporal_size=8, temporal_overlap=4)
    assert tiled.shape == whole.shape == (17, 48, 48, 3) and torch.isfinite(tiled).all()
    frames = torch.rand(9, 48, 48, 3, generator=torch.Generator().manual_seed(7))
    enc = vae.encode_tiled(frames, F32, tile_size=32, overlap=8, temporal_size=8, temporal_overlap=4)
    assert enc.shape == vae.encode(frames, F32).shape == (1, 4, 3, 6, 6)


def test_tiled_nd_blend_is_exact_for_a_local_decoder():
    """A stand-in decoder whose output at frame j, pixel (y, x) depends only on latent frame
    ceil(j/4), pixel (y/f, x/f) (as a causal decoder's first frame of a tile, frame 4·pos, is latent
    frame pos's): 3-D tiling with ComfyUI's index formulas reproduces the whole decode exactly."""
    f = 8

    def local(z):   # [B, C, T, h, w] -> [B, 3, 4T-3, h·f, w·f]
        up = z[:, :3].repeat_interleave(f, 3).repeat_interleave(f, 4)
        return torch.cat([up[:, :, :1], up[:, :, 1:].repeat_interleave(4, 2)], dim=2)

    z = torch.randn(1, 4, 7, 9, 10, generator=torch.Generator().manual_seed(9))
    whole = local(z)
    for tile, overlap in (((3, 4, 4), (1, 1, 1)), ((2, 5, 3), (1, 2, 1)), ((4, 9, 10), (2, 0, 0))):
        got = tiled_nd(z, local, tile, overlap, size=(decoded_frames, lambda n: n * f, lambda n: n * f),
                       pos=(lambda p: 4 * p, lambda p: p * f, lambda p: p * f), out_channels=3)
        assert torch.allclose(got, whole, atol=1e-5), (tile, overlap)


def test_out_of_memory_falls_back_to_tiles(vae_files, monkeypatch):
    """ComfyUI's fallback: 256-pixel tiles, all frames at once (one tile here: the same result)."""
    from mixgraph.nodes.vae.wan_arch import WanArch

    vae = load_vae(vae_files["wan21"])
    z = torch.randn(1, 4, 3, 2, 2, generator=torch.Generator().manual_seed(11))
    frames = torch.rand(5, 16, 16, 3, generator=torch.Generator().manual_seed(12))
    want_image, want_latent = vae.decode(z, F32), vae.encode(frames, F32)

    def oom(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(WanArch, "_decode_frames", staticmethod(oom))
    assert torch.allclose(vae.decode(z, F32), want_image, atol=1e-6)
    encode = WanVAE.encode
    calls = []

    def encode_once_oom(self, x):
        calls.append(x.shape)
        if len(calls) == 1:
            oom()
        return encode(self, x)

    monkeypatch.setattr(WanVAE, "encode", encode_once_oom)
    assert torch.allclose(vae.encode(frames, F32), want_latent, atol=1e-6)
    assert len(calls) == 2


def test_bf16_storage_runs_close_to_f32(vae_files):
    vae = load_vae(vae_files["wan21"])
    z = torch.randn(1, 4, 2, 2, 2, generator=torch.Generator().manual_seed(8))
    got = vae.decode(z, parse_spec("bf16"))
    want = vae.decode(z, F32)
    assert got.dtype == torch.float32 and (got - want).abs().max() < 0.05


@pytest.mark.parametrize("name,qwen", [("wan21", False), ("wan22", False), ("wan21", True)])
def test_diffusers_folders_load_in_their_layout(tmp_path, name, qwen):
    """A diffusers pipeline's vae/ (AutoencoderKLWan / AutoencoderKLQwenImage) loads through the
    key layout and decodes as the original-layout file does."""
    cfg = CONFIGS[name]
    _diffusers(cfg, seed=3, qwen=qwen).save_pretrained(tmp_path / "pipe" / "vae")
    vae = load_vae(tmp_path / "pipe")
    assert vae.arch == "wan" and vae.config == cfg and vae.source.layout == "diffusers_wan_vae"
    z = torch.randn(1, cfg.z_dim, 2, 2, 2, generator=torch.Generator().manual_seed(10))
    with torch.inference_mode():
        got = vae.decode(z, F32)
        want = load_vae(write_wan_vae(tmp_path / "orig.safetensors", cfg, seed=3)).decode(z, F32)
    assert torch.equal(got, want)


# --------------------------------------------------------------------------------------------
# memory over frames


def test_decode_activations_do_not_grow_with_frames():
    """The largest intermediate of a decode covers one chunk (<= 4 frames at the output): it is
    the same for 3 and 12 latent frames."""
    m = _ours(WAN21_TINY)
    largest = {}

    def hook(_mod, _inp, out):
        if isinstance(out, torch.Tensor):
            largest["n"] = max(largest["n"], out.numel())

    handles = [mod.register_forward_hook(hook) for mod in m.decoder.modules() if mod is not m.decoder]
    try:
        for frames in (3, 12):
            largest["n"] = 0
            with torch.no_grad():
                out = m.decode(torch.randn(1, 4, frames, 4, 4))
            largest[frames] = largest["n"]
            assert out.shape[2] == 1 + 4 * (frames - 1)
    finally:
        for h in handles:
            h.remove()
    assert largest[12] == largest[3]
    assert largest[12] <= 8 * 4 * 32 * 32 * 4   # widest layer x 4 frames x full size (not x 45 frames)


def test_encode_activations_do_not_grow_with_frames():
    m = _ours(WAN22_TINY)
    largest = {}

    def hook(_mod, _inp, out):
        if isinstance(out, torch.Tensor):
            largest["n"] = max(largest["n"], out.numel())

    handles = [mod.register_forward_hook(hook) for mod in m.encoder.modules() if mod is not m.encoder]
    try:
        for frames in (5, 21):
            largest["n"] = 0
            with torch.no_grad():
                assert m.encode(torch.rand(1, 3, frames, 32, 32)).shape[2] == 1 + (frames - 1) // 4
            largest[frames] = largest["n"]
    finally:
        for h in handles:
            h.remove()
    assert largest[21] == largest[5]


# --------------------------------------------------------------------------------------------
# workflows


def _write_png(path, h, w, seed):
    arr = (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)
    Image.fromarray(arr).save(path)


@pytest.mark.parametrize("name", ["wan21", "wan22"])
def test_workflow_vaeloader_encode_decode(tmp_path, name):
    cfg = CONFIGS[name]
    models, inputs = tmp_path / "models", tmp_path / "input"
    (models / "vae").mkdir(parents=True)
    inputs.mkdir()
    write_wan_vae(models / "vae" / f"{name}.safetensors", cfg, seed=9)
    side = 2 * cfg.downscale
    _write_png(inputs / "frame.png", side, side, 1)
    g = api.Graph()
    vae = g.add("VAELoader", vae_name=f"{name}.safetensors")
    img = g.add("LoadImage", image="frame.png")
    frames = g.add("RepeatImageBatch", image=img[0], amount=9)
    enc = g.add("VAEEncode", pixels=frames[0], vae=vae[0])
    dec = g.add("VAEDecode", samples=enc[0], vae=vae[0])
    tiled = g.add("VAEDecodeTiled", samples=enc[0], vae=vae[0], tile_size=64, overlap=0, temporal_size=64,
                  temporal_overlap=8)
    g.add("PreviewImage", images=dec[0])
    g.add("PreviewImage", images=tiled[0])
    res = api.run(g.build(), models=models, input=inputs, output=tmp_path / "out")
    latent = res.outputs[enc.node_id][0].samples
    assert latent.shape == (1, cfg.z_dim, 3, 2, 2)
    image = res.outputs[dec.node_id][0]
    assert image.shape == (9, side, side, 3) and torch.isfinite(image).all()
    assert torch.allclose(res.outputs[tiled.node_id][0], image, atol=1e-6)
    direct = load_vae(models / "vae" / f"{name}.safetensors")
    with torch.inference_mode():   # the weight store holds the run's (inference) tensors
        assert torch.allclose(direct.decode(latent, F32), image, atol=1e-6)


def test_memory_estimate_traces_the_wan_vae(tmp_path):
    models = tmp_path / "models"
    (models / "vae").mkdir(parents=True)
    write_wan_vae(models / "vae" / "wan.safetensors", WAN21_TINY)
    prompt = {
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": "wan.safetensors"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 5, "color": 0}},
        "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
        "5": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["3", 0], "vae": ["1", 0], "tile_size": 256,
                                                         "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
        "6": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
        "7": {"class_type": "PreviewImage", "inputs": {"images": ["5", 0]}},
    }
    from mixgraph.ui.cli import main

    (tmp_path / "wf.json").write_text(json.dumps(prompt))
    assert main(["estimate", str(tmp_path / "wf.json"), "--json", "--models", str(models)]) in (0, 1)
    assert main(["validate", str(tmp_path / "wf.json"), "--models", str(models)]) == 0


def test_trace_inputs_fit_the_module():
    for cfg in CONFIGS.values():
        m = _ours(cfg)
        with torch.no_grad():
            out = WAN_ARCH.trace(cfg, "decode", 1, 2 * cfg.downscale, 2 * cfg.downscale)(m)
            assert out.shape == (1, 3, 5, 2 * cfg.downscale, 2 * cfg.downscale)
            lat = WAN_ARCH.trace(cfg, "encode", 1, cfg.downscale, cfg.downscale)(m)
            assert lat.shape == (1, cfg.z_dim, 2, 1, 1)
