"""ControlNet model, file conversion and chain (nodes/adapters/controlnet.py) on tiny seeded nets."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.adapters.controlnet import (ControlNetChain, ControlNetModel,
                                                controlnet_config_from_state_dict,
                                                convert_controlnet_state_dict, resize_hint)
from mixgraph.nodes.families.sd.unet import timestep_embedding
from tests.fixtures.tiny_lora import (
    TINY_POOLED,
    diffusers_controlnet_config,
    tiny_controlnet_config,
    tiny_controlnet_state_dict,
    to_diffusers_controlnet,
)
from tests.fixtures.tiny_unet import tiny_unet


def _net(kind: str, seed: int = 0) -> ControlNetModel:
    sd = convert_controlnet_state_dict(tiny_controlnet_state_dict(kind, seed))
    m = ControlNetModel(controlnet_config_from_state_dict(sd))
    m.load_state_dict(sd)
    return m.eval()


def controlnet_inputs(kind: str, batch: int = 2, hw: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cfg = tiny_controlnet_config(kind).unet
    x = torch.randn(batch, 4, hw, hw, generator=g)
    t = torch.linspace(999.0, 100.0, batch)
    ctx = torch.randn(batch, 7, cfg.context_dim, generator=g)
    pooled = time_ids = y = None
    if cfg.adm_in_channels is not None:
        pooled = torch.randn(batch, TINY_POOLED, generator=g)
        time_ids = torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * batch)
        # SDXL y = [pooled, 256-wide sinusoid of each size number]
        y = torch.cat([pooled, timestep_embedding(time_ids.flatten(), 256).reshape(batch, -1)], dim=1)
    return x, t, ctx, y, pooled, time_ids, g


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
def test_controlnet_matches_diffusers_controlnet_model(kind):
    from diffusers import ControlNetModel as DiffusersControlNet

    ldm = tiny_controlnet_state_dict(kind)
    ours = _net(kind)
    theirs = DiffusersControlNet(**diffusers_controlnet_config(kind))
    theirs.load_state_dict(to_diffusers_controlnet(ldm, kind), strict=True)
    theirs.eval()
    x, t, ctx, y, pooled, time_ids, g = controlnet_inputs(kind)
    hint = torch.rand(2, 3, 64, 64, generator=g)
    kw = {} if y is None else {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": time_ids}}
    with torch.no_grad():
        outs = ours(x, hint, t, ctx, y)
        down, mid = theirs(x, t, ctx, hint, return_dict=False, **kw)
    ref = list(down) + [mid]
    assert len(outs) == len(ref) == len(ours.input_blocks) + 1
    for a, b in zip(outs, ref):
        assert a.shape == b.shape
        assert b.abs().mean() > 0.1  # zero convs carry signal in this fixture
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
def test_convert_controlnet_state_dict_diffusers_layout_to_ldm_names(kind):
    ldm = tiny_controlnet_state_dict(kind)
    diffusers_sd = to_diffusers_controlnet(ldm, kind)
    ours = convert_controlnet_state_dict(diffusers_sd)
    assert set(ours) == {k[len("control_model."):] for k in ldm}
    for k, v in ours.items():
        assert v is ldm["control_model." + k], k
    specific = {
        "controlnet_cond_embedding.conv_in.weight": "input_hint_block.0.weight",
        "controlnet_cond_embedding.blocks.5.weight": "input_hint_block.12.weight",
        "controlnet_cond_embedding.conv_out.bias": "input_hint_block.14.bias",
        "controlnet_down_blocks.3.weight": "zero_convs.3.0.weight",
        "controlnet_mid_block.bias": "middle_block_out.0.bias",
        "down_blocks.0.downsamplers.0.conv.weight": "input_blocks.2.0.op.weight",
        "down_blocks.1.resnets.0.conv_shortcut.weight": "input_blocks.3.0.skip_connection.weight",
        "mid_block.resnets.1.time_emb_proj.weight": "middle_block.2.emb_layers.1.weight",
    }
    for d, l in specific.items():
        assert ours[l] is diffusers_sd[d]


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
def test_controlnet_config_from_state_dict_recovers_config(kind):
    sd = convert_controlnet_state_dict(tiny_controlnet_state_dict(kind))
    assert controlnet_config_from_state_dict(sd) == tiny_controlnet_config(kind)


def test_convert_controlnet_state_dict_rejects_unknown_formats():
    with pytest.raises(NotImplementedError, match="not supported yet"):
        convert_controlnet_state_dict({"adapter.body.0.weight": torch.zeros(1)})


def test_resize_hint_center_crops_to_target_aspect_then_nearest_exact():
    g = torch.Generator().manual_seed(0)
    wide = torch.rand(1, 6, 12, 3, generator=g)  # aspect 2 -> 1: crop 3 columns each side
    ref = F.interpolate(wide.movedim(-1, 1)[..., :, 3:9], size=(8, 8), mode="nearest-exact")
    assert torch.equal(resize_hint(wide, 8, 8), ref)
    tall = torch.rand(2, 10, 4, 3, generator=g)  # aspect 0.4 -> 0.5: crop 1 row each side
    ref = F.interpolate(tall.movedim(-1, 1)[..., 1:9, :], size=(16, 8), mode="nearest-exact")
    assert torch.equal(resize_hint(tall, 16, 8), ref)
    same = torch.rand(1, 16, 16, 3, generator=g)
    assert torch.equal(resize_hint(same, 16, 16), same.movedim(-1, 1))


@pytest.fixture(scope="module")
def sd15_nets():
    return _net("sd15", seed=0), _net("sd15", seed=1)


def test_chain_residuals_are_net_outputs_times_strength(sd15_nets):
    net, _ = sd15_nets
    x, t, ctx, y, *_, g = controlnet_inputs("sd15", batch=3)
    image = torch.rand(1, 48, 48, 3, generator=g)  # one hint image, resized 48 -> 64, shared by 3
    chain = ControlNetChain(net, image, strength=0.4)
    with torch.no_grad():
        ctrl = chain.residuals(x, t, ctx, y, torch.ones(3), 0.5)
        raw = net(x, resize_hint(image, 64, 64).expand(3, -1, -1, -1), t, ctx, y)
    assert len(ctrl.input) == len(raw) - 1
    for a, b in zip(ctrl.input, raw[:-1]):
        assert torch.equal(a, b * 0.4)
    assert torch.equal(ctrl.middle, raw[-1] * 0.4)


def test_chain_is_inactive_outside_its_percent_range(sd15_nets):
    net, _ = sd15_nets
    x, t, ctx, y, *_, g = controlnet_inputs("sd15")
    chain = ControlNetChain(net, torch.rand(1, 64, 64, 3, generator=g), 1.0, start_percent=0.2, end_percent=0.6)
    with torch.no_grad():
        assert chain.residuals(x, t, ctx, y, torch.ones(2), 0.1) is None
        assert chain.residuals(x, t, ctx, y, torch.ones(2), 0.61) is None
        assert chain.residuals(x, t, ctx, y, torch.ones(2), 0.2) is not None  # bounds inclusive
        assert chain.residuals(x, t, ctx, y, torch.ones(2), 0.6) is not None


def test_chain_sums_with_previous_nets(sd15_nets):
    net_a, net_b = sd15_nets
    x, t, ctx, y, *_, g = controlnet_inputs("sd15")
    img_a, img_b = torch.rand(2, 64, 64, 3, generator=g), torch.rand(1, 64, 64, 3, generator=g)
    a = ControlNetChain(net_a, img_a, 0.7, 0.0, 0.5)
    ab = ControlNetChain(net_b, img_b, 1.3, 0.0, 1.0, previous=a)
    with torch.no_grad():
        only_a = a.residuals(x, t, ctx, y, torch.ones(2), 0.3)
        only_b = ControlNetChain(net_b, img_b, 1.3).residuals(x, t, ctx, y, torch.ones(2), 0.3)
        both = ab.residuals(x, t, ctx, y, torch.ones(2), 0.3)
        late = ab.residuals(x, t, ctx, y, torch.ones(2), 0.8)  # a is past its end
    for s, p, q in zip(both.input, only_a.input, only_b.input):
        assert torch.equal(s, p + q)
    assert torch.equal(both.middle, only_a.middle + only_b.middle)
    for s, q in zip(late.input, only_b.input):
        assert torch.equal(s, q)


def test_chain_residuals_feed_the_unet_skip_connections(sd15_nets):
    net, _ = sd15_nets
    unet = tiny_unet("sd15")
    x, t, ctx, y, *_, g = controlnet_inputs("sd15")
    chain = ControlNetChain(net, torch.rand(1, 64, 64, 3, generator=g), 1.0)
    with torch.no_grad():
        ctrl = chain.residuals(x, t, ctx, y, torch.ones(2), 0.0)
        plain = unet(x, t, ctx)
        controlled = unet(x, t, ctx, control=ctrl)
        zero = ControlNetChain(net, chain.hint, 0.0).residuals(x, t, ctx, y, torch.ones(2), 0.0)
    assert len(ctrl.input) == len(unet.input_blocks)
    assert (controlled - plain).abs().mean() > 1e-2
    assert zero is None


@dataclass(frozen=True)
class FixedPolicy:
    storage: torch.dtype
    compute: torch.dtype
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


def test_controlnet_under_bf16_storage_returns_f32_close_to_f32(sd15_nets):
    net, _ = sd15_nets
    x, t, ctx, y, *_, g = controlnet_inputs("sd15", batch=1, hw=4)
    hint = torch.rand(1, 3, 32, 32, generator=g)
    half = apply_precision(net, FixedPolicy(torch.bfloat16, torch.float32))
    with torch.no_grad():
        ref = net(x, hint, t, ctx, y)
        out = half(x, hint, t, ctx, y)
    for a, b in zip(out, ref):
        assert a.dtype == torch.float32
        assert (a - b).abs().max() < 0.1 * b.abs().max()


@pytest.mark.parametrize("layout", ["ldm", "diffusers"])
def test_load_controlnet_file_runs_the_same_net(tmp_path, sd15_nets, layout):
    from safetensors.torch import save_file

    from mixgraph.nodes.models.loader import load_controlnet

    ldm = tiny_controlnet_state_dict("sd15", seed=0)
    sd = ldm if layout == "ldm" else to_diffusers_controlnet(ldm, "sd15")
    path = tmp_path / f"cn_{layout}.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    handle = load_controlnet(path)
    assert handle.config == tiny_controlnet_config("sd15")
    runner = handle.runner(FixedPolicy(torch.float32, torch.float32))
    x, t, ctx, y, *_, g = controlnet_inputs("sd15", batch=1, hw=4)
    hint = torch.rand(1, 3, 32, 32, generator=g)
    with torch.no_grad():
        for a, b in zip(runner(x, hint, t, ctx, y), sd15_nets[0](x, hint, t, ctx, y)):
            # Same weights and math, but the loaded net's tensors come from an mmapped file with
            # their own strides, so oneDNN may pick other kernels (3.8e-6 seen on an AVX-512 EPYC):
            # f32 rounding of a few hundred accumulations, far below any wrong-weight error.
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
