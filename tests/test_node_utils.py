"""Plain helpers behind the node library: folders, PNG writing, resizing, masks, latents."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.env import Env
from mixgraph.nodes.helpers import folders, imaging, latent_ops
from mixgraph.nodes.payloads.conditioning import Cond


def _env(tmp_path: Path) -> Env:
    return Env(models=(tmp_path / "models",), input=tmp_path / "input", output=tmp_path / "out")


def test_folders_list_files_relative_sorted_with_aliases(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "models/checkpoints/sub").mkdir(parents=True)
    (tmp_path / "models/checkpoints/b.safetensors").write_bytes(b"x")
    (tmp_path / "models/checkpoints/sub/a.ckpt").write_bytes(b"x")
    (tmp_path / "models/checkpoints/notes.txt").write_text("x")
    (tmp_path / "models/unet").mkdir()
    (tmp_path / "models/unet/u.safetensors").write_bytes(b"x")
    # the user's files and the embedded model (listed in every models folder), sorted together
    assert folders.list_files(env, "checkpoints") == ["b.safetensors", "mixgraph-shapes.safetensors",
                                                      "sub/a.ckpt"]
    assert folders.list_files(env, "diffusion_models") == ["u.safetensors"]
    assert folders.list_files(env, "unet") == ["u.safetensors"]
    assert folders.resolve(env, "checkpoints", "sub/a.ckpt").name == "a.ckpt"


def test_folders_extra_model_paths_yaml(tmp_path):
    other = tmp_path / "comfy"
    (other / "models/loras").mkdir(parents=True)
    (other / "models/loras/x.safetensors").write_bytes(b"x")
    (tmp_path / "models").mkdir()
    (tmp_path / "extra_model_paths.yaml").write_text(
        f"comfyui:\n  base_path: {other}\n  loras: models/loras\n")
    assert folders.list_files(_env(tmp_path), "loras") == ["mixgraph-shapes-night.safetensors",
                                                           "x.safetensors"]


@pytest.mark.parametrize("bad", ["../x.png", "/etc/passwd", "a/../../x"])
def test_folders_safe_join_refuses_escape(tmp_path, bad):
    with pytest.raises(folders.FolderError):
        folders.safe_join(tmp_path, bad)


def test_folders_safe_join_refuses_symlink_out(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret.txt").write_text("s")
    (tmp_path / "root/link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(folders.FolderError):
        folders.safe_join(tmp_path / "root", "link.txt")


def test_save_images_names_truncation_and_metadata(tmp_path):
    img = torch.full((2, 4, 5, 3), 0.999)  # 255*0.999 = 254.745 -> 254 (truncated, not rounded)
    prompt = {"1": {"class_type": "X", "inputs": {}}}
    out = imaging.save_images(img, tmp_path, "run/pic", prompt=prompt,
                              extra_pnginfo={"workflow": {"nodes": []}})
    assert [o["filename"] for o in out] == ["pic_00001_.png", "pic_00002_.png"]
    assert out[0]["subfolder"] == "run" and out[0]["type"] == "output"
    again = imaging.save_images(img[:1], tmp_path, "run/pic")
    assert again[0]["filename"] == "pic_00003_.png"
    png = Image.open(tmp_path / "run/pic_00001_.png")
    assert np.asarray(png)[0, 0, 0] == 254
    assert json.loads(png.text["prompt"]) == prompt
    assert json.loads(png.text["workflow"]) == {"nodes": []}


def test_load_image_rgba_gives_inverted_alpha_mask(tmp_path):
    rgba = np.zeros((6, 7, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[..., 3] = 51  # alpha 0.2 -> mask 0.8
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    image, mask = imaging.load_image(tmp_path / "a.png")
    assert image.shape == (1, 6, 7, 3) and mask.shape == (1, 6, 7)
    assert image[0, 0, 0, 0] == 1.0 and torch.allclose(mask, torch.full_like(mask, 0.8))
    Image.fromarray(rgba[..., :3]).save(tmp_path / "b.png")
    _, mask = imaging.load_image(tmp_path / "b.png")
    assert mask.shape == (1, 64, 64) and mask.sum() == 0


def test_load_image_rejects_non_image(tmp_path):
    (tmp_path / "x.png").write_bytes(b"not a png")
    with pytest.raises(imaging.ImageFileError, match="x.png"):
        imaging.load_image(tmp_path / "x.png")


def test_latent_upscale_keeps_aspect_and_min_size():
    lat = latent_ops.empty_latent(512, 256, 2)
    assert lat.samples.shape == (2, 4, 32, 64)
    up = latent_ops.upscale_latent(lat, "nearest-exact", 1024, 0, "disabled")
    assert up.samples.shape == (2, 4, 64, 128)
    small = latent_ops.upscale_latent(lat, "bilinear", 16, 16, "disabled")
    assert small.samples.shape[-2:] == (8, 8)  # 64 px minimum


def test_image_scale_center_crop_changes_aspect():
    img = torch.rand(1, 40, 80, 3)
    out = latent_ops.scale_image(img, "bilinear", 20, 20, "center")
    assert out.shape == (1, 20, 20, 3)


def test_grow_mask_box_dilation_matches_comfy_kernel():
    mask = torch.zeros(1, 1, 9, 9)
    mask[..., 4, 4] = 1
    grown = imaging.grow_mask(mask, 3)  # 3x3 box, padding 1
    assert grown.sum() == 9 and grown.shape == mask.shape
    grown = imaging.grow_mask(mask, 4)  # even: padding 2, 4x4 box, cropped back
    assert grown.shape == mask.shape and grown.sum() == 16


def test_prepare_inpaint_greys_masked_pixels():
    pixels = torch.rand(1, 16, 16, 3)
    mask = torch.zeros(1, 16, 16)
    mask[:, :8] = 1
    grey, noise_mask = latent_ops.prepare_inpaint(pixels, mask, 0)
    assert torch.all(grey[:, :8] == 0.5) and torch.equal(grey[:, 8:], pixels[:, 8:])
    assert noise_mask.shape == (1, 1, 16, 16)


def test_conditioning_set_area_and_zero_out():
    c = (Cond(cross_attn=torch.ones(1, 77, 8), pooled=torch.ones(1, 4)),)
    area = latent_ops.set_area(c, 256, 128, 64, 32, 0.5)
    assert area[0].area == (16, 32, 4, 8) and area[0].strength == 0.5
    assert c[0].area is None  # not mutated
    zero = latent_ops.zero_out(c)
    assert zero[0].cross_attn.abs().sum() == 0 and zero[0].pooled.abs().sum() == 0


def test_empty_latent_larger_than_memory_is_a_clear_error():
    with pytest.raises(MemoryError, match="lower width, height or batch_size"):
        latent_ops.empty_latent(16384, 16384, 4096)
