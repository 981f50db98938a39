"""Reading weight files: lazy safetensors access, header-only inspection, guarded pickle loading.

Tensor bytes are read with the ``safetensors`` library (``safe_open`` memory-maps the file); the
8-byte length + JSON header is parsed here by hand only to *validate* a file before use, so a
truncated or corrupt download fails with a message that names the file and says what is wrong
instead of a bare ``SafetensorError``.

Tensors are converted to the target dtype one at a time as they are read, so loading a bf16 copy
of an f32 file never holds an f32 copy of the whole model. ``safe_open`` memory-maps the file
(private mapping): a tensor kept in its stored dtype is a zero-copy view of the page cache, and
after a tensor is converted its source pages are handed back (``madvise(MADV_DONTNEED)``: they are
clean, so the kernel would simply re-read them) — otherwise every page read stays resident until
the whole file is closed, and an f32 → bf16 load would peak at f32 + bf16 bytes instead of bf16.

Pickle-based files (``.ckpt``, ``.pt``, ``.bin``, ``.pth``) are opened only with
``torch.load(weights_only=True)`` (no code can run) and a warning (DESIGN.md §7).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import os
import struct
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open

from mixgraph.nodes.weights import gguf_file
from mixgraph.nodes.weights.gguf_tensor import is_quantized
from mixgraph.nodes.weights.quantized import QuantScheme, kept_int8_layers, quant_scheme, read_quantized

__all__ = [
    "held_quantised",
    "TensorInfo",
    "WeightSource",
    "WeightFileError",
    "PICKLE_SUFFIXES",
    "SAFETENSORS_SUFFIXES",
    "inspect_file",
    "read_tensors",
    "read_source",
    "source_dtypes",
    "quantization",
    "byte_ranges",
    "will_need",
]

SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")

_ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format limit


class WeightFileError(ValueError):
    """A weight file that cannot be read: truncated, corrupt, or of an unknown format."""


def _gguf(path: str) -> gguf_file.GGUFContents:
    """A GGUF file's contents (``gguf_file``), its errors as ``WeightFileError``."""
    try:
        return gguf_file.contents(path)
    except gguf_file.GGUFFileError as e:
        raise WeightFileError(str(e)) from e


@dataclass(frozen=True)
class TensorInfo:
    """Shape and stored dtype of one tensor, known without reading its data."""

    shape: tuple[int, ...]
    dtype: torch.dtype


_memory_ids = itertools.count()


@dataclass(frozen=True)
class WeightSource:
    """Where one model's weights come from, and how to turn them into our module's keys.

    path:      file on disk, or None for an in-memory state dict (tests).
    size, mtime_ns: the file's identity at detection time; a rewritten file is a new source.
    prefix:    only keys starting with this are read, and it is stripped ("" = whole file).
    layout:    key layout of the stored tensors: "ldm" (our module names after stripping the
               prefix), "diffusers_unet", "diffusers_vae", "open_clip", "hf_clip". The loader
               registers a converter per layout (``loader.to_module_keys``).
    tensors:   the in-memory state dict when path is None (excluded from hash and equality;
               ``token`` identifies it instead).
    """

    path: str | None
    size: int = 0
    mtime_ns: int = 0
    prefix: str = ""
    layout: str = "ldm"
    token: str = ""
    tensors: Mapping[str, torch.Tensor] | None = field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike, prefix: str = "", layout: str = "ldm") -> "WeightSource":
        path = os.path.abspath(os.fspath(path))
        st = os.stat(path)
        return cls(path=path, size=st.st_size, mtime_ns=st.st_mtime_ns, prefix=prefix, layout=layout)

    @classmethod
    def from_state_dict(
        cls, state_dict: Mapping[str, torch.Tensor], prefix: str = "", layout: str = "ldm", name: str = "memory"
    ) -> "WeightSource":
        """An in-memory source (tests). Each call is a distinct identity."""
        return cls(path=None, prefix=prefix, layout=layout, token=f"{name}#{next(_memory_ids)}", tensors=state_dict)

    def with_prefix(self, prefix: str, layout: str | None = None) -> "WeightSource":
        return WeightSource(
            self.path, self.size, self.mtime_ns, prefix, layout or self.layout, self.token, self.tensors
        )

    @property
    def file_identity(self) -> tuple:
        """Identity of the underlying file (or memory dict), independent of prefix and layout."""
        return ("mem", self.token) if self.path is None else ("file", self.path, self.size, self.mtime_ns)

    @property
    def identity(self) -> tuple:
        """Cache identity of these weights: file identity + the part of it read."""
        return self.file_identity + (self.prefix, self.layout)

    @property
    def name(self) -> str:
        return os.path.basename(self.path) if self.path else self.token


# --------------------------------------------------------------------------------------------
# header-only inspection


def _is_pickle(path: str) -> bool:
    return path.lower().endswith(PICKLE_SUFFIXES)


def _safetensors_header(path: str) -> dict:
    """Parse and validate the safetensors header; raise WeightFileError naming what is wrong."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightFileError(f"{path}: not a safetensors file: only {size} bytes (truncated?)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER_BYTES:
                raise WeightFileError(
                    f"{path}: not a safetensors file: header length field is {n} bytes "
                    f"(corrupt file, or another format with a .safetensors name)"
                )
            if 8 + n > size:
                raise WeightFileError(
                    f"{path}: truncated safetensors file: the header needs {8 + n} bytes but the file "
                    f"has {size}; download it again"
                )
            raw = f.read(n)
    except OSError as e:
        raise WeightFileError(f"{path}: cannot read weight file: {e}") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightFileError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from e
    if not isinstance(header, dict):
        raise WeightFileError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            entry["shape"], entry["dtype"]
        except (TypeError, KeyError, ValueError) as e:
            raise WeightFileError(f"{path}: corrupt safetensors header entry for {key!r}") from e
        data_end = max(data_end, int(end))
    if 8 + n + data_end > size:
        raise WeightFileError(
            f"{path}: truncated safetensors file: the header declares {data_end} bytes of tensor data "
            f"but only {size - 8 - n} are present ({size} bytes in all); download it again"
        )
    return header


def file_metadata(path: str | os.PathLike) -> dict[str, str]:
    """A safetensors file's `__metadata__` (strings), from its header only; {} for a pickle file
    or a header without one."""
    path = os.fspath(path)
    if _is_pickle(path) or gguf_file.is_gguf(path):
        return {}
    meta = _safetensors_header(path).get("__metadata__")
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def inspect_file(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Key → (shape, dtype) for every tensor, without reading tensor data from safetensors files.

    Pickle files have no separate header: they are loaded (weights_only, memory-mapped where the
    zip format allows) and described.
    """
    path = os.fspath(path)
    if _is_pickle(path):
        return {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in _load_pickle(path).items()}
    if gguf_file.is_gguf(path):  # quantised tensors: their logical shape, float32
        return {k: TensorInfo(t.shape, t.dtype) for k, t in _gguf(path).tensors.items()}
    out: dict[str, TensorInfo] = {}
    for key, entry in _safetensors_header(path).items():
        if key == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise WeightFileError(f"{path}: tensor {key!r} has unsupported dtype {entry['dtype']}")
        out[key] = TensorInfo(tuple(int(s) for s in entry["shape"]), dtype)
    return out


# --------------------------------------------------------------------------------------------
# reading tensors

_pickle_cache: dict[tuple, dict[str, torch.Tensor]] = {}


def _load_pickle(path: str) -> dict[str, torch.Tensor]:
    """torch.load with weights_only=True (DESIGN.md §7), memory-mapped; warns once per file."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key in _pickle_cache:
        return _pickle_cache[key]
    warnings.warn(
        f"{os.path.basename(path)}: pickle-format weights; loading with torch.load(weights_only=True). "
        f"Prefer .safetensors files.",
        stacklevel=3,
    )
    obj = None
    errors = []
    for mmap in (True, False):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception as e:  # noqa: BLE001 - re-raised below with the file name
            errors.append(e)
    if obj is None:
        e = errors[-1]
        raise WeightFileError(
            f"{path}: cannot load pickle weights with weights_only=True (truncated, corrupt, or it "
            f"contains objects other than tensors): {type(e).__name__}: {e}"
        ) from e
    for wrapper in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict) and len(obj) <= 8:
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict):
        raise WeightFileError(f"{path}: pickle file holds a {type(obj).__name__}, not a state dict")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:  # a dict of state dicts (PhotoMaker's {"id_encoder": {...}, "lora_weights": {...}})
        tensors = {f"{k}.{kk}": vv for k, v in obj.items() if isinstance(k, str) and isinstance(v, dict)
                   for kk, vv in v.items() if isinstance(kk, str) and isinstance(vv, torch.Tensor)}
    if not tensors:
        raise WeightFileError(f"{path}: pickle file holds no tensors")
    if len(_pickle_cache) > 4:
        _pickle_cache.clear()
    _pickle_cache[key] = tensors
    return tensors


def _convert(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Cast floating tensors to dtype; integer/bool tensors (position ids) keep theirs."""
    if dtype is None or not t.is_floating_point() or t.dtype == dtype:
        return t
    return t.to(dtype)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_DONTNEED = 4  # Linux


@functools.lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _release_pages(src: torch.Tensor) -> None:
    """Drop the resident pages lying wholly inside ``src``'s bytes, a tensor fresh from
    ``safe_open.get_tensor`` (a view of the file's private mapping) that was just converted and
    is about to be dropped. Best effort: a no-op off Linux or if madvise fails."""
    madvise = _madvise()
    if madvise is None or src.device.type != "cpu":
        return
    start = src.data_ptr()
    end = start + src.numel() * src.element_size()
    lo = -(-start // _PAGE) * _PAGE
    hi = end // _PAGE * _PAGE
    if hi > lo:
        madvise(lo, hi - lo, _MADV_DONTNEED)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A quantised GGUF weight dequantised (float32); any other tensor as it is."""
    return t.dequantize() if is_quantized(t) else t


def _convert_gguf(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``_convert`` for a GGUF tensor: a quantised weight is kept as it is (``gguf_tensor``)."""
    return t if is_quantized(t) else _convert(t, dtype)


def _convert_released(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``_convert`` for a tensor read from a safetensors memory map: when a new tensor is made,
    the source's pages are released (see the module docstring)."""
    out = _convert(t, dtype)
    if out.dtype != t.dtype:
        _release_pages(t)
    return out


def read_tensors(
    path: str | os.PathLike,
    keys: Iterable[str] | None = None,
    *,
    prefix: str = "",
    dtype: torch.dtype | None = None,
    strip_prefix: bool = True,
) -> dict[str, torch.Tensor]:
    """Read tensors whose names start with ``prefix`` (or exactly ``keys``), cast to ``dtype``.

    One tensor at a time: peak memory is the result plus one tensor in the stored dtype.
    """
    path = os.fspath(path)
    wanted = None if keys is None else set(keys)

    def select(names: Iterable[str]) -> list[str]:
        return [k for k in names if k.startswith(prefix) and (wanted is None or k in wanted)]

    def out_key(k: str) -> str:
        return k[len(prefix):] if strip_prefix else k

    if _is_pickle(path):
        sd = _load_pickle(path)
        return {out_key(k): _convert(sd[k], dtype).contiguous() for k in select(sd)}
    if gguf_file.is_gguf(path):
        tensors = _gguf(path).tensors
        return {out_key(k): _convert(_plain(tensors[k].read()), dtype) for k in select(tensors)}
    _safetensors_header(path)  # clear errors before safetensors' own
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            for k in select(f.keys()):
                out[out_key(k)] = _convert_released(f.get_tensor(k), dtype)
    except (SafetensorError, OSError) as e:
        raise WeightFileError(f"{path}: cannot read safetensors data: {e}") from e
    return out


def read_source(
    source: WeightSource,
    dtype_for: Callable[[str], torch.dtype | None],
    rename: Callable[[str], str | None] | None = None,
    keep_scaled: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """All tensors of ``source`` (prefix stripped), renamed and cast one at a time.

    ``rename`` maps a stored key (prefix stripped) to our module key, or None to skip it;
    ``dtype_for(module_key)`` gives the dtype to store that tensor in (None = as stored).
    A ComfyUI quantised source (``quantization``) is read by ``quantized.read_quantized``: its
    scale and marker keys are consumed, its fp8 layers dequantised, or kept fp8 with their scale
    (``<key>_scale``) where ``dtype_for`` says fp8 and ``keep_scaled(module_key)`` allows it.
    """
    scheme = quantization(source)

    def take(items, convert=_convert, release=lambda t: None) -> dict[str, torch.Tensor]:
        if scheme is not None:
            return read_quantized(scheme, dict(items), dtype_for, rename,
                                  keep_scaled or (lambda key: False), convert, release)
        out = {}
        for key, get in items:
            new = rename(key) if rename is not None else key
            if new is None:
                continue
            out[new] = convert(get(), dtype_for(new))
        return out

    p = source.prefix
    if source.path is None:
        assert source.tensors is not None, "in-memory WeightSource without tensors"
        sd = source.tensors
        return take((k[len(p):], (lambda k=k: sd[k])) for k in sd if k.startswith(p))
    path = source.path
    if _is_pickle(path):
        sd = _load_pickle(path)
        return take((k[len(p):], (lambda k=k: sd[k])) for k in sd if k.startswith(p))
    if gguf_file.is_gguf(path):  # quantised weights stay quantised whatever the dtype asked
        tensors = _gguf(path).tensors
        return take(((k[len(p):], tensors[k].read) for k in tensors if k.startswith(p)), _convert_gguf)
    _safetensors_header(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return take(((k[len(p):], (lambda k=k: f.get_tensor(k))) for k in f.keys() if k.startswith(p)),
                        _convert_released, _release_pages)
    except (SafetensorError, OSError) as e:
        raise WeightFileError(f"{path}: cannot read safetensors data: {e}") from e


def byte_ranges(source: WeightSource, keep: Callable[[str], bool]) -> tuple[tuple[int, int], ...]:
    """(file offset, length) of the data of ``source``'s stored tensors (prefix stripped) that
    ``keep`` accepts, adjacent ranges merged; empty for anything but a safetensors file (an
    in-memory source, a pickle or GGUF file). What ``will_need`` is given to bring a streamed
    unit's bytes in ahead of its use."""
    path = source.path
    if path is None or _is_pickle(path) or gguf_file.is_gguf(path):
        return ()
    header = _safetensors_header(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    spans = sorted((8 + n + int(e["data_offsets"][0]), 8 + n + int(e["data_offsets"][1]))
                   for k, e in header.items() if k != "__metadata__" and k.startswith(source.prefix)
                   and keep(k[len(source.prefix):]))
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        elif hi > lo:
            merged.append([lo, hi])
    return tuple((lo, hi - lo) for lo, hi in merged)


_CHUNK = 4 << 20


def will_need(path: str, ranges: Iterable[tuple[int, int]]) -> None:
    """Have ``ranges`` of ``path`` read into the page cache now (meant for a background thread),
    so the memory-mapped views read later find their pages there instead of faulting them in
    from disk one readahead window at a time while the layers compute. ``posix_fadvise(WILLNEED)``
    per 4 MiB: the kernel reads asynchronously and copies nothing to the process (Linux caps one
    call at the readahead window, 8 MiB here: one call on a whole Flux block had brought in 2 % of
    it a second later). Measured on a cold SDXL file: a 140 MiB unit faulted in by its first touch
    0.15 s, 0.4 s after this 0.03 s, for 0.025 s of CPU to ask. Rejected: a ``pread`` into a
    scratch buffer (as fast, but its copy took the CPU from the layers: SDXL at 3 GiB 16.7 s/step
    against 14.7 without) and ``mmap.madvise(MADV_POPULATE_READ)`` (keeps the GIL for the whole
    call: 2x slower steps). Where ``posix_fadvise`` does not exist (macOS, Windows), nothing.
    Holds no memory of the process: the pages are the page cache's (dropped under pressure, then
    the views fault them in as before). Best effort: an error is left for the real read to meet."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for offset, length in ranges:
            end = offset + length
            while offset < end:
                advise(fd, offset, min(_CHUNK, end - offset), os.POSIX_FADV_WILLNEED)
                offset += _CHUNK
    except OSError:
        pass
    finally:
        os.close(fd)


def quantization(source: WeightSource) -> QuantScheme | None:
    """The ComfyUI quantisation (scaled fp8, mixed precision) of ``source``'s part of its file,
    from key names and header metadata only; None for an ordinary source."""
    if source.path is None:  # not cached: a cache entry would keep an in-memory state dict alive
        assert source.tensors is not None, "in-memory WeightSource without tensors"
        return quant_scheme((k[len(source.prefix):] for k in source.tensors if k.startswith(source.prefix)),
                            {}, source.prefix)
    return _file_quantization(source.path, source.size, source.mtime_ns, source.prefix)


@functools.lru_cache(maxsize=64)
def _file_quantization(path: str, size: int, mtime_ns: int, prefix: str) -> QuantScheme | None:
    names = [k[len(prefix):] for k in inspect_file(path) if k.startswith(prefix)]
    return quant_scheme(names, file_metadata(path), prefix)


def held_quantised(source: WeightSource) -> dict[str, tuple[int, int]]:
    """stored key (prefix stripped) -> (bytes the weight store holds, values) for the weights a
    source keeps quantised in memory whatever the storage dtype: a GGUF file's quantised tensors,
    a ComfyUI-quantised file's int8 layers (``quantized.keep_int8``); {} for any other source.
    From the header (and an int8 layer's tiny config tensor): what estimates made from shapes
    need, since they would count these weights dense."""
    if source.path is None:
        return {}
    if gguf_file.is_gguf(source.path):
        return gguf_file.quantised_sizes(source.path, source.prefix)
    if _is_pickle(source.path):
        return {}
    return dict(_held_int8(source.path, source.size, source.mtime_ns, source.prefix))


@functools.lru_cache(maxsize=64)
def _held_int8(path: str, size: int, mtime_ns: int, prefix: str) -> tuple[tuple[str, tuple[int, int]], ...]:
    scheme = _file_quantization(path, size, mtime_ns, prefix)
    if scheme is None:
        return ()
    shapes = {k[len(prefix):]: (i.shape, i.dtype) for k, i in inspect_file(path).items() if k.startswith(prefix)}
    markers = [prefix + layer.marker for layer in scheme.layers.values() if layer.marker is not None
               and layer.format is None and shapes.get(layer.weight, ((), None))[1] == torch.int8]
    configs = read_tensors(path, markers, prefix=prefix) if markers else {}
    return tuple(kept_int8_layers(scheme, shapes, configs.__getitem__).items())


def source_dtypes(source: WeightSource) -> set[torch.dtype]:
    """The stored floating dtypes of a source's tensors (header only for safetensors)."""
    if source.path is None:
        assert source.tensors is not None
        items = [(k, v.dtype) for k, v in source.tensors.items()]
    else:
        items = [(k, i.dtype) for k, i in inspect_file(source.path).items()]
    return {d for k, d in items if k.startswith(source.prefix) and d.is_floating_point}
