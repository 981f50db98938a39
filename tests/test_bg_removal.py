"""LoadBackgroundRemovalModel / RemoveBackground (ComfyUI nodes_bg_removal.py): specs, a tiny
BiRefNet in ComfyUI's key layout (seeded random weights, sizes read back from shapes), the
plain-torch deformable convolution against a naive loop, and the loader's errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.image_models.birefnet import (DETECTION_KEY, INVALID_MESSAGE, BackgroundRemovalError,
                                                  BiRefNet, BiRefNetConfig, load_background_removal_model,
                                                  preprocess)
from mixgraph.nodes.image_models.deform_conv import deform_conv2d
from mixgraph.ui import api

TINY = BiRefNetConfig(embed_dim=8, depths=(2, 1, 1, 1), num_heads=(1, 2, 2, 4), window_size=3,
                      mlp_hidden=(16, 32, 64, 128), dec_inter=8, aspp_planes=4, aspp_kernels=(1, 3, 7),
                      ipt_inter=4, gdt_channels=2)


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = BiRefNet(TINY)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("relative_position_index") or k.endswith("num_batches_tracked"):
            sd[k] = v.clone()
        elif k.endswith("running_var"):
            sd[k] = 0.5 + torch.rand(v.shape, generator=g)
        elif k.endswith(".weight") and v.ndim == 1:          # norms: around 1
            sd[k] = 1.0 + 0.1 * torch.randn(v.shape, generator=g)
        else:
            fan_in = max(1, v[0].numel()) if v.ndim > 1 else 16
            sd[k] = torch.randn(v.shape, generator=g) / math.sqrt(fan_in)
    return sd


def image(b, h, w, seed=0):
    return torch.rand(b, h, w, 3, generator=torch.Generator().manual_seed(seed))


# --- specs ---------------------------------------------------------------------------------------

def test_bg_removal_specs_match_comfyui():
    info = api.default_registry().object_info()
    loader, remove = info["LoadBackgroundRemovalModel"], info["RemoveBackground"]
    assert list(loader["input"]["required"]) == ["bg_removal_name"]
    assert loader["input"]["required"]["bg_removal_name"][1] == {
        "tooltip": "The model used to remove backgrounds from images"}
    assert loader["output"] == ["BACKGROUND_REMOVAL"] and loader["output_name"] == ["bg_model"]
    assert loader["category"] == "model/loaders" and loader["display_name"] == "Load Background Removal Model"
    assert loader["description"] == ""
    req = remove["input"]["required"]
    assert list(req) == ["bg_removal_model", "image"]
    assert req["bg_removal_model"] == ["BACKGROUND_REMOVAL", {
        "tooltip": "Background removal model used to generate the mask"}]
    assert req["image"] == ["IMAGE", {"tooltip": "Input image to remove the background from"}]
    res = remove["input"]["optional"]["resolution"]
    assert res[0] == "INT"
    assert {k: res[1][k] for k in ("default", "min", "max", "step", "advanced")} == {
        "default": 1024, "min": 256, "max": 4096, "step": 32, "advanced": True}
    assert res[1]["tooltip"].startswith("Square size the image is resized to before inference.")
    assert remove["output"] == ["MASK"] and remove["output_name"] == ["mask"]
    assert remove["output_tooltips"] == ["Generated foreground mask"]
    assert remove["category"] == "image/background removal" and remove["display_name"] == "Remove Background"
    assert remove["description"] == ("Generates a foreground mask to remove the background from an image "
                                     "using a background removal model.")


def test_bg_removal_models_folder_is_registered(tmp_path):
    assert folders.FOLDERS["background_removal"] == ("background_removal",)
    (tmp_path / "models" / "background_removal").mkdir(parents=True)
    (tmp_path / "models" / "background_removal" / "b.safetensors").write_bytes(b"")
    env = Env(models=(tmp_path / "models",))
    assert "b.safetensors" in folders.list_files(env, "background_removal")


# --- deformable convolution ----------------------------------------------------------------------

def naive_deform_conv(x, offset, weight, bias, stride, pad, dil, mask):
    """torchvision's definition, one output value at a time."""
    b, cin, h, w = x.shape
    cout, _, kh, kw = weight.shape
    ho, wo = offset.shape[2:]

    def at(bi, c, y, xx):
        if y <= -1 or y >= h or xx <= -1 or xx >= w:
            return 0.0
        y0, x0 = math.floor(y), math.floor(xx)
        total = 0.0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xc, wx in ((x0, 1 - (xx - x0)), (x0 + 1, xx - x0)):
                if 0 <= yy < h and 0 <= xc < w:
                    total += wy * wx * float(x[bi, c, yy, xc])
        return total

    out = torch.zeros(b, cout, ho, wo, dtype=torch.float64)
    for bi in range(b):
        for oy in range(ho):
            for ox in range(wo):
                cols = torch.zeros(cin, kh, kw, dtype=torch.float64)
                for i in range(kh):
                    for j in range(kw):
                        k = i * kw + j
                        y = oy * stride - pad + i * dil + float(offset[bi, 2 * k, oy, ox])
                        xx = ox * stride - pad + j * dil + float(offset[bi, 2 * k + 1, oy, ox])
                        m = float(mask[bi, k, oy, ox]) if mask is not None else 1.0
                        for c in range(cin):
                            cols[c, i, j] = at(bi, c, y, xx) * m
                out[bi, :, oy, ox] = (weight.double() * cols).sum((1, 2, 3))
    if bias is not None:
        out += bias.double().view(1, -1, 1, 1)
    return out


def test_deform_conv2d_zero_offsets_equal_conv2d():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 6, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    bias = torch.randn(4, generator=g)
    for stride, pad, dil in ((1, 1, 1), (2, 1, 1), (1, 2, 2), (1, 0, 1)):
        ref = F.conv2d(x, w, bias, stride=stride, padding=pad, dilation=dil)
        off = torch.zeros(2, 18, *ref.shape[2:])
        out = deform_conv2d(x, off, w, bias, stride=stride, padding=pad, dilation=dil)
        assert torch.allclose(out, ref, atol=1e-5), (stride, pad, dil)


def test_deform_conv2d_random_offsets_match_naive_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, 5, 6, generator=g)
    w = torch.randn(3, 2, 3, 3, generator=g)
    bias = torch.randn(3, generator=g)
    for stride, pad, dil, with_mask in ((1, 1, 1, True), (2, 1, 1, False), (1, 2, 2, True)):
        ho = (5 + 2 * pad - dil * 2 - 1) // stride + 1
        wo = (6 + 2 * pad - dil * 2 - 1) // stride + 1
        off = 2.5 * torch.randn(2, 18, ho, wo, generator=g)   # many taps land outside the image
        mask = torch.rand(2, 9, ho, wo, generator=g) * 2 if with_mask else None
        out = deform_conv2d(x, off, w, bias, stride=stride, padding=pad, dilation=dil, mask=mask)
        ref = naive_deform_conv(x, off, w, bias, stride, pad, dil, mask)
        assert torch.allclose(out.double(), ref, atol=1e-4), (stride, pad, dil)


def test_deform_conv2d_integer_offsets_shift_the_sampling():
    x = torch.arange(25.0).view(1, 1, 5, 5)
    w = torch.ones(1, 1, 1, 1)
    off = torch.zeros(1, 2, 5, 5)
    off[:, 0] = 1.0    # dy = +1: each output reads the row below
    out = deform_conv2d(x, off, w)
    assert torch.equal(out[0, 0, :4], x[0, 0, 1:])
    assert torch.equal(out[0, 0, 4], torch.zeros(5))     # beyond the last row: zero


# --- the network and the nodes -------------------------------------------------------------------

def test_birefnet_loader_reads_sizes_from_shapes(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(tiny_state_dict(), str(path))
    handle = load_background_removal_model(path, device="cpu")
    assert handle.model.cfg == TINY
    with torch.device("meta"):   # ComfyUI's fixed Swin-L sizes come back from a full-size layout
        full = {k: tuple(v.shape) for k, v in BiRefNet(BiRefNetConfig()).state_dict().items()}
    assert BiRefNetConfig.from_shapes(full) == BiRefNetConfig()
    assert full["decoder.ipt_blk5.conv1.weight"] == (64, 2 ** 10 * 3, 3, 3)
    assert full["squeeze_module.0.conv_in.weight"] == (64, 3072 + 1536 + 768 + 384, 3, 3)


def test_remove_background_gives_a_mask_of_the_image_size(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(tiny_state_dict(), str(path))
    handle = load_background_removal_model(path, device="cpu")
    img = image(2, 40, 56)
    mask = handle.encode_image(img, image_size=64)
    assert mask.shape == (2, 40, 56) and mask.dtype == torch.float32
    assert torch.isfinite(mask).all() and mask.min() >= 0 and mask.max() <= 1
    assert mask.std() > 1e-4                                       # not a constant
    # per-image forward: the batch equals each image alone
    assert torch.allclose(mask[1:], handle.encode_image(img[1:], image_size=64), atol=1e-5)
    # the pipeline: stretch to the square, normalise, logits resized back bicubic, sigmoid
    with torch.no_grad():
        logits = handle.model(preprocess(img[:1], 64))
    expected = F.interpolate(logits, size=(40, 56), mode="bicubic", antialias=False).sigmoid()[:, 0]
    assert torch.allclose(mask[:1], expected, atol=1e-5)


def test_preprocess_stretches_quantises_and_normalises():
    img = torch.full((1, 10, 20, 4), 0.5)
    px = preprocess(img, 32)
    assert px.shape == (1, 3, 32, 32)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    expected = (torch.tensor([128 / 255] * 3) - mean) / std
    assert torch.allclose(px[0, :, 5, 5], expected, atol=1e-5)


def test_bg_removal_loader_rejects_a_file_without_the_detection_key(tmp_path):
    sd = tiny_state_dict()
    del sd[DETECTION_KEY]
    path = tmp_path / "other.safetensors"
    save_file(sd, str(path))
    with pytest.raises(BackgroundRemovalError) as e:
        load_background_removal_model(path)
    assert INVALID_MESSAGE in str(e.value) and "other.safetensors" in str(e.value)


def test_bg_removal_loader_names_a_missing_tensor(tmp_path):
    sd = tiny_state_dict()
    del sd["decoder.conv_out1.0.weight"]
    path = tmp_path / "cut.safetensors"
    save_file(sd, str(path))
    with pytest.raises(BackgroundRemovalError, match="decoder.conv_out1.0.weight"):
        load_background_removal_model(path)


def test_bg_removal_nodes_through_the_engine(tmp_path):
    models = tmp_path / "models"
    (models / "background_removal").mkdir(parents=True)
    save_file(tiny_state_dict(seed=3), str(models / "background_removal" / "tiny_birefnet.safetensors"))
    (tmp_path / "in").mkdir()
    arr = (image(1, 24, 36)[0].numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).save(tmp_path / "in" / "small.png")
    env = Env(models=(models,), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "t")
    ex = Executor(api.default_registry(), env, cache=OutputCache(max_bytes=1 << 26))
    prompt = {
        "1": {"class_type": "LoadBackgroundRemovalModel",
              "inputs": {"bg_removal_name": "tiny_birefnet.safetensors"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "small.png"}},
        "3": {"class_type": "RemoveBackground",
              "inputs": {"bg_removal_model": ["1", 0], "image": ["2", 0], "resolution": 256}},
        "4": {"class_type": "MaskToImage", "inputs": {"mask": ["3", 0]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "m"}},
    }
    ex.run(prompt)
    [saved] = list((tmp_path / "out").glob("m_*.png"))
    with Image.open(saved) as im:
        assert im.size == (36, 24)
