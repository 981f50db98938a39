"""Model merging and saving nodes: specs as ComfyUI's, hand-computed merge values, save → reload
round trips in ComfyUI's key layouts, and end-to-end runs on tiny generated checkpoints."""

import json
import warnings

import pytest
import torch
from safetensors import safe_open

from mixgraph.nodes.models import loader
from mixgraph.nodes.weights import save, store
from mixgraph.nodes.adapters.lora import apply_patches
from mixgraph.nodes.weights.merge import ADD, SIMPLE, SUBTRACT, MergePatch, MergeWarning, strengths
from mixgraph.ui import api

INFO = api.default_registry().object_info()
RATIO = ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}]
MULT = ["FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01}]


def _req(name):
    return INFO[name]["input"]["required"]


def test_merge_node_specs_match_comfyui():
    for name, first in {"ModelMergeSimple": "model", "CLIPMergeSimple": "clip"}.items():
        assert INFO[name]["input_order"]["required"] == [f"{first}1", f"{first}2", "ratio"]
        assert _req(name)["ratio"] == RATIO
    for name, first in {"ModelMergeSubtract": "model", "CLIPMergeSubtract": "clip"}.items():
        assert INFO[name]["input_order"]["required"] == [f"{first}1", f"{first}2", "multiplier"]
        assert _req(name)["multiplier"] == MULT
    assert INFO["ModelMergeAdd"]["input_order"]["required"] == ["model1", "model2"]
    assert INFO["CLIPMergeAdd"]["input_order"]["required"] == ["clip1", "clip2"]
    assert INFO["ModelMergeBlocks"]["input_order"]["required"] == ["model1", "model2", "input", "middle", "out"]
    for name in ("ModelMergeSimple", "ModelMergeBlocks", "ModelMergeSubtract", "ModelMergeAdd"):
        assert INFO[name]["output"] == ["MODEL"] and INFO[name]["category"] == "advanced/model_merging"
    for name in ("CLIPMergeSimple", "CLIPMergeSubtract", "CLIPMergeAdd"):
        assert INFO[name]["output"] == ["CLIP"] and INFO[name]["category"] == "advanced/model_merging"
    sd1 = (["model1", "model2", "time_embed.", "label_emb."] + [f"input_blocks.{i}." for i in range(12)]
           + [f"middle_block.{i}." for i in range(3)] + [f"output_blocks.{i}." for i in range(12)] + ["out."])
    sdxl = (["model1", "model2", "time_embed.", "label_emb."] + [f"input_blocks.{i}" for i in range(9)]
            + [f"middle_block.{i}" for i in range(3)] + [f"output_blocks.{i}" for i in range(9)] + ["out."])
    for name, order in {"ModelMergeSD1": sd1, "ModelMergeSD2": sd1, "ModelMergeSDXL": sdxl}.items():
        assert INFO[name]["input_order"]["required"] == order
        assert all(_req(name)[k] == RATIO for k in order[2:])
        assert INFO[name]["category"] == "advanced/model_merging/model_specific"


def test_save_node_specs_match_comfyui():
    hidden = {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}
    for name, inputs, prefix in (("CheckpointSave", ["model", "clip", "vae"], "checkpoints/ComfyUI"),
                                 ("ModelSave", ["model"], "diffusion_models/ComfyUI"),
                                 ("CLIPSave", ["clip"], "clip/ComfyUI"),
                                 ("VAESave", ["vae"], "vae/ComfyUI_vae")):
        assert INFO[name]["input_order"]["required"] == inputs + ["filename_prefix"]
        assert _req(name)["filename_prefix"] == ["STRING", {"default": prefix}]
        assert INFO[name]["input"]["hidden"] == hidden
        assert INFO[name]["output"] == [] and INFO[name]["output_node"] is True
        assert INFO[name]["category"] == "advanced/model_merging"
    assert INFO["CheckpointSave"]["display_name"] == "Save Checkpoint"


# --- merge values by hand ------------------------------------------------------------------------

W1 = {"a.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "only1": torch.tensor([9.0])}
W2 = {"a.weight": torch.tensor([[5.0, 6.0], [7.0, 8.0]]), "only2": torch.tensor([1.0])}


def _merge(mode, value, prefixed=(), w1=W1, w2=W2, skip=()):
    p = MergePatch("unet", "src2", "cfg", (), strengths(mode, value),
                   tuple((k, *strengths(mode, r)) for k, r in prefixed), skip)
    return apply_patches(w1, (p,), target="unet", others={p: w2})


def test_merge_simple_ratio_is_model1_share():
    out = _merge(SIMPLE, 0.25)
    assert torch.equal(out["a.weight"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))  # .25·W1 + .75·W2
    assert torch.equal(out["only1"], W1["only1"]) and "only2" not in out  # keys only in one model
    assert torch.equal(_merge(SIMPLE, 1.0)["a.weight"], W1["a.weight"])
    assert torch.equal(_merge(SIMPLE, 0.0)["a.weight"], W2["a.weight"])


def test_merge_subtract_and_add_hand_values():
    assert torch.equal(_merge(SUBTRACT, 2.0)["a.weight"], torch.full((2, 2), -8.0))  # 2·(W1 − W2)
    assert torch.equal(_merge(SUBTRACT, -0.5)["a.weight"], torch.full((2, 2), 2.0))
    assert torch.equal(_merge(ADD, 0.0)["a.weight"], torch.tensor([[6.0, 8.0], [10.0, 12.0]]))


def test_merge_blocks_longest_prefix_wins_and_default_applies():
    w1 = {k: torch.zeros(1) for k in ("input_blocks.1.0.w", "input_blocks.10.0.w", "middle_block.0.w", "label.w")}
    w2 = {k: torch.ones(1) for k in w1}
    # SDXL-style names without the trailing dot: "input_blocks.1" is also a prefix of
    # "input_blocks.10...", where the longer "input_blocks.10" must win
    out = _merge(SIMPLE, 0.9, (("input_blocks.1", 0.25), ("input_blocks.10", 0.75), ("middle", 0.5)), w1, w2)
    assert out["input_blocks.1.0.w"].item() == pytest.approx(0.75)
    assert out["input_blocks.10.0.w"].item() == pytest.approx(0.25)
    assert out["middle_block.0.w"].item() == pytest.approx(0.5)
    assert out["label.w"].item() == pytest.approx(0.1)  # the default ratio 0.9


def test_merge_shape_mismatch_scales_and_warns_and_skip_suffixes():
    w1 = {"x": torch.ones(2), "y.position_ids": torch.ones(2)}
    w2 = {"x": torch.ones(3), "y.position_ids": torch.zeros(2)}
    with pytest.warns(MergeWarning, match="1 weights have other shapes"):
        out = _merge(SIMPLE, 0.5, (), w1, w2, skip=(".position_ids",))
    assert torch.equal(out["x"], torch.full((2,), 0.5))  # ComfyUI: scaled by strength_model, not merged
    assert torch.equal(out["y.position_ids"], w1["y.position_ids"])


def test_merge_in_f32_then_one_cast():
    w1 = {"k": torch.tensor([1.0, 1.0], dtype=torch.float16)}
    w2 = {"k": torch.tensor([1.0 + 2 ** -10, 3.0], dtype=torch.float16)}
    out = _merge(SIMPLE, 0.5, (), w1, w2)["k"]
    assert out.dtype == torch.float16
    assert torch.equal(out, ((w1["k"].float() + w2["k"].float()) / 2).half())


# --- on tiny checkpoints -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15, write_sdxl
    root = tmp_path_factory.mktemp("merge_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "a.safetensors", seed=3)
    write_sd15(root / "checkpoints" / "b.safetensors", seed=11)
    write_sdxl(root / "checkpoints" / "xl.safetensors", seed=5, v_pred=True)
    return root


def _unet(model):
    return save.unet_state_dict(model, torch.float32)


def test_merged_handle_blends_unet_and_clip_and_leaves_sources_alone(models):
    m1, c1, _ = loader.load_checkpoint(models / "checkpoints" / "a.safetensors")
    m2, c2, _ = loader.load_checkpoint(models / "checkpoints" / "b.safetensors")
    from mixgraph.nodes.weights.merge import merge_clip, merge_model
    merged = merge_model(m1, m2, SIMPLE, 0.3)
    a, b, m = _unet(m1), _unet(m2), _unet(merged)
    for k in a:
        assert torch.allclose(m[k], 0.3 * a[k] + 0.7 * b[k], atol=1e-6), k
    assert torch.equal(_unet(m1)["out.2.weight"], a["out.2.weight"])  # model1's own weights untouched
    cm = save.clip_state_dicts(merge_clip(c1, c2, SUBTRACT, 2.0), torch.float32)["clip_l"]
    ca, cb = (save.clip_state_dicts(c, torch.float32)["clip_l"] for c in (c1, c2))
    for k in ca:
        assert torch.allclose(cm[k], 2.0 * (ca[k] - cb[k]), atol=1e-5), k


def _txt2img(g, model, clip, vae):
    pos = g.add("CLIPTextEncode", text="a red cube", clip=clip)
    neg = g.add("CLIPTextEncode", text="", clip=clip)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=model, seed=7, steps=2, cfg=4.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    return g.add("VAEDecode", samples=ks, vae=vae)


def test_checkpoint_save_round_trip_equals_merged_model(models, tmp_path):
    g = api.Graph(precision="f32")
    a = g.add("CheckpointLoaderSimple", ckpt_name="a.safetensors")
    b = g.add("CheckpointLoaderSimple", ckpt_name="b.safetensors")
    ratios = {k: 1.0 for k in INFO["ModelMergeSD1"]["input_order"]["required"][2:]}
    ratios.update({"input_blocks.1.": 0.2, "out.": 0.6, "time_embed.": 0.5})
    m = g.add("ModelMergeSD1", model1=a[0], model2=b[0], **ratios)
    m = g.add("ModelMergeSimple", model1=m, model2=b[0], ratio=0.8)
    c = g.add("CLIPMergeSimple", clip1=a[1], clip2=b[1], ratio=0.4)
    g.add("CheckpointSave", model=m, clip=c, vae=a[2], filename_prefix="checkpoints/merged")
    img = _txt2img(g, m, c, a[2])
    g.add("PreviewImage", images=img)
    out = api.run(g, models=models, output=tmp_path)
    path = tmp_path / "checkpoints" / "merged_00001_.safetensors"
    assert path.is_file()
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
    assert any(k.startswith("model.diffusion_model.input_blocks.") for k in keys)
    assert any(k.startswith("first_stage_model.decoder.") for k in keys)
    assert any(k.startswith("cond_stage_model.transformer.text_model.encoder.") for k in keys)
    assert meta["modelspec.predict_key"] == "epsilon" and "modelspec.architecture" not in meta
    assert "prompt" in meta

    merged_model = out[m.node_id][0]
    m2, c2, v2 = loader.load_checkpoint(path)
    saved, want = _unet(m2), _unet(merged_model)
    assert saved.keys() == want.keys()
    for k in want:
        assert torch.allclose(saved[k], want[k], atol=1e-6), k
    want_c = save.clip_state_dicts(out[c.node_id][0], torch.float32)["clip_l"]
    got_c = save.clip_state_dicts(c2, torch.float32)["clip_l"]
    assert all(torch.allclose(got_c[k], want_c[k], atol=1e-6) for k in want_c)

    # the reloaded checkpoint gives the same image as the merged model
    (models / "checkpoints" / "reloaded.safetensors").write_bytes(path.read_bytes())
    g2 = api.Graph(precision="f32")
    r = g2.add("CheckpointLoaderSimple", ckpt_name="reloaded.safetensors")
    img2 = _txt2img(g2, r[0], r[1], r[2])
    g2.add("PreviewImage", images=img2)
    out2 = api.run(g2, models=models, output=tmp_path)
    assert torch.allclose(out2[img2.node_id][0], out[img.node_id][0], atol=1e-5)


def test_sdxl_checkpoint_save_keeps_layout_markers_and_lora_merged_weights(models, tmp_path):
    m, c, v = loader.load_checkpoint(models / "checkpoints" / "xl.safetensors")
    assert m.prediction == "v_prediction"
    sd = save.checkpoint_state_dict(m, c, v)
    assert "v_pred" in sd
    assert any(k.startswith("conditioner.embedders.0.transformer.text_model.") for k in sd)
    assert "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight" in sd
    assert "conditioner.embedders.1.model.text_projection" in sd
    meta = save.checkpoint_metadata(m, "x 1")
    assert meta["modelspec.architecture"] == "stable-diffusion-xl-v1-base"
    assert meta["modelspec.predict_key"] == "v" and meta["modelspec.implementation"] == "sgm"
    path = tmp_path / "xl.safetensors"
    save.write_safetensors(path, sd, meta)
    m2, c2, v2 = loader.load_checkpoint(path)
    assert m2.kind == "sdxl" and m2.prediction == "v_prediction"
    for name in ("clip_l", "clip_g"):
        a = save.clip_state_dicts(c, torch.float32)[name]
        b = save.clip_state_dicts(c2, torch.float32)[name]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    va, vb = save.vae_state_dict(v, torch.float32), save.vae_state_dict(v2, torch.float32)
    assert all(torch.equal(va[k], vb[k]) for k in va)


def test_clip_vae_model_save_nodes_write_loadable_files(models, tmp_path):
    g = api.Graph(precision="f32")
    a = g.add("CheckpointLoaderSimple", ckpt_name="xl.safetensors")
    g.add("CLIPSave", clip=a[1], filename_prefix="clip/xl")
    g.add("VAESave", vae=a[2], filename_prefix="vae/ComfyUI_vae")
    g.add("ModelSave", model=a[0], filename_prefix="diffusion_models/ComfyUI")
    g.add("VAESave", vae=a[2], filename_prefix="vae/ComfyUI_vae")
    api.run(g, models=models, output=tmp_path)
    clip_l = tmp_path / "clip" / "xl_clip_l_00001_.safetensors"
    clip_g = tmp_path / "clip" / "xl_clip_g_00001_.safetensors"
    assert clip_l.is_file() and clip_g.is_file()
    with safe_open(str(clip_g), "pt") as f:
        assert f.metadata()["format"] == "pt"
        assert all(k.startswith(("text_model.", "text_projection")) for k in f.keys())
    c = loader.load_clip([clip_l, clip_g], type="sdxl")
    m0, c0, v0 = loader.load_checkpoint(models / "checkpoints" / "xl.safetensors")
    for name in ("clip_l", "clip_g"):
        a_, b_ = (save.clip_state_dicts(x, torch.float32)[name] for x in (c0, c))
        assert all(torch.equal(a_[k], b_[k]) for k in a_)
    vaes = sorted((tmp_path / "vae").glob("ComfyUI_vae_*_.safetensors"))
    assert [p.name for p in vaes] == ["ComfyUI_vae_00001_.safetensors", "ComfyUI_vae_00002_.safetensors"]
    v = loader.load_vae(vaes[0])
    assert all(torch.equal(a_, save.vae_state_dict(v, torch.float32)[k])
               for k, a_ in save.vae_state_dict(v0, torch.float32).items())
    unet = tmp_path / "diffusion_models" / "ComfyUI_00001_.safetensors"
    with safe_open(str(unet), "pt") as f:
        assert all(k.startswith("model.diffusion_model.") or k in ("v_pred",) for k in f.keys())
        assert json.loads(f.metadata()["prompt"])  # the API prompt
    u = loader.load_unet(unet)
    assert u.prediction == "v_prediction"
    assert all(torch.equal(t, _unet(m0)[k]) for k, t in _unet(u).items())


def test_merge_of_lora_patched_model_uses_its_patched_weights(models):
    from mixgraph.nodes.adapters.lora import ScalePatch
    from mixgraph.nodes.weights.merge import merge_model
    m1, _, _ = loader.load_checkpoint(models / "checkpoints" / "a.safetensors")
    m2, _, _ = loader.load_checkpoint(models / "checkpoints" / "b.safetensors")
    scaled = m2.with_patches((ScalePatch("unet", ((".weight", 2.0),)),))
    merged = _unet(merge_model(m1, scaled, ADD))
    a, b = _unet(m1), _unet(m2)
    k = "input_blocks.0.0.weight"
    assert torch.allclose(merged[k], a[k] + 2.0 * b[k], atol=1e-6)
    assert store.stats().patched >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merge_model(m1, m2, SIMPLE, 0.5)  # building the handle reads nothing


# --- LoRA extraction -----------------------------------------------------------------------------

def test_lora_save_spec_matches_comfyui():
    spec = INFO["LoraSave"]
    assert spec["input_order"]["required"] == ["filename_prefix", "rank", "lora_type", "bias_diff"]
    assert spec["input_order"]["optional"] == ["model_diff", "text_encoder_diff"]
    req = spec["input"]["required"]
    assert req["filename_prefix"] == ["STRING", {"default": "loras/ComfyUI_extracted_lora"}]
    assert req["rank"] == ["INT", {"default": 8, "min": 1, "max": 4096, "step": 1}]
    assert req["lora_type"][0] == ["standard", "full_diff"]
    assert req["bias_diff"] == ["BOOLEAN", {"default": True}]
    assert spec["input"]["optional"] == {"model_diff": ["MODEL"], "text_encoder_diff": ["CLIP"]}
    assert spec["output"] == [] and spec["output_node"] is True and spec["category"] == "_for_testing"


def test_extract_lora_quantile_shapes_and_low_rank_exactness():
    from mixgraph.nodes.adapters.lora_extract import quantile, extract_lora, lora_from_diff
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    assert torch.allclose(quantile(x, 0.99), torch.quantile(x, 0.99))
    # a rank-2 difference: the rank-2 SVD is exact; clamping only trims the top 1% of factor values
    diff = torch.randn(16, 2, generator=g) @ torch.randn(2, 12, generator=g)
    up, down = extract_lora(diff, 8)
    assert up.shape == (16, 8) and down.shape == (8, 12)  # rank kept at min(rank, out, in)
    # ComfyUI's formula: factors U_r·diag(S_r) and Vh_r, both clamped to ±quantile_0.99(joined)
    u, sv, vh = torch.linalg.svd(diff)
    ref_up, ref_down = u[:, :8] * sv[:8], vh[:8]
    hi = torch.quantile(torch.cat([ref_up.flatten(), ref_down.flatten()]), 0.99)
    assert torch.allclose(up, ref_up.clamp(-hi, hi), atol=1e-5)
    assert torch.allclose(down, ref_down.clamp(-hi, hi), atol=1e-5)
    assert float((up @ down - diff).norm() / diff.norm()) < 0.2
    up4, down4 = extract_lora(torch.randn(6, 3, 3, 3, generator=g), 4)  # ComfyUI: r = min(4, in 3, out 6)
    assert up4.shape == (6, 3, 1, 1) and down4.shape == (3, 3, 3, 3)
    sd = {"a.weight": diff, "a.bias": torch.ones(16), "n.weight": torch.ones(3)}
    std = lora_from_diff(sd, 4, "standard", True, "diffusion_model.")
    assert set(std) == {"diffusion_model.a.lora_up.weight", "diffusion_model.a.lora_down.weight",
                        "diffusion_model.a.diff_b", "diffusion_model.n.diff"}
    assert all(t.dtype == torch.float16 for t in std.values())
    assert set(lora_from_diff(sd, 4, "standard", False, "")) == {"a.lora_up.weight", "a.lora_down.weight"}
    assert set(lora_from_diff(sd, 4, "full_diff", False, "")) == {"a.diff", "n.diff"}


def test_lora_save_full_diff_round_trip_restores_the_finetune(models, tmp_path):
    g = api.Graph(precision="f32")
    a = g.add("CheckpointLoaderSimple", ckpt_name="a.safetensors")
    b = g.add("CheckpointLoaderSimple", ckpt_name="b.safetensors")
    dm = g.add("ModelMergeSubtract", model1=b[0], model2=a[0], multiplier=1.0)
    dc = g.add("CLIPMergeSubtract", clip1=b[1], clip2=a[1], multiplier=1.0)
    g.add("LoraSave", filename_prefix="loras/full", rank=8, lora_type="full_diff", bias_diff=True,
          model_diff=dm, text_encoder_diff=dc)
    g.add("LoraSave", filename_prefix="loras/std", rank=4, lora_type="standard", bias_diff=True, model_diff=dm)
    api.run(g, models=models, output=tmp_path)
    full = tmp_path / "loras" / "full_00001_.safetensors"
    std = tmp_path / "loras" / "std_00001_.safetensors"
    with safe_open(str(std), "pt") as f:
        keys = list(f.keys())
    assert "diffusion_model.input_blocks.1.1.proj_in.lora_up.weight" in keys
    assert all(k.startswith("diffusion_model.") for k in keys)

    from mixgraph.nodes.adapters.lora import load_lora_patches
    m_a, c_a, _ = loader.load_checkpoint(models / "checkpoints" / "a.safetensors")
    m_b, c_b, _ = loader.load_checkpoint(models / "checkpoints" / "b.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key of the extracted LoRA matches the model
        m, c = load_lora_patches(full, m_a, c_a, 1.0, 1.0)
    got, want = _unet(m), _unet(m_b)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=2e-3, rtol=2e-3), k
    got_c = save.clip_state_dicts(c, torch.float32)["clip_l"]
    want_c = save.clip_state_dicts(c_b, torch.float32)["clip_l"]
    for k in want_c:
        assert torch.allclose(got_c[k], want_c[k], atol=2e-3, rtol=2e-3), k
    m_std, _ = load_lora_patches(std, m_a, None, 1.0, 0.0)
    k = "input_blocks.1.1.proj_in.weight"
    base = _unet(m_a)[k]
    assert not torch.equal(_unet(m_std)[k], base)  # the standard LoRA moves the weight


@pytest.mark.parametrize("kind", ["sd2", "sdxl_refiner"])
def test_openclip_checkpoints_save_in_openclip_layout_and_reload(kind, tmp_path):
    from tests.fixtures.checkpoints import write_sd2, write_sdxl_refiner
    src = tmp_path / "src.safetensors"
    (write_sd2(src, v_prediction=True, seed=1) if kind == "sd2" else write_sdxl_refiner(src, seed=1))
    m, c, v = loader.load_checkpoint(src)
    sd = save.checkpoint_state_dict(m, c, v)
    prefix = "cond_stage_model.model." if kind == "sd2" else "conditioner.embedders.0.model."
    assert prefix + "transformer.resblocks.0.attn.in_proj_weight" in sd
    assert prefix + "positional_embedding" in sd and prefix + "ln_final.weight" in sd
    assert ("v_pred" in sd) == (kind == "sd2")
    out = tmp_path / "out.safetensors"
    save.write_safetensors(out, sd, save.checkpoint_metadata(m, "t"))
    m2, c2, v2 = loader.load_checkpoint(out)
    assert (m2.kind, m2.prediction) == (m.kind, m.prediction)
    for enc in c.names:
        a, b = (save.clip_state_dicts(x, torch.float32)[enc] for x in (c, c2))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), enc
