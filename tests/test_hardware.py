"""Hardware detection, the preset decision table, `auto` per model type, and the memory
estimate. Detection is fed fake flag sets; no test assumes this machine's CPU."""

import asyncio
import contextlib
import json

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from torch import nn

from mixgraph.graph.env import Env
from mixgraph.graph.precision import (CPU_FLAGS_ENV, DeviceCaps, PrecisionError, Resolver,
                                      cpu_caps_from_flags, cpu_flags, emulation_warning,
                                      hardware_section, parse_precision_arg, parse_spec,
                                      preset_spec, preset_table)
from mixgraph.graph.prompt import PrecisionConfig, Region
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.weights.cast import apply_precision, precision_bytes, weight_bytes
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
from mixgraph.ui import api
from mixgraph.ui.cli import main
from mixgraph.ui.estimate import estimate, refusal, trace_peak
from tests import toy_nodes as toy

SAPPHIRE = cpu_caps_from_flags({"avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile",
                                "avx512_vnni"})
ZEN4 = cpu_caps_from_flags({"avx512f", "avx512_bf16", "avx512_vnni"})
ZEN3 = cpu_caps_from_flags({"avx2", "fma"})
GRANITE = cpu_caps_from_flags({"avx512_bf16", "amx_bf16", "amx_fp16", "amx_int8"})
AMPERE = DeviceCaps("cuda", native_bf16=True, native_f16=True, native_int8=True)
TURING = DeviceCaps("cuda", native_bf16=False, native_f16=True, native_int8=True)


# --- detection --------------------------------------------------------------------------------

def test_cpu_flags_reads_the_flags_line_and_the_env_override():
    text = "processor\t: 0\nflags\t\t: fpu sse avx512_bf16 avx512_vnni\nbogomips\t: 1\n"
    assert {"avx512_bf16", "avx512_vnni", "fpu"} <= cpu_flags(text, env={})
    assert cpu_flags(text, env={CPU_FLAGS_ENV: "avx2, FMA"}) == {"avx2", "fma"}
    assert cpu_flags("Features\t: fp asimd bf16\n", env={}) >= {"bf16", "asimd"}


def test_cpu_caps_decision_table_on_synthetic_flag_sets():
    assert (ZEN4.native_bf16, ZEN4.native_f16, ZEN4.native_int8) == (True, False, True)
    assert (ZEN3.native_bf16, ZEN3.native_f16, ZEN3.native_int8) == (False, False, False)
    assert (GRANITE.native_bf16, GRANITE.native_f16, GRANITE.native_int8) == (True, True, True)
    assert cpu_caps_from_flags({"avx_vnni"}).native_int8 and not cpu_caps_from_flags({"avx_vnni"}).native_bf16
    no_onednn = cpu_caps_from_flags({"avx512_bf16"}, onednn=False)
    assert not no_onednn.native_bf16 and "oneDNN" in no_onednn.why
    assert "avx512_bf16" in ZEN4.why and "no avx512_bf16" in ZEN3.why


def test_hardware_section_names_native_arithmetic_and_presets():
    sec = hardware_section("cpu")
    assert {"native_bf16", "native_f16", "native_int8", "why", "auto", "presets"} <= sec.keys()
    assert set(sec["presets"]) == {"quality", "balanced", "memory", "fast"}
    assert sec["auto"] == sec["presets"]["balanced"]


# --- the preset decision table ------------------------------------------------------------------

def test_auto_on_native_bf16_cpu_is_bf16_unet_f32_vae_and_text():
    table = preset_table(caps=ZEN4)["balanced"]
    assert table == {"MODEL": "bf16", "CONTROL_NET": "bf16", "CLIP": "f32", "VAE": "f32",
                     "CLIP.text_large": "bf16:f32",  # T5-XXL & co: bf16 storage, f32 arithmetic
                     "MODEL.sd_unet": "bf16"}  # the SD UNet's role (tests/test_int8_onednn.py)


def test_auto_without_native_half_is_f32_everywhere():
    """f32 arithmetic everywhere; the large text encoders still store bf16 (memory, not speed)."""
    for preset in ("balanced", "fast"):
        table = preset_table(caps=ZEN3)[preset]
        assert {v for k, v in table.items() if "." not in k} == {"f32"}
        assert table["CLIP.text_large"] == "bf16:f32"


def test_auto_on_cuda_is_as_before():
    assert set(preset_table(caps=AMPERE)["balanced"].values()) == {"bf16"}
    assert set(preset_table(caps=TURING)["balanced"].values()) == {"f16+upcast"}


def test_presets_quality_memory_fast():
    for caps in (ZEN3, ZEN4, AMPERE, TURING, GRANITE):
        assert set(preset_table(caps=caps)["quality"].values()) == {"f32"}
        mem = preset_table(caps=caps)["memory"]
        large = parse_spec(mem.pop("CLIP.text_large"))  # billions of weights: fp8 storage
        assert large.storage == torch.float8_e4m3fn and large.compute == torch.float32
        assert all(parse_spec(s).storage in (torch.bfloat16, torch.float16) for s in mem.values())
    assert preset_table(caps=ZEN3)["memory"]["MODEL"] == "bf16:f32"
    assert preset_table(caps=ZEN4)["memory"] == {"MODEL": "bf16", "CONTROL_NET": "bf16",
                                                 "CLIP": "bf16:f32", "VAE": "bf16:f32",
                                                 "CLIP.text_large": "fp8_e4m3fn:f32",
                                                 "MODEL.sd_unet": "bf16"}
    assert preset_spec("fast", "VAE", AMPERE) == "f16"        # the NaN guard is its fallback
    assert preset_spec("fast", "VAE", ZEN4) == "bf16"
    assert preset_spec("fast", "VAE", GRANITE) == "f16"
    assert preset_spec("fast", "CLIP", TURING) == "f16+upcast"


def test_emulation_warning_only_where_emulated_and_says_what_is_lost():
    msg = emulation_warning(parse_spec("bf16"), "cpu", ZEN3)
    assert "emulated" in msg and "slower than f32" in msg and "memory" in msg and "\n" not in msg
    assert emulation_warning(parse_spec("bf16"), "cpu", ZEN4) is None
    assert emulation_warning(parse_spec("f16"), "cpu", ZEN4) is not None
    assert emulation_warning(parse_spec("f16"), "cpu", GRANITE) is None
    assert emulation_warning(parse_spec("int8"), "cpu", ZEN3) is not None
    assert emulation_warning(parse_spec("int8"), "cpu", ZEN4) is None
    assert emulation_warning(parse_spec("bf16:f32"), "cpu", ZEN3) is None


# --- presets in the grammar and the resolver ------------------------------------------------------

def test_parse_spec_resolves_presets_per_socket():
    assert parse_spec("quality", "cpu", "VAE").spec == "f32"
    assert parse_spec("memory", "cpu", "VAE").spec == "bf16:f32"
    assert parse_spec("auto", "cpu", "MODEL") == parse_spec("balanced", "cpu", "MODEL")
    default, types = parse_precision_arg("fast,VAE=memory")
    assert default == "fast" and types["VAE"].spec == "bf16:f32"
    with pytest.raises(PrecisionError, match="preset"):
        parse_spec("speedy")


def test_resolver_auto_per_socket_type_on_native_bf16_cpu():
    r = Resolver(None, caps=ZEN4)
    assert [r.policy("1", s).spec for s in ("MODEL", "CONTROL_NET", "CLIP", "VAE")] == \
        ["bf16", "bf16", "f32", "f32"]
    assert r.warnings == [] and r.describe()["preset_types"]["VAE"] == "f32"
    assert r.policy("1", "MODEL").is_half            # the NaN guard watches it


def test_resolver_preset_regions_and_type_defaults():
    cfg = PrecisionConfig("quality", (Region("fast part", frozenset({"2"}), "fast"),))
    r = Resolver(cfg, {"CLIP": "memory"}, caps=ZEN4)
    assert r.policy("1", "MODEL").spec == "f32" and r.policy("1", "CLIP").spec == "bf16:f32"
    assert r.policy("2", "MODEL").spec == "bf16" and r.policy("2", "VAE").spec == "bf16"
    r = Resolver(cfg, caps=ZEN3)
    assert r.policy("2", "MODEL").spec == "f32" and r.warnings == []


def test_resolver_emulated_spec_warns_on_emulating_cpu_only():
    assert len(Resolver(PrecisionConfig("bf16"), caps=ZEN3).warnings) == 1
    assert Resolver(PrecisionConfig("bf16"), caps=ZEN4).warnings == []


def test_ui_group_tag_accepts_presets():
    ui = {"nodes": [{"id": 1, "type": "Const", "pos": [10, 10], "size": [50, 50],
                     "widgets_values": [2], "mode": 0, "inputs": [], "outputs": []}],
          "links": [], "groups": [{"title": "Sampling [memory]", "bounding": [0, 0, 200, 200]}]}
    wf = load_workflow(ui, toy.registry())
    assert [r.precision for r in wf.precision.regions] == ["memory"]


# --- weights and activations ------------------------------------------------------------------

def test_precision_bytes_match_the_applied_copy():
    model = nn.Sequential(nn.Linear(64, 128), nn.GroupNorm(4, 128), nn.Conv2d(128, 8, 3))
    for spec in ("f32", "bf16", "bf16:f32"):
        held, _ = precision_bytes(model, parse_spec(spec))
        assert held == weight_bytes(apply_precision(model, parse_spec(spec))), spec
    # fp8: the store holds every tensor in fp8; each use adds the vectors in the compute dtype
    held, per_use = precision_bytes(model, parse_spec("fp8_e4m3fn:bf16"))
    vectors = 128 + 2 * 128 + 8
    assert per_use == 2 * vectors
    assert held - vectors + per_use == weight_bytes(apply_precision(model, parse_spec("fp8_e4m3fn:bf16")))
    held, per_use = precision_bytes(model, parse_spec("int8"))
    # int8 Linear [64, 128] and int8 conv [128*3*3, 8], each with its f32 per-output scales
    assert held == weight_bytes(model) and per_use == 64 * 128 + 128 * 4 + 128 * 9 * 8 + 8 * 4


def test_trace_peak_counts_live_activations_only():
    def build():
        return nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10))
    peak = trace_peak(build, parse_spec("f32"), lambda m: m(torch.empty(256, 1000)))
    assert peak == pytest.approx(3 * 256 * 1000 * 4, rel=0.05)   # the input, Linear and ReLU out
    half = trace_peak(build, parse_spec("bf16"), lambda m: m(torch.empty(256, 1000)))
    # the f32 input, its bf16 copy at the entry, then bf16 activations
    assert half == pytest.approx(256 * 1000 * (4 + 3 * 2), rel=0.05)


# --- the estimate on a tiny SD1.5 checkpoint ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hw")
    write_sd15_checkpoint(root / "models" / "checkpoints" / "sd15.safetensors", "tiny")
    (root / "input").mkdir()
    return root


def _wf(size=64, batch=1):
    wf = api.load("workflows/txt2img_sd15.json")
    return api.set_inputs(wf, {"5.width": size, "5.height": size, "5.batch_size": batch, "3.steps": 1})


def test_estimate_per_node_and_scales_with_size_and_batch(tiny):
    reg, env = api.default_registry(), Env.from_args(models=str(tiny / "models"))
    small = estimate(_wf(64), reg, env)
    big = estimate(_wf(128, 2), reg, env)
    assert small["peak_bytes"] > small["weights_bytes"] > 0
    assert {"3", "8"} <= small["nodes"].keys() and small["nodes"]["3"]["policy"] == {"MODEL": "f32"}
    act = lambda e, n: e["nodes"][n]["activation_bytes"]   # noqa: E731
    assert act(big, "8") == pytest.approx(8 * act(small, "8"), rel=0.1)   # 4x pixels, 2x batch
    assert act(big, "3") > 4 * act(small, "3")
    assert big["weights_bytes"] == small["weights_bytes"]


def test_estimate_storage_dtype_halves_weights(tiny):
    reg, env = api.default_registry(), Env.from_args(models=str(tiny / "models"))
    f32 = estimate(_wf(), reg, env, "f32")["weights_bytes"]
    bf16 = estimate(_wf(), reg, env, "bf16:f32")["weights_bytes"]
    assert bf16 == pytest.approx(f32 / 2, rel=0.02)
    per_type = estimate(_wf(), reg, env, "f32,VAE=bf16:f32")
    assert per_type["nodes"]["8"]["policy"] == {"VAE": "bf16:f32"}


def test_refusal_names_the_estimate_and_a_preset(tiny):
    reg, env = api.default_registry(), Env.from_args(models=str(tiny / "models"))
    wf = _wf()
    assert refusal(wf, reg, env, available=1 << 40) is None
    msg = refusal(wf, reg, env, available=-(1 << 30))
    assert "not enough memory" in msg and "GiB" in msg and "no preset fits" in msg


def test_cli_estimate_json_and_validate_memory(tiny, tmp_path, capsys):
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(api.to_api_json(_wf()) if hasattr(api, "to_api_json") else
                               json.loads(open("workflows/txt2img_sd15.json").read())))
    args = ["--models", str(tiny / "models"), "--input", str(tiny / "input")]
    assert main(["estimate", str(path), "--json", "--set", "5.width=64", "--set", "5.height=64",
                 *args]) in (0, 1)
    body = json.loads(capsys.readouterr().out)
    assert body["peak_bytes"] > 0 and set(body["presets"]) == {"quality", "balanced", "memory", "fast"}
    assert body["nodes"]["8"]["size"] == [1, 64, 64]
    assert main(["estimate", str(path), "--precision", "nonsense", *args]) == 2
    capsys.readouterr()
    assert main(["validate", str(path), "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["peak_bytes"] > 0
    assert main(["nodes", "--system"]) == 0
    assert "native_bf16" in capsys.readouterr().out


def test_server_system_stats_and_estimate_endpoint(tiny, tmp_path):
    from mixgraph.ui.server.server import create_app

    env = Env.from_args(models=str(tiny / "models"), input=str(tiny / "input"),
                        output=str(tmp_path / "out"))
    prompt = json.loads(open("workflows/txt2img_sd15.json").read())
    prompt["5"]["inputs"].update(width=64, height=64)

    async def body():
        app = create_app(env, user_dir=tmp_path / "user" / "default", unload_hooks=())
        async with TestServer(app) as server, TestClient(server) as c:
            stats = await (await c.get("/system_stats")).json()
            assert "native_bf16" in stats["devices"][0]["mixgraph_precision"]
            r = await c.post("/api/mixgraph/estimate", json={"prompt": prompt, "precision": "memory"})
            est = await r.json()
            assert r.status == 200 and est["peak_bytes"] > 0 and est["precision"] == "memory"
            r = await c.post("/mixgraph/estimate", json={"prompt": {"1": {"class_type": "Nope",
                                                                          "inputs": {}}}})
            assert r.status == 400
    asyncio.run(body())


def test_server_refuses_a_prompt_that_cannot_fit_and_keeps_serving(tiny):
    """POST /prompt with a batch far beyond this machine's memory: ComfyUI's error body with
    type `insufficient_memory`, naming the estimate; nothing is queued, and a prompt that fits
    is still accepted."""
    from mixgraph.ui.server.limits import Limits
    from mixgraph.ui.server.server import create_app

    env = Env.from_args(models=str(tiny / "models"), input=str(tiny / "input"),
                        output=str(tiny / "output"), temp=str(tiny / "temp"))
    prompt = json.loads(open("workflows/txt2img_sd15.json").read())
    prompt["5"]["inputs"].update(width=8192, height=8192, batch_size=4096)

    async def main_():       # the batch-size limit (tests/test_api_bounds.py) would refuse first
        app = create_app(env, user_dir=tiny / "user", limits=Limits(max_batch_pixels=1 << 50))
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/prompt", json={"prompt": prompt})
            body = await r.json()
            assert r.status == 400, body
            assert body["error"]["type"] == "insufficient_memory", body
            assert "GiB" in body["error"]["message"], body
            queue = await (await c.get("/queue")).json()
            assert queue["queue_running"] == [] and queue["queue_pending"] == []
            small = json.loads(open("workflows/txt2img_sd15.json").read())
            small["5"]["inputs"].update(width=64, height=64)
            small["3"]["inputs"].update(steps=1)
            r = await c.post("/prompt", json={"prompt": small})
            assert r.status == 200, await r.json()

    asyncio.run(main_())
