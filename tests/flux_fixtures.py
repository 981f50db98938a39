"""Tiny Flux.1 / Chroma weights in the real key layouts, for tests (seeded default init)."""

from __future__ import annotations

import torch
from torch import Tensor

from mixgraph.nodes.families.flux.model import Flux, FluxConfig, default_axes_dim

# context and pooled widths equal the tiny SD CLIP fixture's (tests/fixtures/tiny_clip.py: 32), so
# CLIPLoader type stable_diffusion can condition it until the T5 encoder lands
TINY = FluxConfig(in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=64, num_heads=2,
                  depth=2, depth_single_blocks=2, axes_dim=default_axes_dim(32), guidance_embed=True)


def flux_state_dict(cfg: FluxConfig = TINY, seed: int = 0) -> dict[str, Tensor]:
    """Random weights; RMS scales and the zero-initialised-in-training output layer made non-trivial."""
    torch.manual_seed(seed)
    model = Flux(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".scale"):
                p.uniform_(0.5, 1.5)
        model.final_layer.linear.weight.mul_(0.5)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
