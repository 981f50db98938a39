"""DoRA (``dora_scale``) in LoRA / LoHa / LoKr files: the merged weight follows ComfyUI's
``weight_decompose`` (comfy/weight_adapter/base.py 9c0cf36), checked against a reference written
out here channel by channel; strength 0 keeps the weights; LoraLoader runs it end to end; bypass
mode refuses it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.nodes.adapters.lora import apply_patches, load_lora
from mixgraph.nodes.adapters.lora_bypass import bypass_patches
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_lora import UNET_TARGETS, lora_file, unet_file_names
from tests.fixtures.tiny_unet import tiny_unet_state_dict

LINEAR = "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"
CONV3 = "input_blocks.1.0.in_layers.2.weight"
EPS = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def usd():
    return tiny_unet_state_dict("sd15")


def _files(usd, key, fmt, dora, seed=0):
    """(LoRA file without DoRA, same file with ``dora`` as the module's dora_scale)."""
    names = unet_file_names(usd, (key,), "kohya_ldm")
    plain = lora_file({names[key]: usd[key].shape}, fmt, rank=4, alpha=2.0, seed=seed)
    return plain, plain | {names[key] + ".dora_scale": dora}


def _delta(usd, plain, key):
    """scale · ΔW of the plain adapter, from the (DoRA-free) merge at strength 1."""
    return apply_patches(usd, [load_lora(plain, usd).patch("unet", 1.0)])[key] - usd[key]


def _reference(w, delta, m, strength, on_output):
    """ComfyUI's weight_decompose written out one channel at a time."""
    calc = w + delta
    out = calc.clone()
    if on_output:  # per output row, with the norm of the weight before the patch
        for o in range(w.shape[0]):
            out[o] = calc[o] * (m.flatten()[o] / (w[o].norm() + EPS))
    else:  # per input channel, norm over the output rows and kernel taps of W + ΔW
        for i in range(w.shape[1]):
            out[:, i] = calc[:, i] * (m.flatten()[i] / (calc[:, i].norm() + EPS))
    return w + strength * (out - w)


@pytest.mark.parametrize("key", [LINEAR, CONV3])
@pytest.mark.parametrize("fmt", ["lora", "loha", "lokr"])
@pytest.mark.parametrize("strength", [1.0, 0.6])
def test_dora_merge_per_input_channel_matches_formula(usd, key, fmt, strength):
    w = usd[key]
    m = torch.rand((1, w.shape[1]) + (1,) * (w.ndim - 2), generator=torch.Generator().manual_seed(1)) + 0.5
    plain, dora = _files(usd, key, fmt, m)
    got = apply_patches(usd, [load_lora(dora, usd).patch("unet", strength)])[key]
    ref = _reference(w, _delta(usd, plain, key), m, strength, on_output=False)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, w + strength * _delta(usd, plain, key), atol=1e-3)


@pytest.mark.parametrize("key", [LINEAR, CONV3])
def test_dora_merge_on_output_axis_uses_unpatched_norm(usd, key):
    w = usd[key]
    m = torch.rand((w.shape[0],) + (1,) * (w.ndim - 1), generator=torch.Generator().manual_seed(2)) + 0.5
    plain, dora = _files(usd, key, "lora", m)
    got = apply_patches(usd, [load_lora(dora, usd).patch("unet", 0.8)])[key]
    ref = _reference(w, _delta(usd, plain, key), m, 0.8, on_output=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_dora_with_magnitude_of_merged_weight_gives_plain_merge(usd):
    """m = the per-input-channel norms of W + ΔW: DoRA's rescale is the identity."""
    plain, _ = _files(usd, CONV3, "lora", None)
    merged = usd[CONV3] + _delta(usd, plain, CONV3)
    m = merged.transpose(0, 1).flatten(1).norm(dim=1).reshape(1, -1, 1, 1)
    _, dora = _files(usd, CONV3, "lora", m)
    got = apply_patches(usd, [load_lora(dora, usd).patch("unet", 1.0)])[CONV3]
    torch.testing.assert_close(got, merged, rtol=1e-5, atol=1e-5)


def test_dora_strength_zero_keeps_weights(usd):
    m = torch.rand(1, usd[LINEAR].shape[1]) + 0.5
    _, dora = _files(usd, LINEAR, "lora", m)
    lf = load_lora(dora, usd)
    out = apply_patches(usd, [lf.patch("unet", 0.0)])
    assert torch.equal(out[LINEAR], usd[LINEAR])
    assert not torch.equal(apply_patches(usd, [lf.patch("unet", 1e-3)])[LINEAR], usd[LINEAR])


def test_dora_scale_of_wrong_size_is_rejected(usd):
    _, dora = _files(usd, LINEAR, "lora", torch.ones(1, usd[LINEAR].shape[1] + 3))
    with pytest.raises(ValueError, match=r"'bad\.safetensors' does not fit.*dora_scale"):
        load_lora(dora, usd, name="bad.safetensors")


def test_dora_on_full_difference_is_not_supported_yet(usd):
    names = unet_file_names(usd, (LINEAR,), "kohya_ldm")
    sd = {names[LINEAR] + ".diff": torch.zeros_like(usd[LINEAR]),
          names[LINEAR] + ".dora_scale": torch.ones(1, usd[LINEAR].shape[1])}
    with pytest.raises(NotImplementedError, match="DoRA.*not supported yet"):
        load_lora(sd, usd)


def test_dora_in_bypass_mode_is_not_supported_yet(usd):
    _, dora = _files(usd, LINEAR, "lora", torch.ones(1, usd[LINEAR].shape[1]))
    with pytest.raises(NotImplementedError, match=r"DoRA in bypass mode.*not supported yet"):
        bypass_patches(load_lora(dora, usd, name="d.safetensors"), 1.0, 0.0, False)


# --------------------------------------------------------------------------------------------
# end to end: LoraLoader in a workflow


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("dora")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    unet = tiny_unet_state_dict("sd15", 1)
    keys = UNET_TARGETS["sd15"][:6]
    names = unet_file_names(unet, keys, "kohya_ldm")
    plain = lora_file({names[k]: unet[k].shape for k in keys}, "lora", rank=4, alpha=2.0, seed=5)
    gen = torch.Generator().manual_seed(3)
    dora = plain | {names[k] + ".dora_scale": torch.rand((1, unet[k].shape[1]) + (1,) * (unet[k].ndim - 2),
                                                         generator=gen) + 0.5 for k in keys}
    (root / "loras").mkdir()
    save_file(plain, str(root / "loras" / "plain.safetensors"))
    save_file(dora, str(root / "loras" / "dora.safetensors"))
    return root


def _sample(root, lora):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    m, c = ck[0], ck[1]
    if lora:
        lo = g.add("LoraLoader", model=m, clip=c, lora_name=lora, strength_model=0.9, strength_clip=1.0)
        m, c = lo[0], lo[1]
    pos = g.add("CLIPTextEncode", text="a red cube", clip=c)
    neg = g.add("CLIPTextEncode", text="blurry", clip=c)
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    ks = g.add("KSampler", model=m, seed=3, steps=2, cfg=5.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return api.run(g, models=root, output=root / "out")[ks.node_id][0].samples


def test_dora_lora_loader_workflow_changes_output(root):
    base, plain, dora = _sample(root, None), _sample(root, "plain.safetensors"), _sample(root, "dora.safetensors")
    assert torch.isfinite(dora).all()
    assert (dora - base).abs().max() > 1e-3
    assert (dora - plain).abs().max() > 1e-3
