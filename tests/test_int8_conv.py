"""Int8Conv2d: im2col + int8 GEMM against the f32 convolution, chunking, what the int8 policy
converts, and the tiny SD1.5 UNet under it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mixgraph.nodes.weights.cast import (CastConv2d, Int8Conv2d, Int8Linear, apply_precision,
                                         int8_conv_gemm_shape, precision_bytes, weight_bytes)
from tests.fixtures.tiny_unet import tiny_unet, tiny_unet_config
from tests.test_cast import Policy as CastPolicy

F32 = torch.float32

# Absmax int8 with step a/127 has a rounding error of RMS (a/127)/sqrt(12). For Gaussian entries
# the absmax of a row of K = 36..288 values is ~2.6-3.2 sigma, so each quantized operand carries
# a relative error of ~3.2/127/3.46 = 0.73%; both operands are quantized, and their errors add in
# quadrature: ~1.0% relative L2 error on the output (measured 0.5-0.9%). Bound: twice that.
REL_BOUND = 0.02


def Policy() -> CastPolicy:  # the int8 policy: f32 storage and compute
    return CastPolicy(int8=True)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def seeded_conv(seed: int, *args, **kwargs) -> nn.Conv2d:
    conv = nn.Conv2d(*args, **kwargs)  # its own init is replaced by seeded values
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.1)
        if conv.bias is not None:
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=g) * 0.1)
    return conv


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


CASES = {  # name -> (Conv2d args, kwargs, input [N, C, H, W])
    "1x1": ((16, 24, 1), {}, (2, 16, 9, 7)),
    "3x3_s1_p1": ((16, 24, 3), {"padding": 1}, (2, 16, 9, 7)),
    "3x3_s2_p1_downsample": ((16, 16, 3), {"stride": 2, "padding": 1}, (2, 16, 9, 8)),
    "3x3_s2_p0_no_bias": ((8, 12, 3), {"stride": 2, "bias": False}, (3, 8, 11, 10)),
    "3x1_dilated_uneven": ((5, 6, (3, 1)), {"stride": (1, 2), "padding": (2, 0), "dilation": 2}, (1, 5, 7, 9)),
    "4_to_4_unpadded_k": ((4, 4, 3), {"padding": 1}, (2, 4, 8, 8)),  # K = 36, N = 4: both padded to 8s
    "padding_past_kernel": ((5, 6, 3), {"padding": 4}, (2, 5, 5, 5)),  # output rows all padding
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_int8_conv_matches_f32_conv_within_int8_error(case):
    args, kwargs, shape = CASES[case]
    conv = seeded_conv(1, *args, **kwargs)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    ref = conv(x)
    q = Int8Conv2d(conv, F32)
    y = q(x)
    assert y.shape == ref.shape and y.dtype == F32
    rel = _rel(y, ref)
    assert 1e-4 < rel <= REL_BOUND  # int8 really changed the arithmetic, within int8's error
    assert q(x.to(torch.bfloat16)).dtype == F32  # input cast to f32, output in compute_dtype
    assert Int8Conv2d(conv, torch.bfloat16)(x).dtype == torch.bfloat16


@torch.no_grad()
def test_int8_conv_weights_are_int8_in_gemm_layout():
    conv = seeded_conv(3, 4, 4, 3, padding=1)  # K = 36 -> 40, N = 4 -> 8
    q = Int8Conv2d(conv, F32)
    assert int8_conv_gemm_shape(conv) == (40, 8)
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.shape == (40, 8)
    assert not q.weight_int8[36:].any() and not q.weight_int8[:, 4:].any()  # zero padding
    # column j is output channel j's kernel in F.unfold's (C_in, kh, kw) order
    w = q.weight_int8[:36, :4].t().float() * q.weight_scale[:, None]
    assert torch.allclose(w.view(4, 4, 3, 3), conv.weight, atol=q.weight_scale.max().item() / 2 + 1e-7)
    assert weight_bytes(q) == 40 * 8 + 4 * 4 + 4 * 4  # int8 matrix, f32 scales, f32 bias


@pytest.mark.parametrize("case", ["3x3_s1_p1", "3x3_s2_p1_downsample", "3x1_dilated_uneven", "padding_past_kernel"])
@torch.no_grad()
def test_int8_conv_chunking_gives_the_one_chunk_result(case):
    args, kwargs, shape = CASES[case]
    q = Int8Conv2d(seeded_conv(4, *args, **kwargs), F32)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    whole = q(x)
    _, c, _, w = shape
    k = c * q.kernel_size[0] * q.kernel_size[1]
    wo = whole.shape[-1]
    # one output row per chunk, two rows, one image per chunk: rows are quantized independently,
    # so only the float summation order may differ
    for budget in (1, 2 * wo * k * 4, whole.shape[-2] * wo * k * 4):
        q.chunk_bytes = budget
        assert torch.allclose(q(x), whole, rtol=1e-6, atol=1e-6), budget


@torch.no_grad()
def test_int8_conv_default_chunk_bounds_the_unfolded_patches():
    # 1x1 conv of 64 channels on 2 x 384x384 images: 72 MiB of f32 patches, so at least 2 chunks
    q = Int8Conv2d(seeded_conv(6, 64, 8, 1), F32)
    calls = []
    gemm = q._gemm
    q._gemm = lambda cols: calls.append(cols.numel() * cols.element_size()) or gemm(cols)
    x = torch.randn(2, 64, 384, 384, generator=torch.Generator().manual_seed(7))
    y = q(x)
    assert len(calls) >= 2 and max(calls) <= Int8Conv2d.chunk_bytes
    assert sum(calls) == 2 * 384 * 384 * 64 * 4 and y.shape == (2, 8, 384, 384)


def test_int8_policy_leaves_grouped_and_non_zero_padded_convs_cast():
    model = nn.Sequential(
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Conv2d(8, 8, 3, padding=1, groups=2),
        nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"),
        nn.Conv2d(8, 8, 3, padding="same"),
        nn.Linear(8, 8),
    )
    cast = apply_precision(model, Policy())
    assert [type(m) for m in cast] == [Int8Conv2d, CastConv2d, CastConv2d, CastConv2d, Int8Linear]
    x = torch.randn(1, 8, 5, 8, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        ref = model(x)
        out = cast(x)
    assert _rel(out, ref) <= 2 * REL_BOUND
    with pytest.raises(ValueError, match="groups=2"):
        Int8Conv2d(model[1], F32)


def test_precision_bytes_counts_int8_conv_copies_like_linear():
    model = nn.Sequential(nn.Conv2d(4, 16, 3, padding=1), nn.Conv2d(16, 16, 3, groups=2), nn.Linear(16, 8))
    held, per_use = precision_bytes(model, Policy())
    assert held == weight_bytes(model)  # the store keeps the f32 weights the int8 copies come from
    int8_layers = [m for m in apply_precision(model, Policy()).modules() if isinstance(m, (Int8Conv2d, Int8Linear))]
    assert len(int8_layers) == 2
    assert per_use == sum(m.weight_int8.numel() + 4 * m.weight_scale.numel() for m in int8_layers)
    assert per_use == 40 * 16 + 16 * 4 + 16 * 8 + 8 * 4


@torch.no_grad()
def test_int8_policy_on_tiny_sd15_unet_converts_convs_and_stays_close_to_f32():
    model = tiny_unet("sd15")
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, cfg.in_channels, 8, 8, generator=g)
    args = (x, torch.tensor([999.0, 37.0]), torch.randn(2, 6, cfg.context_dim, generator=g))
    ref = model(*args)
    cast = apply_precision(model, Policy())
    convs = {n for n, m in model.named_modules() if type(m) is nn.Conv2d}
    int8_convs = {n for n, m in cast.named_modules() if isinstance(m, Int8Conv2d)}
    assert len(convs) > 10 and int8_convs == convs  # first and last conv included
    out = cast(*args)
    assert out.dtype == F32 and out.shape == ref.shape
    # measured 0.038 (0.034 with the first/last conv f32, 0.017 with only the Linears int8)
    assert 1e-3 < _rel(out, ref) <= 0.1
    # the memory figures skip the same modules: per use, exactly the int8 copies are added
    held, per_use = precision_bytes(model, Policy())
    int8_layers = [m for m in cast.modules() if isinstance(m, (Int8Conv2d, Int8Linear))]
    assert held == weight_bytes(model)
    assert per_use == sum(m.weight_int8.numel() + 4 * m.weight_scale.numel() for m in int8_layers)


@torch.no_grad()
def test_int8_policy_leaves_the_tiny_vae_f32():
    from mixgraph.nodes.weights.synthetic import TINY_VAE, module_shapes, random_state_dict
    from mixgraph.nodes.vae.vae import AutoencoderKL

    vae = AutoencoderKL(TINY_VAE)
    vae.load_state_dict(random_state_dict(module_shapes(lambda: AutoencoderKL(TINY_VAE)), seed=0))
    cast = apply_precision(vae, Policy())  # AutoencoderKL.int8_skip names every submodule
    convs = [m for m in cast.modules() if isinstance(m, CastConv2d)]
    assert convs and all(m.compute_dtype == F32 and m.weight.dtype == F32 for m in convs)
    assert not any(isinstance(m, (Int8Conv2d, Int8Linear)) for m in cast.modules())
    assert precision_bytes(vae, Policy()) == (weight_bytes(vae), 0)
    z = torch.randn(1, TINY_VAE.z_channels, 4, 4, generator=torch.Generator().manual_seed(9))
    assert torch.allclose(cast.decode(z), vae.decode(z), rtol=1e-5, atol=1e-5)
