"""The SD3 / SD3.5 family (``nodes/families/sd3``): the MMDiT against diffusers'
``SD3Transformer2DModel`` on tiny configs in the real key layouts (SD3 Medium-like, SD3.5
Large-like with q/k RMS norms, SD3.5 Medium-like with the second self-attention), loading from
ComfyUI / Stability single files and diffusers files and folders, the runner's conditioning,
and workflows through ``mixgraph.ui.api`` (UNETLoader + ModelSamplingSD3 + KSampler /
SamplerCustomAdvanced, skip-layer guidance, a ``[bf16]`` region, the memory estimate)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families import refused
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.sd3.diffusers_keys import converted_shapes
from mixgraph.nodes.families.sd3.family import SD3
from mixgraph.nodes.families.sd3.mmdit import MMDiT, MMDiTConfig, config_from_shapes
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond, Control
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.nodes.vae.flow_latent_formats import SD3_LATENT
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_sd3 import (KINDS, TEXT_WIDTH, comfy_state_dict, diffusers_sd3, write_sd3_diffusers_file,
                                     write_sd3_diffusers_folder, write_sd3_unet)

SEED, STEPS = 5, 3
KIND = "sd35_medium"  # the workflows' model: every kind of block (qk norms, attn2, pre-only)


def _inputs(h: int = 8, w: int = 8, batch: int = 2, tokens: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 16, h, w, generator=g), torch.tensor([700.0, 30.0][:batch]),
            torch.randn(batch, tokens, TEXT_WIDTH, generator=g), torch.randn(batch, TEXT_WIDTH, generator=g))


# --------------------------------------------------------------------------------------------
# the model against diffusers


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mmdit_matches_diffusers(kind):
    """Same weights (converted by the family's key map), same outputs: square and non-square
    latents (the cropped position table), with and without skipped blocks (diffusers'
    ``skip_layers``, what skip-layer guidance asks)."""
    ref = diffusers_sd3(kind, seed=1)
    sd = comfy_state_dict(ref)
    cfg = config_from_shapes(sd)
    n = KINDS[kind]["num_layers"]
    assert (cfg.depth, cfg.hidden, cfg.heads, cfg.patch_size, cfg.pos_embed_max_size) == (n, 64 * n, n, 2, 16)
    assert (cfg.context_in, cfg.adm_in_channels) == (TEXT_WIDTH, TEXT_WIDTH)
    assert cfg.qk_norm == ("qk_norm" in KINDS[kind])
    assert cfg.x_block_self_attn_layers == tuple(KINDS[kind].get("dual_attention_layers", ()))
    assert config_from_shapes(converted_shapes(ref.state_dict())) == cfg  # detection of the diffusers layout
    model = MMDiT(cfg).eval()
    model.load_state_dict(sd, strict=True)
    assert not model.joint_blocks[-1].context_block.pre_only or not hasattr(model.joint_blocks[-1].context_block,
                                                                              "mlp")
    for h, w in ((8, 8), (6, 10)):
        x, t, ctx, y = _inputs(h, w)
        with torch.no_grad():
            want = ref(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=y, timestep=t).sample
            got = model(x, t, ctx, y)
            want_skip = ref(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=y, timestep=t,
                            skip_layers=[1]).sample
            got_skip = model(x, t, ctx, y, skip={1})
        assert got.shape == (2, 16, h, w)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        assert (got_skip - want_skip).abs().max() <= 1e-4 * want_skip.abs().max()
        assert (want - want_skip).abs().max() > 1e-2  # skipping a block changes the output


def test_config_from_shapes_refuses_what_it_does_not_build():
    sd = comfy_state_dict(diffusers_sd3("sd3"))
    assert config_from_shapes({k: v for k, v in sd.items() if k != "pos_embed"}) is None
    assert config_from_shapes({**sd, "context_processor.layers.0.attn.qkv.weight": torch.zeros(1)}) is None
    assert SD3.detect({"joint_blocks.0.context_block.attn.qkv.weight": (1,)}) is None  # a marker-only file


def test_mmdit_odd_latent_is_padded_and_cropped():
    """A latent side not divisible by the patch is padded circularly and the output cropped
    back, as ComfyUI's PatchEmbed / MMDiT.forward do; too large a latent is refused by name."""
    model = MMDiT(MMDiTConfig(depth=2, pos_embed_max_size=4, context_in=TEXT_WIDTH, adm_in_channels=None)).eval()
    x = torch.randn(1, 16, 7, 5)
    with torch.no_grad():
        out = model(x, torch.tensor([10.0]), torch.randn(1, 3, TEXT_WIDTH))
    assert out.shape == (1, 16, 7, 5)
    with pytest.raises(ValueError, match=r"5x5 patch grid is larger than the model's 4x4 position table"):
        model(torch.randn(1, 16, 10, 10), torch.tensor([10.0]), torch.randn(1, 3, TEXT_WIDTH))


# --------------------------------------------------------------------------------------------
# loading


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd3_family")
    write_sd3_unet(root / "diffusion_models" / "sd3.safetensors", KIND, seed=3)
    write_sd3_unet(root / "diffusion_models" / "sd3_bare.safetensors", KIND, seed=3, prefix="")
    write_sd3_diffusers_file(root / "diffusion_models" / "sd3_diffusers" / "diffusion_pytorch_model.safetensors",
                             KIND, seed=3)
    write_sd3_diffusers_folder(root / "checkpoints" / "sd3_pipeline", KIND, seed=3)
    (root / "text_encoders").mkdir()
    save_file({k: v.contiguous() for k, v in tiny_clip_l_state_dict(4, width=TEXT_WIDTH).items()},
              str(root / "text_encoders" / "clip_l.safetensors"))
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def _f32():
    return parse_spec("f32")


def test_sd3_files_load_in_every_layout(models):
    """The single file (with and without ``model.diffusion_model.``), diffusers' transformer file
    and a diffusers pipeline folder give the same model; none is refused any more."""
    unet = loader.load_unet(models / "diffusion_models" / "sd3.safetensors")
    assert (unet.family, unet.kind, unet.prediction) == ("sd3", "sd3", "flow")
    assert unet.sampling.shift == 3.0 and unet.sampling.multiplier == 1000.0
    assert unet.latent_format == SD3_LATENT and unet.source.prefix == "model.diffusion_model."
    ms = ModelSampling.for_model(unet)
    assert ms.is_flow and float(ms.timestep(torch.tensor(0.5))) == pytest.approx(500.0)
    bare = loader.load_unet(models / "diffusion_models" / "sd3_bare.safetensors")
    diff = loader.load_unet(models / "diffusion_models" / "sd3_diffusers" / "diffusion_pytorch_model.safetensors")
    folder_unet = loader.load_unet(models / "checkpoints" / "sd3_pipeline")
    model, clip, vae = loader.load_checkpoint(models / "checkpoints" / "sd3_pipeline")
    assert diff.source.layout == folder_unet.source.layout == model.source.layout == "diffusers_sd3"
    assert {bare.config, diff.config, folder_unet.config, model.config} == {unet.config}
    assert model.prediction == "flow" and clip is None and vae is None  # the folder holds the transformer only
    for path in (models / "diffusion_models" / "sd3.safetensors", models / "checkpoints" / "sd3_pipeline"):
        assert refused.family_of_file(path) is None
    x, t, ctx, y = _inputs()
    outs = [h.runner(_f32())(x, t, ctx, {"y": y}) for h in (unet, bare, diff, model)]
    for out in outs[1:]:
        assert (out - outs[0]).abs().max() <= 1e-5 * outs[0].abs().max()
    # bf16 storage: the diffusers parts are cast then fused, the same values as fused then cast
    bf16 = parse_spec("bf16")
    assert torch.equal(unet.runner(bf16)(x, t, ctx, {"y": y}), diff.runner(bf16)(x, t, ctx, {"y": y}))
    sd = loader.load_checkpoint(models / "checkpoints" / "sd15.safetensors")[0]
    assert (sd.family, sd.kind) == ("sd", "sd1")


def test_a_checkpoint_with_its_vae_and_encoders_is_not_refused(tmp_path):
    """An all-in-one SD3 checkpoint keeps a 16-channel VAE and T5 beside the MMDiT: the file is the
    SD3 family's, not refused for those parts; a standalone 16-channel VAE is no refusal either (the
    KL VAE runs it, tests/test_vae16.py)."""
    sd = {"model.diffusion_model." + k: v for k, v in comfy_state_dict(diffusers_sd3("sd3")).items()}
    sd["first_stage_model.decoder.conv_in.weight"] = torch.zeros(8, 16, 3, 3)
    sd["text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight"] = torch.zeros(2, 2)
    path = tmp_path / "sd3_all_in_one.safetensors"
    save_file(sd, str(path))
    assert refused.family_of_file(path) is None
    ae = tmp_path / "ae.safetensors"
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, str(ae))
    assert refused.family_of_file(ae) is None


def test_all_in_one_checkpoint_gives_model_and_vae(models, tmp_path):
    """Stability's all-in-one layout: the MMDiT under ``model.diffusion_model.``, the text encoders
    under ``text_encoders.*.transformer.``, the 16-channel VAE under ``first_stage_model.``;
    CheckpointLoaderSimple gives the model and the VAE in SD3's latent format, saving writes them
    back in that layout, and a workflow samples and decodes with them."""
    from mixgraph.nodes.weights.synthetic import TINY_VAE
    from tests.fixtures.checkpoints import tiny_vae_state_dict

    vae_cfg = dataclasses.replace(TINY_VAE, z_channels=16, embed_dim=16, use_quant_conv=False)
    sd = {"model.diffusion_model." + k: v for k, v in comfy_state_dict(diffusers_sd3(KIND, seed=3)).items()}
    sd |= {"first_stage_model." + k: v for k, v in tiny_vae_state_dict(2, vae_cfg).items()}
    sd |= {"text_encoders.clip_l.transformer." + k: v for k, v in tiny_clip_l_state_dict(4, width=32).items()}
    sd |= {"text_encoders.clip_g.transformer." + k: v
           for k, v in tiny_clip_l_state_dict(5, width=64, proj=64).items()}
    (models / "checkpoints").mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(models / "checkpoints" / "sd3_aio.safetensors"))
    model, _clip, vae = loader.load_checkpoint(models / "checkpoints" / "sd3_aio.safetensors")
    assert (model.family, model.config) == ("sd3", loader.load_unet(models / "diffusion_models" /
                                                                    "sd3.safetensors").config)
    assert vae is not None and vae.latent_format == SD3_LATENT and vae.config.z_channels == 16
    # saved back (CheckpointSave's layout): the same keys and values for the model and the VAE
    from mixgraph.nodes.weights import save

    written = save.checkpoint_state_dict(model, None, vae)
    assert set(written) == {k for k in sd if not k.startswith("text_encoders.")}
    assert all(torch.equal(written[k], sd[k]) for k in written)
    assert save.checkpoint_metadata(model, "t") == {"modelspec.architecture": "stable-diffusion-v3-medium",
                                                    "modelspec.sai_model_spec": "1.0.0",
                                                    "modelspec.implementation": "sgm", "modelspec.title": "t"}
    p = prompt()
    p["1"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd3_aio.safetensors"}}
    p["d"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 2]}}
    p["pi"] = {"class_type": "PreviewImage", "inputs": {"images": ["d", 0]}}
    res = api.run(p, models=models, output=models / "out")
    image = res.outputs["d"][0]
    assert image.shape == (2, 64, 64, 3) and torch.isfinite(image).all()


def test_family_declarations():
    assert families.get("sd3") is SD3 and "SD3 / SD3.5" in SD3.refusals and SD3.clip_types == {"sd3": "sd3"}
    slots = SD3.text_encoders("sd3")
    assert [(s.name, s.tokenizer, s.arch, s.optional, s.encoding) for s in slots] == [
        ("clip_l", "clip", "clip", True, "sd3"), ("clip_g", "clip", "clip", True, "sd3"),
        ("t5xxl", "t5", "t5", True, "sd3")]
    assert [s.prefix for s in slots] == ["text_encoders.clip_l.transformer.", "text_encoders.clip_g.transformer.",
                                         "text_encoders.t5xxl.transformer."]
    assert [s.folder for s in slots] == ["text_encoder", "text_encoder_2", "text_encoder_3"]
    assert [s.rule.pooled for s in slots] == [True, True, False]
    assert not slots[0].rule.project_pooled and slots[1].rule.project_pooled  # ComfyUI's sd3_clip
    cfg = MMDiTConfig(depth=2, pos_embed_max_size=8, context_in=4096, adm_in_channels=2048)
    args, kwargs = SD3.trace_inputs(cfg, (16, 24), 2)
    assert [tuple(a.shape) for a in args] == [(2, 16, 16, 24), (2,), (2, 154, 4096), (2, 2048)] and kwargs == {}


# --------------------------------------------------------------------------------------------
# the runner


def test_runner_conditioning(models):
    model = loader.load_unet(models / "diffusion_models" / "sd3.safetensors")
    runner = model.runner(_f32())
    assert runner.skippable_blocks == {"double_block": 3} and runner.in_channels == 16
    text = torch.randn(1, 7, TEXT_WIDTH, generator=torch.Generator().manual_seed(1))
    pooled = torch.randn(1, TEXT_WIDTH, generator=torch.Generator().manual_seed(2))
    assert torch.equal(runner.cond_inputs(Cond(text, pooled=pooled), (1, 16, 8, 8))["y"], pooled)
    assert torch.equal(runner.cond_inputs(Cond(text), (1, 16, 8, 8))["y"], torch.zeros(1, TEXT_WIDTH))
    with pytest.raises(ValueError, match="pooled text vector is 48 wide; this model takes 32"):
        runner.cond_inputs(Cond(text, pooled=torch.zeros(1, 48)), (1, 16, 8, 8))
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.6, 0.6])

    def x0(cond, uncond=Cond(text)):
        return CFGDenoiser(runner, (cond,), (uncond,), 2.0, torch.zeros_like(x))(x, sigma)

    base = x0(Cond(text, pooled=pooled))
    assert torch.isfinite(base).all() and not torch.equal(base, x0(Cond(text, pooled=pooled * 2)))
    with pytest.raises(ValueError, match="text tokens 48 wide; this model takes 32"):
        runner(x, torch.tensor([500.0, 500.0]), torch.zeros(2, 7, 48), {})
    with pytest.raises(ValueError, match="SD 1.x / SDXL ControlNet or T2I-Adapter"):  # SD3's: test_dit_controlnet.py
        runner(x, torch.tensor([500.0, 500.0]), text.repeat(2, 1, 1), {}, control=Control(input=[x]))
    assert "text tokens" in runner.context_free_refusal()


# --------------------------------------------------------------------------------------------
# workflows


def prompt(sampler="euler", scheduler="simple", model=("m", 0)):
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "sd3.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"}},
        "m": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 3.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": list(model), "seed": SEED, "steps": STEPS, "cfg": 4.0, "sampler_name": sampler,
            "scheduler": scheduler, "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": list(model), "scheduler": scheduler, "steps": STEPS, "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "CFGGuider", "inputs": {
            "model": list(model), "positive": ["6", 0], "negative": ["7", 0], "cfg": 4.0}},
        "21": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["5", 0]}},
        "s3": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "sd3/ks"}},
        "s21": {"class_type": "SaveLatent", "inputs": {"samples": ["21", 0], "filename_prefix": "sd3/adv"}},
    }


@pytest.mark.parametrize("sampler,scheduler", [("euler", "simple"), ("dpmpp_2m", "sgm_uniform"),
                                               ("euler", "beta"), ("dpmpp_2m", "simple")])
def test_sd3_samples_through_ksampler_and_sampler_custom_advanced(executor, models, sampler, scheduler):
    res = api.run(prompt(sampler, scheduler), executor=executor, models=models, output=models / "out")
    ks, adv = res.outputs["3"][0].samples, res.outputs["21"][0].samples
    # EmptyLatentImage's 4 zero channels become SD3's 16 (fix_empty_latent_channels)
    assert ks.shape == (2, 16, 8, 8) and torch.isfinite(ks).all() and ks.abs().max() > 0
    assert torch.equal(adv, ks)


@torch.inference_mode()
def test_sampling_is_the_flow_ode_on_the_model(executor, models):
    """KSampler (euler, simple) on the SD3 model is the Euler flow ODE with ComfyUI's schedule
    and CFG, written out here from the formulas: x ← x + (σ' − σ)·v, v = uncond + 4·(cond − uncond)
    evaluated on the model, the latent scaled by SD3's format on the way in and out."""
    res = api.run(prompt(), executor=executor, models=models, output=models / "out")
    from mixgraph.nodes.sampling.noise import prepare_noise

    model = loader.load_unet(models / "diffusion_models" / "sd3.safetensors")
    runner = model.runner(_f32())
    clip = loader.load_clip([models / "text_encoders" / "clip_l.safetensors"])
    pos, neg = (clip.encode(t, _f32())[0] for t in ("a red cube", "blurry"))
    t = torch.arange(1, 1001) / 1000.0
    table = 3.0 * t / (1 + 2.0 * t)  # SD3's shifted sigmas (shift 3) at t = k/1000
    # ComfyUI's simple scheduler: every (1000 / steps)-th entry from the top, then 0
    sigmas = torch.cat([table[[999, 666, 333]], torch.zeros(1)])
    x = prepare_noise(torch.zeros(2, 16, 8, 8), SEED) * sigmas[0]  # σ_max = 1: pure noise
    for i in range(STEPS):
        s = sigmas[i]
        ts = torch.full((2,), float(s) * 1000.0)
        cond = runner(x, ts, pos.cross_attn.repeat(2, 1, 1), {"y": pos.pooled.repeat(2, 1)})
        uncond = runner(x, ts, neg.cross_attn.repeat(2, 1, 1), {"y": neg.pooled.repeat(2, 1)})
        v = uncond + 4.0 * (cond - uncond)
        x = x + (sigmas[i + 1] - s) * v
    want = SD3_LATENT.process_out(x)
    got = res.outputs["3"][0].samples
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_skip_layer_guidance(executor, models):
    """SkipLayerGuidanceSD3 changes the result inside its sigma range only, leaves layers the
    model does not have alone (ComfyUI's semantics) and is refused by name on a model without
    joint blocks."""
    base = api.run(prompt(), executor=executor, models=models, output=models / "out").outputs["3"][0].samples

    def with_slg(layers, scale=3.0, start=0.0, end=1.0, loader_node=None):
        p = prompt(model=("g", 0))
        p["g"] = {"class_type": "SkipLayerGuidanceSD3", "inputs": {
            "model": ["m", 0], "layers": layers, "scale": scale, "start_percent": start, "end_percent": end}}
        if loader_node is not None:
            p.update(loader_node)
        return api.run(p, executor=executor, models=models, output=models / "out").outputs["3"][0].samples

    slg = with_slg("1, 2")
    assert torch.isfinite(slg).all() and not torch.equal(slg, base)
    # no such blocks: the skipped pass is the cond again (evaluated alone, so equal to rounding)
    assert torch.allclose(with_slg("7, 8, 9"), base, atol=1e-4, rtol=0)
    assert torch.equal(with_slg("1", scale=0.0), base)
    assert torch.equal(with_slg("", scale=3.0), base)
    assert torch.equal(with_slg("1", start=0.9, end=0.95), base)  # no step's sigma in that range
    dit = prompt(model=("g", 0))
    dit["g"] = {"class_type": "SkipLayerGuidanceDiT", "inputs": {
        "model": ["m", 0], "double_layers": "1, 2", "single_layers": "7", "scale": 3.0, "start_percent": 0.0,
        "end_percent": 1.0, "rescaling_scale": 0.0}}
    assert torch.equal(api.run(dit, executor=executor, models=models, output=models / "out").outputs["3"][0].samples,
                       slg)  # SD3 has no single blocks: the same guidance
    sd15 = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
            "m": {"class_type": "ModelSamplingDiscrete", "inputs": {"model": ["1", 0], "sampling": "eps",
                                                                     "zsnr": False}},
            "2": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}}}
    p = prompt(model=("g", 0))
    p.update(sd15)
    p["6"]["inputs"]["clip"] = p["7"]["inputs"]["clip"] = ["1", 1]
    p["g"] = {"class_type": "SkipLayerGuidanceSD3", "inputs": {
        "model": ["m", 0], "layers": "1", "scale": 3.0, "start_percent": 0.0, "end_percent": 1.0}}
    with pytest.raises(Exception, match=r"skip-layer guidance: this model \(sd1\) has no double_block blocks"):
        api.run(p, executor=executor, models=models, output=models / "out")


def test_sd3_runs_under_precision_regions(models):
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    wf = load_workflow({"format": "mixgraph/1", "prompt": prompt(), "precision": {
        "default": "f32", "regions": [{"name": "sampling [bf16]", "nodes": ["3"], "precision": "bf16"}]}},
        executor.registry)
    report = executor.run(wf, env=dataclasses.replace(executor.env, output=str(models / "out")))
    nodes = report.to_json()["nodes"]
    assert nodes["3"]["precision"] == "bf16" and nodes["21"]["precision"] == "f32"
    bf16, f32 = report.values["3"][0].samples, report.values["21"][0].samples
    assert torch.isfinite(bf16).all() and not torch.equal(bf16, f32)
    assert (bf16 - f32).abs().max() <= 0.1 * f32.abs().max()  # the same picture, in bf16


@torch.inference_mode()
def test_bf16_model_keeps_its_embedders_f32(models):
    from mixgraph.nodes.weights import store

    model = loader.load_unet(models / "diffusion_models" / "sd3.safetensors")
    module = store.materialize("unet", model.source, model.config, torch.bfloat16, (), SD3.build)
    dtypes = {k: v.dtype for k, v in module.state_dict().items()}
    assert dtypes["t_embedder.mlp.0.weight"] == dtypes["y_embedder.mlp.2.weight"] == torch.float32
    assert dtypes["pos_embed"] == dtypes["joint_blocks.0.x_block.attn.ln_q.weight"] == torch.float32
    assert dtypes["joint_blocks.0.x_block.attn.qkv.weight"] == torch.bfloat16


def test_sd3_memory_estimate_uses_the_family(models):
    from mixgraph.ui.estimate import estimate

    wf = api.load(prompt(), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    # the weights count where the model is first used (ModelSamplingSD3), the activations at the sampler
    assert est["nodes"]["3"]["activation_bytes"] > 0 and est["nodes"]["m"]["weights_bytes"] > 0
