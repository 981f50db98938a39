"""GGUF weight files for tests: a state dict written with gguf-py's ``GGUFWriter`` the way
ComfyUI-GGUF's converter lays it out (model state-dict keys, ``general.architecture``, 1-D and
small tensors in F32, weights whose rows are no multiple of 256 flattened to [n / 256, 256] with
``comfy.gguf.orig_shape.<key>``), and a simple Q4_K encoder (gguf-py quantises no K-quants)."""

from __future__ import annotations

import os

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

QK_K = 256


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 values (a multiple of 256) -> Q4_K blocks [n, 144] uint8: per sub-block of 32 a
    6-bit scale and min against the block's f16 d / dmin, 4-bit codes (plain rounding, not
    llama.cpp's search: an encoder for tests)."""
    sub = x.astype(np.float32).reshape(-1, 8, 32)
    n = sub.shape[0]
    lo = np.minimum(sub.min(axis=2), 0.0)
    scale, mins = (sub.max(axis=2) - lo) / 15.0, -lo  # [n, 8]
    d = (scale.max(axis=1, keepdims=True) / 63.0).astype(np.float16)
    dmin = (mins.max(axis=1, keepdims=True) / 63.0).astype(np.float16)
    safe_d = np.where(d == 0, 1, d).astype(np.float32)
    safe_m = np.where(dmin == 0, 1, dmin).astype(np.float32)
    sc = np.clip(np.rint(scale / safe_d), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(mins / safe_m), 0, 63).astype(np.uint8)
    eff = (d.astype(np.float32) * sc)[:, :, None]
    off = (dmin.astype(np.float32) * mn)[:, :, None]
    q = np.clip(np.rint((sub + off) / np.where(eff == 0, 1, eff)), 0, 15).astype(np.uint8)  # [n, 8, 32]
    packed = np.zeros((n, 12), np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), packed, qs], axis=1)


def quantize(a: np.ndarray, qtype: T) -> np.ndarray:
    """``a`` in ``qtype``: gguf-py's quantiser where it has one, else ours (Q4_K)."""
    if qtype == T.Q4_K:
        return quantize_q4_k(a).reshape(*a.shape[:-1], a.shape[-1] // QK_K * 144)
    return gguf.quants.quantize(a, qtype)


def dequantized(a: np.ndarray, qtype: T) -> np.ndarray:
    """What the file holds for ``a`` stored as ``qtype``, by gguf-py's reference dequantiser."""
    return gguf.quants.dequantize(quantize(a, qtype), qtype).reshape(a.shape)


def stored_type(key: str, t: torch.Tensor, qtype: T) -> T:
    """ComfyUI-GGUF's choice: 1-D and small tensors F32, the rest in ``qtype``."""
    if t.ndim <= 1 or t.numel() < 1024 or qtype in (T.F32, T.F16, T.BF16):
        return T.F32 if t.ndim <= 1 else qtype if qtype in (T.F16, T.BF16) else T.F32
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if t.numel() % QK_K == 0 or t.shape[-1] % block == 0 else T.F16


def write_gguf(path: str | os.PathLike, sd: dict[str, torch.Tensor], qtype: T, arch: str | None = "sd1",
               types: dict[str, T] | None = None) -> dict[str, torch.Tensor]:
    """Write ``sd`` as a GGUF file; returns the tensors the file holds, dequantised (float32),
    by gguf-py's reference (what loading the file must give). ``types`` overrides per key."""
    writer = gguf.GGUFWriter(os.fspath(path), arch=arch or "unused")
    if arch is None:  # stable-diffusion.cpp's files: no general.architecture
        writer.kv_data[0].pop("general.architecture", None)
    out = {}
    for key, t in sd.items():
        a = t.detach().float().numpy()
        qt = (types or {}).get(key) or stored_type(key, t, qtype)
        if qt in (T.F32, T.F16, T.BF16):
            data = gguf.quants.quantize(a, qt)
            writer.add_tensor(key, data, raw_dtype=qt)
            out[key] = torch.from_numpy(gguf.quants.dequantize(data, qt).reshape(a.shape).copy())
            continue
        block = gguf.GGML_QUANT_SIZES[qt][0]
        flat = a if a.shape[-1] % block == 0 else a.reshape(-1, QK_K)  # [..] -> [n / 256, 256]
        if flat is not a:
            writer.add_array(f"comfy.gguf.orig_shape.{key}", [int(s) for s in a.shape])
        data = quantize(flat, qt)
        writer.add_tensor(key, data, raw_dtype=qt)
        out[key] = torch.from_numpy(gguf.quants.dequantize(data, qt).reshape(a.shape).copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
