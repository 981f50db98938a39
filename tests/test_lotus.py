"""Lotus: the null-prompt conditioning shipped as data, UNETLoader's detection of a Lotus UNet and
the one-step x0 run of ComfyUI's Lotus depth template (families/sd/lotus.py)."""

from __future__ import annotations

import math

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.sampling.custom_sampling_nodes import (BasicScheduler, KSamplerSelect,
                                                                   SetFirstSigma)
from mixgraph.nodes.declare.conditioning.lotus_nodes import LotusConditioning
from mixgraph.nodes.models import loader
from mixgraph.nodes.families.sd import lotus
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.sampling.ksampler import sample_custom
from mixgraph.nodes.sampling.noise import initial_noise
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_unet
from tests.fixtures.tiny_unet import tiny_unet

F32 = parse_spec("f32")


def test_lotus_null_prompt_embedding_is_comfyuis_tensor():
    emb = lotus.null_prompt_embedding()
    assert emb.shape == (1, 2, 1024) and emb.dtype == torch.float32
    # values as written in ComfyUI's nodes_lotus.py: first, outliers and last of each row
    assert emb[0, 0, :3].tolist() == [-0.3134765625, -0.447509765625, -0.00823974609375]
    assert emb[0, 0, 20].item() == 0.0007929801940917969
    assert emb[0, 0].max().item() == 13.0234375 and emb[0, 0].min().item() == -5.7578125
    assert emb[0, 0, -1].item() == -0.296142578125
    assert emb[0, 1, :2].tolist() == [1.4111328125, 0.00757598876953125]
    assert emb[0, 1, -3:].tolist() == [1.0361328125, -0.67333984375, 1.5009765625]
    emb.zero_()   # a fresh copy each call: callers cannot change the constant
    assert lotus.null_prompt_embedding()[0, 1, -1].item() == 1.5009765625


def test_lotus_conditioning_node_returns_the_null_prompt_only():
    spec = api.default_registry().get("LotusConditioning")
    assert spec.category == "conditioning/lotus" and not spec.inputs
    assert [(o.type, o.name) for o in spec.outputs] == [("CONDITIONING", "conditioning")]
    (conds,) = LotusConditioning()
    assert len(conds) == 1
    assert torch.equal(conds[0].cross_attn, lotus.null_prompt_embedding())
    assert conds[0].pooled is None and conds[0].area is None   # ComfyUI's cond: [[embeds, {}]]


def test_lotus_task_embedding_is_sin_cos_of_the_annotation_task():
    assert lotus.task_embedding() == pytest.approx((math.sin(1.0), 0.0, math.cos(1.0), 1.0), abs=0)


def test_lotus_unet_loader_detects_lotus(tmp_path):
    write_unet(tmp_path / "lotus.safetensors", kind="lotus", seed=3)
    write_unet(tmp_path / "sd2.safetensors", kind="sd2", seed=3)
    m = loader.load_unet(tmp_path / "lotus.safetensors")
    assert (m.kind, m.prediction, m.parts.unclip) == ("sd2", "img_to_img", None)
    assert m.parts.task_embedding == lotus.task_embedding()
    assert m.config.adm_in_channels == 4 and m.config.context_dim == 1024
    plain = loader.load_unet(tmp_path / "sd2.safetensors")   # SD2 without the task input: unchanged
    assert plain.parts is None and plain.prediction != "img_to_img"


def test_lotus_one_step_sample_is_the_unets_x0_at_timestep_999(tmp_path):
    """The template's sampling: DisableNoise, BasicScheduler(normal, 1 step) → SetFirstSigma(999),
    euler, LotusConditioning. One Euler step from σ=999 lands on the x0 prediction, and a Lotus
    x0 prediction is the UNet's output for the unscaled input (img_to_img) with the task input."""
    write_unet(tmp_path / "lotus.safetensors", kind="lotus", seed=5)
    handle = loader.load_unet(tmp_path / "lotus.safetensors")
    sigmas = SetFirstSigma(BasicScheduler(handle, "normal", 1, 1.0)[0], 999.0)[0]
    assert sigmas.tolist() == [999.0, 0.0]
    gen = torch.Generator().manual_seed(0)
    latent = Latent(torch.randn(1, 4, 8, 8, generator=gen))
    out, _ = sample_custom(handle.runner(F32), guidance=Guidance("cfg", (lotus.lotus_conditioning(), ()), (1.0,)),
                           sampler=KSamplerSelect("euler")[0], sigmas=sigmas,
                           noise=initial_noise(latent, 0, False), seed=0, latent=latent)
    scale = handle.latent_format.scale_factor
    unet = tiny_unet("lotus", seed=5)
    y = torch.tensor([lotus.task_embedding()])
    with torch.no_grad():
        expected = unet(latent.samples * scale, torch.tensor([999.0]), lotus.null_prompt_embedding(), y) / scale
        other_task = unet(latent.samples * scale, torch.tensor([999.0]), lotus.null_prompt_embedding(),
                          torch.tensor([[0.0, 0.0, 1.0, 1.0]])) / scale
    assert torch.allclose(out.samples, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(out.samples, other_task, atol=1e-3)   # the task input matters


def test_lotus_unet_loader_refuses_a_diffusers_layout_lotus(tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "lotus_diffusers.safetensors"
    write_unet(path, kind="sd2", layout="diffusers", seed=2)
    sd = load_file(str(path))
    sd["class_embedding.linear_1.weight"] = torch.zeros(256, 4)
    save_file(sd, str(path))
    with pytest.raises(NotImplementedError, match="lotus_diffusers.safetensors.*not supported yet"):
        loader.load_unet(path)
