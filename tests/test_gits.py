"""GITSScheduler: spec as ComfyUI's, the table rows for ≤ 20 steps, log-linear resampling above,
denoise tails, and the table's own structure (catches transcription slips)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.sampling import custom_sampling_nodes  # noqa: F401  (registers the nodes)
from mixgraph.nodes.sampling.schedule_tables import GITS_NOISE_LEVELS
from mixgraph.nodes.sampling.sigma_tools import gits_sigmas


def test_gits_spec_matches_comfyui():
    spec = REGISTRY.get("GITSScheduler")
    got = [(n, i.type, i.default, i.min, i.max, i.step) for n, i in spec.inputs]
    assert got == [("coeff", "FLOAT", 1.20, 0.80, 1.50, 0.05), ("steps", "INT", 10, 2, 1000, None),
                   ("denoise", "FLOAT", 1.0, 0.0, 1.0, 0.01)]
    assert [o.type for o in spec.outputs] == ["SIGMAS"]


def test_gits_table_shape_and_monotone():
    assert [round(c, 2) for c in GITS_NOISE_LEVELS] == [round(0.80 + 0.05 * i, 2) for i in range(15)]
    for coeff, rows in GITS_NOISE_LEVELS.items():
        assert len(rows) == 19
        for i, row in enumerate(rows):
            assert len(row) == i + 3, (coeff, i)
            assert row[0] == 14.61464119 and row[-1] == 0.02916753
            assert all(a > b for a, b in zip(row, row[1:])), (coeff, i)


def test_gits_reference_values_10_steps_default():
    # ComfyUI GITSScheduler(coeff=1.20, steps=10, denoise=1.0)
    want = [14.61464119, 5.85520077, 2.84484982, 1.67050016, 1.08895338, 0.74807048, 0.50118381,
            0.32104823, 0.19894916, 0.09824532, 0.0]
    got = gits_sigmas(1.20, 10, 1.0)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_gits_reference_values_small_rows():
    assert torch.allclose(gits_sigmas(0.80, 2, 1.0), torch.tensor([14.61464119, 7.49001646, 0.0]))
    assert torch.allclose(gits_sigmas(1.50, 3, 1.0),
                          torch.tensor([14.61464119, 0.803307, 0.25053367, 0.0]))


def test_gits_denoise_takes_the_tail():
    full = gits_sigmas(1.00, 8, 1.0)
    half = gits_sigmas(1.00, 8, 0.5)
    assert len(half) == 5
    assert torch.allclose(half[:-1], full[-5:-1]) and half[-1] == 0
    assert len(gits_sigmas(1.00, 8, 0.0)) == 0


def test_gits_above_20_steps_resamples_the_20_step_row():
    row = np.asarray(GITS_NOISE_LEVELS[1.2][-1], dtype=np.float64)
    got = gits_sigmas(1.2, 30, 1.0)
    assert len(got) == 31 and got[-1] == 0
    # log-linear over an even grid: the ends stay, every value lies between table neighbours
    assert abs(float(got[0]) - row[0]) < 1e-5
    xs = np.linspace(0, 1, len(row))
    want = np.exp(np.interp(np.linspace(0, 1, 31), xs, np.log(row[::-1])))[::-1]
    assert np.allclose(got[:-1].numpy(), want[:-1], rtol=1e-6)


def test_gits_unknown_coeff_is_a_clear_error():
    with pytest.raises(ValueError, match="coeff 1.23"):
        gits_sigmas(1.23, 10, 1.0)
