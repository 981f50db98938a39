"""int8 on CPUs with native int8 dot products: `Int8Conv2d`'s oneDNN kernel against its own
reference quantisation and against f32, `Int8Linear` against an integer reference, what the
int8 policy leaves f32 in the SD UNet, and the preset rows of `CPU_INT8_TABLE`.

The suite pins `MIXGRAPH_CPU_FLAGS` to a CPU without VNNI (conftest.py), so `kernel="auto"`
takes the im2col path in every other test; here the oneDNN kernel is asked for by name, and
skipped where this machine's CPU (torch's probe, `env={}`) has no native int8 or torch no
oneDNN int8 convolution."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mixgraph.graph.precision import (CPU_INT8_TABLE, DeviceCaps, cpu_caps_from_flags,
                                      cpu_int8_row, emulation_warning, parse_spec, preset_spec,
                                      preset_table)
from mixgraph.nodes.weights.cast import (Int8Conv2d, Int8Linear, apply_precision,
                                         onednn_int8_conv_available, quantize_uint8)
from tests.fixtures.tiny_unet import tiny_unet, tiny_unet_config
from tests.test_cast import Policy as CastPolicy
from tests.test_int8_conv import CASES, seeded_conv

F32, F64 = torch.float32, torch.float64

needs_onednn = pytest.mark.skipif(not onednn_int8_conv_available(env={}),
                                  reason="no native int8 dot products (VNNI/AMX-INT8) or no oneDNN int8 conv")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _onednn(conv: nn.Conv2d) -> Int8Conv2d:
    q = Int8Conv2d(conv, F32)
    q.kernel = "onednn"
    return q


# --- the oneDNN convolution ---------------------------------------------------------------------

@needs_onednn
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_onednn_conv_is_exactly_the_dequantised_convolution(case):
    """The kernel against our own quantisation: uint8 x (quantize_input) and int8 weights,
    dequantised and convolved in f64. The products are exact in int32, so what is left is the
    f32 rescale of each output (relative 2^-24 per operation): bound 1e-5 relative."""
    args, kwargs, shape = CASES[case]
    conv = seeded_conv(1, *args, **kwargs)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 2 + 0.5
    q = _onednn(conv)
    qx, scale, zero = q.quantize_input(x)
    assert qx.dtype == torch.uint8 and 0 <= zero <= 255
    xd = (qx.double() - zero) * scale
    assert (xd - x.double()).abs().max() <= scale / 2 + 1e-6  # round to nearest, range holds 0
    k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    wd = (q.weight_int8[:k, : conv.out_channels].t().double() * q.weight_scale.double()[:, None])
    wd = wd.reshape(conv.weight.shape)  # [C_out, K] -> [C_out, C_in, kh, kw]
    bias = None if conv.bias is None else conv.bias.double()
    ref = F.conv2d(xd, wd, bias, conv.stride, conv.padding, conv.dilation)
    out = q(x)
    assert out.dtype == F32 and out.shape == ref.shape
    assert _rel(out, ref) < 1e-5


@needs_onednn
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_onednn_conv_matches_f32_within_int8_error(case):
    """Against the f32 convolution. Per-tensor uint8 over a range of ~7 sigma (the extremes of
    a few thousand Gaussian values, shifted) has a step of ~7/255 sigma, rounding RMS step /
    sqrt(12) = 0.8% of the input's RMS; int8 weights per output channel (absmax ~3 sigma of
    K = 16..144 values) add ~0.7%; in quadrature ~1.1% on the output. Bound: twice that, 0.025
    (the im2col path's test allows 0.02 with per-pixel scales)."""
    args, kwargs, shape = CASES[case]
    conv = seeded_conv(1, *args, **kwargs)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2)) + 0.3
    rel = _rel(_onednn(conv)(x), conv(x))
    assert 1e-4 < rel < 0.025, rel


@needs_onednn
@torch.no_grad()
def test_onednn_conv_packs_once_survives_deepcopy_and_keeps_compute_dtype():
    conv = seeded_conv(3, 8, 8, 3, padding=1)
    q = _onednn(conv)
    x = torch.randn(1, 8, 6, 6)
    first = q(x)
    assert q._packed is not None and "_packed" not in q.state_dict()
    twin = copy.deepcopy(q)  # the opaque packed weight is not copied; the twin packs its own
    assert twin._packed is None and torch.equal(twin(x), first)
    q.compute_dtype = torch.bfloat16
    assert q(x).dtype == torch.bfloat16


def test_kernel_auto_follows_the_pinned_flags_and_rejects_unknown_names():
    assert not onednn_int8_conv_available(env={"MIXGRAPH_CPU_FLAGS": "avx2 fma"})
    q = Int8Conv2d(seeded_conv(0, 4, 4, 1), F32)
    q.kernel = "fbgemm"
    with pytest.raises(ValueError, match="kernel"):
        q(torch.randn(1, 4, 3, 3))


# --- Linear -------------------------------------------------------------------------------------

@torch.no_grad()
def test_int8_linear_is_exactly_its_integer_product_rescaled():
    """`torch._int_mm` against the same per-row / per-column quantisation multiplied in int64:
    the int32 accumulation is exact, the rescale is f32 (bound 1e-6 relative)."""
    g = torch.Generator().manual_seed(4)
    lin = nn.Linear(96, 40)
    x = torch.randn(3, 17, 96, generator=g)
    q = Int8Linear(lin, F32)
    q.kernel = "int_mm"
    x2 = x.reshape(-1, 96)  # [3, 17, 96] -> [51, 96]
    xs = x2.abs().amax(dim=1, keepdim=True) / 127.0
    xq = torch.round(x2 / xs).clamp(-127, 127).long()
    acc = xq @ q.weight_int8.long()  # [51, 40], exact
    ref = acc.double() * xs.double() * q.weight_scale.double() + lin.bias.double()
    assert _rel(q(x).reshape(-1, 40), ref) < 1e-6


@needs_onednn
@torch.no_grad()
def test_onednn_linear_is_the_dequantised_product_of_row_scaled_uint8_activations():
    """oneDNN's dynamic Linear against our own quantisation of the same input: each row divided
    by its absmax s, the whole quantized per tensor (Int8Conv2d.quantize_input's uint8 scheme,
    the one the kernel computes), multiplied in f64 with the dequantised int8 weights, each row
    times s, plus the bias. The kernel picks its own scale/zero point the same way up to float
    rounding, so a few entries may land one level apart: bound 1e-3 relative (one level is ~0.4%
    of the range, and only a rare entry moves)."""
    g = torch.Generator().manual_seed(5)
    lin = nn.Linear(96, 40)
    x = torch.randn(3, 17, 96, generator=g) + 0.2
    x[1] *= 30.0  # rows of very different scale: each keeps its own levels
    q = Int8Linear(lin, F32)
    q.kernel = "onednn"
    rows = x.reshape(-1, 96)  # [3, 17, 96] -> [51, 96]
    s = rows.abs().amax(dim=1, keepdim=True)
    qx, scale, zero = quantize_uint8(rows / s)
    wd = q.weight_int8.double() * q.weight_scale.double()  # [in, out]
    ref = ((qx.double() - zero) * scale) @ wd * s.double() + lin.bias.double()
    out = q(x)
    for i in range(3):  # the small rows are as good as the large ones
        assert _rel(out[i], lin(x[i])) < 0.025
    assert out.shape == (3, 17, 40) and out.dtype == F32
    assert _rel(out.reshape(-1, 40), ref) < 1e-3
    assert 1e-4 < _rel(out, lin(x)) < 0.025  # against f32: the conv's error budget (see above)
    twin = copy.deepcopy(q)
    assert twin._packed is None and torch.equal(twin(x), out)


@needs_onednn
def test_onednn_linear_traces_on_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = Int8Linear(nn.Linear(16, 8), F32)
    q.kernel = "onednn"
    with FakeTensorMode(allow_non_fake_inputs=True):
        assert q(torch.empty(2, 5, 16)).shape == (2, 5, 8)


# --- what int8 leaves f32 in the SD UNet ---------------------------------------------------------

@torch.no_grad()
def test_int8_policy_keeps_the_unet_attention_query_key_projections_f32():
    model = tiny_unet("sd15")
    cast = apply_precision(model, CastPolicy(int8=True))
    qk = {n for n, _ in model.named_modules() if n.rsplit(".", 2)[-2:] in (["attn1", "to_q"], ["attn1", "to_k"],
                                                                         ["attn2", "to_q"], ["attn2", "to_k"])}
    int8_linears = {n for n, m in cast.named_modules() if isinstance(m, Int8Linear)}
    assert qk and not (qk & int8_linears)
    assert any(n.endswith("attn1.to_v") for n in int8_linears)  # the value/output projections are int8
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(2, cfg.in_channels, 8, 8, generator=g), torch.tensor([999.0, 37.0]),
            torch.randn(2, 6, cfg.context_dim, generator=g))
    assert _rel(cast(*args), model(*args)) < 0.1


# --- the preset rows ----------------------------------------------------------------------------

ZEN4 = cpu_caps_from_flags({"avx512f", "avx512_bf16", "avx512_vnni"})
CASCADE_LAKE = cpu_caps_from_flags({"avx512f", "avx512_vnni"})
SAPPHIRE = cpu_caps_from_flags({"avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"})
ALDER_LAKE = cpu_caps_from_flags({"avx2", "avx_vnni"})
ZEN3 = cpu_caps_from_flags({"avx2", "fma"})
AMPERE = DeviceCaps("cuda", native_bf16=True, native_f16=True, native_int8=True)


def test_int8_rows_pick_int8_where_measured_faster():
    assert ZEN4.int8_presets == () and "bf16 kept" in ZEN4.int8_why        # bf16 was faster
    assert CASCADE_LAKE.int8_presets == ("fast",) and "Cascade Lake" in CASCADE_LAKE.int8_why
    assert SAPPHIRE.int8_presets == () and "AMX" in SAPPHIRE.int8_why      # first row wins
    assert ALDER_LAKE.int8_presets == () and "not measured" in ALDER_LAKE.int8_why
    assert ALDER_LAKE.native_int8                                           # native, but no row
    assert ZEN3.int8_presets == () and cpu_int8_row({"avx2"}) == ((), "no native int8")
    no_onednn = cpu_caps_from_flags({"avx512f", "avx512_vnni"}, onednn=False)
    assert no_onednn.int8_presets == () and "oneDNN" in no_onednn.int8_why
    assert all(isinstance(flags, tuple) and flags and set(presets) <= {"balanced", "fast"}
               for flags, presets, _ in CPU_INT8_TABLE)


def test_fast_gives_the_sd_unet_int8_on_vnni_cpus_without_bf16_only():
    """Only the SD UNet's role (`sd_unet`, a further role of MODEL) asks for int8: the DiTs (role
    unet) were not measured faster in int8 than in bf16. `balanced` never picks it (PSNR on
    random weights), and where bf16 is native it was faster than int8."""
    fast = preset_table(caps=CASCADE_LAKE)["fast"]
    assert fast["MODEL.sd_unet"] == "int8"
    assert "int8" not in (fast["MODEL"], fast["CONTROL_NET"], fast["CLIP"], fast["VAE"])
    for preset in ("quality", "balanced", "memory"):
        assert preset_table(caps=CASCADE_LAKE)[preset]["MODEL.sd_unet"] != "int8"
    for caps, want in ((ZEN4, "bf16"), (SAPPHIRE, "bf16"), (ALDER_LAKE, "f32"), (ZEN3, "f32"), (AMPERE, "bf16")):
        for preset in ("balanced", "fast"):
            assert preset_spec(preset, "MODEL", caps, role="sd_unet") == want, (caps.int8_why, preset)
    assert parse_spec(preset_spec("fast", "MODEL", CASCADE_LAKE, role="sd_unet")).int8
    assert emulation_warning(parse_spec("int8"), "cpu", CASCADE_LAKE) is None


def test_effective_asks_for_the_role_the_model_family_names():
    from mixgraph.graph.precision import Resolver
    from mixgraph.nodes.helpers.precision import effective, family_role
    from mixgraph.nodes.models.handles import ModelHandle

    sd, flux = ModelHandle.__new__(ModelHandle), ModelHandle.__new__(ModelHandle)
    object.__setattr__(sd, "family", "sd")
    object.__setattr__(flux, "family", "flux")
    assert family_role(sd, "MODEL") == "sd_unet" and family_role(flux, "MODEL") is None
    assert family_role(sd, "VAE") is None and family_role(object(), "MODEL") is None

    class Ctx:  # what effective needs of graph.context.Context
        def __init__(self, caps):
            self.resolver, self.used = Resolver(None, caps=caps), []

        def policy_for(self, socket, *, role=None, **_pins):
            return self.resolver.policy("1", socket, role)

        def used_precision(self, policy):
            self.used.append(policy)

    class FastCtx(Ctx):
        def __init__(self, caps):
            self.resolver, self.used = Resolver(None, cli_default="fast", caps=caps), []

    for caps, sd_spec, flux_spec in ((CASCADE_LAKE, "int8", "f32"), (ZEN4, "bf16", "bf16"), (ZEN3, "f32", "f32")):
        assert effective(FastCtx(caps), sd, "MODEL").spec == sd_spec
        assert effective(FastCtx(caps), flux, "MODEL").spec == flux_spec
    assert effective(Ctx(CASCADE_LAKE), sd, "MODEL").spec == "f32"  # balanced: f32 there


def test_system_report_says_why():
    js = CASCADE_LAKE.to_json()
    assert js["int8_presets"] == ["fast"] and "faster than f32" in js["int8_why"]
    assert "bf16 kept" in ZEN4.to_json()["int8_why"]


def test_onednn_conv_traces_on_fake_tensors_for_the_estimate():
    """`mixgraph estimate` traces models on fake tensors, which oneDNN's ops cannot take: the
    kernel then only allocates what it would (uint8 input copy, f32 output)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _onednn(seeded_conv(0, 8, 12, 3, stride=2, padding=1))
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = q(torch.empty(2, 8, 9, 10))
    assert y.shape == (2, 12, 5, 5) and y.dtype == F32


def test_precision_bytes_adds_onednn_packed_copies_where_that_kernel_runs(monkeypatch):
    from mixgraph.nodes.weights.cast import precision_bytes

    model = nn.Sequential(nn.Linear(16, 8), nn.Conv2d(4, 6, 3))
    monkeypatch.setenv("MIXGRAPH_CPU_FLAGS", "avx2")
    _, portable = precision_bytes(model, CastPolicy(int8=True))
    monkeypatch.setenv("MIXGRAPH_CPU_FLAGS", "avx512_vnni")
    if not onednn_int8_conv_available():
        pytest.skip("torch without oneDNN int8 kernels")
    _, onednn = precision_bytes(model, CastPolicy(int8=True))
    assert onednn - portable == 16 * 8 + 4 * 9 * 6  # one packed int8 copy per layer
