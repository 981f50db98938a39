"""RebatchLatents / RebatchImages: ComfyUI's spec, the rebatching rules (batch indices, masks,
size changes) and the engine's list handling around them."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.rebatch_nodes import rebatch_images, rebatch_latents
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_rebatch_specs_match_comfyui():
    for name, sock, cat in (("RebatchLatents", "latents", "latent/batch"),
                            ("RebatchImages", "images", "image/batch")):
        info = INFO[name]
        assert list(info["input"]["required"]) == [sock, "batch_size"]
        assert info["input"]["required"]["batch_size"] == ["INT", {"default": 1, "min": 1, "max": 4096}]
        assert info["category"] == cat and info["output_is_list"] == [True]
    assert INFO["RebatchLatents"]["output"] == ["LATENT"]
    assert INFO["RebatchImages"]["output"] == ["IMAGE"]
    assert INFO["RebatchLatents"]["display_name"] == "Rebatch Latents"


def _lat(n, hw, start, mask=None):
    s = torch.arange(start, start + n, dtype=torch.float32).reshape(n, 1, 1, 1).expand(n, 4, *hw)
    return Latent(s.clone(), mask)


def test_rebatch_latents_cuts_batches_and_keeps_indices_and_masks():
    a, b = _lat(3, (2, 2), 0), _lat(2, (2, 2), 3, mask=torch.zeros(1, 1, 16, 16))
    c = Latent(torch.full((1, 4, 3, 3), 5.0), batch_index=(9,))
    out = rebatch_latents([a, b, c], 2)
    # a: 3 > 2 -> [0,1], keep [2]; b: [2,3,4] -> [2,3], keep [4]; c has another size -> [4], then [c]
    assert [o.batch_index for o in out] == [(0, 1), (2, 3), (4,), (9,)]
    assert [o.samples[:, 0, 0, 0].tolist() for o in out] == [[0, 1], [2, 3], [4], [5]]
    assert out[0].noise_mask is None and out[3].noise_mask is None     # all ones: dropped
    assert out[1].noise_mask.shape == (2, 1, 16, 16)
    assert out[1].noise_mask[:, 0, 0, 0].tolist() == [1.0, 0.0]          # a unmasked, b masked
    assert out[2].noise_mask.abs().sum() == 0


def test_rebatch_latents_resizes_small_masks_to_pixels():
    lat = Latent(torch.zeros(2, 4, 2, 2), noise_mask=torch.tensor([[[0.0, 1.0], [1.0, 1.0]]]))
    (out,) = rebatch_latents([lat], 4)
    assert out.noise_mask.shape == (2, 1, 16, 16) and out.batch_index == (0, 1)
    assert out.noise_mask[1, 0, 0, 0] == 0.0 and out.noise_mask[0, 0, 15, 15] == 1.0


def test_rebatch_images_flattens_and_regroups():
    imgs = [torch.full((3, 4, 4, 3), 1.0), torch.full((2, 4, 4, 3), 2.0)]
    out = rebatch_images(imgs, 2)
    assert [o.shape[0] for o in out] == [2, 2, 1]
    assert out[1][:, 0, 0, 0].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="different sizes"):
        rebatch_images([torch.zeros(1, 4, 4, 3), torch.zeros(1, 8, 8, 3)], 2)
    assert len(rebatch_images([torch.zeros(1, 4, 4, 3), torch.zeros(1, 8, 8, 3)], 1)) == 2


def test_rebatch_latents_lists_through_the_engine(tmp_path):
    g = api.Graph(precision="f32")
    empty = g.add("EmptyLatentImage", width=16, height=16, batch_size=5)
    twos = g.add("RebatchLatents", latents=empty, batch_size=2)
    up = g.add("LatentUpscaleBy", samples=twos, upscale_method="nearest-exact", scale_by=2.0)
    fours = g.add("RebatchLatents", latents=up, batch_size=4)
    g.add("SaveLatent", samples=fours, filename_prefix="rb")
    out = api.run(g, output=tmp_path)
    assert [lat.samples.shape[0] for lat in out[twos.node_id][0]] == [2, 2, 1]
    assert len(out[up.node_id][0]) == 3                      # mapped once per list element
    got = out[fours.node_id][0]
    assert [lat.samples.shape for lat in got] == [(4, 4, 4, 4), (1, 4, 4, 4)]
    assert [lat.batch_index for lat in got] == [(0, 1, 2, 3), (4,)]
