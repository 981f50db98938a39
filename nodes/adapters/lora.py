"""LoRA / LyCORIS files: parse, map onto a model's weight keys, merge into weights.

A LoRA file holds, per adapted module, a low-rank (or Hadamard / Kronecker) update ΔW. Files
name the modules in one of several schemes; this module maps every scheme onto *our* weight keys
(LDM UNet names, HF-layout CLIP names), then ``apply_patches`` merges ``W += strength · ΔW`` in
float32 and casts back to the storage dtype (ComfyUI's ``calculate_weight``).

Naming schemes (kohya, diffusers/PEFT, ComfyUI generic, LyCORIS) are matched onto model keys by
``nodes.adapters.lora_keys``; this module builds the adapters and merges them.

Weight formats (per module, the suffix after the module name):
  LoRA (Hu et al. 2021, arXiv:2106.09685): ``lora_up``/``lora_down`` (also ``lora_B``/``lora_A``,
    ``lora.up/down``, ``lora_linear_layer.up/down``, ``_lora.up/down``), optional ``alpha``;
    ΔW = (alpha/r) · up @ down, r = rows of down, alpha defaults to r. Conv layers (LoCon) use
    4-D down [r, in, kh, kw] / up [out, r, 1, 1]; with ``lora_mid`` [r, r, kh, kw] (Tucker form),
    ΔW[o, i, h, w] = Σ_ab up[o, a] · mid[a, b, h, w] · down[b, i].
  LoHa (Hyeon-Woo et al. 2022, "FedPara", arXiv:2108.06098): ΔW = (alpha/r) · (w1a @ w1b) ⊙
    (w2a @ w2b), r = rows of w1b; with ``hada_t1``/``hada_t2`` each factor is a Tucker product
    Σ_ab t[a, b] · w_a[a, o] · w_b[b, i] (LyCORIS stores w_a as [r, out] in that mode).
  LoKr (Yeh et al. 2023, "Navigating Text-To-Image Customization", arXiv:2309.14859):
    ΔW = scale · w1 ⊗ w2 (Kronecker), w1/w2 stored whole or as ``_a @ _b`` (w2 optionally Tucker
    with ``lokr_t2``); scale = alpha / rank of the factorized part, 1 if neither is factorized.
  Full differences: ``diff`` (ΔW) and ``diff_b`` (Δbias).
  DoRA (Liu et al. 2024, arXiv:2402.09353): a LoRA / LoHa / LoKr module with ``dora_scale`` (the
    magnitude vector m) merges as ComfyUI's ``weight_decompose`` (comfy/weight_adapter/base.py,
    9c0cf36): W_c = W + scale · ΔW (strength not applied yet); if m has as many rows as W has
    output channels ("wd_on_output"), W_c is divided by the per-output-row norm of W *before*
    this patch (ComfyUI uses the unpatched W there, not W_c); otherwise (kohya/LyCORIS default,
    m of shape [1, in(, 1, 1)]) by the norm of W_c per input channel (over out and kernel dims);
    eps = float32 eps is added to the norm; W_c ← W_c · m / norm; finally
    W ← W + strength · (W_c − W) (W_c itself at strength 1). Bypass mode refuses DoRA.
Not supported (raise NotImplementedError): GLoRA, OFT/BOFT, DoRA on a full-difference module.

Pieces of fused weights: a family whose model fuses what other layouts keep apart (BFL's
``img_attn.qkv`` = diffusers' ``to_q``, ``to_k``, ``to_v``) maps those LoRA modules onto row slices
(``families.base.LoraTarget``); the weight then holds a ``SlicedAdapter`` whose pieces are merged
into their rows only (ComfyUI narrows the weight to the slice and adds the update there), each with
its own alpha / rank, and a piece whose halves the model stores the other way round gets its
update's halves swapped (ComfyUI's ``swap_scale_shift`` function on the update).

Merging follows ComfyUI: weights to float32, each patch in stack order adds
``(strength · scale) · Δ``, then one cast back to the storage dtype. fp8 storage is rounded to
nearest here (ComfyUI rounds fp8 stochastically with a per-key seed); f32/f16/bf16 are identical.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mixgraph.nodes.adapters.lora_keys import CLIP_TARGETS, group_modules, is_text_encoder_name, model_lookup
from mixgraph.nodes.families.base import LoraTarget
from mixgraph.nodes.weights.merge import MergePatch, merged_weight, warn_mismatches

__all__ = [
    "TARGETS",
    "LoraKeyWarning",
    "LoraAdapter",
    "LohaAdapter",
    "LokrAdapter",
    "DiffAdapter",
    "Piece",
    "SlicedAdapter",
    "is_diff",
    "LoraFile",
    "LoraPatch",
    "load_lora",
    "apply_patches",
    "dora_merge",
    "describe_lora",
]

TARGETS = ("unet",) + CLIP_TARGETS  # ("unet", "clip_l", "clip_g", "clip_h"); other encoder names follow these


class LoraKeyWarning(UserWarning):
    """Some keys of a LoRA file match no weight of the model (ComfyUI: "lora key not loaded")."""


# --------------------------------------------------------------------------------------------
# adapters: one module's update


def _f32(t: Tensor) -> Tensor:
    return t.to(torch.float32)


def _tucker(core: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Tucker product: core [ra, rb, kh, kw], a [out, ra], b [rb, in] -> [out, in, kh, kw]."""
    return torch.einsum("abhw,oa,bi->oihw", core, a, b).contiguous()


def _rank_scale(alpha: float | None, rank: int) -> float:
    return 1.0 if alpha is None else alpha / rank


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """Low-rank update up @ down (LoCon for convs; Tucker with ``mid``)."""

    up: Tensor  # [out, r] or [out, r, 1, 1]
    down: Tensor  # [r, in] or [r, in, kh, kw] ([r, in, 1, 1] with mid)
    mid: Tensor | None = None  # [r, r, kh, kw]
    alpha: float | None = None
    dora_scale: Tensor | None = None  # DoRA magnitude: [out, 1(, 1, 1)] or [1, in(, 1, 1)]

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    def flat_shape(self) -> tuple[int, int]:
        cols = self.down[0].numel() if self.mid is None else self.down.shape[1] * self.mid[0, 0].numel()
        return self.up.shape[0], cols

    @property
    def scale(self) -> float:
        return _rank_scale(self.alpha, self.rank)

    def raw(self, shape: torch.Size) -> Tensor:
        up = _f32(self.up).flatten(1)  # [out, r]
        if self.mid is None:
            diff = up @ _f32(self.down).flatten(1)  # [out, in*kh*kw]
        else:
            diff = _tucker(_f32(self.mid), up, _f32(self.down).flatten(1))  # [out, in, kh, kw]
        return diff.reshape(shape)


@dataclass(frozen=True, eq=False)
class LohaAdapter:
    """Hadamard product of two low-rank matrices (FedPara / LyCORIS LoHa)."""

    w1a: Tensor  # [out, r]; with t1 (LyCORIS Tucker mode) stored [r, out]
    w1b: Tensor  # [r, in*kh*kw]; with t1 [r, in]
    w2a: Tensor
    w2b: Tensor
    t1: Tensor | None = None  # [r, r, kh, kw]
    t2: Tensor | None = None
    alpha: float | None = None
    dora_scale: Tensor | None = None  # DoRA magnitude (see LoraAdapter)

    @property
    def rank(self) -> int:
        return self.w1b.shape[0]

    @staticmethod
    def _factor(a: Tensor, b: Tensor, t: Tensor | None) -> Tensor:
        if t is None:
            return _f32(a) @ _f32(b)  # [out, in*kh*kw]
        return _tucker(_f32(t), _f32(a).T, _f32(b))  # a: [r, out] -> [out, r]

    def flat_shape(self) -> tuple[int, int]:
        if self.t1 is None:
            return self.w1a.shape[0], self.w1b.shape[1]
        return self.w1a.shape[1], self.w1b.shape[1] * self.t1[0, 0].numel()

    @property
    def scale(self) -> float:
        return _rank_scale(self.alpha, self.rank)

    def raw(self, shape: torch.Size) -> Tensor:
        m1 = self._factor(self.w1a, self.w1b, self.t1)
        m2 = self._factor(self.w2a, self.w2b, self.t2)
        return (m1 * m2).reshape(shape)


@dataclass(frozen=True, eq=False)
class LokrAdapter:
    """Kronecker product w1 ⊗ w2 (LyCORIS LoKr); either factor whole or low-rank."""

    w1: Tensor | None = None  # [o1, i1]
    w1a: Tensor | None = None
    w1b: Tensor | None = None
    w2: Tensor | None = None  # [o2, i2] or [o2, i2, kh, kw]
    w2a: Tensor | None = None  # [o2, r]; with t2 (Tucker mode) stored [r, o2]
    w2b: Tensor | None = None  # [r, i2*kh*kw]; with t2 [r, i2]
    t2: Tensor | None = None  # [r, r, kh, kw]
    alpha: float | None = None
    dora_scale: Tensor | None = None  # DoRA magnitude (see LoraAdapter)

    def _w1(self) -> Tensor:
        return _f32(self.w1) if self.w1 is not None else _f32(self.w1a) @ _f32(self.w1b)

    def _w2(self) -> Tensor:
        if self.w2 is not None:
            return _f32(self.w2)
        if self.t2 is None:
            return _f32(self.w2a) @ _f32(self.w2b)
        return _tucker(_f32(self.t2), _f32(self.w2a).T, _f32(self.w2b))  # w2a: [r, o2] -> [o2, r]

    @property
    def scale(self) -> float:
        dim = None
        if self.w1 is None:
            dim = self.w1b.shape[0]
        if self.w2 is None:
            dim = self.w2b.shape[0]
        return 1.0 if self.alpha is None or dim is None else self.alpha / dim

    def flat_shape(self) -> tuple[int, int]:
        o1, i1 = (self.w1.shape if self.w1 is not None else (self.w1a.shape[0], self.w1b.shape[1]))
        if self.w2 is not None:
            o2, c2 = self.w2.shape[0], self.w2[0].numel()
        elif self.t2 is None:
            o2, c2 = self.w2a.shape[0], self.w2b.shape[1]
        else:
            o2, c2 = self.w2a.shape[1], self.w2b.shape[1] * self.t2[0, 0].numel()
        return o1 * o2, i1 * c2

    def raw(self, shape: torch.Size) -> Tensor:
        w1, w2 = self._w1(), self._w2()
        if w2.ndim == 4:  # conv: [o1, i1] -> [o1, i1, 1, 1] so the kernel dims come from w2
            w1 = w1[:, :, None, None]
        # A 2-D w2 of a conv holds [o2, i2*kh*kw]: the Kronecker column c1*(i2*kh*kw) + c2 is the
        # flattened [i1*i2, kh, kw] index, so the 2-D product reshapes to the conv weight.
        return torch.kron(w1, w2).reshape(shape)


@dataclass(frozen=True, eq=False)
class DiffAdapter:
    """A stored full difference ΔW (``.diff``) or Δbias (``.diff_b``)."""

    diff: Tensor

    def flat_shape(self) -> tuple[int, int]:
        return self.diff.shape[0], self.diff[0].numel() if self.diff.ndim > 1 else 1

    scale = 1.0

    def raw(self, shape: torch.Size) -> Tensor:
        return _f32(self.diff).reshape(shape)


Adapter = LoraAdapter | LohaAdapter | LokrAdapter | DiffAdapter


@dataclass(frozen=True, eq=False)
class Piece:
    """One LoRA module's adapter on a row slice of a fused weight (``rows`` (start, size), None:
    all rows), its update's two halves swapped when ``swap_halves``."""

    adapter: Adapter
    rows: tuple[int, int] | None = None
    swap_halves: bool = False

    def shape_in(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of this piece's part of a weight of ``shape``."""
        return tuple(shape) if self.rows is None else (self.rows[1],) + tuple(shape[1:])

    def fits(self, shape: tuple[int, ...]) -> bool:
        if len(shape) == 0:
            return False
        if self.rows is not None and (self.rows[0] < 0 or sum(self.rows) > shape[0]):
            return False
        if self.swap_halves and self.shape_in(shape)[0] % 2:
            return False
        return _fits(self.adapter, self.shape_in(shape))


@dataclass(frozen=True, eq=False)
class SlicedAdapter:
    """The pieces of one fused weight that several LoRA modules adapt (q, k, v of one qkv), in
    the order the file named them; each merges into its own rows."""

    pieces: tuple[Piece, ...]

    def with_piece(self, piece: Piece) -> "SlicedAdapter":
        return SlicedAdapter(self.pieces + (piece,))


def is_diff(ad) -> bool:
    """A stored full difference (a ``DiffAdapter``, or a sliced weight whose every piece is one):
    what bypass mode merges rather than hooks."""
    if isinstance(ad, SlicedAdapter):
        return all(isinstance(p.adapter, DiffAdapter) for p in ad.pieces)
    return isinstance(ad, DiffAdapter)


# --------------------------------------------------------------------------------------------
# the file and the patch


@dataclass(frozen=True)
class LoraFile:
    """A LoRA file mapped onto one model.

    identity:  what makes this file this file (path + size + mtime, or a content hash of an
               in-memory state dict); equality and hashing use only ``identity``.
    name:      for messages (file name).
    adapters:  target -> {model weight key -> adapter}; keys are exactly the keys given to
               ``load_lora`` (so ``apply_patches`` finds them in the materialized state dict).
    unmatched: LoRA module names that matched no model weight (already warned about once).
    skipped:   module names for a part that was not offered (text-encoder keys when no CLIP keys
               were given, as for LoraLoaderModelOnly).
    """

    identity: str
    name: str = field(compare=False)
    adapters: Mapping[str, Mapping[str, Adapter]] = field(compare=False, hash=False, repr=False)
    unmatched: tuple[str, ...] = field(default=(), compare=False, hash=False)
    skipped: tuple[str, ...] = field(default=(), compare=False, hash=False)

    @property
    def targets(self) -> tuple[str, ...]:
        """The parts this file adapts: "unet" and the SD encoders in ``TARGETS`` order, then any
        other text encoder name in the order it was mapped."""
        known = tuple(t for t in TARGETS if self.adapters.get(t))
        return known + tuple(t for t, per in self.adapters.items() if per and t not in TARGETS)

    def patch(self, target: str, strength: float) -> "LoraPatch":
        if target not in TARGETS and target not in self.adapters:
            raise ValueError(f"LoRA target must be one of {TARGETS} or a text encoder the file adapts "
                             f"({', '.join(self.targets) or 'none'}), got {target!r}")
        return LoraPatch(self, float(strength), target)

    def patches(self, strength_model: float, strength_clip: float) -> tuple[tuple["LoraPatch", ...], tuple["LoraPatch", ...]]:
        """(unet patches, clip patches) for LoraLoader; a zero strength or absent part gives ()."""
        unet = (self.patch("unet", strength_model),) if strength_model and self.adapters.get("unet") else ()
        clip = tuple(self.patch(t, strength_clip) for t in self.targets if t != "unet" and strength_clip)
        return unet, clip


@dataclass(frozen=True)
class LoraPatch:
    """One LoRA applied to one model part; what a handle stores in ``patches`` (hashable)."""

    lora: LoraFile
    strength: float
    target: str  # "unet" or a text encoder's name ("clip_l", "clip_g", ...)


@dataclass(frozen=True)
class ScalePatch:
    """Multiplies every weight whose key ends with a given suffix by its factor, in the patch
    order (ComfyUI's ``add_patches({key: (None,)}, 0.0, factor)``: the attention-multiply nodes).
    Hashable like ``LoraPatch``, so a scaled model is cached as its own weight-store entry."""

    target: str  # "unet" or a text encoder's name
    factors: tuple[tuple[str, float], ...]  # (key suffix, factor)


# --------------------------------------------------------------------------------------------
# one module's tensors -> its adapter


def _build_adapter(module: str, slots: dict[str, Tensor]) -> tuple[Adapter | None, Adapter | None]:
    """(weight adapter, bias adapter) for one module's tensors."""
    if "unsupported" in slots:
        raise NotImplementedError(f"LoRA module {module}: this adapter type (OFT/GLoRA/norm) is not supported yet")
    alpha = float(slots["alpha"].float().item()) if "alpha" in slots else None
    bias = DiffAdapter(slots["diff_b"]) if "diff_b" in slots else None
    dora = slots.get("dora_scale")
    if "up" in slots and "down" in slots:
        return LoraAdapter(slots["up"], slots["down"], slots.get("mid"), alpha, dora), bias
    if all(f"hada_{w}" in slots for w in ("w1_a", "w1_b", "w2_a", "w2_b")):
        return LohaAdapter(
            slots["hada_w1_a"], slots["hada_w1_b"], slots["hada_w2_a"], slots["hada_w2_b"],
            slots.get("hada_t1"), slots.get("hada_t2"), alpha, dora,
        ), bias
    lokr = {k[5:]: v for k, v in slots.items() if k.startswith("lokr_")}
    if lokr:
        has1 = "w1" in lokr or ("w1_a" in lokr and "w1_b" in lokr)
        has2 = "w2" in lokr or ("w2_a" in lokr and "w2_b" in lokr)
        if not (has1 and has2):
            raise ValueError(f"LoRA module {module}: incomplete LoKr tensors {sorted(lokr)}")
        return LokrAdapter(
            lokr.get("w1"), lokr.get("w1_a"), lokr.get("w1_b"),
            lokr.get("w2"), lokr.get("w2_a"), lokr.get("w2_b"), lokr.get("t2"), alpha, dora,
        ), bias
    if dora is not None:
        raise NotImplementedError(
            f"LoRA module {module}: DoRA (dora_scale) without LoRA/LoHa/LoKr factors (on a full "
            f"difference or alone) is not supported yet")
    if "diff" in slots:
        return DiffAdapter(slots["diff"]), bias
    if bias is not None:
        return None, bias
    raise ValueError(f"LoRA module {module}: incomplete tensors {sorted(slots)} (no up/down pair)")


# --------------------------------------------------------------------------------------------
# loading


def _identity_of(sd: Mapping[str, Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()


#: module-name pieces that tell which DiT a LoRA was trained for (first match wins)
_DIT_MARKERS = (
    ("single_transformer_blocks", "a Flux-style DiT, diffusers names"),
    ("double_blocks", "a Flux-style DiT, BFL names"),
    ("joint_blocks", "an SD3 MMDiT"),
    ("context_refiner", "a Lumina 2 / Z-Image NextDiT"),
    ("attn.add_q_proj", "an SD3 / Flux-style DiT, diffusers names"),
)


def describe_lora(sd_keys: Iterable[str], adapters: Mapping[str, Adapter]) -> str:
    """A short guess of what a LoRA was trained for, for error messages."""
    keys = list(sd_keys)
    context = None
    for module, ad in adapters.items():
        if re.search(r"attn2[._]to_[kv]$", module) and isinstance(ad, LoraAdapter):
            context = ad.flat_shape()[1]
            break
    te = []
    if any(k.startswith(("lora_te1_", "lora_te2_", "text_encoder_2.")) for k in keys):
        te.append("two text encoders (clip_l + clip_g)")
    elif any(k.startswith(("lora_te_", "text_encoder.")) for k in keys):
        te.append("one text encoder")
    family = {768: "SD1.x", 1024: "SD2.x", 2048: "SDXL", 1280: "SDXL refiner"}.get(context or 0)
    parts = [f"{name} (names such as {marker})" for marker, name in _DIT_MARKERS
             if any(marker in k for k in keys)][:1]
    if family:
        parts.append(f"{family} (cross-attention context {context})")
    elif context:
        parts.append(f"a UNet with cross-attention context {context}")
    parts += te
    if not parts:
        parts.append(f"{len(adapters)} modules such as {', '.join(list(adapters)[:3])}")
    return ", ".join(parts)


def load_lora(
    source: str | os.PathLike | Mapping[str, Tensor],
    unet_keys: Mapping | Iterable[str] | None,
    clip_keys: Mapping[str, Mapping | Iterable[str]] | None = None,
    *,
    name: str | None = None,
    identity: str | None = None,
    unet_names: Mapping[str, LoraTarget] | None = None,
) -> LoraFile:
    """Read a LoRA file (or state dict) and map it onto a model's weights.

    unet_keys: the UNet's weight keys (LDM names, any prefix ending in ``diffusion_model.``
               allowed), as keys or as a key -> tensor/shape mapping (shapes enable the
               wrong-architecture check here rather than at merge time); None = no UNet.
    unet_names: the model family's other LoRA module names (``Family.lora_key_map``, what
               ``ModelHandle.lora_names()`` gives), some onto row slices of fused weights.
    clip_keys: {encoder name ("clip_l", ...): keys or key -> shape} in HF CLIP layout; None = no
               text encoder (text-encoder keys of the file are then skipped, not reported).
    Returns a ``LoraFile``. Warns once (``LoraKeyWarning``) with the count and examples of file
    modules that match nothing. Raises ValueError naming the file and what it targets when
    nothing matches or a matched weight has another shape (a LoRA for another architecture).
    """
    if isinstance(source, Mapping):
        sd = dict(source)
        name = name or "<state dict>"
        identity = identity or _identity_of(sd)
    else:
        from mixgraph.nodes.weights.safetensors_io import WeightSource, read_tensors

        path = os.fspath(source)
        sd = read_tensors(path)
        name = name or os.path.basename(path)
        identity = identity or repr(WeightSource.from_file(path).file_identity)

    control = sorted(k for k in sd if k.endswith((".reshape_weight", ".set_weight")))
    if control:
        # BFL's Flux Canny / Depth LoRAs (flux1-{canny,depth}-dev-lora): ComfyUI pads a layer to a new
        # shape (``reshape_weight``: the input embedder widened to the control channels) and
        # replaces weights whole (``set_weight``), which LoRA patches here cannot express
        raise NotImplementedError(f"{name}: a control LoRA that reshapes or replaces weights ({control[0]}, "
                                  f"{len(control)} such keys; BFL's Flux Canny / Depth LoRAs): not supported yet; "
                                  f"use the full flux1-canny-dev / flux1-depth-dev model")
    grouped, stray = group_modules(sd)
    lookup, shapes = model_lookup(unet_keys, clip_keys, unet_names)

    adapters: dict[str, dict[str, Adapter]] = {}
    by_module: dict[str, Adapter] = {}
    unmatched: list[str] = list(stray)
    skipped: list[str] = []
    mismatched: list[str] = []
    for module, slots in grouped.items():
        w_ad, b_ad = _build_adapter(module, slots)
        if w_ad is not None:
            by_module[module] = w_ad
        hit = lookup.get(module)
        if hit is None:
            if is_text_encoder_name(module) and not clip_keys:
                skipped.append(module)
            elif unet_keys is None and not is_text_encoder_name(module):
                skipped.append(module)
            else:
                unmatched.append(module)
            continue
        target, model_module, part = hit
        per = adapters.setdefault(target, {})
        for suffix, ad in ((".weight", w_ad), (".bias", b_ad)):
            if ad is None:
                continue
            key = model_module + suffix
            shape = shapes.get(key)
            if part is not None and (part.rows is not None or part.swap_halves):
                piece = Piece(ad, part.rows, part.swap_halves)
                if shape is not None and not piece.fits(shape):
                    where = f"rows {part.rows[0]}:{sum(part.rows)} of " if part.rows else ""
                    mismatched.append(f"{module} (gives {_describe_shape(ad)} for {where}{key} {list(shape)})")
                    continue
                held = per.get(key)
                per[key] = held.with_piece(piece) if isinstance(held, SlicedAdapter) else SlicedAdapter((piece,))
                continue
            if shape is not None and not _fits(ad, shape):
                mismatched.append(f"{module} (gives {_describe_shape(ad)} for {key} {list(shape)})")
                continue
            per[key] = ad

    n_matched = sum(len(v) for v in adapters.values())
    if mismatched:
        raise ValueError(
            f"LoRA {name!r} does not fit this model: it targets {describe_lora(sd, by_module)}; "
            f"{len(mismatched)} weights have "
            f"other shapes, e.g. {'; '.join(mismatched[:3])}"
        )
    # nothing matched and not merely because the part it adapts was not offered (a text-encoder
    # LoRA in a model-only load is fine and does nothing)
    if n_matched == 0 and unmatched:
        raise ValueError(
            f"LoRA {name!r} matches no weight of this model: it targets {describe_lora(sd, by_module)}; "
            f"{len(unmatched)} modules match nothing, e.g. {', '.join(unmatched[:3])}"
        )
    if unmatched:
        warnings.warn(
            f"LoRA {name!r}: {len(unmatched)} keys match no model weight and were not loaded, "
            f"e.g. {', '.join(unmatched[:5])}",
            LoraKeyWarning,
            stacklevel=2,
        )
    return LoraFile(
        identity=identity,
        name=name,
        adapters={t: dict(v) for t, v in adapters.items()},
        unmatched=tuple(unmatched),
        skipped=tuple(skipped),
    )


def _fits(ad: Adapter, shape: tuple[int, ...]) -> bool:
    if isinstance(ad, DiffAdapter):
        return tuple(ad.diff.shape) == tuple(shape) or ad.diff.numel() == math.prod(shape) and ad.diff.shape[0] == shape[0]
    rows, cols = ad.flat_shape()
    if getattr(ad, "dora_scale", None) is not None and not _dora_fits(ad.dora_scale, shape):
        return False
    return len(shape) > 0 and rows == shape[0] and rows * cols == math.prod(shape)


def _dora_fits(m: Tensor, shape: tuple[int, ...]) -> bool:
    """A magnitude vector of one entry per output row ([out, 1, ...]) or per input channel."""
    if len(shape) < 2 or m.ndim == 0:
        return False
    return (m.shape[0] == shape[0] and m.numel() == shape[0]) or m.numel() == shape[1]


def _describe_shape(ad: Adapter) -> str:
    if isinstance(ad, DiffAdapter):
        return str(list(ad.diff.shape))
    rows, cols = ad.flat_shape()
    dora = getattr(ad, "dora_scale", None)
    return f"[{rows}, {cols}]" + (f" with dora_scale {list(dora.shape)}" if dora is not None else "")


# --------------------------------------------------------------------------------------------
# merging


def apply_patches(
    state_dict: Mapping[str, Tensor], patches: Iterable[LoraPatch], *, target: str | None = None,
    others: Mapping[MergePatch, Mapping[str, Tensor]] | None = None,
    scales: Mapping[str, Tensor] | None = None,
    only: Callable[[str], bool] | None = None,
) -> dict[str, Tensor]:
    """A new state dict with every patch merged, in order (the input is not modified).

    Keys are those the LoRAs were mapped onto by ``load_lora``. ``target`` restricts the merge to
    patches of one part (e.g. "clip_g" when each encoder is materialized separately); None applies
    every patch whose keys are present. For each patched key: W32 = W.float(); for each patch,
    W32 += (strength · scale) · Δ (Δ from the adapter's formula, scale alpha/rank); then the
    result is cast back to W's dtype once. A patched key missing from ``state_dict`` or with the
    wrong shape raises ValueError naming the LoRA. A ``MergePatch`` (``nodes.weights.merge``) blends
    in the other model's materialized state dict, given in ``others``, in the same float32 pass.
    ``scales``: key -> the scale of an fp8 weight kept quantised (``nodes.weights.quantized``): that
    weight is dequantised (W · s) before the merge and re-quantised with the same scale after it
    (W32 / s, clamped to the fp8 range, rounded to nearest; ComfyUI rounds stochastically).
    ``only``: the keys ``state_dict`` is a part of (weight streaming merges one block at a time,
    ``nodes/weights/streaming.py``): a LoRA key outside them is skipped, not refused; each key's
    merge is the same arithmetic as in a whole-model merge.
    """
    work: dict[str, list[tuple[float, Adapter | None, LoraPatch | ScalePatch]]] = {}
    for p in patches:
        if target is not None and p.target != target:
            continue
        if getattr(p, "bypass", False):  # lora_bypass.BypassPatch: a forward-time patch
            raise NotImplementedError(
                f"LoRA {p.lora.name!r} was loaded in bypass mode (LoraLoaderBypass): merging it into "
                f"weights (saving, model merging, hooks or a ControlNet built from this model) is "
                f"not supported yet; use LoraLoader")
        if isinstance(p, MergePatch):
            other = (others or {}).get(p)
            if other is None:
                raise ValueError(f"model merge ({p.target}): the second model's weights were not given")
            for key in state_dict:
                pair = p.strengths_for(key) if key in other else None
                if pair is not None:
                    work.setdefault(key, []).append((pair, other[key], p))
            continue
        if isinstance(p, ScalePatch):
            for key in state_dict:
                for suffix, factor in p.factors:
                    if factor != 1.0 and key.endswith(suffix):
                        work.setdefault(key, []).append((factor, None, p))
            continue
        if p.strength == 0.0:
            continue
        for key, ad in p.lora.adapters.get(p.target, {}).items():
            if key not in state_dict and only is not None and not only(key):
                continue  # another block's weight (streaming): merged when that block is read
            if key not in state_dict:
                raise ValueError(
                    f"LoRA {p.lora.name!r} ({p.target}) patches {key!r}, which this model does not have "
                    f"(was it loaded against another model's keys?)"
                )
            work.setdefault(key, []).append((p.strength, ad, p))
    out = dict(state_dict)
    mismatched: dict[MergePatch, list[str]] = {}
    for key, items in work.items():
        w = state_dict[key]
        scale = None if scales is None else scales.get(key)
        w32 = w.to(torch.float32, copy=True) if scale is None else w.to(torch.float32) * scale
        for strength, ad, p in items:
            if isinstance(p, MergePatch):
                if not merged_weight(w32, ad, *strength):
                    mismatched.setdefault(p, []).append(key)
                continue
            if ad is None:  # ScalePatch
                w32 *= strength
                continue
            if isinstance(ad, SlicedAdapter):
                _merge_pieces(w32, ad, strength, p, key)
                continue
            if not _fits(ad, tuple(w.shape)):
                raise ValueError(
                    f"LoRA {p.lora.name!r}: {key} has shape {list(w.shape)}, the LoRA gives {_describe_shape(ad)}"
                )
            if getattr(ad, "dora_scale", None) is not None:
                w32 = dora_merge(w32, ad, strength)
            else:
                w32 += _scaled_delta(ad, w.shape, strength)
        if scale is None:
            out[key] = w32.to(w.dtype)
        else:
            top = torch.finfo(w.dtype).max
            out[key] = (w32 / scale).clamp_(-top, top).to(w.dtype)
    for p, keys in mismatched.items():
        warn_mismatches(p, keys, {k: tuple(others[p][k].shape) for k in keys})
    return out


def _swap_halves(t: Tensor) -> Tensor:
    first, second = t.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def _merge_pieces(w32: Tensor, ad: SlicedAdapter, strength: float, p: LoraPatch, key: str) -> None:
    """Each piece's update into its rows of the float32 weight ``w32`` (in place), as ComfyUI
    merges a ``(key, (0, offset, size))`` patch into ``weight.narrow(0, offset, size)``."""
    for piece in ad.pieces:
        if not piece.fits(tuple(w32.shape)):
            raise ValueError(f"LoRA {p.lora.name!r}: {key} has shape {list(w32.shape)}, the LoRA gives "
                             f"{_describe_shape(piece.adapter)} for rows {piece.rows}")
        view = w32 if piece.rows is None else w32.narrow(0, piece.rows[0], piece.rows[1])
        a = piece.adapter
        if getattr(a, "dora_scale", None) is not None:
            # DoRA's norms are those of the piece in the LoRA's own row order
            base = _swap_halves(view) if piece.swap_halves else view
            merged = dora_merge(base, a, strength)
            view.copy_(_swap_halves(merged) if piece.swap_halves else merged)
            continue
        delta = _scaled_delta(a, view.shape, strength)
        view += _swap_halves(delta) if piece.swap_halves else delta


def _scaled_delta(ad: Adapter, shape: torch.Size, strength: float) -> Tensor:
    """(strength · scale) · raw Δ: one scalar multiply, the order ComfyUI uses."""
    return (strength * ad.scale) * ad.raw(shape)


def dora_merge(w32: Tensor, ad: Adapter, strength: float) -> Tensor:
    """One DoRA patch on the float32 weight ``w32`` (ComfyUI ``weight_decompose``,
    comfy/weight_adapter/base.py 9c0cf36; see the module docstring). Returns the new weight."""
    shape = w32.shape
    calc = w32 + ad.scale * ad.raw(shape)  # strength enters only in the final blend
    m = _f32(ad.dora_scale).to(w32.device)
    lead = [1] * (w32.ndim - 1)
    if m.shape[0] == shape[0]:  # wd_on_output: per output row, of the weight before this patch
        norm = w32.reshape(shape[0], -1).norm(dim=1).reshape(shape[0], *lead)
    else:  # per input channel, over output rows and kernel taps, of the patched weight
        norm = calc.transpose(0, 1).reshape(shape[1], -1).norm(dim=1).reshape(1, shape[1], *lead[1:])
    norm = norm + torch.finfo(torch.float32).eps
    if m.numel() == norm.numel():
        m = m.reshape(norm.shape)
    calc = calc * (m / norm)
    if strength == 1.0:
        return calc
    return w32 + strength * (calc - w32)


def load_lora_patches(path: str | os.PathLike, model, clip, strength_model: float,
                      strength_clip: float, warn=None):
    """LoraLoader: new (MODEL, CLIP) handles with this file's patches appended (nothing mutated).

    `clip` may be None (LoraLoaderModelOnly), and so may `model` (LoadLoraTextEncoder: the text
    encoder only). Unmatched keys warn once through `warn` (the node's ctx.warn) as well as the
    Python warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoraKeyWarning)
        lora = load_lora(path, model.weight_shapes() if model is not None else None,
                         clip.weight_shapes() if clip is not None and strength_clip else None,
                         unet_names=model.lora_names() if model is not None else None)
    for w in caught:
        if warn is not None:
            warn(str(w.message))
        else:
            warnings.warn(w.message, stacklevel=2)
    unet_patches, clip_patches = lora.patches(strength_model if model is not None else 0.0,
                                              strength_clip if clip is not None else 0.0)
    new_model = model.with_patches(unet_patches) if model is not None and unet_patches else model
    new_clip = clip.with_patches(clip_patches) if clip is not None and clip_patches else clip
    return new_model, new_clip
