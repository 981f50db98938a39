"""A weight kept in a GGUF block format in memory and dequantised when it is used (also an int8
file's layers, in the block format ``quantized.int8_format``: the same mechanism).

``QuantizedTensor`` is a torch tensor subclass (a "wrapper" tensor: no storage of its own) that
reports the weight's logical shape and float32 dtype while holding only the file's quantised
bytes (``raw``, uint8, usually a view of the memory-mapped file) and its format. So everything
that sees a model's weights as tensors keeps working unchanged: ``load_state_dict(assign=True)``
checks the shape, the weight store caches it like any tensor, and any torch operation on it (a
LoRA merge's ``w.to(torch.float32)``, a model merge, a ``copy_`` from it into a cast buffer, a
convolution) runs on the dequantised float32 values (``__torch_dispatch__``), so nothing can read
the bytes as if they were weights. The cast layers (``cast.py``) dequantise it explicitly on every
forward (``dequantize(dtype)``), which is the use the format is for: the dequantised copy lives
only for the layer's call.

Operations that would write into it (``copy_`` into it, ``mul_``, ...) are refused: a cached
weight is never modified in place (the store's rule), and a write would otherwise land in a
temporary dequantised copy and be lost. ``detach`` / ``alias`` keep it quantised (sharing the
bytes); moving it to another device moves the bytes; a dtype conversion dequantises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_map_only

from mixgraph.nodes.weights.gguf_quants import FORMATS, BlockFormat, dequantize

__all__ = ["QuantizedTensor", "is_quantized", "storage_nbytes"]

_aten = torch.ops.aten
_KEEP = {_aten.detach.default, _aten.alias.default}


class QuantizedTensor(Tensor):
    """A quantised GGUF weight (see the module docstring): ``raw`` bytes, ``fmt`` its block format."""

    raw: Tensor
    fmt: BlockFormat

    @staticmethod
    def __new__(cls, raw: Tensor, fmt: BlockFormat, shape: tuple[int, ...]):
        return Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=torch.float32, device=raw.device,
                                             requires_grad=False)

    def __init__(self, raw: Tensor, fmt: BlockFormat, shape: tuple[int, ...]):
        numel = 1
        for s in shape:
            numel *= int(s)
        if numel % fmt.block_size or raw.numel() != numel // fmt.block_size * fmt.type_size:
            raise ValueError(f"{fmt.name} weight of shape {list(shape)}: {raw.numel()} bytes given, "
                             f"expected {numel // fmt.block_size * fmt.type_size}")
        self.raw = raw
        self.fmt = fmt

    @classmethod
    def from_ggml(cls, raw: Tensor, ggml_type: int, shape: tuple[int, ...]) -> "QuantizedTensor":
        return cls(raw, FORMATS[ggml_type], shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight's values as a plain tensor of ``dtype`` (computed in float32)."""
        return dequantize(self.fmt, self.raw, tuple(self.shape), dtype)

    def rows(self, ids: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """``F.embedding(ids, self)`` dequantising only the rows looked up (a 2-D table whose rows
        are whole blocks: a quantised vocabulary of 32k-150k rows is never expanded whole).
        ids [...] -> [..., dim]"""
        n, dim = self.shape
        if dim % self.fmt.block_size:  # rows are no whole blocks (a flattened weight): the whole table
            return torch.nn.functional.embedding(ids, self.dequantize(dtype))
        table = self.raw.reshape(n, -1)  # [n * row bytes] -> [n, row bytes]
        picked = table[ids.reshape(-1)]  # [k, row bytes]
        return dequantize(self.fmt, picked, (*ids.shape, dim), dtype)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"QuantizedTensor({self.fmt.name}, shape={list(self.shape)}, {self.raw.numel()} bytes)"

    def __deepcopy__(self, memo: dict) -> Tensor:
        """A copy sharing the bytes (they are never written); a parameter stays a parameter."""
        out = QuantizedTensor(self.raw, self.fmt, tuple(self.shape))
        if isinstance(self, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=False)
        memo[id(self)] = out
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _KEEP:
            t = args[0]
            return cls(t.raw, t.fmt, tuple(t.shape))
        if func is _aten._to_copy.default and isinstance(args[0], cls):
            t, device = args[0], kwargs.get("device")
            if (device is not None and torch.device(device) != t.raw.device
                    and kwargs.get("dtype") in (None, torch.float32)):  # a move, not a conversion
                return cls(t.raw.to(device), t.fmt, tuple(t.shape))
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                target = args[i] if i < len(args) else kwargs.get(a.name)
                if isinstance(target, cls):
                    raise RuntimeError(f"{func}: a {target.fmt.name} GGUF weight cannot be modified in place "
                                       f"(dequantise it first: .dequantize())")
        args, kwargs = tree_map_only(cls, lambda t: t.dequantize(), (args, kwargs))
        return func(*args, **kwargs)


def is_quantized(t: Any) -> bool:
    """Whether ``t`` is a GGUF weight kept quantised."""
    return isinstance(t, QuantizedTensor)


def storage_nbytes(t: Tensor) -> int:
    """Bytes ``t`` holds: a quantised weight's raw bytes, else numel x element size."""
    if isinstance(t, QuantizedTensor):
        return t.raw.numel()
    return t.numel() * t.element_size()
