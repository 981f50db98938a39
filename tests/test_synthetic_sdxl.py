"""The seeded SDXL base checkpoint writer (nodes.weights.synthetic): the streamed file holds the
in-memory state dict's tensors, mixgraph's loader reads it as SDXL with the configs it was built
from, and the full-size shapes are SDXL base's (counted on meta shapes; no full-size file is
written in tests)."""

import math

import pytest
import torch
from safetensors.torch import load_file

from mixgraph.graph.env import Env
from mixgraph.nodes.weights import synthetic
from mixgraph.nodes.models.loader import load_checkpoint
from mixgraph.ui import api
from mixgraph.ui.estimate import estimate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_sdxl_checkpoint_streams_the_in_memory_tensors(tmp_path, dtype):
    path = synthetic.write_sdxl_checkpoint(tmp_path / "xl.safetensors", "tiny", seed=5, dtype=dtype)
    written, expected = load_file(str(path)), synthetic.sdxl_checkpoint("tiny", seed=5, dtype=dtype)
    assert written.keys() == expected.keys()
    for key, value in expected.items():
        assert written[key].dtype == dtype and torch.equal(written[key], value), key
    assert not list(tmp_path.glob("*.partial"))
    other = synthetic.sdxl_checkpoint("tiny", seed=6, dtype=dtype)
    key = "model.diffusion_model.out.2.weight"
    assert not torch.equal(other[key], expected[key])


def test_write_sdxl_checkpoint_loads_as_sdxl_with_its_sizes(tmp_path):
    path = synthetic.write_sdxl_checkpoint(tmp_path / "xl.safetensors", "tiny")
    model, clip, vae = load_checkpoint(path)
    assert model.kind == "sdxl" and model.config == synthetic.TINY_SDXL_UNET
    assert model.latent_format.scale_factor == pytest.approx(0.13025)
    assert clip.kind == "sdxl"
    assert clip.encoder("clip_l").config == synthetic.TINY_SDXL_CLIP_L
    assert clip.encoder("clip_g").config == synthetic.TINY_SDXL_CLIP_G
    assert vae.config == synthetic.TINY_VAE
    sd = load_file(str(path))
    g = "conditioner.embedders.1.model."
    assert sd[g + "transformer.resblocks.0.attn.in_proj_weight"].shape == (96, 32)
    assert sd[g + "text_projection"].shape == (32, 32)
    assert "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight" in sd


def test_sdxl_full_shapes_are_sdxl_base():
    counts = {prefix: sum(math.prod(s) for s in shapes.values())
              for prefix, shapes, _ in synthetic.sdxl_parts("full", 0)}
    assert counts["model.diffusion_model."] == 2_567_463_684          # SDXL base UNet
    assert counts["conditioner.embedders.1.model."] == 694_659_840    # OpenCLIP ViT-bigG text
    assert counts["conditioner.embedders.0.transformer."] == pytest.approx(123.06e6, rel=1e-3)
    assert counts["first_stage_model."] == pytest.approx(83.65e6, rel=1e-3)
    with pytest.raises(ValueError, match="size must be"):
        synthetic.sdxl_checkpoint("medium")


def test_estimate_counts_both_sdxl_text_encoders(tmp_path):
    path = synthetic.write_sdxl_checkpoint(tmp_path / "models" / "checkpoints" / "xl.safetensors", "tiny")
    wf = api.set_inputs(api.load("workflows/txt2img_sd15.json"),
                        {"4.ckpt_name": "xl.safetensors", "5.width": 64, "5.height": 64, "3.steps": 1})
    est = estimate(wf, api.default_registry(), Env.from_args(models=str(tmp_path / "models")), "f32")
    # every tensor but the two token tables, which stay lazily paged views of an f32 file
    held = sum(t.numel() * t.element_size() for k, t in load_file(str(path)).items()
               if not k.endswith("token_embedding.weight"))
    assert est["weights_bytes"] == pytest.approx(held, rel=0.01)
    assert est["nodes"]["6"]["weights_bytes"] > 0 and est["nodes"]["6"]["policy"] == {"CLIP": "f32"}


def test_store_nbytes_counts_views_of_one_buffer_each_and_tied_tensors_once():
    from mixgraph.nodes.weights.store import nbytes

    fused = torch.zeros(3 * 8, 8)                       # OpenCLIP in_proj, split into q/k/v views
    q, k, v = fused.chunk(3, dim=0)
    assert nbytes({"q": q, "k": k, "v": v}) == fused.numel() * 4
    assert nbytes({"a": q, "tied": q}) == q.numel() * 4


def test_estimate_drops_what_the_weight_store_evicts(tmp_path):
    from mixgraph.nodes.weights import store

    synthetic.write_sdxl_checkpoint(tmp_path / "models" / "checkpoints" / "xl.safetensors", "tiny")
    wf = api.set_inputs(api.load("workflows/txt2img_sd15.json"),
                        {"4.ckpt_name": "xl.safetensors", "5.width": 64, "5.height": 64, "3.steps": 1})
    reg, env = api.default_registry(), Env.from_args(models=str(tmp_path / "models"))
    roomy = estimate(wf, reg, env, "f32")
    clip, unet = roomy["nodes"]["6"]["weights_bytes"], roomy["nodes"]["3"]["weights_bytes"]
    assert roomy["nodes"]["3"]["resident_bytes"] == clip + unet
    old = store.STORE.budget_bytes
    try:
        store.configure(unet + 1)          # the UNet's load evicts both text encoders
        tight = estimate(wf, reg, env, "f32")
    finally:
        store.configure(old)
    assert tight["nodes"]["3"]["resident_bytes"] == unet
    assert tight["nodes"]["3"]["peak_bytes"] == roomy["nodes"]["3"]["peak_bytes"] - clip
    assert tight["weights_bytes"] == roomy["weights_bytes"]     # loaded all the same
