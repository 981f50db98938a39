"""The Wan family (``nodes/families/wan``): the DiT against diffusers' ``WanTransformer3DModel`` on
tiny configs in the released files' key layout (t2v, i2v with CLIP image tokens, first-last-frame,
Wan 2.2 5B with per-frame timesteps), detection of every variant from shapes (the real 1.3B / 14B /
5B sizes on meta tensors), the runner's conditioning (image-to-video concat channels, CLIP tokens),
and sampling 5-D latents: KSampler / SamplerCustomAdvanced on EmptyHunyuanLatentVideo through
``mixgraph.ui.api`` checked against the flow ODE written out, the Wan 2.2 two-expert run (two
KSamplerAdvanced on two UNETLoader models), the 5B model's kept first frame, diffusers-named LoRAs.

No umT5 encoder is used: the tiny models' text width is the tiny CLIP-L's (loaded with CLIPLoader
type stable_diffusion), or the tests build ``Cond``s directly. No Wan VAE either: the i2v workflow
encodes its one frame with the 16-channel KL VAE fixture (a stand-in; one pixel frame is one latent
frame for both)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families import refused
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.wan.detect import variant_of, wan_config
from mixgraph.nodes.families.wan.family import WAN
from mixgraph.nodes.families.wan.model import WanConfig, WanModel
from mixgraph.nodes.families.wan.runner import wan_concat
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.vision import ClipVisionOutput
from mixgraph.nodes.sampling import ksampler
from mixgraph.nodes.sampling.noise import prepare_noise
from mixgraph.nodes.sampling.preview import latent_to_rgb
from mixgraph.nodes.vae.video_latent_formats import WAN21_LATENT, WAN22_LATENT
from mixgraph.ui import api
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_wan import (IMAGE_TOKENS, IMAGE_WIDTH, TEXT_WIDTH, comfy_state_dict, diffusers_wan,
                                     diffusers_wan_vace, write_wan, write_wan_vace)

SEED, STEPS = 5, 3


def _f32():
    return parse_spec("f32")


def _config(sd) -> WanConfig:
    cfg = wan_config({k: tuple(v.shape) for k, v in sd.items()})
    assert cfg is not None
    return cfg


# --------------------------------------------------------------------------------------------
# the model against diffusers


@pytest.mark.parametrize("kind", ["t2v", "i2v", "flf2v", "ti2v"])
def test_wan_matches_diffusers(kind):
    """Same weights (converted by the test's key map), same velocity: 3 latent frames of 6 x 8,
    two timesteps in one batch; i2v / flf2v with CLIP image tokens (diffusers reads 512 text
    tokens after them; its first-last-frame embedder takes the two images as two batch rows)."""
    ref = diffusers_wan(kind, seed=1)
    sd = comfy_state_dict(ref)
    cfg = _config(sd)
    model = WanModel(cfg).eval()
    model.load_state_dict(sd, strict=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, cfg.in_dim, 3, 6, 8, generator=g)
    t = torch.tensor([700.0, 30.0])
    ctx = torch.randn(2, 512, TEXT_WIDTH, generator=g)
    clip, kw = None, {}
    if cfg.image:
        clip = torch.randn(2, IMAGE_TOKENS * (2 if cfg.flf_tokens else 1), IMAGE_WIDTH, generator=g)
        kw["encoder_hidden_states_image"] = clip.reshape(-1, IMAGE_TOKENS, IMAGE_WIDTH) if cfg.flf_tokens else clip
    with torch.no_grad():
        want = ref(hidden_states=x, timestep=t, encoder_hidden_states=ctx, **kw).sample
        got = model(x, t, ctx, clip)
    assert got.shape == (2, cfg.out_dim, 3, 6, 8)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    if kind == "ti2v":  # one timestep per latent frame (diffusers: per token, 12 tokens a frame)
        tf = torch.tensor([[0.0, 500.0, 500.0], [0.0, 200.0, 200.0]])
        with torch.no_grad():
            want = ref(hidden_states=x, timestep=tf.repeat_interleave(12, dim=1), encoder_hidden_states=ctx).sample
            got = model(x, tf, ctx)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_vace_matches_diffusers():
    """A VACE model (hint blocks after main blocks 0 and 2 of 4, ComfyUI's every-(layers / hints)
    mapping): the hint [1, 96, T, H, W] at strength 0.7 as diffusers' control_hidden_states with
    scale 0.7 per layer."""
    ref = diffusers_wan_vace(seed=1)
    sd = comfy_state_dict(ref)
    cfg = _config(sd)
    assert variant_of(cfg) == "vace" and cfg.vace_layers == (0, 2) and cfg.vace_in_dim == 96
    model = WanModel(cfg).eval()
    model.load_state_dict(sd, strict=True)
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(1, 16, 3, 6, 8, generator=g), torch.randn(1, 7, TEXT_WIDTH, generator=g)
    hint = torch.randn(1, 96, 3, 6, 8, generator=g)
    t = torch.tensor([600.0])
    with torch.no_grad():
        want = ref(hidden_states=x, timestep=t, encoder_hidden_states=ctx, control_hidden_states=hint,
                   control_hidden_states_scale=torch.tensor([0.7, 0.7])).sample
        got = model(x, t, ctx, None, vace=[(hint, 0.7)])
        plain = model(x, t, ctx)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert (plain - want).abs().max() > 1e-2  # the hint matters


def test_odd_latent_is_padded_and_cropped():
    """An odd latent side is padded circularly to the 2 x 2 patch and the output cropped back
    (ComfyUI's pad_to_patch_size)."""
    model = WanModel(_config(comfy_state_dict(diffusers_wan("t2v")))).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 16, 2, 5, 7), torch.tensor([500.0]), torch.randn(1, 4, TEXT_WIDTH))
    assert out.shape == (1, 16, 2, 5, 7) and torch.isfinite(out).all()


# --------------------------------------------------------------------------------------------
# detection


def _meta_shapes(cfg: WanConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = WanModel(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("cfg,variant,latent", [
    (WanConfig(dim=1536, ffn_dim=8960, num_layers=30), "t2v", "wan21"),  # Wan 2.1 T2V 1.3B
    (WanConfig(dim=5120, ffn_dim=13824, num_layers=40), "t2v", "wan21"),  # Wan 2.1 T2V 14B / 2.2 A14B t2v experts
    (WanConfig(in_dim=36, dim=5120, ffn_dim=13824, num_layers=40, image=True), "i2v", "wan21"),
    (WanConfig(in_dim=36, dim=5120, ffn_dim=13824, num_layers=40, image=True, flf_tokens=514), "flf2v", "wan21"),
    (WanConfig(in_dim=36, dim=5120, ffn_dim=13824, num_layers=40), "i2v_a14b", "wan21"),  # Wan 2.2 A14B i2v experts
    (WanConfig(in_dim=48, out_dim=48, dim=3072, ffn_dim=14336, num_layers=30), "ti2v_5b", "wan22"),
    (WanConfig(in_dim=100, out_dim=48, dim=3072, ffn_dim=14336, num_layers=30), "ti2v_5b", "wan22"),  # Fun InP 5B
    (WanConfig(dim=1536, ffn_dim=8960, num_layers=30, vace_layers=tuple(range(0, 30, 2)), vace_in_dim=96),
     "vace", "wan21"),
    (WanConfig(in_dim=48, dim=1536, ffn_dim=8960, num_layers=30, image=True), "fun", "wan21"),
])
def test_variants_are_detected_from_shapes(cfg, variant, latent):
    """Every variant's real sizes, on meta tensors: the config read back from the shapes (heads =
    dim / 128), the variant, ComfyUI's sampling (flow, shift 8, σ·1000) and latent format; with
    the checkpoint prefix the loaders strip, and not refused."""
    shapes = _meta_shapes(cfg)
    assert wan_config(shapes) == cfg
    found = WAN.detect(shapes)
    assert found is not None and (found.family, found.variant) == ("wan", variant) and found.config == cfg
    assert found.fields["latent_format"].name == latent and found.fields["prediction"] == "flow"
    assert WAN.sampling(variant).shift == 8.0 and WAN.sampling(variant).multiplier == 1000.0
    assert cfg.heads == cfg.dim // 128 and sum(cfg.rope_axes) == 128
    assert families.detect(shapes).family == "wan"
    assert refused.detect_family({"model.diffusion_model." + k: v for k, v in shapes.items()}) is None


@pytest.mark.parametrize("marker,row", [
    ("control_adapter.conv.weight", "Wan camera control"), ("casual_audio_encoder.encoder.final_linear.weight",
                                                             "Wan 2.2 S2V (sound to video)"),
    ("audio_proj.audio_proj_glob_1.layer.bias", "Wan HuMo"), ("face_adapter.fuser_blocks.0.k_norm.weight",
                                                              "Wan 2.2 Animate"),
    ("ref_conv.weight", "Wan with a reference-image conv (ref_conv)"),
])
def test_other_wan_variants_stay_refused_by_name(marker, row):
    shapes = _meta_shapes(WanConfig(dim=256, ffn_dim=64, num_layers=2))
    assert WAN.detect({**shapes, marker: (4,)}) is None
    assert refused.detect_family({**shapes, marker: (4,)}) == row


def test_vace_runner_gives_hints_without_vace_inputs(tmp_path):
    """ComfyUI's WAN21_Vace: without WanVaceToVideo a VACE model still gets a hint, zeros in
    Wan 2.1's format and an all-ones mask; VACE inputs on a model without VACE blocks are refused."""
    runner = loader.load_unet(write_wan_vace(tmp_path / "vace.safetensors", seed=2)).runner(_f32())
    assert runner.kind == "vace"
    text = torch.randn(1, 5, TEXT_WIDTH)
    inputs = runner.cond_inputs(Cond(text), (1, 16, 2, 4, 6))
    hint = inputs["vace_0"]
    assert hint.shape == (1, 96, 2, 4, 6) and torch.equal(hint[:, 32:], torch.ones(1, 64, 2, 4, 6))
    assert torch.allclose(hint[:, :16], WAN21_LATENT.process_in(torch.zeros(1, 16, 2, 4, 6)))
    assert float(inputs["vace_strength_0"][0]) == 1.0
    plain = loader.load_unet(write_wan(tmp_path / "t2v.safetensors", "t2v", seed=2)).runner(_f32())
    with pytest.raises(ValueError, match="no VACE blocks"):
        plain.cond_inputs(Cond(text, model_inputs={"vace_frames": [torch.zeros(1, 32, 2, 4, 6)]}), (1, 16, 2, 4, 6))


def test_files_load_with_their_variant(tmp_path):
    for kind, variant in (("t2v", "t2v"), ("i2v", "i2v"), ("flf2v", "flf2v"), ("ti2v", "ti2v_5b"),
                          ("i2v22", "i2v_a14b")):
        path = write_wan(tmp_path / f"{kind}.safetensors", kind, seed=2)
        unet = loader.load_unet(path)
        assert (unet.family, unet.kind, unet.prediction) == ("wan", variant, "flow")
        assert unet.latent_format == (WAN22_LATENT if kind == "ti2v" else WAN21_LATENT)
        assert refused.family_of_file(path) is None
    bare = loader.load_unet(write_wan(tmp_path / "bare.safetensors", "t2v", seed=2, prefix=""))
    assert bare.config == loader.load_unet(tmp_path / "t2v.safetensors").config


@pytest.mark.parametrize("kind", ["t2v", "i2v", "flf2v", "vace"])
def test_diffusers_layout_files_load(tmp_path, kind):
    """diffusers' transformer file (``WanTransformer3DModel`` / ``WanVACETransformer3DModel`` keys)
    loads as the same model as the Wan-layout file of the same weights (the family's own key map,
    against the test's)."""
    ref = diffusers_wan_vace(seed=2) if kind == "vace" else diffusers_wan(kind, seed=2)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(sd, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    save_file({"model.diffusion_model." + k: v for k, v in comfy_state_dict(ref).items()},
              str(tmp_path / "wan.safetensors"))
    diff = loader.load_unet(tmp_path / "diffusion_pytorch_model.safetensors")
    wan = loader.load_unet(tmp_path / "wan.safetensors")
    assert diff.source.layout == "diffusers_wan" and (diff.kind, diff.config) == (wan.kind, wan.config)
    a = dict(diff.runner(_f32()).model.state_dict())
    b = dict(wan.runner(_f32()).model.state_dict())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert refused.family_of_file(tmp_path / "diffusion_pytorch_model.safetensors") is None


def test_family_declarations():
    assert families.get("wan") is WAN and "Wan" in WAN.refusals and WAN.clip_types == {"wan": "t2v"}
    (slot,) = WAN.text_encoders("t2v")
    assert (slot.name, slot.tokenizer, slot.arch, slot.encoding, slot.role) == ("umt5xxl", "umt5", "umt5", "wan",
                                                                                 "text_large")
    assert slot.prefix == "text_encoders.umt5xxl.transformer."
    cfg = WanConfig(in_dim=36, dim=256, ffn_dim=64, num_layers=2, text_dim=32, image=True, image_dim=64)
    args, kwargs = WAN.trace_inputs(cfg, (3, 6, 8), 2)
    assert [tuple(a.shape) for a in args] == [(2, 36, 3, 6, 8), (2,), (2, 512, 32), (2, 257, 64)] and kwargs == {}
    with torch.no_grad():
        assert WanModel(cfg)(*args).shape == (2, 16, 3, 6, 8)


# --------------------------------------------------------------------------------------------
# the runner


def test_i2v_concat_follows_comfyui():
    """ComfyUI's WAN21.concat_cond: 4 mask channels (1 − concat_mask, one per pixel frame of a
    latent frame) then the image latent, scaled by the latent format; zeros without an image on an
    image-to-video model (all 20 channels), the noise mask where no concat mask is given."""
    g = torch.Generator().manual_seed(0)
    latent = torch.randn(1, 16, 3, 4, 6, generator=g)
    image = torch.randn(1, 16, 3, 4, 6, generator=g)
    mask = torch.ones(1, 1, 3, 4, 6)
    mask[:, :, :1] = 0.0
    out = wan_concat(latent, 36, True, WAN21_LATENT, image, mask, None)
    assert out.shape == (1, 20, 3, 4, 6)
    assert torch.equal(out[:, :4, 0], torch.ones(1, 4, 4, 6))
    assert torch.equal(out[:, :4, 1:], torch.zeros(1, 4, 2, 4, 6))
    assert torch.allclose(out[:, 4:], WAN21_LATENT.process_in(image))
    assert torch.equal(wan_concat(latent, 36, True, WAN21_LATENT, None, None, None), torch.zeros(1, 20, 3, 4, 6))
    assert wan_concat(latent, 16, False, WAN21_LATENT, None, None, None) is None
    # Wan 2.2 Fun InP 5B: 48 latent + 4 mask + 48 image channels, in Wan 2.2's format
    image48 = torch.randn(1, 48, 3, 4, 6, generator=g)
    out48 = wan_concat(torch.zeros(1, 48, 3, 4, 6), 100, True, WAN22_LATENT, image48, mask.repeat(1, 4, 1, 1, 1), None)
    assert out48.shape == (1, 52, 3, 4, 6) and torch.allclose(out48[:, 4:], WAN22_LATENT.process_in(image48))
    # a smaller image latent is resized per frame (ComfyUI's common_upscale), batch-repeated
    out2 = wan_concat(latent.repeat(2, 1, 1, 1, 1), 36, True, WAN21_LATENT, image[..., :2, :3], mask, None)
    assert out2.shape == (2, 20, 3, 4, 6) and torch.equal(out2[0], out2[1])


def test_runner_reads_the_clip_vision_output(tmp_path):
    unet = loader.load_unet(write_wan(tmp_path / "i2v.safetensors", "i2v", seed=2))
    runner = unet.runner(_f32())
    states = torch.randn(1, IMAGE_TOKENS, IMAGE_WIDTH)
    vision = ClipVisionOutput(torch.zeros(1, 8), states, states)
    text = torch.randn(1, 7, TEXT_WIDTH)
    inputs = runner.cond_inputs(Cond(text, model_inputs={"clip_vision_output": vision}), (1, 16, 2, 4, 4))
    assert torch.equal(inputs["clip_fea"], states)
    with pytest.raises(ValueError, match="text features 48 wide; the model takes 32"):
        runner.cond_inputs(Cond(torch.zeros(1, 3, 48)), (1, 16, 2, 4, 4))
    # without CLIP tokens the image cross-attention reads the text tokens, as ComfyUI's context_img_len None
    model = WanModel(unet.config).eval()
    model.load_state_dict(comfy_state_dict(diffusers_wan("i2v", seed=2)))
    x, t = torch.randn(1, 36, 2, 4, 4), torch.tensor([500.0])
    with torch.no_grad():
        got = model(x, t, text, None)
        model.img_emb.forward = lambda clip: model.text_embedding(text)  # "image tokens" = the text tokens
        want = model(x, t, text, torch.zeros(1, 3, IMAGE_WIDTH))
    assert torch.equal(got, want) and torch.isfinite(runner(x, t, text, {})).all()
    assert "umT5" in runner.context_free_refusal()


@torch.inference_mode()
def test_area_and_mask_conds_on_a_video_latent(tmp_path):
    """ConditioningSetArea / ConditioningSetMask conds on a video latent: the area is cut from
    every frame, a 2-D mask weighs every frame alike; where a cond covers all of the latent it is
    the plain cond."""
    from mixgraph.nodes.sampling.parameterization import CFGDenoiser

    runner = loader.load_unet(write_wan(tmp_path / "t2v.safetensors", "t2v", seed=2)).runner(_f32())
    g = torch.Generator().manual_seed(0)
    a, b, neg = (torch.randn(1, 5, TEXT_WIDTH, generator=g) for _ in range(3))
    x = torch.randn(1, 16, 2, 8, 8, generator=g)
    sigma = torch.tensor([0.7])

    def x0(conds):
        return CFGDenoiser(runner, conds, (Cond(neg),), 3.0, torch.zeros_like(x))(x, sigma)

    plain = x0((Cond(a),))
    area = x0((Cond(a, area=(4, 8, 0, 0)), Cond(b)))
    masked = x0((Cond(a, mask=torch.ones(8, 8)), Cond(b, mask=torch.zeros(8, 8))))
    assert area.shape == masked.shape == (1, 16, 2, 8, 8) and torch.isfinite(area).all()
    assert torch.allclose(masked, plain, atol=1e-5) and not torch.allclose(area, plain, atol=1e-3)
    half = torch.zeros(8, 8)
    half[:4] = 1.0
    by_mask = x0((Cond(a, mask=half), Cond(b, mask=1.0 - half)))
    assert not torch.allclose(by_mask[..., :4, :], by_mask[..., 4:, :])


@torch.inference_mode()
def test_previews_show_the_first_frame(tmp_path):
    """latent2rgb on a video latent previews its first frame (ComfyUI's Latent2RGBPreviewer), at
    every KSampler step."""
    from mixgraph.nodes.sampling.preview import Latent2RGBPreviewer, preview_format

    x0 = torch.randn(1, 16, 3, 4, 6)
    assert torch.equal(latent_to_rgb(x0, WAN21_LATENT), latent_to_rgb(x0[:, :, 0], WAN21_LATENT))
    runner = loader.load_unet(write_wan(tmp_path / "t2v.safetensors", "t2v", seed=2)).runner(_f32())
    assert preview_format(runner) is WAN21_LATENT
    seen = []
    text = torch.randn(1, 5, TEXT_WIDTH)
    ksampler.sample(runner, seed=1, steps=2, cfg=1.0, sampler_name="euler", scheduler="simple",
                    positive=[Cond(text)], negative=[Cond(text)], latent=Latent(torch.zeros(1, 16, 3, 4, 6)),
                    on_step=lambda i, n, image: seen.append((i, n, image.size)),
                    preview=Latent2RGBPreviewer(WAN21_LATENT))
    assert seen == [(1, 2, (6, 4)), (2, 2, (6, 4))]


def test_video_noise_mask_is_resized_in_three_dimensions():
    mask = torch.zeros(1, 1, 2, 4, 4)
    mask[:, :, 1] = 1.0
    m = ksampler.prepare_mask(mask, (2, 16, 2, 8, 8))
    assert m.shape == (2, 16, 2, 8, 8) and torch.equal(m[:, :, 0], torch.zeros(2, 16, 8, 8))
    assert torch.equal(m[:, :, 1], torch.ones(2, 16, 8, 8))
    flat = ksampler.prepare_mask(torch.ones(1, 4, 4), (1, 16, 3, 8, 8))  # a MASK [N, H, W]: frames
    assert flat.shape == (1, 16, 3, 8, 8)


# --------------------------------------------------------------------------------------------
# workflows


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan_family")
    write_wan(root / "diffusion_models" / "wan_t2v.safetensors", "t2v", seed=3)
    write_wan(root / "diffusion_models" / "wan_high.safetensors", "t2v", seed=3)
    write_wan(root / "diffusion_models" / "wan_low.safetensors", "t2v", seed=4)
    (root / "text_encoders").mkdir()
    save_file({k: v.contiguous() for k, v in tiny_clip_l_state_dict(4, width=TEXT_WIDTH).items()},
              str(root / "text_encoders" / "clip_l.safetensors"))
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def prompt(sampler="euler", scheduler="simple", length=9):
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan_t2v.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "m": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 48, "length": length,
                                                                    "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["m", 0], "seed": SEED, "steps": STEPS, "cfg": 4.0, "sampler_name": sampler,
            "scheduler": scheduler, "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler}},
        "11": {"class_type": "BasicScheduler", "inputs": {"model": ["m", 0], "scheduler": scheduler, "steps": STEPS,
                                                          "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "CFGGuider", "inputs": {"model": ["m", 0], "positive": ["6", 0], "negative": ["7", 0],
                                                     "cfg": 4.0}},
        "21": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["5", 0]}},
        "s3": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "wan/ks"}},
        "s21": {"class_type": "SaveLatent", "inputs": {"samples": ["21", 0], "filename_prefix": "wan/adv"}},
    }


@pytest.mark.parametrize("sampler,scheduler", [("euler", "simple"), ("dpmpp_2m", "sgm_uniform"),
                                               ("euler_ancestral", "simple")])
def test_t2v_samples_a_video_latent(executor, models, sampler, scheduler):
    res = api.run(prompt(sampler, scheduler), executor=executor, models=models, output=models / "out")
    ks, adv = res.outputs["3"][0].samples, res.outputs["21"][0].samples
    assert ks.shape == (1, 16, 3, 6, 8) and torch.isfinite(ks).all() and ks.abs().max() > 0
    assert torch.equal(adv, ks)


def _text(models):
    clip = loader.load_clip([models / "text_encoders" / "clip_l.safetensors"])
    return [clip.encode(t, _f32())[0].cross_attn for t in ("a red cube", "blurry")]


def _euler(runners_by_step, sigmas, x, pos, neg, cfg=4.0):
    """Euler on the flow ODE with CFG: x ← x + (σ' − σ)·v, v = uncond + cfg·(cond − uncond)."""
    for i in range(len(sigmas) - 1):
        s = sigmas[i]
        run = runners_by_step[i]
        ts = torch.full((x.shape[0],), float(s) * 1000.0)
        cond, uncond = run(x, ts, pos, {}), run(x, ts, neg, {})
        x = x + (sigmas[i + 1] - s) * (uncond + cfg * (cond - uncond))
    return x


@torch.inference_mode()
def test_sampling_is_the_flow_ode_on_the_model(executor, models):
    """KSampler (euler, simple) on the Wan model is the Euler flow ODE with ComfyUI's shift-8
    schedule, written out here: noise [1, 16, 3, 6, 8] drawn as ComfyUI draws it, σ·1000 as the
    timestep, Wan 2.1's format on the way out."""
    res = api.run(prompt(), executor=executor, models=models, output=models / "out")
    runner = loader.load_unet(models / "diffusion_models" / "wan_t2v.safetensors").runner(_f32())
    pos, neg = _text(models)
    t = torch.arange(1, 1001) / 1000.0
    table = 8.0 * t / (1 + 7.0 * t)
    sigmas = torch.cat([table[[999, 666, 333]], torch.zeros(1)])
    x = prepare_noise(torch.zeros(1, 16, 3, 6, 8), SEED) * sigmas[0]
    want = WAN21_LATENT.process_out(_euler([runner] * STEPS, sigmas, x, pos, neg))
    got = res.outputs["3"][0].samples
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def _expert_prompt(split: int, steps: int = 4):
    p = prompt()
    for k in ("3", "10", "11", "12", "13", "21", "s21"):
        del p[k]
    p["1b"] = {"class_type": "UNETLoader", "inputs": {"unet_name": "wan_low.safetensors", "weight_dtype": "default"}}
    p["1"]["inputs"]["unet_name"] = "wan_high.safetensors"
    p["mb"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1b", 0], "shift": 8.0}}
    common = {"noise_seed": SEED, "steps": steps, "cfg": 4.0, "sampler_name": "euler", "scheduler": "simple",
              "positive": ["6", 0], "negative": ["7", 0]}
    p["h"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "model": ["m", 0], "add_noise": "enable", "latent_image": ["5", 0], "start_at_step": 0,
        "end_at_step": split, "return_with_leftover_noise": "enable"}}
    p["l"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "model": ["mb", 0], "add_noise": "disable", "latent_image": ["h", 0], "start_at_step": split,
        "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
    p["s3"]["inputs"]["samples"] = ["l", 0]
    return p


@torch.inference_mode()
def test_wan22_two_expert_run(executor, models):
    """Wan 2.2 A14B's workflow: the high-noise expert samples steps 0-2 of 4 and returns its
    leftover noise, the low-noise expert (another UNETLoader model) finishes without new noise;
    the same as one Euler run switching models after step 2."""
    res = api.run(_expert_prompt(2), executor=executor, models=models, output=models / "out")
    got = res.outputs["l"][0].samples
    high = loader.load_unet(models / "diffusion_models" / "wan_high.safetensors").runner(_f32())
    low = loader.load_unet(models / "diffusion_models" / "wan_low.safetensors").runner(_f32())
    pos, neg = _text(models)
    t = torch.arange(1, 1001) / 1000.0
    table = 8.0 * t / (1 + 7.0 * t)
    sigmas = torch.cat([table[[999, 749, 499, 249]], torch.zeros(1)])
    x = prepare_noise(torch.zeros(1, 16, 3, 6, 8), SEED) * sigmas[0]
    want = WAN21_LATENT.process_out(_euler([high, high, low, low], sigmas, x, pos, neg))
    assert got.shape == (1, 16, 3, 6, 8)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    only_high = WAN21_LATENT.process_out(_euler([high] * 4, sigmas, x, pos, neg))
    assert (got - only_high).abs().max() > 1e-3  # the second expert did run


@torch.inference_mode()
def test_wan22_5b_keeps_the_given_first_frame(tmp_path):
    """Wan22ImageToVideoLatent's latent (the start image's latent frame kept by a noise mask) on
    the 5B model: each step's model input has the clean first frame at timestep 0 and the others
    at σ·1000 (ComfyUI's WAN22 process_timestep / scale_latent_inpaint); the sampled first frame
    is the given latent. Checked against the loop written out."""
    from mixgraph.nodes.helpers.video.latent_ops import wan22_image_to_video_latent

    unet = loader.load_unet(write_wan(tmp_path / "ti2v.safetensors", "ti2v", seed=2))
    runner = unet.runner(_f32())
    given = torch.randn(1, 48, 1, 3, 4, generator=torch.Generator().manual_seed(7))
    latent = wan22_image_to_video_latent(lambda px: given, 64, 48, 9, 1, torch.zeros(1, 48, 64, 3))
    assert latent.samples.shape == (1, 48, 3, 3, 4) and latent.noise_mask.shape == (1, 1, 3, 3, 4)
    assert torch.equal(latent.samples[:, :, :1], given)
    g = torch.Generator().manual_seed(1)
    pos, neg = torch.randn(1, 6, TEXT_WIDTH, generator=g), torch.randn(1, 6, TEXT_WIDTH, generator=g)
    out = ksampler.sample(runner, seed=SEED, steps=STEPS, cfg=3.0, sampler_name="euler", scheduler="simple",
                          positive=[Cond(pos)], negative=[Cond(neg)], latent=latent)
    got = out.samples
    assert torch.allclose(got[:, :, :1], given, atol=1e-5, rtol=1e-5)
    # the loop: inpaint blend with the clean latent, per-frame timesteps
    t = torch.arange(1, 1001) / 1000.0
    sigmas = torch.cat([(8.0 * t / (1 + 7.0 * t))[[999, 666, 333]], torch.zeros(1)])
    clean = WAN22_LATENT.process_in(latent.samples)
    mask = latent.noise_mask.expand(1, 48, 3, 3, 4)
    x = sigmas[0] * prepare_noise(latent.samples, SEED) + (1 - sigmas[0]) * clean
    for i in range(STEPS):
        s = sigmas[i]
        xin = x * mask + clean * (1 - mask)
        ts = torch.tensor([[0.0, 1.0, 1.0]]) * float(s) * 1000.0
        v = [runner.model(xin, ts, c) for c in (pos, neg)]
        denoised = xin - s * (v[1] + 3.0 * (v[0] - v[1]))
        denoised = denoised * mask + clean * (1 - mask)
        x = x + (x - denoised) / s * (sigmas[i + 1] - s)
    want = WAN22_LATENT.process_out(x)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert not torch.allclose(got[:, :, 1:], latent.samples[:, :, 1:])


def test_an_image_latent_samples_as_one_frame(executor, models):
    """EmptyLatentImage's 4-D latent becomes one 16-channel frame (ComfyUI's
    fix_empty_latent_channels adds the frame axis for a video format)."""
    p = prompt()
    p["5"] = {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 48, "batch_size": 1}}
    res = api.run(p, executor=executor, models=models, output=models / "out")
    assert res.outputs["3"][0].samples.shape == (1, 16, 1, 6, 8)


def test_wan_runs_under_precision_regions(models):
    """A ``[bf16]`` region around KSampler and an fp8 UNETLoader: the same video to rounding; the
    patch embedding (a Conv3d), the timestep path and the modulation tables stay f32."""
    from mixgraph.graph.formats.workflow import load_workflow
    from mixgraph.nodes.weights import store

    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    wf = load_workflow({"format": "mixgraph/1", "prompt": prompt(), "precision": {
        "default": "f32", "regions": [{"name": "sampling [bf16]", "nodes": ["3"], "precision": "bf16"}]}},
        executor.registry)
    report = executor.run(wf, env=dataclasses.replace(executor.env, output=str(models / "out")))
    bf16, f32 = report.values["3"][0].samples, report.values["21"][0].samples
    assert torch.isfinite(bf16).all() and not torch.equal(bf16, f32)
    assert (bf16 - f32).abs().max() <= 0.05 * f32.abs().max()
    p = prompt()
    p["1"]["inputs"]["weight_dtype"] = "fp8_e4m3fn"
    fp8 = api.run(p, executor=executor, models=models, output=models / "out").outputs["3"][0].samples
    assert torch.isfinite(fp8).all() and (fp8 - f32).abs().max() <= 0.1 * f32.abs().max()
    unet = loader.load_unet(models / "diffusion_models" / "wan_t2v.safetensors")
    with torch.inference_mode():
        module = store.materialize("unet", unet.source, unet.config, torch.bfloat16, (), WAN.build)
    dtypes = {k: v.dtype for k, v in module.state_dict().items()}
    assert dtypes["patch_embedding.weight"] == dtypes["time_projection.1.weight"] == torch.float32
    assert dtypes["blocks.0.self_attn.q.weight"] == torch.bfloat16


# --------------------------------------------------------------------------------------------
# LoRA


def test_diffusers_named_lora_patches_the_wan_weights(tmp_path):
    """A diffusers / PEFT-named Wan LoRA (``transformer.blocks.0.attn1.to_q``), the same LoRA in
    ComfyUI's names (``diffusion_model.blocks.0.self_attn.q``: lightx2v's form) and in Wan Fun's
    (``lora_unet__blocks_0_self_attn_q``) patch the same weights by the same amount."""
    from mixgraph.nodes.adapters.lora import load_lora_patches

    g = torch.Generator().manual_seed(1)
    up, down = torch.randn(256, 4, generator=g), torch.randn(4, 256, generator=g)
    up2, down2 = torch.randn(64, 4, generator=g), torch.randn(4, 256, generator=g)
    diffusers = {"transformer.blocks.0.attn1.to_q.lora_B.weight": up,
                 "transformer.blocks.0.attn1.to_q.lora_A.weight": down,
                 "transformer.blocks.1.ffn.net.0.proj.lora_B.weight": up2,
                 "transformer.blocks.1.ffn.net.0.proj.lora_A.weight": down2}
    fun = {"lora_unet__blocks_0_self_attn_q.lora_up.weight": up,
           "lora_unet__blocks_0_self_attn_q.lora_down.weight": down,
           "lora_unet__blocks_1_ffn_0.lora_up.weight": up2, "lora_unet__blocks_1_ffn_0.lora_down.weight": down2}
    comfy = {"diffusion_model.blocks.0.self_attn.q.lora_up.weight": up,
             "diffusion_model.blocks.0.self_attn.q.lora_down.weight": down,
             "diffusion_model.blocks.1.ffn.0.lora_up.weight": up2,
             "diffusion_model.blocks.1.ffn.0.lora_down.weight": down2}
    save_file(diffusers, str(tmp_path / "diffusers.safetensors"))
    save_file(comfy, str(tmp_path / "comfy.safetensors"))
    save_file(fun, str(tmp_path / "fun.safetensors"))
    # a file of its own: the store's copies of the workflow models were made under inference mode
    base = loader.load_unet(write_wan(tmp_path / "wan_lora_base.safetensors", "t2v", seed=6))
    a = dict(base.runner(_f32()).model.named_parameters())
    results = []
    for name in ("diffusers.safetensors", "comfy.safetensors", "fun.safetensors"):
        patched, _ = load_lora_patches(tmp_path / name, base, None, 0.5, 0.0)
        b = dict(patched.runner(_f32()).model.named_parameters())
        assert torch.allclose(b["blocks.0.self_attn.q.weight"] - a["blocks.0.self_attn.q.weight"], 0.5 * up @ down,
                              atol=1e-5)
        assert torch.allclose(b["blocks.1.ffn.0.weight"] - a["blocks.1.ffn.0.weight"], 0.5 * up2 @ down2, atol=1e-5)
        assert torch.equal(a["blocks.0.self_attn.k.weight"], b["blocks.0.self_attn.k.weight"])
        results.append(b)
    assert all(torch.equal(results[0][k], r[k]) for r in results[1:] for k in results[0])
    targets = WAN.lora_key_map(base.config)
    assert targets["blocks.1.attn2.to_out.0"].key == "blocks.1.cross_attn.o.weight"
    assert targets["condition_embedder.time_proj"].key == "time_projection.1.weight"


def test_wan_memory_estimate_uses_the_family(models):
    from mixgraph.ui.estimate import estimate

    wf = api.load(prompt(), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    assert est["nodes"]["3"]["activation_bytes"] > 0 and est["nodes"]["m"]["weights_bytes"] > 0
