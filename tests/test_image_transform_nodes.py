"""ImageFlip, ImageRotate, GetImageSize, Split/JoinImageWithAlpha: specs as ComfyUI's and values
on small hand-built images."""

import torch

from mixgraph.nodes.helpers import image_ops
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_image_transform_specs_match_comfyui():
    req = lambda n: INFO[n]["input"]["required"]  # noqa: E731
    assert req("ImageFlip")["flip_method"][0] == ["x-axis: vertically", "y-axis: horizontally"]
    assert req("ImageRotate")["rotation"][0] == ["none", "90 degrees", "180 degrees", "270 degrees"]
    assert INFO["GetImageSize"]["output"] == ["INT", "INT", "INT"]
    assert INFO["GetImageSize"]["output_name"] == ["width", "height", "batch_size"]
    assert INFO["SplitImageWithAlpha"]["output"] == ["IMAGE", "MASK"]
    assert INFO["JoinImageWithAlpha"]["input_order"]["required"] == ["image", "alpha"]
    assert INFO["JoinImageWithAlpha"]["category"] == "mask/compositing"


def _img():  # [1, 2, 3, 1]: rows (0 1 2), (3 4 5)
    return torch.arange(6.0).reshape(1, 2, 3, 1)


def test_image_flip_and_rotate_by_hand():
    assert image_ops.flip(_img(), "x-axis: vertically")[0, :, :, 0].tolist() == [[3, 4, 5], [0, 1, 2]]
    assert image_ops.flip(_img(), "y-axis: horizontally")[0, :, :, 0].tolist() == [[2, 1, 0], [5, 4, 3]]
    # clockwise quarter turn: the bottom-left pixel comes to the top-left
    assert image_ops.rotate(_img(), "90 degrees")[0, :, :, 0].tolist() == [[3, 0], [4, 1], [5, 2]]
    assert image_ops.rotate(_img(), "180 degrees")[0, :, :, 0].tolist() == [[5, 4, 3], [2, 1, 0]]
    assert image_ops.rotate(_img(), "270 degrees")[0, :, :, 0].tolist() == [[2, 5], [1, 4], [0, 3]]
    assert torch.equal(image_ops.rotate(_img(), "none"), _img())
    assert image_ops.size(torch.zeros(3, 5, 7, 3)) == (7, 5, 3)


def test_split_and_join_alpha_round_trip():
    rgba = torch.rand(2, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    rgb, mask = image_ops.split_alpha(rgba)
    assert torch.equal(rgb, rgba[..., :3]) and torch.allclose(mask, 1.0 - rgba[..., 3])
    assert torch.allclose(image_ops.join_alpha(rgb, mask), rgba)
    _, no_alpha = image_ops.split_alpha(rgba[..., :3])
    assert torch.equal(no_alpha, torch.zeros(2, 4, 4))
    # a 2x2 mask is resized to the image; the shorter batch wins
    joined = image_ops.join_alpha(rgb, torch.ones(1, 2, 2))
    assert joined.shape == (1, 4, 4, 4) and torch.equal(joined[..., 3], torch.zeros(1, 4, 4))
