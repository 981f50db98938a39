"""ControlLoRA (Stability's control-lora files): the net is built on the sampled model's UNet
(``nodes.adapters.control_lora``)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.adapters.control_lora import ControlLoraHandle, ControlLoraRunner
from mixgraph.nodes.adapters.controlnet import convert_controlnet_state_dict
from mixgraph.nodes.models.loader import load_checkpoint, load_controlnet
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sdxl
from tests.fixtures.tiny_lora import tiny_controlnet_state_dict

F32 = parse_spec("f32")
RANK = 2
# LoRA'd layers: convs (4-D weights) and linears (a transformer's q projection, a time-embedding layer)
LORA_LAYERS = ("input_blocks.0.0", "input_blocks.1.0.in_layers.2",
               "input_blocks.3.1.transformer_blocks.0.attn1.to_q", "input_blocks.1.0.emb_layers.1")


def _control_lora_file(path, seed: int = 7):
    """The real key layout: the ``lora_controlnet`` marker, full tensors for the ControlNet-only
    parts (hint block, zero convs, middle_block_out), up/down pairs for some encoder layers."""
    full = {k[len("control_model."):]: v for k, v in tiny_controlnet_state_dict("sdxl", seed).items()}
    g = torch.Generator().manual_seed(seed + 1)
    sd = {k: v.contiguous() for k, v in full.items()
          if k.startswith(("input_hint_block.", "zero_convs.", "middle_block_out."))}
    for layer in LORA_LAYERS:
        w = full[layer + ".weight"]
        sd[layer + ".up"] = torch.randn(w.shape[0], RANK, 1, 1, generator=g) * 0.1 if w.ndim == 4 else \
            torch.randn(w.shape[0], RANK, generator=g) * 0.1
        rest = w.shape[1:]
        sd[layer + ".down"] = torch.randn(RANK, *rest, generator=g) * 0.1
    sd["lora_controlnet"] = torch.zeros(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path))
    return sd


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("control_lora")
    write_sdxl(root / "checkpoints" / "sdxl_tiny.safetensors", seed=0)
    sd = _control_lora_file(root / "controlnet" / "control-lora-tiny.safetensors")
    return root, sd


def test_load_controlnet_detects_control_lora_by_its_marker(models):
    root, _ = models
    handle = load_controlnet(root / "controlnet" / "control-lora-tiny.safetensors")
    assert isinstance(handle, ControlLoraHandle)
    runner = handle.runner(F32)
    with pytest.raises(RuntimeError, match="not bound to a model"):
        runner(torch.zeros(1))
    with pytest.raises(ValueError, match="ControlLoRA"):
        convert_controlnet_state_dict({"lora_controlnet": torch.zeros(1), "zero_convs.0.0.weight": torch.zeros(1)})


def test_control_lora_weights_are_base_plus_up_down_and_the_files_full_tensors(models):
    root, sd = models
    model, _, _ = load_checkpoint(root / "checkpoints" / "sdxl_tiny.safetensors")
    unet = model.runner(F32)
    handle = load_controlnet(root / "controlnet" / "control-lora-tiny.safetensors")
    net = ControlLoraRunner(handle, None).bind_model(unet)
    got = net.state_dict()
    base = {k: v.float() for k, v in unet.model.state_dict().items()}
    for layer in LORA_LAYERS:
        w = base[layer + ".weight"]
        want = w + (sd[layer + ".up"].flatten(1) @ sd[layer + ".down"].flatten(1)).reshape(w.shape)
        torch.testing.assert_close(got[layer + ".weight"], want, rtol=1e-5, atol=1e-6)
        assert (got[layer + ".weight"] - w).abs().max() > 1e-4
    for k in ("input_hint_block.0.weight", "zero_convs.1.0.weight", "middle_block_out.0.bias"):
        torch.testing.assert_close(got[k], sd[k], rtol=0, atol=0)
    # a key neither LoRA'd nor in the file: the base model's weight
    torch.testing.assert_close(got["middle_block.0.in_layers.2.weight"], base["middle_block.0.in_layers.2.weight"],
                               rtol=0, atol=0)
    # cached per base model: the same model gives the same module, another seed another net
    assert ControlLoraRunner(handle, None).bind_model(unet) is net
    write_sdxl(root / "checkpoints" / "sdxl_other.safetensors", seed=5)
    other, _, _ = load_checkpoint(root / "checkpoints" / "sdxl_other.safetensors")
    net2 = ControlLoraRunner(handle, None).bind_model(other.runner(F32))
    assert (net2.state_dict()["middle_block.0.in_layers.2.weight"] - got["middle_block.0.in_layers.2.weight"]).abs().max() > 0


def _sample(root, tmp_path, strength: float):
    from PIL import Image

    (tmp_path / "in").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 30, 90)).save(tmp_path / "in" / "hint.png")
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sdxl_tiny.safetensors")
    cn = g.add("ControlNetLoader", control_net_name="control-lora-tiny.safetensors")
    pos = g.add("CLIPTextEncode", text="a road", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    image = g.add("LoadImage", image="hint.png")
    ap = g.add("ControlNetApplyAdvanced", positive=pos, negative=neg, control_net=cn, image=image[0],
               strength=strength, start_percent=0.0, end_percent=1.0)
    ks = g.add("KSampler", model=ck[0], seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=ap[0], negative=ap[1],
               latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    out = api.run(g, models=root, input=tmp_path / "in", output=tmp_path / "out")
    return out[ks.node_id][0].samples


def test_control_lora_samples_through_apply_advanced_and_changes_the_output(models, tmp_path):
    root, _ = models
    off = _sample(root, tmp_path, 0.0)
    on = _sample(root, tmp_path, 1.0)
    assert torch.isfinite(on).all()
    assert (on - off).abs().max() > 1e-4
