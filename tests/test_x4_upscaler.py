"""Stability's SD 2.x x4 upscaler and ComfyUI's SD_4XUpscale_Conditioning: detection from the
checkpoint's shapes, the UNet against diffusers on the same random weights, the node's outputs,
the noise augmentation against the q_sample formula, the denoiser's inputs, and the ComfyUI
workflow end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models.loader import load_checkpoint, load_unet
from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict
from mixgraph.nodes.families.sd.family import SD
from mixgraph.nodes.families.sd.unet import UNetModel, unet_config_from_state_dict
from mixgraph.nodes.families.sd.x4_upscaler import ImageAugmentor, resize_to_batch_size
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.nodes.sampling.preview import make_previewer
from mixgraph.nodes.declare.conditioning.upscale_diffusion_nodes import SD_4XUpscale_Conditioning
from mixgraph.ui import api
from tests.fixtures.checkpoints import save_state_dict
from tests.fixtures.tiny_x4 import X4_UNET, sd2_x4_state_dict, write_sd2_x4

WORKFLOW = Path(__file__).resolve().parent.parent / "workflows" / "upscale_x4_sd2.json"
NAME = "x4-upscaler-ema.safetensors"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("x4")
    write_sd2_x4(root / "models" / "checkpoints" / NAME, seed=11)
    (root / "input").mkdir()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(root / "input" / "example.png")
    return root


@pytest.fixture(scope="module")
def handles(dirs):
    return load_checkpoint(dirs / "models" / "checkpoints" / NAME)


def _betas_reference(start: float, end: float, n: int = 1000) -> np.ndarray:
    return np.linspace(start**0.5, end**0.5, n, dtype=np.float64) ** 2


# ------------------------------------------------------------------------------- detection


def test_x4_checkpoint_detected_as_the_upscaler_family(handles):
    model, clip, vae = handles
    assert model.kind == "sd2_x4" and model.prediction == "v_prediction"
    assert model.latent_format.scale_factor == 0.08333 and model.beta_range == (0.0001, 0.02)
    assert model.parts.x4 == ImageAugmentor(max_noise_level=350, linear_start=0.0001, linear_end=0.02)
    cfg = model.config
    assert (cfg.in_channels, cfg.out_channels, cfg.num_classes) == (7, 4, 1000)
    assert cfg.disable_self_attentions == (False, True, False) and not cfg.disable_middle_self_attn
    assert (cfg.num_heads, cfg.num_head_channels) == (8, -1)  # the family's rule, not SD2's 64-wide heads
    assert cfg == X4_UNET
    assert clip.kind == "sd2" and clip.names == ("clip_h",)  # SD2's OpenCLIP text tower
    assert vae.downscale == 4 and vae.config.ch_mult == (1, 2, 2)  # 3 levels: 4x, not 8x
    assert vae.latent_format.scale_factor == 0.08333


def test_x4_unet_file_loads_with_unetloader(tmp_path):
    sd = sd2_x4_state_dict(seed=2)
    unet = {k: v for k, v in sd.items() if k.startswith("model.diffusion_model.")}
    path = save_state_dict(tmp_path / "x4_unet.safetensors", unet)
    handle = load_unet(path)
    assert handle.kind == "sd2_x4" and handle.parts.x4 is not None and handle.config == X4_UNET
    assert handle.prediction == "v_prediction" and handle.beta_range == (0.0001, 0.02)


def test_unet_config_reads_labels_and_context_attn1_from_shapes():
    shapes = module_shapes(lambda: UNetModel(X4_UNET))
    assert shapes["label_emb.weight"] == (1000, 128)
    # attn1 of the level-1 transformer projects keys from the 48-wide context, not the 64-wide image
    assert shapes["input_blocks.3.1.transformer_blocks.0.attn1.to_k.weight"] == (64, 48)
    cfg = unet_config_from_state_dict({k: torch.empty(s, device="meta") for k, s in shapes.items()})
    assert cfg.num_classes == 1000 and cfg.disable_self_attentions == (False, True, False)
    from tests.fixtures.tiny_unet import tiny_unet_config
    sd2 = tiny_unet_config("sd2")
    plain = unet_config_from_state_dict(
        {k: torch.empty(s, device="meta") for k, s in module_shapes(lambda: UNetModel(sd2)).items()})
    assert plain.num_classes is None and plain.disable_self_attentions == () and plain == sd2


def test_x4_unet_matches_diffusers_on_the_same_weights():
    diffusers = pytest.importorskip("diffusers")
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    ldm = random_state_dict(module_shapes(lambda: UNetModel(X4_UNET)), seed=5)
    config = {
        "in_channels": 7, "out_channels": 4, "block_out_channels": [32, 64, 64], "layers_per_block": 1,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "cross_attention_dim": 48, "use_linear_projection": True, "attention_head_dim": 8,
        "only_cross_attention": [True, True, False], "num_class_embeds": 1000, "sample_size": 8,
    }
    converted = convert_ldm_unet_checkpoint({"model.diffusion_model." + k: v for k, v in ldm.items()}, config)
    converted["class_embedding.weight"] = ldm["label_emb.weight"]
    ref = diffusers.UNet2DConditionModel(**config)
    missing, unexpected = ref.load_state_dict(converted, strict=False)
    assert not missing and not unexpected
    ours = UNetModel(X4_UNET)
    ours.load_state_dict(ldm)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 12, 8, generator=gen)
    t = torch.tensor([999.0, 250.0])
    ctx = torch.randn(2, 77, 48, generator=gen)
    labels = torch.tensor([0, 70])
    with torch.no_grad():
        want = ref(x, t, encoder_hidden_states=ctx, class_labels=labels).sample
        got = ours(x, t, ctx, y=labels.float().reshape(2, 1))
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
        sd2_heads = UNetModel(dataclasses.replace(X4_UNET, num_heads=-1, num_head_channels=64))
        sd2_heads.load_state_dict(ldm)
        assert not torch.allclose(sd2_heads(x, t, ctx, y=labels.float().reshape(2, 1)), want, atol=1e-3)


# ------------------------------------------------------------------------------- the node


def test_sd_4xupscale_conditioning_spec_matches_comfyui():
    info = api.default_registry().object_info()["SD_4XUpscale_Conditioning"]
    req = info["input"]["required"]
    assert list(req) == ["images", "positive", "negative", "scale_ratio", "noise_augmentation"]
    keys = ("default", "min", "max", "step")
    assert tuple(req["scale_ratio"][1][k] for k in keys) == (4.0, 0.0, 10.0, 0.01)
    assert tuple(req["noise_augmentation"][1][k] for k in keys) == (0.0, 0.0, 1.0, 0.001)
    assert [req[k][0] for k in ("images", "positive", "negative")] == ["IMAGE", "CONDITIONING", "CONDITIONING"]
    assert info["category"] == "conditioning/upscale_diffusion"
    assert info["output"] == ["CONDITIONING", "CONDITIONING", "LATENT"]
    assert info["output_name"] == ["positive", "negative", "latent"]


def test_sd_4xupscale_conditioning_outputs_by_hand():
    pos = (Cond(torch.ones(1, 77, 48)), Cond(torch.zeros(1, 77, 48), strength=0.5))
    neg = (Cond(torch.full((1, 77, 48), 2.0)),)
    # scale 4: a 8x12 image -> 48x32 output -> a 12x8 latent, the image's own size (no resize)
    image = torch.rand(2, 8, 12, 3, generator=torch.Generator().manual_seed(1))
    p, n, latent = SD_4XUpscale_Conditioning(image, pos, neg, 4.0, 0.25)
    assert latent.samples.shape == (2, 4, 8, 12) and not latent.samples.any()
    want = image.movedim(-1, 1) * 2 - 1  # [-1, 1], channels first
    assert len(p) == 2 and len(n) == 1
    for c, src in zip(p + n, pos + neg):
        assert torch.allclose(c.concat_image, want, atol=1e-6) and c.noise_augmentation == 0.25
        assert c.cross_attn is src.cross_attn and c.strength == src.strength
    # scale 1: a 8x10 image -> 10x8 output -> a 2x2 latent: the centre 8x8 (columns 1..8, round(1.0))
    # bilinear to 2x2 samples source rows/columns 1.5 and 5.5: means of 2x2 blocks
    image = torch.arange(80, dtype=torch.float32).reshape(1, 8, 10, 1).expand(1, 8, 10, 3) / 80
    _, _, latent = SD_4XUpscale_Conditioning(image, pos, neg, 1.0, 0.0)
    got = SD_4XUpscale_Conditioning(image, pos, neg, 1.0, 0.0)[0][0].concat_image
    crop = image[0, :, 1:9, 0] * 2 - 1
    want = torch.tensor([[crop[1:3, 1:3].mean(), crop[1:3, 5:7].mean()],
                         [crop[5:7, 1:3].mean(), crop[5:7, 5:7].mean()]])
    assert latent.samples.shape == (1, 4, 2, 2)
    assert got.shape == (1, 3, 2, 2) and torch.allclose(got[0, 1], want, atol=1e-5)
    # ComfyUI rounds the output size: 10 x 2.5 = 25 -> 6 latent px; 13 x 2.5 = 32.5 -> 32 (even) -> 8
    _, _, latent = SD_4XUpscale_Conditioning(torch.rand(1, 10, 13, 3), pos, neg, 2.5, 0.0)
    assert latent.samples.shape == (1, 4, 6, 8)
    with pytest.raises(ValueError, match="at least 4x4"):
        SD_4XUpscale_Conditioning(torch.rand(1, 8, 8, 3), pos, neg, 0.1, 0.0)


# ------------------------------------------------------------------------ noise augmentation


def test_x4_noise_augmentation_is_q_sample_with_seed_minus_10():
    aug = ImageAugmentor()
    image = torch.rand(2, 3, 5, 6, generator=torch.Generator().manual_seed(2)) * 2 - 1
    ac = np.cumprod(1.0 - _betas_reference(0.0001, 0.02))
    for seed, augmentation in ((25, 0.3), (3, 1.0)):  # seed 3: the noise seed is -7
        level = round(350 * augmentation)
        with torch.random.fork_rng():
            noise = torch.randn(image.shape, generator=torch.manual_seed(seed - 10))  # ComfyUI's draw
        want = np.sqrt(ac[level]).astype(np.float32) * image + np.sqrt(1 - ac[level]).astype(np.float32) * noise
        got = aug.concat(image, augmentation, (2, 4, 5, 6), seed)
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.equal(aug.label(augmentation), torch.tensor([[float(level)]]))
    assert aug.level(0.3) == 105 and aug.level(0.5) == 175
    # no augmentation: the image as is, noise level 0; no image: zeros
    assert torch.equal(aug.concat(image, 0.0, (2, 4, 5, 6), 25), image)
    assert torch.equal(aug.label(0.0), torch.zeros(1, 1))
    assert torch.equal(aug.concat(None, 0.0, (3, 4, 5, 6), 25), torch.zeros(3, 3, 5, 6))


def test_resize_to_batch_size_stretches_like_comfyui():
    t = torch.arange(2).reshape(2, 1)
    assert resize_to_batch_size(t, 4).flatten().tolist() == [0, 0, 1, 1]
    t = torch.arange(5).reshape(5, 1)
    assert resize_to_batch_size(t, 3).flatten().tolist() == [0, 2, 4]
    assert resize_to_batch_size(t, 1).flatten().tolist() == [0]


# ------------------------------------------------------------------------------- sampling


def test_x4_denoiser_feeds_the_image_and_its_noise_level(handles):
    model, _, _ = handles
    runner = model.runner(parse_spec("f32"))
    image = torch.rand(1, 3, 4, 6) * 2 - 1
    cond = Cond(torch.randn(1, 77, 48), concat_image=image, noise_augmentation=0.1)
    plain = Cond(torch.randn(1, 77, 48))
    latent = torch.zeros(2, 4, 4, 6)
    d = CFGDenoiser(runner, (cond,), (plain,), 5.0, latent, seed=40)
    e, u = d.lists[0][0], d.lists[1][0]
    assert torch.equal(e.concat, model.parts.x4.concat(image, 0.1, (2, 4, 4, 6), 40)) and e.concat.shape == (2, 3, 4, 6)
    assert torch.equal(e.inputs["y"], torch.tensor([[35.0]]))
    assert torch.equal(u.concat, torch.zeros(2, 3, 4, 6)) and torch.equal(u.inputs["y"], torch.zeros(1, 1))
    out = d(torch.randn(2, 4, 4, 6), torch.tensor([2.0, 2.0]))
    assert out.shape == (2, 4, 4, 6) and torch.isfinite(out).all()
    # the schedule is the family's: betas 0.0001..0.02 linear in sqrt
    ac = np.cumprod(1.0 - _betas_reference(0.0001, 0.02))
    ms = ModelSampling.for_model(runner)
    assert float(ms.sigma_max) == pytest.approx(float(np.sqrt((1 - ac[-1]) / ac[-1])), rel=1e-5)
    assert ms.prediction == "v_prediction"


def test_x4_previews_use_the_sd_x4_factors():
    fmt = SD.latent_format("sd2_x4")
    assert fmt.taesd_decoder_name is None and fmt.latent_rgb_factors_bias is None
    preview = make_previewer("auto", fmt, lambda name: None)
    x0 = torch.zeros(1, 4, 2, 2)
    x0[0, 0] = 1.0
    rgb = np.asarray(preview(x0), dtype=np.float32) / 255
    assert np.allclose(rgb[0, 0], (np.array([-0.2340, -0.3863, -0.3257]) + 1) / 2, atol=1 / 255)


def test_x4_workflow_runs_unchanged_and_upscales_4x(dirs, tmp_path):
    prompt = json.loads(WORKFLOW.read_text())
    assert prompt["4"]["inputs"]["ckpt_name"] == NAME
    result = api.run(WORKFLOW, set={"3.steps": 2}, models=dirs / "models", input=dirs / "input",
                     output=tmp_path)
    assert result.report.to_json()["status"] == "success"
    (png,) = result.files
    assert Image.open(png).size == (64, 48)  # the 16x12 input, 4x
    p, n, latent = result.outputs["12"]
    assert latent.samples.shape == (1, 4, 12, 16) and p[0].noise_augmentation == 0.2
    image = result.outputs["8"][0]
    assert image.shape == (1, 48, 64, 3) and torch.isfinite(image).all()
    other = api.run(WORKFLOW, set={"3.steps": 2, "12.noise_augmentation": 0.0}, models=dirs / "models",
                    input=dirs / "input", output=tmp_path)
    assert not torch.allclose(other.outputs["8"][0], image, atol=1e-4)  # the noise level reaches the UNet


def test_x4_memory_estimate_follows_the_output_size(dirs):
    from mixgraph.graph.env import Env
    from mixgraph.ui.estimate import estimate

    registry = api.default_registry()
    env = Env.from_args(models=dirs / "models", input=dirs / "input")
    nodes = estimate(api.load(WORKFLOW, registry), registry, env)["nodes"]
    assert nodes["3"]["size"] == [1, 48, 64] and nodes["8"]["size"] == [1, 48, 64]  # 16x12 × 4
    assert nodes["3"]["activation_bytes"] > 0 and "assumed" not in nodes["3"]
