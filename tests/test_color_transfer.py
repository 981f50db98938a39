"""ComfyUI 0.38.1's ColorTransfer: spec (its `source_stats` DynamicCombo), the Lab conversion
against published CIE values, and hand-computed transfers for Reinhard, MKL and histograms."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.helpers.color_transfer import color_transfer, lab_to_rgb, mkl_matrix, rgb_to_lab
from mixgraph.ui import api

REG = api.default_registry()


def call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


def noise(b, h, w, seed=0):
    return torch.rand(b, h, w, 3, generator=torch.Generator().manual_seed(seed)) * 0.8 + 0.1


def test_color_transfer_spec_matches_comfyui():
    info = REG.object_info()["ColorTransfer"]
    req = info["input"]["required"]
    assert list(req) == ["image_target", "method", "source_stats", "strength"]
    assert list(info["input"]["optional"]) == ["image_ref"]
    assert req["method"][0] == ["reinhard_lab", "mkl_lab", "histogram"]
    opts = req["source_stats"][1]["options"]
    assert [o["key"] for o in opts] == ["per_frame", "uniform", "target_frame"]
    assert opts[0]["inputs"] == {} and opts[2]["inputs"]["required"]["target_index"][1]["max"] == 10000
    assert req["strength"][1] == {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}
    assert info["output"] == ["IMAGE"] and info["category"] == "image/postprocessing"


def test_color_transfer_lab_matches_cie_values_and_round_trips():
    rgb = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    lab = rgb_to_lab(rgb).T
    expected = torch.tensor([[100.0, 0.0, 0.0], [53.24, 80.09, 67.20], [87.73, -86.18, 83.18],
                             [32.30, 79.19, -107.86]])     # white, red, green, blue (D65)
    assert torch.allclose(lab, expected, atol=0.03)
    x = torch.rand(3, 500, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(lab_to_rgb(rgb_to_lab(x)), x, atol=2e-4)


def test_color_transfer_reinhard_moves_mean_and_std_to_the_reference():
    target, ref = noise(1, 8, 8, 0), noise(1, 8, 8, 1) * 0.5 + 0.2
    out = color_transfer(target, ref, "reinhard_lab", "per_frame")
    lab_o = rgb_to_lab(out[0].reshape(-1, 3).T)
    lab_r = rgb_to_lab(ref[0].reshape(-1, 3).T)
    assert torch.allclose(lab_o.mean(1), lab_r.mean(1), atol=0.3)
    assert torch.allclose(lab_o.std(1, unbiased=False), lab_r.std(1, unbiased=False), atol=0.3)


def test_color_transfer_flat_reference_gives_its_colour():
    ref = torch.tensor([0.2, 0.5, 0.7]).expand(1, 4, 4, 3)
    for method in ("reinhard_lab", "mkl_lab"):
        for stats in ("per_frame", "uniform", "target_frame"):
            out = color_transfer(noise(2, 4, 4), ref, method, stats)
            assert torch.allclose(out, ref.expand(2, 4, 4, 3), atol=1e-3), (method, stats)


def test_color_transfer_mkl_maps_covariance_exactly():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g)
    cov_s, cov_r = a @ a.T + 0.1 * torch.eye(3), b @ b.T + 0.1 * torch.eye(3)
    t = mkl_matrix(cov_s.double(), cov_r.double())
    assert torch.allclose(t @ cov_s.double() @ t.T, cov_r.double(), atol=1e-8)
    assert torch.allclose(t, t.T, atol=1e-8)                 # MKL's map is symmetric
    assert torch.allclose(mkl_matrix(cov_s.double(), cov_s.double()), torch.eye(3).double(), atol=1e-8)


def test_color_transfer_histogram_maps_levels_by_cdf():
    # target: half 0.0, half 1.0 in every channel; reference: quarters at 0.2, 0.4, 0.6, 0.8
    target = torch.tensor([0.0, 0.0, 1.0, 1.0]).view(1, 1, 4, 1).expand(1, 1, 4, 3)
    ref = torch.tensor([0.2, 0.4, 0.6, 0.8]).view(1, 1, 4, 1).expand(1, 1, 4, 3)
    out = color_transfer(target, ref, "histogram", "per_frame")
    bins = (ref * 255).long()                                   # 51, 102, 153, 204
    want = torch.tensor([bins[0, 0, 1, 0], bins[0, 0, 1, 0], bins[0, 0, 3, 0], bins[0, 0, 3, 0]]) / 255
    assert torch.allclose(out[0, 0, :, 0], want.float())
    half = color_transfer(target, ref, "histogram", "uniform", strength=0.5)
    assert torch.allclose(half, (target + out) / 2)


def test_color_transfer_uniform_and_target_frame_use_one_transform():
    target = torch.stack([torch.full((4, 4, 3), 0.3), torch.full((4, 4, 3), 0.6)])
    target[:, :2] += 0.1
    ref = noise(1, 4, 4, 5)
    one = color_transfer(target, ref, "reinhard_lab", "target_frame", target_index=7)  # clamped to 1
    own = color_transfer(target[1:], ref, "reinhard_lab", "per_frame")
    assert torch.allclose(one[1], own[0], atol=1e-5)
    assert not torch.allclose(one[0], own[0], atol=1e-2)     # frame 0 keeps its difference
    assert color_transfer(target, None, "mkl_lab", "uniform") is target
    assert color_transfer(target, ref, "mkl_lab", "uniform", strength=0.0) is target


def test_color_transfer_in_a_graph_with_target_index(tmp_path):
    ex = Executor(REG, Env.from_args(output=tmp_path / "o", temp=tmp_path / "t"),
                  cache=OutputCache(max_bytes=1 << 22))
    wf = {"1": call("EmptyImage", width=8, height=8, batch_size=2, color=0x336699),
          "2": call("EmptyImage", width=8, height=8, batch_size=1, color=0xCC8844),
          "3": call("ColorTransfer", image_target=["1", 0], image_ref=["2", 0], method="mkl_lab",
                    source_stats="target_frame", **{"source_stats.target_index": 1}, strength=1.0),
          "4": call("PreviewImage", images=["3", 0])}
    out = api.run(wf, executor=ex).outputs["3"][0]
    assert out.shape == (2, 8, 8, 3)
    assert torch.allclose(out[0, 0, 0], torch.tensor([0xCC, 0x88, 0x44]) / 255.0, atol=2e-3)
    wf["3"]["inputs"]["source_stats.target_index"] = -1
    (p,) = validate(load_workflow(wf, REG).prompt, REG).errors
    assert (p.node_id, p.input_name, p.type) == ("3", "source_stats.target_index", "value_smaller_than_min")
