"""Mismatches found re-reading ComfyUI's modules (docs/comfy-core-coverage.md, the † rows):
Perp-Neg's non-finite projection falls back to CFG (nodes_perpneg.py, Comfy-Org f6ae4ca),
DifferentialDiffusion's strength step (6dbaee6), PrimitiveFloat's step (nodes_primitive.py
02529c6), and the Perp-Neg display names."""

from __future__ import annotations

import torch

from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.logic import primitive_nodes  # noqa: F401  (register)
from mixgraph.nodes.declare.model_patches import guidance_extra_nodes, model_patch_nodes  # noqa: F401
from mixgraph.nodes.declare.sampling import custom_sampling_nodes  # noqa: F401
from mixgraph.nodes.sampling.guidance import perp_neg


def test_perp_neg_positive_equal_to_empty_falls_back_to_cfg():
    """p = pos − empty = 0 makes the projection 0/0; ComfyUI counts it as 0 (no NaN)."""
    empty = torch.linspace(-1, 1, 32).reshape(1, 2, 4, 4)
    neg = empty + 0.3
    out = perp_neg(empty.clone(), neg, empty, neg_scale=0.7, cfg=5.0)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, empty + 5.0 * (0.0 - 0.7 * (neg - empty)))


def test_perp_neg_finite_projection_unchanged():
    pos, neg, empty = (torch.full((1, 1, 2, 2), v) for v in (2.0, 1.0, 0.0))
    out = perp_neg(pos, neg, empty, neg_scale=1.0, cfg=3.0)  # parallel: nothing removed
    assert torch.allclose(out, torch.full_like(out, 6.0))


def test_reread_specs_match_comfyui():
    assert REGISTRY.get("DifferentialDiffusion").input_map["strength"].step == 0.0001
    assert REGISTRY.get("PrimitiveFloat").input_map["value"].step == 0.1
    assert REGISTRY.get("PerpNeg").display_name == "Perp-Neg (DEPRECATED by Perp-Neg Guider)"
    assert REGISTRY.get("PerpNegGuider").display_name == "Perp-Neg Guider"
