"""UNet: reference against diffusers on identical random weights, detection, ControlNet residuals."""

from __future__ import annotations

import functools

import pytest
import torch
from diffusers import UNet2DConditionModel
from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

from mixgraph.nodes.families.sd.unet import (UNetModel, sdxl_adm, sdxl_refiner_adm, timestep_embedding,
                                             unet_config_from_state_dict)
from mixgraph.nodes.payloads.conditioning import Control
from tests.fixtures.tiny_unet import KINDS, TINY_POOLED, tiny_unet, tiny_unet_config, tiny_unet_state_dict

PREFIX = "model.diffusion_model."
ours_unet = functools.cache(tiny_unet)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# diffusers configs equal to the tiny kinds (attention_head_dim is diffusers' head *count*)
DIFFUSERS_CONFIGS = {
    "sd15": dict(
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32, attention_head_dim=8,
    ),
    "sdxl": dict(
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(64, 128), layers_per_block=1, transformer_layers_per_block=(1, 2),
        cross_attention_dim=64, attention_head_dim=(1, 2), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=TINY_POOLED + 6 * 256,
    ),
}


@functools.cache  # models are only read; building them dominates the test time
def diffusers_unet(kind: str) -> UNet2DConditionModel:
    ref = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, **DIFFUSERS_CONFIGS[kind])
    ldm = {PREFIX + k: v for k, v in tiny_unet_state_dict(kind).items()}
    ref.load_state_dict(convert_ldm_unet_checkpoint(ldm, dict(ref.config)), strict=True)
    return ref.eval()


def inputs(kind: str, h: int = 8, w: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    cfg = tiny_unet_config(kind)
    x = torch.randn(2, cfg.in_channels, h, w, generator=g)
    t = torch.tensor([3.0, 871.0])
    ctx = torch.randn(2, 5, cfg.context_dim, generator=g)
    pooled = torch.randn(2, TINY_POOLED, generator=g)
    return x, t, ctx, pooled


def sdxl_pair(pooled: torch.Tensor):
    """Our y and diffusers' added_cond_kwargs for one non-square, cropped size condition."""
    y = sdxl_adm(pooled, width=512, height=768, crop_w=16, crop_h=32, target_width=1024, target_height=640)
    # diffusers time_ids: original (h, w), crop (top, left), target (h, w)
    time_ids = torch.tensor([[768.0, 512.0, 32.0, 16.0, 640.0, 1024.0]]).repeat(2, 1)
    return y, {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": time_ids}}


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
@pytest.mark.parametrize("hw", [(8, 8), (9, 11)])
@torch.no_grad()
def test_unet_matches_diffusers(kind, hw):
    ours, ref = ours_unet(kind), diffusers_unet(kind)
    x, t, ctx, pooled = inputs(kind, *hw)
    y, extra = sdxl_pair(pooled) if kind == "sdxl" else (None, {})
    a = ours(x, t, ctx, y)
    b = ref(x, t, ctx, **extra).sample
    assert a.shape == b.shape == (2, 4, *hw)
    assert (a - b).abs().max().item() < 1e-4
    assert b.abs().max().item() > 0.5  # the comparison is not between two near-zero tensors


@torch.no_grad()
def test_unet_sdxl_size_order_matters():
    ours, ref = ours_unet("sdxl"), diffusers_unet("sdxl")
    x, t, ctx, pooled = inputs("sdxl")
    _, extra = sdxl_pair(pooled)
    swapped = sdxl_adm(
        pooled, width=768, height=512, crop_w=32, crop_h=16, target_width=640, target_height=1024
    )
    b = ref(x, t, ctx, **extra).sample
    assert (ours(x, t, ctx, swapped) - b).abs().max().item() > 1e-3


def test_sdxl_adm_layout():
    pooled = torch.randn(3, TINY_POOLED, generator=torch.Generator().manual_seed(0))
    y = sdxl_adm(pooled, width=1024, height=768, crop_w=8, crop_h=16, target_width=512, target_height=256)
    assert y.shape == (3, TINY_POOLED + 6 * 256) and y.dtype == torch.float32
    assert torch.equal(y[:, :TINY_POOLED], pooled)
    expected = timestep_embedding(torch.tensor([768.0, 1024.0, 16.0, 8.0, 256.0, 512.0]), 256).reshape(-1)
    assert torch.equal(y[1, TINY_POOLED:], expected)
    r = sdxl_refiner_adm(pooled, width=1024, height=768, crop_w=0, crop_h=0, aesthetic_score=2.5)
    assert r.shape == (3, TINY_POOLED + 5 * 256)
    assert torch.equal(r[0, TINY_POOLED + 4 * 256:], timestep_embedding(torch.tensor([2.5]), 256)[0])


def test_timestep_embedding_is_cos_then_sin():
    emb = timestep_embedding(torch.tensor([0.0, 5.0]), 8)
    assert torch.equal(emb[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    freqs = torch.exp(-torch.log(torch.tensor(10000.0)) * torch.arange(4) / 4)
    assert torch.allclose(emb[1], torch.cat([torch.cos(5 * freqs), torch.sin(5 * freqs)]))


@pytest.mark.parametrize("kind", KINDS)
def test_unet_config_from_state_dict_round_trip(kind):
    sd = {PREFIX + k: v for k, v in tiny_unet_state_dict(kind).items()}
    sd["first_stage_model.decoder.conv_in.weight"] = torch.zeros(1)  # other checkpoint parts are ignored
    cfg = unet_config_from_state_dict(sd, prefix=PREFIX)
    assert cfg == tiny_unet_config(kind)
    UNetModel(cfg).load_state_dict(tiny_unet_state_dict(kind), strict=True)


def test_unet_config_from_state_dict_rejects_non_unet():
    sd = {"encoder.conv_in.weight": torch.zeros(8, 3, 3, 3), "decoder.conv_out.weight": torch.zeros(3, 8, 3, 3)}
    with pytest.raises(ValueError, match=r"not an LDM UNet.*encoder.conv_in.weight"):
        unet_config_from_state_dict(sd)
    with pytest.raises(ValueError, match="under prefix 'model.diffusion_model.'"):
        unet_config_from_state_dict({"input_blocks.0.0.weight": torch.zeros(32, 4, 3, 3)}, PREFIX)


def skip_shapes(model: UNetModel, x, t, ctx, y=None) -> list[torch.Size]:
    shapes: list[torch.Size] = []
    hooks = [
        b.register_forward_hook(lambda _m, _i, o: shapes.append(o.shape)) for b in model.input_blocks
    ]
    model(x, t, ctx, y)
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
@torch.no_grad()
def test_unet_control_residuals_match_diffusers(kind):
    ours, ref = ours_unet(kind), diffusers_unet(kind)
    x, t, ctx, pooled = inputs(kind)
    y, extra = sdxl_pair(pooled) if kind == "sdxl" else (None, {})
    shapes = skip_shapes(ours, x, t, ctx, y)
    g = torch.Generator().manual_seed(7)
    residuals = [torch.randn(s, generator=g) for s in shapes]
    middle = torch.randn(shapes[-1], generator=g)
    control = Control(input=[None if i == 1 else r for i, r in enumerate(residuals)], middle=middle)
    dense = tuple(torch.zeros_like(r) if i == 1 else r for i, r in enumerate(residuals))

    a = ours(x, t, ctx, y, control=control)
    b = ref(x, t, ctx, down_block_additional_residuals=dense, mid_block_additional_residual=middle,
            **extra).sample
    assert (a - b).abs().max().item() < 1e-4
    assert (a - ours(x, t, ctx, y)).abs().max().item() > 1e-2  # residuals really changed the output


def test_control_add_sums_residuals_and_rejects_mismatch():
    a = Control(input=[torch.ones(1), None], middle=None)
    b = Control(input=[torch.ones(1), torch.full((1,), 2.0)], middle=torch.ones(1))
    s = a + b
    assert torch.equal(s.input[0], torch.full((1,), 2.0)) and torch.equal(s.input[1], torch.full((1,), 2.0))
    assert torch.equal(s.middle, torch.ones(1))
    with pytest.raises(ValueError):
        a + Control(input=[None], middle=None)


def test_unet_rejects_wrong_y_and_control_length():
    model = ours_unet("sd15")
    x, t, ctx, _ = inputs("sd15")
    with pytest.raises(ValueError, match="adm_in_channels=None"):
        model(x, t, ctx, y=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="input residuals"):
        model(x, t, ctx, control=Control(input=[None], middle=None))
