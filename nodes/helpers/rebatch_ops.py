"""Rebatching a list of batches (ComfyUI's ``comfy_extras/nodes_rebatch.py``, its newest V3 form):
consecutive inputs are joined along one dimension into outputs of `batch_size`, optionally with
`overlap` samples shared between consecutive pieces.

The rules, for a queue of inputs:

* An output starts with the first input in the queue and takes the following ones while its
  length is below `batch_size` and the next one is *compatible* (same shape on every other
  dimension); an incompatible input closes it (the output is then shorter).
* Consecutive inputs share `overlap` samples: the last `overlap` of the earlier one and the first
  `overlap` of the later one become one, by `mode`: "truncate start" keeps the earlier one's,
  "truncate end" the later one's, "fade linear" / "fade smooth" blend them with weights
  w = linspace(0, 1, overlap) for the later one (smooth: w·w·(3 − 2w)).
* An output is the first `batch_size` samples of the joined inputs; when they are longer, the
  rest from `batch_size − overlap` goes back to the front of the queue, so consecutive outputs
  also share `overlap` samples.

overlap = 0 is plain concatenation and cutting, as the V1 nodes did, with two differences that
follow the V3 node: an image of another size closes the image batch being filled (the V1
RebatchImages failed there; RebatchLatents already closed it), and a latent's noise mask comes out
at the samples' size [B, 1, H, W] (mixgraph's V1 port brought it to pixel size; the sampler resizes
either).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Callable, Sequence, TypeVar

import torch
import torch.nn.functional as F

from mixgraph.nodes.payloads.latent import Latent

MERGE_MODES = ("truncate start", "truncate end", "fade smooth", "fade linear")
DIMENSIONS = ("b", "t (video only)", "t (audio only)")

T = TypeVar("T")


def _cut(x: torch.Tensor, dim: int, start: int, end: int) -> torch.Tensor:
    return x.narrow(dim, start, end - start)


def _fade_weights(overlap: int, mode: str, ndim: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """The later piece's weight for each overlapped sample, shaped to broadcast along `dim`."""
    w = torch.linspace(0, 1, overlap, dtype=like.dtype, device=like.device)
    if mode == "fade smooth":
        w = w * w * (3 - 2 * w)   # smoothstep
    return w.reshape([1] * dim + [overlap] + [1] * (ndim - dim - 1))


def _check_mode(mode: str) -> None:
    if mode not in MERGE_MODES:
        raise ValueError(f"input 'merge_overlap_mode': {mode!r} is not one of {', '.join(MERGE_MODES)}")


def merge_tensors(tensors: Sequence[torch.Tensor], dim: int, overlap: int, mode: str) -> torch.Tensor:
    """Join `tensors` along `dim`, each consecutive pair sharing `overlap` samples merged by `mode`.
    Every tensor holds at least `overlap` samples along `dim` (the caller checks)."""
    _check_mode(mode)
    if len(tensors) == 1:
        return tensors[0]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    done: list[torch.Tensor] = []        # joined so far, except the open piece
    open_ = tensors[0].to(dtype)         # the last piece: its tail may still be merged
    weights = None
    if overlap and mode.startswith("fade"):
        weights = _fade_weights(overlap, mode, open_.ndim, dim, open_)
    for t in tensors[1:]:
        t = t.to(dtype)
        n = open_.shape[dim]
        done.append(_cut(open_, dim, 0, n - overlap))
        tail, head = _cut(open_, dim, n - overlap, n), _cut(t, dim, 0, overlap)
        if mode == "truncate start":
            shared = tail
        elif mode == "truncate end":
            shared = head
        else:
            shared = tail * (1 - weights) + head * weights
        open_ = torch.cat((shared, _cut(t, dim, overlap, t.shape[dim])), dim)
    return torch.cat((*done, open_), dim)


def rebatch(items: Sequence[T], length: Callable[[T], torch.Tensor], merge: Callable[[list[T]], T],
            cut: Callable[[T, int, int], T], dim: int, batch_size: int, overlap: int) -> list[T]:
    """The queue walk of the module docstring, over any item: `length(item)` gives the tensor
    whose shape decides (its size along `dim` and compatibility), `merge(items)` joins a group,
    `cut(item, start, end)` slices one along `dim`."""
    if overlap >= batch_size:
        raise ValueError(f"input 'overlap': {overlap} must be smaller than batch_size ({batch_size})")
    queue = deque(items)
    out: list[T] = []
    while queue:
        group = [queue.popleft()]
        first = length(group[0])
        total = first.shape[dim]
        while total < batch_size and queue and _compatible(first, length(queue[0]), dim):
            n = length(queue[0]).shape[dim]
            if overlap > min(total, n):
                raise ValueError(f"input 'overlap': {overlap} is more than an input batch holds "
                                 f"({min(total, n)} along the rebatched dimension)")
            group.append(queue.popleft())
            total += n - overlap
        joined = merge(group) if len(group) > 1 else group[0]
        out.append(cut(joined, 0, min(batch_size, total)))
        if total > batch_size:
            queue.appendleft(cut(joined, batch_size - overlap, total))
    return out


def _compatible(a: torch.Tensor, b: torch.Tensor, dim: int) -> bool:
    return a.ndim == b.ndim and all(a.shape[i] == b.shape[i] for i in range(a.ndim) if i != dim)


def rebatch_images(images: Sequence[torch.Tensor], batch_size: int, overlap: int = 0,
                   mode: str = "truncate start") -> list[torch.Tensor]:
    """IMAGE batches [B, H, W, C] regrouped along B (images of another size start a new batch)."""
    _check_mode(mode)
    return rebatch(list(images), lambda x: x, lambda xs: merge_tensors(xs, 0, overlap, mode),
                   lambda x, s, e: _cut(x, 0, s, e), 0, batch_size, overlap)


# ---- latents: samples, noise mask and batch index travel together


def dimension_index(dimension: str, latents: Sequence[Latent]) -> int:
    """The samples dimension a `dimension` choice rebatches: b → 0, video time → 2 (of
    [B, C, T, H, W]), audio time → the last one (the width of a 4-D image latent, as in ComfyUI)."""
    if dimension not in DIMENSIONS:
        raise ValueError(f"input 'dimension': {dimension!r} is not one of {', '.join(DIMENSIONS)}")
    if dimension == "t (video only)" and any(lat.samples.ndim == 4 for lat in latents):
        raise ValueError("input 'dimension': 't (video only)' rebatches the time axis of video latents "
                         "[B, C, T, H, W]; these are image latents [B, C, H, W] (use 'b')")
    return {"b": 0, "t (video only)": 2}.get(dimension, latents[0].samples.ndim - 1)


def _mask_at_samples(lat: Latent) -> torch.Tensor | None:
    """The noise mask as [B, 1, H, W] at the samples' size (bilinear, batch repeated or cut: the
    sampler's own reshape, without its channel repeat), or None."""
    if lat.noise_mask is None:
        return None
    s = lat.samples
    if s.ndim != 4:
        raise ValueError(f"input 'latents': a noise mask on a {s.ndim}-D latent is not supported "
                         f"(image latents are [B, C, H, W])")
    m = lat.noise_mask.to(torch.float32)
    m = m.reshape(-1, 1, m.shape[-2], m.shape[-1])                       # [Bm, 1, h, w]
    m = F.interpolate(m, size=tuple(s.shape[-2:]), mode="bilinear")     # [Bm, 1, H, W]
    if m.shape[0] < s.shape[0]:
        m = m.repeat(-(-s.shape[0] // m.shape[0]), 1, 1, 1)
    return m[: s.shape[0]]


def _merge_latents(lats: list[Latent], dim: int, overlap: int, mode: str) -> Latent:
    samples = merge_tensors([lat.samples for lat in lats], dim, overlap, mode)
    mask = None
    present = [lat.noise_mask for lat in lats if lat.noise_mask is not None]
    if present:
        like = present[0]
        masks = []
        for lat in lats:   # an unmasked input is fully resampled: ones
            if lat.noise_mask is not None:
                masks.append(lat.noise_mask)
            else:
                shape = list(like.shape)
                shape[dim] = lat.samples.shape[dim]
                masks.append(torch.ones(shape, dtype=like.dtype, device=like.device))
        mask = merge_tensors(masks, dim, overlap, mode)
    index = lats[0].batch_index
    if dim == 0:
        joined = list(lats[0].batch_index)
        for lat in lats[1:]:
            if overlap and mode == "truncate end":
                joined[-overlap:] = lat.batch_index[:overlap]
            joined += lat.batch_index[overlap:]
        index = tuple(joined)
    return Latent(samples, mask, index)


def _cut_latent(lat: Latent, dim: int, start: int, end: int) -> Latent:
    mask = None if lat.noise_mask is None else _cut(lat.noise_mask, dim, start, end)
    index = lat.batch_index[start:end] if dim == 0 else lat.batch_index
    return Latent(_cut(lat.samples, dim, start, end), mask, index)


def rebatch_latents(latents: Sequence[Latent], batch_size: int, dimension: str = "b", overlap: int = 0,
                    mode: str = "truncate start") -> list[Latent]:
    """LATENT batches regrouped along `dimension` (module docstring). Noise masks are brought to
    the samples' shape ([B, 1, H, W]); where a group mixes masked and unmasked inputs the unmasked
    get ones, and an output whose mask is all ones has none. Along b each sample keeps its batch
    index (its own, else its position in the whole input); overlapped samples keep the earlier
    input's index, or the later one's with "truncate end"."""
    _check_mode(mode)
    if not latents:
        return []
    dim = dimension_index(dimension, latents)
    prepared, seen = [], 0
    for lat in latents:
        n = lat.samples.shape[0]
        index = lat.batch_index
        if dim == 0 and index is None:
            index = tuple(range(seen, seen + n))
        seen += n
        prepared.append(Latent(lat.samples, _mask_at_samples(lat), index))
    out = rebatch(prepared, lambda lat: lat.samples,
                  lambda lats: _merge_latents(lats, dim, overlap, mode),
                  lambda lat, s, e: _cut_latent(lat, dim, s, e), dim, batch_size, overlap)
    return [dataclasses.replace(lat, noise_mask=None)
            if lat.noise_mask is not None and bool(torch.all(lat.noise_mask == 1)) else lat
            for lat in out]
