"""`int8:bf16` / `int8:f16`: the int8 Linear and Conv2d layers of `int8`, every other layer stored
and computed in the half dtype (issue 27: with bf16 native, the attention and norms beside the
int8 GEMMs run at bf16's speed). The grammar, the per-use rules, what `apply_precision` builds
and the bytes it holds; the executor run is in tests/test_precision_surfaces.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mixgraph.graph.precision import PrecisionError, parse_spec, resolve
from mixgraph.nodes.weights.cast import (CastLinear, Int8Conv2d, Int8Linear, apply_precision,
                                         onednn_int8_conv_available, precision_bytes)
from tests.fixtures.tiny_unet import tiny_unet, tiny_unet_config
from tests.test_int8_conv import seeded_conv

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_grammar_names_the_dtype_of_the_other_layers():
    p = parse_spec("int8:bf16")
    assert (p.storage, p.compute, p.int8, p.spec, p.is_half) == (BF16, BF16, True, "int8:bf16", True)
    assert parse_spec("INT8:fp16").spec == "int8:f16" and parse_spec("int8:f16").compute == F16
    assert parse_spec("int8:f32") == parse_spec("int8") and parse_spec("int8").spec == "int8"
    for bad in ("int8:fp8_e4m3fn", "int8:bf16+upcast", "int8:", "int8:int8"):
        with pytest.raises(PrecisionError, match="int8:bf16"):
            parse_spec(bad)


def test_per_use_rules_keep_int8_layers_or_say_what_runs_instead():
    # a NaN-guard re-run: the int8 layers stay, the rest computes (and is stored) in f32
    assert resolve(parse_spec("int8:bf16"), f32_compute=True) == parse_spec("int8")
    # a pinned compute dtype does not change an int8 policy, and says so
    warned: list[str] = []
    assert resolve(parse_spec("int8:bf16"), compute=F32, warn=warned.append) == parse_spec("int8:bf16")
    assert len(warned) == 1 and "int8:bf16" in warned[0] and "does not apply" in warned[0]
    # a pinned storage dtype turns int8 off and keeps the compute dtype of the rest
    warned.clear()
    p = resolve(parse_spec("int8:bf16"), storage=torch.float8_e4m3fn, warn=warned.append)
    assert (p.int8, p.spec) == (False, "fp8_e4m3fn:bf16")
    assert len(warned) == 1 and "fp8_e4m3fn:bf16" in warned[0]


@torch.no_grad()
def test_emulation_warning_names_the_half_rest_where_it_is_emulated():
    from mixgraph.graph.precision import cpu_caps_from_flags, emulation_warning

    cascade_lake = cpu_caps_from_flags({"avx512f", "avx512_vnni"})
    zen4 = cpu_caps_from_flags({"avx512f", "avx512_bf16", "avx512_vnni"})
    assert emulation_warning(parse_spec("int8"), "cpu", cascade_lake) is None
    assert "bf16 compute on cpu is emulated" in emulation_warning(parse_spec("int8:bf16"), "cpu", cascade_lake)
    assert emulation_warning(parse_spec("int8:bf16"), "cpu", zen4) is None


@torch.no_grad()
def test_apply_precision_makes_int8_layers_and_half_for_the_rest():
    model = tiny_unet("sd15")
    cast = apply_precision(model, parse_spec("int8:bf16"))
    int8 = [m for m in cast.modules() if isinstance(m, (Int8Linear, Int8Conv2d))]
    assert int8 and all(m.compute_dtype == BF16 for m in int8)
    qk = [m for n, m in cast.named_modules() if n.endswith(("attn1.to_q", "attn1.to_k"))]
    assert qk and all(isinstance(m, CastLinear) and m.compute_dtype == BF16 and m.weight.dtype == BF16
                      for m in qk)  # int8_skip layers compute in the half dtype, not f32
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(2, cfg.in_channels, 8, 8, generator=g), torch.tensor([999.0, 37.0]),
            torch.randn(2, 6, cfg.context_dim, generator=g))
    ref, full = model(*args), apply_precision(model, parse_spec("int8"))(*args)
    out = cast(*args)
    assert out.dtype == F32 and torch.isfinite(out).all()
    assert _rel(out, ref) < 0.1
    assert 0 < _rel(out, full) < 0.1  # not the f32-rest run: the other layers really are bf16


def test_held_bytes_follow_the_storage_of_the_rest():
    model = nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8))
    held32, _ = precision_bytes(model, parse_spec("int8"))
    held16, _ = precision_bytes(model, parse_spec("int8:bf16"))
    assert held32 == (16 * 8 + 8 + 2 * 8) * 4 and held16 == held32 // 2


@pytest.mark.skipif(not onednn_int8_conv_available(env={}), reason="no native int8 dot products / oneDNN int8 conv")
@torch.no_grad()
def test_onednn_conv_writes_bf16_exactly_as_its_f32_result_cast():
    """The oneDNN convolution writes bf16 itself under int8:bf16 (no f32 copy of the output):
    the same values as its f32 output cast to bf16, for the same (bf16) input."""
    conv = seeded_conv(4, 16, 24, 3, padding=1)
    x = torch.nn.functional.silu(torch.randn(2, 16, 12, 12, generator=torch.Generator().manual_seed(5))).to(BF16)
    a, b = Int8Conv2d(conv, F32), Int8Conv2d(conv, BF16)
    a.kernel = b.kernel = "onednn"
    yb = b(x)
    assert yb.dtype == BF16 and torch.equal(yb, a(x).to(BF16))
