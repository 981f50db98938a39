"""Forward-time UNet patches: what FreeU and perturbed-attention guidance change inside one UNet
call, given to ``UNetModel.forward(..., patches=...)`` and never stored on the module.

The weight store shares one module between every handle that uses the same weights, so a patch
that lived on the module would leak into other handles; a patch passed per call cannot. A patch
is a frozen dataclass (hashable, compared by value) with one or both of these methods:

* ``output_block(h, skip, index) -> (h, skip)``: called before output block ``index``
  concatenates the main path ``h`` [B, C, H, W] with its skip connection ``skip`` (after any
  ControlNet residual was added), ComfyUI's ``output_block_patch``. A ``skip`` of None returned
  means the patch merged the skip into ``h`` itself and no concatenation follows (SUPIR).
* ``begin(x, timesteps, context, y) -> object | None``: called first in every UNet call; the
  object returned (None: nothing this call) replaces the patch for that call. It may have the
  other hooks plus ``middle_after(h) -> h`` (after the middle block and any ControlNet middle
  residual, ComfyUI's ``middle_block_after_patch``) and ``before_upsample(h) -> h`` (in an
  output block, just before its Upsample; ComfyUI's ``forward_timestep_embed_patch`` on
  Upsample). ``adapters/supir.py``.
* ``attention(q, k, v, heads) -> Tensor`` together with ``attn`` ("attn1" self-attention or
  "attn2" cross-attention) and ``block`` (("input" | "middle" | "output", index), ComfyUI's
  block numbering): replaces softmax(qkᵀ/√d)v inside every transformer block of that UNet block;
  q [B, T, inner], k/v [B, S, inner], result [B, T, inner] (``to_out`` still follows),
  ComfyUI's ``attn1``/``attn2`` replace patches.
* ``input_block(h, index) -> h`` with ``after_skip``: called after input block ``index``, before
  (``after_skip`` False) or after (True) ``h`` is kept as that block's skip connection, ComfyUI's
  ``input_block_patch`` / ``input_block_patch_after_skip``.

* ``middle(x, transformer_index) -> x``: called in every transformer block between self- and
  cross-attention on the tokens x [B, N, C]; ``transformer_index`` numbers the UNet blocks that
  hold a transformer in call order (ComfyUI's ``middle_patch`` and ``transformer_index``; GLIGEN).

* ``wrap_attn1(n, k, v) -> (n, k, v, undo)``: in every transformer block, the normed tokens the
  self-attention projects its queries (n), keys and values from [B, N, C] may be rearranged or
  merged, and ``undo(out)`` restores the attention output's token layout (ComfyUI's
  ``attn1_patch`` + ``attn1_output_patch``; HyperTile, ToMe, hypernetworks); ``wrap_attn2`` the
  same for the cross-attention, whose k and v come from the text context (hypernetworks).
  HyperTile and ToMe also have
  ``for_call(shape, state)``: the runner binds the UNet input's shape [B, C, H, W] and a dict
  that lives for one sampling run.

A patch that depends on the noise level has ``at_sigma(sigma) -> patch``: the runner binds the
evaluated sigma (the batch's first, as ComfyUI's ``transformer_options["sigmas"][0]``) before
the UNet call (``UNetRunner.unet(..., sigma=)``); unbound, it does nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mixgraph.nodes.models.resize import upscale

__all__ = ["FreeU", "DeepShrink", "IdentityAttention", "AttentionRecorder", "attention_with_probs", "fourier_filter",
           "attention_replacements", "block_patches"]


def fourier_filter(x: Tensor, threshold: int, scale: float) -> Tensor:
    """Scale the lowest spatial frequencies (a (2·threshold)² square around DC of the centred
    2-D FFT) by ``scale`` (Si et al. 2023, "FreeU: Free Lunch in Diffusion U-Net", eq. 6-7)."""
    freq = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    h, w = freq.shape[-2:]
    mask = torch.ones(freq.shape, device=x.device)
    cy, cx = h // 2, w // 2
    mask[..., cy - threshold:cy + threshold, cx - threshold:cx + threshold] = scale
    freq = torch.fft.ifftshift(freq * mask, dim=(-2, -1))
    return torch.fft.ifftn(freq, dim=(-2, -1)).real.to(x.dtype)


@dataclass(frozen=True)
class FreeU:
    """FreeU (Si et al. 2023): at the decoder levels with 4× and 2× ``model_channels``, the first
    half of the backbone channels is scaled by b (v2: by 1 + (b − 1)·the min-max normalised
    channel mean) and the skip's low frequencies by s."""

    model_channels: int
    b1: float
    b2: float
    s1: float
    s2: float
    v2: bool = False

    def output_block(self, h: Tensor, skip: Tensor, index: int) -> tuple[Tensor, Tensor]:
        scales = {self.model_channels * 4: (self.b1, self.s1), self.model_channels * 2: (self.b2, self.s2)}
        bs = scales.get(int(h.shape[1]))
        if bs is None:
            return h, skip
        b, s = bs
        half = h.shape[1] // 2
        factor: Tensor | float = b
        if self.v2:
            mean = h.mean(1, keepdim=True)  # [B, 1, H, W]
            flat = mean.flatten(1)
            lo = flat.min(dim=1).values.reshape(-1, 1, 1, 1)
            hi = flat.max(dim=1).values.reshape(-1, 1, 1, 1)
            factor = (b - 1.0) * ((mean - lo) / (hi - lo)) + 1.0
        h = torch.cat([h[:, :half] * factor, h[:, half:]], dim=1)  # [B, C, H, W]
        return h, fourier_filter(skip, threshold=1, scale=s)


@dataclass(frozen=True)
class IdentityAttention:
    """Attention replaced by its values (every query attends to itself only): the perturbed
    self-attention of Ahn et al. 2024, "Self-Rectifying Diffusion Sampling with Perturbed-Attention
    Guidance"."""

    attn: str = "attn1"
    block: tuple[str, int] = ("middle", 0)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, heads: int) -> Tensor:
        return v


def attention_with_probs(q: Tensor, k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Plain multi-head attention in float32, also returning the softmax probabilities.
    q [B, T, inner], k/v [B, S, inner] -> (out [B, T, inner], probs [B·heads, T, S]), the batch
    outermost (rows b·heads .. b·heads + heads − 1 belong to sample b)."""
    b, _, inner = q.shape
    d = inner // heads

    def split(t: Tensor) -> Tensor:  # [B, N, inner] -> [B·heads, N, d]
        return t.float().reshape(b, -1, heads, d).permute(0, 2, 1, 3).reshape(b * heads, -1, d)

    qh, kh, vh = split(q), split(k), split(v)
    probs = (qh @ kh.transpose(1, 2) * d**-0.5).softmax(dim=-1)  # [B·heads, T, S]
    out = (probs @ vh).reshape(b, heads, -1, d).permute(0, 2, 1, 3).reshape(b, -1, inner)
    return out.to(q.dtype), probs


@dataclass(frozen=True)
class AttentionRecorder:
    """Ordinary attention that appends its softmax probabilities [B·heads, T, S] to ``sink``
    (self-attention guidance reads the middle block's map). Made per evaluation, never stored on
    a handle: the sink is excluded from equality and hashing."""

    attn: str
    block: tuple[str, int]
    sink: list = field(default_factory=list, compare=False, hash=False, repr=False)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, heads: int) -> Tensor:
        out, probs = attention_with_probs(q, k, v, heads)
        self.sink.append(probs)
        return out


def attention_replacements(patches, block: tuple[str, int]) -> dict | None:
    """{"attn1"/"attn2": patch.attention} of the patches aimed at ``block``, or None."""
    found = {p.attn: p.attention for p in patches if hasattr(p, "attention") and tuple(p.block) == block}
    return found or None


def _chain_wraps(wraps):
    """Several ``wrap_attn1`` hooks as one: inputs through each in order, and the outputs through
    their undo functions in the same order (ComfyUI runs attn1_patch and attn1_output_patch
    lists in list order)."""
    def wrap(n, k, v):
        undos = []
        for w in wraps:
            n, k, v, undo = w(n, k, v)
            undos.append(undo)

        def undo_all(out):
            for u in undos:
                out = u(out)
            return out

        return n, k, v, undo_all

    return wrap


def block_patches(patches, block: tuple[str, int], transformer_index: int | None) -> dict | None:
    """What the transformer blocks of UNet block ``block`` get: the attention replacements, and
    under "middle" the patches' ``middle`` hooks (in order) bound to ``transformer_index``."""
    found = attention_replacements(patches, block) or {}
    for hook in ("attn1", "attn2"):
        wraps = [getattr(p, f"wrap_{hook}") for p in patches if hasattr(p, f"wrap_{hook}")]
        if wraps:
            found[f"{hook}_wrap"] = _chain_wraps(tuple(wraps))
    middles = [p.middle for p in patches if hasattr(p, "middle")]
    if middles and transformer_index is not None:
        def middle(x, _fns=tuple(middles), _i=transformer_index):
            for fn in _fns:
                x = fn(x, _i)
            return x
        found["middle"] = middle
    return found or None


@dataclass(frozen=True)
class DeepShrink:
    """Kohya's Deep Shrink (ComfyUI's PatchModelAddDownscale): while sigma_end <= σ <= sigma_start,
    the main path after input block ``block_number`` is resized by 1/``downscale_factor``
    (``downscale_method``, no crop), before or after it is kept as the skip; an output block whose
    main path and skip differ in size gets the main path resized to the skip (``upscale_method``)."""

    block_number: int
    downscale_factor: float
    sigma_start: float
    sigma_end: float
    after_skip: bool
    downscale_method: str
    upscale_method: str
    sigma: float | None = None

    def at_sigma(self, sigma: float) -> "DeepShrink":
        return dataclasses.replace(self, sigma=float(sigma))

    def input_block(self, h: Tensor, index: int) -> Tensor:
        if index != self.block_number or self.sigma is None:
            return h
        if not (self.sigma_end <= self.sigma <= self.sigma_start):
            return h
        width = round(int(h.shape[-1]) * (1.0 / self.downscale_factor))
        height = round(int(h.shape[-2]) * (1.0 / self.downscale_factor))
        return upscale(h, width, height, self.downscale_method, "disabled")

    def output_block(self, h: Tensor, skip: Tensor, index: int) -> tuple[Tensor, Tensor]:
        if tuple(h.shape[-2:]) != tuple(skip.shape[-2:]):
            h = upscale(h, int(skip.shape[-1]), int(skip.shape[-2]), self.upscale_method, "disabled")
        return h, skip
