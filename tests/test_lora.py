"""LoRA parsing, key mapping and merging (nodes/adapters/lora.py) on tiny seeded models."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.nodes.weights.diffusers_names import unet_diffusers_module_map
from mixgraph.nodes.adapters.lora import LoraKeyWarning, LoraPatch, apply_patches, load_lora
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict
from tests.fixtures.tiny_lora import (
    CLIP_TARGETS,
    UNET_TARGETS,
    clip_file_names,
    diffusers_unet_names,
    lora_file,
    unet_file_names,
)
from tests.fixtures.tiny_unet import tiny_unet_state_dict

NAMINGS = ("kohya_ldm", "kohya_diffusers", "peft", "diffusers_bare", "generic")


@pytest.fixture(scope="module")
def unets():
    return {k: tiny_unet_state_dict(k) for k in ("sd15", "sdxl")}


@pytest.fixture(scope="module")
def clip_sd():
    return tiny_clip_l_state_dict(seed=1, width=32, layers=3)


def _unet_lora(usd, kind, naming, fmt="lora", keys=None, seed=0, **kw):
    names = unet_file_names(usd, keys or UNET_TARGETS[kind], naming, sdxl=kind == "sdxl")
    return names, lora_file({names[k]: usd[k].shape for k in names}, fmt, seed=seed, **kw)


def _loads_quietly(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoraKeyWarning)
        return load_lora(*args, **kw)


# --------------------------------------------------------------------------------------------
# key mapping


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
def test_unet_diffusers_module_map_matches_diffusers_conversion(unets, kind):
    usd = unets[kind]
    ours = unet_diffusers_module_map(usd)
    theirs = diffusers_unet_names(usd, 1, sdxl=kind == "sdxl")
    assert len(theirs) == len(usd)
    assert ours == theirs


@pytest.mark.parametrize("kind", ["sd15", "sdxl"])
@pytest.mark.parametrize("naming", NAMINGS)
def test_load_lora_maps_each_naming_scheme_to_ldm_keys(unets, kind, naming):
    usd = unets[kind]
    names, lsd = _unet_lora(usd, kind, naming, fmt="peft" if naming == "peft" else "lora")
    lf = _loads_quietly(lsd, usd)
    adapters = lf.adapters["unet"]
    assert sorted(adapters) == sorted(UNET_TARGETS[kind])
    up = ".lora_B.weight" if naming == "peft" else ".lora_up.weight"
    for key, module in names.items():
        assert adapters[key].up is lsd[module + up]
    assert lf.unmatched == ()


def test_load_lora_maps_specific_kohya_and_peft_names(unets):
    usd = unets["sd15"]
    cases = {
        "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q":
            "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight",
        "lora_unet_input_blocks_1_1_proj_in": "input_blocks.1.1.proj_in.weight",
        "lora_unet_mid_block_attentions_0_transformer_blocks_0_attn1_to_out_0":
            "middle_block.1.transformer_blocks.0.attn1.to_out.0.weight",
        "lora_unet_up_blocks_1_attentions_1_transformer_blocks_0_ff_net_0_proj":
            "output_blocks.3.1.transformer_blocks.0.ff.net.0.proj.weight",
        "lora_unet_down_blocks_1_resnets_0_conv_shortcut": "input_blocks.3.0.skip_connection.weight",
        "lora_unet_up_blocks_0_upsamplers_0_conv": "output_blocks.1.1.conv.weight",
        "unet.down_blocks.0.downsamplers.0.conv": "input_blocks.2.0.op.weight",
        "unet.up_blocks.1.resnets.1.time_emb_proj": "output_blocks.3.0.emb_layers.1.weight",
        "lycoris_down_blocks_0_resnets_0_conv1": "input_blocks.1.0.in_layers.2.weight",
    }
    lsd = lora_file({m: usd[k].shape for m, k in cases.items()}, "lora")
    adapters = _loads_quietly(lsd, usd).adapters["unet"]
    for module, key in cases.items():
        assert adapters[key].up is lsd[module + ".lora_up.weight"]


def test_load_lora_maps_old_diffusers_attention_processor_names(unets):
    usd = unets["sd15"]
    base = "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn2.processor."
    g = torch.Generator().manual_seed(3)
    lsd = {
        base + "to_k_lora.up.weight": torch.randn(32, 2, generator=g),
        base + "to_k_lora.down.weight": torch.randn(2, 32, generator=g),
        base + "to_out_lora.up.weight": torch.randn(32, 2, generator=g),
        base + "to_out_lora.down.weight": torch.randn(2, 32, generator=g),
    }
    adapters = _loads_quietly(lsd, usd).adapters["unet"]
    blk = "input_blocks.1.1.transformer_blocks.0.attn2."
    assert adapters[blk + "to_k.weight"].up is lsd[base + "to_k_lora.up.weight"]
    assert adapters[blk + "to_out.0.weight"].down is lsd[base + "to_out_lora.down.weight"]


@pytest.mark.parametrize(
    "naming,target", [("lora_te_", "clip_l"), ("lora_te1_", "clip_l"), ("text_encoder.", "clip_l"),
                      ("lora_te2_", "clip_g"), ("text_encoder_2.", "clip_g"), ("lora_te_", "clip_h")]
)
def test_load_lora_maps_text_encoder_names(clip_sd, naming, target):
    names = clip_file_names(CLIP_TARGETS, naming)
    lsd = lora_file({names[k]: clip_sd[k].shape for k in names}, "lora", seed=4)
    lf = _loads_quietly(lsd, None, {target: clip_sd})
    assert lf.targets == (target,)
    for key, module in names.items():
        assert lf.adapters[target][key].down is lsd[module + ".lora_down.weight"]


# --------------------------------------------------------------------------------------------
# merge formulas


def _lora_delta(lsd, module, shape, up=".lora_up.weight", down=".lora_down.weight"):
    u, d = lsd[module + up], lsd[module + down]
    alpha = lsd[module + ".alpha"].item() if module + ".alpha" in lsd else d.shape[0]
    return (alpha / d.shape[0]), (u.flatten(1) @ d.flatten(1)).reshape(shape)


@pytest.mark.parametrize("naming", ["kohya_ldm", "kohya_diffusers", "peft"])
def test_apply_patches_lora_equals_analytic_merge(unets, naming):
    usd = unets["sd15"]
    fmt = "peft" if naming == "peft" else "lora"
    names, lsd = _unet_lora(usd, "sd15", naming, fmt=fmt, rank=4, alpha=2.0)
    patch = _loads_quietly(lsd, usd).patch("unet", 0.7)
    out = apply_patches(usd, [patch])
    ud = (".lora_B.weight", ".lora_A.weight") if fmt == "peft" else (".lora_up.weight", ".lora_down.weight")
    for key, module in names.items():
        scale, diff = _lora_delta(lsd, module, usd[key].shape, *ud)
        assert scale == (1.0 if fmt == "peft" else 0.5)
        assert torch.equal(out[key], usd[key] + (0.7 * scale) * diff), key
    untouched = "input_blocks.1.1.transformer_blocks.0.attn1.to_k.weight"
    assert out[untouched] is usd[untouched]
    assert all(not torch.equal(out[k], usd[k]) for k in names)


def test_apply_patches_does_not_modify_input(unets):
    usd = unets["sd15"]
    key = UNET_TARGETS["sd15"][1]
    before = usd[key].clone()
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", keys=(key,))
    apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 1.0)])
    assert torch.equal(usd[key], before)


def test_apply_patches_locon_tucker_mid(unets):
    usd = unets["sd15"]
    key = "input_blocks.1.0.in_layers.2.weight"  # [32, 32, 3, 3]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="locon_mid", keys=(key,), rank=3, alpha=1.5)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 0.8)])
    up, mid, down = (lsd[m + s].flatten(1) if s != ".lora_mid.weight" else lsd[m + s]
                     for s in (".lora_up.weight", ".lora_mid.weight", ".lora_down.weight"))
    ref = torch.empty(usd[key].shape)
    for h in range(3):
        for w in range(3):
            ref[:, :, h, w] = up @ mid[:, :, h, w] @ down
    torch.testing.assert_close(out[key], usd[key] + 0.8 * (1.5 / 3) * ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", ["input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
                                 "input_blocks.1.0.in_layers.2.weight"])
def test_apply_patches_loha_hadamard_product(unets, key):
    usd = unets["sd15"]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="loha", keys=(key,), rank=4, alpha=3.0)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 1.0)])
    w1 = lsd[m + ".hada_w1_a"] @ lsd[m + ".hada_w1_b"]
    w2 = lsd[m + ".hada_w2_a"] @ lsd[m + ".hada_w2_b"]
    ref = (w1 * w2).reshape(usd[key].shape) * (3.0 / 4)
    torch.testing.assert_close(out[key], usd[key] + ref, rtol=0, atol=1e-5)


def test_apply_patches_loha_tucker(unets):
    usd = unets["sd15"]
    key = "input_blocks.1.0.in_layers.2.weight"
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="loha_tucker", keys=(key,), rank=2, alpha=None)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 1.0)])

    def tucker(t, a, b):  # a: [r, out] (LyCORIS Tucker mode), b: [r, in]
        r = torch.empty(a.shape[1], b.shape[1], *t.shape[2:])
        for h in range(t.shape[2]):
            for w in range(t.shape[3]):
                r[:, :, h, w] = a.T @ t[:, :, h, w] @ b
        return r

    ref = tucker(lsd[m + ".hada_t1"], lsd[m + ".hada_w1_a"], lsd[m + ".hada_w1_b"]) * tucker(
        lsd[m + ".hada_t2"], lsd[m + ".hada_w2_a"], lsd[m + ".hada_w2_b"])
    torch.testing.assert_close(out[key], usd[key] + ref, rtol=0, atol=1e-5)


def _kron_blocks(w1, w2):
    """Kronecker product by explicit blocks: block (a, b) = w1[a, b] * w2 (w2 2-D or 4-D)."""
    o2, i2 = w2.shape[:2]
    out = torch.empty(w1.shape[0] * o2, w1.shape[1] * i2, *w2.shape[2:])
    for a in range(w1.shape[0]):
        for b in range(w1.shape[1]):
            out[a * o2:(a + 1) * o2, b * i2:(b + 1) * i2] = w1[a, b] * w2
    return out


@pytest.mark.parametrize("key", ["input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight",
                                 "input_blocks.1.0.in_layers.2.weight"])
def test_apply_patches_lokr_whole_factors(unets, key):
    usd = unets["sd15"]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="lokr", keys=(key,), alpha=5.0)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 0.5)])
    ref = _kron_blocks(lsd[m + ".lokr_w1"], lsd[m + ".lokr_w2"])  # neither factorized: scale 1
    torch.testing.assert_close(out[key], usd[key] + 0.5 * ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", ["input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight",
                                 "input_blocks.1.0.in_layers.2.weight"])
def test_apply_patches_lokr_factorized_w2(unets, key):
    usd = unets["sd15"]
    shape = usd[key].shape
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="lokr_factorized", keys=(key,), rank=3, alpha=6.0)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 1.0)])
    w2 = (lsd[m + ".lokr_w2_a"] @ lsd[m + ".lokr_w2_b"]).reshape(shape[0] // 2, shape[1] // 2, *shape[2:])
    ref = _kron_blocks(lsd[m + ".lokr_w1"], w2) * (6.0 / 3)
    torch.testing.assert_close(out[key], usd[key] + ref, rtol=0, atol=1e-5)


def test_apply_patches_lokr_tucker_w2(unets):
    usd = unets["sd15"]
    key = "input_blocks.1.0.in_layers.2.weight"  # [32, 32, 3, 3]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", fmt="lokr_tucker", keys=(key,), rank=3, alpha=1.5)
    m = names[key]
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 1.0)])
    a, b, t = lsd[m + ".lokr_w2_a"], lsd[m + ".lokr_w2_b"], lsd[m + ".lokr_t2"]
    w2 = torch.empty(a.shape[1], b.shape[1], 3, 3)
    for h in range(3):
        for w in range(3):
            w2[:, :, h, w] = a.T @ t[:, :, h, w] @ b
    ref = _kron_blocks(lsd[m + ".lokr_w1"], w2) * (1.5 / 3)
    torch.testing.assert_close(out[key], usd[key] + ref, rtol=0, atol=1e-5)


def test_apply_patches_full_diff_weight_and_bias(unets):
    usd = unets["sd15"]
    g = torch.Generator().manual_seed(5)
    k = "input_blocks.1.1.proj_out"
    lsd = {"lora_unet_input_blocks_1_1_proj_out.diff": torch.randn(usd[k + ".weight"].shape, generator=g),
           "lora_unet_input_blocks_1_1_proj_out.diff_b": torch.randn(usd[k + ".bias"].shape, generator=g)}
    out = apply_patches(usd, [_loads_quietly(lsd, usd).patch("unet", 0.25)])
    assert torch.equal(out[k + ".weight"], usd[k + ".weight"] + 0.25 * lsd["lora_unet_input_blocks_1_1_proj_out.diff"])
    assert torch.equal(out[k + ".bias"], usd[k + ".bias"] + 0.25 * lsd["lora_unet_input_blocks_1_1_proj_out.diff_b"])


def test_apply_patches_keeps_bf16_storage_and_merges_in_f32(unets):
    usd = unets["sd15"]
    bf = {k: v.to(torch.bfloat16) for k, v in usd.items()}
    key = "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", keys=(key,), alpha=2.0)
    out = apply_patches(bf, [_loads_quietly(lsd, bf).patch("unet", 0.3)])
    assert out[key].dtype == torch.bfloat16
    scale, diff = _lora_delta(lsd, names[key], usd[key].shape)
    expected = (bf[key].float() + (0.3 * scale) * diff).to(torch.bfloat16)
    assert torch.equal(out[key], expected)
    # merging in bf16 would round the product first: a different result
    in_bf16 = bf[key] + ((0.3 * scale) * diff).to(torch.bfloat16)
    assert not torch.equal(out[key], in_bf16)


def test_apply_patches_stacks_two_loras_in_order(unets):
    usd = unets["sd15"]
    key = UNET_TARGETS["sd15"][1]
    n1, l1 = _unet_lora(usd, "sd15", "kohya_ldm", keys=(key,), seed=1, alpha=2.0)
    n2, l2 = _unet_lora(usd, "sd15", "peft", fmt="peft", keys=(key,), seed=2)
    p1 = _loads_quietly(l1, usd).patch("unet", 0.6)
    p2 = _loads_quietly(l2, usd).patch("unet", -1.2)
    out = apply_patches(usd, [p1, p2])
    s1, d1 = _lora_delta(l1, n1[key], usd[key].shape)
    s2, d2 = _lora_delta(l2, n2[key], usd[key].shape, ".lora_B.weight", ".lora_A.weight")
    assert torch.equal(out[key], usd[key] + (0.6 * s1) * d1 + (-1.2 * s2) * d2)
    assert torch.equal(apply_patches(usd, [p1, p1.lora.patch("unet", 0.0)])[key], usd[key] + (0.6 * s1) * d1)


def test_lora_patches_apply_unet_and_clip_strengths_separately(unets, clip_sd):
    usd = unets["sd15"]
    ukey = UNET_TARGETS["sd15"][0]
    ckey = CLIP_TARGETS[0]
    un, lsd = _unet_lora(usd, "sd15", "kohya_ldm", keys=(ukey,), seed=1)
    cn = clip_file_names((ckey,), "lora_te_")
    lsd.update(lora_file({cn[ckey]: clip_sd[ckey].shape}, "lora", seed=2))
    lf = _loads_quietly(lsd, usd, {"clip_l": clip_sd})
    unet_p, clip_p = lf.patches(0.5, 1.5)
    assert [(p.target, p.strength) for p in unet_p + clip_p] == [("unet", 0.5), ("clip_l", 1.5)]
    out_u = apply_patches(usd, unet_p + clip_p, target="unet")
    out_c = apply_patches(clip_sd, unet_p + clip_p, target="clip_l")
    su, du = _lora_delta(lsd, un[ukey], usd[ukey].shape)
    sc, dc = _lora_delta(lsd, cn[ckey], clip_sd[ckey].shape)
    assert torch.equal(out_u[ukey], usd[ukey] + (0.5 * su) * du)
    assert torch.equal(out_c[ckey], clip_sd[ckey] + (1.5 * sc) * dc)
    assert lf.patches(0.0, 1.0)[0] == () and lf.patches(1.0, 0.0)[1] == ()


def test_lora_sdxl_text_encoders_go_to_clip_l_and_clip_g(clip_sd):
    g_sd = tiny_clip_l_state_dict(seed=2, width=32, layers=3)
    k = CLIP_TARGETS[2]
    n1, n2 = clip_file_names((k,), "lora_te1_"), clip_file_names((k,), "lora_te2_")
    lsd = {**lora_file({n1[k]: clip_sd[k].shape}, "lora", seed=1), **lora_file({n2[k]: g_sd[k].shape}, "lora", seed=2)}
    lf = _loads_quietly(lsd, None, {"clip_l": clip_sd, "clip_g": g_sd})
    assert lf.adapters["clip_l"][k].up is lsd[n1[k] + ".lora_up.weight"]
    assert lf.adapters["clip_g"][k].up is lsd[n2[k] + ".lora_up.weight"]


# --------------------------------------------------------------------------------------------
# reporting and errors


def test_load_lora_warns_once_with_count_of_unmatched_keys(unets):
    usd = unets["sd15"]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm")
    bogus = lora_file({f"lora_unet_no_such_block_{i}": (8, 8) for i in range(3)}, "lora")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lf = load_lora({**lsd, **bogus}, usd)
    lora_warnings = [w for w in caught if issubclass(w.category, LoraKeyWarning)]
    assert len(lora_warnings) == 1
    assert "3 keys" in str(lora_warnings[0].message)
    assert "lora_unet_no_such_block_0" in str(lora_warnings[0].message)
    assert len(lf.unmatched) == 3 and len(lf.adapters["unet"]) == len(names)


def test_load_lora_model_only_skips_text_encoder_keys_silently(unets, clip_sd):
    usd = unets["sd15"]
    _, lsd = _unet_lora(usd, "sd15", "kohya_ldm")
    cn = clip_file_names(CLIP_TARGETS, "lora_te_")
    lsd.update(lora_file({cn[k]: clip_sd[k].shape for k in CLIP_TARGETS}, "lora"))
    lf = _loads_quietly(lsd, usd, None)
    assert len(lf.skipped) == len(CLIP_TARGETS) and lf.unmatched == ()


def test_load_lora_rejects_sdxl_lora_on_sd1_model(unets):
    _, lsd = _unet_lora(unets["sdxl"], "sdxl", "kohya_ldm")
    with pytest.raises(ValueError, match=r"'xl_style\.safetensors'.*cross-attention context 64"):
        load_lora(lsd, unets["sd15"], name="xl_style.safetensors")


def test_load_lora_rejects_lora_matching_nothing(unets):
    keys = ("middle_block.1.transformer_blocks.1.ff.net.2.weight", "input_blocks.3.1.proj_in.weight")
    _, lsd = _unet_lora(unets["sdxl"], "sdxl", "kohya_ldm", keys=keys)
    with pytest.raises(ValueError, match=r"'other\.safetensors' matches no weight"):
        load_lora(lsd, unets["sd15"], name="other.safetensors")


def test_apply_patches_rejects_shape_mismatch_when_loaded_by_keys_only(unets):
    key = "output_blocks.2.0.in_layers.2.weight"  # exists in both, other shape
    _, lsd = _unet_lora(unets["sdxl"], "sdxl", "kohya_ldm", keys=(key,))
    lf = _loads_quietly(lsd, list(unets["sd15"]), name="xl.safetensors")
    with pytest.raises(ValueError, match=r"'xl\.safetensors'.*output_blocks\.2\.0\.in_layers\.2\.weight"):
        apply_patches(unets["sd15"], [lf.patch("unet", 1.0)])


def test_load_lora_dora_alone_is_not_supported_yet(unets):
    """DoRA on LoRA/LoHa/LoKr merges (tests/test_lora_dora.py); a dora_scale with no factors
    to decompose is refused."""
    usd = unets["sd15"]
    key = UNET_TARGETS["sd15"][1]
    names, lsd = _unet_lora(usd, "sd15", "kohya_ldm", keys=(key,))
    lsd = {names[key] + ".dora_scale": torch.ones(usd[key].shape[0], 1)}
    with pytest.raises(NotImplementedError, match="DoRA"):
        load_lora(lsd, usd)


def test_load_lora_from_file_has_stable_hashable_identity(unets, tmp_path):
    usd = unets["sd15"]
    _, lsd = _unet_lora(usd, "sd15", "kohya_ldm")
    path = tmp_path / "style.safetensors"
    save_file(lsd, str(path))
    a = _loads_quietly(path, usd)
    b = _loads_quietly(str(path), usd)
    assert a.name == "style.safetensors"
    assert a == b and hash(LoraPatch(a, 1.0, "unet")) == hash(LoraPatch(b, 1.0, "unet"))
    assert a.patch("unet", 1.0) == b.patch("unet", 1.0) != b.patch("unet", 0.5)
    c = _loads_quietly(lsd, usd)
    d = _loads_quietly(dict(lsd), usd)
    assert c == d  # in-memory dicts: content hash
    merged = apply_patches(usd, [a.patch("unet", 1.0)])
    assert torch.equal(merged[UNET_TARGETS["sd15"][0]], apply_patches(usd, [c.patch("unet", 1.0)])[UNET_TARGETS["sd15"][0]])


# --------------------------------------------------------------------------------------------
# through the handles and the weight store


@dataclass(frozen=True)
class _F32:
    storage: torch.dtype = torch.float32
    compute: torch.dtype = torch.float32
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


def test_lora_patches_merge_at_materialization_of_model_and_clip_handles(tmp_path):
    from mixgraph.nodes.models.loader import load_checkpoint
    from tests.fixtures.checkpoints import write_sd15

    model, clip, _ = load_checkpoint(write_sd15(tmp_path / "tiny.safetensors", seed=7))
    unet_shapes, clip_shapes = model.weight_shapes(), clip.weight_shapes()
    ukey, ckey = UNET_TARGETS["sd15"][1], CLIP_TARGETS[1]
    un = {ukey: "lora_unet_" + ukey[: -len(".weight")].replace(".", "_")}
    cn = clip_file_names((ckey,), "lora_te_")
    lsd = {**lora_file({un[ukey]: unet_shapes[ukey]}, "lora", seed=1),
           **lora_file({cn[ckey]: clip_shapes["clip_l"][ckey]}, "lora", seed=2)}
    lf = _loads_quietly(lsd, unet_shapes, clip_shapes, name="tiny_lora.safetensors")
    unet_p, clip_p = lf.patches(0.5, 2.0)

    base = model.runner(_F32()).model.state_dict()
    patched = model.with_patches(unet_p).runner(_F32()).model.state_dict()
    su, du = _lora_delta(lsd, un[ukey], unet_shapes[ukey])
    assert torch.equal(patched[ukey], base[ukey] + (0.5 * su) * du)
    other = UNET_TARGETS["sd15"][0]
    assert torch.equal(patched[other], base[other])

    from mixgraph.nodes.weights import store
    from mixgraph.nodes.encoders.clip import CLIPTextModel

    def clip_sd(handle):
        clip_l = handle.encoder("clip_l")
        return store.materialize("clip_l", clip_l.source, clip_l.config, torch.float32,
                                 tuple(p for p in handle.patches if p.target == "clip_l"), CLIPTextModel).state_dict()

    sc, dc = _lora_delta(lsd, cn[ckey], clip_shapes["clip_l"][ckey])
    assert torch.equal(clip_sd(clip.with_patches(clip_p))[ckey], clip_sd(clip)[ckey] + (2.0 * sc) * dc)
