"""Self-attention token patches (``unet_patches.py``'s ``wrap_attn1`` hook): HyperTile and
Token Merging, as ComfyUI's HyperTile and TomePatchModel apply them.

* HyperTile (tfernd/HyperTile): at the UNet levels whose width is model_channels·2^d (d ≤
  max_depth), the query tokens are cut into nh × nw tiles, each attended separately. The grid
  (h, w) of the N tokens comes from the UNet input's aspect ratio W/H (``find_hw_candidates``,
  h = round(√(N·W/H)): ComfyUI's own reading), nh and nw are picked among the largest divisors of
  h and w giving tiles of at least tile_size/8 (× 2^(level) with scale_depth) latent pixels, by
  ``random.Random(counter).randint`` with a counter that starts at 1 for each sampling run and
  advances by one per pick (ComfyUI starts it when the node runs). Keys and values are not
  tiled: ComfyUI's attention reshapes them to the tiled batch, so query tile j attends to the
  j-th run of N/(nh·nw) consecutive tokens; this module does the same.
* ToMe (Bolya & Hoffman 2023, "Token Merging for Fast Stable Diffusion", arXiv:2303.17604), at
  full-resolution blocks only: query tokens are split into one destination per 2×2 cell (chosen
  with ``torch.randint`` from the global generator, as ComfyUI; ``noise.prepare_noise`` seeded it
  with the sampling seed) and sources; the ratio·N sources most similar (cosine) to a
  destination are averaged into it; the attention output is unmerged by copying each merged
  destination back. Keys and values keep every token.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["HyperTile", "TokenMerge", "find_hw_candidates", "random_divisor", "bipartite_soft_matching"]


def random_divisor(value: int, min_value: int, max_options: int, counter: int) -> int:
    """value // d for one of the ``max_options`` smallest divisors d ≥ min(min_value, value),
    chosen by ``random.Random(counter)``."""
    min_value = min(min_value, value)
    divisors = [i for i in range(min_value, value + 1) if value % i == 0]
    options = [value // i for i in divisors[:max_options]]
    return options[random.Random(counter).randint(0, len(options) - 1)]


@lru_cache(maxsize=256)
def find_hw_candidates(hw: int, aspect_ratio: float) -> tuple[int, int]:
    """(h, w) with h·w = hw near the aspect ratio; exact factor pairs first, else the divisor pair
    whose w/h is closest to it."""
    h, w = round(math.sqrt(hw * aspect_ratio)), round(math.sqrt(hw / aspect_ratio))
    if h * w == hw:
        return h, w
    if (hw / h).is_integer():
        return h, int(hw / h)
    if (hw / w).is_integer():
        return int(hw / w), w
    pairs = [(i, hw // i) for i in range(2, hw + 1) if hw % i == 0]
    ratios = [b / a for a, b in pairs]
    best = min(ratios, key=lambda r: abs(r - aspect_ratio))
    return pairs[ratios.index(best)]


@dataclass(frozen=True)
class HyperTile:
    model_channels: int
    tile_size: int = 256
    swap_size: int = 2
    max_depth: int = 0
    scale_depth: bool = False
    shape: tuple | None = None
    state: dict | None = field(default=None, compare=False, hash=False, repr=False)

    def for_call(self, shape: tuple, state: dict) -> "HyperTile":
        return dataclasses.replace(self, shape=tuple(shape), state=state)

    def _next(self) -> int:
        key = ("hypertile", self.model_channels, self.tile_size, self.swap_size, self.max_depth, self.scale_depth)
        n = self.state.get(key, 1)
        self.state[key] = n + 1
        return n

    def wrap_attn1(self, n: Tensor, k: Tensor, v: Tensor):
        width = n.shape[-1]
        widths = {self.model_channels * 2 ** d for d in range(self.max_depth + 1)}
        if self.shape is None or width not in widths:
            return n, k, v, _same
        b, hw = n.shape[0], n.shape[1]
        h, w = find_hw_candidates(hw, self.shape[-1] / self.shape[-2])
        factor = 2 ** (width // self.model_channels - 1) if self.scale_depth else 1
        tile = max(32, self.tile_size) // 8 * factor
        nh = random_divisor(h, tile, self.swap_size, self._next())
        nw = random_divisor(w, tile, self.swap_size, self._next())
        if nh * nw <= 1:
            return n, k, v, _same
        th, tw = h // nh, w // nw
        tiles = b * nh * nw
        # [B, (nh th nw tw), C] -> [B, nh, th, nw, tw, C] -> [B·nh·nw, th·tw, C]
        q = n.reshape(b, nh, th, nw, tw, width).permute(0, 1, 3, 2, 4, 5).reshape(tiles, th * tw, width)
        k = k.reshape(tiles, -1, k.shape[-1])  # consecutive runs of tokens, as ComfyUI's view
        v = v.reshape(tiles, -1, v.shape[-1])

        def undo(out: Tensor) -> Tensor:
            c = out.shape[-1]  # [B·nh·nw, th·tw, C] -> [B, nh, th, nw, tw, C] -> [B, N, C]
            return out.reshape(b, nh, nw, th, tw, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hw, c)

        return q, k, v, undo


def _same(out: Tensor) -> Tensor:
    return out


def bipartite_soft_matching(metric: Tensor, w: int, h: int, sx: int, sy: int, r: int, rand_idx: Tensor):
    """ToMe's random 2-D bipartite matching. ``rand_idx`` [h//sy, w//sx, 1]: which token of each
    sy×sx cell is the destination. Returns (merge, unmerge)."""
    b, n, _ = metric.shape
    if r <= 0 or w == 1 or h == 1:
        return _same, _same
    hsy, wsx = h // sy, w // sx
    cells = torch.zeros(hsy, wsx, sy * sx, device=metric.device, dtype=torch.int64)
    cells.scatter_(2, rand_idx, -torch.ones_like(rand_idx))  # -1 marks each cell's destination
    # [hsy, wsx, sy, sx] -> [hsy, sy, wsx, sx] -> [hsy·sy, wsx·sx]
    cells = cells.view(hsy, wsx, sy, sx).transpose(1, 2).reshape(hsy * sy, wsx * sx)
    if hsy * sy < h or wsx * sx < w:
        grid = torch.zeros(h, w, device=metric.device, dtype=torch.int64)
        grid[:hsy * sy, :wsx * sx] = cells
    else:
        grid = cells
    order = grid.reshape(1, -1, 1).argsort(dim=1)  # destinations first, then sources (stable order)
    n_dst = hsy * wsx
    src_idx_all, dst_idx_all = order[:, n_dst:], order[:, :n_dst]

    def split(x: Tensor) -> tuple[Tensor, Tensor]:
        c = x.shape[-1]
        return (torch.gather(x, 1, src_idx_all.expand(x.shape[0], n - n_dst, c)),
                torch.gather(x, 1, dst_idx_all.expand(x.shape[0], n_dst, c)))

    with torch.no_grad():
        unit = metric / metric.norm(dim=-1, keepdim=True)
        a, bb = split(unit)
        scores = a @ bb.transpose(-1, -2)  # [B, n_src, n_dst] cosine similarity
        r = min(a.shape[1], r)
        best, best_dst = scores.max(dim=-1)
        ranked = best.argsort(dim=-1, descending=True)[..., None]
        unmerged, merged = ranked[..., r:, :], ranked[..., :r, :]
        merged_dst = torch.gather(best_dst[..., None], -2, merged)

    def merge(x: Tensor) -> Tensor:
        src, dst = split(x)
        bx, t1, c = src.shape
        keep = torch.gather(src, -2, unmerged.expand(bx, t1 - r, c))
        moved = torch.gather(src, -2, merged.expand(bx, r, c))
        dst = dst.scatter_reduce(-2, merged_dst.expand(bx, r, c), moved, reduce="mean")
        return torch.cat([keep, dst], dim=1)  # [B, N - r, C]

    def unmerge(x: Tensor) -> Tensor:
        n_keep = unmerged.shape[1]
        keep, dst = x[..., :n_keep, :], x[..., n_keep:, :]
        c = keep.shape[-1]
        moved = torch.gather(dst, -2, merged_dst.expand(b, r, c))
        out = torch.zeros(b, n, c, device=x.device, dtype=x.dtype)
        out.scatter_(-2, dst_idx_all.expand(b, n_dst, c), dst)
        src_pos = src_idx_all.expand(b, src_idx_all.shape[1], 1)
        out.scatter_(-2, torch.gather(src_pos, 1, unmerged).expand(b, n_keep, c), keep)
        out.scatter_(-2, torch.gather(src_pos, 1, merged).expand(b, r, c), moved)
        return out

    return merge, unmerge


@dataclass(frozen=True)
class TokenMerge:
    ratio: float = 0.3
    shape: tuple | None = None

    def for_call(self, shape: tuple, state: dict) -> "TokenMerge":
        return dataclasses.replace(self, shape=tuple(shape))

    def wrap_attn1(self, n: Tensor, k: Tensor, v: Tensor):
        if self.shape is None:
            return n, k, v, _same
        _, _, height, width = self.shape
        tokens = n.shape[1]
        downsample = int(math.ceil(math.sqrt((height * width) // tokens)))
        if downsample > 1:
            return n, k, v, _same
        w, h = int(math.ceil(width / downsample)), int(math.ceil(height / downsample))
        r = int(tokens * self.ratio)
        if r <= 0 or w == 1 or h == 1:  # nothing to merge: no random draw either (ComfyUI)
            return n, k, v, _same
        rand = global_randint(4, (h // 2, w // 2, 1), n.device)
        merge, unmerge = bipartite_soft_matching(n, w, h, 2, 2, r, rand)
        return merge(n), k, v, unmerge


def global_randint(high: int, size: tuple, device) -> Tensor:
    """``torch.randint`` from torch's global generator: ComfyUI's ToMe draws its destination
    tokens there (parity; see the module docstring)."""
    return torch.randint(high, size=size, device=device)
