"""benchmarks/bench_dit.py works: its full-size configs are the real architectures (checked on the
meta device: detection reads back the same config, the parameter counts are the published ones),
its streamed random files are what their headers say, and `--tiny` runs every family through
UNETLoader / KSampler per precision and reports s/step, peak RSS and the estimate. No number is
asserted beyond being there (a benchmark, not a timed test)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_dit  # noqa: E402

# published sizes: Flux.1-dev 11.9 B, SD3.5 medium 2.5 B, Z-Image 6 B parameters
FULL = {"flux": ("flux", "dev", 11.90e9), "sd35m": ("sd3", "sd3", 2.47e9), "zimage": ("z_image", "z_image", 6.15e9)}


@pytest.mark.parametrize("key", sorted(FULL))
def test_full_size_configs_are_the_real_architectures(key):
    from mixgraph.nodes.families import registry as families

    family_name, variant, params = FULL[key]
    shapes = bench_dit.FAMILIES[key].shapes(False)   # meta device: no memory
    found = families.get(family_name).detect(shapes)
    assert found is not None and found.variant == variant
    assert sum(math.prod(s) for s in shapes.values()) == pytest.approx(params, rel=0.01)
    cfg = found.config
    if key == "flux":
        assert (cfg.hidden_size, cfg.depth, cfg.depth_single_blocks, cfg.context_in_dim, cfg.vec_in_dim) == (
            3072, 19, 38, 4096, 768)
    elif key == "sd35m":
        assert (cfg.depth, cfg.pos_embed_max_size, cfg.qk_norm, cfg.x_block_self_attn_layers, cfg.context_in,
                cfg.adm_in_channels) == (24, 384, True, tuple(range(13)), 4096, 2048)
    else:
        assert (cfg.dim, cfg.heads, cfg.depth, cfg.refiner_depth, cfg.cap_feat_dim, cfg.ffn_hidden) == (
            3840, 30, 30, 2, 2560, 10240)


def test_streamed_file_matches_its_header_and_dtypes(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_dit, "CHUNK_ELEMENTS", 16)   # several chunks per tensor
    shapes = {"a.weight": (10, 7), "a.bias": (10,), "norm.weight": (5,), "scalar": ()}
    path = bench_dit.write_random_file(tmp_path / "x.safetensors", shapes, bench_dit.fp8_matrices, seed=3)
    with safe_open(str(path), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert {k: tuple(v.shape) for k, v in got.items()} == shapes
    assert got["a.weight"].dtype == torch.float8_e4m3fn and got["a.bias"].dtype == torch.bfloat16
    assert torch.isfinite(got["a.weight"].float()).all() and got["a.weight"].float().std() > 0
    assert (got["norm.weight"].float() - 1).abs().max() < 1   # norm scales near 1
    again = bench_dit.write_random_file(tmp_path / "y.safetensors", shapes, bench_dit.fp8_matrices, seed=3)
    assert path.read_bytes() == again.read_bytes()   # seeded
    assert not list(tmp_path.glob("*.partial"))


def test_tiny_run_reports_each_family_and_preset(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_dit.py"), "--tiny", "--size", "64", "--steps", "2",
         "--runs", "f32;memory;quality", "--models", str(tmp_path / "models"), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    rows = data["rows"]
    assert [(r["family"], r["precision"]) for r in rows] == [
        (bench_dit.FAMILIES[k].display, p) for k in bench_dit.FAMILIES for p in ("f32", "memory", "quality")]
    for r in rows:
        assert r["estimate_bytes"] > 0 and "skipped" not in r
        assert r["peak_rss_bytes"] > 50 * 2**20 and r["s_per_step"] > 0 and r["nan_fallbacks"] == []
        assert r["estimate_error"] == pytest.approx(r["estimate_bytes"] / r["peak_rss_bytes"] - 1)
    assert all(r["same_as"] == "f32" for r in rows if r["precision"] == "quality")
    # the files were kept for reuse (--models) and are what the loaders detect
    assert (tmp_path / "models" / "diffusion_models" / "bench_tiny_flux1_dev_fp8.safetensors").exists()
