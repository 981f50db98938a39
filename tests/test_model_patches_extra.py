"""HyperTile and TomePatchModel: ComfyUI's tile-size and grid rules, the tiled attention against
an index-by-index reference, ToMe's merge/unmerge bookkeeping, and both nodes sampling a tiny
SD1 model deterministically."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from mixgraph.nodes.models.token_patches import (
    HyperTile, TokenMerge, bipartite_soft_matching, find_hw_candidates, random_divisor,
)
from mixgraph.ui import api


def test_hypertile_grid_and_divisor_rules():
    assert find_hw_candidates(4096, 1.0) == (64, 64)
    assert find_hw_candidates(6144, 1.5) == (96, 64)
    assert find_hw_candidates(50, 2.0) == (10, 5)
    assert find_hw_candidates(14, 1.0) == (7, 2)  # no exact pair near 4 x 4: the divisor pair closest to 1
    for counter in range(1, 6):
        random.seed(counter)  # ComfyUI seeds Python's global generator with the counter
        expected = [2, 1][random.randint(0, 1)]  # 64's divisors >= 32: 32, 64 -> 2 or 1 tiles
        assert random_divisor(64, 32, 2, counter) == expected
    assert random_divisor(64, 32, 1, 3) == 2 and random_divisor(6, 32, 2, 1) == 1


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]


def test_hypertile_tiles_queries_and_chunks_keys_like_comfyui():
    b, h, w, c = 2, 8, 8, 32
    n = torch.randn(b, h * w, c, generator=torch.Generator().manual_seed(0))
    patch = HyperTile(model_channels=32, tile_size=32).for_call((b, 4, h, w), {})
    q, k, v, undo = patch.wrap_attn1(n, n, n)
    random.seed(1)
    nh = [2, 1][random.randint(0, 1)]
    random.seed(2)
    nw = [2, 1][random.randint(0, 1)]
    assert q.shape == (b * nh * nw, (h // nh) * (w // nw), c)
    out = undo(_sdpa(q, k, v))
    th, tw, tiles = h // nh, w // nw, nh * nw
    expected = torch.zeros_like(n)
    for bi in range(b):
        for ih in range(nh):
            for iw in range(nw):
                j = ih * nw + iw
                rows = [(ih * th + y) * w + iw * tw + x for y in range(th) for x in range(tw)]
                run = n[bi, j * (h * w // tiles):(j + 1) * (h * w // tiles)]  # keys: consecutive tokens
                expected[bi, rows] = _sdpa(n[bi, rows][None], run[None], run[None])[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert patch.state[next(iter(patch.state))] == 3  # two picks made: the next counter is 3
    deeper = torch.randn(b, 16, 64)  # 64 channels: outside max_depth 0, untouched
    q2, _, _, undo2 = patch.wrap_attn1(deeper, deeper, deeper)
    assert q2 is deeper and undo2(deeper) is deeper


def test_tome_merges_duplicates_and_unmerges_them_exactly():
    h = w = 4
    cells = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(1))  # one vector per 2x2 cell
    idx = torch.tensor([(y // 2) * 2 + x // 2 for y in range(h) for x in range(w)])
    x = cells[:, idx]  # [1, 16, 16]: the four tokens of a cell are equal
    rand = torch.tensor([[[3], [0]], [[1], [2]]])
    merge, unmerge = bipartite_soft_matching(x, w, h, 2, 2, 12, rand)
    merged = merge(x)
    assert merged.shape == (1, 4, 16)  # 12 sources merged into the 4 destinations
    torch.testing.assert_close(unmerge(merged), x, rtol=1e-6, atol=1e-6)
    y = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(2))
    m2, u2 = bipartite_soft_matching(y, w, h, 2, 2, 5, rand)
    back = u2(m2(y))
    kept = (back - y).abs().amax(-1) < 1e-6
    assert int(kept.sum()) >= 16 - 5 - 4  # unmerged sources come back unchanged
    noop = TokenMerge(0.0).for_call((1, 4, 4, 4), {})
    q, _, _, undo = noop.wrap_attn1(y, y, y)
    assert q is y and undo(y) is y


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("token_patch_models")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=6)
    return root


def _sample(models, tmp_path, patch: dict | None, size=64):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    model = ck[0]
    if patch is not None:
        model = g.add(patch.pop("class_type"), model=ck[0], **patch)
    ks = g.add("KSampler", model=model, seed=4, steps=3, cfg=2.5, sampler_name="euler", scheduler="normal",
               positive=g.add("CLIPTextEncode", text="a boat", clip=ck[1]),
               negative=g.add("CLIPTextEncode", text="", clip=ck[1]),
               latent_image=g.add("EmptyLatentImage", width=size, height=size, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return api.run(g, models=models, output=tmp_path)[ks.node_id][0].samples


def test_hypertile_and_tome_nodes_sample_deterministically(models, tmp_path):
    info = api.default_registry().object_info()
    ht = info["HyperTile"]["input"]["required"]
    assert list(ht) == ["model", "tile_size", "swap_size", "max_depth", "scale_depth"]
    assert (ht["tile_size"][1]["default"], ht["swap_size"][1]["default"], ht["max_depth"][1]["default"]) == (256, 2, 0)
    assert info["TomePatchModel"]["input"]["required"]["ratio"][1]["default"] == 0.3
    plain = _sample(models, tmp_path, None)
    tiled = _sample(models, tmp_path, {"class_type": "HyperTile", "tile_size": 32, "swap_size": 2, "max_depth": 0,
                                       "scale_depth": False})
    again = _sample(models, tmp_path, {"class_type": "HyperTile", "tile_size": 33, "swap_size": 2, "max_depth": 0,
                                       "scale_depth": False})  # 33 // 8 == 32 // 8: same tiles, fresh node
    assert torch.isfinite(tiled).all() and (tiled - plain).abs().max() > 1e-4
    torch.testing.assert_close(tiled, again)  # the counter restarts with each sampling run
    merged = _sample(models, tmp_path, {"class_type": "TomePatchModel", "ratio": 0.5})
    merged2 = _sample(models, tmp_path, {"class_type": "TomePatchModel", "ratio": 0.5 + 1e-9})
    assert torch.isfinite(merged).all() and (merged - plain).abs().max() > 1e-4
    torch.testing.assert_close(merged, merged2)  # the destinations come from the seeded stream


# --- hypernetworks ----------------------------------------------------------------------------


def _hypernet_pair(width: int, seed: int, layer_norm: bool = False) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    pair = []
    for _ in range(2):
        d = {"linear.0.weight": torch.randn(2 * width, width, generator=g) * 0.1,
             "linear.0.bias": torch.randn(2 * width, generator=g) * 0.1}
        nxt = 1
        if layer_norm:
            d["linear.1.weight"], d["linear.1.bias"] = 1 + 0.1 * torch.randn(2 * width, generator=g), torch.zeros(2 * width)
            nxt = 2
        d[f"linear.{nxt}.weight"] = torch.randn(width, 2 * width, generator=g) * 0.1
        d[f"linear.{nxt}.bias"] = torch.randn(width, generator=g) * 0.1
        if layer_norm:  # A1111 puts a LayerNorm after every Linear, the last one included
            d["linear.3.weight"], d["linear.3.bias"] = 1 + 0.1 * torch.randn(width, generator=g), torch.zeros(width)
        pair.append(d)
    return pair


def test_hypernetwork_mlps_follow_comfyuis_layer_rules(tmp_path):
    from mixgraph.nodes.adapters.hypernetwork import load_hypernetwork

    path = tmp_path / "hn.pt"
    torch.save({32: _hypernet_pair(32, 1, layer_norm=True), "activation_func": "relu", "is_layer_norm": True,
                "use_dropout": True, "activate_output": False, "name": "hn"}, path)
    with pytest.warns(UserWarning, match="pickle-format hypernetwork"):
        patch = load_hypernetwork(path, 0.7)
    mk, mv = patch.mlps[32]
    # ComfyUI counts LayerNorms when it looks for the last layer, so with layer norms the last
    # Linear is activated too
    assert [type(m).__name__ for m in mk] == ["Linear", "ReLU", "LayerNorm", "Linear", "ReLU", "LayerNorm"]
    k = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    p = _hypernet_pair(32, 1, layer_norm=True)[0]
    h = torch.relu(F.linear(k, p["linear.0.weight"], p["linear.0.bias"]))
    h = F.layer_norm(h, (64,), p["linear.1.weight"], p["linear.1.bias"])
    h = F.layer_norm(torch.relu(F.linear(h, p["linear.2.weight"], p["linear.2.bias"])), (32,),
                     p["linear.3.weight"], p["linear.3.bias"])
    n, k2, v2, undo = patch.wrap_attn2(k, k, k)
    torch.testing.assert_close(k2, k + 0.7 * h, rtol=1e-5, atol=1e-5)
    assert n is k and undo(k) is k
    other = torch.randn(1, 3, 48)
    assert patch.wrap_attn1(other, other, other)[1] is other  # no MLP pair for width 48
    torch.save({32: _hypernet_pair(32, 1), "activation_func": "gelu_new"}, tmp_path / "bad.pt")
    with pytest.warns(UserWarning), pytest.raises(NotImplementedError, match="activation 'gelu_new'"):
        load_hypernetwork(tmp_path / "bad.pt", 1.0)


def test_hypernetwork_loader_node_end_to_end(models, tmp_path):
    (models / "hypernetworks").mkdir(exist_ok=True)
    torch.save({32: _hypernet_pair(32, 3), 64: _hypernet_pair(64, 4), "activation_func": "tanh",
                "is_layer_norm": False}, models / "hypernetworks" / "tiny.pt")
    spec = api.default_registry().object_info()["HypernetworkLoader"]["input"]["required"]
    assert list(spec) == ["model", "hypernetwork_name", "strength"]
    plain = _sample(models, tmp_path, None)
    with pytest.warns(UserWarning):
        zero = _sample(models, tmp_path, {"class_type": "HypernetworkLoader", "hypernetwork_name": "tiny.pt",
                                          "strength": 0.0})
        full = _sample(models, tmp_path, {"class_type": "HypernetworkLoader", "hypernetwork_name": "tiny.pt",
                                          "strength": 1.0})
    torch.testing.assert_close(zero, plain, rtol=1e-5, atol=1e-5)  # strength 0 adds nothing
    assert torch.isfinite(full).all() and (full - plain).abs().max() > 1e-4
