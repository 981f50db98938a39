"""ControlNet++ union ControlNets (nodes/adapters/controlnet_union.py) and ComfyUI's nodes_controlnet.py
(SetUnionControlNetType, ControlNetInpaintingAliMamaApply): spec, loading a tiny union SDXL net in
the xinsir file layout, its union parts against the formulas written out here, sampling through
ControlNetApplyAdvanced + KSampler, and the nodes on plain ControlNets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.conditioning.controlnet_extra_nodes import SetUnionControlNetType
from mixgraph.nodes.adapters.controlnet import (ControlNetChain, ControlNetModel,
                                                controlnet_config_from_state_dict,
                                                convert_controlnet_state_dict)
from mixgraph.nodes.adapters.controlnet_union import UNION_CONTROLNET_TYPES, UnionConfig
from mixgraph.nodes.models.loader import load_controlnet
from mixgraph.nodes.families.sd.unet import timestep_embedding
from mixgraph.ui import api
from tests.fixtures.tiny_lora import (tiny_controlnet_state_dict, tiny_union_controlnet_state_dict,
                                      to_diffusers_controlnet)
from tests.test_controlnet import controlnet_inputs

F32 = parse_spec("f32")
TYPES = ["auto", "openpose", "depth", "hed/pidi/scribble/ted", "canny/lineart/anime_lineart/mlsd", "normal",
         "segment", "tile", "repaint"]


def save_state_dict(path, sd):
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def union_file(tmp_path_factory):
    return save_state_dict(tmp_path_factory.mktemp("union") / "union.safetensors", tiny_union_controlnet_state_dict(0))


# --------------------------------------------------------------------------------------------
# specs


def test_set_union_controlnet_type_spec_matches_comfyui():
    info = api.default_registry().object_info()["SetUnionControlNetType"]
    req = info["input"]["required"]
    assert list(req) == ["control_net", "type"]
    assert req["control_net"] == ["CONTROL_NET"]
    assert req["type"][0] == TYPES  # ComfyUI: ["auto"] + list(UNION_CONTROLNET_TYPES)
    assert info["output"] == ["CONTROL_NET"] and info["output_name"] == ["CONTROL_NET"]
    assert info["category"] == "conditioning/controlnet" and "optional" not in info["input"]


def test_controlnet_inpainting_alimama_apply_spec_matches_comfyui():
    info = api.default_registry().object_info()["ControlNetInpaintingAliMamaApply"]
    req = info["input"]["required"]
    assert list(req) == ["positive", "negative", "control_net", "vae", "image", "mask", "strength",
                         "start_percent", "end_percent"]
    assert [req[k][0] for k in list(req)[:6]] == ["CONDITIONING", "CONDITIONING", "CONTROL_NET", "VAE", "IMAGE", "MASK"]
    assert req["strength"][1] == {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}
    assert req["start_percent"][1] == {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.001}
    assert req["end_percent"][1] == {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.001}
    assert info["output"] == ["CONDITIONING", "CONDITIONING"] and info["output_name"] == ["positive", "negative"]
    assert info["category"] == "conditioning/controlnet"


def test_union_controlnet_types_are_comfyuis_indices():
    assert UNION_CONTROLNET_TYPES == {"openpose": 0, "depth": 1, "hed/pidi/scribble/ted": 2,
                                      "canny/lineart/anime_lineart/mlsd": 3, "normal": 4, "segment": 5,
                                      "tile": 6, "repaint": 7}


# --------------------------------------------------------------------------------------------
# loading and the union math


def test_load_controlnet_union_file_derives_union_config(union_file):
    handle = load_controlnet(union_file)
    assert handle.config.union == UnionConfig(num_types=8, width=64, layers=1, type_embed_dim=256, heads=8)
    assert handle.control_type == ()
    # the plain part is the tiny SDXL ControlNet's
    plain = controlnet_config_from_state_dict(convert_controlnet_state_dict(tiny_controlnet_state_dict("sdxl")))
    assert dataclasses.replace(handle.config, union=None) == plain


def test_convert_controlnet_state_dict_keeps_refusing_instantx_mode_embedding():
    sd = to_diffusers_controlnet(tiny_controlnet_state_dict("sdxl"), "sdxl")
    sd["controlnet_mode_embedding.weight"] = torch.zeros(10, 64)
    with pytest.raises(NotImplementedError, match="controlnet_mode_embedding.*not supported yet"):
        convert_controlnet_state_dict(sd)


def _sinusoid(v: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    a = v[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1)


def _reference(net: ControlNetModel, sd: dict, x, hint, t, ctx, y, control_type: int | None):
    """The union net written from the formulas (comfy/cldm/cldm.py), with the net's own plain
    parts (time/label embeddings, hint convs, encoder blocks)."""
    n, w = sd["task_embedding"].shape
    one_hot = torch.zeros(n)
    if control_type is not None:
        one_hot[control_type] = 1.0
    e = _sinusoid(one_hot, 256).reshape(1, n * 256)
    add = F.silu(e @ sd["control_add_embedding.linear_1.weight"].T + sd["control_add_embedding.linear_1.bias"])
    add = add @ sd["control_add_embedding.linear_2.weight"].T + sd["control_add_embedding.linear_2.bias"]
    emb = net.time_embed(timestep_embedding(t, 64)) + add + net.label_emb(y)
    feats = net.input_hint_block(hint)
    guided = feats
    if control_type is not None:
        p = "transformer_layes.0."
        tok = (feats.mean(dim=(2, 3)) + sd["task_embedding"][control_type])[:, None]  # [B, 1, W]
        h = F.layer_norm(tok, (w,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps=1e-5)
        q, k, v = (h @ sd[p + "attn.in_proj_weight"].T + sd[p + "attn.in_proj_bias"]).split(w, dim=-1)
        heads, d = 8, w // 8
        q, k, v = (z.reshape(z.shape[0], -1, heads, d).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v
        att = att.transpose(1, 2).reshape(tok.shape)
        tok = tok + att @ sd[p + "attn.out_proj.weight"].T + sd[p + "attn.out_proj.bias"]
        h = F.layer_norm(tok, (w,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps=1e-5)
        h = h @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"]
        h = h * torch.sigmoid(1.702 * h)
        tok = tok + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]
        alpha = tok[:, 0] @ sd["spatial_ch_projs.weight"].T + sd["spatial_ch_projs.bias"]
        guided = feats + alpha[:, :, None, None]
    outs, h = [], x
    for i, (block, zero) in enumerate(zip(net.input_blocks, net.zero_convs)):
        h = block(h, emb, ctx)
        if i == 0:
            h = h + guided
        outs.append(zero(h))
    outs.append(net.middle_block_out(net.middle_block(h, emb, ctx)))
    return outs


def test_union_controlnet_type_and_auto_match_the_formulas(union_file):
    raw = tiny_union_controlnet_state_dict(0)
    sd = convert_controlnet_state_dict(raw)
    runner = load_controlnet(union_file).runner(F32)
    x, t, ctx, y, *_, g = controlnet_inputs("sdxl", batch=2, hw=8)
    hint = torch.rand(2, 3, 64, 64, generator=g)
    net = ControlNetModel(controlnet_config_from_state_dict(sd))
    net.load_state_dict(sd)
    with torch.no_grad():
        auto = runner(x, hint, t, ctx, y)
        depth = runner(x, hint, t, ctx, y, control_type=(UNION_CONTROLNET_TYPES["depth"],))
        canny = runner(x, hint, t, ctx, y, control_type=[3])
        for got, ctype in ((auto, None), (depth, 1), (canny, 3)):
            ref = _reference(net.eval(), sd, x, hint, t, ctx, y, ctype)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
    # the type changes every residual, and two types differ
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(auto, depth))
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(depth, canny))


def test_set_union_controlnet_type_sets_the_index_and_refuses_types_the_net_lacks(union_file):
    handle = load_controlnet(union_file)
    (depth,) = SetUnionControlNetType(handle, "depth")
    assert depth.control_type == (1,) and handle.control_type == ()
    (auto,) = SetUnionControlNetType(depth, "auto")
    assert auto.control_type == ()
    (repaint,) = SetUnionControlNetType(handle, "repaint")
    assert repaint.control_type == (7,)
    six = dataclasses.replace(handle, config=dataclasses.replace(
        handle.config, union=dataclasses.replace(handle.config.union, num_types=6)))  # the first union release
    with pytest.raises(ValueError, match="'tile' \\(index 6\\) is not one of this net's 6 types"):
        SetUnionControlNetType(six, "tile")


def test_set_union_controlnet_type_on_a_plain_controlnet_is_ignored_by_it(tmp_path):
    path = save_state_dict(tmp_path / "plain.safetensors", tiny_controlnet_state_dict("sdxl", 3))
    handle = load_controlnet(path)
    assert handle.config.union is None
    (typed,) = SetUnionControlNetType(handle, "openpose")
    assert typed.control_type == (0,)  # the extra argument is set, as ComfyUI's set_extra_arg
    x, t, ctx, y, *_, g = controlnet_inputs("sdxl", batch=1, hw=8)
    hint = torch.rand(1, 64, 64, 3, generator=g)
    sigma = torch.tensor([1.0])
    runner = handle.runner(F32)
    with torch.no_grad():
        plain = ControlNetChain(runner, hint).residuals(x, t, ctx, y, sigma, 0.5)
        with_type = ControlNetChain(runner, hint, control_type=typed.control_type).residuals(x, t, ctx, y, sigma, 0.5)
    for a, b in zip(plain.input + [plain.middle], with_type.input + [with_type.middle]):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------
# sampling through the nodes


@pytest.fixture(scope="module")
def models(tmp_path_factory, union_file):
    from tests.fixtures.checkpoints import write_sdxl

    root = tmp_path_factory.mktemp("union_models")
    write_sdxl(root / "checkpoints" / "sdxl_tiny.safetensors", seed=0)
    save_state_dict(root / "controlnet" / "union_tiny.safetensors", tiny_union_controlnet_state_dict(0))
    save_state_dict(root / "controlnet" / "plain_sdxl.safetensors", tiny_controlnet_state_dict("sdxl", 3))
    return root


def _sample(models, tmp_path, net: str, type_: str | None = None, alimama: bool = False, strength: float = 1.0):
    from PIL import Image

    (tmp_path / "in").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 30, 90)).save(tmp_path / "in" / "hint.png")
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sdxl_tiny.safetensors")
    cn = g.add("ControlNetLoader", control_net_name=net)
    if type_ is not None:
        cn = g.add("SetUnionControlNetType", control_net=cn, type=type_)
    pos = g.add("CLIPTextEncode", text="a road", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    image = g.add("LoadImage", image="hint.png")
    common = dict(positive=pos, negative=neg, control_net=cn, image=image[0], strength=strength,
                  start_percent=0.0, end_percent=1.0)
    if alimama:
        ap = g.add("ControlNetInpaintingAliMamaApply", vae=ck[2], mask=image[1], **common)
    else:
        ap = g.add("ControlNetApplyAdvanced", **common)
    ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=ap[0], negative=ap[1],
               latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1),
               denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    return out[ks.node_id][0].samples


def test_union_controlnet_samples_through_apply_advanced_and_the_type_steers(models, tmp_path):
    off = _sample(models, tmp_path, "union_tiny.safetensors", strength=0.0)
    auto = _sample(models, tmp_path, "union_tiny.safetensors")
    auto_node = _sample(models, tmp_path, "union_tiny.safetensors", "auto")
    depth = _sample(models, tmp_path, "union_tiny.safetensors", "depth")
    assert all(torch.isfinite(s).all() for s in (auto, depth))
    assert (auto - off).abs().max() > 1e-4
    assert (depth - auto).abs().max() > 1e-4
    torch.testing.assert_close(auto_node, auto, rtol=0, atol=0)  # "auto" = no type set


def test_alimama_apply_on_a_plain_controlnet_equals_apply_advanced(models, tmp_path):
    advanced = _sample(models, tmp_path, "plain_sdxl.safetensors")
    alimama = _sample(models, tmp_path, "plain_sdxl.safetensors", alimama=True)
    off = _sample(models, tmp_path, "plain_sdxl.safetensors", strength=0.0)
    assert (advanced - off).abs().max() > 1e-4
    torch.testing.assert_close(alimama, advanced, rtol=0, atol=0)
    # a union net with a type set through AliMama too (no concat mask: as ControlNetApplyAdvanced)
    torch.testing.assert_close(_sample(models, tmp_path, "union_tiny.safetensors", "depth", alimama=True),
                               _sample(models, tmp_path, "union_tiny.safetensors", "depth"), rtol=0, atol=0)


def test_union_controlnet_under_bf16_returns_f32_close_to_f32(union_file):
    from tests.test_controlnet import FixedPolicy

    handle = load_controlnet(union_file)
    x, t, ctx, y, *_, g = controlnet_inputs("sdxl", batch=2, hw=8)
    hint = torch.rand(2, 3, 64, 64, generator=g)
    with torch.no_grad():
        ref = handle.runner(F32)(x, hint, t, ctx, y, control_type=(1,))
        out = handle.runner(FixedPolicy(torch.bfloat16, torch.bfloat16))(x, hint, t, ctx, y, control_type=(1,))
    for a, b in zip(out, ref):
        assert a.dtype == torch.float32
        assert (a - b).abs().max() < 0.05 * b.abs().max()
