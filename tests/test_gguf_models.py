"""GGUF weight files through ComfyUI-GGUF's loader nodes (``nodes/declare/loaders/gguf_nodes.py``):
a tiny SD1.5 UNet and a tiny Flux written with gguf-py's ``GGUFWriter`` in F16, BF16, Q8_0 and Q4_K
sample through ``mixgraph.ui.api`` exactly as the same models loaded from their dequantised
tensors (gguf-py's reference dequantiser) in safetensors files; the quantised weights stay
quantised in memory; LoRA patches the dequantised weights; bad files are refused by name."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import save_file

from mixgraph.graph.env import Env
from mixgraph.graph.report import ValidationFailed
from mixgraph.nodes.families.sd.unet import UNetModel
from mixgraph.nodes.declare.loaders import gguf_nodes
from mixgraph.nodes.models import loader
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.gguf_tensor import QuantizedTensor, is_quantized
from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file
from mixgraph.nodes.weights.store import WeightStore, nbytes
from mixgraph.ui import api
from tests.fixtures import checkpoints as C
from tests.fixtures.tiny_lora import UNET_TARGETS, lora_file, unet_file_names
from tests.fixtures.tiny_unet import tiny_unet_config, tiny_unet_state_dict
from tests.gguf_fixtures import write_gguf

F32, BF16 = torch.float32, torch.bfloat16
SD_TYPES = (T.F16, T.BF16, T.Q8_0, T.Q4_K)
FLUX_TYPES = (T.Q8_0, T.Q4_K)


@dataclass(frozen=True)
class Policy:  # stands in for graph.precision.Policy (duck-typed seam)
    storage: torch.dtype = F32
    compute: torch.dtype = F32
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models/: each test model as ``<name>_<type>.gguf`` beside ``<name>_<type>.safetensors``
    holding the GGUF's tensors dequantised by gguf-py; the tiny CLIP-L, a 16-channel VAE, a LoRA."""
    from tests.flux_fixtures import write_flux_models

    root = tmp_path_factory.mktemp("gguf") / "models"
    flux_sd = write_flux_models(root)  # diffusion_models/flux_tiny.safetensors, clip_l_tiny, vae16
    dm = root / "diffusion_models"
    sd15 = tiny_unet_state_dict("sd15", seed=3)
    for name, sd, arch, types in (("sd15", sd15, "sd1", SD_TYPES), ("flux", flux_sd, "flux", FLUX_TYPES)):
        for qt in types:
            ref = write_gguf(dm / f"{name}_{qt.name}.gguf", sd, qt, arch)
            save_file({k: v.contiguous() for k, v in ref.items()}, str(dm / f"{name}_{qt.name}.safetensors"))
    names = unet_file_names(sd15, UNET_TARGETS["sd15"], "kohya_ldm")
    (root / "loras").mkdir()
    save_file(lora_file({names[k]: sd15[k].shape for k in names}, "lora", seed=2), str(root / "loras" / "l.safetensors"))
    return root


def _sd_graph(loader_type: str, unet: str, lora: str | None = None) -> tuple[api.Graph, api.NodeRef]:
    """``lora``: the LoRA node between the loader and KSampler (the tiny LoRA at 0.8), or none."""
    g = api.Graph()
    extra = {"weight_dtype": "default"} if loader_type == "UNETLoader" else {}
    m = g.add(loader_type, unet_name=unet, **extra)[0]
    if lora:
        m = g.add(lora, model=m, lora_name="l.safetensors", strength_model=0.8)[0]
    c = g.add("CLIPLoaderGGUF", clip_name="clip_l_tiny.safetensors", type="stable_diffusion")[0]
    pos, neg = g.add("CLIPTextEncode", text="a red cube", clip=c), g.add("CLIPTextEncode", text="", clip=c)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=m, seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    g.add("SaveLatent", samples=ks, filename_prefix="gguf/sd")
    return g, ks


def _samples(models, graph_and_node, precision="f32") -> torch.Tensor:
    g, ks = graph_and_node
    out = api.run(g, models=models, output=models.parent / "out", precision=precision)
    return out.outputs[ks.node_id][0].samples


@pytest.mark.parametrize("qt", SD_TYPES, ids=lambda t: t.name)
def test_sd15_gguf_samples_as_its_dequantised_safetensors(models, qt):
    got = _samples(models, _sd_graph("UnetLoaderGGUF", f"sd15_{qt.name}.gguf"))
    want = _samples(models, _sd_graph("UNETLoader", f"sd15_{qt.name}.safetensors"))
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_sd15_gguf_under_bf16_and_with_the_advanced_loader(models):
    """bf16 compute: the dequantised f32 weights cast to bf16 per layer equal the safetensors'
    weights stored in bf16; UnetLoaderGGUFAdvanced's default options load the same model."""
    name = "sd15_Q4_K"
    got = _samples(models, _sd_graph("UnetLoaderGGUF", f"{name}.gguf"), "bf16")
    want = _samples(models, _sd_graph("UNETLoader", f"{name}.safetensors"), "bf16")
    assert torch.equal(got, want)
    adv = api.Graph()
    m = adv.add("UnetLoaderGGUFAdvanced", unet_name=f"{name}.gguf", dequant_dtype="target", patch_dtype="float32",
                patch_on_device=True)[0]
    c = adv.add("CLIPLoaderGGUF", clip_name="clip_l_tiny.safetensors", type="stable_diffusion")[0]
    pos, neg = adv.add("CLIPTextEncode", text="a red cube", clip=c), adv.add("CLIPTextEncode", text="", clip=c)
    lat = adv.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks2 = adv.add("KSampler", model=m, seed=3, steps=2, cfg=2.0, sampler_name="euler", scheduler="normal",
                  positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    adv.add("SaveLatent", samples=ks2, filename_prefix="gguf/adv")
    assert torch.equal(_samples(models, (adv, ks2)), _samples(models, _sd_graph("UNETLoader", f"{name}.safetensors")))


def test_lora_on_a_gguf_model_patches_the_dequantised_weights(models):
    name = "sd15_Q8_0"
    got = _samples(models, _sd_graph("UnetLoaderGGUF", f"{name}.gguf", lora="LoraLoaderModelOnly"))
    want = _samples(models, _sd_graph("UNETLoader", f"{name}.safetensors", lora="LoraLoaderModelOnly"))
    plain = _samples(models, _sd_graph("UnetLoaderGGUF", f"{name}.gguf"))
    assert torch.equal(got, want) and not torch.equal(got, plain)


def _flux_graph(loader_type: str, unet: str) -> tuple[api.Graph, api.NodeRef]:
    g = api.Graph()
    extra = {"weight_dtype": "default"} if loader_type == "UNETLoader" else {}
    m = g.add(loader_type, unet_name=unet, **extra)[0]
    c = g.add("CLIPLoader", clip_name="clip_l_tiny.safetensors", type="stable_diffusion")[0]
    pos = g.add("FluxGuidance", conditioning=g.add("CLIPTextEncode", text="a red cube", clip=c), guidance=3.5)
    neg = g.add("CLIPTextEncode", text="", clip=c)
    lat = g.add("EmptySD3LatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=m, seed=5, steps=2, cfg=1.0, sampler_name="euler", scheduler="simple",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    g.add("SaveLatent", samples=ks, filename_prefix="gguf/flux")
    return g, ks


@pytest.mark.parametrize("qt", FLUX_TYPES, ids=lambda t: t.name)
def test_flux_gguf_samples_as_its_dequantised_safetensors(models, qt):
    got = _samples(models, _flux_graph("UnetLoaderGGUF", f"flux_{qt.name}.gguf"))
    want = _samples(models, _flux_graph("UNETLoader", f"flux_{qt.name}.safetensors"))
    assert got.shape == (1, 16, 4, 4) and torch.isfinite(got).all() and torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# memory: the weights stay quantised


@pytest.mark.parametrize("storage", [F32, BF16])
def test_loaded_model_keeps_the_quantised_bytes(models, storage):
    path = models / "diffusion_models" / "sd15_Q4_K.gguf"
    handle = gguf_nodes.load_unet_gguf(path)
    assert handle.family == "sd" and handle.kind == "sd1"
    store = WeightStore()
    module = store.materialize("unet", handle.source, handle.config, storage, (), UNetModel)
    params = dict(module.named_parameters())
    quantised = {k: p for k, p in params.items() if is_quantized(p)}
    reader = gguf.GGUFReader(str(path))
    in_file = {t.name: int(t.n_bytes) for t in reader.tensors if t.tensor_type == T.Q4_K}
    assert set(quantised) == set(in_file) and len(in_file) > 20
    for k, p in quantised.items():  # the file's bytes, nothing more
        assert p.raw.dtype == torch.uint8 and p.raw.numel() == in_file[k] and p.fmt.name == "Q4_K"
    # a conv weight the file stores flattened (comfy.gguf.orig_shape) comes back in its shape
    conv = "input_blocks.1.0.in_layers.2.weight"
    assert reader.get_field(f"comfy.gguf.orig_shape.{conv}") is not None
    assert params[conv].ndim == 4 and tuple(params[conv].shape) == inspect_file(path)[conv].shape
    plain = sum(p.numel() * p.element_size() for k, p in params.items() if k not in quantised)
    assert nbytes(store.state_dict("unet", handle.source, handle.config, storage)) == sum(in_file.values()) + plain
    dense = sum(p.numel() for p in quantised.values()) * 4
    assert sum(in_file.values()) * 6 < dense  # 4.5 bits a weight against 32
    # the precision layer keeps them quantised too, and dequantises per forward
    run = apply_precision(module, Policy(storage, storage))
    assert all(is_quantized(run.get_submodule(k[: -len(".weight")]).weight) for k in quantised)
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(1, cfg.in_channels, 8, 8, generator=g), torch.randn(1, 4, cfg.context_dim, generator=g)
    with torch.no_grad():
        assert torch.isfinite(run(x, torch.tensor([400.0]), ctx)).all()


# ---------------------------------------------------------------------------------------------
# text encoders


def test_clip_gguf_with_state_dict_names_loads_and_llama_files_are_refused(models, tmp_path):
    te = models / "text_encoders"
    sd = C.write_clip_l(tmp_path / "clip.safetensors", seed=4)  # write_flux_models' clip_l_tiny
    ref = write_gguf(te / "clip_l_tiny_Q8_0.gguf", sd, T.Q8_0, arch=None)
    save_file({k: v.contiguous() for k, v in ref.items()}, str(te / "clip_l_tiny_deq.safetensors"))
    a = gguf_nodes.load_clip_gguf([te / "clip_l_tiny_Q8_0.gguf"], "stable_diffusion")
    b = loader.load_clip([te / "clip_l_tiny_deq.safetensors"], "stable_diffusion")
    assert [e.config for e in a.encoders] == [e.config for e in b.encoders]
    llama = {"token_embd.weight": torch.randn(64, 32), "blk.0.attn_q.weight": torch.randn(32, 32)}
    write_gguf(te / "llama.gguf", llama, T.Q8_0, arch="llama")
    with pytest.raises(NotImplementedError, match="llama.gguf: a llama.cpp-converted text encoder .*'llama'"):
        gguf_nodes.load_clip_gguf([te / "llama.gguf"], "lumina2")
    g = api.Graph()
    c = g.add("CLIPLoaderGGUF", clip_name="llama.gguf", type="lumina2")[0]
    g.add("PreviewAny", source=g.add("CLIPTextEncode", text="x", clip=c)[0])
    with pytest.raises(ValidationFailed, match="not supported yet"):
        api.run(g, models=models, output=tmp_path / "out")
    (te / "llama.gguf").unlink()


# ---------------------------------------------------------------------------------------------
# bad files


def _tiny_gguf(path, arch="sd1", qt=T.Q8_0):
    return write_gguf(path, tiny_unet_state_dict("sd15", seed=1), qt, arch)


def test_truncated_gguf_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cut.gguf"
    _tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 4096])
    with pytest.raises(WeightFileError, match="cut.gguf.*truncated"):
        gguf_nodes.load_unet_gguf(path)
    assert "cut.gguf" in gguf_nodes.unet_problem(path, "unet_name 'cut.gguf'")
    path.write_bytes(data[:100])  # inside the header
    with pytest.raises(WeightFileError, match="cut.gguf.*(truncated|corrupt)"):
        gguf_nodes.load_unet_gguf(path)


def test_unknown_and_unsupported_tensor_types_are_refused_by_name(tmp_path):
    path = tmp_path / "iq.gguf"
    sd = tiny_unet_state_dict("sd15", seed=1)
    key = "input_blocks.1.1.proj_in.weight"
    w = gguf.GGUFWriter(str(path), arch="sd1")
    for k, t in sd.items():
        if k == key:  # IQ4_NL: 32 values in 18 bytes, a type mixgraph does not read
            n = t.numel() // 32 * 18
            w.add_tensor(k, torch.zeros(t.shape[0], n // t.shape[0], dtype=torch.uint8).numpy(), raw_dtype=T.IQ4_NL)
        else:
            w.add_tensor(k, t.float().numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(WeightFileError, match=f"iq.gguf: tensor '{key}' has GGML type IQ4_NL, which is not supported yet"):
        gguf_nodes.load_unet_gguf(path)
    # a type id no GGML release has: found in the tensor's info (after its name, dims and sizes)
    path2 = tmp_path / "unknown.gguf"
    _tiny_gguf(path2, qt=T.Q8_0)
    data = bytearray(path2.read_bytes())
    name = b"input_blocks.1.1.proj_in.weight"
    at = data.rindex(len(name).to_bytes(8, "little") + name) + 8 + len(name)  # the last: the tensor infos
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    assert int.from_bytes(data[at:at + 4], "little") == int(T.Q8_0)
    data[at:at + 4] = (77).to_bytes(4, "little")
    path2.write_bytes(bytes(data))
    with pytest.raises(WeightFileError, match="unknown.gguf: a tensor of an unknown GGML type"):
        gguf_nodes.load_unet_gguf(path2)


def test_wrong_architecture_is_refused_naming_the_file(tmp_path):
    text = tmp_path / "llm.gguf"
    _tiny_gguf(text, arch="llama")
    with pytest.raises(ValueError, match="llm.gguf: GGUF architecture 'llama' is a text model"):
        gguf_nodes.load_unet_gguf(text)
    assert "is a text model" in gguf_nodes.unet_problem(text, "unet_name 'llm.gguf'")
    mislabelled = tmp_path / "said_flux.gguf"
    _tiny_gguf(mislabelled, arch="flux")
    with pytest.raises(ValueError, match="said_flux.gguf: the GGUF file says architecture 'flux', but its tensors "
                                         "are a sd model"):
        gguf_nodes.load_unet_gguf(mislabelled)
    no_arch = tmp_path / "sdcpp.gguf"  # stable-diffusion.cpp writes none: detected from the keys
    _tiny_gguf(no_arch, arch=None)
    assert gguf_nodes.load_unet_gguf(no_arch).kind == "sd1"
    pig = tmp_path / "pig.gguf"  # an older converter's placeholder: detected from the keys too
    _tiny_gguf(pig, arch="pig")
    assert gguf_nodes.load_unet_gguf(pig).kind == "sd1" and gguf_nodes.unet_problem(pig, "x") is None


# ---------------------------------------------------------------------------------------------
# the nodes as ComfyUI clients see them


def test_object_info_lists_the_pack_nodes_and_gguf_files(models, tmp_path):
    env = Env.from_args(models=models)
    info = api.default_registry().object_info(env)
    for name, title in (("UnetLoaderGGUF", "Unet Loader (GGUF)"), ("UnetLoaderGGUFAdvanced", "Unet Loader (GGUF/Advanced)"),
                        ("CLIPLoaderGGUF", "CLIPLoader (GGUF)"), ("DualCLIPLoaderGGUF", "DualCLIPLoader (GGUF)"),
                        ("TripleCLIPLoaderGGUF", "TripleCLIPLoader (GGUF)")):
        assert info[name]["category"] == "bootleg" and info[name]["display_name"] == title
    assert list(info["UnetLoaderGGUFAdvanced"]["input"]["required"]) == [
        "unet_name", "dequant_dtype", "patch_dtype", "patch_on_device"]
    assert list(info["CLIPLoaderGGUF"]["input"]["required"]) == ["clip_name", "type"]
    assert list(info["DualCLIPLoaderGGUF"]["input"]["required"]) == ["clip_name1", "clip_name2", "type"]
    assert list(info["TripleCLIPLoaderGGUF"]["input"]["required"]) == ["clip_name1", "clip_name2", "clip_name3"]
    unets = gguf_nodes.UNET_GGUF.options(env)
    assert "sd15_Q4_K.gguf" in unets and all(n.endswith(".gguf") for n in unets)
    assert info["UnetLoaderGGUF"]["input"]["required"]["unet_name"][0] == unets
    assert "clip_l_tiny.safetensors" in info["CLIPLoaderGGUF"]["input"]["required"]["clip_name"][0]
    assert "sd15_Q4_K.gguf" not in info["UNETLoader"]["input"]["required"]["unet_name"][0]  # core lists stay


def test_half_precision_dequant_dtype_is_refused_at_validation(models, tmp_path):
    g = api.Graph()
    m = g.add("UnetLoaderGGUFAdvanced", unet_name="sd15_Q8_0.gguf", dequant_dtype="float16", patch_dtype="default",
              patch_on_device=False)[0]
    g.add("PreviewAny", source=m)
    with pytest.raises(ValidationFailed, match="dequant_dtype 'float16': not supported yet"):
        api.run(g, models=models, output=tmp_path / "out")


def test_saving_a_gguf_model_writes_its_dequantised_weights(models):
    """ModelSave's state dict of a GGUF model: plain tensors, the quantised ones dequantised."""
    from mixgraph.nodes.weights.save import unet_state_dict
    from safetensors.torch import load_file

    handle = gguf_nodes.load_unet_gguf(models / "diffusion_models" / "sd15_Q8_0.gguf")
    sd = unet_state_dict(handle, F32)
    want = load_file(str(models / "diffusion_models" / "sd15_Q8_0.safetensors"))
    assert set(sd) == set(want) and not any(is_quantized(v) for v in sd.values())
    assert all(torch.equal(sd[k], want[k]) for k in want)


def test_lora_patched_gguf_weights_are_held_in_the_storage_dtype(models):
    """Under bf16 storage a LoRA-patched GGUF weight is merged on its f32 dequantised values and
    held dense in bf16 (as a patched plain weight is); the unpatched ones stay quantised."""
    from mixgraph.nodes.adapters.lora import load_lora_patches

    handle = gguf_nodes.load_unet_gguf(models / "diffusion_models" / "sd15_Q8_0.gguf")
    patched, _ = load_lora_patches(models / "loras" / "l.safetensors", handle, None, 0.8, 0.0)
    store = WeightStore()
    base = store.state_dict("unet", handle.source, handle.config, BF16)
    module = store.materialize("unet", patched.source, patched.config, BF16, patched.patches, UNetModel)
    sd = dict(module.named_parameters())
    key = "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"
    assert is_quantized(base[key]) and not is_quantized(sd[key]) and sd[key].dtype == BF16
    assert not torch.equal(sd[key].float(), base[key].dequantize().to(BF16).float())
    untouched = "input_blocks.1.1.transformer_blocks.0.attn1.to_k.weight"
    assert is_quantized(sd[untouched])


def test_memory_estimate_counts_the_quantised_blocks(models):
    """``mixgraph estimate`` follows UnetLoaderGGUF like UNETLoader and counts a GGUF model's
    quantised weights as the blocks the weight store holds."""
    from mixgraph.ui.estimate import estimate

    env = Env.from_args(models=str(models))
    held = {}
    for loader_type, name in (("UnetLoaderGGUF", "sd15_Q4_K.gguf"), ("UNETLoader", "sd15_Q4_K.safetensors")):
        g, ks = _sd_graph(loader_type, name)
        est = estimate(api.load(g.build(), api.default_registry()), api.default_registry(), env, "f32")
        held[loader_type] = est["nodes"][ks.node_id]["weights_bytes"]
    handle = gguf_nodes.load_unet_gguf(models / "diffusion_models" / "sd15_Q4_K.gguf")
    store = WeightStore()
    gguf_bytes = nbytes(store.state_dict("unet", handle.source, handle.config, F32))
    plain = loader.load_unet(models / "diffusion_models" / "sd15_Q4_K.safetensors")
    dense_bytes = nbytes(store.state_dict("unet", plain.source, plain.config, F32))
    assert held["UnetLoaderGGUF"] > 0
    assert held["UNETLoader"] - held["UnetLoaderGGUF"] == dense_bytes - gguf_bytes


def test_int8_policy_on_a_gguf_model_quantises_the_dequantised_weights(models):
    """An int8 policy builds its int8 layers from the dequantised weights: the GGUF model and its
    dequantised safetensors twin give the same output."""
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(2)
    x, ctx = torch.randn(1, cfg.in_channels, 8, 8, generator=g), torch.randn(1, 4, cfg.context_dim, generator=g)
    outs = []
    for handle in (gguf_nodes.load_unet_gguf(models / "diffusion_models" / "sd15_Q8_0.gguf"),
                   loader.load_unet(models / "diffusion_models" / "sd15_Q8_0.safetensors")):
        module = WeightStore().materialize("unet", handle.source, handle.config, F32, (), UNetModel)
        with torch.no_grad():
            outs.append(apply_precision(module, Policy(int8=True))(x, torch.tensor([300.0]), ctx))
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])


def test_bypass_lora_on_a_gguf_model_keeps_the_weights_quantised(models):
    """LoraLoaderBypassModelOnly adds the LoRA in the forward pass: on a GGUF model it samples as
    on the dequantised twin, close to the merged LoRA, and no weight is dequantised to hold."""
    def graph(loader_type, unet, bypass):
        lora = "LoraLoaderBypassModelOnly" if bypass else "LoraLoaderModelOnly"
        return _samples(models, _sd_graph(loader_type, unet, lora))

    name = "sd15_Q8_0"
    got = graph("UnetLoaderGGUF", f"{name}.gguf", True)
    assert torch.equal(got, graph("UNETLoader", f"{name}.safetensors", True))
    merged = graph("UnetLoaderGGUF", f"{name}.gguf", False)
    torch.testing.assert_close(got, merged, rtol=1e-4, atol=1e-4)
    from mixgraph.graph.precision import parse_spec
    from mixgraph.nodes.adapters.lora import load_lora
    from mixgraph.nodes.adapters.lora_bypass import bypass_patches

    handle = gguf_nodes.load_unet_gguf(models / "diffusion_models" / f"{name}.gguf")
    lora = load_lora(models / "loras" / "l.safetensors", handle.weight_shapes(), None, unet_names=handle.lora_names())
    unet_patches, _ = bypass_patches(lora, 0.8, 0.0, False)
    with torch.inference_mode():  # as every consumer materializes (the store's entries are inference tensors)
        module = handle.with_patches(unet_patches).runner(parse_spec("f32")).model
    key = "input_blocks.1.1.transformer_blocks.0.attn1.to_q"
    assert is_quantized(module.get_submodule(key).weight)
