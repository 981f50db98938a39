"""Precision layer: every policy on a tiny UNet, bytes, error bounds, keep-f32, no mutation."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mixgraph.nodes.weights.cast import (CastConv2d, CastGroupNorm, CastLayer, Int8Conv2d, Int8Linear,
                                         apply_precision, int8_conv_gemm_shape, matched_names,
                                         weight_bytes)
from mixgraph.nodes.families.sd.unet import CrossAttention, sdxl_adm
from tests.fixtures.tiny_unet import TINY_POOLED, tiny_unet, tiny_unet_config

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@dataclass(frozen=True)
class Policy:  # stands in for graph.precision.Policy (duck-typed seam)
    storage: torch.dtype = F32
    compute: torch.dtype = F32
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


# name -> (policy, max relative L2 error vs f32 on the tiny UNet); measured errors are ~1/3 of these
SPECS = {
    "f32": (Policy(), 0.0),
    "bf16": (Policy(BF16, BF16), 0.04),
    "f16": (Policy(F16, F16), 0.006),
    "bf16_storage_f32_compute": (Policy(BF16, F32), 0.025),
    "fp8_e4m3fn_storage_bf16_compute": (Policy(E4M3, BF16), 0.3),
    "fp8_e5m2_storage_bf16_compute": (Policy(E5M2, BF16), 0.6),
    "f16_upcast_attention_f32_norms": (Policy(F16, F16, upcast_attention=True, f32_norms=True), 0.006),
    "int8": (Policy(int8=True), 0.1),  # measured 0.038 / 0.055 (sd15 / sdxl): Linears and convs int8
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@functools.cache
def model_and_reference(kind: str):
    model = tiny_unet(kind)
    cfg = tiny_unet_config(kind)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, cfg.in_channels, 8, 8, generator=g)
    args = (x, torch.tensor([999.0, 37.0]), torch.randn(2, 6, cfg.context_dim, generator=g))
    y = sdxl_adm(torch.randn(2, TINY_POOLED, generator=g), 512, 512) if cfg.adm_in_channels else None
    with torch.no_grad():
        ref = model(*args, y)
    return model, args, y, ref


def kept(name: str) -> bool:
    return name.split(".")[0] in ("time_embed", "label_emb")  # UNetModel.keep_f32


def expected_bytes(model: nn.Module, policy: Policy) -> int:
    """Bytes the documented storage rules give, computed from the f32 model's parameters."""
    total = 0
    skipped = matched_names(model, "int8_skip")  # UNetModel.int8_skip: attention q/k stay f32
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            n = p.numel()
            if kept(mname):
                total += 4 * n
            elif policy.int8 and mname in skipped:
                total += 4 * n
            elif policy.int8 and type(m) is nn.Linear:
                total += n + 4 * m.out_features if pname == "weight" else 4 * n  # int8 + f32 scale
            elif policy.int8 and type(m) is nn.Conv2d:  # int8 [K, N] padded to 8s + f32 scale
                k, n_out = int8_conv_gemm_shape(m)
                total += k * n_out + 4 * m.out_channels if pname == "weight" else 4 * n
            elif policy.storage in (E4M3, E5M2):
                vector = p.ndim < 2 or isinstance(m, (nn.GroupNorm, nn.LayerNorm))
                total += n * (policy.compute.itemsize if vector else 1)
            else:
                total += n * policy.storage.itemsize
    return total


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
@pytest.mark.parametrize("spec", list(SPECS))
@torch.no_grad()
def test_apply_precision_spec_dtype_bytes_and_error(kind, spec):
    policy, bound = SPECS[spec]
    model, args, y, ref = model_and_reference(kind)
    cast = apply_precision(model, policy)
    out = cast(*args, y)
    assert out.dtype == torch.float32
    assert weight_bytes(cast) == expected_bytes(model, policy)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel <= bound
    if spec != "f32":
        assert rel > 1e-5  # the policy really changed the arithmetic


def test_apply_precision_memory_ratios():
    model, *_ = model_and_reference("sd15")
    full = weight_bytes(model)
    ratio = {s: weight_bytes(apply_precision(model, SPECS[s][0])) / full for s in SPECS}
    assert ratio["f32"] == 1.0
    assert 0.5 < ratio["bf16"] == ratio["f16"] == ratio["bf16_storage_f32_compute"] < 0.53
    assert 0.25 < ratio["fp8_e4m3fn_storage_bf16_compute"] < 0.28
    int8 = apply_precision(model, SPECS["int8"][0])
    skipped = matched_names(model, "int8_skip")  # attention q/k: f32 under int8
    lin_f32 = sum(
        m.weight.numel() * 4 for n, m in model.named_modules()
        if type(m) is nn.Linear and not kept(n) and n not in skipped
    )
    lin_int8 = sum(
        m.weight_int8.numel() + 4 * m.weight_scale.numel() for m in int8.modules() if isinstance(m, Int8Linear)
    )
    assert 0.25 <= lin_int8 / lin_f32 < 0.27


@pytest.mark.parametrize("spec", ["bf16", "fp8_e4m3fn_storage_bf16_compute", "int8"])
def test_apply_precision_keep_f32_modules_stay_f32(spec):
    model, *_ = model_and_reference("sdxl")
    cast = apply_precision(model, SPECS[spec][0])
    for name, m in cast.named_modules():
        if kept(name) and name:
            assert all(p.dtype == F32 for p in m.parameters(recurse=False))
            if isinstance(m, CastLayer):
                assert m.compute_dtype == F32
            assert not isinstance(m, (Int8Linear, Int8Conv2d))
    conv = cast.input_blocks[1][0].in_layers[2]
    if spec == "int8":
        assert isinstance(conv, Int8Conv2d) and conv.weight_int8.dtype == torch.int8
    else:
        expected = {"bf16": BF16, "fp8_e4m3fn_storage_bf16_compute": E4M3}[spec]
        assert conv.weight.dtype == expected


@torch.no_grad()
def test_apply_precision_does_not_mutate_input():
    model, args, y, ref = model_and_reference("sd15")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    for policy, _ in SPECS.values():
        cast = apply_precision(model, policy)
        cast(*args, y)
    assert [type(m) for m in model.modules()] == classes
    after = model.state_dict()
    assert all(after[k].dtype == F32 and torch.equal(after[k], v) for k, v in before.items())
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not m.upcast_attention for m in model.modules() if isinstance(m, CrossAttention))
    assert torch.equal(model(*args, y), ref)


def test_apply_precision_same_dtype_shares_weights():
    model, *_ = model_and_reference("sd15")
    cast = apply_precision(model, Policy())
    assert cast is not model
    assert cast.out[2].weight.data_ptr() == model.out[2].weight.data_ptr()


def test_apply_precision_rejects_double_application_and_bad_dtypes():
    model, *_ = model_and_reference("sd15")
    with pytest.raises(ValueError, match="already has a precision"):
        apply_precision(apply_precision(model, Policy(BF16, BF16)), Policy())
    with pytest.raises(ValueError, match="compute dtype"):
        apply_precision(model, Policy(E4M3, E4M3))
    with pytest.raises(ValueError, match="storage dtype"):
        apply_precision(model, Policy(torch.int8, F32))


def test_apply_precision_upcast_attention_sets_flag_and_computes_in_f32():
    model, *_ = model_and_reference("sd15")
    cast = apply_precision(model, Policy(F16, F16, upcast_attention=True))
    attn = [m for m in cast.modules() if isinstance(m, CrossAttention)]
    assert attn and all(m.upcast_attention for m in attn)
    plain = apply_precision(model, Policy(F16, F16))
    assert not any(m.upcast_attention for m in plain.modules() if isinstance(m, CrossAttention))


def test_attention_upcast_matches_f32_softmax():
    from mixgraph.nodes.models.attention import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 16, generator=g) * 30 for _ in range(3))
    ref = attention(q, k, v, heads=2)
    q16, k16, v16 = q.half(), k.half(), v.half()
    up = attention(q16, k16, v16, heads=2, upcast=True)
    assert up.dtype == F16
    assert torch.equal(up, attention(q16.float(), k16.float(), v16.float(), heads=2).half())
    # [B, T, heads*dh] -> [B, heads, T, dh]: check head split against a manual per-head softmax
    qh, kh, vh = (t.view(2, 9, 2, 8).transpose(1, 2) for t in (q, k, v))
    manual = torch.softmax(qh @ kh.transpose(-1, -2) / 8**0.5, dim=-1) @ vh
    assert torch.allclose(ref, manual.transpose(1, 2).reshape(2, 9, 16), atol=1e-4)


def test_cast_group_norm_f32_statistics():
    g = torch.Generator().manual_seed(0)
    norm = nn.GroupNorm(32, 64)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(64, generator=g))
    x = (torch.randn(2, 64, 4, 4, generator=g) * 5 + 40).to(BF16)
    cast = apply_precision(nn.Sequential(norm), Policy(BF16, BF16, f32_norms=True))[0]
    assert isinstance(cast, CastGroupNorm) and cast.weight.dtype == BF16
    expected = F.group_norm(x.float(), 32, cast.weight.float(), cast.bias.float(), 1e-5).to(BF16)
    assert torch.equal(cast(x), expected)
    low = apply_precision(nn.Sequential(norm), Policy(BF16, BF16))[0]
    assert low.norm_dtype == BF16 and torch.equal(
        low(x), F.group_norm(x, 32, low.weight, low.bias, 1e-5)
    )


def test_apply_precision_half_cpu_convs_are_channels_last():
    model, args, y, _ = model_and_reference("sd15")
    cast = apply_precision(model, Policy(BF16, BF16))
    convs = [m for m in cast.modules() if isinstance(m, CastConv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert all(c.weight.is_contiguous() for c in apply_precision(model, Policy(BF16, F32)).modules()
               if isinstance(c, CastConv2d) and c.weight.shape[-1] > 1)


class _Probe(nn.Module):
    """Records the dtypes its forward sees; `t` is declared not to be cast at entry."""

    keep_f32: tuple[str, ...] = ("head",)
    keep_f32_inputs: tuple[str, ...] = ("t",)

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x, t, extra=None):
        self.seen.update(x=x.dtype, t=t.dtype, extra=extra[0].dtype, ids=extra[1].dtype)
        return {"out": self.head(self.body(x) * t[:, None]), "ids": extra[1]}


def test_apply_precision_entry_exit_casts():
    probe = apply_precision(_Probe(), Policy(BF16, BF16))
    ids = torch.arange(3)
    out = probe(torch.randn(3, 4), torch.tensor([999.0, 1.0, 2.0]), extra=[torch.zeros(1), ids])
    assert probe.seen == {"x": BF16, "t": F32, "extra": BF16, "ids": torch.int64}
    assert out["out"].dtype == F32 and torch.equal(out["ids"], ids)
    assert probe.head.weight.dtype == F32 and probe.body.weight.dtype == BF16


def test_int8_linear_stores_int8_and_is_accurate():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(256, 128)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(128, 256, generator=g) / 16)
    q = Int8Linear(lin, F32)
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.shape == (256, 128)
    assert weight_bytes(q) == 256 * 128 + 4 * 128 + 4 * 128  # int8 matrix, f32 scales, f32 bias
    x = torch.randn(5, 7, 256, generator=g)
    with torch.no_grad():
        ref, out = lin(x), q(x)
    assert out.shape == (5, 7, 128) and out.dtype == F32
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 1e-5 < rel < 0.01


def test_no_stray_half_calls_in_runtime():
    """Precision is applied by cast.py only (STYLE rule 6): no .half()/.bfloat16() in nodes/."""
    root = Path(__file__).resolve().parents[1] / "nodes"
    bad = [
        f"{p.relative_to(root.parent)}:{i}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.(half|bfloat16)\(\)", line.split("#")[0])
    ]
    assert not bad, f"use nodes.weights.cast.apply_precision instead of .half()/.bfloat16(): {bad}"


def test_apply_precision_keep_stored_embedding_table_is_shared_as_is():
    """CLIP's token table keeps the dtype it arrives in (an f32 file's view stays lazily paged);
    the layer still returns compute-dtype rows and other weights take the storage dtype."""
    from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel
    from mixgraph.nodes.weights.store import dtype_rule

    cfg = CLIPTextConfig(vocab_size=64, width=32, layers=1, heads=2, max_positions=8,
                         intermediate=64, projection_dim=None, activation="quick_gelu")
    model = CLIPTextModel(cfg)
    table = model.text_model.embeddings.token_embedding.weight
    out = apply_precision(model, Policy(BF16, BF16))
    new_table = out.text_model.embeddings.token_embedding.weight
    assert new_table.dtype == torch.float32 and new_table.data_ptr() == table.data_ptr()
    assert out.text_model.embeddings.position_embedding.weight.dtype == BF16
    assert out.text_model.embeddings.token_embedding(torch.tensor([[1, 2]])).dtype == BF16
    rule = dtype_rule(model)
    assert rule("text_model.embeddings.token_embedding.weight", BF16) is None
    assert rule("text_model.embeddings.position_embedding.weight", BF16) == BF16
