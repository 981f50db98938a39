"""GGML's block quantisation formats, dequantised with torch (for GGUF weight files).

Each quantised type stores a row of a weight as consecutive blocks of ``block_size`` values in
``type_size`` bytes (little-endian); a dequantiser takes the raw bytes of ``n`` blocks as a uint8
tensor ``[n, type_size]`` and returns their values as float32 ``[n, block_size]``. Written from
the block layouts of ggml (``ggml-common.h``'s ``block_q4_0`` ... ``block_q6_K``, dequantised as in
``ggml-quants.c``'s ``dequantize_row_*``), in the same arithmetic order (scale products first, in
float32), so they agree bit for bit with gguf-py's numpy reference (``gguf.quants``), which the
tests compare against.

Formats (d, m, dmin: float16 scales; q: unsigned codes unless said):

- ``Q8_0`` (32 values, 34 bytes): d, 32 int8 q; x = d * q.
- ``Q4_0`` (32, 18): d, 16 bytes of nibbles (low nibbles are values 0-15, high 16-31); x = d * (q - 8).
- ``Q4_1`` (32, 20): d, m, nibbles as Q4_0; x = d * q + m.
- ``Q5_0`` (32, 22): d, 32-bit qh (bit i = the fifth bit of value i), nibbles; x = d * (q - 16).
- ``Q5_1`` (32, 24): d, m, qh, nibbles; x = d * q + m.
- K-quants (256 values per super-block, sub-blocks of 16 or 32 with their own scales):
  ``Q2_K`` (84): 16 bytes of 4-bit scale | 4-bit min, 64 bytes of 2-bit q, d, dmin;
  x = d * sc * q - dmin * mn.
  ``Q3_K`` (110): 32 bytes high-bit mask, 64 bytes of 2-bit q, 12 bytes of 6-bit scales, d;
  x = d * (sc - 32) * (q - 4 * (1 - hbit)).
  ``Q4_K`` (144): d, dmin, 12 bytes of 6-bit scales and mins (8 sub-blocks of 32), 128 bytes of
  nibbles; x = d * sc * q - dmin * mn.
  ``Q5_K`` (176): as Q4_K plus 32 bytes of fifth bits.
  ``Q6_K`` (210): 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d;
  x = d * sc * (q - 32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BlockFormat", "FORMATS", "dequantize_blocks", "dequantize", "CHUNK_VALUES"]

QK_K = 256  # values per K-quant super-block


def _f16(raw: Tensor, start: int) -> Tensor:
    """The float16 at byte ``start`` of each block, as float32 ``[n, 1]``."""
    return raw[:, start:start + 2].contiguous().view(torch.float16).to(torch.float32)


def _bits(raw: Tensor, shifts: tuple[int, ...], mask: int) -> Tensor:
    """``(raw[..., None, :] >> s) & mask`` for each shift: ``[n, k]`` -> ``[n, len(shifts), k]``."""
    s = torch.tensor(shifts, dtype=torch.uint8, device=raw.device).reshape(1, -1, 1)
    return (raw.unsqueeze(1) >> s) & mask


def _nibbles32(qs: Tensor) -> Tensor:
    """16 bytes per block -> 32 codes: low nibbles are values 0-15, high nibbles 16-31. [n, 16] -> [n, 32]"""
    return _bits(qs, (0, 4), 0x0F).reshape(qs.shape[0], 32)


def _fifth_bits(qh: Tensor) -> Tensor:
    """4 bytes per block (a little-endian uint32) -> bit i of value i. [n, 4] -> [n, 32]"""
    return _bits(qh, tuple(range(8)), 1).transpose(1, 2).reshape(qh.shape[0], 32)  # [n, 4 bytes, 8 bits]


def _q8_0(raw: Tensor) -> Tensor:
    return _f16(raw, 0) * raw[:, 2:34].contiguous().view(torch.int8).to(torch.float32)


def _q4_0(raw: Tensor) -> Tensor:
    q = _nibbles32(raw[:, 2:18]).to(torch.int8) - 8
    return _f16(raw, 0) * q.to(torch.float32)


def _q4_1(raw: Tensor) -> Tensor:
    q = _nibbles32(raw[:, 4:20]).to(torch.float32)
    return _f16(raw, 0) * q + _f16(raw, 2)


def _q5_0(raw: Tensor) -> Tensor:
    q = (_nibbles32(raw[:, 6:22]) | (_fifth_bits(raw[:, 2:6]) << 4)).to(torch.int8) - 16
    return _f16(raw, 0) * q.to(torch.float32)


def _q5_1(raw: Tensor) -> Tensor:
    q = (_nibbles32(raw[:, 8:24]) | (_fifth_bits(raw[:, 4:8]) << 4)).to(torch.float32)
    return _f16(raw, 0) * q + _f16(raw, 2)


def _q2_k(raw: Tensor) -> Tensor:
    n = raw.shape[0]
    scales, qs = raw[:, 0:16], raw[:, 16:80]
    d, dmin = _f16(raw, 80), _f16(raw, 82)
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    # value h*128 + j*32 + l: byte h*32 + l of qs, bits 2j..2j+1
    q = _bits(qs.reshape(n * 2, 32), (0, 2, 4, 6), 0x03)  # [2n, 4, 32]
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k_scales(sc: Tensor) -> Tensor:
    """12 bytes -> 16 signed 6-bit scales: low 4 bits of scale i in byte i (i < 8) or the high
    nibble of byte i - 8; high 2 bits in byte 8 + i % 4 at bit 2 * (i // 4). [n, 12] -> [n, 16]"""
    low = _bits(sc[:, 0:8], (0, 4), 0x0F).reshape(sc.shape[0], 16)
    high = _bits(sc[:, 8:12], (0, 2, 4, 6), 0x03).reshape(sc.shape[0], 16)
    return (low | (high << 4)).to(torch.int8) - 32


def _q3_k(raw: Tensor) -> Tensor:
    n = raw.shape[0]
    hmask, qs, sc = raw[:, 0:32], raw[:, 32:96], raw[:, 96:108]
    d = _f16(raw, 108)
    dl = (d * _q3_k_scales(sc).to(torch.float32)).reshape(n, 16, 1)
    low = _bits(qs.reshape(n * 2, 32), (0, 2, 4, 6), 0x03).reshape(n, 16, 16)  # value h*128 + j*32 + l
    high = _bits(hmask, tuple(range(8)), 1).reshape(n, 16, 16)  # value b*32 + l: bit b of byte l
    q = low.to(torch.int8) - ((high ^ 1) << 2).to(torch.int8)  # the mask bit set means no offset
    return (dl * q.to(torch.float32)).reshape(n, QK_K)


def _k4_scales(sc: Tensor) -> tuple[Tensor, Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's ``get_scale_min_k4``): for
    j < 4, scale = b[j] & 63, min = b[j + 4] & 63; else scale = (b[j + 4] & 15) | (b[j - 4] >> 6) << 4,
    min = (b[j + 4] >> 4) | (b[j] >> 6) << 4. [n, 12] -> ([n, 8], [n, 8])"""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 6) << 4)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 6) << 4)], dim=1)
    return scale, mins


def _k4_affine(raw: Tensor, q: Tensor) -> Tensor:
    """Q4_K / Q5_K: d * sc * q - dmin * mn per sub-block of 32. q: [n, 8, 32] codes"""
    n = raw.shape[0]
    sc, mn = _k4_scales(raw[:, 4:16])
    dl = (_f16(raw, 0) * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (_f16(raw, 2) * mn.to(torch.float32)).reshape(n, 8, 1)
    return (dl * q.to(torch.float32) - ml).reshape(n, QK_K)


def _q4_k(raw: Tensor) -> Tensor:
    n = raw.shape[0]
    # value c*64 + k*32 + l: nibble k of byte c*32 + l
    q = _bits(raw[:, 16:144].reshape(n * 4, 32), (0, 4), 0x0F).reshape(n, 8, 32)
    return _k4_affine(raw, q)


def _q5_k(raw: Tensor) -> Tensor:
    n = raw.shape[0]
    low = _bits(raw[:, 48:176].reshape(n * 4, 32), (0, 4), 0x0F).reshape(n, 8, 32)
    high = _bits(raw[:, 16:48], tuple(range(8)), 1)  # [n, 8, 32]: value b*32 + l is bit b of byte l
    return _k4_affine(raw, low | (high << 4))


def _q6_k(raw: Tensor) -> Tensor:
    n = raw.shape[0]
    ql, qh, sc = raw[:, 0:128], raw[:, 128:192], raw[:, 192:208]
    d = _f16(raw, 208)
    # value h*128 + k*32 + l: nibble k // 2 of ql byte h*64 + (k % 2)*32 + l, bits 2k of qh byte h*32 + l
    low = _bits(ql.reshape(n * 2, 64), (0, 4), 0x0F).reshape(n, 2, 4, 32)
    high = _bits(qh.reshape(n * 2, 32), (0, 2, 4, 6), 0x03).reshape(n, 2, 4, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    dl = (d * sc.contiguous().view(torch.int8).to(torch.float32)).reshape(n, 16, 1)
    return (dl * q.reshape(n, 16, 16).to(torch.float32)).reshape(n, QK_K)


@dataclass(frozen=True)
class BlockFormat:
    """One quantised type: its GGML name and id, values and bytes per block, dequantiser."""

    name: str
    ggml_type: int  # ``gguf.GGMLQuantizationType`` value
    block_size: int
    type_size: int
    dequantize: Callable[[Tensor], Tensor]


FORMATS: dict[int, BlockFormat] = {f.ggml_type: f for f in (
    BlockFormat("Q4_0", 2, 32, 18, _q4_0),
    BlockFormat("Q4_1", 3, 32, 20, _q4_1),
    BlockFormat("Q5_0", 6, 32, 22, _q5_0),
    BlockFormat("Q5_1", 7, 32, 24, _q5_1),
    BlockFormat("Q8_0", 8, 32, 34, _q8_0),
    BlockFormat("Q2_K", 10, QK_K, 84, _q2_k),
    BlockFormat("Q3_K", 11, QK_K, 110, _q3_k),
    BlockFormat("Q4_K", 12, QK_K, 144, _q4_k),
    BlockFormat("Q5_K", 13, QK_K, 176, _q5_k),
    BlockFormat("Q6_K", 14, QK_K, 210, _q6_k),
)}


def dequantize_blocks(fmt: BlockFormat, raw: Tensor) -> Tensor:
    """The values of whole blocks: uint8 bytes (any shape, ``type_size`` * n bytes) -> float32 [n, block_size]."""
    blocks = raw.reshape(-1, fmt.type_size)  # [..., bytes] -> [n, type_size]
    return fmt.dequantize(blocks)


#: values dequantised per step: the intermediates of one step (codes, float32 products) stay a few
#: MB, so a weight's dequantisation peaks at about its output, not several times it
CHUNK_VALUES = 1 << 20


def dequantize(fmt: BlockFormat, raw: Tensor, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
    """A quantised tensor of logical ``shape`` (torch order, the last dim the row) from its raw
    bytes, in ``dtype`` (each value dequantised in float32, then cast), written chunk by chunk
    into the output."""
    blocks = raw.reshape(-1, fmt.type_size)  # [..., bytes] -> [n, type_size]
    n = blocks.shape[0]
    step = max(1, CHUNK_VALUES // fmt.block_size)
    if n <= step:
        out = fmt.dequantize(blocks)
        return (out if dtype == torch.float32 else out.to(dtype)).reshape(shape)  # [n, block] -> shape
    out = torch.empty(n, fmt.block_size, dtype=dtype, device=raw.device)
    for i in range(0, n, step):
        out[i:i + step] = fmt.dequantize(blocks[i:i + step])  # cast on the copy where dtype differs
    return out.reshape(shape)  # [n, block] -> shape
