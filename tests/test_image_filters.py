"""Morphology, Canny and ImageAddNoise: specs as ComfyUI's and values derived by hand on small
images (kornia's definitions, module docstring of nodes/helpers/image_filters.py)."""

import pytest
import torch

from mixgraph.nodes.helpers import image_filters as F
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def test_image_filter_specs_match_comfyui():
    m = INFO["Morphology"]
    assert m["display_name"] == "ImageMorphology" and m["category"] == "image/postprocessing"
    assert m["input"]["required"]["operation"] == [["erode", "dilate", "open", "close", "gradient", "bottom_hat",
                                                    "top_hat"]]
    assert m["input"]["required"]["kernel_size"] == ["INT", {"default": 3, "min": 3, "max": 999, "step": 1}]
    c = INFO["Canny"]
    assert c["category"] == "image/preprocessors" and c["input_order"]["required"] == ["image", "low_threshold",
                                                                                        "high_threshold"]
    assert c["input"]["required"]["low_threshold"] == ["FLOAT", {"default": 0.4, "min": 0.01, "max": 0.99, "step": 0.01}]
    assert c["input"]["required"]["high_threshold"][1]["default"] == 0.8
    n = INFO["ImageAddNoise"]
    assert n["category"] == "image" and n["output"] == ["IMAGE"]
    seed = n["input"]["required"]["seed"][1]
    assert seed["default"] == 0 and seed["max"] == 0xFFFFFFFFFFFFFFFF and seed["control_after_generate"] is True
    assert n["input"]["required"]["strength"] == ["FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.01}]


def _img(rows):
    return torch.tensor(rows, dtype=torch.float32)[None, :, :, None]  # [1, H, W, 1]


def test_morphology_hand_values():
    dot = _img([[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    dil = F.morphology(dot, "dilate", 3)[0, :, :, 0]
    expect = torch.zeros(5, 5)
    expect[1:4, 1:4] = 1
    assert torch.equal(dil, expect)
    assert torch.equal(F.morphology(dot, "erode", 3), torch.zeros_like(dot))
    assert torch.equal(F.morphology(dot, "open", 3), torch.zeros_like(dot))  # a lone dot is removed
    assert torch.equal(F.morphology(dot, "top_hat", 3), dot)
    assert torch.equal(F.morphology(dot, "gradient", 3)[0, :, :, 0], expect)
    # close fills a one-pixel hole; bottom_hat is exactly that hole
    hole = 1 - dot
    assert torch.equal(F.morphology(hole, "close", 3), torch.ones_like(hole))
    assert torch.equal(F.morphology(hole, "bottom_hat", 3), dot)
    # the border does not count: a full image stays full under erosion
    assert torch.equal(F.morphology(torch.ones(1, 4, 4, 3), "erode", 3), torch.ones(1, 4, 4, 3))
    # even kernel: kornia's origin is k//2, so the window spans 2 before and 1 after; the output
    # at p is the max over p−2..p+1 and the dot at 2 reaches outputs 1..4
    d4 = F.morphology(dot, "dilate", 4)[0, :, :, 0]
    e4 = torch.zeros(5, 5)
    e4[1:5, 1:5] = 1
    assert torch.equal(d4, e4)


def test_hysteresis_keeps_weak_chains_touching_strong_pixels():
    e = torch.tensor([[1.0, 0.5, 0.5, 0.0, 0.0, 0.5],
                      [0.0, 0.0, 0.0, 0.5, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])[None, None]
    out = F.hysteresis(e)[0, 0]
    expect = torch.tensor([[1.0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert torch.equal(out, expect)  # the diagonal link counts; the isolated weak pixel drops


def test_canny_finds_both_sides_of_a_bright_line_and_nothing_in_flat_areas():
    img = torch.zeros(1, 12, 12, 3)
    img[:, :, 6, :] = 1.0  # a vertical white line at column 6
    mag, edges = F.canny(img, 0.1, 0.2)
    edges = edges[0, 0]
    assert edges.shape == (12, 12)
    cols = edges.sum(0)
    assert cols[5] == 12 and cols[7] == 12  # the steepest gradient is beside the line, every row
    assert cols[6] == 0  # on the line itself the gradient vanishes
    assert cols[:4].sum() == 0 and cols[9:].sum() == 0
    # hand value of the magnitude at column 5: grey = 1 on the line; after the 5-tap Gaussian
    # (σ = 1) the row is g(c − 6); Sobel x at column 5 is 4·(b(6) − b(4)) (rows are constant)
    g = torch.exp(-torch.arange(-2, 3, dtype=torch.float32) ** 2 / 2)
    g = g / g.sum()
    b6, b4 = g[2], g[0]
    assert torch.allclose(mag[0, 0, 6, 5], torch.sqrt((4 * (b6 - b4)) ** 2 + 1e-6), rtol=1e-5)
    # a dim line (0.2: magnitude ≈ 0.28) is below both thresholds: nothing; with only the low
    # threshold passed and no strong pixel, hysteresis drops every weak pixel too
    assert F.canny(img * 0.2, 0.5, 0.6)[1].sum() == 0
    assert F.canny(img * 0.2, 0.1, 0.9)[1].sum() == 0


def test_canny_node_output_is_three_channel_image():
    from mixgraph.nodes.declare.image.image_filter_nodes import Canny
    img = torch.zeros(2, 8, 8, 3)
    img[:, 2:6, 2:6] = 1.0
    (out,) = Canny(img, 0.2, 0.5)
    assert out.shape == (2, 8, 8, 3) and torch.equal(out[..., 0], out[..., 2])
    assert set(out.unique().tolist()) <= {0.0, 1.0} and out.sum() > 0


def test_image_add_noise_matches_cpu_seeded_randn():
    img = torch.full((1, 3, 4, 3), 0.5)
    out = F.add_noise(img, 7, 0.1)
    ref = torch.clip(img + 0.1 * torch.randn(img.size(), generator=torch.Generator().manual_seed(7)), 0, 1)
    assert torch.equal(out, ref)
    assert torch.equal(F.add_noise(img, 7, 0.0), img)
    assert float(F.add_noise(img, 1, 1.0).min()) >= 0.0 and float(F.add_noise(img, 1, 1.0).max()) <= 1.0


def test_porter_duff_spec_and_hand_values():
    p = INFO["PorterDuffImageComposite"]
    assert p["input_order"]["required"] == ["source", "source_alpha", "destination", "destination_alpha", "mode"]
    assert p["input"]["required"]["mode"][0] == list(F.PORTER_DUFF_MODES) and len(F.PORTER_DUFF_MODES) == 18
    assert p["input"]["required"]["mode"][1]["default"] == "DST"
    assert p["output"] == ["IMAGE", "MASK"] and p["category"] == "mask/compositing"
    one = lambda v: torch.full((1, 1, 1), float(v))  # noqa: E731  [H, W, 1]
    # source colour 0.8 with alpha 0.5 (mask 0.5) over destination 0.2 with alpha 1 (mask 0):
    # premultiplied 0.4 + (1 − 0.5)·0.2 = 0.5, alpha 1 -> colour 0.5, mask 0
    c, m = F.porter_duff(one(0.8), one(0.5), one(0.2), one(0.0), "SRC_OVER")
    assert float(c) == 0.5 and float(m) == 0.0
    # SRC_IN: alpha 0.5·1, colour 0.4·1 / 0.5 = 0.8
    c, m = F.porter_duff(one(0.8), one(0.5), one(0.2), one(0.0), "SRC_IN")
    assert abs(float(c) - 0.8) < 1e-6 and float(m) == 0.5
    c, m = F.porter_duff(one(0.8), one(0.5), one(0.2), one(0.0), "CLEAR")
    assert float(c) == 0.0 and float(m) == 1.0
    # XOR of two opaque layers is fully transparent
    c, m = F.porter_duff(one(0.8), one(0.0), one(0.2), one(0.0), "XOR")
    assert float(c) == 0.0 and float(m) == 1.0


def test_porter_duff_node_resizes_source_to_destination():
    from mixgraph.nodes.declare.image.image_filter_nodes import PorterDuffImageComposite
    src = torch.full((2, 4, 4, 3), 0.6)
    dst = torch.full((1, 8, 8, 3), 0.3)
    img, mask = PorterDuffImageComposite(src, torch.zeros(2, 4, 4), dst, torch.zeros(1, 8, 8), "SRC")
    assert img.shape == (1, 8, 8, 3) and mask.shape == (1, 8, 8)
    assert torch.allclose(img, torch.full_like(img, 0.6), atol=1e-5)
    img, _ = PorterDuffImageComposite(src, torch.zeros(2, 4, 4), dst, torch.zeros(1, 8, 8), "DST")
    assert torch.allclose(img, dst)


def test_stitch_and_resize_pad_specs():
    s = INFO["ImageStitch"]
    assert s["input_order"] == {"required": ["image1", "direction", "match_image_size", "spacing_width",
                                             "spacing_color"], "optional": ["image2"]}
    r = s["input"]["required"]
    assert r["direction"][0] == ["right", "down", "left", "up"]  # default: the first option
    assert r["match_image_size"] == ["BOOLEAN", {"default": True}]
    assert r["spacing_width"] == ["INT", {"default": 0, "min": 0, "max": 1024, "step": 2}]
    assert r["spacing_color"][0] == ["white", "black", "red", "green", "blue"]
    assert s["category"] == "image/transform" and s["display_name"] == "Image Stitch"
    p = INFO["ResizeAndPadImage"]
    assert p["input_order"]["required"] == ["image", "target_width", "target_height", "padding_color",
                                            "interpolation"]
    assert p["input"]["required"]["interpolation"][0] == ["area", "bicubic", "nearest-exact", "bilinear", "lanczos"]
    assert p["input"]["required"]["target_width"][1]["default"] == 512 and p["category"] == "image/transform"


def test_stitch_layouts_spacing_and_padding():
    a = torch.full((1, 2, 3, 3), 0.2)
    b = torch.full((2, 4, 2, 3), 0.7)
    assert torch.equal(F.stitch(a, "right", True, 0, "white"), a)  # no image2
    # no size matching, right: heights 2 and 4 -> a centred in white (1.0) padding; batch 2
    out = F.stitch(a, "right", False, 0, "white", b)
    assert out.shape == (2, 4, 5, 3)
    assert torch.equal(out[:, 1:3, :3], torch.full((2, 2, 3, 3), 0.2))
    assert torch.equal(out[:, 0, :3], torch.ones(2, 3, 3)) and torch.equal(out[:, :, 3:], torch.full((2, 4, 2, 3), 0.7))
    # left with a red spacer of 3 -> widened to 4; image2 first; padding black for a colour
    out = F.stitch(a, "left", False, 3, "red", b)
    assert out.shape == (2, 4, 2 + 4 + 3, 3)
    assert torch.equal(out[0, 0, 2:6], torch.tensor([[1.0, 0.0, 0.0]] * 4))
    assert torch.equal(out[:, 0, 6:], torch.zeros(2, 3, 3))
    # up with size matching: image2 resized to image1's width 3, height int(3 / (2/4)) = 6
    out = F.stitch(a, "up", True, 0, "white", b)
    assert out.shape == (2, 6 + 2, 3, 3) and torch.allclose(out[:, 6:], torch.full((2, 2, 3, 3), 0.2))
    # RGB + RGBA: the RGB image gets alpha 1
    out = F.stitch(a, "down", False, 0, "black", torch.zeros(1, 1, 3, 4))
    assert out.shape == (1, 3, 3, 4) and torch.equal(out[0, :2, :, 3], torch.ones(2, 3))


def test_resize_and_pad_centres_the_scaled_image():
    img = torch.full((1, 2, 4, 3), 0.5)  # 4 wide, 2 high -> 8×4 inside 8×8: rows 2..5
    out = F.resize_and_pad(img, 8, 8, "black", "nearest-exact")
    assert out.shape == (1, 8, 8, 3)
    assert torch.equal(out[0, 2:6], torch.full((4, 8, 3), 0.5))
    assert torch.equal(out[0, :2], torch.zeros(2, 8, 3)) and torch.equal(out[0, 6:], torch.zeros(2, 8, 3))
    assert float(F.resize_and_pad(img, 8, 8, "white", "area")[0, 0, 0, 0]) == 1.0


def test_save_animated_webp_and_png_frames_and_metadata(tmp_path):
    import json

    from PIL import Image

    from mixgraph.nodes.helpers import image_animation as A
    frames = torch.stack([torch.full((4, 6, 3), v) for v in (0.0, 0.5, 1.0)])
    (w,) = A.save_animated_webp(frames, tmp_path, "anim/x", 4.0, True, 80, "default", prompt={"1": {}},
                                extra_pnginfo={"workflow": {"a": 1}})
    assert w == {"filename": "x_00001_.webp", "subfolder": "anim", "type": "output"}
    with Image.open(tmp_path / "anim" / w["filename"]) as im:
        assert im.n_frames == 3 and im.size == (6, 4)
        exif = im.getexif()
        assert exif[0x0110] == 'prompt:{"1": {}}' and exif[0x010F] == 'workflow:{"a": 1}'
        im.seek(1)
        assert im.convert("RGB").getpixel((0, 0)) == (127, 127, 127)  # lossless, 0.5·255 truncated
    (p,) = A.save_animated_png(frames, tmp_path, "anim/x", 4.0, 4, prompt={"1": {}})
    assert p["filename"] == "x_00002_.png"  # the counter runs over every extension, as ComfyUI
    raw = (tmp_path / "anim" / p["filename"]).read_bytes()
    assert b"comf" + b"prompt\0" + json.dumps({"1": {}}).encode() in raw
    with Image.open(tmp_path / "anim" / p["filename"]) as im:
        assert im.n_frames == 3 and im.info.get("duration") == 250
    (again,) = A.save_animated_png(frames, tmp_path, "anim/x", 4.0, 4)
    assert again["filename"] == "x_00003_.png"


def test_image_filter_nodes_in_a_workflow(tmp_path):
    g = api.Graph()
    a = g.add("EmptyImage", width=16, height=8, batch_size=2, color=0x808080)
    b = g.add("EmptyImage", width=8, height=8, batch_size=1, color=0xFFFFFF)
    s = g.add("ImageStitch", image1=a, direction="right", match_image_size=True, spacing_width=2,
              spacing_color="black", image2=b)
    s = g.add("Morphology", image=s, operation="dilate", kernel_size=3)
    s = g.add("ImageAddNoise", image=s, seed=3, strength=0.1)
    c = g.add("Canny", image=s, low_threshold=0.4, high_threshold=0.8)
    g.add("SaveAnimatedWEBP", images=c, filename_prefix="w", fps=6.0, lossless=True, quality=80, method="default")
    g.add("SaveAnimatedPNG", images=s, filename_prefix="p", fps=6.0, compress_level=4)
    out = api.run(g, output=tmp_path)
    assert out[s.node_id][0].shape == (2, 8, 26, 3)
    assert (tmp_path / "w_00001_.webp").is_file() and (tmp_path / "p_00001_.png").is_file()


def test_load_image_output_reads_plain_and_annotated_names(tmp_path):
    from PIL import Image
    out_dir = tmp_path / "out"
    (out_dir / "sub").mkdir(parents=True)
    Image.new("RGB", (5, 3), (255, 0, 0)).save(out_dir / "sub" / "r.png")
    spec = INFO["LoadImageOutput"]
    opts = spec["input"]["required"]["image"][1]
    assert opts["image_upload"] is True and opts["image_folder"] == "output"
    assert opts["remote"] == {"route": "/internal/files/output", "refresh_button": True,
                              "control_after_refresh": "first"}
    assert spec["display_name"] == "Load Image (from Outputs)" and spec["output"] == ["IMAGE", "MASK"]
    for name in ("sub/r.png [output]", "sub/r.png"):
        g = api.Graph()
        img = g.add("LoadImageOutput", image=name)
        g.add("PreviewImage", images=img[0])
        res = api.run(g, output=out_dir)
        assert res[img.node_id][0].shape == (1, 3, 5, 3) and float(res[img.node_id][0][0, 0, 0, 0]) == 1.0
    g = api.Graph()
    g.add("PreviewImage", images=g.add("LoadImageOutput", image="missing.png [output]")[0])
    from mixgraph.graph.executor import ValidationFailed
    with pytest.raises(ValidationFailed, match="Invalid image file: missing.png"):
        api.run(g, output=out_dir)
