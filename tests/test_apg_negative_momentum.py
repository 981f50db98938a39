"""APG's momentum as in ComfyUI's V3 nodes_apg.py (comfyanonymous/ComfyUI 940df5e): the input
takes −5 … 1 and any non-zero momentum (the paper's negative one included) keeps the running
average of the guidance."""

from __future__ import annotations

import torch

from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.declare.model_patches import model_patch_nodes  # noqa: F401  (register)
from mixgraph.nodes.sampling.cfg_patches import APG, GuidanceArgs


def _args(cond, uncond, sigma, state):
    return GuidanceArgs(x=torch.zeros_like(cond), sigma=torch.tensor([sigma]), cond_scale=2.0,
                        cond_denoised=cond, uncond_denoised=uncond, evaluate=lambda _p: cond,
                        state=state)


def test_apg_momentum_range_is_comfyuis_v3():
    m = REGISTRY.get("APG").input_map["momentum"]
    assert (m.min, m.max, m.default, m.step) == (-5.0, 1.0, 0.0, 0.01)


def test_apg_negative_momentum_keeps_the_running_average():
    """eta = 1, no norm clamp: APG's cond is uncond + ḡ + (cond − uncond)/cfg with
    ḡ = momentum·ḡ_prev + g; momentum −0.5 on the second step gives g2 − 0.5·g1."""
    patch, state = APG(eta=1.0, norm_threshold=0.0, momentum=-0.5), {}
    uncond = torch.zeros(1, 2, 2, 2)
    g1 = torch.arange(8.0).reshape(1, 2, 2, 2) + 1.0
    g2 = torch.full((1, 2, 2, 2), 3.0)
    patch.pre(_args(uncond + g1, uncond, 5.0, state))
    out, _ = patch.pre(_args(uncond + g2, uncond, 2.0, state))
    expected = uncond + (g2 - 0.5 * g1) + g2 / 2.0
    assert torch.allclose(out, expected, atol=1e-6)
    # momentum 0 ignores the history
    plain, _ = APG(eta=1.0, norm_threshold=0.0, momentum=0.0).pre(_args(uncond + g2, uncond, 2.0, {}))
    assert torch.allclose(plain, uncond + g2 + g2 / 2.0, atol=1e-6)
