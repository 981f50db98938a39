"""`mixgraph bench precision` on the demo's tiny checkpoint (32x32, 2 steps), and its metrics."""

import json
import math

import torch

from mixgraph.ui.cli import main
from mixgraph.ui.bench.bench_precision import parse_precision_list, psnr, ssim
from mixgraph.ui.demo import DEMO_CHECKPOINT, demo_workflow
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint


def test_bench_precision_json_reports_each_precision_against_f32(tmp_path, capsys):
    write_sd15_checkpoint(tmp_path / "models" / "checkpoints" / DEMO_CHECKPOINT, size="tiny", seed=0)
    wf = demo_workflow("a lighthouse", seed=3)
    wf["5"]["inputs"].update(width=32, height=32)
    wf["3"]["inputs"]["steps"] = 2
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    code = main(["bench", "precision", str(path), "--precisions", "f32,bf16", "--json",
                 "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out")])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reference"] == "f32"
    assert [r["precision"] for r in data["runs"]] == ["f32", "bf16"]
    for run in data["runs"]:
        assert run["status"] == "ok"
        assert {"seconds", "s_per_step", "steps", "peak_rss_bytes", "psnr_db", "ssim",
                "nan_fallbacks"} <= run.keys()
        assert run["steps"] == 2 and run["s_per_step"] > 0
        assert run["peak_rss_bytes"] > 50 * 2**20  # a real process holding torch
        assert run["nan_fallbacks"] == []
    f32, bf16 = data["runs"]
    assert math.isinf(f32["psnr_db"]) and f32["ssim"] == 1.0
    assert math.isfinite(bf16["psnr_db"]) and bf16["psnr_db"] > 10
    assert 0 < bf16["ssim"] < 1


def test_bench_precision_list_attaches_type_defaults_to_the_run_before():
    assert parse_precision_list("f32,bf16:f32,f32,MODEL=bf16,VAE=f32") == [
        "f32", "bf16:f32", "f32,MODEL=bf16,VAE=f32"]
    assert parse_precision_list("MODEL=bf16,VAE=f32;bf16") == ["MODEL=bf16,VAE=f32", "bf16"]


def test_psnr_of_known_error():
    a = torch.zeros(1, 8, 8, 3)
    assert psnr(a, a) == math.inf
    assert abs(psnr(a, a + 0.25) - 10 * math.log10(16)) < 1e-12  # mse 1/16, exact in f32


def test_ssim_identical_is_one_and_drops_with_noise():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1, 32, 32, 3, generator=g)
    noisy = (a + 0.2 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    assert abs(ssim(a, a) - 1.0) < 1e-12
    assert ssim(a, noisy) < 0.9
    assert ssim(a, noisy) > ssim(a, torch.rand(a.shape, generator=g))
