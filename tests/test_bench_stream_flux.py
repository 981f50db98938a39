"""benchmarks/bench_stream_flux.py works: its random Q4_0 GGUF file is what mixgraph's GGUF reader
reads (keys, shapes, types, values of the intended spread), and `--tiny` streams the fp8 and GGUF
diffusion models through the real nodes under a budget, each latent equal to its resident run's.
No number is asserted beyond being there (a benchmark, not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_stream_flux  # noqa: E402


def test_random_gguf_reads_back_as_the_shapes_in_q4_0(tmp_path, monkeypatch):
    from mixgraph.nodes.weights import gguf_file
    from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor

    monkeypatch.setattr(bench_stream_flux, "CHUNK_BLOCKS", 8)   # several chunks per tensor
    shapes = {"a.weight": (40, 64), "a.bias": (40,), "norm.scale": (16,), "b.weight": (3, 96)}
    path = bench_stream_flux.write_random_gguf(tmp_path / "x.gguf", shapes, seed=3)
    c = gguf_file.contents(path)
    assert c.architecture == "flux"
    assert {k: t.shape for k, t in c.tensors.items()} == shapes
    assert {k: t.type_name for k, t in c.tensors.items()} == {
        "a.weight": "Q4_0", "b.weight": "Q4_0", "a.bias": "F32", "norm.scale": "F32"}
    q = c.tensors["a.weight"].read()
    assert isinstance(q, QuantizedTensor)
    w = q.dequantize()
    assert w.shape == (40, 64) and torch.isfinite(w).all()
    assert 0.5 < float(w.float().std()) * 64 ** 0.5 < 1.5   # about N(0, 1 / fan_in)
    assert (c.tensors["norm.scale"].read() - 1).abs().max() < 1
    assert not list(tmp_path.glob("*.partial"))


def test_tiny_run_streams_fp8_and_gguf(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_stream_flux.py"), "--tiny", "--size", "64",
         "--models", str(tmp_path / "models"), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["format"], r["budget_gib"] < 1) for r in rows] == [("fp8", True), ("gguf_q4_0", True),
                                                                   ("fp8", False), ("gguf_q4_0", False)]
    for r in rows:
        assert "error" not in r and r["s_per_step"] > 0 and r["peak_rss_bytes"] > 50 * 2**20 and r["latent_finite"]
    assert all(r["bytes_per_step"] > 0 for r in rows[:2]) and all(r["bytes_per_step"] == 0 for r in rows[2:])
    assert rows[0]["identical_to_resident"] is True and rows[1]["identical_to_resident"] is True
