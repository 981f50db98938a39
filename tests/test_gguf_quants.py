"""GGUF block formats (``nodes/weights/gguf_quants.py``) against gguf-py's numpy reference
dequantisers, and the quantised weight tensor (``nodes/weights/gguf_tensor.py``)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T
from torch import nn

from mixgraph.nodes.weights.gguf_quants import FORMATS, dequantize_blocks
from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor, is_quantized, storage_nbytes
from tests.gguf_fixtures import quantize_q4_k

#: byte offsets of each type's float16 scale fields (d, m / dmin), to put sane values there
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
              "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
QUANTISABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf-py has encoders for these


def _random_blocks(fmt, n: int, seed: int) -> np.ndarray:
    """Random raw blocks: random bytes, the float16 scales set to finite values of both signs."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, fmt.type_size), dtype=np.uint8)
    for off in F16_FIELDS[fmt.name]:
        scales = (rng.standard_normal(n) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n, 2)
    return raw


def test_formats_match_gguf_sizes():
    assert sorted(f.name for f in FORMATS.values()) == sorted(F16_FIELDS)
    for t, fmt in FORMATS.items():
        assert T(t).name == fmt.name
        assert GGML_QUANT_SIZES[T(t)] == (fmt.block_size, fmt.type_size)


@pytest.mark.parametrize("name", sorted(F16_FIELDS))
def test_dequantiser_equals_the_numpy_reference_on_random_blocks(name):
    fmt = next(f for f in FORMATS.values() if f.name == name)
    raw = _random_blocks(fmt, 96, seed=len(name) + fmt.ggml_type)
    want = quants.dequantize(raw, T(fmt.ggml_type)).reshape(96, fmt.block_size)
    got = dequantize_blocks(fmt, torch.from_numpy(raw))
    assert got.dtype == torch.float32 and got.shape == (96, fmt.block_size)
    np.testing.assert_array_equal(got.numpy(), want)  # same arithmetic order: bit for bit


@pytest.mark.parametrize("name", QUANTISABLE)
def test_dequantiser_on_gguf_py_quantised_data(name):
    qt = T[name]
    x = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    data = quants.quantize(x, qt)
    want = quants.dequantize(data, qt)
    got = dequantize_blocks(FORMATS[int(qt)], torch.from_numpy(data)).reshape(16, 256)
    np.testing.assert_array_equal(got.numpy(), want)
    assert np.abs(want - x).max() < 0.15 * np.abs(x).max()  # and it is the data (4 bits or more)


def test_q4_k_test_encoder_round_trips():
    """The tests' Q4_K encoder (gguf-py has none) gives blocks both dequantisers read alike,
    close to the data."""
    x = np.random.default_rng(2).standard_normal((8, 512)).astype(np.float32)
    data = quantize_q4_k(x)
    want = quants.dequantize(data, T.Q4_K).reshape(x.shape)
    got = dequantize_blocks(FORMATS[int(T.Q4_K)], torch.from_numpy(data)).reshape(x.shape)
    np.testing.assert_array_equal(got.numpy(), want)
    assert np.abs(want - x).max() < 0.15 * np.abs(x).max()


# ---------------------------------------------------------------------------------------------
# the quantised tensor


def _q8(shape=(8, 64), seed=0) -> QuantizedTensor:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return QuantizedTensor.from_ggml(torch.from_numpy(quants.quantize(x, T.Q8_0)).reshape(-1), int(T.Q8_0), shape)


def test_quantized_tensor_reads_as_its_dequantised_values():
    q = _q8()
    d = q.dequantize()
    assert is_quantized(q) and q.shape == (8, 64) and q.dtype == torch.float32
    assert storage_nbytes(q) == 8 * 2 * 34 and storage_nbytes(d) == 8 * 64 * 4
    assert torch.equal(q.to(torch.float32, copy=True), d) and not is_quantized(q.to(torch.float32, copy=True))
    assert torch.equal(q.to(torch.bfloat16), d.to(torch.bfloat16))
    assert torch.equal(q * 2 + 1, d * 2 + 1)
    x = torch.randn(3, 64)
    assert torch.equal(torch.nn.functional.linear(x, q), torch.nn.functional.linear(x, d))
    buf = torch.empty(8, 64)
    assert torch.equal(buf.copy_(q), d)  # a copy from it: its values
    assert q.dequantize(torch.float16).dtype == torch.float16


def test_quantized_tensor_refuses_writes_and_shares_its_bytes():
    q = _q8()
    with pytest.raises(RuntimeError, match="cannot be modified in place"):
        q.mul_(2)
    with pytest.raises(RuntimeError, match="cannot be modified in place"):
        q.copy_(torch.zeros(8, 64))
    assert q.detach().raw is q.raw
    with torch.device("meta"):
        layer = nn.Linear(64, 8)
    layer.load_state_dict({"weight": q, "bias": torch.zeros(8)}, assign=True)
    assert is_quantized(layer.weight) and isinstance(layer.weight, nn.Parameter)
    clone = copy.deepcopy(layer)
    assert is_quantized(clone.weight) and clone.weight.raw is q.raw
    assert torch.equal(clone(torch.ones(1, 64)), torch.ones(1, 64) @ q.dequantize().t())


def test_quantized_tensor_checks_its_byte_count():
    raw = torch.zeros(34 * 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="Q8_0 weight of shape \\[2, 64\\]: 102 bytes given, expected 136"):
        QuantizedTensor.from_ggml(raw, int(T.Q8_0), (2, 64))


def test_every_type_reads_from_a_file_in_its_torch_shape(tmp_path):
    """One tensor of each type (random blocks) in a GGUF file: read back quantised, in the torch
    shape (GGUF lists dims reversed), with the reference's values."""
    import gguf

    from mixgraph.nodes.weights.gguf_file import contents

    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(str(path), arch="sd1")
    want = {}
    for i, (name, offsets) in enumerate(sorted(F16_FIELDS.items())):
        fmt = next(f for f in FORMATS.values() if f.name == name)
        rows = 3
        raw = _random_blocks(fmt, rows * 2, seed=i).reshape(rows, 2 * fmt.type_size)  # [rows, 2 blocks]
        writer.add_tensor(f"w.{name}", raw, raw_dtype=T(fmt.ggml_type))
        want[f"w.{name}"] = quants.dequantize(raw, T(fmt.ggml_type))  # [rows, 2 * block]
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    tensors = contents(path).tensors
    for key, ref in want.items():
        t = tensors[key].read()
        assert is_quantized(t) and tuple(t.shape) == ref.shape == tensors[key].shape
        np.testing.assert_array_equal(t.dequantize().numpy(), ref)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
def test_chunked_dequantisation_equals_the_whole(monkeypatch, name):
    """A weight larger than a chunk is dequantised chunk by chunk into its output, in float32 or
    straight into the compute dtype, with the same values."""
    from mixgraph.nodes.weights import gguf_quants

    fmt = next(f for f in FORMATS.values() if f.name == name)
    raw = torch.from_numpy(_random_blocks(fmt, 40, seed=3)).reshape(-1)
    shape = (8, 5 * fmt.block_size)
    want = torch.from_numpy(quants.dequantize(raw.numpy().reshape(40, -1), T(fmt.ggml_type))).reshape(shape)
    monkeypatch.setattr(gguf_quants, "CHUNK_VALUES", 3 * fmt.block_size)  # 14 chunks, the last short
    assert torch.equal(gguf_quants.dequantize(fmt, raw, shape), want)
    assert torch.equal(gguf_quants.dequantize(fmt, raw, shape, torch.bfloat16), want.to(torch.bfloat16))
