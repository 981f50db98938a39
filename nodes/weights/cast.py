"""The one cast-on-forward precision layer of the model runtime.

`apply_precision(module, policy)` returns a copy of a plain-PyTorch model whose layers keep their
weights in `policy.storage` and cast them, layer by layer, to `policy.compute` on every forward
(the scheme of diffusers' layerwise casting hook and ComfyUI's `manual_cast` ops). Written here
rather than using those hooks because the runtime also needs f32 norms, int8 Linear/Conv2d layers,
keep-f32 patterns and f32 entry/exit on the same copy; the copy is made by class swap so attribute
names (and so checkpoint keys) stay the same.

Rules:
- Linear/Conv1d/Conv2d/Embedding/GroupNorm/LayerNorm (exact types) are cast layers. Weight
  matrices and embedding tables are stored in `policy.storage`. Vectors (biases, norm affine
  params) are stored in the storage dtype too, except under fp8 storage: there they are kept in
  the compute dtype (~0.1% of the bytes, and 3 mantissa bits would distort them).
- Other layers (3-D convolutions such as the Wan VAE's `CausalConv3d`, custom norm gains) keep
  the dtype the weight store gave them, which is `policy.storage` unless kept f32
  (`store.dtype_rule`); such a layer casts its weights to its input's dtype itself.
- Each cast layer casts its input to its compute dtype, so layers of different dtypes can follow
  each other (a keep-f32 layer feeding a bf16 one).
- `keep_f32`: a class attribute (tuple of fnmatch patterns over dotted module names, relative to
  the module that declares it) naming submodules that stay f32 storage and f32 compute.
- `keep_stored`: a class attribute (patterns as above) naming embedding tables whose weights keep
  the dtype they arrive in (the weight store leaves them as stored: an f32 file's table stays a
  lazily paged view of the file, and only looked-up rows are ever read); the layer still computes
  in `policy.compute`, since rows are cast on lookup.
- `keep_f32_inputs`: a class attribute of the top-level module naming forward arguments the entry
  must not cast (e.g. `timesteps`, which bf16 cannot represent exactly). All other floating tensors
  given to the top-level forward (also inside lists/tuples/dicts) are cast to the compute dtype;
  floating tensors in the output are cast to float32.
- `f32_norms`: GroupNorm/LayerNorm statistics are computed in f32, the result cast to compute.
- `upcast_attention`: sets `upcast_attention = True` on every submodule that has the attribute
  (False leaves the model's own default).
- `int8`: every nn.Linear not kept f32 becomes an `Int8Linear`: symmetric per-output-channel int8
  weights and dynamic int8 activations; on a CPU with native int8 dot products oneDNN's dynamic
  quantized Linear (per-tensor uint8 activations), elsewhere per-row int8 activations, int32
  accumulation via `torch._int_mm`, f32 rescale (LLM.int8()-style absmax quantization without
  the outlier split; Dettmers et al., arXiv:2208.07339). Every nn.Conv2d not kept f32 becomes an `Int8Conv2d`: on a CPU with native
  int8 dot products (VNNI / AMX-INT8) oneDNN's int8 convolution with per-tensor asymmetric
  uint8 activations (no im2col; 3-4x the f32 convolution), elsewhere the per-row scheme above
  over im2col patches (one row per output pixel, in bounded chunks); convolutions are most of an
  SD UNet's FLOPs (62% at 256 px, 55% at 512 px for SD1.5; the Linears 34% / 29%). Grouped
  convs, non-zero padding modes and string padding stay cast layers (`int8_conv_supported`).
- `int8_skip`: a class attribute (patterns as above) naming Linear/Conv2d modules that `int8`
  leaves as cast layers (f32, since int8 computes in f32): the whole VAE, whose int8 convs cost
  most of int8's PSNR on the embedded model; the SD UNet's attention query/key projections,
  whose errors pass through the softmax's exponent. The UNet's first and last convs are
  converted: kept f32 they gave no measurable gain there (and a tenth less error on the tiny
  test UNet).
- Quantised fp8 weights (ComfyUI's scaled fp8 / mixed-precision files, `quantized.py`): a layer
  the weight store gave an fp8 weight with a `weight_scale` buffer keeps that weight as it is (in
  the file's fp8 type) and multiplies the weight it casts by the scale on every forward (ComfyUI's
  dequantising path; fp8 matrix multiplies with `scale_input` are not used: compute dtypes are
  f32 / f16 / bf16); an int8 layer is made from the dequantised weight.
- GGUF weights (`gguf_tensor.QuantizedTensor`, from `.gguf` files): kept quantised whatever the
  storage dtype, and dequantised (in f32, then cast to the layer's compute dtype) on every
  forward of their layer; the dequantised copy lives for that call only.
- Half compute on CPU: Conv2d weights are stored channels_last and activations made channels_last,
  since NCHW half convolutions on CPU are orders of magnitude slower.
- The per-forward weight cast writes into a reused per-thread scratch buffer (one per device,
  dtype and inference mode, as large as the largest weight, dropped at the end of each top-level
  forward) instead of a fresh tensor, when
  autograd will not keep the cast weight: no allocation and no page faults per layer, which makes
  the cast of a bf16-stored SD1.5 UNet to f32 2-3x faster on CPU and keeps allocator churn out of
  peak memory. Layers run one at a time per thread, and on a GPU the copy is ordered on the
  stream, so the buffer is never needed by two layers at once. Embeddings look rows up in the
  storage dtype and cast only those rows (exact: a cast is elementwise).

The input module is never modified; tensors whose dtype does not change are shared with it.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import inspect
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from mixgraph.nodes.weights.gguf_tensor import is_quantized

STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
HALF_DTYPES = (torch.float16, torch.bfloat16)


class PolicyLike(Protocol):
    """What `apply_precision` and the handles read from a policy: `graph.precision.Policy`
    satisfies it, duck-typed (the runtime never imports graph/). A policy given to the runtime is
    final: every resolution rule (pins, int8 with a pinned storage, NaN-guard f32 compute) has
    been applied by `graph.precision.resolve`."""

    storage: torch.dtype
    compute: torch.dtype
    upcast_attention: bool
    f32_norms: bool
    int8: bool


# ---------------------------------------------------------------------------------------------
# cast layers: subclasses of the torch layers, swapped in by class on the copy


_SCRATCH_MIN_NUMEL = 1 << 16  # smaller weights: a fresh tensor is as cheap


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[tuple, Tensor] = {}


_SCRATCH = _Scratch()


def _cast_weight(w: Tensor, dtype: torch.dtype, x: Tensor | None) -> Tensor:
    """`w.to(dtype)`, written into the thread's scratch buffer when that is safe (see the module
    docstring): the result is only valid until the next cast on this thread."""
    if w.dtype == dtype:
        return w
    dense = w.is_contiguous() or (w.ndim == 4 and w.is_contiguous(memory_format=torch.channels_last))
    if (w.numel() < _SCRATCH_MIN_NUMEL or not dense
            or (torch.is_grad_enabled() and (w.requires_grad or (x is not None and x.requires_grad)))):
        return w.to(dtype)
    key = (w.device, dtype, torch.is_inference_mode_enabled())
    buf = _SCRATCH.buffers.get(key)
    if buf is None or buf.numel() < w.numel():
        buf = _SCRATCH.buffers[key] = torch.empty(w.numel(), dtype=dtype, device=w.device)
    out = buf[: w.numel()].as_strided(w.shape, w.stride())  # same layout as w (dense)
    return out.copy_(w)


class CastLayer:
    """Marker mixin; `compute_dtype` is set per instance by apply_precision."""

    compute_dtype: torch.dtype = torch.float32

    def _params(self, dtype: torch.dtype, x: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        w = getattr(self, "weight", None)
        b = getattr(self, "bias", None)
        if is_quantized(w):  # a GGUF weight (gguf_tensor.py): dequantised for this call only
            return w.dequantize(dtype), None if b is None else _plain(b).to(dtype)
        cast = None if w is None else _cast_weight(w, dtype, x)
        scale = self._buffers.get("weight_scale")
        if scale is not None:  # a quantised fp8 weight (quantized.py): w · s, in place on the fresh cast
            cast = cast.mul_(scale.to(cast.device))
        return (cast, None if b is None else b.to(dtype))


class CastLinear(CastLayer, nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        w, b = self._params(self.compute_dtype, x)
        return F.linear(x.to(self.compute_dtype), w, b)


class CastConv1d(CastLayer, nn.Conv1d):
    def forward(self, x: Tensor) -> Tensor:
        w, b = self._params(self.compute_dtype, x)
        return self._conv_forward(x.to(self.compute_dtype), w, b)


class CastConv2d(CastLayer, nn.Conv2d):
    channels_last: bool = False

    def forward(self, x: Tensor) -> Tensor:
        w, b = self._params(self.compute_dtype, x)
        x = x.to(self.compute_dtype)
        if self.channels_last and x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        return self._conv_forward(x, w, b)


class CastEmbedding(CastLayer, nn.Embedding):
    def forward(self, ids: Tensor) -> Tensor:
        if self.max_norm is None and is_quantized(self.weight):  # a GGUF table: dequantise the rows used
            return self.weight.rows(ids, self.compute_dtype)
        if self.max_norm is None:  # look rows up in the stored dtype, cast only those (exact)
            rows = F.embedding(ids, self.weight, self.padding_idx, None, self.norm_type,
                               self.scale_grad_by_freq, self.sparse)
            return rows.to(self.compute_dtype)
        w, _ = self._params(self.compute_dtype, ids)
        return F.embedding(ids, w, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)


class CastGroupNorm(CastLayer, nn.GroupNorm):
    norm_dtype: torch.dtype = torch.float32

    def forward(self, x: Tensor) -> Tensor:
        w, b = self._params(self.norm_dtype)
        return F.group_norm(x.to(self.norm_dtype), self.num_groups, w, b, self.eps).to(self.compute_dtype)


class CastLayerNorm(CastLayer, nn.LayerNorm):
    norm_dtype: torch.dtype = torch.float32

    def forward(self, x: Tensor) -> Tensor:
        w, b = self._params(self.norm_dtype)
        y = F.layer_norm(x.to(self.norm_dtype), self.normalized_shape, w, b, self.eps)
        return y.to(self.compute_dtype)


_CAST_CLASSES: dict[type, type] = {
    nn.Linear: CastLinear,
    nn.Conv1d: CastConv1d,
    nn.Conv2d: CastConv2d,
    nn.Embedding: CastEmbedding,
    nn.GroupNorm: CastGroupNorm,
    nn.LayerNorm: CastLayerNorm,
}
_NORMS = (nn.GroupNorm, nn.LayerNorm)


class _PackedInt8(nn.Module):
    """An int8 layer holding oneDNN's packed weight (`_packed`), made on first use: opaque,
    so a copy or pickle drops it and the copy packs again."""

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_packed"] = None
        return state


class Int8Linear(_PackedInt8):
    """nn.Linear with int8 weights [in, out] (per-output-channel absmax scale) and dynamic int8
    activations, in one of two kernels (`kernel`; "auto" picks per call), returned in
    `compute_dtype`:

    - "onednn" (CPU with native int8 dot products, `onednn_int8_conv_available`): oneDNN's
      dynamic quantized Linear (`quantized::linear_dynamic`, the x86 backend's kernel), which
      quantizes its input per tensor (asymmetric uint8). To give each token its own scale, as
      "int_mm" does, the rows are first divided by their absmax and the output rows multiplied
      back (x W = diag(s) (diag(1/s) x) W, exact up to rounding), the bias added after in f32:
      a token of small values then keeps its levels beside a large one (per layer 34 vs 21 dB
      SNR on rows of mixed scale, `benchmarks/bench_int8_models.py`), at 1.1-1.5x the time of
      the plain per-tensor call and still 1.4-2x faster than "int_mm" at 1024-4096 tokens.
    - "int_mm" (any device): per-row absmax int8 activations, `torch._int_mm`, f32 rescale.

    The weights are held once, as `weight_int8`; oneDNN's packed copy is made from them on first
    use and is not part of the state."""

    kernel: str = "auto"  # "auto" | "onednn" | "int_mm"

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        w = _float_weight(linear)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [out, in]
        self.register_buffer("weight_int8", q.t().contiguous())  # [out, in] -> [in, out]
        self.register_buffer("weight_scale", scale)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._packed: Any = None

    def _use_onednn(self, x: Tensor) -> bool:
        if self.kernel == "auto":
            return (x.device.type == "cpu" and onednn_int8_conv_available()
                    and "onednn" in torch.backends.quantized.supported_engines)
        if self.kernel not in ("onednn", "int_mm"):
            raise ValueError(f"Int8Linear.kernel must be 'auto', 'onednn' or 'int_mm', not {self.kernel!r}")
        return self.kernel == "onednn"

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()  # [..., in] -> [N, in]
        if self._use_onednn(x2):
            if x2.device.type == "meta" or is_fake(x2):  # `mixgraph estimate`'s trace: shapes only
                y = x2.new_empty(x2.shape[0], self.out_features)
            else:
                s = x2.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)  # [N, 1] per-token scale
                y = torch.ops.quantized.linear_dynamic(x2 / s, self._onednn_packed(), False)
                y = y.mul_(s) if self.bias is None else torch.addcmul(self.bias, y, s, out=y)  # y s + b
        else:
            y = self._forward_int_mm(x2)
        return y.reshape(*lead, self.out_features).to(self.compute_dtype)  # [N, out] -> [..., out]

    def _onednn_packed(self) -> Any:
        if self._packed is None:
            zeros = torch.zeros(self.out_features, dtype=torch.int64)
            engine = torch.backends.quantized.engine
            with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the kernel needs one
                warnings.simplefilter("ignore")
                qw = torch._make_per_channel_quantized_tensor(
                    self.weight_int8.t().contiguous(), self.weight_scale.double(), zeros, 0)  # [out, in]
                try:  # without the bias: it is added after the rows are scaled back
                    torch.backends.quantized.engine = "onednn"
                    self._packed = torch.ops.quantized.linear_prepack(qw, None)
                finally:
                    torch.backends.quantized.engine = engine
        return self._packed

    def _forward_int_mm(self, x2: Tensor) -> Tensor:
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # [N, 1]
        xq = torch.round(x2 / x_scale).clamp(-127, 127).to(torch.int8)
        n = xq.shape[0]
        if xq.device.type == "cuda" and n <= 16:  # cuBLAS int8 GEMM needs more than 16 rows
            xq = F.pad(xq, (0, 0, 0, 17 - n))
        acc = torch._int_mm(xq, self.weight_int8)[:n]  # [N, out] int32
        y = acc.float() * x_scale * self.weight_scale[None]
        return y if self.bias is None else y + self.bias


def _plain(t: Tensor) -> Tensor:
    """A GGUF-quantised tensor dequantised (float32); any other as it is."""
    return t.dequantize() if is_quantized(t) else t


def _float_weight(layer: nn.Module) -> Tensor:
    """The layer's weight in float32; a quantised fp8 weight times its ``weight_scale``."""
    w = _plain(layer.weight.detach()).float()
    scale = layer._buffers.get("weight_scale")
    return w if scale is None else w * scale


def int8_conv_supported(conv: nn.Conv2d) -> bool:
    """Whether `Int8Conv2d` can stand in for `conv`. Grouped convolutions would need one GEMM per
    group (none in the SD UNets/VAEs; depthwise ones would gain nothing from int8), other padding
    modes a padded copy of the input per call, and string padding ('same' can pad unevenly) its
    own arithmetic: those stay cast layers."""
    return conv.groups == 1 and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)


def int8_conv_gemm_shape(conv: nn.Conv2d) -> tuple[int, int]:
    """(K, N) of `Int8Conv2d`'s weight matrix: C_in*kh*kw and C_out, each rounded up to a multiple
    of 8 (cuBLAS's int8 GEMM requires it; the zero padding adds nothing to the products)."""
    k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    return -(-k // 8) * 8, -(-conv.out_channels // 8) * 8


#: Environment variable that replaces the CPU flags the runtime sees (`graph.precision` reads the
#: same one for its decision table), so the test suite pins which int8 kernel runs.
CPU_FLAGS_ENV = "MIXGRAPH_CPU_FLAGS"
#: CPU flags with native int8 dot products: oneDNN's u8 x s8 convolution accumulates exactly in
#: int32 there; without them (AVX2/AVX-512 vpmaddubsw) its pair sums saturate at int16.
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.lru_cache(maxsize=4)
def _onednn_int8_conv(flags_env: str | None) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qconv2d_pointwise")):
        return False
    if flags_env is not None:
        flags = set(flags_env.replace(",", " ").lower().split())
    else:
        probe = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
        try:
            flags = {k for k, v in (probe() if probe is not None else {}).items() if v is True}
        except Exception:  # noqa: BLE001 - a torch without the probe: the portable path
            flags = set()
    return bool(flags & set(INT8_DOT_FLAGS))


def onednn_int8_conv_available(env: Mapping[str, str] | None = None) -> bool:
    """Whether `Int8Conv2d` runs oneDNN's int8 convolution on CPU (`kernel="auto"`): torch built
    with oneDNN's quantized ops, on a CPU with native int8 dot products (`INT8_DOT_FLAGS`, from
    `MIXGRAPH_CPU_FLAGS` in `env` (default os.environ) when set, else torch's CPU probe)."""
    return _onednn_int8_conv((os.environ if env is None else env).get(CPU_FLAGS_ENV))


def quantize_uint8(x: Tensor) -> tuple[Tensor, float, int]:
    """Per-tensor asymmetric uint8 quantisation, as oneDNN's dynamic kernels do it: (q, scale,
    zero point) with x ~ (q - zero_point) * scale, q = clamp(round(x / scale + zero_point), 0,
    255), over the range [min(x, 0), max(x, 0)] (0 is exact, as zero padding needs)."""
    lo, hi = torch.aminmax(x)
    lo, hi = min(lo.item(), 0.0), max(hi.item(), 0.0)
    scale = max((hi - lo) / 255.0, 1e-12)
    zero = min(max(round(-lo / scale), 0), 255)
    q = torch.div(x, scale).add_(zero).round_().clamp_(0, 255).to(torch.uint8)
    return q, scale, zero


class Int8Conv2d(_PackedInt8):
    """nn.Conv2d (groups 1, zero padding) with int8 weights (per-output-channel absmax scale)
    and dynamic int8 activations, in one of two kernels (`kernel`; "auto" picks per call):

    - "onednn" (CPU with native int8 dot products, `onednn_int8_conv_available`): oneDNN's int8
      convolution (`torch.ops.onednn.qconv2d_pointwise`, the kernel torch's x86 quantization
      backend lowers to) on the whole activation, quantized asymmetric uint8 per tensor (scale
      (max - min) / 255 over a range that includes 0, zero point -min / scale: GroupNorm + SiLU
      outputs are lopsided, so the asymmetric range gives them ~2x the levels of a symmetric
      one), channels_last; it returns f32 (channels_last) directly. No im2col: the cost is the
      int8 GEMM plus one quantising pass. Per-pixel scales cannot be given to it (oneDNN takes
      one source scale), which costs ~1 dB per conv against "gemm" (measured 37 vs 38 dB SNR on
      Gaussian data); the whole-image PSNR is in benchmarks/README.md.
    - "gemm" (any device): im2col + `torch._int_mm`, one int8 GEMM per chunk of output pixels:
      activations unfolded (in `F.unfold`'s K order) and quantized per output pixel (its
      receptive field, absmax symmetric), int32 accumulation, rescaled in f32 by row scale x
      column scale. The unfolded f32 patches of one chunk stay within `chunk_bytes` (so the int8
      copy within a quarter of it): im2col multiplies an activation by kh*kw, which unchunked
      would be the largest tensor of a forward. The im2col and quantisation cost 70-90% of its
      time on CPU (issue 27), which is why "onednn" exists.

    The weights are held once, as the GEMM matrix `weight_int8` [Kp, Np] (K = C_in*kh*kw, both
    padded to multiples of 8); the oneDNN kernel's packed copy is made from it on first use and
    is not part of the state. Output in `compute_dtype`."""

    chunk_bytes: int = 64 << 20
    kernel: str = "auto"  # "auto" | "onednn" | "gemm"

    def __init__(self, conv: nn.Conv2d, compute_dtype: torch.dtype):
        super().__init__()
        if not int8_conv_supported(conv):
            raise ValueError(f"Int8Conv2d: unsupported conv (groups={conv.groups}, "
                             f"padding={conv.padding!r}, padding_mode={conv.padding_mode!r})")
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.compute_dtype = compute_dtype
        k, n = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1], conv.out_channels
        kp, np_ = int8_conv_gemm_shape(conv)
        w = _float_weight(conv).reshape(n, k)  # [C_out, C_in, kh, kw] -> [C_out, K]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [C_out]
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        q = F.pad(q, (0, kp - k, 0, np_ - n))  # [C_out, K] -> [Np, Kp], zeros
        self.register_buffer("weight_int8", q.t().contiguous())  # [Np, Kp] -> [Kp, Np]
        self.register_buffer("weight_scale", scale)
        bias = conv.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._packed: Tensor | None = None

    def _use_onednn(self, x: Tensor) -> bool:
        if self.kernel == "auto":
            return x.device.type == "cpu" and onednn_int8_conv_available()
        if self.kernel not in ("onednn", "gemm"):
            raise ValueError(f"Int8Conv2d.kernel must be 'auto', 'onednn' or 'gemm', not {self.kernel!r}")
        return self.kernel == "onednn"

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        if self._use_onednn(x):
            if x.device.type == "meta" or is_fake(x):  # `mixgraph estimate`'s trace: shapes only
                return self._onednn_like(x).to(self.compute_dtype)
            return self._forward_onednn(x)
        return self._forward_gemm(x)

    def _out_hw(self, h: int, w: int) -> tuple[int, int]:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation
        return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1

    def _onednn_like(self, x: Tensor) -> Tensor:
        """What the oneDNN kernel allocates (a uint8 copy of x, the f32 output), without running
        it: its ops have no fake-tensor implementation, and the estimate traces on fake tensors."""
        torch.empty_like(x, dtype=torch.uint8, memory_format=torch.channels_last)
        ho, wo = self._out_hw(x.shape[2], x.shape[3])
        return torch.empty((x.shape[0], self.out_channels, ho, wo), dtype=torch.float32,
                           device=x.device).contiguous(memory_format=torch.channels_last)

    def quantize_input(self, x: Tensor) -> tuple[Tensor, float, int]:
        """The "onednn" kernel's activation quantisation (`quantize_uint8`), channels_last."""
        q, scale, zero = quantize_uint8(x)
        return q.contiguous(memory_format=torch.channels_last), scale, zero

    def _forward_onednn(self, x: Tensor) -> Tensor:
        packed = self._packed
        if packed is None:
            kh, kw = self.kernel_size
            k = self.in_channels * kh * kw
            w4 = self.weight_int8[:k, : self.out_channels].t().reshape(  # [K, N] -> [C_out, C_in, kh, kw]
                self.out_channels, self.in_channels, kh, kw).contiguous()
            packed = self._packed = torch.ops.onednn.qconv_prepack(
                w4, self.weight_scale, 1.0, 0, list(self.stride), list(self.padding),
                list(self.dilation), 1, None)
        q, scale, zero = self.quantize_input(x)
        zeros = torch.zeros(self.out_channels, dtype=torch.int64)
        # oneDNN writes f32 or bf16 (rounded from its f32 result: the same values as a cast after)
        out_dtype = torch.bfloat16 if self.compute_dtype == torch.bfloat16 else torch.float32
        y = torch.ops.onednn.qconv2d_pointwise(
            q, scale, zero, packed, self.weight_scale, zeros, self.bias, list(self.stride),
            list(self.padding), list(self.dilation), 1, 1.0, 0, out_dtype, "none", [], "")
        return y.to(self.compute_dtype)

    def _forward_gemm(self, x: Tensor) -> Tensor:
        b, _, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation
        ho, wo = self._out_hw(h, w)
        out = torch.empty(b, self.out_channels, ho, wo, dtype=self.compute_dtype, device=x.device)
        k = self.in_channels * kh * kw
        rows = max(1, self.chunk_bytes // (wo * k * 4))  # output rows per chunk (f32 patches)
        imgs = max(1, rows // ho)  # whole images per chunk when an image fits
        for i0 in range(0, b, imgs):
            i1 = min(b, i0 + imgs)
            for r0 in range(0, ho, rows):
                r1 = min(ho, r0 + rows)
                # input rows r*sh - ph + i*dh for output rows r0..r1-1, kernel rows i: the band
                # lo..hi of x, zero-padded where it runs past the top or bottom
                lo, hi = r0 * sh - ph, (r1 - 1) * sh - ph + dh * (kh - 1)
                start = min(max(lo, 0), h)
                stop = max(min(hi + 1, h), start)
                top = min(max(start - lo, 0), hi + 1 - lo)
                bottom = hi + 1 - lo - top - (stop - start)
                band = F.pad(x[i0:i1, :, start:stop], (0, 0, top, bottom))  # [b', C, hi-lo+1, W]
                cols = F.unfold(band, (kh, kw), dilation=(dh, dw), padding=(0, pw), stride=(sh, sw))
                y = self._gemm(cols.transpose(1, 2).reshape(-1, k))  # [b', K, L'] -> [b'*L', K]
                out[i0:i1, :, r0:r1] = y.view(i1 - i0, r1 - r0, wo, -1).permute(0, 3, 1, 2)
        return out

    def _gemm(self, cols: Tensor) -> Tensor:
        """[M, K] f32 patches -> [M, C_out] f32 (bias added)."""
        m = cols.shape[0]
        x_scale = cols.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # [M, 1]
        xq = torch.round(cols / x_scale).clamp(-127, 127).to(torch.int8)
        kp = self.weight_int8.shape[0]
        pad_rows = 17 - m if xq.device.type == "cuda" and m <= 16 else 0  # cuBLAS: more than 16 rows
        if kp != xq.shape[1] or pad_rows:
            xq = F.pad(xq, (0, kp - xq.shape[1], 0, pad_rows))  # [M, K] -> [M', Kp], zeros
        acc = torch._int_mm(xq, self.weight_int8)[:m, : self.out_channels]  # [M, C_out] int32
        y = acc.float() * x_scale * self.weight_scale[None]
        return y if self.bias is None else y + self.bias


# ---------------------------------------------------------------------------------------------
# apply


def apply_precision(module: nn.Module, policy: PolicyLike) -> nn.Module:
    """A copy of `module` whose layers store weights in `policy.storage` and compute in
    `policy.compute`; its forward takes and returns float32. See the module docstring."""
    storage, compute = policy.storage, policy.compute
    if storage not in STORAGE_DTYPES:
        raise ValueError(f"apply_precision: storage dtype {storage} not one of {STORAGE_DTYPES}")
    if compute not in COMPUTE_DTYPES:
        raise ValueError(f"apply_precision: compute dtype {compute} not one of {COMPUTE_DTYPES}")
    if any(isinstance(m, (CastLayer, Int8Linear, Int8Conv2d)) for m in module.modules()):
        raise ValueError("apply_precision: module already has a precision applied; pass the f32 original")

    kept = _keep_f32_names(module)
    as_stored = matched_names(module, "keep_stored")
    int8_names = _int8_names(module, policy)
    if int8_names and any(p.is_meta for p in module.parameters()):
        raise NotImplementedError("int8 weights for a model whose blocks stream (it does not fit in the memory "
                                  "budget) are not supported yet; raise --memory-budget or use another precision")
    vector_dtype = compute if storage in FP8_DTYPES else storage
    to_half_cpu = compute in HALF_DTYPES

    # Pre-fill deepcopy's memo with the converted tensors so the copy never duplicates f32 weights.
    memo: dict[int, Any] = {}
    plans: dict[str, str] = {}  # module name -> "cast" | "int8"
    for name, m in module.named_modules():
        for buf in m._buffers.values():
            if buf is not None:
                memo[id(buf)] = buf
        f32 = name in kept
        if type(m) in _CAST_CLASSES:
            plans[name] = "int8" if name in int8_names else "cast"
        for pname, p in m._parameters.items():
            if p is None or id(p) in memo:
                continue
            if is_quantized(p):  # a GGUF weight stays quantised (dequantised per forward)
                memo[id(p)] = p
                continue
            if (type(m) not in _CAST_CLASSES or plans[name] == "int8" or f32
                    or (name in as_stored and type(m) is nn.Embedding)
                    or (pname == "weight" and m._buffers.get("weight_scale") is not None)):
                dtype = p.dtype  # unsupported module, int8 source, keep-f32/stored, fp8 with scale: as is
            elif isinstance(m, _NORMS) or p.ndim < 2:
                dtype = vector_dtype
            else:
                dtype = storage
            t = p.detach().to(dtype)
            if (pname == "weight" and type(m) is nn.Conv2d and to_half_cpu and not f32
                    and t.device.type == "cpu"):
                t = t.contiguous(memory_format=torch.channels_last)
            memo[id(p)] = nn.Parameter(t, requires_grad=False)
    new = copy.deepcopy(module, memo)

    for name, m in list(new.named_modules()):
        plan = plans.get(name)
        if plan is None:
            continue
        layer_compute = torch.float32 if name in kept else compute
        if plan == "int8":
            int8_class = Int8Linear if type(m) is nn.Linear else Int8Conv2d
            _set_submodule(new, name, int8_class(m, layer_compute))
            continue
        m.__class__ = _CAST_CLASSES[type(m)]
        m.compute_dtype = layer_compute
        if isinstance(m, _NORMS):
            m.norm_dtype = torch.float32 if policy.f32_norms else layer_compute
        if isinstance(m, CastConv2d):
            m.channels_last = layer_compute in HALF_DTYPES
    if policy.upcast_attention:
        for m in new.modules():
            if hasattr(m, "upcast_attention"):
                m.upcast_attention = True
    _install_entry_exit(new, compute)
    return new


def weight_bytes(module: nn.Module) -> int:
    """Bytes held by the module's parameters and buffers (each storage counted once)."""
    seen: set[tuple[int, torch.dtype]] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.raw.data_ptr(), "gguf") if is_quantized(t) else (t.data_ptr(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += t.raw.numel() if is_quantized(t) else t.numel() * t.element_size()
    return total


def precision_bytes(module: nn.Module, policy: PolicyLike) -> tuple[int, int]:
    """(held, per_use): the bytes of weights the weight store holds for `module` under `policy`
    (storage dtype, also for parameters of layers that are no cast layers (3-D convolutions,
    custom norms), as the store holds them; keep-f32 parts f32; `keep_stored` tables 0, since they stay lazily paged views
    of the file and only looked-up rows are read), and the bytes `apply_precision` adds on each
    use (int8 layers and their scales; fp8 storage's vectors in the compute dtype). Reads shapes
    only, so a module built on the meta device answers for a full-size model without weights.
    `mixgraph estimate` builds its weight figures from this; the rules mirror `apply_precision`
    and `store.dtype_rule` (and, for int8 convolutions, the kernel this machine runs:
    `onednn_int8_conv_available`)."""
    kept = _keep_f32_names(module)
    as_stored = matched_names(module, "keep_stored")
    int8_names = _int8_names(module, policy)
    storage, compute = policy.storage, policy.compute
    size = {dt: torch.empty((), dtype=dt).element_size() for dt in (*STORAGE_DTYPES,)}
    onednn_conv = bool(int8_names) and onednn_int8_conv_available()
    held = per_use = 0
    seen: set[int] = set()
    for name, m in module.named_modules():
        for pname, p in m._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            if name in as_stored and type(m) is nn.Embedding:
                continue
            if name in kept:
                held += n * 4
            elif type(m) not in _CAST_CLASSES:
                # the store holds it in the storage dtype (`store.dtype_rule`) and apply_precision
                # leaves it as stored: the Wan VAE's CausalConv3d weights, custom norm gains; the
                # module casts it itself where it uses it
                held += n * size[storage]
            elif name in int8_names:
                held += n * size[storage]  # the store keeps the weights the int8 copy is made from
                if pname == "weight" and type(m) is nn.Linear:
                    per_use += n + m.out_features * 4  # int8 matrix, f32 scales
                    if onednn_conv:  # oneDNN's packed copy of the int8 weights, made on first use
                        per_use += n
                elif pname == "weight":
                    k, n_out = int8_conv_gemm_shape(m)
                    per_use += k * n_out + m.out_channels * 4  # padded int8 matrix, f32 scales
                    if onednn_conv:  # oneDNN's packed copy of the int8 weights, made on first use
                        per_use += m.in_channels * m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            elif storage in FP8_DTYPES and (isinstance(m, _NORMS) or p.ndim < 2):
                held += n * size[storage]
                per_use += n * size[compute]
            else:
                held += n * size[storage]
    return held, per_use


# ---------------------------------------------------------------------------------------------
# helpers


def _int8_names(module: nn.Module, policy: PolicyLike) -> set[str]:
    """Names of the modules `policy` turns into Int8Linear / Int8Conv2d: under `int8`, every
    nn.Linear and supported nn.Conv2d not kept f32 and not named by `int8_skip`."""
    if not policy.int8:
        return set()
    skip = _keep_f32_names(module) | matched_names(module, "int8_skip")
    return {name for name, m in module.named_modules() if name not in skip and (
        type(m) is nn.Linear or (type(m) is nn.Conv2d and int8_conv_supported(m)))}


def _keep_f32_names(module: nn.Module) -> set[str]:
    """Names of all modules matched by any `keep_f32` pattern (and everything below them)."""
    return matched_names(module, "keep_f32")


def matched_names(module: nn.Module, attr: str) -> set[str]:
    """Names of all modules matched by a pattern in class attribute `attr` (and those below)."""
    patterns: list[str] = []
    for owner, m in module.named_modules():
        for p in getattr(type(m), attr, ()):
            patterns.append(f"{owner}.{p}" if owner else p)
    kept: set[str] = set()
    for name, _ in module.named_modules():
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*") for p in patterns):
            kept.add(name)
    return kept


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def _cast_tree(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_cast_tree(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_tree(v, dtype) for k, v in obj.items()}
    return obj


def _install_entry_exit(model: nn.Module, compute: torch.dtype) -> None:
    keep: Iterable[str] = getattr(type(model), "keep_f32_inputs", ())
    keep = frozenset(keep)
    params = list(inspect.signature(model.forward).parameters)

    def entry(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        new_args = tuple(
            a if i < len(params) and params[i] in keep else _cast_tree(a, compute)
            for i, a in enumerate(args)
        )
        new_kwargs = {k: v if k in keep else _cast_tree(v, compute) for k, v in kwargs.items()}
        return new_args, new_kwargs

    def exit_(_mod: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> Any:
        _SCRATCH.buffers.clear()  # no cast buffer outlives a forward (peak memory between calls)
        return _cast_tree(output, torch.float32)

    model.register_forward_pre_hook(entry, with_kwargs=True)
    model.register_forward_hook(exit_, with_kwargs=True)
