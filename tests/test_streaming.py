"""Weight streaming within the memory budget (nodes/weights/streaming.py, nodes/models/memory_budget.py):
a model over the budget streams its blocks and gives exactly the resident run's output, within the
budget, with the cost reported; the CLI flag, the estimate and its refusal follow the budget."""

from __future__ import annotations

import json

import pytest
import torch

from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.graph.precision import Policy
from mixgraph.nodes.adapters.lora import LoraPatch, load_lora
from mixgraph.nodes.families.flux.model import Flux
from mixgraph.nodes.families.sd.unet import UNetModel
from mixgraph.nodes.models import memory_budget
from mixgraph.nodes.weights import store, streaming
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.weights.synthetic import write_header_only
from mixgraph.ui import api
from mixgraph.ui.cli import main
from tests.fixtures.checkpoints import save_state_dict, write_sd15, write_unet
from tests.fixtures.tiny_lora import lora_file, unet_file_names
from tests.fixtures.tiny_unet import tiny_unet_config
from tests.flux_fixtures import TINY, flux_state_dict

GIB = memory_budget.GIB


@pytest.fixture(autouse=True)
def _fresh_budget(fresh_memory_budget):
    yield


def _budget_for(nbytes: int) -> float:
    """A budget (GiB) whose weights allowance is `nbytes`."""
    return nbytes / (1 - streaming.WORK_SHARE) / GIB


def _run(build, config, source, policy, inputs, patches=(), stream=None):
    module = store.materialize("unet", source, config, policy.storage, patches, build, stream=stream)
    streamed = streaming.is_streamed(module)
    with torch.no_grad():
        return apply_precision(module, policy)(*inputs), streamed


def _unet_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, 16, 16, generator=g), torch.tensor([500.0, 20.0]),
            torch.randn(2, 5, tiny_unet_config("sd15").context_dim, generator=g))


@pytest.mark.parametrize("spec", ["f32", "bf16", "f16"])
def test_sd_unet_over_the_budget_streams_and_equals_the_resident_run(tmp_path, spec):
    write_unet(tmp_path / "u.safetensors", "sd15", seed=2)
    source, config = WeightSource.from_file(tmp_path / "u.safetensors"), tiny_unet_config("sd15")
    policy = {"f32": Policy(torch.float32, torch.float32, False, True, False),
              "bf16": Policy(torch.bfloat16, torch.bfloat16, False, True, False),
              "f16": Policy(torch.float16, torch.float16, False, True, False)}[spec]
    resident, was = _run(UNetModel, config, source, policy, _unet_inputs(), stream=False)
    assert not was
    with torch.device("meta"):
        meta = UNetModel(config)
    units, fixed = streaming.units_of(meta, store.dtype_rule(meta), policy.storage)
    total = fixed + sum(u.nbytes for u in units)
    store.clear()
    b = memory_budget.set_budget("cpu", _budget_for(total // 2))
    before = streaming.snapshot()
    out, was = _run(UNetModel, config, source, policy, _unet_inputs())
    cost = streaming.since(before)
    assert was and torch.equal(out, resident)
    assert cost["bytes_streamed"] > 0 and cost["loads"] > 0 and cost["passes"] == 1
    assert cost["peak_weight_bytes"] <= streaming.weights_allowance(b) <= b.nbytes
    # the resident part stays in the store: a second use reads only the streamed blocks again
    out2, _ = _run(UNetModel, config, source, policy, _unet_inputs())
    assert torch.equal(out2, resident) and store.stats().hits >= 1


def test_every_block_streams_under_novram_and_none_under_highvram(tmp_path):
    write_unet(tmp_path / "u.safetensors", "sd15", seed=1)
    source, config = WeightSource.from_file(tmp_path / "u.safetensors"), tiny_unet_config("sd15")
    policy = Policy(torch.float32, torch.float32, False, True, False)
    resident, _ = _run(UNetModel, config, source, policy, _unet_inputs(), stream=False)
    store.clear()
    memory_budget.set_budget("cpu", 8, mode="none")
    before = streaming.snapshot()
    out, was = _run(UNetModel, config, source, policy, _unet_inputs())
    with torch.device("meta"):
        n_units = len(streaming.units_of(UNetModel(config), lambda k, d: d, torch.float32)[0])
    assert was and torch.equal(out, resident) and streaming.since(before)["loads"] == n_units
    store.clear()
    memory_budget.set_budget("cpu", 1e-4, mode="high")
    assert not _run(UNetModel, config, source, policy, _unet_inputs())[1]


def test_lora_on_a_streamed_model_equals_the_resident_merge(tmp_path):
    usd = write_unet(tmp_path / "u.safetensors", "sd15", seed=3)
    keys = [k for k in usd if k.endswith(".weight") and ("attn" in k or "proj_in" in k) and usd[k].ndim >= 2]
    names = unet_file_names(usd, keys, "kohya_ldm")
    lora = load_lora(lora_file({names[k]: usd[k].shape for k in names}, "lora", seed=5), usd, name="l.safetensors")
    patches = (LoraPatch(lora, 0.8, "unet"),)
    source, config = WeightSource.from_file(tmp_path / "u.safetensors"), tiny_unet_config("sd15")
    policy = Policy(torch.bfloat16, torch.float32, False, True, False)
    resident, _ = _run(UNetModel, config, source, policy, _unet_inputs(), patches, stream=False)
    plain, _ = _run(UNetModel, config, source, policy, _unet_inputs(), stream=False)
    assert not torch.equal(resident, plain)   # the LoRA changes the output
    store.clear()
    out, was = _run(UNetModel, config, source, policy, _unet_inputs(), patches, stream=True)
    assert was and torch.equal(out, resident)


def test_tiny_flux_dit_streams_its_double_and_single_blocks(tmp_path):
    save_state_dict(tmp_path / "f.safetensors", flux_state_dict(TINY, seed=4))
    source = WeightSource.from_file(tmp_path / "f.safetensors")
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, TINY.in_channels, 8, 8, generator=g), torch.tensor([0.7]),
              torch.randn(1, 6, TINY.context_in_dim, generator=g), torch.randn(1, TINY.vec_in_dim, generator=g))
    with torch.device("meta"):
        meta = Flux(TINY)
    assert any(u.startswith("double_blocks.") for u in streaming.stream_units(meta))
    assert any(u.startswith("single_blocks.") for u in streaming.stream_units(meta))
    for spec in (Policy(torch.float32, torch.float32, False, True, False),
                 Policy(torch.bfloat16, torch.bfloat16, False, True, False)):
        store.clear()
        resident, _ = _run(Flux, TINY, source, spec, inputs, stream=False)
        store.clear()
        out, was = _run(Flux, TINY, source, spec, inputs, stream=True)
        assert was and torch.equal(out, resident)


def test_choose_keeps_the_largest_blocks_resident_within_the_allowance():
    units = [streaming.Unit(f"b.{i}", (), n) for i, n in enumerate((10, 40, 20, 30))]
    assert streaming.choose(units, 5, 200) == frozenset()
    picked = streaming.choose(units, 5, 80)
    assert streaming.footprint(units, 5, picked) <= 80 and "b.1" not in picked
    assert streaming.choose(units, 5, 80, mode="none") == {u.name for u in units}
    assert streaming.choose(units, 5, 1, mode="gpu_only") == frozenset()
    assert streaming.smallest_footprint(units, 5) == 45


def _sd15_workflow(tmp_path):
    models = tmp_path / "models"
    write_sd15(models / "checkpoints" / "sd15.safetensors", seed=3)
    g = api.Graph()
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    pos = g.add("CLIPTextEncode", text="a cat", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    ks = g.add("KSampler", model=ck[0], positive=pos.out, negative=neg.out, latent_image=lat.out, seed=1,
               steps=2, cfg=5.0, sampler_name="euler", scheduler="normal", denoise=1.0)
    dec = g.add("VAEDecode", samples=ks.out, vae=ck[2])
    g.add("PreviewImage", images=dec.out)
    return g.build(), dec.node_id, models


def test_sd15_workflow_under_a_small_budget_gives_the_same_image(tmp_path):
    wf, dec, models = _sd15_workflow(tmp_path)
    fresh = lambda: Executor(api.default_registry(), Env.from_args())  # noqa: E731 - no output cache
    resident = api.run(wf, models=models, executor=fresh())[dec][0]
    store.clear()
    before = streaming.snapshot()
    streamed = api.run(wf, models=models, executor=fresh(), memory_budget=0.002)[dec][0]
    cost = streaming.since(before)
    assert torch.equal(streamed, resident)
    assert cost["models"] >= 2 and cost["bytes_streamed"] > 0
    passes = {name.split()[0]: m["passes"] for name, m in cost["by_model"].items()}
    assert passes["unet"] == 2 and passes["vae"] == 1   # a pass per sampling step (CFG batched), one decode
    assert memory_budget.budget("cpu").origin == "--memory-budget 0.002"


def test_cli_memory_budget_is_parsed_and_bad_values_refused(tmp_path, capsys):
    for bad in ("abc", "0", "-2", "nan"):
        assert main(["run", "--memory-budget", bad, "x.json"]) == 2
        assert "--memory-budget needs a positive number of GiB (e.g. 6 or 7.5)" in capsys.readouterr().err
    assert main(["nodes", "--system", "--memory-budget", "3.5"]) == 0
    section = json.loads(capsys.readouterr().out)["memory_budget"]
    assert section["gib"] == 3.5 and section["origin"] == "--memory-budget 3.5"


def test_cli_run_reports_what_streaming_cost(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIXGRAPH_MEMORY_CHECK", "0")   # a budget under the VAE's activations: run anyway
    wf, _dec, models = _sd15_workflow(tmp_path)
    path = tmp_path / "wf.json"
    path.write_text(json.dumps({nid: {"class_type": c.class_type, "inputs": {
        k: ([v.node_id, v.slot] if hasattr(v, "node_id") else v) for k, v in c.inputs.items()}}
        for nid, c in wf.prompt.items()}))
    code = main(["run", str(path), "--models", str(models), "--output", str(tmp_path / "out"), "--quiet",
                 "--memory-budget", "0.002", "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "streamed " in err and " read in " in err and "per pass" in err
    memory = json.loads((tmp_path / "r.json").read_text())["memory"]
    assert memory["budget_origin"] == "--memory-budget 0.002"
    assert memory["streaming"]["bytes_streamed"] > 0 and memory["streaming"]["passes"] >= 2
    assert any(name.startswith("unet weights from") for name in memory["streaming"]["by_model"])


def test_server_history_entry_has_the_runs_memory_section(tmp_path, monkeypatch):
    """`serve` puts what `run --report`'s `memory` section says in the prompt's history entry
    (`status["mixgraph"]["memory"]`): the budget in force and what streaming cost, per prompt."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from mixgraph.ui.server.server import create_app
    from tests.test_editor_browser import txt2img
    from tests.test_server import post_prompt, wait_history

    monkeypatch.setenv("MIXGRAPH_MEMORY_CHECK", "0")   # a budget under the VAE's activations: run anyway
    _wf, _dec, models = _sd15_workflow(tmp_path)
    for d in ("in", "out", "temp"):
        (tmp_path / d).mkdir()
    env = Env(models=(models,), input=tmp_path / "in", output=tmp_path / "out", temp=tmp_path / "temp")

    async def main_():
        app = create_app(env, user_dir=tmp_path / "user" / "default")
        async with TestServer(app) as server, TestClient(server) as c:
            entries = []
            for seed in (1, 2):
                status, r = await post_prompt(c, {**txt2img(), "3": {**txt2img()["3"], "inputs": {
                    **txt2img()["3"]["inputs"], "seed": seed}}})
                assert status == 200, r
                entries.append(await wait_history(c, r["prompt_id"], timeout=120))
            listed = await (await c.get("/history")).json()
        return entries, listed

    memory_budget.set_budget("cpu", 0.002)
    (first, second), listed = asyncio.run(main_())
    for entry in (first, second):
        assert entry["status"]["status_str"] == "success", entry["status"]
        memory = entry["status"]["mixgraph"]["memory"]
        assert (memory["budget_bytes"], memory["budget_origin"], memory["mode"]) == \
            (int(0.002 * GIB), "--memory-budget 0.002", "normal")
    cost = first["status"]["mixgraph"]["memory"]["streaming"]
    assert cost["bytes_streamed"] > 0 and cost["passes"] >= 2
    assert any(name.startswith("unet weights from") for name in cost["by_model"])
    # the second prompt's own cost: the text encodings are cached, the UNet and VAE stream again
    again = second["status"]["mixgraph"]["memory"]["streaming"]
    assert not any(name.startswith("clip_l") for name in again["by_model"])
    unet = next(name for name in cost["by_model"] if name.startswith("unet"))
    assert again["by_model"][unet]["bytes_streamed"] == cost["by_model"][unet]["bytes_streamed"]
    assert all(e["status"]["mixgraph"]["memory"]["streaming"] for e in listed.values())


def test_estimate_counts_the_streamed_footprint_and_refusal_names_the_budget(tmp_path):
    from mixgraph.ui.estimate import estimate, refusal

    wf, _dec, models = _sd15_workflow(tmp_path)
    reg, env = api.default_registry(), Env.from_args(models=str(models))
    roomy = estimate(wf, reg, env, "f32")
    ks = next(n for n, e in roomy["nodes"].items() if e["class_type"] == "KSampler")
    assert "streamed" not in roomy["nodes"][ks]
    small = memory_budget.Budget("cpu", roomy["nodes"][ks]["weights_bytes"] // 2, "test")
    tight = estimate(wf, reg, env, "f32", budget=small)
    assert tight["nodes"][ks]["streamed"] == ["MODEL"]
    assert tight["nodes"][ks]["weights_bytes"] < roomy["nodes"][ks]["weights_bytes"]
    memory_budget.set_budget("cpu", 0.001)
    msg = refusal(wf, reg, env, "f32", available=64 * GIB)
    assert msg is not None and "even with model blocks streamed" in msg
    assert "memory budget of 1.0 MiB (--memory-budget 0.001)" in msg and "--memory-budget 1 would fit" in msg
    memory_budget.set_budget("cpu", 4)
    assert refusal(wf, reg, env, "f32", available=64 * GIB) is None


def _fp8_scaled(sd: dict, layers: list[str]) -> dict:
    """``sd`` with ``layers``' weights in ComfyUI's scaled-fp8 layout (per-tensor scale)."""
    out = dict(sd)
    for layer in layers:
        w = sd[f"{layer}.weight"]
        scale = (w.abs().amax() / torch.finfo(torch.float8_e4m3fn).max).float()
        out[f"{layer}.weight"] = (w / scale).to(torch.float8_e4m3fn)
        out[f"{layer}.scale_weight"] = scale
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def test_scaled_fp8_and_gguf_files_stream_as_they_load(tmp_path):
    """Quantised files stream through the same read path: scaled fp8 kept fp8 with its scale under
    an fp8 storage (dequantised under f32), GGUF weights kept quantised; each equals its resident run."""
    import gguf

    from tests.gguf_fixtures import write_gguf

    usd = write_unet(tmp_path / "u.safetensors", "sd15", seed=6)
    layers = [k[: -len(".weight")] for k in usd if k.endswith(".weight") and usd[k].ndim >= 2
              and (".attn" in k or ".proj_" in k or "in_layers.2" in k)]
    save_state_dict(tmp_path / "fp8.safetensors", _fp8_scaled(usd, layers))
    write_gguf(tmp_path / "q8.gguf", usd, gguf.GGMLQuantizationType.Q8_0)
    config = tiny_unet_config("sd15")
    cases = [("fp8.safetensors", Policy(torch.float8_e4m3fn, torch.float32, False, True, False)),
             ("fp8.safetensors", Policy(torch.float32, torch.float32, False, True, False)),
             ("q8.gguf", Policy(torch.float32, torch.float32, False, True, False)),
             ("q8.gguf", Policy(torch.bfloat16, torch.bfloat16, False, True, False))]
    for name, policy in cases:
        source = WeightSource.from_file(tmp_path / name)
        store.clear()
        resident, _ = _run(UNetModel, config, source, policy, _unet_inputs(), stream=False)
        store.clear()
        before = streaming.snapshot()
        out, was = _run(UNetModel, config, source, policy, _unet_inputs(), stream=True)
        assert was and torch.equal(out, resident), (name, policy)
        assert streaming.since(before)["bytes_streamed"] > 0


def test_full_size_sdxl_over_the_machine_is_refused_naming_the_budget_that_streams_it(tmp_path):
    """A header-only full-size SDXL checkpoint (13.9 GB in f32) on a machine with 10 GiB free:
    held whole it does not fit, streamed within a smaller budget it does, and the refusal says
    which budget; with that budget the estimate counts the UNet streamed and fits."""
    from mixgraph.nodes.weights.synthetic import sdxl_parts
    from mixgraph.ui.estimate import BASE_BYTES, estimate, refusal

    shapes = {prefix + k: v for prefix, sh, _seed in sdxl_parts("full", 0) for k, v in sh.items()}
    shapes["conditioner.embedders.1.model.logit_scale"] = ()
    models = tmp_path / "models"
    write_header_only(models / "checkpoints" / "xl.safetensors", shapes)
    wf = api.set_inputs(api.load("workflows/txt2img_sd15.json"),
                        {"4.ckpt_name": "xl.safetensors", "5.width": 64, "5.height": 64, "3.steps": 1})
    reg, env = api.default_registry(), Env.from_args(models=str(models))
    memory_budget.set_budget("cpu", 64)
    msg = refusal(wf, reg, env, "f32", available=10 * GIB)
    assert msg is not None and "not enough memory" in msg and "would fit (model blocks stream within it)" in msg
    gib = int(msg.split("--memory-budget ")[1].split()[0])
    assert 1 <= gib <= 10
    memory_budget.set_budget("cpu", gib)
    est = estimate(wf, reg, env, "f32")
    assert est["nodes"]["3"]["streamed"] == ["MODEL"]
    assert est["peak_bytes"] <= 10 * GIB + BASE_BYTES and est["peak_bytes"] - BASE_BYTES <= gib * GIB
    assert refusal(wf, reg, env, "f32", available=10 * GIB) is None


def _join_prefetch():
    import threading

    for t in threading.enumerate():
        if t.name == "mixgraph-stream-prefetch":
            t.join(timeout=10)


@pytest.mark.parametrize("spec", ["f32", "bf16"])
def test_cpu_prefetch_asks_for_the_next_units_bytes_and_changes_nothing(tmp_path, monkeypatch, spec):
    """When a unit comes in, the file bytes of the one after it are asked for in the background
    (``will_need``); the output, the bytes counted and the peak held are those of the run without."""
    from mixgraph.nodes.weights.safetensors_io import byte_ranges

    write_unet(tmp_path / "u.safetensors", "sd15", seed=2)
    source, config = WeightSource.from_file(tmp_path / "u.safetensors"), tiny_unet_config("sd15")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[spec]
    policy = Policy(dtype, dtype, False, True, False)
    resident, _ = _run(UNetModel, config, source, policy, _unet_inputs(), stream=False)
    with torch.device("meta"):
        meta = UNetModel(config)
    units, fixed = streaming.units_of(meta, store.dtype_rule(meta), policy.storage)
    real, asked = store.will_need, []
    monkeypatch.setattr(store, "will_need", lambda path, ranges: (asked.append(tuple(ranges)), real(path, ranges)))
    runs = {}
    for prefetch in ("1", "0"):
        monkeypatch.setenv(streaming.PREFETCH_ENV, prefetch)
        store.clear()
        b = memory_budget.set_budget("cpu", _budget_for((fixed + sum(u.nbytes for u in units)) // 2))
        before = streaming.snapshot()
        out, was = _run(UNetModel, config, source, policy, _unet_inputs())
        _join_prefetch()
        cost = streaming.since(before)
        assert was and torch.equal(out, resident), prefetch
        assert cost["peak_weight_bytes"] <= streaming.weights_allowance(b)
        runs[prefetch] = (cost, len(asked))
    (on, n_on), (off, n_off) = runs["1"], runs["0"]
    assert n_on > 0 and n_off == n_on   # asked with prefetch on, never with it off
    assert (on["bytes_streamed"], on["loads"], on["passes"]) == (off["bytes_streamed"], off["loads"], off["passes"])
    # every unit streams: bytes once per unit load, and each unit's successor asked for in order
    asked.clear()
    monkeypatch.setenv(streaming.PREFETCH_ENV, "1")
    store.clear()
    memory_budget.set_budget("cpu", 8, mode="none")
    before = streaming.snapshot()
    out, _ = _run(UNetModel, config, source, policy, _unet_inputs())
    _join_prefetch()
    cost = streaming.since(before)
    assert torch.equal(out, resident)
    assert cost["loads"] == len(units) and cost["bytes_streamed"] == sum(u.nbytes for u in units)
    second = byte_ranges(source, lambda k: k.startswith(units[1].name + "."))
    assert second and second in asked and len(asked) == len(units)


def test_the_output_caches_budget_share_is_left_out_of_the_weights_allowance(tmp_path, monkeypatch):
    """The default output cache's bound is a share of the budget (``graph.cache.BUDGET_SHARE``):
    a model's weights allowance leaves it out, so a model that fits beside no cache streams beside
    one; other cache modes, ``MIXGRAPH_CACHE_BYTES`` and a budget set afterwards leave it whole."""
    from argparse import Namespace

    from mixgraph.graph.cache import BUDGET_SHARE
    from mixgraph.ui.comfy.comfy_flags import cache_from_args

    monkeypatch.delenv("MIXGRAPH_CACHE_BYTES", raising=False)
    write_unet(tmp_path / "u.safetensors", "sd15", seed=2)
    source, config = WeightSource.from_file(tmp_path / "u.safetensors"), tiny_unet_config("sd15")
    policy = Policy(torch.float32, torch.float32, False, True, False)
    with torch.device("meta"):
        meta = UNetModel(config)
    units, fixed = streaming.units_of(meta, store.dtype_rule(meta), policy.storage)
    total = fixed + sum(u.nbytes for u in units)
    b = memory_budget.set_budget("cpu", _budget_for(total * 6 // 5))  # fits with a fifth to spare
    whole = streaming.weights_allowance(b)
    assert whole >= total
    assert not _run(UNetModel, config, source, policy, _unet_inputs())[1]
    cache = cache_from_args(Namespace())
    assert cache.max_bytes == int(b.nbytes * BUDGET_SHARE)
    assert streaming.weights_allowance(b) == whole - cache.max_bytes < total
    store.clear()
    assert _run(UNetModel, config, source, policy, _unet_inputs())[1]  # now it streams
    for args in (Namespace(cache_none=True), Namespace(cache_lru=4)):
        cache_from_args(args)
        assert streaming.weights_allowance(b) == whole, args
    monkeypatch.setenv("MIXGRAPH_CACHE_BYTES", str(1 << 20))
    cache_from_args(Namespace())
    assert streaming.weights_allowance(b) == whole
    monkeypatch.delenv("MIXGRAPH_CACHE_BYTES")
    cache_from_args(Namespace())
    again = memory_budget.set_budget("cpu", _budget_for(total * 6 // 5))
    assert streaming.weights_allowance(again) == whole  # a new budget: its cache is made after it
