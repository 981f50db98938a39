"""The KL VAE against diffusers' AutoencoderKL on the same random weights, plus image I/O and tiling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models.handles import VaeHandle
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.vae.vae import (AutoencoderKL, VAEConfig, crop_to_multiple, decode_image, decode_tiled,
                                    encode_image, tiled_map)
from tests.fixtures.checkpoints import TINY_VAE_CONFIG, tiny_vae_state_dict, vae_diffusers_config, vae_to_diffusers


@pytest.fixture(scope="module")
def sd():
    return tiny_vae_state_dict(0)


@pytest.fixture(scope="module")
def ours(sd):
    m = AutoencoderKL(VAEConfig.from_state_dict(sd))
    m.load_state_dict(sd, strict=True)
    return m.eval()


@pytest.fixture(scope="module")
def reference(sd):
    from diffusers import AutoencoderKL as DiffusersAE

    cfg = {k: v for k, v in vae_diffusers_config().items() if not k.startswith("_")}
    m = DiffusersAE(**cfg)
    m.load_state_dict(vae_to_diffusers(sd), strict=True)
    return m.eval()


def test_vae_config_from_state_dict_reads_sizes_from_shapes(sd):
    assert VAEConfig.from_state_dict(sd) == TINY_VAE_CONFIG
    prefixed = {"first_stage_model." + k: v for k, v in sd.items()}
    assert VAEConfig.from_state_dict(prefixed, "first_stage_model.") == TINY_VAE_CONFIG
    assert TINY_VAE_CONFIG.downscale == 8 and TINY_VAE_CONFIG.latent_channels == 4


def test_vae_encode_mean_matches_diffusers(ours, reference):
    x = torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        got = ours.encode(x)
        want = reference.encode(x).latent_dist.mean
    assert got.shape == (2, 4, 8, 6)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_vae_decode_matches_diffusers(ours, reference):
    z = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = ours.decode(z)
        want = reference.decode(z).sample
    assert got.shape == (2, 3, 64, 48)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_decode_image_is_clamped_bhwc(ours):
    z = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        img = decode_image(ours.decode, z)
        raw = ours.decode(z)
    assert img.shape == (1, 32, 32, 3) and img.dtype == torch.float32
    torch.testing.assert_close(img, torch.clamp((raw + 1) / 2, 0, 1).permute(0, 2, 3, 1))


def test_encode_image_center_crops_to_multiple_of_8(ours):
    pixels = torch.rand(1, 70, 67, 4, generator=torch.Generator().manual_seed(4))  # RGBA, odd size
    with torch.no_grad():
        lat = encode_image(ours.encode, pixels)
        cropped = pixels[:, 3:67, 1:65, :3]  # offsets (70 % 8) // 2 = 3, (67 % 8) // 2 = 1
        want = ours.encode(cropped.permute(0, 3, 1, 2) * 2 - 1)
    assert lat.shape == (1, 4, 8, 8)
    torch.testing.assert_close(lat, want)
    assert crop_to_multiple(pixels, 8).shape == (1, 64, 64, 4)


def _pointwise_decoder(z: torch.Tensor) -> torch.Tensor:
    """A position-independent 'decoder' (1x1 channel mix + nearest upsampling): tiling must not
    change its output at all, so any blending error shows."""
    w = torch.linspace(-1, 1, 12).reshape(3, 4, 1, 1)
    return F.interpolate(F.conv2d(z, w), scale_factor=8, mode="nearest")


def test_tiled_map_feathered_blend_is_exact_for_pointwise_functions():
    z = torch.randn(2, 4, 13, 21, generator=torch.Generator().manual_seed(5))
    full = _pointwise_decoder(z)
    tiled = tiled_map(z, _pointwise_decoder, (6, 8), overlap=2, scale=8, out_channels=3)
    torch.testing.assert_close(tiled, full, atol=1e-5, rtol=1e-5)
    img = decode_tiled(_pointwise_decoder, z, tile=8, overlap=2)  # three passes averaged
    torch.testing.assert_close(img, torch.clamp((full + 1) / 2, 0, 1).permute(0, 2, 3, 1), atol=1e-5, rtol=1e-5)


def test_tiled_decode_single_tile_equals_full_decode(ours):
    z = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = decode_image(ours.decode, z)
        tiled = decode_tiled(ours.decode, z, tile=16, overlap=4)  # every pass is one tile
    torch.testing.assert_close(tiled, full, atol=1e-5, rtol=1e-5)


def test_decode_out_of_memory_falls_back_to_tiles():
    calls = []

    def small_memory_decoder(z):
        calls.append(tuple(z.shape[-2:]))
        if z.shape[-1] * z.shape[-2] > 64 * 64:  # "too big": only the fallback tiles fit
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return _pointwise_decoder(z)

    z = torch.randn(1, 4, 80, 72, generator=torch.Generator().manual_seed(7))
    img = decode_image(small_memory_decoder, z)
    assert calls[0] == (80, 72) and len(calls) > 3
    want = torch.clamp((_pointwise_decoder(z) + 1) / 2, 0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(img, want, atol=1e-5, rtol=1e-5)


def test_vae_handle_decode_bf16_close_to_f32(sd):
    handle = VaeHandle(WeightSource.from_state_dict(sd, name="vae"), VAEConfig.from_state_dict(sd))
    z = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(8))
    f32 = handle.decode(z, parse_spec("f32"))
    bf16 = handle.decode(z, parse_spec("bf16"))
    assert bf16.dtype == torch.float32 and bf16.shape == (1, 16, 16, 3)
    assert (bf16 - f32).abs().max() < 0.05
    assert not torch.equal(bf16, f32)  # it really ran in bf16
    lat = handle.encode(f32, parse_spec("f32"))
    assert lat.shape == (1, 4, 2, 2)
