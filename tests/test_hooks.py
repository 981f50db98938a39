"""Scheduled weight hooks (ComfyUI nodes_hooks.py) on a tiny generated SD1.5 checkpoint and LoRA:
a hooked cond is evaluated with the hook's LoRA at the keyframe strength of each step."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.report import NodeError, ValidationFailed
from mixgraph.nodes.helpers.hook_ops import interpolated_keyframes, keyframe, keyframes_from_floats
from mixgraph.nodes.models.hooks import clip_schedule
from mixgraph.nodes.payloads.hooks import HookGroup, HookKeyframe, HookKeyframes, WeightHook
from mixgraph.nodes.sampling.hooks import KeyframeState
from mixgraph.nodes.sampling.parameterization import ModelSampling
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.workflow_models import write_lora

STEPS = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks") / "models"
    ckpt = root / "checkpoints" / "sd15.safetensors"
    ckpt.parent.mkdir(parents=True)
    write_sd15(ckpt, seed=1)
    write_lora(root / "loras" / "sd15_lora.safetensors", ckpt, seed=5)
    write_sd15(root / "loras" / "not_a_lora.safetensors", seed=2)  # a checkpoint, misfiled
    write_sd15(root / "checkpoints" / "other.safetensors", seed=2)
    return root


@pytest.fixture(scope="module")
def executor(models):
    return Executor(api.default_registry(), Env.from_args(models=models, output=models.parent / "out"),
                    cache=OutputCache(max_bytes=1 << 30))


def _base(model=("1", 0), clip=("1", 1), positive=None, negative=None) -> dict:
    """Checkpoint → two prompts → KSampler (euler, 4 steps) → decode → preview."""
    g = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": list(clip)}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": list(clip)}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {
            "model": list(model), "seed": 3, "steps": STEPS, "cfg": 5.0, "sampler_name": "euler",
            "scheduler": "normal", "positive": list(positive or ("2", 0)),
            "negative": list(negative or ("3", 0)), "latent_image": ["4", 0], "denoise": 1.0}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "PreviewImage", "inputs": {"images": ["6", 0]}},
    }
    return g


def _hook(strength_model=1.0, strength_clip=1.0, node="10", prev=None) -> dict:
    inputs = {"lora_name": "sd15_lora.safetensors", "strength_model": strength_model,
              "strength_clip": strength_clip}
    if prev is not None:
        inputs["prev_hooks"] = list(prev)
    return {node: {"class_type": "CreateHookLora", "inputs": inputs}}


def _hooked_conds(g: dict, hooks=("10", 0)) -> dict:
    """Both prompts get the hooks through PairConditioningSetProperties; KSampler uses them."""
    g["20"] = {"class_type": "PairConditioningSetProperties", "inputs": {
        "positive_NEW": ["2", 0], "negative_NEW": ["3", 0], "strength": 1.0, "set_cond_area": "default",
        "hooks": list(hooks)}}
    g["5"]["inputs"]["positive"] = ["20", 0]
    g["5"]["inputs"]["negative"] = ["20", 1]
    return g


def _latent(executor, models, graph) -> torch.Tensor:
    return api.run(graph, executor=executor, models=models)["5"][0].samples


@pytest.fixture(scope="module")
def plain(executor, models):
    return _latent(executor, models, _base())


@pytest.fixture(scope="module")
def lora_model(executor, models):
    """LoraLoaderModelOnly at strength 1: the model part of the hook, merged into the MODEL."""
    g = _base(model=("9", 0))
    g["9"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
        "model": ["1", 0], "lora_name": "sd15_lora.safetensors", "strength_model": 1.0}}
    return _latent(executor, models, g)


def test_hooks_lora_changes_the_sampled_latent(plain, lora_model):
    assert (plain - lora_model).abs().max() > 1e-3  # the fixture LoRA has an effect to measure


def test_hooks_on_every_cond_equal_lora_loader_model_only(executor, models, lora_model):
    g = _hooked_conds({**_base(), **_hook(strength_clip=0.0)})
    torch.testing.assert_close(_latent(executor, models, g), lora_model, atol=1e-5, rtol=1e-5)


def test_hooks_model_only_node_equals_lora_loader_model_only(executor, models, lora_model):
    g = _hooked_conds({**_base(), "10": {"class_type": "CreateHookLoraModelOnly", "inputs": {
        "lora_name": "sd15_lora.safetensors", "strength_model": 1.0}}})
    torch.testing.assert_close(_latent(executor, models, g), lora_model, atol=1e-5, rtol=1e-5)


def test_hooks_strength_zero_keyframe_gives_unhooked_latent(executor, models, plain):
    g = _hooked_conds({**_base(), **_hook(strength_clip=0.0)}, hooks=("12", 0))
    g["11"] = {"class_type": "CreateHookKeyframe", "inputs": {"strength_mult": 0.0, "start_percent": 0.0}}
    g["12"] = {"class_type": "SetHookKeyframes", "inputs": {"hooks": ["10", 0], "hook_kf": ["11", 0]}}
    torch.testing.assert_close(_latent(executor, models, g), plain, atol=1e-6, rtol=1e-6)


def test_hooks_strength_zero_hook_gives_unhooked_latent(executor, models, plain):
    g = _hooked_conds({**_base(), **_hook(strength_model=0.0, strength_clip=0.0)})
    torch.testing.assert_close(_latent(executor, models, g), plain, atol=1e-6, rtol=1e-6)


def test_hooks_only_hooked_conds_use_the_lora(executor, models, plain, lora_model):
    g = {**_base(), **_hook(strength_clip=0.0)}
    g["20"] = {"class_type": "SetModelHooksOnCond", "inputs": {"conditioning": ["2", 0], "hooks": ["10", 0]}}
    g["5"]["inputs"]["positive"] = ["20", 0]  # the negative stays unhooked
    out = _latent(executor, models, g)
    assert (out - plain).abs().max() > 1e-4 and (out - lora_model).abs().max() > 1e-4


def test_hooks_model_as_lora_at_strength_one_samples_with_the_other_unet(executor, models):
    g = _hooked_conds({**_base(), "10": {"class_type": "CreateHookModelAsLoraModelOnly", "inputs": {
        "ckpt_name": "other.safetensors", "strength_model": 1.0}}})
    ref = _base(model=("9", 0))
    ref["9"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "other.safetensors"}}
    torch.testing.assert_close(_latent(executor, models, g), _latent(executor, models, ref), atol=1e-5, rtol=1e-5)


def _switch_step(models, percent: float) -> int:
    """The first step whose sigma is at or below the keyframe's start sigma."""
    from mixgraph.nodes.models.loader import load_checkpoint
    from mixgraph.nodes.sampling.ksampler import compute_sigmas

    model, _, _ = load_checkpoint(models / "checkpoints" / "sd15.safetensors")
    ms = ModelSampling.for_model(model)
    sigmas = compute_sigmas(ms, "normal", "euler", STEPS)
    start = ms.percent_to_sigma(percent)
    return next(i for i, s in enumerate(sigmas[:-1].tolist()) if s <= start)


def test_hooks_keyframe_off_after_half_equals_two_phase_sampling(executor, models, plain, lora_model):
    g = _hooked_conds({**_base(), **_hook(strength_clip=0.0)}, hooks=("13", 0))
    g["11"] = {"class_type": "CreateHookKeyframe", "inputs": {"strength_mult": 1.0, "start_percent": 0.0}}
    g["12"] = {"class_type": "CreateHookKeyframe", "inputs": {
        "strength_mult": 0.0, "start_percent": 0.5, "prev_hook_kf": ["11", 0]}}
    g["13"] = {"class_type": "SetHookKeyframes", "inputs": {"hooks": ["10", 0], "hook_kf": ["12", 0]}}
    scheduled = _latent(executor, models, g)
    # between: neither the plain nor the LoRA result
    assert (scheduled - plain).abs().max() > 1e-4 and (scheduled - lora_model).abs().max() > 1e-4

    # the same as sampling steps [0, k) with the LoRA model and [k, end) with the plain one
    k = _switch_step(models, 0.5)
    assert 0 < k < STEPS
    two = _base()
    two["9"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
        "model": ["1", 0], "lora_name": "sd15_lora.safetensors", "strength_model": 1.0}}
    common = {"noise_seed": 3, "steps": STEPS, "cfg": 5.0, "sampler_name": "euler", "scheduler": "normal",
              "positive": ["2", 0], "negative": ["3", 0]}
    two["30"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "model": ["9", 0], "add_noise": "enable", "latent_image": ["4", 0], "start_at_step": 0,
        "end_at_step": k, "return_with_leftover_noise": "enable"}}
    two["5"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **common, "model": ["1", 0], "add_noise": "disable", "latent_image": ["30", 0], "start_at_step": k,
        "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
    torch.testing.assert_close(scheduled, _latent(executor, models, two), atol=1e-4, rtol=1e-4)


def test_hooks_combine_two_half_strength_hooks_equal_one_full(executor, models, lora_model):
    g = {**_base(), **_hook(0.5, 0.0, node="10"), **_hook(0.5, 0.0, node="11")}
    g["12"] = {"class_type": "CombineHooks2", "inputs": {"hooks_A": ["10", 0], "hooks_B": ["11", 0]}}
    g = _hooked_conds(g, hooks=("12", 0))
    # two merges of half the LoRA each round differently from one full merge
    torch.testing.assert_close(_latent(executor, models, g), lora_model, atol=1e-3, rtol=1e-3)


def test_hooks_combine_keeps_one_copy_of_the_same_hook(executor, models):
    half = _hooked_conds({**_base(), **_hook(0.5, 0.0)})
    twice = {**_base(), **_hook(0.5, 0.0)}
    twice["12"] = {"class_type": "CombineHooks4", "inputs": {"hooks_A": ["10", 0], "hooks_C": ["10", 0]}}
    twice = _hooked_conds(twice, hooks=("12", 0))
    torch.testing.assert_close(_latent(executor, models, twice), _latent(executor, models, half))


def _encode(executor, models, clip_graph: dict, clip=("9", 0)) -> tuple:
    g = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
         **clip_graph,
         "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": list(clip)}},
         "3": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["2", 0]}},
         "5": {"class_type": "KSampler", "inputs": {
             "model": ["1", 0], "seed": 0, "steps": 1, "cfg": 1.0, "sampler_name": "euler", "scheduler": "normal",
             "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0], "denoise": 0.0}},
         "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
         "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
         "7": {"class_type": "PreviewImage", "inputs": {"images": ["6", 0]}}}
    return api.run(g, executor=executor, models=models)["2"][0]


def test_hooks_set_clip_hooks_encodes_like_lora_loader_clip(executor, models):
    plain = _encode(executor, models, {}, clip=("1", 1))
    loader = _encode(executor, models, {"9": {"class_type": "LoraLoader", "inputs": {
        "model": ["1", 0], "clip": ["1", 1], "lora_name": "sd15_lora.safetensors", "strength_model": 1.0,
        "strength_clip": 1.0}}}, clip=("9", 1))
    hooked = _encode(executor, models, {**_hook(), "9": {"class_type": "SetClipHooks", "inputs": {
        "clip": ["1", 1], "apply_to_conds": True, "schedule_clip": False, "hooks": ["10", 0]}}})
    assert len(hooked) == 1
    assert (loader[0].cross_attn - plain[0].cross_attn).abs().max() > 1e-4
    torch.testing.assert_close(hooked[0].cross_attn, loader[0].cross_attn)
    assert isinstance(hooked[0].hooks, HookGroup) and len(hooked[0].hooks) == 1


def test_hooks_set_clip_hooks_schedule_encodes_per_keyframe_range(executor, models):
    plain = _encode(executor, models, {}, clip=("1", 1))
    loader = _encode(executor, models, {"9": {"class_type": "LoraLoader", "inputs": {
        "model": ["1", 0], "clip": ["1", 1], "lora_name": "sd15_lora.safetensors", "strength_model": 1.0,
        "strength_clip": 1.0}}}, clip=("9", 1))
    g = {**_hook(),
         "11": {"class_type": "CreateHookKeyframe", "inputs": {"strength_mult": 1.0, "start_percent": 0.0}},
         "12": {"class_type": "CreateHookKeyframe", "inputs": {
             "strength_mult": 0.0, "start_percent": 0.5, "prev_hook_kf": ["11", 0]}},
         "13": {"class_type": "SetHookKeyframes", "inputs": {"hooks": ["10", 0], "hook_kf": ["12", 0]}},
         "9": {"class_type": "SetClipHooks", "inputs": {
             "clip": ["1", 1], "apply_to_conds": False, "schedule_clip": True, "hooks": ["13", 0]}}}
    conds = _encode(executor, models, g)
    assert [c.clip_range for c in conds] == [(0.0, 0.5), (0.5, 1.0)]
    assert all(c.hooks is None for c in conds)  # apply_to_conds off
    torch.testing.assert_close(conds[0].cross_attn, loader[0].cross_attn)
    torch.testing.assert_close(conds[1].cross_attn, plain[0].cross_attn)


def test_hooks_default_cond_fills_only_uncovered_weight(executor, models, plain):
    # a default cond next to a full-strength cond covering everything adds nothing
    g = _base()
    g["8"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "a green sphere", "clip": ["1", 1]}}
    g["20"] = {"class_type": "ConditioningSetDefaultCombine", "inputs": {"cond": ["2", 0], "cond_DEFAULT": ["8", 0]}}
    g["5"]["inputs"]["positive"] = ["20", 0]
    torch.testing.assert_close(_latent(executor, models, g), plain, atol=1e-6, rtol=1e-6)
    # alone (the other conds inactive here: timestep range empty), it acts as the prompt
    g["21"] = {"class_type": "ConditioningSetTimestepRange", "inputs": {"conditioning": ["2", 0], "start": 1.0,
                                                                        "end": 1.0}}
    g["20"]["inputs"]["cond"] = ["21", 0]
    ref = _base()
    ref["8"] = g["8"]
    ref["5"]["inputs"]["positive"] = ["8", 0]
    torch.testing.assert_close(_latent(executor, models, g), _latent(executor, models, ref), atol=1e-6, rtol=1e-6)


def test_hooks_lora_name_that_is_no_lora_is_a_clear_node_error(executor, models):
    g = _hooked_conds({**_base(), "10": {"class_type": "CreateHookLora", "inputs": {
        "lora_name": "not_a_lora.safetensors", "strength_model": 1.0, "strength_clip": 1.0}}})
    with pytest.raises(NodeError) as err:
        api.run(g, executor=executor, models=models)
    assert err.value.node_id == "10" and "is not a LoRA file" in str(err.value)


def test_hooks_wrong_type_link_fails_validation(executor, models):
    g = _hooked_conds({**_base(), **_hook()}, hooks=("2", 0))  # a CONDITIONING into `hooks`
    with pytest.raises(ValidationFailed) as err:
        api.run(g, executor=executor, models=models)
    assert "hooks" in str(err.value) and "HOOKS" in str(err.value)


# ------------------------------------------------------------------------ schedules, unit


def _sigma_of(percent: float) -> float:
    return {0.0: 1000.0, 0.5: 5.0, 1.0: 0.0}.get(percent, 10.0 * (1 - percent))


def test_keyframe_state_switches_at_start_sigma_after_guaranteed_steps():
    kfs = keyframe(keyframe(None, 1.0, 0.0), 0.0, 0.5)
    st = KeyframeState(kfs, _sigma_of)
    assert [st.advance(s, 10.0) for s in (10.0, 10.0, 7.0, 5.0, 2.0)] == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_keyframe_state_guarantee_steps_delay_the_next_keyframe():
    kfs = HookKeyframes((HookKeyframe(1.0, 0.0, 1), HookKeyframe(0.5, 0.1, 3), HookKeyframe(0.0, 0.2, 0)))
    st = KeyframeState(kfs, lambda p: 1000.0 if p == 0 else 10.0 * (1 - p))
    # 0.1 → σ 9, 0.2 → σ 8: the 0.5 keyframe holds for three steps before 0.0 takes over
    assert [st.advance(s, 10.0) for s in (9.5, 8.5, 7.5, 6.5, 5.5)] == [1.0, 0.5, 0.5, 0.5, 0.0]


def test_keyframes_from_floats_spread_evenly_first_guaranteed():
    kfs = keyframes_from_floats(None, [1.0, 0.5, 0.0], 0.0, 1.0)
    assert [(k.strength, k.start_percent, k.guarantee_steps) for k in kfs.keyframes] == [
        (1.0, 0.0, 1), (0.5, 0.5, 0), (0.0, 1.0, 0)]
    (one,) = keyframes_from_floats(None, 0.25, 0.2, 0.8).keyframes  # a single float: one keyframe
    assert (one.strength, one.guarantee_steps) == (0.25, 1)
    assert one.start_percent == pytest.approx(0.2)  # float32, as ComfyUI's torch.linspace


def test_keyframes_interpolated_follow_the_curve():
    lin = interpolated_keyframes(None, 1.0, 0.0, "linear", 0.0, 1.0, 5)
    assert [k.strength for k in lin.keyframes] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    ease = interpolated_keyframes(None, 0.0, 1.0, "ease_in", 0.0, 1.0, 3)
    assert [k.strength for k in ease.keyframes] == pytest.approx([0.0, 0.25, 1.0])
    with pytest.raises(ValueError, match="interpolation"):
        interpolated_keyframes(None, 0.0, 1.0, "cubic", 0.0, 1.0, 3)


def test_clip_schedule_ranges_where_strength_changes():
    kfs = keyframe(keyframe(keyframe(None, 1.0, 0.0), 1.0, 0.3), 0.2, 0.6)
    hook = WeightHook("h", None, keyframes=kfs)  # weights unused by the schedule
    plain = WeightHook("p", None)
    sched = clip_schedule(HookGroup((hook, plain)))
    assert [(r, [m for _, m in pairs]) for r, pairs in sched] == [
        ((0.0, 0.6), [1.0, 1.0]), ((0.6, 1.0), [0.2, 1.0])]
