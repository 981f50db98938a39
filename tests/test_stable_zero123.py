"""Stable Zero123 (ImageOnlyCheckpointLoader, StableZero123_Conditioning[_Batched]) on a tiny seeded
checkpoint in the real single-file layout: detection, the camera numbers against hand-computed
values, the conds and latents the nodes give, the camera projection and the view latent in the
UNet call against a UNet built by hand from the file's tensors, and a ComfyUI API workflow run
through the executor. SV3D (a video model) and SVD files are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

from mixgraph.graph.executor import ValidationFailed
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.families.sd import zero123
from mixgraph.nodes.encoders.clip_vision_handle import load_clip_vision
from mixgraph.nodes.families.refused import UnsupportedFamilyError
from mixgraph.nodes.families.sd.unet import UNetModel, unet_config_from_state_dict
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CondDenoiser, ModelSampling
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_zero123 import CONTEXT, EMBED, stable_zero123_state_dict, write_stable_zero123

F32 = parse_spec("f32")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero123")
    parts = write_stable_zero123(root / "models" / "checkpoints" / "stable_zero123.safetensors", seed=3)
    write_sd15(root / "models" / "checkpoints" / "sd15.safetensors", seed=4)
    (root / "models" / "clip_vision").mkdir()
    save_file({k: v.contiguous() for k, v in parts["vision"].items()},  # the same tower, HF layout
              str(root / "models" / "clip_vision" / "same_tower.safetensors"))
    rng = np.random.default_rng(5)
    (root / "input").mkdir()
    Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(root / "input" / "view.png")
    return root, parts


def _ckpt(models):
    return models[0] / "models" / "checkpoints" / "stable_zero123.safetensors"


# --- camera numbers ---------------------------------------------------------------------------


def test_camera_embeddings_are_polar_change_sin_cos_azimuth_and_radius():
    cams = zero123.camera_embeddings([30.0, -90.0], [45.0, 180.0])
    assert cams.shape == (2, 1, 4) and cams.dtype == torch.float32
    expected = torch.tensor([[[-math.pi / 6, math.sqrt(0.5), math.sqrt(0.5), math.pi / 2]],
                             [[math.pi / 2, 0.0, -1.0, math.pi / 2]]])
    torch.testing.assert_close(cams, expected, rtol=0, atol=2e-7)


def test_camera_embeddings_polar_uses_comfyuis_float32_order():
    # (90 - 0.1) - 90 in float32 is -0.0999985: ComfyUI's number, not -0.1
    polar = zero123.camera_embeddings([0.1], [0.0])[0, 0, 0]
    assert polar.item() == pytest.approx(math.radians(-0.09999847412109375), abs=1e-9)


def test_batch_cameras_add_one_increment_per_image():
    elevations, azimuths = zero123.batch_cameras(10.0, -170.0, 4, 5.0, 20.0)
    assert elevations == [10.0, 15.0, 20.0, 25.0]
    assert azimuths == [-170.0, -150.0, -130.0, -110.0]  # not wrapped: sin/cos see the same angle
    assert zero123.batch_cameras(1.0, 2.0, 1, 9.0, 9.0) == ([1.0], [2.0])


# --- detection --------------------------------------------------------------------------------


def test_image_only_loader_detects_stable_zero123(models):
    model, vision, vae = loader.load_image_only_checkpoint(_ckpt(models))
    assert model.kind == "sd1" and model.prediction == "eps" and model.latent_format.scale_factor == 0.18215
    assert model.config.in_channels == 8 and model.config.context_dim == CONTEXT
    assert model.parts.cc_projection.config == zero123.CameraProjectionConfig(EMBED + 4, CONTEXT)
    assert vision.source.prefix == "cond_stage_model.model.visual." and vision.config.projection_dim == EMBED
    assert vae is not None and vae.source.prefix == "first_stage_model."


def test_checkpoint_loader_gives_the_zero123_model_and_no_text_encoder(models):
    # cond_stage_model.model.* is the CLIP model, not SD2's text encoder (ComfyUI: clip None)
    model, clip, vae = loader.load_checkpoint(_ckpt(models))
    assert clip is None and vae is not None
    assert model == loader.load_image_only_checkpoint(_ckpt(models))[0]


def test_image_only_loader_refuses_other_checkpoints(models, tmp_path):
    with pytest.raises(UnsupportedFamilyError, match=r"no Stable Zero123 camera projection .*\(SVD img2vid, SV3D\) are not supported yet"):
        loader.load_image_only_checkpoint(models[0] / "models" / "checkpoints" / "sd15.safetensors")
    sd, _ = stable_zero123_state_dict(seed=1)
    sd["model.diffusion_model.input_blocks.1.0.time_stack.in_layers.0.weight"] = torch.ones(32)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "svd.safetensors"))
    with pytest.raises(UnsupportedFamilyError, match="model family Stable Video Diffusion .* is not supported"):
        loader.load_image_only_checkpoint(tmp_path / "svd.safetensors")


def test_image_only_loader_refuses_a_bad_projection(tmp_path):
    sd, _ = stable_zero123_state_dict(seed=1)
    sd["cc_projection.weight"] = torch.ones(CONTEXT + 1, EMBED + 4)
    sd["cc_projection.bias"] = torch.ones(CONTEXT + 1)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="cc_projection gives 33-wide context; the UNet attends to 32"):
        loader.load_image_only_checkpoint(tmp_path / "bad.safetensors")


def test_model_save_keeps_the_camera_projection(models, tmp_path):
    from mixgraph.nodes.weights import save

    model, _vision, vae = loader.load_image_only_checkpoint(_ckpt(models))
    sd = save.checkpoint_state_dict(model, None, vae)
    assert torch.equal(sd["cc_projection.weight"], models[1]["cc"]["weight"])
    assert torch.equal(sd["cc_projection.bias"], models[1]["cc"]["bias"])
    save.write_safetensors(tmp_path / "resaved.safetensors", sd)
    again, clip, _vae = loader.load_checkpoint(tmp_path / "resaved.safetensors")
    assert clip is None and again.parts.cc_projection.config == model.parts.cc_projection.config


# --- the conditioning nodes -------------------------------------------------------------------


def _conditioning_graph(node="StableZero123_Conditioning", **inputs):
    g = api.Graph(precision="f32")
    ck = g.add("ImageOnlyCheckpointLoader", ckpt_name="stable_zero123.safetensors")
    cond = g.add(node, clip_vision=ck[1], init_image=g.add("LoadImage", image="view.png"), vae=ck[2], **inputs)
    g.add("PreviewAny", source=cond[0])
    return g, ck, cond


def _run(g, models, tmp_path):
    root = models[0]
    return api.run(g, models=root / "models", input=root / "input", output=tmp_path / "out")


def test_stable_zero123_conditioning_outputs(models, tmp_path):
    g, ck, node = _conditioning_graph(width=48, height=32, batch_size=3, elevation=30.0, azimuth=45.0)
    out = _run(g, models, tmp_path)
    _model, vision, vae = out[ck.node_id]
    (pos,), (neg,), latent = out[node.node_id]
    # the checkpoint's tower is the same tower as a standalone clip_vision file of its weights
    image = torch.from_numpy(np.asarray(Image.open(models[0] / "input" / "view.png"), np.float32) / 255.0)[None]
    alone = load_clip_vision(models[0] / "models" / "clip_vision" / "same_tower.safetensors")
    embeds = alone.encode(image, F32, crop=True).image_embeds  # [1, EMBED]
    camera = torch.tensor([-math.pi / 6, math.sqrt(0.5), math.sqrt(0.5), math.pi / 2])
    assert pos.cross_attn.shape == (1, 1, EMBED + 4)
    torch.testing.assert_close(pos.cross_attn[0, 0, :EMBED], embeds[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pos.cross_attn[0, 0, EMBED:], camera, rtol=0, atol=2e-7)
    # init image 56x40 -> centre crop towards 3:2: round((40 - 40·1.4/1.5)/2) = 1 row off each side
    # (ComfyUI common_upscale "center") -> bilinear 48x32 -> VAE
    cropped = image.movedim(-1, 1)[:, :, 1:39, :]
    pixels = F.interpolate(cropped, size=(32, 48), mode="bilinear", align_corners=False).movedim(1, -1)
    with torch.inference_mode():  # the run filled the weight store with inference tensors
        reference = vae.encode(pixels, F32)
    torch.testing.assert_close(pos.concat_latent, reference, rtol=1e-5, atol=1e-5)
    assert pos.concat_latent.shape == (1, 4, 4, 6)
    assert torch.equal(neg.cross_attn, torch.zeros(1, 1, EMBED))
    assert torch.equal(neg.concat_latent, torch.zeros(1, 4, 4, 6))
    assert torch.equal(latent.samples, torch.zeros(3, 4, 4, 6)) and latent.batch_index is None


def test_stable_zero123_batched_conditioning_gives_one_camera_per_image(models, tmp_path):
    g, _ck, node = _conditioning_graph("StableZero123_Conditioning_Batched", width=32, height=32, batch_size=3,
                                       elevation=0.0, azimuth=-90.0, elevation_batch_increment=15.0,
                                       azimuth_batch_increment=90.0)
    (pos,), (neg,), latent = _run(g, models, tmp_path)[node.node_id]
    assert pos.cross_attn.shape == (3, 1, EMBED + 4)
    assert torch.equal(pos.cross_attn[0, :, :EMBED], pos.cross_attn[2, :, :EMBED])  # one image embedding
    expected = torch.tensor([[0.0, -1.0, 0.0, math.pi / 2],
                             [-math.radians(15.0), 0.0, 1.0, math.pi / 2],
                             [-math.radians(30.0), 1.0, 0.0, math.pi / 2]])
    torch.testing.assert_close(pos.cross_attn[:, 0, EMBED:], expected, rtol=0, atol=3e-7)
    assert neg.cross_attn.shape == (1, 1, EMBED)
    assert latent.samples.shape == (3, 4, 4, 4) and latent.batch_index == (0, 0, 0)


def test_stable_zero123_conditioning_takes_one_init_image(models):
    model, vision, vae = loader.load_image_only_checkpoint(_ckpt(models))
    with pytest.raises(ValueError, match="input 'init_image': Stable Zero123 conditions on one image"):
        zero123.conditioning(vision, vae, torch.rand(2, 16, 16, 3), 32, 32, 1, [0.0], [0.0], F32, F32)


def test_sv3d_conditioning_is_refused_at_validation(models, tmp_path):
    g, _ck, _node = _conditioning_graph("SV3D_Conditioning", width=32, height=32, video_frames=4, elevation=0.0)
    with pytest.raises(ValidationFailed, match="model family SV3D .* is not supported"):
        _run(g, models, tmp_path)


def test_image_only_loader_refuses_an_sd_checkpoint_at_validation(models, tmp_path):
    g = api.Graph()
    ck = g.add("ImageOnlyCheckpointLoader", ckpt_name="sd15.safetensors")
    g.add("PreviewAny", source=ck[1])
    with pytest.raises(ValidationFailed, match="no Stable Zero123 camera projection"):
        _run(g, models, tmp_path)


# --- the UNet path ----------------------------------------------------------------------------


def _reference_unet(parts):
    unet = UNetModel(unet_config_from_state_dict(parts["unet"])).eval()
    unet.load_state_dict(parts["unet"])
    return unet


def test_cc_projection_and_view_latent_reach_the_unet(models):
    """One evaluation through the sampler's denoiser against the UNet built by hand from the
    file's tensors: context = cc_projection(cond), input = cat(c_in·x, view latent)."""
    _root, parts = models
    model, _vision, _vae = loader.load_image_only_checkpoint(_ckpt(models))
    with torch.inference_mode():  # as the sampler node does: the weight store keeps inference tensors
        runner = model.runner(F32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 4, 4, generator=gen)
    view = torch.randn(1, 4, 4, 4, generator=gen)
    cams = zero123.camera_embeddings([20.0, -10.0], [30.0, 120.0])  # [2, 1, 4]
    embed = torch.randn(1, 1, EMBED, generator=gen)
    cond = Cond(cross_attn=torch.cat([embed.expand(2, -1, -1), cams], dim=-1), concat_latent=view)
    neg = Cond(cross_attn=torch.zeros(1, 1, EMBED), concat_latent=torch.zeros_like(view))
    sigma = torch.tensor([3.0])
    with torch.inference_mode():
        d = CondDenoiser(runner, [(cond,), (neg,)], [False, True], x)
        got_pos, got_neg = d.calc_cond_batch(d.lists, x, sigma)

    ms, unet = ModelSampling("eps"), _reference_unet(parts)
    c_in, t = ms.calculate_input(sigma, x), ms.timestep(sigma).float().expand(2)
    context = F.linear(cond.cross_attn, parts["cc"]["weight"], parts["cc"]["bias"])  # [2, 1, CONTEXT]
    with torch.inference_mode():
        eps = unet(torch.cat([c_in, view.expand(2, -1, -1, -1)], dim=1), t, context)
        eps_neg = unet(torch.cat([c_in, torch.zeros_like(c_in)], dim=1), t, torch.zeros(2, 1, CONTEXT))
    torch.testing.assert_close(got_pos, x - eps * 3.0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_neg, x - eps_neg * 3.0, rtol=1e-4, atol=1e-4)
    assert (got_pos[0] - got_pos[1]).abs().max() > 1e-3  # each image saw its own camera


def test_cc_projection_refuses_a_cond_of_another_width(models):
    model, _vision, _vae = loader.load_image_only_checkpoint(_ckpt(models))
    with torch.inference_mode():
        runner = model.runner(F32)
    with pytest.raises(ValueError, match=r"Stable Zero123: a conditioning 20 wide; .*\(36 wide"):
        with torch.inference_mode():
            runner.project_context(torch.zeros(1, 77, 20))
    plain = torch.ones(1, 77, CONTEXT)
    assert runner.project_context(plain) is plain


# --- a ComfyUI workflow -----------------------------------------------------------------------


WORKFLOW = {
    "1": {"class_type": "ImageOnlyCheckpointLoader", "inputs": {"ckpt_name": "stable_zero123.safetensors"}},
    "2": {"class_type": "LoadImage", "inputs": {"image": "view.png"}},
    "3": {"class_type": "StableZero123_Conditioning",
          "inputs": {"clip_vision": ["1", 1], "init_image": ["2", 0], "vae": ["1", 2], "width": 32, "height": 32,
                     "batch_size": 2, "elevation": 10.0, "azimuth": 30.0}},
    "4": {"class_type": "KSampler",
          "inputs": {"model": ["1", 0], "positive": ["3", 0], "negative": ["3", 1], "latent_image": ["3", 2],
                     "seed": 7, "steps": 3, "cfg": 4.0, "sampler_name": "euler", "scheduler": "sgm_uniform",
                     "denoise": 1.0}},
    "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["1", 2]}},
    "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "zero123"}},
}


def test_stable_zero123_api_workflow_runs_through_the_executor(models, tmp_path):
    root = models[0]
    result = api.run(WORKFLOW, models=root / "models", input=root / "input", output=tmp_path / "out")
    assert result.report.to_json()["status"] == "success"
    assert len(result.files) == 2
    for path in result.files:
        assert Image.open(path).size == (32, 32)
    image = result.outputs["5"][0]
    assert image.shape == (2, 32, 32, 3) and torch.isfinite(image).all()
    moved = api.run(WORKFLOW, set={"3.azimuth": -60.0}, models=root / "models", input=root / "input",
                    output=tmp_path / "out2").outputs["5"][0]
    assert (moved - image).abs().max() > 1e-4  # the camera steers the sample
