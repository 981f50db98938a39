"""Context windows: evaluate the model over overlapping index windows along one latent axis and
fuse the window outputs with weights (ComfyUI's ``ContextWindowsManual``; AnimateDiff-style
batches of frames on SD latents, where the axis is the batch, dim 0).

Facts from ComfyUI: the node ``comfy_extras/nodes_context_windows.py`` (comfyanonymous/ComfyUI
065c1df) and its machinery ``comfy/context_windows.py``. The stored comfyanonymous copy
(0258521) predates two inputs the node passes (``latent_retain_index_list``,
``causal_window_fix``); this follows the copy that has them, drozbay/ComfyUI 03e034e (the
handler signature the node calls). The schedules come from animatediff-cli's context.py via
ComfyUI; FreeNoise is Qiu et al. 2023, "FreeNoise: Tuning-Free Longer Video Diffusion via
Noise Rescheduling".

How it runs here: a MODEL handle carries a ``ContextWindows`` sampler patch (stage
"context_windows", settings only). ``ksampler.sample_custom`` calls ``attach`` after building the
guidance denoiser; it gives the ``CondDenoiser`` (and a DualModelGuider's negative denoiser) a
``WindowRun`` holding the run's sigmas. ``CondDenoiser.calc_cond_batch`` hands the evaluation to
``WindowRun.evaluate`` when the latent is longer than ``context_length`` along ``dim`` (ComfyUI's
``calc_cond_batch`` → ``IndexListContextHandler.execute``). Per window it slices the latent,
σ and the per-frame parts of every cond (``_slice_entry``), evaluates the window with the plain
``calc_cond_batch`` and adds the window's x0 back with the fuse weights; the sum is divided by
the summed weights (``relative`` keeps a running weighted mean instead).

Per window, as ComfyUI's ``get_resized_cond`` for an SD model (dim 0): the cond's per-image
text (Stable Zero123), ADM vector, mask and inpaint / instruct-pix2pix / x4 concat are sliced
when their batch equals the latent's (``cond_retain_index_list`` applies to the text and the
concat, ComfyUI's model_conds; not to the mask). A ControlNet / T2I-Adapter hint whose batch
equals the latent's is sliced too, so each window sees its own frames (a deliberate difference:
ComfyUI core hands every window the hint's first frames, ``broadcast_image_to``; a single hint
image behaves the same in both). Windows along H or W (dims 2, 3) slice the masks and concats
spatially; area conds, ControlNets and GLIGEN boxes there are "not supported yet". Dim 1 (the
channels) cannot be windowed (the UNet needs every channel); dims past the latent's are refused.
σ is sliced only for dim 0 (it has one entry per batch item).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from mixgraph.nodes.sampling.cfg_patches import last_patch

__all__ = ["ContextWindows", "SCHEDULES", "FUSE_METHODS", "context_windows_of", "attach",
           "get_windows", "fuse_weights", "relative_bias", "ordered_halving", "apply_freenoise",
           "parse_index_list", "WindowRun"]

SCHEDULES = ("standard_static", "standard_uniform", "looped_uniform", "batched")
FUSE_METHODS = ("pyramid", "relative", "flat", "overlap-linear")
NODE = "ContextWindowsManual"


@dataclass(frozen=True)
class ContextWindows:
    """Settings of ContextWindowsManual (a sampler patch; no state)."""

    context_length: int = 16
    context_overlap: int = 4
    context_schedule: str = "standard_static"
    context_stride: int = 1
    closed_loop: bool = False
    fuse_method: str = "pyramid"
    dim: int = 0
    freenoise: bool = False
    cond_retain_index_list: tuple[int, ...] = ()
    split_conds_to_windows: bool = False
    latent_retain_index_list: tuple[int, ...] = ()
    causal_window_fix: bool = True
    stage: str = "context_windows"

    def __post_init__(self):
        if self.context_schedule not in SCHEDULES:
            raise ValueError(f"{NODE}: context_schedule {self.context_schedule!r} is not one of {SCHEDULES}")
        if self.fuse_method not in FUSE_METHODS:
            raise ValueError(f"{NODE}: fuse_method {self.fuse_method!r} is not one of {FUSE_METHODS}")
        if self.context_length < 1 or self.context_overlap < 0 or self.context_stride < 1:
            raise ValueError(f"{NODE}: context_length and context_stride must be ≥ 1, context_overlap ≥ 0")


def context_windows_of(patches) -> ContextWindows | None:
    """The handle's context-window settings (the last ContextWindowsManual wins), or None."""
    return last_patch(patches, "context_windows")


def parse_index_list(text: str, name: str) -> tuple[int, ...]:
    """'0, 2' → (0, 2) (ComfyUI splits on commas and int()s each part); '' → ()."""
    if not text or not text.strip():
        return ()
    try:
        return tuple(int(part.strip()) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{NODE}: input '{name}' must be a comma-separated list of integers "
                         f"such as '0' or '0, 1'; got {text!r}") from None


# ------------------------------------------------------------------------------------ schedules


def ordered_halving(val: int) -> float:
    """The 64-bit binary reversal of ``val`` over 2⁶⁴: 0, 1/2, 1/4, 3/4, 1/8, ... (a fraction with
    a power-of-two denominator; shifts the uniform schedules' windows from step to step)."""
    return int(f"{val:064b}"[::-1], 2) / (1 << 64)


def _uniform(n: int, cw: ContextWindows, step: int, closed_loop: bool) -> list[list[int]]:
    """animatediff-cli's uniform windows: per stride level 2^k, windows of ``length`` frames
    spaced 2^k apart, starting at an offset that moves with the step, wrapping modulo n."""
    stride = min(cw.context_stride, int(math.ceil(math.log2(n / cw.context_length))) + 1)
    windows = []
    for k in range(stride):
        step_k = 1 << k
        pad = int(round(n * ordered_halving(step)))
        stop = n + pad + (0 if closed_loop else -cw.context_overlap)
        for j in range(int(ordered_halving(step) * step_k) + pad, stop,
                       cw.context_length * step_k - cw.context_overlap):
            windows.append([e % n for e in range(j, j + cw.context_length * step_k, step_k)])
    return windows


def _rolls_over(window: list[int]) -> int:
    """Position where the window's indices wrap back (decrease), or -1."""
    for i in range(1, len(window)):
        if window[i] < window[i - 1]:
            return i
    return -1


def _shift_to_end(window: list[int], n: int) -> list[int]:
    """The window's pattern re-based to start at 0, then slid so it ends at frame n - 1."""
    rel = [(v - window[0] + n) % n for v in window]
    return [v + n - rel[-1] - 1 for v in rel]


def _uniform_standard(n: int, cw: ContextWindows, step: int) -> list[list[int]]:
    """Uniform windows without wrapping: a wrapping window is slid to the end (and a plain window
    starting at its wrap value inserted after it when the next window lacks that value); repeats
    are dropped."""
    windows = _uniform(n, cw, step, closed_loop=False)
    drop = []
    i = 0
    while i < len(windows):
        roll = _rolls_over(windows[i])
        if roll >= 0:
            roll_val = windows[i][roll]
            windows[i] = _shift_to_end(windows[i], n)
            if roll_val not in windows[(i + 1) % len(windows)]:
                windows.insert(i + 1, list(range(roll_val, roll_val + cw.context_length)))
        if any(windows[i] == windows[j] for j in range(i)):
            drop.append(i)
        i += 1
    return [w for k, w in enumerate(windows) if k not in set(drop)]


def _static_standard(n: int, cw: ContextWindows) -> list[list[int]]:
    """Windows of ``length`` every ``length - overlap`` frames; the last one moved back to end
    at frame n - 1."""
    delta = cw.context_length - cw.context_overlap
    if delta <= 0:
        raise ValueError(f"{NODE}: context_overlap ({cw.context_overlap}) must be smaller than "
                         f"context_length ({cw.context_length}) for the standard_static schedule")
    windows = []
    for start in range(0, n, delta):
        if start + cw.context_length >= n:
            start = n - cw.context_length
            windows.append(list(range(start, start + cw.context_length)))
            break
        windows.append(list(range(start, start + cw.context_length)))
    return windows


def get_windows(n: int, cw: ContextWindows, step: int = 0) -> list[list[int]]:
    """The index windows over ``n`` frames at sampling step ``step`` (ComfyUI's schedule funcs)."""
    s = cw.context_schedule
    if s == "looped_uniform":
        if n < cw.context_length:
            return [list(range(n))]
        if cw.context_length * 1 - cw.context_overlap <= 0:
            raise ValueError(f"{NODE}: context_overlap must be smaller than context_length")
        return _uniform(n, cw, step, cw.closed_loop)
    if n <= cw.context_length:
        return [list(range(n))]
    if s == "standard_uniform":
        if cw.context_length - cw.context_overlap <= 0:
            raise ValueError(f"{NODE}: context_overlap must be smaller than context_length")
        return _uniform_standard(n, cw, step)
    if s == "standard_static":
        return _static_standard(n, cw)
    return [list(range(a, min(a + cw.context_length, n))) for a in range(0, n, cw.context_length)]


# --------------------------------------------------------------------------------------- fusing


def fuse_weights(method: str, length: int, full_length: int, idxs: Sequence[int],
                 overlap: int) -> torch.Tensor:
    """[length] weights of one window's outputs (flat, pyramid, overlap-linear; ``relative``
    uses ``relative_bias`` instead). Pyramid: 1..L/2, L/2..1 (odd L: 1..(L+1)/2..1).
    Overlap-linear: 1 inside; the first ``overlap`` positions ramp up from 1e-37 to 1 unless the
    window starts at frame 0, the last ones ramp down unless it ends at the last frame (with
    overlap 0 there is no ramp; ComfyUI fails there)."""
    if method == "flat":
        return torch.ones(length)
    if method in ("pyramid", "relative"):
        half = (length + 1) // 2
        if length % 2 == 0:
            seq = list(range(1, half + 1)) + list(range(half, 0, -1))
        else:
            seq = list(range(1, half)) + [half] + list(range(half - 1, 0, -1))
        return torch.tensor(seq, dtype=torch.float32)
    if method == "overlap-linear":
        w = torch.ones(length)
        if overlap > 0:
            if min(idxs) > 0:
                w[:overlap] = torch.linspace(1e-37, 1, overlap)[:length]
            if max(idxs) < full_length - 1:
                w[-overlap:] = torch.linspace(1, 1e-37, overlap)[-length:]
        return w
    raise ValueError(f"{NODE}: unknown fuse_method {method!r}")


def relative_bias(idx: int, window: Sequence[int]) -> float:
    """``relative``: 1 − |idx − centre| / half-width of the window (ends from its first and last
    entries, +0.01 in the width), at least 0.01."""
    centre = (window[0] + window[-1]) / 2
    return max(1e-2, 1 - abs(idx - centre) / ((window[-1] - window[0] + 1e-2) / 2))


def apply_freenoise(noise: torch.Tensor, dim: int, length: int, overlap: int, seed: int) -> torch.Tensor:
    """FreeNoise: each block of ``length - overlap`` frames after the first window takes a
    seeded permutation of the block before it (in place; ComfyUI's order of draws: one CPU
    generator seeded with ``seed``, one randperm per block)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    n = noise.shape[dim]
    delta = length - overlap
    if delta <= 0:
        return noise
    for start in range(0, n - length, delta):
        place = start + length
        count = min(delta, n - place)
        if count <= 0:
            break
        src = (torch.randperm(count, generator=g) + start).to(noise.device)
        noise.narrow(dim, place, count).copy_(noise.index_select(dim, src))
    return noise


# ------------------------------------------------------------------------------------ evaluation


def _take(t: torch.Tensor, dim: int, idx: list[int], retain: Sequence[int] = (), name: str = "") -> torch.Tensor:
    out = t.index_select(dim, torch.tensor(idx, device=t.device))
    if retain:
        n = out.shape[dim]
        for r in retain:
            if not -n <= r < n or not -t.shape[dim] <= r < t.shape[dim]:
                raise ValueError(f"{NODE}: index {r} of '{name}' is outside a window of {n} "
                                 f"(latent length {t.shape[dim]} along dim {dim})")
            out.select(dim, r).copy_(t.select(dim, r))
    return out


def _slice_chain(chain, idx: list[int], full: int, memo: dict):
    """A ControlNet / T2I chain whose hints with ``full`` images are cut to the window's."""
    if chain is None:
        return None
    if id(chain) in memo:
        return memo[id(chain)]
    if not dataclasses.is_dataclass(chain) or not hasattr(chain, "hint") or not hasattr(chain, "previous"):
        raise NotImplementedError(f"{NODE}: a {type(chain).__name__} control on a cond is not "
                                  f"supported with context windows yet")
    changes = {"previous": _slice_chain(chain.previous, idx, full, memo)}
    if chain.hint.shape[0] == full:
        changes["hint"] = chain.hint.index_select(0, torch.tensor(idx))
    if any(f.name == "cache" for f in dataclasses.fields(chain)):
        changes["cache"] = {}  # features are per hint batch (T2I-Adapter)
    out = dataclasses.replace(chain, **changes)
    memo[id(chain)] = out
    return out


def _slice_entry(e, dim: int, idx: list[int], full: int, cw: ContextWindows, memo: dict):
    """The cond entry (``parameterization._Entry``) for one window along ``dim``."""
    keep = cw.cond_retain_index_list
    if dim == 0:
        changes = {}
        if e.context is not None and e.context.shape[0] == full:
            changes["context"] = _take(e.context, 0, idx, keep, "cond_retain_index_list")
        if any(v.shape[0] == full for v in e.inputs.values()):
            changes["inputs"] = {k: _take(v, 0, idx) if v.shape[0] == full else v for k, v in e.inputs.items()}
        if e.mask is not None and e.mask.shape[0] == full:
            changes["mask"] = _take(e.mask, 0, idx)
        if e.concat is not None and e.concat.shape[0] == full:
            changes["concat"] = _take(e.concat, 0, idx, keep, "cond_retain_index_list")
        if e.cond.control is not None:
            changes["cond"] = dataclasses.replace(e.cond, control=_slice_chain(e.cond.control, idx, full, memo))
        return dataclasses.replace(e, **changes)
    what = "area conds" if e.area is not None else "ControlNets / T2I-Adapters" if e.cond.control is not None \
        else "GLIGEN boxes" if e.gligen is not None else None
    if what is not None:
        raise NotImplementedError(f"{NODE}: {what} with context windows along dim {dim} (a spatial "
                                  f"axis) are not supported yet; use dim 0 (the batch)")
    changes = {}
    if e.mask is not None and e.mask.shape[dim - 1] == full:
        changes["mask"] = _take(e.mask, dim - 1, idx)  # [Bm, H, W]: latent dim d is mask dim d-1
    if e.concat is not None and e.concat.shape[dim] == full:
        changes["concat"] = _take(e.concat, dim, idx, keep, "cond_retain_index_list")
    return dataclasses.replace(e, **changes)


class WindowRun:
    """Per-sampling-run state: the settings, the run's sigmas (for the uniform schedules' step)
    and the windows' sliced cond entries (kept per window, so entry ids stay stable for step
    caches and T2I features are computed once per window)."""

    def __init__(self, cw: ContextWindows, sigmas: torch.Tensor):
        self.cw = cw
        self.sigmas = sigmas.detach().float().cpu()
        self.step = 0
        self._entries: dict = {}

    def applies(self, x: torch.Tensor) -> bool:
        dim = self.cw.dim
        if dim >= x.ndim:
            raise ValueError(f"{NODE}: input 'dim' is {dim}, but the latent has {x.ndim} "
                             f"dimensions {tuple(x.shape)} (an SD latent is [batch, channels, "
                             f"height, width]: dim 0 to {x.ndim - 1})")
        if x.shape[dim] <= self.cw.context_length:
            return False
        if dim == 1:
            raise ValueError(f"{NODE}: input 'dim' is 1, the latent's channel axis ({x.shape[1]} "
                             f"channels): the UNet needs every channel, so it cannot be windowed "
                             f"below {x.shape[1]}; use dim 0 (the batch) or a context_length ≥ {x.shape[1]}")
        return True

    def _set_step(self, sigma: torch.Tensor) -> None:
        s = torch.as_tensor(sigma).reshape(-1)[0].detach().float().cpu()
        hits = torch.nonzero(torch.isclose(self.sigmas, s, rtol=1e-4))
        if hits.numel():  # a sub-step of a multi-stage sampler keeps the last step
            self.step = int(hits[0].item())

    def evaluate(self, den, cond_lists, x: torch.Tensor, sigma: torch.Tensor, unet_patches=()):
        """``den.calc_cond_batch`` over the windows, fused (IndexListContextHandler.execute)."""
        cw, dim = self.cw, self.cw.dim
        self._set_step(sigma)
        full = x.shape[dim]
        windows = get_windows(full, cw, self.step)
        relative = cw.fuse_method == "relative"
        shape = [1] * x.ndim
        shape[dim] = full
        outs = [torch.zeros_like(x) for _ in cond_lists]
        counts = [torch.ones(shape, device=x.device) if relative else torch.zeros(shape, device=x.device)
                  for _ in cond_lists]
        biases = [[0.0] * full for _ in cond_lists]
        sig = torch.as_tensor(sigma)
        for window in windows:
            idx = list(window)
            anchored = cw.causal_window_fix and 0 <= window[0] - 1 < full
            if anchored:
                idx = [window[0] - 1] + idx  # a frame before the window, dropped from its output
            x_w = _take(x, dim, idx, cw.latent_retain_index_list, "latent_retain_index_list")
            sig_w = sig
            if dim == 0 and sig.ndim and sig.shape[0] == full:
                sig_w = sig[idx]
            lists_w = [self._window_list(lst, dim, idx, window, full) for lst in cond_lists]
            outs_w = den._calc_cond_batch(lists_w, x_w, sig_w, unet_patches)
            if anchored:
                outs_w = [o.narrow(dim, 1, o.shape[dim] - 1) for o in outs_w]
            if relative:
                for pos, i in enumerate(window):
                    bias = relative_bias(i, window)
                    for k, o in enumerate(outs_w):
                        total = biases[k][i]
                        at = outs[k].select(dim, i)
                        at.copy_(at * (total / (total + bias)) + o.select(dim, pos) * (bias / (total + bias)))
                        biases[k][i] = total + bias
                continue
            w = fuse_weights(cw.fuse_method, len(window), full, window, cw.context_overlap).to(x.device)
            wshape = [1] * x.ndim
            wshape[dim] = len(window)
            w = w.reshape(wshape)
            where = torch.tensor(window, device=x.device)
            for k, o in enumerate(outs_w):
                outs[k].index_add_(dim, where, o * w)
                counts[k].index_add_(dim, where, w)
        if relative:
            return outs
        return [o / c for o, c in zip(outs, counts)]

    def _window_list(self, entries, dim: int, idx: list[int], window: list[int], full: int):
        entries = list(entries)
        if self.cw.split_conds_to_windows and len(entries) > 1:
            # the window's centre, as a fraction of the frames, picks one cond of the list
            centre = (min(window) + max(window)) / (2 * full)
            entries = [entries[min(max(int(centre * len(entries)), 0), len(entries) - 1)]]
        key = (dim, tuple(idx), tuple(id(e) for e in entries))
        got = self._entries.get(key)
        if got is None:
            memo: dict = {}
            got = self._entries[key] = [_slice_entry(e, dim, idx, full, self.cw, memo) for e in entries]
        return got


def attach(denoiser, patches, sigmas: torch.Tensor) -> WindowRun | None:
    """Give the run's ``CondDenoiser`` (and a DualModelGuider's negative one, which ComfyUI runs
    with the first model's options) a ``WindowRun`` when the handle carries ContextWindows."""
    cw = context_windows_of(patches)
    if cw is None:
        return None
    run = WindowRun(cw, sigmas)
    denoiser.context_run = run
    inner = getattr(denoiser, "_uncond", None)
    if inner is not None:
        inner.context_run = run
    return run


def shuffle_noise(patches, noise: torch.Tensor, seed: int) -> torch.Tensor:
    """FreeNoise on the initial noise when the handle's ContextWindows asks for it (ComfyUI's
    SAMPLER_SAMPLE wrapper, with the sampler's seed)."""
    cw = context_windows_of(patches)
    if cw is None or not cw.freenoise:
        return noise
    if cw.dim >= noise.ndim:
        raise ValueError(f"{NODE}: input 'dim' is {cw.dim}, but the latent has {noise.ndim} dimensions")
    return apply_freenoise(noise.clone(), cw.dim, cw.context_length, cw.context_overlap, seed)
