"""The Flux.1 family (``nodes/families/flux``): the model against diffusers'
``FluxTransformer2DModel`` on a tiny config in the real key layouts, detection of BFL / ComfyUI
and diffusers files, its conditioning (guidance, pooled vector, Kontext references, Fill /
Canny-Depth channels), its nodes, and workflows end to end."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.model import Flux, FluxConfig, default_axes_dim, image_ids, patchify, unpatchify
from tests.flux_fixtures import TINY, flux_state_dict


def _diffusers_flux(cfg: FluxConfig, sd):
    from diffusers import FluxTransformer2DModel

    ref = FluxTransformer2DModel(patch_size=1, in_channels=cfg.in_channels * 4, out_channels=cfg.out_channels * 4,
                                 num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
                                 attention_head_dim=cfg.head_dim, num_attention_heads=cfg.num_heads,
                                 joint_attention_dim=cfg.context_in_dim, pooled_projection_dim=cfg.vec_in_dim,
                                 guidance_embeds=cfg.guidance_embed, axes_dims_rope=cfg.axes_dim).eval()
    converted = diffusers_keys.to_diffusers(sd, ref.state_dict().keys())
    missing, unexpected = ref.load_state_dict(converted, strict=True)
    assert not missing and not unexpected
    return ref


@pytest.mark.parametrize("guidance_embed", [True, False])
def test_flux_matches_diffusers(guidance_embed):
    cfg = FluxConfig(**{**TINY.__dict__, "guidance_embed": guidance_embed})
    sd = flux_state_dict(cfg, seed=1)
    ours = Flux(cfg).eval()
    ours.load_state_dict(sd, strict=True)
    ref = _diffusers_flux(cfg, sd)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 6, 10, generator=g)
    ctx = torch.randn(2, 7, cfg.context_in_dim, generator=g)
    pooled = torch.randn(2, cfg.vec_in_dim, generator=g)
    t = torch.tensor([0.7, 0.25])
    guidance = torch.tensor([3.5, 5.0]) if guidance_embed else None
    with torch.no_grad():
        got = ours(x, t, ctx, pooled, guidance)
        ids = image_ids(3, 5, 1)[0]
        want = ref(hidden_states=patchify(x), encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                   img_ids=ids, txt_ids=torch.zeros(7, 3), guidance=guidance, return_dict=False)[0]
    want = unpatchify(want, 6, 10)
    assert got.shape == want.shape == x.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    # and the key map round-trips
    back = diffusers_keys.to_bfl(ref.state_dict())
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_axes_dim_and_odd_sizes():
    assert default_axes_dim(128) == (16, 56, 56) and sum(default_axes_dim(32)) == 32
    x = torch.randn(1, 16, 5, 7)
    tokens = patchify(x)
    assert tokens.shape == (1, 3 * 4, 64)
    assert torch.equal(unpatchify(tokens, 5, 7), x)


# ---------------------------------------------------------------------------------------------
# detection, sampling settings, conditioning

from mixgraph.graph.cache import OutputCache  # noqa: E402
from mixgraph.graph.env import Env  # noqa: E402
from mixgraph.graph.executor import Executor  # noqa: E402
from mixgraph.graph.precision import parse_spec  # noqa: E402
from mixgraph.nodes.families import refused  # noqa: E402
from mixgraph.nodes.families.flux.family import FLUX  # noqa: E402
from mixgraph.nodes.models import loader  # noqa: E402
from mixgraph.nodes.payloads.conditioning import Cond  # noqa: E402
from mixgraph.nodes.sampling.parameterization import ModelSampling  # noqa: E402
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT  # noqa: E402
from mixgraph.ui import api  # noqa: E402
from tests.flux_fixtures import write_flux_models  # noqa: E402

SEED, STEPS = 11, 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux_family")
    write_flux_models(root)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def _f32():
    return parse_spec("f32")


def test_flux_files_are_detected_in_both_layouts(models):
    dm = models / "diffusion_models"
    bfl = loader.load_unet(dm / "flux_tiny.safetensors")
    assert (bfl.family, bfl.kind, bfl.config, bfl.source.layout) == ("flux", "dev", TINY, "ldm")
    assert bfl.latent_format == FLUX_LATENT and bfl.prediction == "flow"
    for path in (dm / "flux_tiny_diffusers.safetensors", dm / "flux_tiny_diffusers"):
        diff = loader.load_unet(path)
        assert (diff.family, diff.kind, diff.config, diff.source.layout) == ("flux", "dev", TINY, "diffusers_flux")
    assert refused.detect_family({"model.diffusion_model.double_blocks.0.img_attn.qkv.weight": (3, 1)}) == "Flux"
    # both layouts give the same model
    g = torch.Generator().manual_seed(5)
    x, ctx = torch.randn(1, 16, 8, 6, generator=g), torch.randn(1, 9, 32, generator=g)
    inputs = {"y": torch.randn(1, 32, generator=g), "guidance": torch.tensor([2.0])}
    a = bfl.runner(_f32())(x, torch.tensor([0.4]), ctx, inputs)
    b = loader.load_unet(dm / "flux_tiny_diffusers.safetensors").runner(_f32())(x, torch.tensor([0.4]), ctx, inputs)
    assert torch.allclose(a, b, atol=1e-6)


def test_variants_and_sampling(tmp_path):
    from safetensors.torch import save_file

    schnell_cfg = FluxConfig(**{**TINY.__dict__, "guidance_embed": False})
    fill_cfg = FluxConfig(**{**TINY.__dict__, "in_channels": 96})
    for name, cfg, kind in (("schnell", schnell_cfg, "schnell"), ("fill", fill_cfg, "dev")):
        save_file(flux_state_dict(cfg), str(tmp_path / f"{name}.safetensors"))
        handle = loader.load_unet(tmp_path / f"{name}.safetensors")
        assert (handle.kind, handle.config) == (kind, cfg)
    dev = ModelSampling.for_model(loader.load_unet(tmp_path / "fill.safetensors"))
    schnell = ModelSampling.for_model(loader.load_unet(tmp_path / "schnell.safetensors"))
    # ModelSamplingFlux (shift 1.15, the model sees σ) vs ModelSamplingDiscreteFlow(shift 1, multiplier 1)
    assert FLUX.sampling("dev").shift_kind == "exponential" and FLUX.sampling("dev").shift == 1.15
    assert float(dev.timestep(torch.tensor(0.5))) == pytest.approx(0.5)
    assert float(schnell.timestep(torch.tensor(0.5))) == pytest.approx(0.5)
    t = 0.5
    assert float(dev.schedule.sigmas[-1]) == pytest.approx(1.0, abs=1e-3)
    mid = dev.schedule.sigmas[len(dev.schedule.sigmas) // 2]
    assert float(mid) > t  # the exponential shift pushes sigmas up
    assert FLUX.text_encoders("dev")[0].name == "clip_l" and FLUX.text_encoders("chroma")[0].encoding == "chroma"
    assert FLUX.clip_types == {"flux": "dev", "chroma": "chroma"}


def test_cond_inputs(models):
    runner = loader.load_unet(models / "diffusion_models" / "flux_tiny.safetensors").runner(_f32())
    text = torch.zeros(1, 5, 32)
    plain = runner.cond_inputs(Cond(text), (1, 16, 8, 8))
    assert float(plain["guidance"]) == 3.5 and torch.equal(plain["y"], torch.zeros(1, 32))
    assert "guidance" not in runner.cond_inputs(Cond(text, model_inputs={"guidance": None}), (1, 16, 8, 8))
    ref = torch.randn(1, 16, 4, 6)
    inputs = runner.cond_inputs(Cond(text, pooled=torch.ones(1, 32), model_inputs={
        "guidance": 5.0, "reference_latents": [ref, ref * 2]}), (1, 16, 8, 8))
    assert float(inputs["guidance"]) == 5.0 and torch.equal(inputs["y"], torch.ones(1, 32))
    assert torch.equal(inputs["ref_latent_1"], FLUX_LATENT.process_in(ref * 2)) and float(inputs["ref_method"]) == 0
    with pytest.raises(ValueError, match="16-wide pooled"):
        runner.cond_inputs(Cond(text, pooled=torch.ones(1, 16)), (1, 16, 8, 8))


def test_kontext_references_are_extra_tokens_with_their_own_positions(models):
    handle = loader.load_unet(models / "diffusion_models" / "flux_tiny.safetensors")
    runner = handle.runner(_f32())
    g = torch.Generator().manual_seed(9)
    x, ctx, ref = torch.randn(1, 16, 8, 8, generator=g), torch.randn(1, 5, 32, generator=g), torch.randn(1, 16, 6, 4)
    base = {"y": torch.zeros(1, 32), "guidance": torch.tensor([3.5])}
    plain = runner(x, torch.tensor([0.6]), ctx, base)
    outs = {m: runner(x, torch.tensor([0.6]), ctx, {**base, "ref_latent_0": ref, "ref_method": torch.tensor([i])})
            for i, m in enumerate(("offset", "index", "uxo"))}
    assert all(o.shape == x.shape for o in outs.values())
    assert not torch.allclose(plain, outs["offset"])
    assert not torch.allclose(outs["offset"], outs["uxo"])
    # "offset" and "index" place a single reference the same way (index 1, no offset)
    assert torch.allclose(outs["offset"], outs["index"])
    from mixgraph.nodes.families.flux.model import embed_image_tokens

    _, ids = embed_image_tokens(torch.nn.Identity(), x, [ref, ref], "offset")
    # the first reference at index 1 from (0, 0); the second beside it (wider than tall: to the right)
    assert ids.shape == (1, 16 + 6 + 6, 3)
    assert ids[0, 16].tolist() == [1, 0, 0] and ids[0, 22].tolist() == [1, 0, 2]


def test_fill_and_control_concat():
    from mixgraph.nodes.families.flux.runner import control_concat, fill_concat

    latent = torch.randn(2, 16, 4, 6)
    image = torch.randn(1, 16, 4, 6)
    mask = torch.zeros(1, 1, 32, 48)
    mask[..., :8, :8] = 1.0
    fill = fill_concat(latent, None, image, mask, FLUX_LATENT)
    assert fill.shape == (2, 16 + 64, 4, 6)
    assert torch.equal(fill[:, :16], FLUX_LATENT.process_in(image).expand(2, -1, -1, -1))
    assert torch.equal(fill[0, 16:, 0, 0], torch.ones(64)) and fill[0, 16:, 1:, :].abs().sum() == 0
    # no image: ComfyUI's zeros, taken into the model's space; no mask: ones
    blank = fill_concat(latent, None, None, None, FLUX_LATENT)
    assert torch.allclose(blank[:, :16], FLUX_LATENT.process_in(torch.zeros_like(latent)))
    assert torch.equal(blank[:, 16:], torch.ones(2, 64, 4, 6))
    assert control_concat(latent, image, FLUX_LATENT).shape == (2, 16, 4, 6)


# ---------------------------------------------------------------------------------------------
# workflows end to end (UNETLoader; the tiny SD CLIP-L stands in for CLIP-L + T5 until the T5
# encoder lands: the tiny Flux's context and pooled widths are its 32)


def flux_prompt(unet: str = "flux_tiny.safetensors", guidance: float = 4.0) -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l_tiny.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "FluxGuidance", "inputs": {"conditioning": ["3", 0], "guidance": guidance}},
        "6": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 48, "batch_size": 1}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": SEED, "steps": STEPS, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["5", 0], "negative": ["4", 0], "latent_image": ["6", 0],
            "denoise": 1.0}},
        "8": {"class_type": "VAELoader", "inputs": {"vae_name": "vae16.safetensors"}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["8", 0]}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": ["1", 0], "scheduler": "simple", "steps": STEPS, "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "BasicGuider", "inputs": {"model": ["1", 0], "conditioning": ["5", 0]}},
        "14": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["6", 0]}},
        "s7": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": "flux/ks"}},
        "s14": {"class_type": "SaveLatent", "inputs": {"samples": ["14", 0], "filename_prefix": "flux/adv"}},
        "s9": {"class_type": "PreviewImage", "inputs": {"images": ["9", 0]}},
    }


def test_flux_samples_through_ksampler_and_sampler_custom_advanced(executor, models):
    res = api.run(flux_prompt(), executor=executor, models=models, output=models / "out")
    ks, adv = res.outputs["7"][0].samples, res.outputs["14"][0].samples
    assert ks.shape == (1, 16, 6, 8) and torch.isfinite(ks).all() and ks.abs().max() > 0
    assert torch.allclose(ks, adv, atol=1e-5)
    image = res.outputs["9"][0]
    assert image.shape == (1, 48, 64, 3) and torch.isfinite(image).all()
    # the guidance reaches the model; the diffusers-layout file samples the same
    other = api.run(flux_prompt(guidance=1.0), executor=executor, models=models, output=models / "out")
    assert not torch.allclose(other.outputs["7"][0].samples, ks)
    diff = api.run(flux_prompt("flux_tiny_diffusers.safetensors"), executor=executor, models=models,
                   output=models / "out")
    assert torch.allclose(diff.outputs["7"][0].samples, ks, atol=1e-5)


def test_flux_nodes(executor, models):
    from mixgraph.nodes.declare.conditioning import flux_nodes
    from mixgraph.nodes.helpers.image_ops import KONTEXT_RESOLUTIONS
    from mixgraph.nodes.payloads.latent import Latent

    conds = (Cond(torch.zeros(1, 3, 32)),)
    (g,) = flux_nodes.FluxGuidance(conds, 2.5)
    assert g[0].model_inputs["guidance"] == 2.5
    assert flux_nodes.FluxDisableGuidance(g)[0][0].model_inputs["guidance"] is None
    a, b = torch.zeros(1, 16, 2, 2), torch.ones(1, 16, 3, 3)
    (r,) = flux_nodes.ReferenceLatent(flux_nodes.ReferenceLatent(conds, Latent(a))[0], Latent(b))
    assert [t.shape for t in r[0].model_inputs["reference_latents"]] == [a.shape, b.shape]
    assert flux_nodes.ReferenceLatent(conds, None)[0] is conds
    (m,) = flux_nodes.FluxKontextMultiReferenceLatentMethod(r, "uxo/uno")
    assert m[0].model_inputs["reference_latents_method"] == "uxo"
    (scaled,) = flux_nodes.FluxKontextImageScale(torch.rand(1, 100, 150, 3))
    assert scaled.shape == (1, 832, 1248, 3) and len(KONTEXT_RESOLUTIONS) == 17
    (latent,) = flux_nodes.EmptySD3LatentImage(1024, 768, 2)
    assert latent.samples.shape == (2, 16, 96, 128) and not latent.samples.any()
    # the specs ComfyUI clients read
    info = executor.registry.object_info()
    assert info["FluxGuidance"]["input"]["required"]["guidance"][1]["default"] == 3.5
    assert info["FluxGuidance"]["category"] == "advanced/conditioning/flux"
    assert info["EmptySD3LatentImage"]["input"]["required"]["width"][1]["default"] == 1024
    assert info["EmptySD3LatentImage"]["input"]["required"]["width"][1]["step"] == 16
    assert "latent" in info["ReferenceLatent"]["input"]["optional"]
    assert info["FluxKontextMultiReferenceLatentMethod"]["experimental"] is True
    assert info["FluxKontextMultiReferenceLatentMethod"]["input"]["required"]["reference_latents_method"][0] == [
        "offset", "index", "uxo/uno", "index_timestep_zero"]


def test_kontext_workflow_with_reference_latent(executor, models):
    prompt = flux_prompt()
    prompt["21"] = {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}}
    prompt["22"] = {"class_type": "ReferenceLatent", "inputs": {"conditioning": ["5", 0], "latent": ["21", 0]}}
    prompt["7"]["inputs"]["positive"] = ["22", 0]
    prompt["13"]["inputs"]["conditioning"] = ["22", 0]
    res = api.run(prompt, executor=executor, models=models, output=models / "out")
    plain = api.run(flux_prompt(), executor=executor, models=models, output=models / "out")
    ks = res.outputs["7"][0].samples
    assert ks.shape == (1, 16, 6, 8) and torch.isfinite(ks).all()
    assert not torch.allclose(ks, plain.outputs["7"][0].samples)
    assert torch.allclose(ks, res.outputs["14"][0].samples, atol=1e-5)


@pytest.mark.parametrize("kind", ["fill", "canny_depth"])
def test_fill_and_canny_depth_workflows(executor, models, kind):
    """Flux Fill through InpaintModelConditioning (masked image latent + folded mask: 96 input
    channels), Canny / Depth through InstructPixToPixConditioning (the control image latent: 32)."""
    from safetensors.torch import save_file

    channels = {"fill": 96, "canny_depth": 32}[kind]
    cfg = FluxConfig(**{**TINY.__dict__, "in_channels": channels})
    name = f"flux_{kind}.safetensors"
    if not (models / "diffusion_models" / name).exists():
        save_file(flux_state_dict(cfg, seed=8), str(models / "diffusion_models" / name))
    prompt = flux_prompt(name)
    prompt["30"] = {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1,
                                                            "color": 0x8040C0}}
    prompt["31"] = {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 64, "height": 48}}
    if kind == "fill":
        prompt["32"] = {"class_type": "InpaintModelConditioning", "inputs": {
            "positive": ["5", 0], "negative": ["4", 0], "vae": ["8", 0], "pixels": ["30", 0], "mask": ["31", 0],
            "noise_mask": True}}
    else:
        prompt["32"] = {"class_type": "InstructPixToPixConditioning", "inputs": {
            "positive": ["5", 0], "negative": ["4", 0], "vae": ["8", 0], "pixels": ["30", 0]}}
    prompt["7"]["inputs"].update(positive=["32", 0], negative=["32", 1], latent_image=["32", 2])
    prompt["13"]["inputs"]["conditioning"] = ["32", 0]
    prompt["14"]["inputs"]["latent_image"] = ["32", 2]
    res = api.run(prompt, executor=executor, models=models, output=models / "out")
    ks = res.outputs["7"][0].samples
    assert ks.shape == (1, 16, 6, 8) and torch.isfinite(ks).all()
    assert torch.allclose(ks, res.outputs["14"][0].samples, atol=1e-5)
    assert res.outputs["9"][0].shape == (1, 48, 64, 3)


def test_all_in_one_checkpoint(tmp_path):
    """ComfyUI's all-in-one Flux checkpoint layout: the model under ``model.diffusion_model.``, the
    VAE under ``vae.``, CLIP-L under ``text_encoders.clip_l.transformer.`` (no T5 here: the CLIP
    needs both, so none is made)."""
    from safetensors.torch import save_file

    from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
    from tests.flux_fixtures import tiny_vae16_state_dict

    sd = {"model.diffusion_model." + k: v for k, v in flux_state_dict(TINY, seed=2).items()}
    sd |= {"vae." + k: v for k, v in tiny_vae16_state_dict(1).items()}
    sd |= {"text_encoders.clip_l.transformer." + k: v for k, v in tiny_clip_l_state_dict(4, width=32).items()}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "flux_aio.safetensors"))
    model, clip, vae = loader.load_checkpoint(tmp_path / "flux_aio.safetensors")
    assert (model.family, model.kind, model.config) == ("flux", "dev", TINY)
    assert vae is not None and vae.source.prefix == "vae." and vae.config.latent_channels == 16
    assert clip is None


def test_half_precision_keeps_the_conditioning_vector_f32_in_both_layouts(models):
    """Under bf16 the embedders of the conditioning vector and the last layer stay f32
    (``Flux.keep_f32``), whichever layout the file stores; both layouts give the same bf16 model."""
    dm = models / "diffusion_models"
    bf16 = parse_spec("bf16")
    runners = [loader.load_unet(dm / name).runner(bf16)
               for name in ("flux_tiny.safetensors", "flux_tiny_diffusers.safetensors")]
    for r in runners:
        assert r.model.time_in.in_layer.weight.dtype == torch.float32
        assert r.model.final_layer.adaLN_modulation[1].weight.dtype == torch.float32
        assert r.model.double_blocks[0].img_attn.qkv.weight.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(3)
    x, ctx = torch.randn(1, 16, 4, 4, generator=g), torch.randn(1, 5, 32, generator=g)
    inputs = {"y": torch.randn(1, 32, generator=g), "guidance": torch.tensor([3.5])}
    a, b = (r(x, torch.tensor([0.3]), ctx, inputs) for r in runners)
    assert a.dtype == torch.float32 and torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-6)
    f32 = loader.load_unet(dm / "flux_tiny.safetensors").runner(_f32())(x, torch.tensor([0.3]), ctx, inputs)
    assert (a - f32).abs().max() < 0.05 * f32.abs().max()
    # fp8 storage: the QK norms' scales stay f32 (``keep_f32`` "*.norm"), the Linears are fp8
    fp8 = loader.load_unet(dm / "flux_tiny_diffusers.safetensors").runner(parse_spec("fp8_e4m3fn:bf16"))
    assert fp8.model.double_blocks[0].img_attn.norm.query_norm.scale.dtype == torch.float32
    assert fp8.model.single_blocks[0].norm.key_norm.scale.dtype == torch.float32
    assert fp8.model.single_blocks[0].linear1.weight.dtype == torch.float8_e4m3fn
    assert torch.isfinite(fp8(x, torch.tensor([0.3]), ctx, inputs)).all()


def test_memory_estimate_uses_the_family(models):
    from mixgraph.ui.estimate import estimate

    wf = api.load(flux_prompt(), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    assert est["nodes"]["7"]["activation_bytes"] > 0 and est["nodes"]["7"]["weights_bytes"] > 0
    # the sampled latent's size is followed through EmptySD3LatentImage (nothing assumed)
    big = api.load(flux_prompt(), api.default_registry())
    for call in big.prompt.values():
        if call.class_type == "EmptySD3LatentImage":
            call.inputs.update(width=256, height=256)
    est_big = estimate(big, api.default_registry(), Env.from_args(models=str(models)), "f32")
    assert "assumed" not in est_big["nodes"]["7"] and \
        est_big["nodes"]["7"]["activation_bytes"] > est["nodes"]["7"]["activation_bytes"]


def test_loras_in_bfl_names_patch_the_model(models, tmp_path):
    """kohya (``lora_unet_double_blocks_0_img_attn_qkv``) and ComfyUI (``diffusion_model.<key>``)
    LoRA names reach the BFL-named weights (diffusers-named Flux LoRAs, split q / k / v:
    tests/test_dit_lora.py)."""
    from safetensors.torch import save_file

    from mixgraph.nodes.adapters.lora import load_lora_patches

    g = torch.Generator().manual_seed(1)
    sd = {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.randn(192, 4, generator=g),
          "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.randn(4, 64, generator=g),
          "diffusion_model.single_blocks.1.linear1.lora_A.weight": torch.randn(4, 64, generator=g),
          "diffusion_model.single_blocks.1.linear1.lora_B.weight": torch.randn(448, 4, generator=g)}
    save_file(sd, str(tmp_path / "lora.safetensors"))
    want = 0.5 * sd["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"] @ sd[
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"]
    for name in ("flux_tiny.safetensors", "flux_tiny_diffusers.safetensors"):  # either layout as the base
        base = loader.load_unet(models / "diffusion_models" / name)
        assert base.weight_shapes()["double_blocks.0.img_attn.qkv.weight"] == (192, 64)
        patched, _ = load_lora_patches(tmp_path / "lora.safetensors", base, None, 0.5, 0.0)
        a = dict(base.runner(_f32()).model.named_parameters())
        b = dict(patched.runner(_f32()).model.named_parameters())
        assert torch.allclose(b["double_blocks.0.img_attn.qkv.weight"] - a["double_blocks.0.img_attn.qkv.weight"],
                              want, atol=1e-5)
        assert not torch.equal(a["single_blocks.1.linear1.weight"], b["single_blocks.1.linear1.weight"])
        assert torch.equal(a["single_blocks.0.linear1.weight"], b["single_blocks.0.linear1.weight"])


def test_look_alikes_are_not_flux_1():
    """Files sharing Flux.1's block names but another model stay refused: Hunyuan Video, Flux.2
    (shared modulation), a file missing the detection keys."""
    sd = {k: tuple(v.shape) for k, v in flux_state_dict(TINY).items()}
    assert FLUX.detect(sd) is not None
    for extra in ("txt_in.individual_token_refiner.blocks.0.norm1.weight", "double_stream_modulation_img.lin.weight"):
        assert FLUX.detect({**sd, extra: (4,)}) is None
    assert FLUX.detect({k: v for k, v in sd.items() if k != "img_in.weight"}) is None
    flux2 = {**sd, "double_stream_modulation_img.lin.weight": (4,)}
    assert refused.detect_family(flux2) == "Flux.2" and refused.detect_family(sd) is None


def test_checkpoint_save_round_trip(models, tmp_path):
    """CheckpointSave writes ComfyUI's all-in-one layout (``FLUX.checkpoint_layout``); the file
    loads back as the same model (a diffusers-layout source is written in BFL's keys)."""
    from safetensors.torch import save_file

    from mixgraph.nodes.weights import save

    model = loader.load_unet(models / "diffusion_models" / "flux_tiny_diffusers.safetensors")
    vae = loader.load_vae(models / "vae" / "vae16.safetensors")
    sd = save.checkpoint_state_dict(model, None, vae)
    assert "model.diffusion_model.double_blocks.0.img_attn.qkv.weight" in sd and "vae.decoder.conv_in.weight" in sd
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "saved.safetensors"))
    back, clip, back_vae = loader.load_checkpoint(tmp_path / "saved.safetensors")
    assert (back.family, back.kind, back.config) == ("flux", "dev", TINY) and back_vae is not None and clip is None
    ref = flux_state_dict(TINY, seed=3)  # write_flux_models' weights
    assert all(torch.equal(sd["model.diffusion_model." + k], v) for k, v in ref.items())
