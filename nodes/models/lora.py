"""LoRA / LyCORIS files: parse, map onto a model's weight keys, merge into weights.

A LoRA file holds, per adapted module, a low-rank (or Hadamard / Kronecker) update ΔW. Files
name the modules in one of several schemes; this module maps every scheme onto *our* weight keys
(LDM UNet names, HF-layout CLIP names), then ``apply_patches`` merges ``W += strength · ΔW`` in
float32 and casts back to the storage dtype (ComfyUI's ``calculate_weight``).

Naming schemes understood (``<m>`` a module name with dots):
  kohya, LDM names        ``lora_unet_<ldm m, . → _>`` (SDXL files), ``lora_te_`` / ``lora_te1_``
                          (clip_l) / ``lora_te2_`` (clip_g) + ``text_model_encoder_layers_N_...``
  kohya, diffusers names  ``lora_unet_<diffusers m, . → _>`` (SD1.x files)
  diffusers / PEFT        ``unet.<diffusers m>``, bare ``<diffusers m>``, ``text_encoder.<m>``,
                          ``text_encoder_2.<m>``, old attention-processor names
                          (``attn1.processor.to_q_lora.up.weight``), ``base_model.model.`` prefix
  generic (ComfyUI)       ``diffusion_model.<ldm m>``, ``text_encoders.<clip>.transformer.<m>``
  SimpleTuner / LyCORIS   ``lycoris_<diffusers m, . → _>``

Because ``_`` is ambiguous once dots are replaced, names are never parsed: every candidate name of
every model weight is generated and looked up (the only sound way). The diffusers↔LDM UNet module
correspondence is derived from the UNet's block layout (``unet_diffusers_module_map``) and is
shared with the ControlNet loader.

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
Not supported (raise NotImplementedError): DoRA (``dora_scale``), GLoRA, OFT/BOFT.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "TARGETS",
    "LoraKeyWarning",
    "LoraAdapter",
    "LohaAdapter",
    "LokrAdapter",
    "DiffAdapter",
    "LoraFile",
    "LoraPatch",
    "load_lora",
    "apply_patches",
    "describe_lora",
    "unet_diffusers_module_map",
    "diffusers_to_ldm_table",
    "translate_diffusers_key",
]

TARGETS = ("unet", "clip_l", "clip_g", "clip_h")


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
        return tuple(t for t in TARGETS if self.adapters.get(t))

    def patch(self, target: str, strength: float) -> "LoraPatch":
        if target not in TARGETS:
            raise ValueError(f"LoRA target must be one of {TARGETS}, got {target!r}")
        return LoraPatch(self, float(strength), target)

    def patches(self, strength_model: float, strength_clip: float) -> tuple[tuple["LoraPatch", ...], tuple["LoraPatch", ...]]:
        """(unet patches, clip patches) for LoraLoader; a zero strength or absent part gives ()."""
        unet = (self.patch("unet", strength_model),) if strength_model and self.adapters.get("unet") else ()
        clip = tuple(self.patch(t, strength_clip) for t in TARGETS[1:] if strength_clip and self.adapters.get(t))
        return unet, clip


@dataclass(frozen=True)
class LoraPatch:
    """One LoRA applied to one model part; what a handle stores in ``patches`` (hashable)."""

    lora: LoraFile
    strength: float
    target: str  # "unet" | "clip_l" | "clip_g" | "clip_h"


# --------------------------------------------------------------------------------------------
# diffusers <-> LDM UNet module names

_RESNET_SUBS = {  # diffusers ResnetBlock2D child -> LDM ResBlock child
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
_RESNET_SUBS_INV = {v: k for k, v in _RESNET_SUBS.items()}


def _block_pairs(num_res: tuple[int, ...], mid_attn: bool = True) -> list[tuple[str, str, bool]]:
    """(LDM prefix, diffusers prefix, is_resnet) for every block of a UNet with this layout.

    ``num_res``: ResBlocks per level, shallowest first. LDM numbering: input_blocks.0 = conv_in,
    then per level its ResBlocks (resnet at .0, transformer at .1) and, except on the deepest
    level, a downsampler (.0.op). Output blocks run deepest level first with num_res + 1 blocks per
    level; the last of a level holds the upsampler at .1.conv, or .2.conv after a transformer.
    diffusers' up_blocks.i is LDM output level i (deepest first).
    """
    pairs: list[tuple[str, str, bool]] = [
        ("time_embed.0", "time_embedding.linear_1", False),
        ("time_embed.2", "time_embedding.linear_2", False),
        ("label_emb.0.0", "add_embedding.linear_1", False),
        ("label_emb.0.2", "add_embedding.linear_2", False),
        ("input_blocks.0.0", "conv_in", False),
        ("out.0", "conv_norm_out", False),
        ("out.2", "conv_out", False),
        ("middle_block.0", "mid_block.resnets.0", True),
    ]
    if mid_attn:
        pairs += [("middle_block.1", "mid_block.attentions.0", False), ("middle_block.2", "mid_block.resnets.1", True)]
    else:
        pairs += [("middle_block.1", "mid_block.resnets.1", True)]
    levels = len(num_res)
    n = 1
    for i, nr in enumerate(num_res):
        for j in range(nr):
            pairs.append((f"input_blocks.{n}.0", f"down_blocks.{i}.resnets.{j}", True))
            pairs.append((f"input_blocks.{n}.1", f"down_blocks.{i}.attentions.{j}", False))
            n += 1
        if i < levels - 1:
            pairs.append((f"input_blocks.{n}.0.op", f"down_blocks.{i}.downsamplers.0.conv", False))
            n += 1
    n = 0
    for i, nr in enumerate(reversed(num_res)):
        for j in range(nr + 1):
            pairs.append((f"output_blocks.{n}.0", f"up_blocks.{i}.resnets.{j}", True))
            pairs.append((f"output_blocks.{n}.1", f"up_blocks.{i}.attentions.{j}", False))
            if j == nr and i < levels - 1:
                # longer prefixes win in lookup, so ".1.conv" beats the ".1" attention entry
                pairs.append((f"output_blocks.{n}.1.conv", f"up_blocks.{i}.upsamplers.0.conv", False))
                pairs.append((f"output_blocks.{n}.2.conv", f"up_blocks.{i}.upsamplers.0.conv", False))
            n += 1
    return pairs


def _ldm_layout(ldm_modules: Iterable[str]) -> tuple[tuple[int, ...], bool]:
    """(ResBlocks per level, middle attention) from LDM UNet module/key names."""
    inputs, downs, mid = set(), set(), set()
    for k in ldm_modules:
        parts = k.split(".")
        if parts[0] == "input_blocks" and len(parts) > 1:
            inputs.add(int(parts[1]))
            if len(parts) > 3 and parts[2] == "0" and parts[3] == "op":
                downs.add(int(parts[1]))
        elif parts[0] == "middle_block" and len(parts) > 2:
            mid.add((int(parts[1]), parts[2]))
    num_res, count = [], 0
    for i in range(1, max(inputs, default=0) + 1):
        if i in downs:
            num_res.append(count)
            count = 0
        else:
            count += 1
    if inputs:
        num_res.append(count)
    mid_attn = any(p in ("proj_in", "transformer_blocks", "norm") for i, p in mid if i == 1)
    return tuple(num_res), mid_attn


def _translate(name: str, table: Mapping[str, tuple[str, bool]], subs: Mapping[str, str] | None) -> str | None:
    """Map ``name`` through the longest matching dotted prefix of ``table``; None if none."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        hit = table.get(".".join(parts[:cut]))
        if hit is None:
            continue
        new_prefix, is_resnet = hit
        rest = parts[cut:]
        if is_resnet and subs is not None and rest:
            for n in (2, 1):
                mapped = subs.get(".".join(rest[:n]))
                if mapped is not None:
                    rest = mapped.split(".") + rest[n:]
                    break
        return ".".join([new_prefix, *rest])
    return None


def unet_diffusers_module_map(ldm_modules: Iterable[str]) -> dict[str, str]:
    """LDM UNet module (or key) name -> diffusers name, for every given LDM name with one."""
    names = list(ldm_modules)
    num_res, mid_attn = _ldm_layout(names)
    table = {ldm: (diff, res) for ldm, diff, res in _block_pairs(num_res, mid_attn)}
    out = {}
    for n in names:
        d = _translate(n, table, _RESNET_SUBS_INV)
        if d is not None:
            out[n] = d
    return out


def diffusers_to_ldm_table(num_res: tuple[int, ...], mid_attn: bool = True) -> dict[str, tuple[str, bool]]:
    """diffusers prefix -> (LDM prefix, is_resnet); use with ``translate_diffusers_key``.

    ``num_res``: ResBlocks per level (diffusers' layers_per_block per down block)."""
    table = {}
    for ldm, diff, res in _block_pairs(num_res, mid_attn):
        if diff.startswith("up_blocks.") and diff.endswith("upsamplers.0.conv"):
            continue  # ambiguous (.1 or .2); only needed for LDM -> diffusers
        table[diff] = (ldm, res)
    return table


def translate_diffusers_key(key: str, table: Mapping[str, tuple[str, bool]]) -> str | None:
    """A diffusers UNet key -> the LDM key, using a ``diffusers_to_ldm_table``."""
    return _translate(key, table, _RESNET_SUBS)


# --------------------------------------------------------------------------------------------
# parsing a LoRA state dict into modules

# (suffix, slot); longest suffixes first so ".lora_up.weight" wins over ".weight"-like overlaps.
_SUFFIXES: list[tuple[str, str]] = sorted(
    [
        (".lora_up.weight", "up"), (".lora_down.weight", "down"), (".lora_mid.weight", "mid"),
        (".lora_B.weight", "up"), (".lora_A.weight", "down"),
        (".lora_B.default.weight", "up"), (".lora_A.default.weight", "down"),
        (".lora.up.weight", "up"), (".lora.down.weight", "down"),
        ("_lora.up.weight", "up"), ("_lora.down.weight", "down"),
        (".lora_linear_layer.up.weight", "up"), (".lora_linear_layer.down.weight", "down"),
        (".alpha", "alpha"),
        (".hada_w1_a", "hada_w1_a"), (".hada_w1_b", "hada_w1_b"),
        (".hada_w2_a", "hada_w2_a"), (".hada_w2_b", "hada_w2_b"),
        (".hada_t1", "hada_t1"), (".hada_t2", "hada_t2"),
        (".lokr_w1", "lokr_w1"), (".lokr_w1_a", "lokr_w1_a"), (".lokr_w1_b", "lokr_w1_b"),
        (".lokr_w2", "lokr_w2"), (".lokr_w2_a", "lokr_w2_a"), (".lokr_w2_b", "lokr_w2_b"),
        (".lokr_t2", "lokr_t2"),
        (".diff", "diff"), (".diff_b", "diff_b"),
        (".dora_scale", "dora_scale"), (".w_norm", "unsupported"), (".b_norm", "unsupported"),
        (".oft_blocks", "unsupported"), (".oft_diag", "unsupported"), (".a1.weight", "unsupported"),
    ],
    key=lambda s: -len(s[0]),
)


def _split_key(key: str) -> tuple[str, str] | None:
    for suffix, slot in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], slot
    return None


def _normalize_module(name: str) -> str:
    """Undo wrapper prefixes and the old diffusers attention-processor naming."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    name = name.replace(".processor.to_out", ".to_out.0").replace(".processor.", ".")
    return name


def _build_adapter(module: str, slots: dict[str, Tensor]) -> tuple[Adapter | None, Adapter | None]:
    """(weight adapter, bias adapter) for one module's tensors."""
    if "dora_scale" in slots:
        raise NotImplementedError(f"LoRA module {module}: DoRA (dora_scale) is not supported yet")
    if "unsupported" in slots:
        raise NotImplementedError(f"LoRA module {module}: this adapter type (OFT/GLoRA/norm) is not supported yet")
    alpha = float(slots["alpha"].float().item()) if "alpha" in slots else None
    bias = DiffAdapter(slots["diff_b"]) if "diff_b" in slots else None
    if "up" in slots and "down" in slots:
        return LoraAdapter(slots["up"], slots["down"], slots.get("mid"), alpha), bias
    if all(f"hada_{w}" in slots for w in ("w1_a", "w1_b", "w2_a", "w2_b")):
        return LohaAdapter(
            slots["hada_w1_a"], slots["hada_w1_b"], slots["hada_w2_a"], slots["hada_w2_b"],
            slots.get("hada_t1"), slots.get("hada_t2"), alpha,
        ), bias
    lokr = {k[5:]: v for k, v in slots.items() if k.startswith("lokr_")}
    if lokr:
        has1 = "w1" in lokr or ("w1_a" in lokr and "w1_b" in lokr)
        has2 = "w2" in lokr or ("w2_a" in lokr and "w2_b" in lokr)
        if not (has1 and has2):
            raise ValueError(f"LoRA module {module}: incomplete LoKr tensors {sorted(lokr)}")
        return LokrAdapter(
            lokr.get("w1"), lokr.get("w1_a"), lokr.get("w1_b"),
            lokr.get("w2"), lokr.get("w2_a"), lokr.get("w2_b"), lokr.get("t2"), alpha,
        ), bias
    if "diff" in slots:
        return DiffAdapter(slots["diff"]), bias
    if bias is not None:
        return None, bias
    raise ValueError(f"LoRA module {module}: incomplete tensors {sorted(slots)} (no up/down pair)")


# --------------------------------------------------------------------------------------------
# candidate names for model weights


def _shapes(keys: Mapping | Iterable[str] | None) -> dict[str, tuple[int, ...] | None]:
    """Accept a state dict, a key -> shape mapping, or plain keys."""
    if keys is None:
        return {}
    if isinstance(keys, Mapping):
        out = {}
        for k, v in keys.items():
            shape = getattr(v, "shape", v)
            out[k] = tuple(shape) if shape is not None else None
        return out
    return {k: None for k in keys}


def _ldm_unet_name(key: str) -> str:
    i = key.find("diffusion_model.")
    return key[i + len("diffusion_model."):] if i >= 0 else key


def _clip_name(key: str) -> str:
    i = key.find("text_model.")
    if i >= 0:
        return key[i:]
    return key[len("transformer."):] if key.startswith("transformer.") else key


def _unet_candidates(weight_keys: Iterable[str]) -> dict[str, str]:
    """LoRA module name -> model module key (without .weight), every scheme."""
    modules = {k[: -len(".weight")]: k for k in weight_keys if k.endswith(".weight")}
    ldm = {_ldm_unet_name(m): m for m in modules}
    to_diff = unet_diffusers_module_map(ldm)
    out: dict[str, str] = {}
    for name, module in ldm.items():
        out["lora_unet_" + name.replace(".", "_")] = module
        out["diffusion_model." + name] = module
        d = to_diff.get(name)
        if d is not None:
            us = d.replace(".", "_")
            out["lora_unet_" + us] = module
            out["lycoris_" + us] = module
            out["unet." + d] = module
            out[d] = module
    return out


_KOHYA_TE = {"clip_l": ("lora_te_", "lora_te1_"), "clip_h": ("lora_te_",), "clip_g": ("lora_te2_",)}
_DIFFUSERS_TE = {"clip_l": "text_encoder.", "clip_h": "text_encoder.", "clip_g": "text_encoder_2."}


def _clip_candidates(target: str, weight_keys: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in weight_keys:
        if not k.endswith(".weight"):
            continue
        module = k[: -len(".weight")]
        name = _clip_name(module)
        for p in _KOHYA_TE[target]:
            out[p + name.replace(".", "_")] = module
        out[_DIFFUSERS_TE[target] + name] = module
        out[f"text_encoders.{target}.transformer.{name}"] = module
        out[f"text_encoders.{target}.{name}"] = module
    return out


_TE_MARKERS = ("lora_te", "text_encoder", "text_encoders.")


def _is_text_encoder_name(module: str) -> bool:
    return module.startswith(_TE_MARKERS)


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
    parts = []
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
) -> LoraFile:
    """Read a LoRA file (or state dict) and map it onto a model's weights.

    unet_keys: the UNet's weight keys (LDM names, any prefix ending in ``diffusion_model.``
               allowed), as keys or as a key -> tensor/shape mapping (shapes enable the
               wrong-architecture check here rather than at merge time); None = no UNet.
    clip_keys: {"clip_l"|"clip_g"|"clip_h": keys or key -> shape} in HF CLIP layout; None = no
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
        from nodes.models.safetensors_io import WeightSource, read_tensors

        path = os.fspath(source)
        sd = read_tensors(path)
        name = name or os.path.basename(path)
        identity = identity or repr(WeightSource.from_file(path).file_identity)

    # group by module
    grouped: dict[str, dict[str, Tensor]] = {}
    stray: list[str] = []
    for key, t in sd.items():
        split = _split_key(key)
        if split is None:
            stray.append(key)
            continue
        module, slot = split
        grouped.setdefault(_normalize_module(module), {})[slot] = t

    unet_shapes = _shapes(unet_keys)
    shapes: dict[str, tuple[int, ...] | None] = {}
    lookup: dict[str, tuple[str, str]] = {}  # lora module -> (target, model module)
    if unet_keys is not None:
        for cand, module in _unet_candidates(unet_shapes).items():
            lookup[cand] = ("unet", module)
        shapes.update(unet_shapes)
    for target, keys in (clip_keys or {}).items():
        if target not in TARGETS[1:]:
            raise ValueError(f"clip_keys target must be one of {TARGETS[1:]}, got {target!r}")
        ks = _shapes(keys)
        for cand, module in _clip_candidates(target, ks).items():
            lookup.setdefault(cand, (target, module))
        shapes.update(ks)

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
            if _is_text_encoder_name(module) and not clip_keys:
                skipped.append(module)
            elif unet_keys is None and not _is_text_encoder_name(module):
                skipped.append(module)
            else:
                unmatched.append(module)
            continue
        target, model_module = hit
        per = adapters.setdefault(target, {})
        for suffix, ad in ((".weight", w_ad), (".bias", b_ad)):
            if ad is None:
                continue
            key = model_module + suffix
            shape = shapes.get(key)
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
    return len(shape) > 0 and rows == shape[0] and rows * cols == math.prod(shape)


def _describe_shape(ad: Adapter) -> str:
    if isinstance(ad, DiffAdapter):
        return str(list(ad.diff.shape))
    rows, cols = ad.flat_shape()
    return f"[{rows}, {cols}]"


# --------------------------------------------------------------------------------------------
# merging


def apply_patches(
    state_dict: Mapping[str, Tensor], patches: Iterable[LoraPatch], *, target: str | None = None
) -> dict[str, Tensor]:
    """A new state dict with every patch merged, in order (the input is not modified).

    Keys are those the LoRAs were mapped onto by ``load_lora``. ``target`` restricts the merge to
    patches of one part (e.g. "clip_g" when each encoder is materialized separately); None applies
    every patch whose keys are present. For each patched key: W32 = W.float(); for each patch,
    W32 += (strength · scale) · Δ (Δ from the adapter's formula, scale alpha/rank); then the
    result is cast back to W's dtype once. A patched key missing from ``state_dict`` or with the
    wrong shape raises ValueError naming the LoRA.
    """
    work: dict[str, list[tuple[float, Adapter, LoraPatch]]] = {}
    for p in patches:
        if target is not None and p.target != target:
            continue
        if p.strength == 0.0:
            continue
        for key, ad in p.lora.adapters.get(p.target, {}).items():
            if key not in state_dict:
                raise ValueError(
                    f"LoRA {p.lora.name!r} ({p.target}) patches {key!r}, which this model does not have "
                    f"(was it loaded against another model's keys?)"
                )
            work.setdefault(key, []).append((p.strength, ad, p))
    out = dict(state_dict)
    for key, items in work.items():
        w = state_dict[key]
        w32 = w.to(torch.float32, copy=True)
        for strength, ad, p in items:
            if not _fits(ad, tuple(w.shape)):
                raise ValueError(
                    f"LoRA {p.lora.name!r}: {key} has shape {list(w.shape)}, the LoRA gives {_describe_shape(ad)}"
                )
            w32 += _scaled_delta(ad, w.shape, strength)
        out[key] = w32.to(w.dtype)
    return out


def _scaled_delta(ad: Adapter, shape: torch.Size, strength: float) -> Tensor:
    """(strength · scale) · raw Δ: one scalar multiply, the order ComfyUI uses."""
    return (strength * ad.scale) * ad.raw(shape)


def load_lora_patches(path: str | os.PathLike, model, clip, strength_model: float,
                      strength_clip: float, warn=None):
    """LoraLoader: new (MODEL, CLIP) handles with this file's patches appended (nothing mutated).

    `clip` may be None (LoraLoaderModelOnly). Unmatched keys warn once through `warn` (the node's
    ctx.warn) as well as the Python warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoraKeyWarning)
        lora = load_lora(path, model.weight_shapes(),
                         clip.weight_shapes() if clip is not None and strength_clip else None)
    for w in caught:
        if warn is not None:
            warn(str(w.message))
        else:
            warnings.warn(w.message, stacklevel=2)
    unet_patches, clip_patches = lora.patches(strength_model, strength_clip if clip is not None else 0.0)
    new_model = model.with_patches(unet_patches) if unet_patches else model
    new_clip = clip.with_patches(clip_patches) if clip is not None and clip_patches else clip
    return new_model, new_clip
