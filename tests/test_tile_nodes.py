"""SplitImageToTileList / ImageMergeTileList (ComfyUI 0.38.1 nodes_images.py): specs, the tile
grid by hand, the sine-feathered merge against an independent numpy computation, and a list
round trip through the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixgraph.nodes.declare.image.tile_nodes import merge_tiles, split_tiles, tile_grid
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_tile_nodes_specs_match_comfyui():
    s = INFO["SplitImageToTileList"]
    assert s["input_order"]["required"] == ["image", "tile_width", "tile_height", "overlap"]
    assert s["input"]["required"]["tile_width"] == ["INT", {"default": 1024, "min": 64, "max": 16384}]
    assert s["input"]["required"]["overlap"] == ["INT", {"default": 128, "min": 0, "max": 4096}]
    assert s["output"] == ["IMAGE"] and s["output_is_list"] == [True] and s["category"] == "image/batch"
    m = INFO["ImageMergeTileList"]
    assert m["input_order"]["required"] == ["image_list", "final_width", "final_height", "overlap"]
    assert m["input"]["required"]["final_height"] == ["INT", {"default": 1024, "min": 64, "max": 32768}]
    assert m["output"] == ["IMAGE"] and m["output_is_list"] == [False]
    assert m["display_name"] == "Merge List of Tiles to Image"


def test_tile_grid_hand_values():
    # stride 128 − 32 = 96; the last tile of a row/column is pulled back to the edge
    assert tile_grid(300, 200, 128, 128, 32) == [
        (0, 0, 128, 128), (96, 0, 224, 128), (172, 0, 300, 128),
        (0, 72, 128, 200), (96, 72, 224, 200), (172, 72, 300, 200)]
    # image smaller than a tile: one tile, the whole image
    assert tile_grid(50, 40, 64, 64, 8) == [(0, 0, 50, 40)]
    # no overlap: a plain grid
    assert tile_grid(128, 64, 64, 64, 0) == [(0, 0, 64, 64), (64, 0, 128, 64)]


def test_tile_grid_vertical_stride_floors_at_a_quarter_of_tile_width():
    # ComfyUI's vertical stride is max(tile_width/4, tile_height − overlap): 64/4 = 16 < 256 − 200
    # = 56, so rows start every 56 px (a tile_height floor would give 64)
    rows = sorted({y0 for _, y0, _, _ in tile_grid(64, 400, 64, 256, 200)})
    assert rows == [0, 56, 112, 144]  # 168 + 256 > 400: the third tile is pulled back to 144
    # and the horizontal stride is floored at a quarter of the tile: 64 − 60 < 16
    assert [x0 for x0, _, _, _ in tile_grid(128, 64, 64, 64, 60)] == [0, 16, 32, 48, 64]


def test_split_tiles_are_views_of_the_image():
    img = torch.rand(2, 200, 300, 3, generator=torch.Generator().manual_seed(0))
    tiles = split_tiles(img, 128, 128, 32)
    assert len(tiles) == 6 and all(t.shape == (2, 128, 128, 3) for t in tiles)
    assert torch.equal(tiles[5], img[:, 72:200, 172:300])


def test_merge_tiles_reassembles_the_split_image():
    img = torch.rand(1, 150, 230, 3, generator=torch.Generator().manual_seed(1))
    for overlap in (0, 16, 64):
        out = merge_tiles(split_tiles(img, 96, 80, overlap), 230, 150, overlap)
        assert out.shape == img.shape
        assert torch.allclose(out, img, atol=1e-6)


def _numpy_merge(values, coords, t_h, t_w, h, w):
    """Independent reference: per-tile constant values, sine weights sin(π·i/(n−1)) ≥ 1e-5."""
    wy = np.maximum(np.sin(np.pi * np.arange(t_h) / (t_h - 1)), 1e-5)
    wx = np.maximum(np.sin(np.pi * np.arange(t_w) / (t_w - 1)), 1e-5)
    wgt = np.outer(wy, wx)
    num, den = np.zeros((h, w)), np.zeros((h, w))
    for v, (x0, y0, x1, y1) in zip(values, coords):
        num[y0:y1, x0:x1] += v * wgt[:y1 - y0, :x1 - x0]
        den[y0:y1, x0:x1] += wgt[:y1 - y0, :x1 - x0]
    den[den == 0] = 1
    return num / den


def test_merge_tiles_sine_feather_matches_numpy():
    coords = tile_grid(150, 100, 64, 64, 24)
    values = [float(i + 1) for i in range(len(coords))]
    tiles = [torch.full((1, 64, 64, 1), v, dtype=torch.float64) for v in values]
    out = merge_tiles(tiles, 150, 100, 24)
    ref = _numpy_merge(values, coords, 64, 64, 100, 150)
    assert np.allclose(out[0, :, :, 0].numpy(), ref, rtol=1e-9, atol=1e-9)
    # the blend between tile 1 (value 1) and tile 2 (value 2) is strictly between them
    mid = out[0, 32, 40:64, 0]
    assert (mid > 1).all() and (mid < 2).all()


def test_merge_tiles_leaves_uncovered_pixels_black_and_checks_the_list():
    # fewer tiles than the grid: the missing part of the canvas stays 0
    tiles = split_tiles(torch.ones(1, 64, 128, 3), 64, 64, 0)
    out = merge_tiles(tiles[:1], 128, 64, 0)
    assert out[:, :, :64].eq(1).all() and out[:, :, 64:].eq(0).all()
    with pytest.raises(ValueError, match="image_list"):
        merge_tiles([], 64, 64, 0)
    with pytest.raises(ValueError, match="tile 1"):
        merge_tiles([torch.zeros(1, 64, 64, 3), torch.zeros(2, 64, 64, 3)], 128, 64, 0)


def test_tile_list_round_trip_through_the_engine(tmp_path):
    g = api.Graph(precision="f32")
    img = g.add("EmptyImage", width=200, height=130, batch_size=2, color=0x336699)
    tiles = g.add("SplitImageToTileList", image=img, tile_width=96, tile_height=64, overlap=16)
    inv = g.add("ImageInvert", image=tiles)  # mapped once per tile
    merged = g.add("ImageMergeTileList", image_list=inv, final_width=200, final_height=130, overlap=16)
    g.add("PreviewImage", images=merged)
    out = api.run(g, output=tmp_path)
    assert len(out[tiles.node_id][0]) == len(tile_grid(200, 130, 96, 64, 16)) == 9
    source = out[img.node_id][0]
    got = out[merged.node_id][0]
    assert got.shape == (2, 130, 200, 3)
    assert torch.allclose(got, 1.0 - source, atol=1e-6)
