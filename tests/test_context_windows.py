"""ContextWindowsManual (ComfyUI nodes_context_windows): spec, schedules and fuse weights against
hand-computed values, and windowed sampling on a tiny SD1.5 UNet (which acts per batch item, so
any windowing must reproduce the unpatched result)."""


import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.model_patches.context_window_nodes import ContextWindowsManual
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import context_windows as cw
from mixgraph.nodes.sampling.ksampler import sample
from mixgraph.ui import api

F32 = parse_spec("f32")


def test_context_windows_spec_matches_comfyui():
    info = api.default_registry().object_info()["ContextWindowsManual"]
    assert info["display_name"] == "Context Windows (Manual)" and info["category"] == "model_patches"
    assert info["output"] == ["MODEL"]
    assert info["input_order"]["required"] == [
        "model", "context_length", "context_overlap", "context_schedule", "context_stride", "closed_loop",
        "fuse_method", "dim", "freenoise", "cond_retain_index_list", "split_conds_to_windows",
        "latent_retain_index_list", "causal_window_fix"]
    req = info["input"]["required"]
    assert req["context_length"][1]["default"] == 16 and req["context_length"][1]["min"] == 1
    assert req["context_overlap"][1]["default"] == 4 and req["context_overlap"][1]["min"] == 0
    assert req["context_schedule"][0] == ["standard_static", "standard_uniform", "looped_uniform", "batched"]
    assert req["fuse_method"][0] == ["pyramid", "relative", "flat", "overlap-linear"]
    assert req["context_stride"][1]["default"] == 1 and req["context_stride"][1]["min"] == 1
    assert (req["dim"][1]["default"], req["dim"][1]["min"], req["dim"][1]["max"]) == (0, 0, 5)
    assert req["closed_loop"][1]["default"] is False and req["freenoise"][1]["default"] is False
    assert req["causal_window_fix"][1]["default"] is True
    assert req["cond_retain_index_list"][0] == "STRING" and req["cond_retain_index_list"][1]["default"] == ""
    assert req["latent_retain_index_list"][1]["default"] == ""


def _cw(length, overlap, schedule="standard_static", stride=1, closed=False, **kw):
    return cw.ContextWindows(length, overlap, schedule, stride, closed, **kw)


def test_ordered_halving_hand_values():
    assert [cw.ordered_halving(i) for i in range(4)] == [0.0, 0.5, 0.25, 0.75]


def test_schedules_hand_computed_windows():
    r = lambda a, b: list(range(a, b))  # noqa: E731
    assert cw.get_windows(10, _cw(4, 1)) == [r(0, 4), r(3, 7), r(6, 10)]
    # delta 2; the third window (start 4) would pass the end, so it starts at 7 − 4 = 3
    assert cw.get_windows(7, _cw(4, 2)) == [r(0, 4), r(2, 6), r(3, 7)]
    assert cw.get_windows(10, _cw(4, 1, "batched")) == [r(0, 4), r(4, 8), [8, 9]]
    assert cw.get_windows(4, _cw(4, 1)) == [r(0, 4)]
    # uniform, step 1: offset round(10 · 1/2) = 5, starts 5, 8, 11 (wrapping mod 10)
    assert cw.get_windows(10, _cw(4, 1, "looped_uniform"), 1) == [r(5, 9), [8, 9, 0, 1], r(1, 5)]
    # standard: the wrapping window slides to the end, a window starting at 0 is inserted after it
    assert cw.get_windows(10, _cw(4, 1, "standard_uniform"), 1) == [r(5, 9), r(6, 10), r(0, 4), r(1, 5)]
    # step 2: offset round(2.5) = 2
    assert cw.get_windows(10, _cw(4, 1, "looped_uniform"), 2) == [r(2, 6), r(5, 9), [8, 9, 0, 1]]
    # closed loop runs the starts up to n instead of n − overlap
    assert cw.get_windows(10, _cw(4, 1, "looped_uniform", closed=True), 0) == [r(0, 4), r(3, 7), r(6, 10), [9, 0, 1, 2]]
    # stride 2: a second pass with frames 2 apart, starts every 4·2 − 1 = 7
    assert cw.get_windows(10, _cw(4, 1, "looped_uniform", stride=2), 0) == [
        r(0, 4), r(3, 7), r(6, 10), [0, 2, 4, 6], [7, 9, 1, 3]]


def test_fuse_weights_hand_values():
    assert cw.fuse_weights("pyramid", 4, 10, [0, 1, 2, 3], 1).tolist() == [1, 2, 2, 1]
    assert cw.fuse_weights("pyramid", 5, 10, [0, 1, 2, 3, 4], 1).tolist() == [1, 2, 3, 2, 1]
    assert cw.fuse_weights("flat", 3, 10, [0, 1, 2], 1).tolist() == [1, 1, 1]
    mid = cw.fuse_weights("overlap-linear", 4, 10, [3, 4, 5, 6], 2)
    assert torch.allclose(mid, torch.tensor([1e-37, 1.0, 1.0, 1e-37]))
    first = cw.fuse_weights("overlap-linear", 4, 10, [0, 1, 2, 3], 2)
    assert torch.allclose(first, torch.tensor([1.0, 1.0, 1.0, 1e-37]))
    assert cw.fuse_weights("overlap-linear", 4, 10, [6, 7, 8, 9], 3).tolist()[1:] == [0.5, 1.0, 1.0]
    assert cw.relative_bias(4, [3, 4, 5, 6]) == pytest.approx(1 - 0.5 / 1.505)
    assert cw.relative_bias(3, [3, 4, 5, 6]) == 0.01  # 1 − 1.5/1.505 < 0.01


def test_freenoise_hand_values():
    noise = torch.arange(6.0).reshape(6, 1, 1, 1)
    out = cw.apply_freenoise(noise.clone(), 0, 4, 2, seed=3)
    perm = torch.randperm(2, generator=torch.Generator().manual_seed(3))
    assert out[:4].flatten().tolist() == [0, 1, 2, 3]
    assert out[4:].flatten().tolist() == perm.float().tolist()


def test_index_list_input_errors_name_the_input():
    assert cw.parse_index_list("0, 2", "x") == (0, 2) and cw.parse_index_list("", "x") == ()
    with pytest.raises(ValueError, match="latent_retain_index_list"):
        cw.parse_index_list("0;1", "latent_retain_index_list")


# --- windowed sampling on a tiny SD1.5 UNet --------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    from tests.fixtures.checkpoints import tiny_sd15_model
    return tiny_sd15_model(seed=4)


def _patched(handle, length, overlap, schedule="standard_static", **kw):
    args = dict(context_length=length, context_overlap=overlap, context_schedule=schedule, context_stride=1,
                closed_loop=False, fuse_method="pyramid", dim=0, freenoise=False, cond_retain_index_list="",
                split_conds_to_windows=False, latent_retain_index_list="", causal_window_fix=True)
    args.update(kw)
    return ContextWindowsManual(handle, **args)[0]


def _run(handle, batch=5, masked=False, steps=3, sampler="euler"):
    g = torch.Generator().manual_seed(5)
    pos = [Cond(torch.randn(1, 77, 32, generator=g))]
    if masked:  # a second prompt on a per-image mask: sliced per window
        pos.append(Cond(torch.randn(1, 77, 32, generator=g), mask=torch.rand(batch, 8, 8, generator=g)))
    neg = Cond(torch.randn(1, 77, 32, generator=g))
    return sample(handle.runner(F32), seed=1, steps=steps, cfg=4.0, sampler_name=sampler, scheduler="normal",
                  positive=tuple(pos), negative=(neg,), latent=Latent(torch.zeros(batch, 4, 8, 8))).samples


def test_context_windows_longer_than_batch_equal_unpatched_exactly(model):
    assert torch.equal(_run(_patched(model, 5, 2)), _run(model))
    assert torch.equal(_run(_patched(model, 16, 4, "looped_uniform")), _run(model))


@pytest.mark.parametrize("length,overlap,schedule,kw", [
    (2, 1, "standard_static", {}),
    (3, 1, "standard_uniform", {"fuse_method": "relative"}),
    (2, 0, "batched", {"fuse_method": "flat", "causal_window_fix": False}),
    (3, 1, "looped_uniform", {"closed_loop": True, "fuse_method": "overlap-linear"}),
    (3, 2, "looped_uniform", {"context_stride": 2}),
])
def test_context_windows_per_sample_model_equals_unpatched(model, length, overlap, schedule, kw):
    ref = _run(model, masked=True)
    out = _run(_patched(model, length, overlap, schedule, **kw), masked=True)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-3), (out - ref).abs().max()  # values reach ~300


def test_context_windows_split_conds_picks_one_cond_per_window(model):
    # two unmasked prompts split over two windows differ from their average over the whole batch
    ref = _run(model, masked=True)
    out = _run(_patched(model, 2, 0, "batched", split_conds_to_windows=True), masked=True)
    assert not torch.allclose(out, ref, atol=1e-3)


def test_context_windows_refuse_missing_and_channel_dims(model):
    with pytest.raises(ValueError, match="input 'dim' is 4"):
        _run(_patched(model, 2, 1, dim=4))
    with pytest.raises(ValueError, match="input 'dim' is 1"):
        _run(_patched(model, 2, 1, dim=1))
    _run(_patched(model, 4, 1, dim=1))  # 4 channels fit in one window: no windowing


def test_context_windows_spatial_dim_runs_and_refuses_areas(model):
    out = _run(_patched(model, 4, 1, dim=3))
    assert out.shape == (5, 4, 8, 8) and torch.isfinite(out).all()
    h = _patched(model, 4, 1, dim=2)
    with pytest.raises(NotImplementedError, match="area conds"):
        g = torch.Generator().manual_seed(5)
        pos = Cond(torch.randn(1, 77, 32, generator=g), area=(4, 4, 0, 0))
        sample(h.runner(F32), seed=1, steps=2, cfg=4.0, sampler_name="euler", scheduler="normal",
               positive=(pos,), negative=(Cond(torch.randn(1, 77, 32, generator=g)),),
               latent=Latent(torch.zeros(1, 4, 8, 8)))


def test_context_windows_latent_retain_out_of_window_is_a_clear_error(model):
    with pytest.raises(ValueError, match="latent_retain_index_list"):
        _run(_patched(model, 2, 1, latent_retain_index_list="5"))
