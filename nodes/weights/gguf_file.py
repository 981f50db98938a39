"""GGUF weight files (llama.cpp's format, as ComfyUI-GGUF uses it for image models).

A GGUF file is a header (metadata key/values, then per tensor its name, dims, GGML type and
offset) followed by the tensor data; it is read with gguf-py's ``GGUFReader``, memory-mapped
(copy-on-write, so torch may view it; nothing writes to it). What this module gives the weight
layer is what ``safetensors_io`` gives for a safetensors file: ``inspect`` (key -> shape and
dtype, from the header only) and ``items`` (key -> a reader of the tensor), so detection, the
loaders and the weight store treat a ``.gguf`` file like any other weight file:

- F32 / F16 / BF16 tensors are plain tensors (views of the mapped file), cast to the storage
  dtype by the store like a safetensors file's.
- Quantised tensors (``gguf_quants.FORMATS``: Q4_0 ... Q8_0, Q2_K ... Q6_K) stay quantised in
  memory whatever the storage dtype: ``gguf_tensor.QuantizedTensor`` (logical shape, float32
  dtype, the file's bytes), dequantised by the cast layers when the layer runs.
- Shapes: GGUF lists dims fastest-first (``ne[0]`` is the row length), so the torch shape is the
  reverse; ComfyUI-GGUF's converter stores some weights (5-D ones) flattened, with the real shape
  in the metadata entry ``comfy.gguf.orig_shape.<key>`` (an array of int32), which wins.
- Keys are the model's state-dict keys (city96's ``convert.py`` writes the model's keys as the
  checkpoint has them, ``general.architecture`` naming the model: "flux", "sd1", "sdxl", "sd3",
  "wan", "qwen_image", ...). Text encoders converted by llama.cpp name their tensors llama.cpp's
  way (``token_embd``, ``blk.N.attn_q``, ``enc.blk.N.ffn_gate``); the T5 ("t5", "t5encoder") and
  Qwen ("qwen3", "qwen2vl") ones are renamed here to the Hugging Face names mixgraph's encoders
  use (``llm_key``: ComfyUI-GGUF's ``T5_SD_MAP`` / ``LLAMA_SD_MAP`` renamings, written as a table
  per block tensor), so they read as the safetensors files do; T5's decoder is dropped. "llama"
  files are refused by name (``llm_refusal``): llama.cpp permutes their q / k rows, which would
  have to be undone on dequantised weights.

Other GGML types (IQ*, TQ*, MXFP4, F64, integer tensors) are refused by name with the tensor
they were found on; a file that cannot be parsed, or whose data runs past its end, raises
``WeightFileError`` naming the file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gguf
import numpy as np
import torch

from mixgraph.nodes.weights.gguf_quants import FORMATS
from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor

__all__ = ["GGUF_SUFFIX", "GGUFTensorInfo", "GGUFContents", "is_gguf", "contents", "IMAGE_ARCHS", "TEXT_ARCHS",
           "llm_refusal", "llm_key", "LLM_RENAMED", "image_arch_problem", "SUPPORTED_TYPES", "UNNAMED_ARCHS",
           "quantised_sizes"]

GGUF_SUFFIX = ".gguf"
#: ComfyUI-GGUF's image-model architectures (``loader.py: IMG_ARCH_LIST``)
IMAGE_ARCHS = frozenset({"flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos", "ltxv", "hyvid", "wan",
                         "lumina2", "qwen_image"})
#: llama.cpp text-model architectures ComfyUI-GGUF loads as text encoders (``TXT_ARCH_LIST``)
TEXT_ARCHS = frozenset({"t5", "t5encoder", "llama", "qwen2vl", "qwen3", "qwen3vl"})
#: placeholders older converters wrote for image models (ComfyUI-GGUF loads them by their keys)
UNNAMED_ARCHS = ("pig", "cow")
ORIG_SHAPE = "comfy.gguf.orig_shape."
_PLAIN = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}  # GGML F32, F16, BF16
SUPPORTED_TYPES = ("F32", "F16", "BF16", *(f.name for f in FORMATS.values()))


class GGUFFileError(ValueError):
    """A GGUF file that cannot be read (raised as safetensors_io's WeightFileError by its callers)."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of the file: torch shape, GGML type id and name, and a reader of its value."""

    shape: tuple[int, ...]
    ggml_type: int
    type_name: str
    read: Callable[[], torch.Tensor]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the tensor reads as (float32 for a quantised one: its dequantised values)."""
        return _PLAIN.get(self.ggml_type, torch.float32)


@dataclass(frozen=True)
class GGUFContents:
    """A parsed GGUF file: its architecture (``general.architecture``, None without one) and tensors."""

    path: str
    architecture: str | None
    tensors: dict[str, GGUFTensorInfo]

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return counts


def is_gguf(path: str | os.PathLike) -> bool:
    return os.fspath(path).lower().endswith(GGUF_SUFFIX)


def contents(path: str | os.PathLike) -> GGUFContents:
    """The file's architecture and tensors (header parsed once per file version; the data is
    memory-mapped, not read)."""
    path = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(path)
    except OSError as e:
        raise GGUFFileError(f"{path}: cannot read GGUF file: {e}") from e
    return _contents(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _contents(path: str, size: int, mtime_ns: int) -> GGUFContents:
    name = os.path.basename(path)
    try:
        reader = gguf.GGUFReader(path, "c")
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):
            raise GGUFFileError(f"{path}: a tensor of an unknown GGML type ({e}); mixgraph reads "
                                f"{', '.join(SUPPORTED_TYPES)}") from e
        raise GGUFFileError(f"{path}: not a readable GGUF file (truncated or corrupt: {e}); download it "
                            f"again") from e
    except Exception as e:  # noqa: BLE001 - gguf-py raises many kinds on a damaged header
        raise GGUFFileError(f"{path}: not a readable GGUF file (truncated or corrupt: {type(e).__name__}: "
                            f"{e}); download it again") from e
    arch = _string_field(reader, "general.architecture")
    rename = arch in LLM_RENAMED and _is_llm_named(t.name for t in reader.tensors)
    tensors: dict[str, GGUFTensorInfo] = {}
    for t in reader.tensors:
        ggml_type = int(t.tensor_type)
        type_name = getattr(t.tensor_type, "name", str(ggml_type))
        if ggml_type not in _PLAIN and ggml_type not in FORMATS:
            raise GGUFFileError(f"{name}: tensor {t.name!r} has GGML type {type_name}, which is not supported "
                                f"yet (mixgraph reads {', '.join(SUPPORTED_TYPES)})")
        if t.data_offset + int(t.n_bytes) > size or t.data.nbytes != int(t.n_bytes):
            raise GGUFFileError(f"{path}: truncated GGUF file: tensor {t.name!r} needs bytes up to "
                                f"{t.data_offset + int(t.n_bytes)} but the file has {size}; download it again")
        shape = _orig_shape(reader, t.name) or tuple(int(d) for d in reversed(t.shape.tolist()))
        if int(np.prod(shape, dtype=np.int64)) != int(t.n_elements):
            raise GGUFFileError(f"{name}: {ORIG_SHAPE}{t.name} gives shape {list(shape)} for a tensor of "
                                f"{int(t.n_elements)} values")
        key = llm_key(arch, t.name) if rename else t.name
        if key is not None:
            tensors[key] = GGUFTensorInfo(shape, ggml_type, type_name,
                                          functools.partial(_read, t.data, ggml_type, shape))
    return GGUFContents(path, arch, tensors)


def _read(data: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing the mapped bytes: plain types reshaped to ``shape``, quantised ones wrapped."""
    flat = torch.from_numpy(data).reshape(-1)  # the file's bytes / values, no copy
    if ggml_type in FORMATS:
        return QuantizedTensor.from_ggml(flat, ggml_type, shape)
    if ggml_type == 30:  # BF16: gguf-py hands its bytes as uint8
        flat = flat.view(torch.bfloat16)
    return flat.reshape(shape)


def _string_field(reader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None:
        return None
    try:
        return bytes(field.parts[field.data[-1]]).decode("utf-8")
    except (IndexError, UnicodeDecodeError, TypeError):
        return None


def _orig_shape(reader, name: str) -> tuple[int, ...] | None:
    field = reader.get_field(ORIG_SHAPE + name)
    if field is None:
        return None
    return tuple(int(field.parts[i][0]) for i in field.data)


def iter_tensors(path: str | os.PathLike, prefix: str = "") -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(key without ``prefix``, reader) for the file's tensors under ``prefix``."""
    for key, info in contents(path).tensors.items():
        if key.startswith(prefix):
            yield key[len(prefix):], info.read


def quantised_sizes(path: str | os.PathLike, prefix: str = "") -> dict[str, tuple[int, int]]:
    """key (``prefix`` stripped) -> (bytes held, values) of the file's quantised tensors under
    ``prefix``: what the weight store holds for them whatever the storage dtype (for estimates
    made from shapes, which would count them dense)."""
    out = {}
    for key, info in contents(path).tensors.items():
        if info.ggml_type in FORMATS and key.startswith(prefix):
            fmt = FORMATS[info.ggml_type]
            numel = int(np.prod(info.shape, dtype=np.int64))
            out[key[len(prefix):]] = (numel // fmt.block_size * fmt.type_size, numel)
    return out


def _is_llm_named(keys) -> bool:
    return any(k.startswith(("blk.", "token_embd", "enc.blk.", "output_norm")) for k in keys)


#: llama.cpp's per-block tensor names -> Hugging Face's, by architecture family
_T5_BLOCK = {"attn_q": "layer.0.SelfAttention.q", "attn_k": "layer.0.SelfAttention.k",
             "attn_v": "layer.0.SelfAttention.v", "attn_o": "layer.0.SelfAttention.o",
             "attn_norm": "layer.0.layer_norm", "attn_rel_b": "layer.0.SelfAttention.relative_attention_bias",
             "ffn_gate": "layer.1.DenseReluDense.wi_0", "ffn_up": "layer.1.DenseReluDense.wi_1",
             "ffn_down": "layer.1.DenseReluDense.wo", "ffn_norm": "layer.1.layer_norm"}
_T5_TOP = {"token_embd": "shared", "enc.output_norm": "encoder.final_layer_norm"}
_LLM_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
              "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}
_LLM_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
#: architectures whose llama.cpp names are renamed: (block prefix, HF block prefix, block table, top table)
LLM_RENAMED = {"t5": ("enc.blk.", "encoder.block.", _T5_BLOCK, _T5_TOP),
               "t5encoder": ("enc.blk.", "encoder.block.", _T5_BLOCK, _T5_TOP),
               "qwen3": ("blk.", "model.layers.", _LLM_BLOCK, _LLM_TOP),
               "qwen2vl": ("blk.", "model.layers.", _LLM_BLOCK, _LLM_TOP)}


def llm_key(arch: str, name: str) -> str | None:
    """The Hugging Face key of a llama.cpp tensor name of a ``LLM_RENAMED`` architecture
    (``enc.blk.3.ffn_gate.weight`` -> ``encoder.block.3.layer.1.DenseReluDense.wi_0.weight``);
    None for a tensor the encoder does not use (T5's decoder); the name itself when no rule
    knows it (the loader then reports it among the unused or missing keys)."""
    block, hf_block, table, top = LLM_RENAMED[arch]
    base, dot, suffix = name.rpartition(".")
    if not dot:
        return name
    if base.startswith("dec."):
        return None
    if base.startswith(block):
        n, _, part = base[len(block):].partition(".")
        return f"{hf_block}{n}.{table[part]}.{suffix}" if n.isdigit() and part in table else name
    return f"{top[base]}.{suffix}" if base in top else name


def llm_refusal(c: GGUFContents) -> str | None:
    """Why a llama.cpp-style text-encoder GGUF cannot be loaded (tensors named ``blk.N.attn_q``,
    ``token_embd``, ... in an architecture ``LLM_RENAMED`` does not rename), or None."""
    if not _is_llm_named(c.tensors):
        return None
    why = ("llama.cpp permutes the q / k rows of 'llama' files, which is not undone yet" if c.architecture == "llama"
           else f"renamed are {', '.join(sorted(LLM_RENAMED))}")
    return (f"{os.path.basename(c.path)}: a llama.cpp-converted text encoder (GGUF architecture "
            f"{c.architecture!r}, tensors named blk.N.* / token_embd): not supported yet ({why}); use "
            f"the safetensors text encoder")


def image_arch_problem(c: GGUFContents) -> str | None:
    """Why a GGUF file is no diffusion model for UnetLoaderGGUF (ComfyUI-GGUF's architecture
    check), or None. A file without ``general.architecture`` (stable-diffusion.cpp's) or with an
    old converter's placeholder ("pig", "cow") is left to key detection, as ComfyUI-GGUF does."""
    if c.architecture in (None, *UNNAMED_ARCHS) or c.architecture in IMAGE_ARCHS:
        return None
    kind = "a text model" if c.architecture in TEXT_ARCHS else "not an image model"
    return (f"{os.path.basename(c.path)}: GGUF architecture {c.architecture!r} is {kind}; UnetLoaderGGUF "
            f"loads {', '.join(sorted(IMAGE_ARCHS))} (text encoders load with CLIPLoaderGGUF)")
