"""SDPoseKeypointExtractor (ComfyUI nodes_sdpose.py 47e4a90; the heatmap head of ComfyUI's SDPose
module; detection in comfy/model_detection.py 0b61ce5): loader detection of a tiny SDPose UNet
(Lotus + heatmap head, seeded random weights in the real key layout), heatmap decoding against
hand-made heatmaps, the neck insertion and MMPose→OpenPose remap against hand values, and the
extractor's frames (full-image batches and bbox crops)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.helpers import sdpose_extract
from mixgraph.nodes.models import loader
from mixgraph.nodes.families.sd import lotus, sdpose
from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict
from tests.fixtures.checkpoints import write_vae
from tests.fixtures.tiny_unet import tiny_unet_state_dict

F32 = parse_spec("f32")
HEAD_CFG = sdpose.HeatmapHeadConfig(in_channels=128, out_channels=133, deconv=((16, 4),), conv=((16, 1),),
                                    final_kernel=1)


def write_sdpose(path, seed=0):
    unet = tiny_unet_state_dict("lotus", seed)
    head = random_state_dict(module_shapes(lambda: sdpose.HeatmapHead(HEAD_CFG)), seed + 1)
    save_file({**unet, **{"heatmap_head." + k: v for k, v in head.items()}}, str(path))
    return head


def gaussian(h, w, cx, cy, sigma=2.0, peak=1.0):
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    return (peak * np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma ** 2))).astype(np.float32)


def test_sdpose_unet_loader_detects_the_heatmap_head(tmp_path):
    write_sdpose(tmp_path / "sdpose.safetensors")
    m = loader.load_unet(tmp_path / "sdpose.safetensors")
    assert m.parts.task_embedding == lotus.task_embedding() and m.prediction == "img_to_img"   # a Lotus UNet
    assert m.parts.heatmap_head is not None
    cfg = m.parts.heatmap_head.config
    assert (cfg.in_channels, cfg.out_channels, cfg.deconv, cfg.conv, cfg.final_kernel) == (128, 133, ((16, 4),),
                                                                                        ((16, 1),), 1)
    assert cfg.input_size == (768, 1024) and cfg.heatmap_size == (192, 256)   # ComfyUI's fixed sizes
    plain = tmp_path / "lotus.safetensors"
    save_file(tiny_unet_state_dict("lotus", 0), str(plain))
    assert loader.load_unet(plain).parts.heatmap_head is None


def test_sdpose_head_module_loads_the_files_weights(tmp_path):
    head = write_sdpose(tmp_path / "sdpose.safetensors", seed=4)
    m = loader.load_unet(tmp_path / "sdpose.safetensors").parts.heatmap_head.module(F32)
    ref = sdpose.HeatmapHead(HEAD_CFG)
    ref.load_state_dict(head)
    x = torch.randn(2, 128, 6, 5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = m(x)
        assert out.shape == (2, 133, 12, 10)
        assert torch.allclose(out, ref(x), atol=1e-5)


def test_sdpose_decode_heatmaps_integer_and_subpixel_peaks():
    h, w = 24, 32
    hms = np.zeros((1, 3, h, w), np.float32)
    hms[0, 0] = gaussian(h, w, 10.0, 7.0, peak=0.8)   # on a pixel: refinement keeps it
    hms[0, 1] = gaussian(h, w, 20.4, 12.7)            # between pixels: refinement finds it
    hms[0, 2] = -1.0                                  # no positive value: invalid
    kps, scs = sdpose.decode_heatmaps(hms)
    kp, sc = kps[0], scs[0]
    assert kp.shape == (3, 2) and sc.shape == (3,)
    assert np.allclose(kp[0], [10.0, 7.0], atol=1e-3) and sc[0] == pytest.approx(0.8)
    assert np.allclose(kp[1], [20.4, 12.7], atol=0.1)
    assert abs(kp[1, 0] - 20.4) < abs(20.0 - 20.4) and abs(kp[1, 1] - 12.7) < abs(13.0 - 12.7)
    assert kp[2].tolist() == [-1.0, -1.0] and sc[2] == -1.0


def test_sdpose_decode_heatmaps_scales_to_the_input_size():
    cfg = dataclasses.replace(HEAD_CFG, input_size=(64, 48))   # heatmap 16 x 12
    hms = gaussian(12, 16, 8.0, 6.0)[None, None]
    kps, _ = sdpose.decode_heatmaps(hms, cfg)
    assert np.allclose(kps[0][0], [8.0 * 63 / 15, 6.0 * 47 / 11], atol=2e-2)   # (input − 1)/(heatmap − 1)


def test_sdpose_preprocess_inserts_the_neck_and_remaps_to_openpose():
    kp = np.array([[float(i), float(100 + i)] for i in range(133)], np.float32)
    sc = np.full(133, 0.9, np.float32)
    sc[5], sc[6] = 0.5, 0.7
    out_kp, out_sc = sdpose.preprocess_keypoints(kp, sc)
    assert out_kp.shape == (134, 2)
    assert out_kp[1].tolist() == [5.5, 105.5] and out_sc[1] == pytest.approx(0.5)   # neck
    # OpenPose 2..4 = right shoulder/elbow/wrist = MMPose 6, 8, 10; 14/15 = eyes MMPose 2/1
    assert [out_kp[i, 0] for i in (0, 2, 3, 4, 5, 6, 7, 14, 15, 16, 17)] == [0, 6, 8, 10, 5, 7, 9, 2, 1, 4, 3]
    assert [out_kp[i, 0] for i in (8, 9, 10, 11, 12, 13)] == [12, 14, 16, 11, 13, 15]
    assert out_kp[18, 0] == 17 and out_kp[133, 0] == 132   # the rest shifted by the inserted neck
    sc[6] = 0.3   # not above the threshold: no neck score
    assert sdpose.preprocess_keypoints(kp, sc)[1][1] == 0.0


def test_sdpose_openpose_frames_split_134_keypoints():
    kp = np.array([[float(i), 0.0] for i in range(133)], np.float32)
    frames = sdpose.to_openpose_frames([[kp]], [[np.ones(133, np.float32)]], 40, 50)
    assert frames[0]["canvas_width"] == 50 and frames[0]["canvas_height"] == 40
    p = frames[0]["people"][0]
    sizes = {k: len(v) // 3 for k, v in p.items()}
    assert sizes == {"pose_keypoints_2d": 18, "foot_keypoints_2d": 6, "face_keypoints_2d": 70,
                     "hand_right_keypoints_2d": 21, "hand_left_keypoints_2d": 21}
    assert p["foot_keypoints_2d"][0] == 17.0 and p["face_keypoints_2d"][0] == 23.0   # MMPose 17, 23
    assert p["face_keypoints_2d"][68 * 3] == 2.0 and p["face_keypoints_2d"][69 * 3] == 1.0   # eyes


def test_sdpose_remap_keypoints_back_to_image_pixels():
    kp = np.array([[30.0, 20.0], [-1.0, -1.0]], np.float32)
    out = sdpose_extract.remap_keypoints(kp, 2.0, 4.0, 10, 5)
    assert out.tolist() == [[25.0, 10.0], [-1.0, -1.0]]


def _small_handle(tmp_path):
    write_sdpose(tmp_path / "sdpose.safetensors", seed=2)
    m = loader.load_unet(tmp_path / "sdpose.safetensors")
    small = dataclasses.replace(m.parts.heatmap_head.config, input_size=(64, 48))   # latent 6 x 8: a cheap test
    head = dataclasses.replace(m.parts.heatmap_head, config=small)
    return dataclasses.replace(m, parts=dataclasses.replace(m.parts, heatmap_head=head))


def test_sdpose_extractor_full_image_batches(tmp_path):
    write_vae(tmp_path / "vae.safetensors")
    vae = loader.load_vae(tmp_path / "vae.safetensors")
    model = _small_handle(tmp_path)
    image = torch.rand(3, 40, 50, 3, generator=torch.Generator().manual_seed(1))
    done = []
    frames = sdpose_extract.extract(model, vae, image, 2, None, F32, F32, done.append)
    assert done == [2, 1] and len(frames) == 3
    for f in frames:
        assert (f["canvas_width"], f["canvas_height"]) == (50, 40) and len(f["people"]) == 1
        pose = np.array(f["people"][0]["pose_keypoints_2d"]).reshape(18, 3)
        assert np.all(np.isfinite(pose)) and np.all(pose[pose[:, 0] < 0, :2] == -1)
    again = sdpose_extract.extract(model, vae, image[:1], 16, None, F32, F32)
    assert np.allclose(again[0]["people"][0]["pose_keypoints_2d"], frames[0]["people"][0]["pose_keypoints_2d"],
                       atol=0.05)   # batched vs alone: float noise, amplified by the Newton step


def test_sdpose_extractor_bbox_mode_crops(tmp_path):
    write_vae(tmp_path / "vae.safetensors")
    vae = loader.load_vae(tmp_path / "vae.safetensors")
    model = _small_handle(tmp_path)
    image = torch.rand(2, 40, 50, 3, generator=torch.Generator().manual_seed(3))
    boxes = [[{"x": 10, "y": 5, "width": 20, "height": 30}, {"x": 45, "y": 0, "width": 0, "height": 10}]]
    frames = sdpose_extract.extract(model, vae, image, 16, boxes, F32, F32)
    assert [len(f["people"]) for f in frames] == [1, 1]   # degenerate box skipped, last list reused
    pose = np.array(frames[0]["people"][0]["pose_keypoints_2d"]).reshape(18, 3)
    assert np.all(np.isfinite(pose))
    # the crop run equals a full-image run on the cropped pixels, shifted by the box origin
    crop = sdpose_extract.extract(model, vae, image[:1, 5:35, 10:30], 16, None, F32, F32)
    ref = np.array(crop[0]["people"][0]["pose_keypoints_2d"]).reshape(18, 3)
    shifted = ref.copy()
    ok = ref[:, 0] >= 0
    shifted[ok, 0] += 10
    shifted[ok, 1] += 5
    assert np.allclose(pose, shifted, atol=1e-3)


def test_sdpose_extractor_refuses_a_model_without_heatmap_head(tmp_path):
    save_file(tiny_unet_state_dict("lotus", 0), str(tmp_path / "lotus.safetensors"))
    m = loader.load_unet(tmp_path / "lotus.safetensors")
    with pytest.raises(ValueError, match="does not have a heatmap_head"):
        sdpose_extract.extract(m, None, torch.zeros(1, 8, 8, 3), 1, None, F32, F32)
