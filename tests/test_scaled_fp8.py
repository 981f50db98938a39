"""ComfyUI's quantised weight files (scaled fp8, mixed precision) and plain fp8 files, read for any
model by the weight layer (``nodes/weights/quantized.py``): the dequantised weights equal the f32
reference, fp8 storage keeps the file's fp8 + scale, UNETLoader's weight_dtype options work."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mixgraph.nodes.families.sd.unet import UNetModel
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights import quantized
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource, quantization
from mixgraph.nodes.weights.save import unet_state_dict
from mixgraph.nodes.weights.store import WeightStore
from tests.fixtures import checkpoints as C
from tests.fixtures.tiny_unet import tiny_unet_config

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@dataclass(frozen=True)
class Policy:  # stands in for graph.precision.Policy (duck-typed seam)
    storage: torch.dtype = F32
    compute: torch.dtype = F32
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Tiny(nn.Module):
    """A model of no family: Linear, Conv2d, LayerNorm and an Embedding."""

    def __init__(self, config=None):
        super().__init__()
        self.emb = nn.Embedding(10, 16)
        self.inp = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.blocks = nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32, bias=False)])
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.out = nn.Linear(32, 8)

    def forward(self, ids, img):
        h = self.norm(self.inp(self.emb(ids)))
        for b in self.blocks:
            h = h + torch.nn.functional.gelu(b(h))
        return self.out(h), self.conv(img)


def _quantize(w: torch.Tensor, dtype=E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """ComfyUI's per-tensor fp8 quantisation: s = max|w| / fp8 max, q = fp8(w / s)."""
    scale = (w.abs().amax() / torch.finfo(dtype).max).float()
    return (w / scale).to(dtype), scale


def _scaled(sd: dict, layers, fmt: str = "scaled_fp8", input_scale: bool = True, dtype=E4M3):
    """``sd`` with ``layers``' weights quantised in ComfyUI's layout ``fmt``, and the dequantised
    f32 reference."""
    out, ref = dict(sd), dict(sd)
    for layer in layers:
        q, s = _quantize(sd[f"{layer}.weight"], dtype)
        out[f"{layer}.weight"] = q
        ref[f"{layer}.weight"] = q.float() * s
        if fmt == "scaled_fp8":
            out[f"{layer}.scale_weight"] = s
            if input_scale:
                out[f"{layer}.scale_input"] = torch.tensor(0.5)
        else:
            out[f"{layer}.weight_scale"] = s
            if input_scale:
                out[f"{layer}.input_scale"] = torch.tensor(0.5)
            if fmt == "mixed":
                name = {E4M3: "float8_e4m3fn", E5M2: "float8_e5m2"}[dtype]
                out[f"{layer}.comfy_quant"] = torch.tensor(
                    list(json.dumps({"format": name, "full_precision_matrix_mult": True}).encode()), dtype=torch.uint8)
    if fmt == "scaled_fp8":
        out["scaled_fp8"] = torch.empty(0, dtype=dtype)
    return out, ref


def _tiny_files(tmp_path, fmt, dtype=E4M3):
    torch.manual_seed(0)
    sd = {k: v.detach().clone() for k, v in Tiny().state_dict().items()}
    layers = ["inp", "blocks.0", "blocks.1", "out"]
    q, ref = _scaled(sd, layers, fmt, dtype=dtype)
    meta = None
    if fmt == "metadata":
        meta = {quantized.QUANT_METADATA: json.dumps({"layers": {k: {"format": "float8_e4m3fn"} for k in layers}})}
    path = tmp_path / f"tiny_{fmt}.safetensors"
    save_file(q, str(path), metadata=meta)
    return WeightSource.from_file(path), ref, layers


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 10, (2, 5), generator=g), torch.randn(1, 2, 6, 6, generator=g)


def _run(module, policy):
    with torch.no_grad():
        return apply_precision(module, policy)(*_inputs())


def _reference(ref: dict, policy=Policy()):
    m = Tiny()
    m.load_state_dict(ref)
    return _run(m.eval(), policy)


@pytest.mark.parametrize("fmt", ["scaled_fp8", "mixed", "metadata"])
def test_quantised_file_dequantises_to_the_f32_reference(tmp_path, fmt):
    source, ref, layers = _tiny_files(tmp_path, fmt)
    scheme = quantization(source)
    assert scheme is not None and set(scheme.layers) == {f"{k}.weight" for k in layers}
    m = WeightStore().materialize("tiny", source, None, F32, (), Tiny)
    for k, v in ref.items():  # exactly the dequantised values: fp8.float() * scale
        assert torch.equal(m.state_dict()[k], v), k
    assert not any(hasattr(x, "weight_scale") for x in m.modules())
    for got, want in zip(_run(m, Policy()), _reference(ref)):
        assert torch.equal(got, want)  # same arithmetic as the reference: bit-identical


@pytest.mark.parametrize("fmt", ["scaled_fp8", "mixed"])
def test_fp8_storage_keeps_fp8_and_scale(tmp_path, fmt):
    """Under an fp8 storage dtype the quantised Linears keep the file's bytes and their scale, in
    the file's fp8 type even when the policy names the other one (as ComfyUI keeps them); the
    forward equals the dequantised reference's whose other tensors take the same fp8 storage."""
    source, ref, layers = _tiny_files(tmp_path, fmt)
    for storage in (E4M3, E5M2):
        store = WeightStore()
        m = store.materialize("tiny", source, None, storage, (), Tiny)
        for layer in layers:
            lin = m.get_submodule(layer)
            assert lin.weight.dtype == E4M3 and lin.weight_scale.dtype == F32
            assert torch.equal(lin.weight.float() * lin.weight_scale, ref[f"{layer}.weight"])
        assert m.conv.weight.dtype == storage  # the rest follows the policy
        # reference: the plain weights through the same fp8 storage, the quantised ones exact
        want = {k: (v if k[: -len(".weight")] in layers and k.endswith(".weight") else v.to(storage).float())
                for k, v in ref.items()}
        for compute in (F32, BF16):
            got = _run(m, Policy(storage, compute))
            exp = _reference(want, Policy(F32, compute))
            for a, b in zip(got, exp):
                if compute == F32:
                    assert torch.equal(a, b)
                else:
                    assert (a - b).norm() <= 0.02 * b.norm()
        held = store.stats.bytes
        f32_bytes = sum(v.numel() * 4 for v in ref.values())
        assert held < f32_bytes / 3  # fp8 bytes, not a dequantised copy


def test_quantised_layers_of_other_modules_and_keep_f32_dequantise(tmp_path):
    """Only exact Linear / Conv layers keep a scale; a keep-f32 layer is dequantised in f32."""

    class KeepOut(Tiny):
        keep_f32 = ("out",)

    source, ref, _ = _tiny_files(tmp_path, "scaled_fp8")
    m = WeightStore().materialize("tiny", source, None, E4M3, (), KeepOut)
    assert m.out.weight.dtype == F32 and torch.equal(m.out.weight, ref["out.weight"])
    assert not hasattr(m.out, "weight_scale") and hasattr(m.inp, "weight_scale")


def test_int8_policy_on_kept_fp8_uses_the_dequantised_weight(tmp_path):
    source, ref, _ = _tiny_files(tmp_path, "scaled_fp8")
    m = WeightStore().materialize("tiny", source, None, E4M3, (), Tiny)
    got = _run(m, Policy(E4M3, F32, int8=True))[0]
    want = _reference(ref, Policy(F32, F32, int8=True))[0]
    assert (got - want).norm() <= 0.05 * want.norm()


def test_unsupported_quant_format_is_refused_by_name(tmp_path):
    sd = {"lin.weight": torch.zeros(4, 8, dtype=torch.uint8), "lin.weight_scale": torch.ones(4, 1),
          "lin.weight_scale_2": torch.tensor(1.0),
          "lin.comfy_quant": torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)}
    path = tmp_path / "nvfp4.safetensors"
    save_file(sd, str(path))

    class One(nn.Module):
        def __init__(self, config=None):
            super().__init__()
            self.lin = nn.Linear(16, 4, bias=False)

    with pytest.raises(NotImplementedError, match="nvfp4"):
        WeightStore().materialize("one", WeightSource.from_file(path), None, F32, (), One)


# ---------------------------------------------------------------------------------------------
# the SD UNet fixture as a scaled fp8 file, through UNETLoader


def _linear_layers(sd: dict) -> list[str]:
    return sorted(k[: -len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2)


@pytest.fixture(scope="module")
def unet_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("scaled_unet")
    sd = C.write_unet(d / "plain.safetensors", "sd15", seed=3)
    q, ref = _scaled(sd, _linear_layers(sd))
    save_file(q, str(d / "scaled.safetensors"))
    save_file({k: v.contiguous() for k, v in ref.items()}, str(d / "dequantised.safetensors"))
    mixed, _ = _scaled(sd, _linear_layers(sd), "mixed")
    save_file({C.UNET_PREFIX + k: v for k, v in mixed.items()}, str(d / "mixed_prefixed.safetensors"))
    return d


def _unet_out(handle, policy):
    module = WeightStore().materialize("unet", handle.source, handle.config, policy.storage, (), UNetModel)
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, cfg.in_channels, 8, 8, generator=g)
    ctx = torch.randn(1, 4, cfg.context_dim, generator=g)
    with torch.no_grad():
        return apply_precision(module, policy)(x, torch.tensor([500.0]), ctx), module


@pytest.mark.parametrize("name", ["scaled.safetensors", "mixed_prefixed.safetensors"])
def test_scaled_unet_loads_with_unetloader_and_matches_the_dequantised_file(unet_files, name):
    ref = loader.load_unet(unet_files / "dequantised.safetensors")
    got = loader.load_unet(unet_files / name)
    assert got.kind == "sd1" and got.config == ref.config
    a, _ = _unet_out(got, Policy())
    b, _ = _unet_out(ref, Policy())
    assert torch.equal(a, b)


@pytest.mark.parametrize("weight_dtype,dtype", [("fp8_e4m3fn", E4M3), ("fp8_e4m3fn_fast", E4M3),
                                                ("fp8_e5m2", E5M2)])
def test_scaled_unet_weight_dtype_options(unet_files, weight_dtype, dtype):
    got = loader.load_unet(unet_files / "scaled.safetensors", weight_dtype=weight_dtype)
    assert got.weight_dtype == dtype
    plain = loader.load_unet(unet_files / "dequantised.safetensors", weight_dtype=weight_dtype)
    out, module = _unet_out(got, Policy(dtype, F32))
    ref_out, ref_module = _unet_out(plain, Policy(dtype, F32))
    f32_out, _ = _unet_out(plain, Policy())
    scaled = {f"{k}.weight" for k in _linear_layers(dict(module.state_dict()))}
    ours, theirs = module.state_dict(), ref_module.state_dict()
    for k in ours:
        if k in scaled and not k.startswith("time_embed"):  # keep_f32: dequantised in f32
            lin = module.get_submodule(k[: -len(".weight")])
            assert ours[k].dtype == E4M3 and lin.weight_scale.dtype == F32
        else:
            assert torch.equal(ours[k], theirs[k]), k  # everything else as a plain file's
    # the quantised layers are exact, so the scaled file is closer to f32 than the plain fp8 cast
    err = (out - f32_out).norm() / f32_out.norm()
    assert err < (ref_out - f32_out).norm() / f32_out.norm() + 1e-6 and err < 0.3


def test_save_of_a_kept_fp8_model_writes_comfy_mixed_layout(unet_files, tmp_path):
    got = loader.load_unet(unet_files / "scaled.safetensors", weight_dtype="fp8_e4m3fn")
    sd = unet_state_dict(got, E4M3)
    layer = "input_blocks.1.1.transformer_blocks.0.attn1.to_q"
    assert sd[f"{layer}.weight"].dtype == E4M3 and sd[f"{layer}.weight_scale"].dtype == F32
    assert json.loads(bytes(sd[f"{layer}.comfy_quant"].tolist())) == {"format": "float8_e4m3fn"}
    path = tmp_path / "resaved.safetensors"
    save_file(sd, str(path))
    again = loader.load_unet(path)
    a, _ = _unet_out(again, Policy())
    b, _ = _unet_out(loader.load_unet(unet_files / "scaled.safetensors", weight_dtype="fp8_e4m3fn"),
                     Policy(E4M3, F32))
    assert (a - b).norm() <= 1e-5 * b.norm()


# ---------------------------------------------------------------------------------------------
# plain fp8 files


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_plain_fp8_unet_file_loads(tmp_path, dtype):
    path = tmp_path / f"unet_{dtype}.safetensors"
    sd = C.write_unet(path, "sd15", seed=2, dtype=dtype)
    handle = loader.load_unet(path)
    assert handle.kind == "sd1" and quantization(handle.source) is None
    out, module = _unet_out(handle, Policy())
    for k, v in module.state_dict().items():
        assert torch.equal(v, sd[k].to(dtype).float()), k
    ref = UNetModel(handle.config)
    ref.load_state_dict({k: v.to(dtype).float() for k, v in sd.items()})
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, cfg.in_channels, 8, 8, generator=g)
    ctx = torch.randn(1, 4, cfg.context_dim, generator=g)
    with torch.no_grad():
        want = apply_precision(ref.eval(), Policy())(x, torch.tensor([500.0]), ctx)
    assert torch.equal(out, want)
    pinned, module = _unet_out(loader.load_unet(path, weight_dtype="fp8_e4m3fn"), Policy(E4M3, BF16))
    assert torch.isfinite(pinned).all()


def test_lora_on_a_kept_fp8_model_merges_in_dequantised_units(unet_files, tmp_path):
    """A LoRA merged into a kept fp8 weight: dequantise, add, re-quantise with the same scale; the
    effective weight is the plain model's merged weight to fp8 precision, saturating where the merge
    leaves the scale's range (ComfyUI's convert_weight / set_weight, round-to-nearest here)."""
    from mixgraph.nodes.adapters.lora import load_lora_patches
    from tests.fixtures.tiny_lora import lora_file, unet_file_names

    keys = ["input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight",
            "middle_block.1.transformer_blocks.0.attn1.to_out.0.weight"]
    plain = loader.load_unet(unet_files / "dequantised.safetensors")
    shapes = plain.weight_shapes()
    names = unet_file_names(dict.fromkeys(shapes), keys, "kohya_ldm")
    path = tmp_path / "lora.safetensors"
    save_file(lora_file({names[k]: shapes[k] for k in keys}, "lora", seed=7), str(path))
    scaled = loader.load_unet(unet_files / "scaled.safetensors", weight_dtype="fp8_e4m3fn")
    (plain_l, _), (scaled_l, _) = (load_lora_patches(path, h, None, 0.8, 0.0) for h in (plain, scaled))
    store = WeightStore()
    want = store.materialize("unet", plain_l.source, plain_l.config, F32, plain_l.patches, UNetModel)
    got = store.materialize("unet", scaled_l.source, scaled_l.config, E4M3, scaled_l.patches, UNetModel)
    base = store.materialize("unet", scaled.source, scaled.config, E4M3, (), UNetModel)
    for k in keys:
        layer = k[: -len(".weight")]
        lin, lin0 = got.get_submodule(layer), base.get_submodule(layer)
        assert lin.weight.dtype == E4M3 and torch.equal(lin.weight_scale, lin0.weight_scale)
        eff = lin.weight.float() * lin.weight_scale
        w = want.state_dict()[k]
        assert not torch.equal(lin.weight, lin0.weight)  # the LoRA changed it
        top = torch.finfo(E4M3).max * lin.weight_scale  # the scale's range: beyond it saturates
        inside = w.abs() <= top
        assert ((eff - w).abs() <= 0.07 * w.abs() + 1e-3 * top)[inside].all()  # e4m3 rounding
        assert torch.equal(eff[~inside], torch.sign(w[~inside]) * top)


def test_scaled_diffusers_layout_unet(tmp_path):
    """The scale keys follow their weight through a key layout's renaming (diffusers -> LDM)."""
    from safetensors.torch import load_file

    C.write_unet(tmp_path / "diffusers.safetensors", "sd15", layout="diffusers", seed=3)
    diff = load_file(str(tmp_path / "diffusers.safetensors"))
    q, ref = _scaled(diff, _linear_layers(diff))
    save_file(q, str(tmp_path / "scaled.safetensors"))
    save_file(ref, str(tmp_path / "dequantised.safetensors"))
    got = loader.load_unet(tmp_path / "scaled.safetensors")
    want = loader.load_unet(tmp_path / "dequantised.safetensors")
    assert got.source.layout == "diffusers_unet" and got.config == want.config
    a, ma = _unet_out(got, Policy())
    b, mb = _unet_out(want, Policy())
    sa, sb = ma.state_dict(), mb.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sb)
    # same weights; the f32 sums may differ in the last bits (freshly allocated dequantised
    # tensors vs memory-mapped file views: BLAS blocking follows alignment)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _, kept = _unet_out(loader.load_unet(tmp_path / "scaled.safetensors", weight_dtype="fp8_e4m3fn"), Policy(E4M3, F32))
    n = sum(m.weight.dtype == E4M3 and "weight_scale" in m._buffers for m in kept.modules() if hasattr(m, "weight"))
    assert n == len([k for k in _linear_layers(diff)]) - 2  # all but time_embed's two (keep_f32)


@pytest.mark.parametrize("storage", [F32, E4M3])
def test_scaled_text_encoder_file(tmp_path, storage):
    """A text encoder file in the scaled fp8 layout (as ComfyUI's t5xxl_fp8_e4m3fn_scaled): the
    same weight layer, through CLIPLoader's source and the CLIP handle."""
    sd = C.write_clip_l(tmp_path / "plain.safetensors", seed=2)
    layers = [k[: -len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2
              and "embedding" not in k]
    q, ref = _scaled(sd, layers)
    save_file(q, str(tmp_path / "scaled.safetensors"))
    save_file({k: v.contiguous() for k, v in ref.items()}, str(tmp_path / "dequantised.safetensors"))
    got = loader.load_clip([tmp_path / "scaled.safetensors"])
    want = loader.load_clip([tmp_path / "dequantised.safetensors"])
    assert got.encoder("clip_l").config == want.encoder("clip_l").config
    (a,) = got.encode("a red cube", Policy(storage, F32))
    (b,) = want.encode("a red cube", Policy(F32 if storage == E4M3 else storage, F32))
    if storage == F32:
        torch.testing.assert_close(a.cross_attn, b.cross_attn, rtol=1e-5, atol=1e-5)
    else:  # the quantised Linears exact, the rest (embeddings, norms) through fp8 storage
        assert (a.cross_attn - b.cross_attn).norm() <= 0.1 * b.cross_attn.norm()


def test_unetloader_node_samples_a_scaled_file(unet_files, tmp_path):
    """UNETLoader -> KSampler through ``mixgraph.ui.api``: the scaled file samples exactly as its
    dequantised twin under the default policy, and runs under each fp8 weight_dtype."""
    from mixgraph.ui import api

    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    for name in ("scaled.safetensors", "dequantised.safetensors"):
        shutil.copyfile(unet_files / name, models / "diffusion_models" / name)
    (models / "text_encoders").mkdir()
    C.write_clip_l(models / "text_encoders" / "clip_l.safetensors", width=32)

    def run(unet: str, weight_dtype: str):
        g = api.Graph()
        m = g.add("UNETLoader", unet_name=unet, weight_dtype=weight_dtype)[0]
        c = g.add("CLIPLoader", clip_name="clip_l.safetensors", type="stable_diffusion")[0]
        cond = g.add("CLIPTextEncode", text="a red cube", clip=c)
        lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
        ks = g.add("KSampler", model=m, seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
                   positive=cond, negative=cond, latent_image=lat, denoise=1.0)
        g.add("SaveLatent", samples=ks, filename_prefix="scaled/out")
        out = api.run(g, models=models, output=tmp_path / "out", precision="f32")
        return out.outputs[ks.node_id][0].samples

    assert torch.equal(run("scaled.safetensors", "default"), run("dequantised.safetensors", "default"))
    for weight_dtype in ("fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"):
        assert torch.isfinite(run("scaled.safetensors", weight_dtype)).all()


@pytest.mark.parametrize("storage", [F32, E4M3])
def test_model_merge_of_scaled_models(tmp_path, storage):
    """ModelMergeSimple-style blend (0.5 / 0.5) of a scaled file into a scaled file: both seen
    dequantised; under fp8 storage the result re-quantised with the patched model's scale."""
    from mixgraph.nodes.weights.merge import MergePatch

    a, ref_a, layers = _tiny_files(tmp_path, "scaled_fp8")
    torch.manual_seed(1)
    other = {k: v.detach().clone() for k, v in Tiny().state_dict().items()}
    q, ref_b = _scaled(other, layers)
    save_file(q, str(tmp_path / "other.safetensors"))
    b = WeightSource.from_file(tmp_path / "other.safetensors")
    merge = MergePatch("tiny", b, None, (), (0.5, 0.5), build=Tiny)
    m = WeightStore().materialize("tiny", a, None, storage, (merge,), Tiny)
    for layer in layers:
        want = 0.5 * ref_a[f"{layer}.weight"] + 0.5 * ref_b[f"{layer}.weight"]
        lin = m.get_submodule(layer)
        got = lin.weight.float() * lin.weight_scale if storage == E4M3 else lin.weight
        tol = 0.07 * want.abs().max() if storage == E4M3 else 1e-6
        assert (got - want).abs().max() <= tol, layer
