"""Detection and loading of every supported layout, safe file handling, and the weight store."""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.encoders.clip import open_clip_to_hf
from mixgraph.nodes.models.handles import ModelHandle
from mixgraph.nodes.weights.safetensors_io import WeightFileError, WeightSource, inspect_file
from mixgraph.nodes.weights.store import WeightStore
from mixgraph.nodes.families.sd.unet import UNetModel
from mixgraph.nodes.vae.vae import AutoencoderKL
from tests.fixtures import checkpoints as C
from tests.fixtures.tiny_clip import tiny_clip_l_state_dict, tiny_open_clip_state_dict
from tests.fixtures.tiny_unet import tiny_unet_config, tiny_unet_state_dict

F32 = parse_spec("f32")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return {
        "sd15": C.write_sd15(d / "sd15.safetensors", ema=True),
        "inpaint": C.write_sd15(d / "inpaint.safetensors", inpaint=True),
        "instruct": C.write_sd15(d / "instruct.safetensors", instruct=True),
        "sd2v": C.write_sd2(d / "sd2v.safetensors", v_prediction=True),
        "sd2e": C.write_sd2(d / "sd2e.safetensors", v_prediction=False),
        "sdxl": C.write_sdxl(d / "sdxl.safetensors"),
        "sdxl_v": C.write_sdxl(d / "sdxl_v.safetensors", v_pred=True, ztsnr=True),
        "refiner": C.write_sdxl_refiner(d / "refiner.safetensors"),
        "diffusers": C.write_diffusers_folder(d / "diffusers_sd15", "sd15", v_prediction=True),
        "dir": d,
    }


def _weights(store: WeightStore, kind, handle_source, config, build, dtype=torch.float32):
    return store.materialize(kind, handle_source, config, dtype, (), build).state_dict()


def _assert_same(got: dict, want: dict):
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))[:5]
    for k, v in want.items():
        assert torch.equal(got[k].reshape(v.shape).float(), v.float()), k


# ---------------------------------------------------------------------------------------------
# single-file checkpoints


def test_loader_sd15_detected_ema_ignored(files):
    model, clip, vae = loader.load_checkpoint(files["sd15"])
    assert (model.kind, model.prediction, model.zsnr) == ("sd1", "eps", False)
    assert model.config == tiny_unet_config("sd15")
    assert model.latent_format.scale_factor == 0.18215
    assert clip.kind == "sd1" and clip.names == ("clip_l",)
    clip_l = clip.encoder("clip_l")
    assert clip_l.source.prefix == "cond_stage_model.transformer." and clip_l.config.activation == "quick_gelu"
    assert (clip_l.tokenizer, clip_l.role, clip_l.rule.pad_token, clip_l.rule.default_layer) == ("clip", "text", 49407, None)
    assert vae.config == C.TINY_VAE_CONFIG
    store = WeightStore()
    # the file also holds model_ema.* copies with other values: the live weights are loaded
    _assert_same(_weights(store, "unet", model.source, model.config, UNetModel), tiny_unet_state_dict("sd15", 0))
    _assert_same(_weights(store, "vae", vae.source, vae.config, AutoencoderKL), C.tiny_vae_state_dict(1))


@pytest.mark.parametrize("name,channels", [("inpaint", 9), ("instruct", 8)])
def test_loader_sd15_inpaint_and_instruct_channels(files, name, channels):
    model, _, _ = loader.load_checkpoint(files[name])
    assert model.kind == "sd1" and model.config.in_channels == channels
    assert model.runner(F32).in_channels == channels


def test_loader_sd2_v_prediction_detected_and_overridable(files):
    v, clip, _ = loader.load_checkpoint(files["sd2v"])
    e, _, _ = loader.load_checkpoint(files["sd2e"])
    assert (v.kind, v.prediction) == ("sd2", "v_prediction")
    assert (e.kind, e.prediction) == ("sd2", "eps")
    assert clip.kind == "sd2" and clip.encoder("clip_h").source.layout == "open_clip" and clip.encoder("clip_h").config.width == 48
    forced, _, _ = loader.load_checkpoint(files["sd2e"], prediction="v_prediction")
    assert forced.prediction == "v_prediction"
    assert e.with_sampling("v_prediction", True).runner(F32).zsnr is True


def test_loader_sdxl_encoders_and_markers(files):
    model, clip, _ = loader.load_checkpoint(files["sdxl"])
    assert (model.kind, model.prediction, model.latent_format.scale_factor) == ("sdxl", "eps", 0.13025)
    assert clip.names == ("clip_l", "clip_g")  # the order their features join
    clip_l, clip_g = clip.encoders
    assert clip_l.source.prefix == "conditioner.embedders.0.transformer." and clip_l.source.layout == "hf_clip"
    assert clip_g.source.prefix == "conditioner.embedders.1.model." and clip_g.source.layout == "open_clip"
    assert not clip_l.rule.pooled and clip_g.rule.pooled and clip_l.rule.default_layer == clip_g.rule.default_layer == -2
    store = WeightStore()
    want = open_clip_to_hf(tiny_open_clip_state_dict(3, width=32, proj=C.TINY_POOLED), "")
    from mixgraph.nodes.encoders.clip import CLIPTextModel

    _assert_same(_weights(store, "clip_g", clip_g.source, clip_g.config, CLIPTextModel), want)
    v, _, _ = loader.load_checkpoint(files["sdxl_v"])
    assert (v.prediction, v.zsnr) == ("v_prediction", True)


def test_loader_sdxl_refiner_clip_g_only(files):
    model, clip, _ = loader.load_checkpoint(files["refiner"])
    assert model.kind == "sdxl_refiner" and clip.kind == "sdxl_refiner"
    assert clip.names == ("clip_g",) and clip.encoder("clip_g").source.prefix == "conditioner.embedders.0.model."


def test_loader_end_to_end_sdxl_encode_adm_unet(files):
    model, clip, vae = loader.load_checkpoint(files["sdxl"])
    (cond,) = clip.encode("a cat", F32)
    assert cond.cross_attn.shape == (1, 77, 64) and cond.pooled.shape == (1, C.TINY_POOLED)
    runner = model.runner(F32)
    y = runner.adm(cond, (8, 12))
    from mixgraph.nodes.families.sd.unet import sdxl_adm

    torch.testing.assert_close(y, sdxl_adm(cond.pooled, 96.0, 64.0, 0, 0, 96.0, 64.0))
    out = runner.unet(torch.zeros(1, 4, 8, 12), torch.tensor([10.0]), cond.cross_attn, y)
    assert out.shape == (1, 4, 8, 12) and out.dtype == torch.float32


def test_loader_refiner_adm_aesthetic_defaults(files):
    model, clip, _ = loader.load_checkpoint(files["refiner"])
    (cond,) = clip.encode("x", F32)
    runner = model.runner(F32)
    from mixgraph.nodes.families.sd.unet import sdxl_refiner_adm

    torch.testing.assert_close(runner.adm(cond, (4, 4)), sdxl_refiner_adm(cond.pooled, 32.0, 32.0, 0, 0, 6.0))
    torch.testing.assert_close(runner.adm(cond, (4, 4), negative=True), sdxl_refiner_adm(cond.pooled, 32.0, 32.0, 0, 0, 2.5))


# ---------------------------------------------------------------------------------------------
# diffusers folders and standalone files


def test_loader_diffusers_folder_converts_to_ldm(files):
    model, clip, vae = loader.load_checkpoint(files["diffusers"])
    assert model.kind == "sd1" and model.prediction == "v_prediction"  # from scheduler_config.json
    assert model.source.layout == "diffusers_unet" and vae.source.layout == "diffusers_vae"
    assert model.config == tiny_unet_config("sd15")
    store = WeightStore()
    _assert_same(_weights(store, "unet", model.source, model.config, UNetModel), tiny_unet_state_dict("sd15", 0))
    _assert_same(_weights(store, "vae", vae.source, vae.config, AutoencoderKL), C.tiny_vae_state_dict(1))
    assert clip.kind == "sd1" and clip.encoder("clip_l").source.path.endswith("text_encoder/model.safetensors")


@pytest.mark.parametrize("layout,prefix", [("ldm", ""), ("ldm", "first_stage_model."), ("diffusers", "")])
def test_loader_standalone_vae(files, layout, prefix):
    path = files["dir"] / f"vae_{layout}_{prefix or 'bare'}.safetensors"
    want = C.write_vae(path, layout=layout, seed=5, prefix=prefix)
    vae = loader.load_vae(path)
    assert vae.config == C.TINY_VAE_CONFIG and vae.latent_channels == 4
    _assert_same(_weights(WeightStore(), "vae", vae.source, vae.config, AutoencoderKL), want)


@pytest.mark.parametrize("layout,prefixed", [("ldm", False), ("ldm", True), ("diffusers", False)])
def test_loader_standalone_unet(files, layout, prefixed):
    path = files["dir"] / f"unet_{layout}_{prefixed}.safetensors"
    want = C.write_unet(path, "sdxl", layout=layout, prefixed=prefixed, seed=4)
    model = loader.load_unet(path, weight_dtype="fp8_e4m3fn")
    assert model.kind == "sdxl" and model.config == tiny_unet_config("sdxl")
    assert model.weight_dtype == torch.float8_e4m3fn
    _assert_same(_weights(WeightStore(), "unet", model.source, model.config, UNetModel), want)


def test_loader_standalone_text_encoders(files):
    d = files["dir"]
    C.write_clip_l(d / "clip_l.safetensors", width=32)
    C.write_clip_g(d / "clip_g.safetensors", width=64, layout="open_clip")
    single = loader.load_clip([d / "clip_l.safetensors"], "stable_diffusion")
    assert single.kind == "sd1" and single.encoder("clip_l").source.layout == "hf_clip"
    dual = loader.load_clip([d / "clip_g.safetensors", d / "clip_l.safetensors"], "sdxl")  # any order
    assert dual.kind == "sdxl" and dual.names == ("clip_l", "clip_g")
    assert dual.encoder("clip_l").source.path.endswith("clip_l.safetensors")
    assert dual.encoder("clip_g").config.width == 64 and dual.encoder("clip_g").source.layout == "open_clip"
    (cond,) = dual.encode("hello", F32)
    assert cond.cross_attn.shape == (1, 77, 96) and cond.pooled.shape == (1, C.TINY_POOLED)


def test_loader_unknown_file_says_what_it_found(files):
    path = files["dir"] / "other.safetensors"
    save_file({"backbone.layer1.weight": torch.zeros(2, 2), "backbone.layer2.weight": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match=r"not a Stable Diffusion checkpoint.*backbone\.layer1"):
        loader.load_checkpoint(path)
    with pytest.raises(ValueError, match="not a KL VAE"):
        loader.load_vae(path)


# ---------------------------------------------------------------------------------------------
# file safety


def test_truncated_safetensors_names_file_and_problem(files):
    data = files["sd15"].read_bytes()
    bad = files["dir"] / "truncated.safetensors"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightFileError, match=r"truncated\.safetensors: truncated safetensors file.*declares"):
        loader.load_checkpoint(bad)
    tiny = files["dir"] / "tiny.safetensors"
    tiny.write_bytes(data[:5])
    with pytest.raises(WeightFileError, match="truncated"):
        inspect_file(tiny)
    garbage = files["dir"] / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\0" * 64)
    with pytest.raises(WeightFileError, match="corrupt safetensors header"):
        inspect_file(garbage)


def test_pickle_checkpoint_loads_weights_only_with_warning(files):
    path = files["dir"] / "old.ckpt"
    torch.save({"state_dict": C.sd15_state_dict(seed=0), "global_step": 10}, path)
    with pytest.warns(UserWarning, match="weights_only=True"):
        model, clip, vae = loader.load_checkpoint(path)
    assert model.kind == "sd1"
    _assert_same(_weights(WeightStore(), "unet", model.source, model.config, UNetModel), tiny_unet_state_dict("sd15", 0))


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickle_with_code_is_refused(files):
    path = files["dir"] / "evil.ckpt"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "payload": _Evil()}, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(WeightFileError, match="weights_only=True"):
            loader.load_checkpoint(path)


# ---------------------------------------------------------------------------------------------
# the weight store


def test_store_bf16_storage_without_f32_copy(files):
    model, _, _ = loader.load_checkpoint(files["sd15"])
    store = WeightStore()
    m = store.materialize("unet", model.source, model.config, torch.bfloat16, (), UNetModel)
    dtypes = {n: p.dtype for n, p in m.state_dict().items()}
    kept = {n for n in dtypes if n.startswith(("time_embed", "label_emb"))}  # UNetModel.keep_f32
    assert kept and all(dtypes[n] == torch.float32 for n in kept)
    assert all(d == torch.bfloat16 for n, d in dtypes.items() if n not in kept)
    f32_bytes = sum(v.numel() * 4 for v in tiny_unet_state_dict("sd15").values())
    assert store.stats.bytes_read < 0.6 * f32_bytes  # read straight into bf16


def test_store_reads_file_once_per_source_and_dtype(files):
    model, _, _ = loader.load_checkpoint(files["sd15"])
    store = WeightStore()
    src, cfg = model.source, model.config
    a = store.materialize("unet", src, cfg, torch.float32, (), UNetModel)
    b = store.materialize("unet", src, cfg, torch.float32, (), UNetModel)
    assert (store.stats.loads, store.stats.hits) == (1, 1)
    assert a is not b and a.out[2].weight.data_ptr() == b.out[2].weight.data_ptr()  # shared tensors
    # bf16 after f32: derived from the exact f32 copy in memory, no second disk read
    c = store.materialize("unet", src, cfg, torch.bfloat16, (), UNetModel)
    assert (store.stats.loads, store.stats.derived) == (1, 1)
    assert torch.equal(c.out[2].weight, a.out[2].weight.to(torch.bfloat16))
    # a handle loaded again (same file, same identity) hits the cache
    again, _, _ = loader.load_checkpoint(files["sd15"])
    store.materialize("unet", again.source, again.config, torch.bfloat16, (), UNetModel)
    assert store.stats.loads == 1 and store.stats.reads_by_source[src.identity] == 1


def test_store_f32_after_bf16_rereads_the_file(files):
    model, _, _ = loader.load_checkpoint(files["sd15"])
    store = WeightStore()
    store.materialize("unet", model.source, model.config, torch.bfloat16, (), UNetModel)
    m = store.materialize("unet", model.source, model.config, torch.float32, (), UNetModel)
    assert store.stats.loads == 2 and store.stats.derived == 0  # bf16 cannot give back f32 values
    assert torch.equal(m.out[2].weight, tiny_unet_state_dict("sd15")["out.2.weight"])


def test_store_lru_budget_evicts_oldest():
    sd1, sd2 = C.tiny_vae_state_dict(0), C.tiny_vae_state_dict(1)
    size = sum(v.numel() * 4 for v in sd1.values())
    store = WeightStore(budget_bytes=int(size * 1.5))
    s1, s2 = WeightSource.from_state_dict(sd1), WeightSource.from_state_dict(sd2)
    store.materialize("vae", s1, C.TINY_VAE_CONFIG, torch.float32, (), AutoencoderKL)
    store.materialize("vae", s2, C.TINY_VAE_CONFIG, torch.float32, (), AutoencoderKL)
    assert store.stats.evictions == 1 and store.stats.bytes == size
    store.materialize("vae", s2, C.TINY_VAE_CONFIG, torch.float32, (), AutoencoderKL)
    assert store.stats.hits == 1
    store.materialize("vae", s1, C.TINY_VAE_CONFIG, torch.float32, (), AutoencoderKL)
    assert store.stats.loads == 3
    store.clear()
    assert store.stats.bytes == 0


def test_store_merges_lora_patch_in_f32():
    from mixgraph.nodes.adapters.lora import LoraAdapter, LoraFile, LoraPatch

    sd = tiny_unet_state_dict("sd15")
    key = "input_blocks.1.1.proj_in.weight"  # [32, 32, 1, 1] conv
    gen = torch.Generator().manual_seed(9)
    up, down = torch.randn(32, 2, generator=gen), torch.randn(2, 32, generator=gen)
    lora = LoraFile("test-lora", "test", {"unet": {key: LoraAdapter(up=up, down=down, alpha=1.0)}})
    store = WeightStore()
    src = WeightSource.from_state_dict(sd)
    cfg = tiny_unet_config("sd15")
    m = store.materialize("unet", src, cfg, torch.float32, (LoraPatch(lora, 0.5, "unet"),), UNetModel)
    want = sd[key] + 0.5 * (1.0 / 2) * (up @ down).reshape(32, 32, 1, 1)
    torch.testing.assert_close(m.state_dict()[key], want)
    assert torch.equal(m.state_dict()["out.2.weight"], sd["out.2.weight"])
    assert store.stats.patched == 1 and store.stats.loads == 1


def test_handles_are_hashable_and_equal_per_file(files):
    a, ca, va = loader.load_checkpoint(files["sd15"])
    b, cb, vb = loader.load_checkpoint(files["sd15"])
    assert a == b and hash(a) == hash(b) and ca == cb and va == vb
    pinned = a.with_precision(parse_spec("bf16"))
    assert pinned != a and isinstance(pinned, ModelHandle) and hash(pinned)
    assert ca.with_layer(-2).layer_idx == -2 and ca.layer_idx is None


def test_loader_controlnet_ldm_file(files):
    import dataclasses

    from mixgraph.nodes.adapters.controlnet import ControlNetConfig, ControlNetModel

    cfg = ControlNetConfig(unet=dataclasses.replace(tiny_unet_config("sd15"), transformer_depth_output=()))
    sd = C.random_state_dict(C.module_shapes(lambda: ControlNetModel(cfg)), 0)
    path = files["dir"] / "control.safetensors"
    save_file({"control_model." + k: v for k, v in sd.items()}, str(path))
    handle = loader.load_controlnet(path)
    assert handle.config == cfg and hash(handle)
    runner = handle.runner(F32)
    _assert_same(runner.state_dict(), sd)
    outs = runner(torch.zeros(1, 4, 8, 8), torch.zeros(1, 3, 64, 64), torch.tensor([1.0]), torch.zeros(1, 77, 32))
    assert len(outs) == 5 and outs[-1].dtype == torch.float32
