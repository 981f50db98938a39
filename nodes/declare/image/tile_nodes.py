"""ComfyUI's SplitImageToTileList and ImageMergeTileList (``comfy_extras/nodes_images.py``,
0.38.1): an image cut into a list of overlapping tiles (OUTPUT_IS_LIST), and such a list
blended back into one image (INPUT_IS_LIST) with a sine feather over every tile.

The tile grid is ComfyUI's: tiles start every `stride` pixels and the last tile of a row or
column is pulled back to end at the image's edge (so tiles never shrink unless the image is
smaller than a tile). The vertical stride uses `tile_width` for its 25 % floor, as ComfyUI's does:
kept, so the same inputs give the same grid.
"""

from __future__ import annotations

import math

import torch

from mixgraph.graph.node import MAX_RESOLUTION, Int, Output, Socket, node

__all__ = ["tile_grid", "split_tiles", "merge_tiles"]


def _starts(size: int, tile: int, stride: int) -> list[tuple[int, int]]:
    """(start, end) of each tile along one axis: every `stride`, the last one flush with `size`."""
    spans, pos = [], 0
    while pos < size:
        end = min(pos + tile, size)
        spans.append((max(0, end - tile), end))
        if end >= size:
            break
        pos += stride
    return spans


def tile_grid(width: int, height: int, tile_width: int, tile_height: int,
              overlap: int) -> list[tuple[int, int, int, int]]:
    """(x_start, y_start, x_end, y_end) of every tile, rows top to bottom, left to right."""
    stride_x = round(max(tile_width * 0.25, tile_width - overlap))
    stride_y = round(max(tile_width * 0.25, tile_height - overlap))  # tile_width: ComfyUI's grid
    if stride_x <= 0 or stride_y <= 0:
        raise ValueError(f"tile size {tile_width}x{tile_height} with overlap {overlap} gives no "
                         f"forward step; use tiles of at least 1 pixel")
    return [(x0, y0, x1, y1) for y0, y1 in _starts(height, tile_height, stride_y)
            for x0, x1 in _starts(width, tile_width, stride_x)]


def split_tiles(image: torch.Tensor, tile_width: int, tile_height: int,
                overlap: int) -> list[torch.Tensor]:
    """[B, H, W, C] → the tiles [B, h, w, C] of ``tile_grid``, in its order."""
    _, h, w, _ = image.shape
    return [image[:, y0:y1, x0:x1, :] for x0, y0, x1, y1 in tile_grid(w, h, tile_width, tile_height, overlap)]


def _feather(t_h: int, t_w: int, overlap: int, like: torch.Tensor) -> torch.Tensor:
    """[1, t_h, t_w, 1] blend weight: sin(π·u)·sin(π·v) over the tile (u, v in [0, 1]), floored at
    1e-5 per axis so edge pixels still count; flat ones when tiles do not overlap."""
    if overlap <= 0:
        return torch.ones(1, t_h, t_w, 1, dtype=like.dtype, device=like.device)
    wy = torch.sin(math.pi * torch.linspace(0, 1, t_h, dtype=like.dtype, device=like.device)).clamp(min=1e-5)
    wx = torch.sin(math.pi * torch.linspace(0, 1, t_w, dtype=like.dtype, device=like.device)).clamp(min=1e-5)
    return (wy[:, None] * wx[None, :])[None, :, :, None]


def merge_tiles(tiles: list[torch.Tensor], width: int, height: int, overlap: int) -> torch.Tensor:
    """Tiles laid on the ``tile_grid`` of a `width`×`height` canvas (the grid is rebuilt from the
    first tile's size) and averaged with the sine feather; extra tiles are ignored, pixels no tile
    covers stay 0. Every tile must hold as many images as the first."""
    if not tiles:
        raise ValueError("input 'image_list': the list of tiles is empty")
    first = tiles[0]
    b, t_h, t_w, c = first.shape
    for i, t in enumerate(tiles):
        if t.ndim != 4 or t.shape[0] != b or t.shape[3] != c:
            raise ValueError(f"input 'image_list': tile {i} has shape {tuple(t.shape)}, the first "
                             f"{tuple(first.shape)}; tiles must share batch size and channels")
    weight = _feather(t_h, t_w, overlap, first)
    canvas = torch.zeros(b, height, width, c, dtype=first.dtype, device=first.device)
    total = torch.zeros(b, height, width, 1, dtype=first.dtype, device=first.device)
    for (x0, y0, x1, y1), tile in zip(tile_grid(width, height, t_w, t_h, overlap), tiles):
        h, w = min(y1 - y0, tile.shape[1]), min(x1 - x0, tile.shape[2])
        wgt = weight[:, :h, :w, :]
        canvas[:, y0:y0 + h, x0:x0 + w, :] += tile[:, :h, :w, :].to(first) * wgt
        total[:, y0:y0 + h, x0:x0 + w, :] += wgt
    total[total == 0] = 1.0
    return canvas / total


@node(category="image/batch", display_name="Split Image into List of Tiles",
      description="Splits an image into a batched list of tiles with a specified overlap.",
      outputs=[Output("IMAGE", "IMAGE", is_list=True)])
def SplitImageToTileList(image=Socket("IMAGE"),
                         tile_width=Int(1024, min=64, max=MAX_RESOLUTION),
                         tile_height=Int(1024, min=64, max=MAX_RESOLUTION),
                         overlap=Int(128, min=0, max=4096)):
    return (split_tiles(image, int(tile_width), int(tile_height), int(overlap)),)


@node(category="image/batch", display_name="Merge List of Tiles to Image", input_is_list=True,
      outputs=("IMAGE",))
def ImageMergeTileList(image_list=Socket("IMAGE"),
                       final_width=Int(1024, min=64, max=32768),
                       final_height=Int(1024, min=64, max=32768),
                       overlap=Int(128, min=0, max=4096)):
    return (merge_tiles(list(image_list), int(final_width[0]), int(final_height[0]), int(overlap[0])),)
