"""LoRAs for the DiT families in the names people share them in (diffusers / PEFT / ai-toolkit,
OneTrainer, LyCORIS, kohya, ComfyUI), applied with LoraLoaderModelOnly through ``mixgraph.ui.api``.

The reference is computed independently of the LoRA mapper: each LoRA is made over the diffusers
model's own Linear weights, the patched weight W + strength · (alpha / rank) · B @ A is computed
by hand in the diffusers layout, and that state dict is converted to the model's layout by the
family's weight converter (the one its diffusers files load through, checked against diffusers'
models in the family tests). The mapper's slices of fused weights (q / k / v of one qkv, a single
block's MLP input) must land exactly where that conversion puts them.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.ui import api

RANK = 2
STRENGTH = 0.7


def _peft_lora(diff_sd: dict, prefix: str, seed: int, every: int = 1) -> tuple[dict, dict]:
    """(LoRA state dict, expected diffusers state dict) over every ``every``-th 2-D Linear weight:
    ``<prefix><module>.lora_A.weight`` [r, in], ``.lora_B.weight`` [out, r], an ``.alpha`` on
    every other module (ai-toolkit writes one; PEFT's default is alpha = rank)."""
    g = torch.Generator().manual_seed(seed)
    lora, want = {}, dict(diff_sd)
    linears = [k for k, v in diff_sd.items() if k.endswith(".weight") and v.ndim == 2 and "pad_token" not in k]
    for i, key in enumerate(linears[::every]):
        module = key[: -len(".weight")]
        out_f, in_f = diff_sd[key].shape
        a, b = torch.randn(RANK, in_f, generator=g) * 0.3, torch.randn(out_f, RANK, generator=g) * 0.3
        lora[f"{prefix}{module}.lora_A.weight"], lora[f"{prefix}{module}.lora_B.weight"] = a, b
        alpha = float(RANK)
        if i % 2:
            alpha = 1.0
            lora[f"{prefix}{module}.alpha"] = torch.tensor(alpha)
        want[key] = diff_sd[key] + STRENGTH * (alpha / RANK) * (b @ a)
    return lora, want


def _patched(root, unet: str, lora: dict, strength: float = STRENGTH, node: str = "LoraLoaderModelOnly"):
    """(base MODEL, patched MODEL) of a workflow UNETLoader -> ``node``, and the patched weights."""
    (root / "loras").mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lora.items()}, str(root / "loras" / "dit_lora.safetensors"))
    g = api.Graph()
    base = g.add("UNETLoader", unet_name=unet, weight_dtype="default")
    patched = g.add(node, model=base.out, lora_name="dit_lora.safetensors", strength_model=strength)
    g.add("PreviewAny", source=patched.out)  # an output node, so the loaders run
    res = api.run(g, models=root, output=root / "out")
    return res[base.node_id][0], res[patched.node_id][0]


def _weights(handle) -> dict:
    return {k: v.detach() for k, v in handle.runner(parse_spec("f32")).model.state_dict().items()}


def _assert_weights(got: dict, want: dict, base: dict) -> None:
    assert set(got) == set(want)
    changed = 0
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-5), k
        changed += not torch.equal(want[k], base[k])
    assert changed > 0


# ---------------------------------------------------------------------------------------------
# Flux.1


@pytest.fixture(scope="module")
def flux_root(tmp_path_factory):
    from tests.flux_fixtures import write_flux_models

    root = tmp_path_factory.mktemp("flux_lora")
    write_flux_models(root)
    return root


@pytest.fixture(scope="module")
def flux_diffusers(flux_root):
    from mixgraph.nodes.families.flux import diffusers_keys
    from tests.flux_fixtures import TINY, diffusers_flux_keys, flux_state_dict

    bfl = flux_state_dict(TINY, seed=3)  # write_flux_models' weights
    return bfl, diffusers_keys.to_diffusers(bfl, diffusers_flux_keys(TINY))


@pytest.mark.parametrize("prefix", ["transformer.", "", "base_model.model.", "diffusion_model."])
def test_flux_diffusers_lora_patches_the_fused_weights(flux_root, flux_diffusers, prefix):
    """ai-toolkit / diffusers (``transformer.``), bare PEFT and ComfyUI-converted names: q, k, v
    land on their thirds of ``img_attn.qkv`` / ``txt_attn.qkv``, q, k, v and ``proj_mlp`` on their
    rows of ``linear1``, ``norm_out.linear`` swapped into ``final_layer.adaLN_modulation.1``."""
    from mixgraph.nodes.families.flux import diffusers_keys

    bfl, diff = flux_diffusers
    lora, want_diff = _peft_lora(diff, prefix, seed=1)
    want = diffusers_keys.to_bfl(want_diff)
    for unet in ("flux_tiny.safetensors", "flux_tiny_diffusers.safetensors"):
        base, patched = _patched(flux_root, unet, lora)
        assert len(patched.patches) == 1 and not patched.patches[0].lora.unmatched
        _assert_weights(_weights(patched), want, bfl)


def test_flux_onetrainer_lycoris_kohya_and_comfy_names(flux_root, flux_diffusers):
    """One module per naming scheme in one file: OneTrainer ``lora_transformer_``, LyCORIS
    ``lycoris_`` (diffusers names with underscores), kohya ``lora_unet_`` (BFL names), ComfyUI
    ``diffusion_model.`` (BFL names) and XLabs / USO's ``linear1_qkv``."""
    bfl, diff = flux_diffusers
    g = torch.Generator().manual_seed(2)
    h = 64

    def pair(name, out_f, in_f, up="lora_up", down="lora_down"):
        a, b = torch.randn(RANK, in_f, generator=g), torch.randn(out_f, RANK, generator=g)
        return {f"{name}.{down}.weight": a, f"{name}.{up}.weight": b}, b @ a

    lora, want = {}, dict(bfl)
    for name, key, rows in (
            ("lora_transformer_transformer_blocks_0_attn_to_k", "double_blocks.0.img_attn.qkv.weight", (h, h)),
            ("lycoris_single_transformer_blocks_1_proj_mlp", "single_blocks.1.linear1.weight", (3 * h, 4 * h)),
            ("lora_unet_double_blocks_1_txt_attn_qkv", "double_blocks.1.txt_attn.qkv.weight", None),
            ("diffusion_model.single_blocks.0.linear2", "single_blocks.0.linear2.weight", None),
            ("diffusion_model.single_blocks.0.linear1_qkv", "single_blocks.0.linear1.weight", (0, 3 * h))):
        w = bfl[key]
        size = w.shape[0] if rows is None else rows[1]
        tensors, delta = pair(name, size, w.shape[1])
        lora.update(tensors)
        start = 0 if rows is None else rows[0]
        want[key] = want[key].clone()
        want[key][start:start + size] += STRENGTH * delta
    _, patched = _patched(flux_root, "flux_tiny.safetensors", lora)
    _assert_weights(_weights(patched), want, bfl)


def test_flux_diffusers_lora_in_bypass_mode_matches_the_merge(flux_root, flux_diffusers):
    """LoraLoaderBypassModelOnly adds each slice's low-rank path into its output columns: the
    model output equals the merged model's."""
    _, diff = flux_diffusers
    lora, _ = _peft_lora(diff, "transformer.", seed=4)
    _, merged = _patched(flux_root, "flux_tiny.safetensors", lora)
    _, bypass = _patched(flux_root, "flux_tiny.safetensors", lora, node="LoraLoaderBypassModelOnly")
    g = torch.Generator().manual_seed(5)
    x, ctx = torch.randn(1, 16, 8, 6, generator=g), torch.randn(1, 9, 32, generator=g)
    inputs = {"y": torch.randn(1, 32, generator=g), "guidance": torch.tensor([2.0])}
    a = merged.runner(parse_spec("f32"))(x, torch.tensor([0.4]), ctx, inputs)
    b = bypass.runner(parse_spec("f32"))(x, torch.tensor([0.4]), ctx, inputs)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_lora_for_another_architecture_is_refused_by_name(flux_root, tmp_path):
    """An SD UNet LoRA matches nothing of Flux; an SD3 diffusers LoRA shares Flux's diffusers
    names but not its widths: both stop with the LoRA's name and what it targets."""
    from mixgraph.graph.executor import NodeError
    from tests.fixtures.tiny_sd3 import diffusers_sd3

    g = torch.Generator().manual_seed(6)
    sd_lora = {"lora_unet_input_blocks_1_1_proj_in.lora_down.weight": torch.randn(RANK, 32, generator=g),
               "lora_unet_input_blocks_1_1_proj_in.lora_up.weight": torch.randn(32, RANK, generator=g)}
    with pytest.raises(NodeError, match="matches no weight of this model"):
        _patched(flux_root, "flux_tiny.safetensors", sd_lora)
    sd3_lora, _ = _peft_lora(diffusers_sd3("sd3").state_dict(), "transformer.", seed=7)
    with pytest.raises(NodeError, match="does not fit this model"):
        _patched(flux_root, "flux_tiny.safetensors", sd3_lora)


# ---------------------------------------------------------------------------------------------
# SD3 / SD3.5


@pytest.mark.parametrize("kind", ["sd3", "sd35_medium"])
def test_sd3_diffusers_lora(tmp_path, kind):
    """diffusers SD3 LoRA names onto the MMDiT: q / k / v (also SD3.5 medium's ``attn2``) onto
    their thirds of the fused ``qkv``, the last block's ``norm1_context`` and ``norm_out`` with
    their halves swapped."""
    from tests.fixtures.tiny_sd3 import comfy_state_dict, diffusers_sd3, write_sd3_unet

    model = diffusers_sd3(kind, seed=0)
    write_sd3_unet(tmp_path / "diffusion_models" / "mmdit.safetensors", kind, seed=0)
    lora, want_diff = _peft_lora(model.state_dict(), "transformer.", seed=8)
    model.load_state_dict(want_diff)
    want = comfy_state_dict(model)
    base, patched = _patched(tmp_path, "mmdit.safetensors", lora)
    assert not patched.patches[0].lora.unmatched
    _assert_weights(_weights(patched), want, _weights(base))


# ---------------------------------------------------------------------------------------------
# Z-Image / Lumina 2


@pytest.mark.parametrize("which", ["z_image", "lumina2"])
@pytest.mark.parametrize("prefix", ["diffusion_model.", "transformer."])
def test_nextdit_diffusers_lora(tmp_path, which, prefix):
    """Z-Image (``attention.to_q``) and Lumina 2 (``attn.to_q``, fewer key / value heads: narrower
    k and v slices) diffusers LoRA names onto the fused ``attention.qkv`` and the renamed layers."""
    from mixgraph.nodes.families.lumina import diffusers_keys
    from tests.fixtures.tiny_nextdit import reference_lumina2, reference_z_image

    ref = (reference_z_image if which == "z_image" else reference_lumina2)()
    diff = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    (tmp_path / "diffusion_models").mkdir(parents=True)
    base_sd = {k: v.contiguous() for k, v in diffusers_keys.to_comfy(diff).items()}
    save_file(base_sd, str(tmp_path / "diffusion_models" / "nextdit.safetensors"))
    lora, want_diff = _peft_lora(diff, prefix, seed=9)
    want = diffusers_keys.to_comfy(want_diff)
    base, patched = _patched(tmp_path, "nextdit.safetensors", lora)
    assert patched.family == which
    assert not patched.patches[0].lora.unmatched
    got = _weights(patched)
    _assert_weights({k: got[k] for k in want}, want, base_sd)


# ---------------------------------------------------------------------------------------------
# text encoders after the CLIPs (T5-XXL, Qwen3)


def test_t5_lora_names_by_place_in_the_set():
    """ComfyUI's rule for T5's kohya prefix: Flux (clip_l + t5xxl) ``lora_te2_`` and ``lora_te3_``,
    SD3 (clip_l + clip_g + t5xxl) ``lora_te3_``, Chroma (t5xxl alone) ``lora_te1_``; diffusers'
    pipelines name it ``text_encoder_2.`` / ``text_encoder_3.`` / ``text_encoder.``; the generic
    ``text_encoders.t5xxl.transformer.`` always. The merge lands on the T5 weight."""
    from mixgraph.nodes.adapters.lora import apply_patches, load_lora
    from mixgraph.nodes.adapters.lora_keys import model_lookup

    t5 = {"encoder.block.0.layer.0.SelfAttention.q.weight": (8, 8)}
    clip = {"text_model.encoder.layers.0.self_attn.q_proj.weight": (8, 8)}
    kohya = "encoder_block_0_layer_0_SelfAttention_q"
    cases = {("clip_l", "t5xxl"): (("lora_te2_", "lora_te3_"), "text_encoder_2."),
             ("clip_l", "clip_g", "t5xxl"): (("lora_te3_",), "text_encoder_3."),
             ("t5xxl",): (("lora_te1_",), "text_encoder.")}
    for names, (prefixes, diffusers) in cases.items():
        lookup, _ = model_lookup(None, {n: (t5 if n == "t5xxl" else clip) for n in names})
        for p in prefixes:
            assert lookup[p + kohya][:2] == ("t5xxl", "encoder.block.0.layer.0.SelfAttention.q")
        assert lookup[diffusers + "encoder.block.0.layer.0.SelfAttention.q"][0] == "t5xxl"
        assert lookup["text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q"][0] == "t5xxl"
    g = torch.Generator().manual_seed(10)
    a, b = torch.randn(RANK, 8, generator=g), torch.randn(8, RANK, generator=g)
    lf = load_lora({f"lora_te3_{kohya}.lora_down.weight": a, f"lora_te3_{kohya}.lora_up.weight": b}, None,
                   {"clip_l": clip, "t5xxl": t5})
    w = torch.randn(8, 8, generator=g)
    out = apply_patches({"encoder.block.0.layer.0.SelfAttention.q.weight": w}, [lf.patch("t5xxl", 0.5)])
    assert torch.allclose(out["encoder.block.0.layer.0.SelfAttention.q.weight"], w + 0.5 * b @ a)
    # a Qwen3 (Z-Image) LoRA in ComfyUI's generic names
    qwen = {"model.layers.0.self_attn.q_proj.weight": (8, 8)}
    lookup, _ = model_lookup(None, {"qwen3_4b": qwen})
    assert lookup["text_encoders.qwen3_4b.transformer.model.layers.0.self_attn.q_proj"][0] == "qwen3_4b"


def test_flux_text_encoder_lora_through_lora_loader(flux_root):
    """LoraLoader on a Flux CLIP (DualCLIPLoader type flux: clip_l + T5-XXL): kohya ``lora_te1_``
    reaches CLIP-L, OneTrainer's ``lora_te2_`` T5-XXL; the patches merge W + strength · B @ A into
    the T5 weight and change the encoding."""
    from mixgraph.nodes.adapters.lora import apply_patches
    from tests.fixtures.tiny_t5 import tiny_t5_state_dict

    t5 = tiny_t5_state_dict(6, d_model=32)
    save_file({k: v.contiguous() for k, v in t5.items()}, str(flux_root / "text_encoders" / "t5_tiny.safetensors"))
    g = torch.Generator().manual_seed(11)
    q = "encoder.block.1.layer.0.SelfAttention.q"
    a, b = torch.randn(RANK, 32, generator=g), torch.randn(32, RANK, generator=g)
    ca, cb = torch.randn(RANK, 32, generator=g), torch.randn(32, RANK, generator=g)
    lora = {f"lora_te2_{q.replace('.', '_')}.lora_down.weight": a, f"lora_te2_{q.replace('.', '_')}.lora_up.weight": b,
            "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": ca,
            "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": cb}
    (flux_root / "loras").mkdir(exist_ok=True)
    save_file(lora, str(flux_root / "loras" / "te_lora.safetensors"))
    gr = api.Graph()
    unet = gr.add("UNETLoader", unet_name="flux_tiny.safetensors", weight_dtype="default")
    clip = gr.add("DualCLIPLoader", clip_name1="t5_tiny.safetensors", clip_name2="clip_l_tiny.safetensors",
                  type="flux")
    lo = gr.add("LoraLoader", model=unet.out, clip=clip.out, lora_name="te_lora.safetensors", strength_model=1.0,
                strength_clip=0.8)
    enc = gr.add("CLIPTextEncode", clip=lo[1], text="a red cube")
    plain = gr.add("CLIPTextEncode", clip=clip.out, text="a red cube")
    gr.add("PreviewAny", source=enc.out)
    gr.add("PreviewAny", source=plain.out)
    res = api.run(gr, models=flux_root, output=flux_root / "out")
    patched = res[lo.node_id][1]
    assert patched.names == ("clip_l", "t5xxl") and {p.target for p in patched.patches} == {"clip_l", "t5xxl"}
    t5_patch = next(p for p in patched.patches if p.target == "t5xxl")
    merged = apply_patches({f"{q}.weight": t5[f"{q}.weight"]}, [t5_patch])
    assert torch.allclose(merged[f"{q}.weight"], t5[f"{q}.weight"] + 0.8 * b @ a, atol=1e-6)
    got, base = res[enc.node_id][0][0].cross_attn, res[plain.node_id][0][0].cross_attn
    assert got.shape == base.shape and not torch.allclose(got, base, atol=1e-4)


def test_a_dora_piece_decomposes_its_rows_only():
    """DoRA on one piece of a fused weight: ComfyUI narrows the weight to the slice and applies
    ``weight_decompose`` there, so the norms are the slice's (in the LoRA's row order)."""
    from mixgraph.nodes.adapters.lora import LoraAdapter, apply_patches, dora_merge, load_lora
    from mixgraph.nodes.families.base import LoraTarget

    g = torch.Generator().manual_seed(12)
    w = torch.randn(6, 4, generator=g)
    a, b, m = torch.randn(RANK, 4, generator=g), torch.randn(2, RANK, generator=g), torch.rand(2, 1, generator=g) + 0.5
    lf = load_lora({"transformer.blk.to_k.lora_A.weight": a, "transformer.blk.to_k.lora_B.weight": b,
                    "transformer.blk.to_k.dora_scale": m}, {"blk.qkv.weight": (6, 4)},
                   unet_names={"blk.to_k": LoraTarget("blk.qkv.weight", (2, 2))})
    out = apply_patches({"blk.qkv.weight": w}, [lf.patch("unet", 0.6)])["blk.qkv.weight"]
    want = w.clone()
    want[2:4] = dora_merge(w[2:4].clone(), LoraAdapter(b, a, dora_scale=m), 0.6)
    assert torch.allclose(out, want, atol=1e-6) and torch.equal(out[:2], w[:2]) and torch.equal(out[4:], w[4:])
