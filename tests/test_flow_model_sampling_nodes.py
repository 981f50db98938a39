"""ModelSamplingSD3, ModelSamplingAuraFlow and ModelSamplingFlux (ComfyUI's
``nodes_model_advanced.py``) on any flow family: each pins the MODEL handle's flow schedule, as
ModelSamplingDiscrete pins its prediction type, checked on the toy flow family
(``tests/toy_family.py``) and on an SD 1.5 model (which they turn into a flow model, as ComfyUI's
object patch does); the schedules are ComfyUI's formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.nodes.sampling.skip_layer_guidance import SkipLayerGuidance, parse_layers
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.toy_family import TEXT_PREFIX, TOY, ToyConfig, toy_state_dict

INFO = api.default_registry().object_info()
SEED, STEPS = 3, 4


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    families.register(TOY)
    yield
    families.unregister(TOY.name)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("flow_sampling")
    sd = {"model.diffusion_model." + k: v for k, v in toy_state_dict(ToyConfig(), seed=3).items()}
    sd |= {TEXT_PREFIX + k: v for k, v in tiny_clip_l_state_dict(4, width=32).items()}
    (root / "checkpoints").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "checkpoints" / "toy.safetensors"))
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))


def test_specs_match_comfyui():
    sd3 = INFO["ModelSamplingSD3"]
    assert sd3["input_order"] == {"required": ["model", "shift"]}
    assert sd3["input"]["required"]["shift"] == ["FLOAT", {"default": 3.0, "min": 0.0, "max": 100.0, "step": 0.01}]
    aura = INFO["ModelSamplingAuraFlow"]
    assert aura["input_order"] == {"required": ["model", "shift"], "optional": ["sampling"]}
    assert aura["input"]["required"]["shift"][1]["default"] == 1.73
    assert aura["input"]["optional"]["sampling"][0] == ["flow", "img_to_img_velocity"]
    flux = INFO["ModelSamplingFlux"]
    assert flux["input_order"] == {"required": ["model", "max_shift", "base_shift", "width", "height"]}
    req = flux["input"]["required"]
    assert req["max_shift"][1]["default"] == 1.15 and req["base_shift"][1]["default"] == 0.5
    assert req["max_shift"][1]["advanced"] is True
    assert req["width"] == ["INT", {"default": 1024, "min": 16, "max": 16384, "step": 8}] == req["height"]
    slg = INFO["SkipLayerGuidanceSD3"]
    assert slg["input_order"] == {"required": ["model", "layers", "scale", "start_percent", "end_percent"]}
    r = slg["input"]["required"]
    assert r["layers"] == ["STRING", {"default": "7, 8, 9"}]
    assert r["scale"] == ["FLOAT", {"default": 3.0, "min": 0.0, "max": 10.0, "step": 0.1}]
    assert r["start_percent"][1]["default"] == 0.01 and r["end_percent"][1]["default"] == 0.15
    assert slg["category"] == "advanced/guidance" and slg["experimental"] is True
    dit = INFO["SkipLayerGuidanceDiT"]
    assert dit["input_order"] == {"required": ["model", "double_layers", "single_layers", "scale", "start_percent",
                                               "end_percent", "rescaling_scale"]}
    d = dit["input"]["required"]
    assert d["double_layers"] == d["single_layers"] == ["STRING", {"default": "7, 8, 9", "advanced": True}]
    assert d["rescaling_scale"] == ["FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 0.01}]
    assert d["end_percent"][1] == {"default": 0.15, "min": 0.0, "max": 1.0, "step": 0.001, "advanced": True}
    assert dit["experimental"] is True and dit["category"] == "advanced/guidance"
    for name in ("ModelSamplingSD3", "ModelSamplingAuraFlow", "ModelSamplingFlux"):
        assert INFO[name]["output"] == ["MODEL"]


def _model(executor, models, node=None, inputs=None, ckpt="toy.safetensors", then=None):
    """The MODEL handle ``node`` (then ``then``) makes of ``ckpt``'s model (the declared functions)."""
    from mixgraph.nodes.models import loader

    base = loader.load_checkpoint(models / "checkpoints" / ckpt)[0]
    if node is None:
        return base
    fn = api.default_registry().get(node).fn
    patched = fn(model=base, **inputs)[0]
    if then is not None:
        patched = api.default_registry().get(then["class_type"]).fn(model=patched, **then["inputs"])[0]
    return patched


def test_model_sampling_sd3_pins_the_linear_shift(executor, models):
    model = _model(executor, models, "ModelSamplingSD3", {"shift": 2.0})
    assert (model.prediction, model.sampling.shift, model.sampling.multiplier, model.sampling.shift_kind) == \
        ("flow", 2.0, 1000.0, "linear")
    ms = ModelSampling.for_model(model)
    t = torch.arange(1, 1001) / 1000.0
    assert torch.allclose(torch.as_tensor(ms.schedule.sigmas), 2.0 * t / (1 + t), atol=1e-6)  # time_snr_shift
    assert float(ms.timestep(torch.tensor(0.25))) == pytest.approx(250.0)
    assert ms.percent_to_sigma(0.5) == pytest.approx(2.0 * 0.5 / (1 + 0.5))
    with pytest.raises(ValueError, match="ModelSamplingSD3: the shift must be > 0, got 0.0"):
        _model(executor, models, "ModelSamplingSD3", {"shift": 0.0})


def test_model_sampling_auraflow_has_multiplier_one(executor, models):
    model = _model(executor, models, "ModelSamplingAuraFlow", {"shift": 1.73, "sampling": "flow"})
    ms = ModelSampling.for_model(model)
    assert model.sampling.multiplier == 1.0 and ms.is_flow
    assert float(ms.timestep(torch.tensor(0.25))) == pytest.approx(0.25)
    assert float(ms.sigma_max) == pytest.approx(1.0)
    with pytest.raises(NotImplementedError, match="sampling 'img_to_img_velocity': not supported yet"):
        _model(executor, models, "ModelSamplingAuraFlow", {"shift": 1.73, "sampling": "img_to_img_velocity"})


def test_model_sampling_flux_resolution_shift(executor, models):
    """ComfyUI's formula: μ = (w·h / (8·8·2·2))·m + b with the line through (256, base_shift)
    and (4096, max_shift); σ(t) = e^μ / (e^μ + 1/t − 1), the model sees σ."""
    model = _model(executor, models, "ModelSamplingFlux",
                   {"max_shift": 1.15, "base_shift": 0.5, "width": 768, "height": 512})
    m = (1.15 - 0.5) / (4096 - 256)
    mu = (768 * 512 / (8 * 8 * 2 * 2)) * m + (0.5 - m * 256)
    assert model.sampling.shift_kind == "exponential" and model.sampling.shift == pytest.approx(mu)
    ms = ModelSampling.for_model(model)
    assert ms.percent_to_sigma(0.3) == pytest.approx(math.exp(mu) / (math.exp(mu) + 1 / 0.7 - 1))
    assert float(ms.timestep(torch.tensor(0.4))) == pytest.approx(0.4)


def test_nodes_turn_any_model_into_a_flow_model(executor, models):
    """On an SD 1.5 (eps) model the patch makes a flow model, as ComfyUI's object patch does; a
    later ModelSamplingDiscrete takes it back (the later node wins)."""
    sd = _model(executor, models, "ModelSamplingSD3", {"shift": 3.0}, ckpt="sd15.safetensors")
    assert sd.prediction == "flow" and ModelSampling.for_model(sd).is_flow
    back = _model(executor, models, "ModelSamplingSD3", {"shift": 3.0}, ckpt="sd15.safetensors",
                  then={"class_type": "ModelSamplingDiscrete", "inputs": {"sampling": "eps", "zsnr": False}})
    assert back.prediction == "eps" and not ModelSampling.for_model(back).is_flow


def _prompt(patch: dict | None):
    model = ["4", 0] if patch is None else ["p", 0]
    p = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "toy.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": model, "seed": SEED, "steps": STEPS, "cfg": 3.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "denoise": 1.0}},
        "11": {"class_type": "BasicScheduler", "inputs": {"model": model, "scheduler": "simple", "steps": STEPS,
                                                           "denoise": 1.0}},
        "s": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "flow/ks"}},
        "ps": {"class_type": "PreviewAny", "inputs": {"source": ["11", 0]}},
    }
    if patch is not None:
        p["p"] = {"class_type": patch["class_type"], "inputs": {"model": ["4", 0], **patch["inputs"]}}
    return p


def test_sampling_with_the_nodes(executor, models):
    """The toy family samples with SD3's settings (shift 3, multiplier 1000): ModelSamplingSD3 with
    shift 3 gives the very same latent; other shifts give other schedules (simple: σ(k/1000) at
    every 250th k) and other latents."""
    def run(patch):
        res = api.run(_prompt(patch), executor=executor, models=models, output=models / "out")
        return res.outputs["3"][0].samples, res.outputs["11"][0]

    base, base_sigmas = run(None)
    same, same_sigmas = run({"class_type": "ModelSamplingSD3", "inputs": {"shift": 3.0}})
    assert torch.equal(same, base) and torch.equal(same_sigmas, base_sigmas)
    t = torch.tensor([1000, 750, 500, 250]) / 1000.0
    for patch, want in (
            ({"class_type": "ModelSamplingSD3", "inputs": {"shift": 6.0}}, 6.0 * t / (1 + 5.0 * t)),
            ({"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 1.73}}, 1.73 * t / (1 + 0.73 * t)),
            ({"class_type": "ModelSamplingFlux", "inputs": {"max_shift": 1.15, "base_shift": 0.5, "width": 64,
                                                             "height": 64}}, None)):
        latent, sigmas = run(patch)
        assert torch.isfinite(latent).all() and not torch.equal(latent, base)
        assert sigmas[-1] == 0 and len(sigmas) == STEPS + 1
        if want is not None:
            assert torch.allclose(sigmas[:-1], want, atol=1e-5)
        else:  # Flux's table: σ(k/10000); simple takes every 2500th
            mu = (64 * 64 / 256) * (0.65 / 3840) + (0.5 - 0.65 / 3840 * 256)
            tt = torch.tensor([10000, 7500, 5000, 2500]) / 10000.0
            assert torch.allclose(sigmas[:-1], math.exp(mu) / (math.exp(mu) + 1 / tt - 1), atol=1e-5)


def test_skip_layer_guidance_patch():
    """The post-CFG formula and its sigma window, on stand-in predictions: x0 + (cond − skipped)·s
    for sigma_end < σ ≤ sigma_start, the block indices parsed as ComfyUI does."""
    assert parse_layers("7, 8,9") == (7, 8, 9) and parse_layers("layer 10 and 2") == (10, 2) and parse_layers("") == ()
    calls = []

    class Model:
        skippable_blocks = {"double_block": 12}

    def evaluate(patches):
        calls.append(patches)
        return torch.full((1, 2, 2, 2), 0.25)

    patch = SkipLayerGuidance((("double_block", (7, 8)), ("single_block", ())), 2.0, sigma_start=0.9,
                              sigma_end=0.2)
    cond = torch.ones(1, 2, 2, 2)

    def post(sigma, model=Model()):
        a = GuidanceArgs(torch.zeros(1, 2, 2, 2), torch.tensor([sigma]), 4.0, cond, torch.zeros_like(cond),
                         evaluate, None, {}, model=model)
        return patch.post(a, torch.full_like(cond, 0.5))

    assert torch.allclose(post(0.5), torch.full_like(cond, 0.5 + (1 - 0.25) * 2.0))
    assert len(calls[-1]) == 1 and calls[-1][0].kind == "double_block" and calls[-1][0].indices == (7, 8)
    assert torch.equal(post(0.9), torch.full_like(cond, 2.0))  # σ_start itself is inside
    n = len(calls)
    assert torch.equal(post(0.15), torch.full_like(cond, 0.5)) and torch.equal(post(0.95), torch.full_like(cond, 0.5))
    assert len(calls) == n  # outside the window: no extra evaluation
    with pytest.raises(NotImplementedError, match="has no double_block blocks to skip"):
        post(0.5, model=object())
    # SkipLayerGuidanceDiT's rescaling: toward std(cond) by rescaling_scale; a kind the model lacks
    # (single blocks) is left alone, as long as it has one of the kinds asked for
    rescaled = SkipLayerGuidance((("double_block", (1,)), ("single_block", (2,))), 2.0, 0.9, 0.2, 0.5)
    cond = torch.randn(1, 2, 2, 2, generator=torch.Generator().manual_seed(0))
    a = GuidanceArgs(torch.zeros(1, 2, 2, 2), torch.tensor([0.5]), 4.0, cond, torch.zeros_like(cond), evaluate,
                     None, {}, model=Model())
    plain = torch.full_like(cond, 0.5) + (cond - 0.25) * 2.0
    want = plain * (0.5 * cond.std() / plain.std() + 0.5)
    assert torch.allclose(rescaled.post(a, torch.full_like(cond, 0.5)), want)
    assert [(p.kind, p.indices) for p in calls[-1]] == [("double_block", (1,)), ("single_block", (2,))]
