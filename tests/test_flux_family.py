"""The Flux.1 family (``nodes/families/flux``): the model against diffusers'
``FluxTransformer2DModel`` on a tiny config in the real key layouts, detection of BFL / ComfyUI
and diffusers files, its conditioning (guidance, pooled vector, Kontext references, Fill /
Canny-Depth channels), its nodes, and workflows end to end."""

from __future__ import annotations

import pytest
import torch

from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.model import Flux, FluxConfig, default_axes_dim, image_ids, patchify, unpatchify
from tests.flux_fixtures import TINY, flux_state_dict


def _diffusers_flux(cfg: FluxConfig, sd):
    from diffusers import FluxTransformer2DModel

    ref = FluxTransformer2DModel(patch_size=1, in_channels=cfg.in_channels * 4, out_channels=cfg.out_channels * 4,
                                 num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
                                 attention_head_dim=cfg.head_dim, num_attention_heads=cfg.num_heads,
                                 joint_attention_dim=cfg.context_in_dim, pooled_projection_dim=cfg.vec_in_dim,
                                 guidance_embeds=cfg.guidance_embed, axes_dims_rope=cfg.axes_dim).eval()
    converted = diffusers_keys.to_diffusers(sd, ref.state_dict().keys())
    missing, unexpected = ref.load_state_dict(converted, strict=True)
    assert not missing and not unexpected
    return ref


@pytest.mark.parametrize("guidance_embed", [True, False])
def test_flux_matches_diffusers(guidance_embed):
    cfg = FluxConfig(**{**TINY.__dict__, "guidance_embed": guidance_embed})
    sd = flux_state_dict(cfg, seed=1)
    ours = Flux(cfg).eval()
    ours.load_state_dict(sd, strict=True)
    ref = _diffusers_flux(cfg, sd)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 6, 10, generator=g)
    ctx = torch.randn(2, 7, cfg.context_in_dim, generator=g)
    pooled = torch.randn(2, cfg.vec_in_dim, generator=g)
    t = torch.tensor([0.7, 0.25])
    guidance = torch.tensor([3.5, 5.0]) if guidance_embed else None
    with torch.no_grad():
        got = ours(x, t, ctx, pooled, guidance)
        ids = image_ids(3, 5, 1)[0]
        want = ref(hidden_states=patchify(x), encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                   img_ids=ids, txt_ids=torch.zeros(7, 3), guidance=guidance, return_dict=False)[0]
    want = unpatchify(want, 6, 10)
    assert got.shape == want.shape == x.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    # and the key map round-trips
    back = diffusers_keys.to_bfl(ref.state_dict())
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_axes_dim_and_odd_sizes():
    assert default_axes_dim(128) == (16, 56, 56) and sum(default_axes_dim(32)) == 32
    x = torch.randn(1, 16, 5, 7)
    tokens = patchify(x)
    assert tokens.shape == (1, 3 * 4, 64)
    assert torch.equal(unpatchify(tokens, 5, 7), x)
