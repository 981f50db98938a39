"""ModelPatchLoader (SUPIR format) and SUPIRApply (ComfyUI comfy_extras/nodes_model_patch.py):
ComfyUI's specs, loading a tiny SUPIR file sized from its shapes, formats of other model
families refused by name, the strength ramp, restore_cfg, and a tiny SDXL sampling with it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.report import NodeError
from mixgraph.nodes.adapters.supir import (SIGMA_MAX, ModelPatchError, RestoreCFG, ZeroSFT, control_scale,
                                           load_model_patch)
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs
from mixgraph.ui import api
from tests.fixtures.tiny_supir import write_tiny_supir


def test_model_patch_loader_and_supir_apply_specs_match_comfyui():
    info = api.default_registry().object_info()
    loader, apply = info["ModelPatchLoader"], info["SUPIRApply"]
    assert list(loader["input"]["required"]) == ["name"]
    assert isinstance(loader["input"]["required"]["name"][0], list)
    assert loader["output"] == ["MODEL_PATCH"] and loader["output_name"] == ["MODEL_PATCH"]
    assert loader["category"] == "model/loaders" and loader["display_name"] == "Load Model Patch"
    assert loader["experimental"] is True
    req = apply["input"]["required"]
    assert list(req) == ["model", "model_patch", "vae", "image", "strength_start", "strength_end", "restore_cfg",
                         "restore_cfg_s_tmin"]
    assert req["model_patch"] == ["MODEL_PATCH"]
    assert req["strength_start"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01,
                                               "tooltip": "Control strength at the start of sampling (high sigma)."}]
    assert req["strength_end"][1]["tooltip"] == ("Control strength at the end of sampling (low sigma). Linearly "
                                                 "interpolated from start.")
    assert {k: req["restore_cfg"][1][k] for k in ("default", "min", "max", "step", "advanced")} == {
        "default": 4.0, "min": 0.0, "max": 20.0, "step": 0.1, "advanced": True}
    assert {k: req["restore_cfg_s_tmin"][1][k] for k in ("default", "min", "max", "step", "advanced")} == {
        "default": 0.05, "min": 0.0, "max": 1.0, "step": 0.01, "advanced": True}
    assert apply["output"] == ["MODEL"] and apply["category"] == "model/patch/supir"
    assert apply["display_name"] == "Apply SUPIR Patch" and apply["experimental"] is True


def test_supir_loader_sizes_from_shapes_and_remaps_prefixes(tmp_path):
    prefixed = load_model_patch(write_tiny_supir(tmp_path / "a.safetensors", seed=4))
    bare = load_model_patch(write_tiny_supir(tmp_path / "b.safetensors", seed=4, prefixed=False,
                                             denoise_encoder=False))
    m = prefixed.model
    assert m.control_model.config.model_channels == 64 and m.control_model.config.adm_in_channels == 1568
    kinds = [type(p).__name__ for p in m.project_modules]
    assert kinds == ["ZeroSFT", "ZeroSFT", "ZeroCrossAttn", "ZeroSFT", "ZeroSFT", "ZeroSFT"]
    assert m.project_modules[4].zero_mul.out_channels == 256 and m.project_modules[4].pre_concat
    assert not m.project_modules[5].pre_concat  # the middle block's adapter concatenates nothing
    assert prefixed.denoise_encoder and "conv_in.weight" in prefixed.denoise_encoder
    assert bare.denoise_encoder == {}
    a, b = prefixed.model.state_dict(), bare.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("key,name", [
    ("controlnet_blocks.0.y_rms.weight", "Qwen-Image DiffSynth ControlNet"),
    ("control_all_x_embedder.2-1.weight", "Z-Image Fun ControlNet"),
    ("controlnet_patch_embedding.weight", "Wan Uni3C ControlNet"),
    ("feature_embedder.mid_layer_norm.bias", "Flux USO style projector"),
    ("lllite_conditioning1.conv1.weight", "Anima LLLite"),
    ("audio_proj.proj1.weight", "Wan MultiTalk"),
    ("model.duration_head.attention_pooler.query_tokens", "LTX duration head"),
])
def test_model_patch_loader_refuses_other_families_by_name(tmp_path, key, name):
    path = tmp_path / "other.safetensors"
    save_file({key: torch.zeros(2)}, str(path))
    with pytest.raises(ModelPatchError) as e:
        load_model_patch(path)
    assert str(e.value) == (f"other.safetensors: model patch format {name}: model family not supported "
                            f"(mixgraph runs SD 1.x, SD 2.x and SDXL)")
    save_file({"foo.weight": torch.zeros(2)}, str(path))
    with pytest.raises(ModelPatchError, match="not a model patch format mixgraph knows"):
        load_model_patch(path)


def test_supir_control_scale_ramps_over_sigma():
    assert control_scale(2.0, 0.5, 2 * SIGMA_MAX) == 2.0
    assert control_scale(2.0, 0.5, SIGMA_MAX / 2) == pytest.approx(1.25)
    assert control_scale(2.0, 0.5, 0.0) == 0.5
    assert control_scale(2.0, 0.5, None) == 0.5
    assert control_scale(0.7, 0.7, 3.0) == 0.7


def test_zero_sft_scale_zero_is_its_comfyui_start_point():
    torch.manual_seed(0)
    c, h, h_ori = torch.randn(1, 8, 4, 4), torch.randn(1, 32, 4, 4), torch.randn(1, 32, 4, 4)
    cat = ZeroSFT(8, 32, 32, 16)
    assert torch.equal(cat(c, h, h_ori, scale=0.0), torch.cat([h_ori, h], dim=1))
    mid = ZeroSFT(8, 32, 0, 16)
    # ComfyUI adds the conv in place before blending, so the blend starts at h + zero_conv(c)
    assert torch.allclose(mid(c, h, scale=0.0), h + mid.zero_conv(c), atol=1e-6)
    assert not torch.allclose(mid(c, h, scale=1.0), h + mid.zero_conv(c), atol=1e-3)


def _args(sigma):
    z = torch.zeros(2, 1, 1, 1)
    return GuidanceArgs(x=z, sigma=torch.tensor(sigma), cond_scale=1.0, cond_denoised=z, uncond_denoised=z,
                        evaluate=lambda patches: z)


def test_restore_cfg_pulls_towards_the_input_latent():
    p = RestoreCFG(torch.full((1, 1, 1, 1), 0.5), restore_cfg=2.0, s_tmin=0.05)
    denoised = torch.full((2, 1, 1, 1), 2.0)
    out = p.post(_args([SIGMA_MAX / 2, SIGMA_MAX]), denoised)
    # 2 - (2 - 0.5)·(1/2)² = 1.625; 2 - (2 - 0.5)·1² = 0.5
    assert out.flatten().tolist() == pytest.approx([1.625, 0.5])
    assert torch.equal(p.post(_args([0.04, 3.0]), denoised), denoised)  # the first sigma ≤ s_tmin


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15, write_sdxl
    root = tmp_path_factory.mktemp("supir_models")
    (root / "checkpoints").mkdir()
    (root / "model_patches").mkdir()
    write_sdxl(root / "checkpoints" / "xl.safetensors", seed=3)
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=3)
    write_tiny_supir(root / "model_patches" / "supir.safetensors", seed=5)
    write_tiny_supir(root / "model_patches" / "supir_plain.safetensors", seed=5, denoise_encoder=False)
    return root


def _graph(patched=True, start=1.0, end=1.0, restore=0.0, ckpt="xl.safetensors", patch="supir.safetensors"):
    g = api.Graph(precision="f32")
    ck = g.add("CheckpointLoaderSimple", ckpt_name=ckpt)
    img = g.add("EmptyImage", width=64, height=64, batch_size=1, color=0x8040C0)
    mp = g.add("ModelPatchLoader", name=patch)
    sup = g.add("SUPIRApply", model=ck[0], model_patch=mp, vae=ck[2], image=img, strength_start=start,
                strength_end=end, restore_cfg=restore, restore_cfg_s_tmin=0.05)
    pos = g.add("CLIPTextEncode", text="a hill", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    ks = g.add("KSampler", model=sup if patched else ck[0], seed=2, steps=3, cfg=2.0, sampler_name="euler",
               scheduler="normal", positive=pos, negative=neg,
               latent_image=g.add("EmptyLatentImage", width=64, height=64, batch_size=1), denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ck[2]))
    return g, sup, ks


def _samples(models, tmp_path, **kw):
    g, sup, ks = _graph(**kw)
    out = api.run(g, models=models, output=tmp_path)
    return out[ks.node_id][0].samples, out.outputs.get(sup.node_id, (None,))[0]


def test_supir_apply_samples_and_changes_the_result(models, tmp_path):
    plain, _ = _samples(models, tmp_path, patched=False)
    on, handle = _samples(models, tmp_path)
    assert torch.isfinite(on).all() and not torch.allclose(on, plain, atol=1e-3)
    ramp, _ = _samples(models, tmp_path, start=2.0, end=0.5)
    assert torch.isfinite(ramp).all() and not torch.allclose(ramp, on, atol=1e-3)
    restored, _ = _samples(models, tmp_path, restore=4.0)
    assert torch.isfinite(restored).all() and not torch.allclose(restored, on, atol=1e-3)
    # the denoise encoder replaces the VAE encoder for the hint
    _, no_denoise = _samples(models, tmp_path, patch="supir_plain.safetensors")
    (hint_a,), (hint_b,) = ([p.hint for p in h.unet_patches] for h in (handle, no_denoise))
    assert hint_a.shape == (1, 4, 8, 8) and not torch.allclose(hint_a, hint_b, atol=1e-4)


def test_supir_apply_strength_zero_is_the_unpatched_result(models, tmp_path):
    plain, _ = _samples(models, tmp_path, patched=False)
    zero, _ = _samples(models, tmp_path, start=0.0, end=0.0)
    assert torch.equal(zero, plain)


def test_supir_apply_refuses_a_non_sdxl_model(models, tmp_path):
    g, _, _ = _graph(ckpt="sd15.safetensors")
    with pytest.raises(NodeError, match="SUPIR is an SDXL model patch"):
        api.run(g, models=models, output=tmp_path)
