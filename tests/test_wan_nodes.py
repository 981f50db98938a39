"""The Wan latent and conditioning nodes (``nodes/declare/conditioning/wan_nodes.py``,
``nodes/declare/latent/video_latent_nodes.py``, the tensors in ``nodes/helpers/video/latent_ops.py``):
their specs as ComfyUI's, the tensors they build (checked with a stand-in video encoder that
records what it is given), and image-to-video / first-last-frame workflows through
``mixgraph.ui.api`` on tiny models. The Wan VAE is not used here: the workflows encode one frame
with the 16-channel KL VAE fixture as a stand-in (one pixel frame is one latent frame for both)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.helpers.video import latent_ops as ops
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.vision import ClipVisionOutput
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT, WAN22_LATENT
from mixgraph.nodes.weights.synthetic import TINY_VAE
from mixgraph.ui import api
from tests.fixtures.checkpoints import tiny_vae_state_dict
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_vision import write_clip_vision
from tests.fixtures.tiny_wan import TEXT_WIDTH, write_wan, write_wan_vace

INFO = api.default_registry().object_info()


def _nums(spec):
    return {k: spec[1][k] for k in ("default", "min", "max", "step") if k in spec[1]}


def test_specs_match_comfyui():
    e = INFO["EmptyHunyuanLatentVideo"]
    assert e["category"] == "latent/video" and e["output"] == ["LATENT"]
    req = e["input"]["required"]
    assert list(req) == ["width", "height", "length", "batch_size"]
    assert _nums(req["width"]) == dict(default=848, min=16, max=16384, step=16)
    assert _nums(req["height"]) == dict(default=480, min=16, max=16384, step=16)
    assert _nums(req["length"]) == dict(default=25, min=1, max=16384, step=4)
    assert _nums(req["batch_size"]) == dict(default=1, min=1, max=4096)
    t = INFO["TrimVideoLatent"]
    assert t["category"] == "latent/video" and list(t["input"]["required"]) == ["samples", "trim_amount"]
    assert _nums(t["input"]["required"]["trim_amount"]) == dict(default=0, min=0, max=99999)
    for name, length, opt in (("WanImageToVideo", 81, ["clip_vision_output", "start_image"]),
                              ("WanFunInpaintToVideo", 81, ["clip_vision_output", "start_image", "end_image"]),
                              ("WanFunControlToVideo", 81, ["clip_vision_output", "start_image", "control_video"]),
                              ("WanFirstLastFrameToVideo", 81, ["clip_vision_start_image", "clip_vision_end_image",
                                                                "start_image", "end_image"])):
        s = INFO[name]
        assert s["category"] == "conditioning/video_models"
        assert s["output"] == ["CONDITIONING", "CONDITIONING", "LATENT"]
        assert s["output_name"] == ["positive", "negative", "latent"]
        assert s["input_order"] == {"required": ["positive", "negative", "vae", "width", "height", "length",
                                                 "batch_size"], "optional": opt}
        req = s["input"]["required"]
        assert _nums(req["width"]) == dict(default=832, min=16, max=16384, step=16)
        assert _nums(req["height"]) == dict(default=480, min=16, max=16384, step=16)
        assert _nums(req["length"]) == dict(default=length, min=1, max=16384, step=4)
        assert [s["input"]["optional"][k][0] for k in opt] == [
            "CLIP_VISION_OUTPUT" if k.startswith("clip") else "IMAGE" for k in opt]
    v = INFO["WanVaceToVideo"]
    assert v["category"] == "conditioning/video_models"
    assert v["output"] == ["CONDITIONING", "CONDITIONING", "LATENT", "INT"]
    assert v["output_name"] == ["positive", "negative", "latent", "trim_latent"]
    assert v["input_order"] == {"required": ["positive", "negative", "vae", "width", "height", "length", "batch_size",
                                             "strength"], "optional": ["control_video", "control_masks",
                                                                       "reference_image"]}
    assert _nums(v["input"]["required"]["strength"]) == dict(default=1.0, min=0.0, max=1000.0, step=0.01)
    assert [v["input"]["optional"][k][0] for k in ("control_video", "control_masks", "reference_image")] == [
        "IMAGE", "MASK", "IMAGE"]
    w = INFO["Wan22ImageToVideoLatent"]
    assert w["category"] == "conditioning/inpaint" and w["output"] == ["LATENT"]
    assert w["input_order"] == {"required": ["vae", "width", "height", "length", "batch_size"],
                                "optional": ["start_image"]}
    req = w["input"]["required"]
    assert _nums(req["width"]) == dict(default=1280, min=32, max=16384, step=32)
    assert _nums(req["height"]) == dict(default=704, min=32, max=16384, step=32)
    assert _nums(req["length"]) == dict(default=49, min=1, max=16384, step=4)


class VideoEncoder:
    """A stand-in video VAE encode: [N, H, W, 3] -> [1, C, 1 + (N − 1) / 4, H/8, W/8], the mean
    of each latent frame's pixel frames per channel; records what it was given."""

    def __init__(self, channels: int = 16, downscale: int = 8):
        self.channels, self.downscale, self.seen = channels, downscale, []

    def __call__(self, pixels):
        self.seen.append(pixels)
        n, h, w, _ = pixels.shape
        groups = [pixels[:1]] + [pixels[i:i + 4] for i in range(1, n, 4)]
        frames = [g.mean(dim=(0, 3)) for g in groups]  # [H, W] per latent frame
        small = [torch.nn.functional.avg_pool2d(f[None, None], self.downscale)[0, 0] for f in frames]
        return torch.stack(small).unsqueeze(0).unsqueeze(0).repeat(1, self.channels, 1, 1, 1)


def _conds():
    return (Cond(torch.ones(1, 3, 4)),), (Cond(torch.zeros(1, 3, 4)),)


def test_image_to_video_tensors():
    enc = VideoEncoder()
    start = torch.rand(2, 40, 40, 3)
    vision = ClipVisionOutput(torch.zeros(1, 4), torch.zeros(1, 5, 8), torch.rand(1, 5, 8))
    pos, neg, latent = ops.image_to_video(*_conds(), enc, 32, 16, 9, 2, start, vision)
    assert latent.samples.shape == (2, 16, 3, 2, 4) and not latent.samples.any()
    (video,) = enc.seen
    assert video.shape == (9, 16, 32, 3)
    assert torch.allclose(video[:2], ops.fit_frames(start, 32, 16))
    assert torch.equal(video[2:], torch.full((7, 16, 32, 3), 0.5))
    for c in pos + neg:
        assert c.concat_latent.shape == (1, 16, 3, 2, 4)
        assert c.concat_mask.shape == (1, 1, 3, 2, 4)
        assert not c.concat_mask[:, :, 0].any() and c.concat_mask[:, :, 1:].all()
        assert c.model_inputs["clip_vision_output"] is vision
    # without a start image: the latent only; the CLIP output still reaches the conds
    pos, _, latent = ops.image_to_video(*_conds(), enc, 32, 16, 9, 1, None, vision)
    assert pos[0].concat_latent is None and pos[0].model_inputs["clip_vision_output"] is vision


def test_first_last_frame_tensors():
    enc = VideoEncoder()
    first, last = torch.zeros(1, 16, 32, 3), torch.ones(1, 16, 32, 3)
    a = ClipVisionOutput(torch.zeros(1, 4), torch.zeros(1, 5, 8), torch.rand(1, 5, 8))
    b = ClipVisionOutput(torch.zeros(1, 4), torch.zeros(1, 5, 8), torch.rand(1, 5, 8))
    pos, neg, latent = ops.first_last_frame_to_video(*_conds(), enc, 16, 8, 32, 16, 9, 1, first, last, a, b)
    assert latent.samples.shape == (1, 16, 3, 2, 4)
    (video,) = enc.seen
    assert torch.equal(video[0], first[0]) and torch.equal(video[-1], last[0])
    assert torch.equal(video[1:-1], torch.full((7, 16, 32, 3), 0.5))
    mask = pos[0].concat_mask
    assert mask.shape == (1, 4, 3, 2, 4)
    # pixel frames 0..3 (the first latent frame) kept, 4..10 generated, 11 (the last) kept
    assert not mask[:, :, 0].any() and mask[:, :, 1].all() and mask[:, :3, 2].all() and not mask[:, 3, 2].any()
    states = pos[0].model_inputs["clip_vision_output"].penultimate_hidden_states
    assert torch.equal(states, torch.cat([a.penultimate_hidden_states, b.penultimate_hidden_states], dim=1))
    _, _, _ = ops.first_last_frame_to_video(*_conds(), enc, 16, 8, 32, 16, 9, 1, None, None, None, b)


def test_vace_to_video_tensors():
    """WanVaceToVideo: the control video split by the mask into inactive / reactive frames (both
    encoded), a reference image's latent in front with 16 channels of process_out(0), the mask
    folded 8 x 8 into 64 channels per latent frame; lists appended on the conds; trim 1."""
    enc = VideoEncoder()
    video = torch.rand(5, 16, 32, 3)
    masks = torch.zeros(5, 16, 32)
    masks[:, :8] = 1.0  # the top half regenerated
    ref = torch.rand(1, 16, 32, 3)
    pos, neg, latent, trim = ops.vace_to_video(*_conds(), enc, 32, 16, 5, 1, 0.5, video, masks, ref)
    assert trim == 1 and latent.samples.shape == (1, 16, 3, 2, 4)
    ref_seen, inactive, reactive = enc.seen
    assert torch.allclose(inactive[:, :8], torch.full((5, 8, 32, 3), 0.5))  # masked rows: grey
    assert torch.allclose(inactive[:, 8:], video[:, 8:]) and torch.allclose(reactive[:, :8], video[:, :8])
    (frames,), (mask,), (strength,) = (pos[0].model_inputs[k] for k in ("vace_frames", "vace_mask", "vace_strength"))
    assert frames.shape == (1, 32, 3, 2, 4) and strength == 0.5
    assert torch.allclose(frames[:, 16:, :1], WAN21_LATENT.process_out(torch.zeros(1, 16, 1, 2, 4)))
    assert mask.shape == (1, 64, 3, 2, 4) and not mask[:, :, 0].any()
    assert mask[:, :, 1:, 0].all() and not mask[:, :, 1:, 1].any()  # top latent row regenerated
    # chained: a second node appends its inputs
    pos2, _, _, _ = ops.vace_to_video(pos, neg, enc, 32, 16, 5, 1, 1.0)
    assert len(pos2[0].model_inputs["vace_frames"]) == 2 and pos2[0].model_inputs["vace_strength"] == [0.5, 1.0]


def test_fun_control_tensors():
    enc = VideoEncoder()
    control, start = torch.rand(9, 16, 32, 3), torch.rand(1, 16, 32, 3)
    pos, neg, latent = ops.fun_control_to_video(*_conds(), enc, 32, 16, 9, 2, start, None, control)
    concat = pos[0].concat_latent
    assert latent.samples.shape == (2, 16, 3, 2, 4) and concat.shape == (2, 32, 3, 2, 4)
    assert torch.allclose(concat[:, :16], enc(control).expand(2, -1, -1, -1, -1))
    assert torch.allclose(concat[:, 16:, :1], enc(start).expand(2, -1, -1, -1, -1))
    assert torch.allclose(concat[:, 16:, 1:], WAN21_LATENT.process_out(torch.zeros(2, 16, 2, 2, 4)))
    assert pos[0].concat_mask is None
    # the Fun Control model (48 input channels) takes the 32 channels as they are (ComfyUI: no mask)
    from mixgraph.nodes.families.wan.runner import wan_concat

    out = wan_concat(torch.zeros(2, 16, 3, 2, 4), 48, False, WAN21_LATENT, concat, None, None)
    assert torch.allclose(out, torch.cat([WAN21_LATENT.process_in(concat[:, :16]),
                                          WAN21_LATENT.process_in(concat[:, 16:])], dim=1))


def test_wan22_latent_and_trim():
    enc = VideoEncoder(channels=48, downscale=16)
    empty = ops.wan22_image_to_video_latent(enc, 64, 32, 9, 2)
    assert empty.samples.shape == (2, 48, 3, 2, 4) and empty.noise_mask is None and not empty.samples.any()
    start = torch.rand(1, 32, 64, 3)
    lat = ops.wan22_image_to_video_latent(enc, 64, 32, 9, 2, start)
    given = enc(start)
    assert torch.equal(lat.samples[:, :, :1], given.repeat(2, 1, 1, 1, 1))
    # the sampled frames: process_out of zeros, so process_in gives 0 where the sampler works
    assert torch.allclose(WAN22_LATENT.process_in(lat.samples[:, :, 1:]), torch.zeros(2, 48, 2, 2, 4), atol=1e-6)
    assert lat.noise_mask.shape == (2, 1, 3, 2, 4) and not lat.noise_mask[:, :, 0].any()
    trimmed = ops.trim_video_latent(Latent(torch.rand(1, 16, 5, 2, 2), batch_index=(3,)), 2)
    assert trimmed.samples.shape == (1, 16, 3, 2, 2) and trimmed.batch_index == (3,)
    with pytest.raises(ValueError, match="trims the frames of a video latent"):
        ops.trim_video_latent(Latent(torch.rand(1, 4, 2, 2)), 1)
    assert ops.as_video(torch.rand(3, 16, 2, 2)).shape == (1, 16, 3, 2, 2)


# --------------------------------------------------------------------------------------------
# workflows


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan_nodes")
    write_wan(root / "diffusion_models" / "wan_i2v.safetensors", "i2v", seed=3)
    write_wan(root / "diffusion_models" / "wan_flf2v.safetensors", "flf2v", seed=4)
    write_wan_vace(root / "diffusion_models" / "wan_vace.safetensors", seed=5)
    (root / "text_encoders").mkdir()
    save_file({k: v.contiguous() for k, v in tiny_clip_l_state_dict(4, width=TEXT_WIDTH).items()},
              str(root / "text_encoders" / "clip_l.safetensors"))
    (root / "vae").mkdir()
    vae_cfg = dataclasses.replace(TINY_VAE, z_channels=16, embed_dim=16, use_quant_conv=False)
    save_file({k: v.contiguous() for k, v in tiny_vae_state_dict(2, vae_cfg).items()},
              str(root / "vae" / "vae16.safetensors"))
    (root / "clip_vision").mkdir()
    write_clip_vision(root / "clip_vision" / "vision.safetensors", seed=5)  # 64 wide: the tiny models' CLIP width
    return root


def _prompt(model: str, cond_node: dict):
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": model, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "v": {"class_type": "VAELoader", "inputs": {"vae_name": "vae16.safetensors"}},
        "cv": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "vision.safetensors"}},
        "img": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1,
                                                       "color": 0x336699}},
        "img2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1,
                                                        "color": 0xCC9933}},
        "e": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["cv", 0], "image": ["img", 0],
                                                          "crop": "none"}},
        "e2": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["cv", 0], "image": ["img2", 0],
                                                           "crop": "none"}},
        "m": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "w": cond_node,
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["m", 0], "seed": 3, "steps": 2, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple",
            "positive": ["w", 0], "negative": ["w", 1], "latent_image": ["w", 2], "denoise": 1.0}},
        "s": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "wan/i2v"}},
    }


@torch.inference_mode()  # the workflow's weights are in the store as inference tensors
def test_image_to_video_workflow(models):
    """UNETLoader (i2v) + WanImageToVideo (start image through the VAE, CLIP vision output) +
    KSampler: a [1, 16, 1, 6, 8] latent; the model's 20 extra channels are 4 ones (the given
    frame) and the start frame's latent in Wan 2.1's format."""
    node = {"class_type": "WanImageToVideo", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["v", 0], "width": 64, "height": 48, "length": 1,
        "batch_size": 1, "clip_vision_output": ["e", 0], "start_image": ["img", 0]}}
    res = api.run(_prompt("wan_i2v.safetensors", node), models=models, output=models / "out")
    out = res.outputs["3"][0].samples
    assert out.shape == (1, 16, 1, 6, 8) and torch.isfinite(out).all()
    pos = res.outputs["w"][0]
    runner = loader.load_unet(models / "diffusion_models" / "wan_i2v.safetensors").runner(parse_spec("f32"))
    concat = runner.concat(pos[0], torch.zeros(1, 16, 1, 6, 8), None, 0)
    assert torch.equal(concat[:, :4], torch.ones(1, 4, 1, 6, 8))
    assert torch.allclose(concat[:, 4:], WAN21_LATENT.process_in(pos[0].concat_latent))
    vision = res.outputs["e"][0]
    assert torch.equal(runner.cond_inputs(pos[0], (1, 16, 1, 6, 8))["clip_fea"], vision.penultimate_hidden_states)


def test_first_last_frame_workflow(models):
    node = {"class_type": "WanFirstLastFrameToVideo", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["v", 0], "width": 64, "height": 48, "length": 1,
        "batch_size": 1, "clip_vision_start_image": ["e", 0], "clip_vision_end_image": ["e2", 0],
        "start_image": ["img", 0], "end_image": ["img2", 0]}}
    p = _prompt("wan_flf2v.safetensors", node)
    p["t"] = {"class_type": "TrimVideoLatent", "inputs": {"samples": ["3", 0], "trim_amount": 0}}
    p["s"]["inputs"]["samples"] = ["t", 0]
    res = api.run(p, models=models, output=models / "out")
    out = res.outputs["t"][0].samples
    assert out.shape == (1, 16, 1, 6, 8) and torch.isfinite(out).all()
    states = res.outputs["w"][0][0].model_inputs["clip_vision_output"].penultimate_hidden_states
    assert states.shape[1] == 2 * res.outputs["e"][0].penultimate_hidden_states.shape[1]


def test_vace_workflow(models):
    """UNETLoader (VACE) + WanVaceToVideo (control video, reference image) + KSampler +
    TrimVideoLatent by the node's trim_latent: the reference frame sampled and cut off."""
    node = {"class_type": "WanVaceToVideo", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["v", 0], "width": 64, "height": 48, "length": 1,
        "batch_size": 1, "strength": 0.8, "control_video": ["img", 0], "reference_image": ["img2", 0]}}
    p = _prompt("wan_vace.safetensors", node)
    p["t"] = {"class_type": "TrimVideoLatent", "inputs": {"samples": ["3", 0], "trim_amount": ["w", 3]}}
    p["s"]["inputs"]["samples"] = ["t", 0]
    res = api.run(p, models=models, output=models / "out")
    assert res.outputs["w"][3] == 1 and res.outputs["3"][0].samples.shape == (1, 16, 2, 6, 8)
    out = res.outputs["t"][0].samples
    assert out.shape == (1, 16, 1, 6, 8) and torch.isfinite(out).all()


def test_empty_hunyuan_latent_video_through_the_engine(models):
    p = {"5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 48, "length": 25,
                                                                    "batch_size": 2}},
         "t": {"class_type": "TrimVideoLatent", "inputs": {"samples": ["5", 0], "trim_amount": 2}},
         "s": {"class_type": "SaveLatent", "inputs": {"samples": ["t", 0], "filename_prefix": "wan/empty"}}}
    res = api.run(p, models=models, output=models / "out")
    assert res.outputs["5"][0].samples.shape == (2, 16, 7, 6, 8)
    assert res.outputs["t"][0].samples.shape == (2, 16, 5, 6, 8)
