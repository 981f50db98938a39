"""LoraLoaderBypass / LoraLoaderBypassModelOnly (ComfyUI nodes_lora_debug.py 828798f): the LoRA
applied in the forward pass gives LoraLoader's (merged weights) results within float tolerance,
on a tiny SD1.5 checkpoint, for every adapter kind and layer kind; specs; what stays refused."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.adapters.lora import LoraPatch, load_lora, load_lora_patches
from mixgraph.nodes.adapters.lora_bypass import BypassPatch, bypass_patches
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.fixtures.tiny_lora import CLIP_TARGETS, UNET_TARGETS, lora_file
from tests.fixtures.workflow_models import CLIP, UNET, write_lora

INFO = api.default_registry().object_info()
F32 = parse_spec("f32")
CONV3 = ("input_blocks.1.0.in_layers.2.weight", "input_blocks.2.0.op.weight",
         "output_blocks.1.1.conv.weight", "out.2.weight")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bypass")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    write_lora(root / "loras" / "lora.safetensors", root / "checkpoints" / "sd15.safetensors", seed=5)
    return root


@pytest.fixture(scope="module")
def models(root):
    return loader.load_checkpoint(root / "checkpoints" / "sd15.safetensors")


def _write(root, name, fmt, keys, clip=True, seed=3):
    with safe_open(str(root / "checkpoints" / "sd15.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    modules = {"lora_unet_" + k.removesuffix(".weight").replace(".", "_"): shapes[UNET + k] for k in keys}
    if clip:
        modules |= {"lora_te_" + k.removesuffix(".weight").replace(".", "_"): shapes[CLIP + k] for k in CLIP_TARGETS}
    path = root / "loras" / name
    save_file(lora_file(modules, fmt, rank=4, alpha=2.0, seed=seed), str(path))
    return path


def _bypassed(path, model, clip, sm, sc):
    lora = load_lora(path, model.weight_shapes(), clip.weight_shapes() if clip is not None else None)
    unet, clip_p = bypass_patches(lora, sm, sc, clip is not None)
    return model.with_patches(unet), (clip.with_patches(clip_p) if clip is not None else None)


def _unet_out(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, ctx = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 77, 32, generator=g)
    with torch.no_grad():
        return model.runner(F32).unet(x, torch.tensor([500.0, 20.0]), ctx)


def test_lora_bypass_specs_match_comfyui():
    b = INFO["LoraLoaderBypass"]
    assert b["display_name"] == "Load LoRA (Bypass) (For debugging)" and b["category"] == "model/loaders"
    assert b["experimental"] is True and b["output"] == ["MODEL", "CLIP"]
    assert b["input_order"] == {"required": ["model", "clip", "lora_name", "strength_model", "strength_clip"]}
    req = b["input"]["required"]
    assert req["model"] == ["MODEL", {"tooltip": "The diffusion model the LoRA will be applied to."}]
    assert req["lora_name"][1] == {"tooltip": "The name of the LoRA."}
    tip = "How strongly to modify the CLIP model. This value can be negative."
    assert req["strength_clip"] == ["FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01,
                                              "tooltip": tip}]
    assert b["output_tooltips"] == ["The modified diffusion model.", "The modified CLIP model."]
    assert b["description"].startswith("Apply LoRA in bypass mode. Unlike regular LoRA")
    m = INFO["LoraLoaderBypassModelOnly"]
    assert m["display_name"] == "Load LoRA (Bypass, Model Only) (for debugging)" and m["output"] == ["MODEL"]
    assert m["input_order"] == {"required": ["model", "lora_name", "strength_model"]}
    assert m["input"]["required"]["strength_model"] == ["FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0,
                                                                  "step": 0.01}]
    assert m["experimental"] is True and m["category"] == "model/loaders"


@pytest.mark.parametrize("fmt,keys", [("lora", UNET_TARGETS["sd15"]), ("loha", UNET_TARGETS["sd15"]),
                                      ("lokr", UNET_TARGETS["sd15"]), ("locon_mid", CONV3)])
def test_lora_bypass_unet_matches_merged_lora(root, models, fmt, keys):
    model, clip, _ = models
    path = _write(root, f"unet_{fmt}.safetensors", fmt, keys, clip=False)
    for strength in (1.0, -0.6):
        merged, _ = load_lora_patches(path, model, None, strength, 0.0)
        bypass, _ = _bypassed(path, model, None, strength, 0.0)
        assert all(isinstance(p, BypassPatch) for p in bypass.patches)
        ref, got, base = _unet_out(merged), _unet_out(bypass), _unet_out(model)
        assert not torch.allclose(ref, base, atol=1e-3)  # the LoRA does change the output
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_lora_bypass_leaves_the_shared_weights_and_other_uses_alone(root, models):
    model, clip, _ = models
    path = root / "loras" / "lora.safetensors"
    before = _unet_out(model)
    bypass, _ = _bypassed(path, model, clip, 1.0, 1.0)
    r = bypass.runner(F32)
    plain_sd = model.runner(F32).model.state_dict()
    for k, v in r.model.state_dict().items():  # bypass: the module's weights are the base weights
        assert torch.equal(v, plain_sd[k]), k
    _unet_out(bypass)
    assert torch.equal(_unet_out(model), before)


def test_lora_bypass_clip_matches_merged_lora(root, models):
    model, clip, _ = models
    path = root / "loras" / "lora.safetensors"
    for sc in (1.0, 0.5):
        _, merged = load_lora_patches(path, model, clip, 1.0, sc)
        _, bypass = _bypassed(path, model, clip, 1.0, sc)
        ref, got, base = (c.encode("a red cube", F32) for c in (merged, bypass, clip))
        assert not torch.allclose(ref[0].cross_attn, base[0].cross_attn, atol=1e-4)
        torch.testing.assert_close(got[0].cross_attn, ref[0].cross_attn, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[0].pooled, ref[0].pooled, rtol=1e-4, atol=1e-4)


def test_lora_bypass_merges_full_differences_as_comfyui(root, models):
    """``diff`` / ``diff_b`` tensors are not adapters: ComfyUI patches them into the weights."""
    model, _, _ = models
    path = _write(root, "withdiff.safetensors", "lora", UNET_TARGETS["sd15"][:2], clip=False)
    from safetensors.torch import load_file
    sd = load_file(str(path))
    with safe_open(str(root / "checkpoints" / "sd15.safetensors"), "pt") as f:
        bias = f.get_tensor(UNET + "time_embed.0.bias")
    sd["lora_unet_time_embed_0.diff_b"] = torch.randn(bias.shape, generator=torch.Generator().manual_seed(2))
    save_file(sd, str(path))
    bypass, _ = _bypassed(path, model, None, 0.7, 0.0)
    kinds = sorted(type(p).__name__ for p in bypass.patches)
    assert kinds == ["BypassPatch", "LoraPatch"]
    merged, _ = load_lora_patches(path, model, None, 0.7, 0.0)
    torch.testing.assert_close(_unet_out(bypass), _unet_out(merged), rtol=1e-4, atol=1e-4)


def test_lora_bypass_stacks_with_merged_loras(root, models):
    model, _, _ = models
    a = root / "loras" / "lora.safetensors"
    b = _write(root, "second.safetensors", "lora", UNET_TARGETS["sd15"][:4], clip=False, seed=9)
    merged_a, _ = load_lora_patches(a, model, None, 0.8, 0.0)
    both_merged, _ = load_lora_patches(b, merged_a, None, 1.2, 0.0)
    mixed, _ = _bypassed(b, merged_a, None, 1.2, 0.0)
    two_bypass, _ = _bypassed(b, _bypassed(a, model, None, 0.8, 0.0)[0], None, 1.2, 0.0)
    ref = _unet_out(both_merged)
    torch.testing.assert_close(_unet_out(mixed), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(_unet_out(two_bypass), ref, rtol=1e-4, atol=1e-4)
    assert any(isinstance(p, LoraPatch) for p in mixed.patches)


def test_lora_bypass_cannot_be_merged_into_weights_yet(root, models):
    from mixgraph.nodes.weights import save
    model, clip, _ = models
    bypass, _ = _bypassed(root / "loras" / "lora.safetensors", model, clip, 1.0, 1.0)
    with pytest.raises(NotImplementedError, match="bypass mode.*not supported yet"):
        save.unet_state_dict(bypass, torch.float32)


def _graph(bypass: bool, model_only: bool = False):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    if model_only:
        cls = "LoraLoaderBypassModelOnly" if bypass else "LoraLoaderModelOnly"
        m, c = g.add(cls, model=ck[0], lora_name="lora.safetensors", strength_model=0.9), ck[1]
    else:
        cls = "LoraLoaderBypass" if bypass else "LoraLoader"
        lo = g.add(cls, model=ck[0], clip=ck[1], lora_name="lora.safetensors", strength_model=0.9,
                   strength_clip=0.7)
        m, c = lo[0], lo[1]
    pos = g.add("CLIPTextEncode", text="a red cube", clip=c)
    neg = g.add("CLIPTextEncode", text="blurry", clip=c)
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    ks = g.add("KSampler", model=m, seed=3, steps=3, cfg=5.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return g, ks


@pytest.mark.parametrize("model_only", [False, True])
def test_lora_loader_bypass_workflow_matches_lora_loader(root, model_only):
    outs = []
    for bypass in (False, True):
        g, ks = _graph(bypass, model_only)
        outs.append(api.run(g, models=root, output=root / "out")[ks.node_id][0].samples)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-3, atol=5e-3)


def test_lora_bypass_runs_in_the_layers_compute_dtype(root, models):
    """Under a bf16 policy the LoRA path runs in the layer's output dtype (ComfyUI casts the
    adapter to the layer's dtype): close to the merged LoRA at bf16 precision."""
    model, _, _ = models
    bf16 = parse_spec("bf16")
    path = root / "loras" / "lora.safetensors"
    merged, _ = load_lora_patches(path, model, None, 1.0, 0.0)
    bypass, _ = _bypassed(path, model, None, 1.0, 0.0)
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 77, 32, generator=g)
    with torch.no_grad():
        ref = merged.runner(bf16).unet(x, torch.tensor([300.0]), ctx)
        got = bypass.runner(bf16).unet(x, torch.tensor([300.0]), ctx)
    assert got.dtype == ref.dtype and torch.isfinite(got).all()
    assert (got.float() - ref.float()).abs().max() <= 0.05 * ref.float().abs().max()
