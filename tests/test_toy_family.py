"""A new model family is a family object plus one registry line (``tests/toy_family.py``): the
toy flow transformer is detected from its own keys, samples through KSampler and
SamplerCustomAdvanced with its own conditioning and latent format, and runs under precision
regions, with no change to shared code."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.toy_family import TEXT_PREFIX, TOY, ToyConfig, toy_state_dict

CFG = ToyConfig()
SEED, STEPS = 7, 3


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    families.register(TOY)
    yield
    families.unregister(TOY.name)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_family")
    sd = {"model.diffusion_model." + k: v for k, v in toy_state_dict(CFG, seed=3).items()}
    sd |= {TEXT_PREFIX + k: v for k, v in tiny_clip_l_state_dict(4, width=32).items()}
    (root / "checkpoints").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "checkpoints" / "toy.safetensors"))
    (root / "diffusion_models").mkdir()
    save_file({k: v.contiguous() for k, v in toy_state_dict(CFG, seed=3).items()},
              str(root / "diffusion_models" / "toy_dit.safetensors"))
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def test_toy_is_detected_from_its_keys_and_sd_stays_sd(models):
    model, clip, vae = loader.load_checkpoint(models / "checkpoints" / "toy.safetensors")
    assert (model.family, model.kind, model.config) == ("toy", "toy", CFG)
    assert model.latent_format == TOY.latent_format("toy", CFG.channels) and model.latent_format.mean[0] == 0.1
    assert model.prediction == "flow" and model.sampling.shift == 3.0
    ms = ModelSampling.for_model(model)
    assert ms.is_flow and float(ms.timestep(torch.tensor(1.0))) == pytest.approx(1000.0)
    assert clip is not None and clip.names == ("clip_l",) and vae is None
    alone = loader.load_unet(models / "diffusion_models" / "toy_dit.safetensors")
    assert (alone.family, alone.config, alone.source.prefix) == ("toy", CFG, "")
    sd = loader.load_checkpoint(models / "checkpoints" / "sd15.safetensors")[0]
    assert (sd.family, sd.kind) == ("sd", "sd1")


def test_toy_conditioning_is_its_own(models):
    model = loader.load_checkpoint(models / "checkpoints" / "toy.safetensors")[0]
    runner = model.runner(_f32())
    text = torch.randn(1, 77, CFG.context_dim, generator=torch.Generator().manual_seed(1))
    pooled = torch.randn(1, CFG.pooled_dim, generator=torch.Generator().manual_seed(2))
    x = torch.randn(2, CFG.channels, 8, 8, generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.5, 0.5])

    def x0(cond):
        d = CFGDenoiser(runner, (cond,), (Cond(text),), 1.0, torch.zeros_like(x))
        return d(x, sigma)

    base = x0(Cond(text, pooled=pooled))
    inputs = runner.cond_inputs(Cond(text, pooled=pooled, model_inputs={"guidance": 7.0}), (2, 4, 8, 8))
    assert set(inputs) == {"pooled", "guidance"} and float(inputs["guidance"]) == 7.0
    assert torch.isfinite(base).all()
    assert not torch.equal(base, x0(Cond(text, pooled=pooled, model_inputs={"guidance": 7.0})))
    assert torch.equal(base, x0(Cond(text, pooled=pooled, model_inputs={"guidance": 3.5})))  # the default
    assert not torch.equal(base, x0(Cond(text, pooled=pooled * 2)))


def _f32():
    from mixgraph.graph.precision import parse_spec

    return parse_spec("f32")


def prompt():
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "toy.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": SEED, "steps": STEPS, "cfg": 4.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "BasicScheduler", "inputs": {
            "model": ["4", 0], "scheduler": "simple", "steps": STEPS, "denoise": 1.0}},
        "12": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "13": {"class_type": "CFGGuider", "inputs": {
            "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": 4.0}},
        "21": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["12", 0], "guider": ["13", 0], "sampler": ["10", 0], "sigmas": ["11", 0],
            "latent_image": ["5", 0]}},
        "s3": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "toy/ks"}},
        "s21": {"class_type": "SaveLatent", "inputs": {"samples": ["21", 0], "filename_prefix": "toy/adv"}},
    }


def test_toy_samples_through_ksampler_and_sampler_custom_advanced(executor, models):
    res = api.run(prompt(), executor=executor, models=models, output=models / "out")
    ks = res.outputs["3"][0].samples
    adv = res.outputs["21"][0].samples
    # EmptyLatentImage's 4 zero channels become the toy's 16 (fix_empty_latent_channels)
    assert ks.shape == (2, CFG.channels, 8, 8) and torch.isfinite(ks).all() and ks.abs().max() > 0
    assert torch.equal(adv, ks)


def test_toy_runs_under_precision_regions(models):
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    TOY.policies.clear()
    wf = load_workflow({"format": "mixgraph/1", "prompt": prompt(), "precision": {
        "default": "f32", "regions": [{"name": "sampling [bf16]", "nodes": ["3"], "precision": "bf16"}]}},
        executor.registry)
    report = executor.run(wf, env=dataclasses.replace(executor.env, output=str(models / "out")))
    nodes = report.to_json()["nodes"]
    assert nodes["3"]["precision"] == "bf16" and nodes["21"]["precision"] == "f32"
    assert {p.compute for p in TOY.policies} == {torch.bfloat16, torch.float32}
    bf16 = report.values["3"][0].samples
    assert torch.isfinite(bf16).all() and not torch.equal(bf16, report.values["21"][0].samples)

    TOY.policies.clear()
    typed = api.run(prompt(), executor=executor, models=models, output=models / "out", precision="MODEL=bf16")
    assert {p.compute for p in TOY.policies} == {torch.bfloat16}
    assert torch.equal(typed.outputs["3"][0].samples, typed.outputs["21"][0].samples)


def test_toy_memory_estimate_uses_the_family(models):
    from mixgraph.ui.estimate import estimate

    wf = api.load(prompt(), api.default_registry())
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(models)), "f32")
    assert est["nodes"]["3"]["activation_bytes"] > 0 and est["nodes"]["3"]["weights_bytes"] > 0


def test_a_registered_family_takes_its_files_over_from_the_refusal_table():
    """The table of families mixgraph does not run (``families/refused.py``) stops refusing a
    row's files once a registered family names the row in its ``refusals`` and recognises the
    file, so a new family needs no edit there; refusals name the registered families."""
    from mixgraph.nodes.families import refused
    from mixgraph.nodes.families.base import Detection

    key = "joint_blocks.0.context_block.attn.qkv.weight"  # the SD3 / SD3.5 row of the table
    info = {f"model.diffusion_model.{key}": (12, 4), "model.diffusion_model.x_embedder.proj.weight": (4, 4, 2, 2)}

    class ClaimsSD3:
        name, display, precision_roles = "toy_sd3", "Toy SD3", {}
        refusals = ("SD3 / SD3.5",)

        def detect(self, info, read=None, source=None):
            return Detection(self.name, "toy", None) if key in info else None

        build = runner = sampling = latent_format = text_encoders = trace_inputs = TOY.build

    assert refused.detect_family(info) == "SD3 / SD3.5"
    families.register(ClaimsSD3())
    try:
        assert refused.detect_family(info) is None
        assert "Toy SD3" in refused.refusal("Flux")
    finally:
        families.unregister("toy_sd3")
    assert refused.detect_family(info) == "SD3 / SD3.5"
    assert refused.refusal("Flux", "x.safetensors") == (
        f"x.safetensors: model family Flux is not supported (mixgraph runs {refused.supported()})")


def test_toy_has_no_preview_no_concat_and_is_not_saved(models):
    """What the toy family does not declare it does not get, by name and without an error from
    inside shared code: no latent preview (its format has no factors), no extra input channels
    (its runner has no ``concat``: a wider model would be named), no checkpoint saving."""
    from types import SimpleNamespace

    from mixgraph.nodes.helpers.previews import previewer_for
    from mixgraph.nodes.weights import save

    model = loader.load_checkpoint(models / "checkpoints" / "toy.safetensors")[0]
    runner = model.runner(_f32())
    ctx = SimpleNamespace(env=SimpleNamespace(settings={"preview_method": "auto"}))
    assert previewer_for(ctx, runner) is None and previewer_for(ctx, model) is None
    text = torch.zeros(1, 77, CFG.context_dim)
    latent = torch.zeros(1, CFG.channels, 8, 8)
    assert CFGDenoiser(runner, (Cond(text),), (), 1.0, latent).positive[0].concat is None
    wider = SimpleNamespace(prediction="flow", zsnr=False, in_channels=CFG.channels + 1,
                            latent_format=model.latent_format, sampling=model.sampling)
    with pytest.raises(ValueError, match=r"no extra input channels \(FamilyRunner.concat\)"):
        CFGDenoiser(wider, (Cond(text),), (), 1.0, latent)
    with pytest.raises(NotImplementedError, match=r"Toy flow transformer \(tests\) \('toy'\) model as a "
                                                  r"checkpoint is not supported yet"):
        save.checkpoint_state_dict(model)
