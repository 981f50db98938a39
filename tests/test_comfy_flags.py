"""`mixgraph serve` with ComfyUI's own server flags (ui/comfy/comfy_flags.py): the flags map onto
mixgraph's settings with ComfyUI's meaning, inapplicable ones print a note, and the safety rules
(token beyond loopback, foreign-Origin refusal) stay in force, CORS included."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import FormData
from aiohttp.test_utils import TestClient, TestServer

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.ui.cli import build_parser, main
from mixgraph.ui.comfy.comfy_flags import FlagError, serve_options
from mixgraph.ui.server.security import SecurityError
from mixgraph.ui.server.server import create_app
from tests import toy_nodes as toy
from tests.test_editor_browser import free_port
from tests.test_server import diamond, png_bytes

ROOT = Path(__file__).resolve().parents[1]


def _options(*argv, cuda_available=False):
    return serve_options(build_parser().parse_args(["serve", *argv]), cuda_available=cuda_available)


def test_comfy_flags_map_folders_device_upload_preview_and_note_cuda_flags(tmp_path):
    (tmp_path / "u").mkdir()
    opts, notes = _options("--listen", "127.0.0.1", "--port", "9123", "--output-directory", "x",
                           "--input-directory", "y", "--temp-directory", "t", "--user-directory",
                           str(tmp_path / "u"), "--cpu", "--disable-xformers", "--lowvram",
                           "--max-upload-size", "0.5", "--preview-method", "taesd", "--fast")
    assert opts["host"] == "127.0.0.1" and opts["port"] == 9123
    assert (opts["output"], opts["input"], opts["temp"]) == ("x", "y", "t")
    assert opts["user_dir"] == str(tmp_path / "u" / "default")
    assert opts["device"] == "cpu" and opts["max_upload"] == 512 * 1024
    assert opts["settings"] == {"preview_method": "taesd"}
    assert notes == [
        "note: --fast has no effect on this build (precision is per workflow here: precision tags "
        "on groups and subgraphs, or `mixgraph run --precision`)",
        "note: --disable-xformers has no effect on this build (attention always uses PyTorch's "
        "scaled_dot_product_attention)"]


def test_comfy_flags_listen_without_value_means_all_interfaces():
    assert _options("--listen")[0]["host"] == "0.0.0.0,::"
    assert _options()[0]["host"] == "127.0.0.1"
    assert _options("--host", "::1")[0]["host"] == "::1"


def test_comfy_flags_base_directory_is_the_base_of_every_folder(tmp_path):
    opts, _ = _options("--base-directory", str(tmp_path), "--output-directory", "elsewhere")
    assert opts["models"] == str(tmp_path / "models") and opts["input"] == str(tmp_path / "input")
    assert opts["temp"] == str(tmp_path / "temp") and opts["output"] == "elsewhere"
    assert opts["user_dir"] == str(tmp_path / "user" / "default")
    assert opts["settings"]["custom_nodes"] == str(tmp_path / "custom_nodes")


def test_comfy_flags_extra_model_paths_config_repeatable(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"comfy:\n  base_path: {tmp_path}/comfy\n  checkpoints: models/checkpoints\n")
    b.write_text(f"a111:\n  base_path: {tmp_path}/webui\n  checkpoints: models/Stable-diffusion\n"
                 f"  loras: models/Lora\n")
    opts, _ = _options("--extra-model-paths-config", str(a), "--extra-model-paths-config", str(b))
    assert opts["extra_model_paths"] == {
        "checkpoints": (tmp_path / "comfy/models/checkpoints", tmp_path / "webui/models/Stable-diffusion"),
        "loras": (tmp_path / "webui/models/Lora",)}


def test_comfy_flags_cuda_device_is_a_note_without_cuda_and_a_device_with_it():
    opts, notes = _options("--cuda-device", "1", cuda_available=False)
    assert opts["device"] is None and notes == [
        "note: --cuda-device 1 has no effect on this build (no CUDA on this machine; running on cpu)"]
    assert _options("--cuda-device", "1", cuda_available=True)[0]["device"] == "cuda:1"


def test_comfy_flags_bad_values_are_clear_errors(tmp_path, capsys):
    with pytest.raises(FlagError, match="--user-directory .*no such folder"):
        _options("--user-directory", str(tmp_path / "missing"))
    with pytest.raises(FlagError, match="--extra-model-paths-config .*no such file"):
        _options("--extra-model-paths-config", str(tmp_path / "none.yaml"))
    with pytest.raises(FlagError, match="--cpu and --device cuda disagree"):
        _options("--cpu", "--device", "cuda")
    with pytest.raises(FlagError, match="--max-upload-size"):
        _options("--max-upload-size", "0")
    assert main(["serve", "--preview-method", "fancy"]) == 2
    assert "invalid choice: 'fancy'" in capsys.readouterr().err


# --- CORS and the Origin rule, in process --------------------------------------------------------

def _serve_in_process(tmp_path, body, **kw):
    env = Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    for d in (env.input, env.output, env.temp):
        d.mkdir(parents=True, exist_ok=True)
    reg = toy.registry()

    async def go():
        app = create_app(env, registry=reg, executor=Executor(reg, env, OutputCache(2**24)),
                         user_dir=tmp_path / "user" / "default", **kw)
        async with TestServer(app) as server, TestClient(server) as c:
            await body(c)
    asyncio.run(go())


def test_comfy_flags_cors_origin_is_trusted_others_still_refused(tmp_path):
    async def body(c):
        ok = {"Origin": "https://app.example"}
        r = await c.options("/prompt", headers={**ok, "Access-Control-Request-Method": "POST"})
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        r = await c.post("/prompt", json={"prompt": diamond()}, headers=ok)
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
        r = await c.get("/system_stats", headers={"Origin": "https://app.example:443"})
        assert r.headers["Access-Control-Allow-Origin"] == "https://app.example:443"
        for evil in ("https://evil.example", "http://app.example", "https://app.example:8443"):
            r = await c.post("/prompt", json={"prompt": diamond()}, headers={"Origin": evil})
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers, evil
            r = await c.options("/prompt", headers={"Origin": evil})
            assert "Access-Control-Allow-Origin" not in r.headers
    _serve_in_process(tmp_path, body, cors_origin="https://app.example")


def test_comfy_flags_cors_any_origin_needs_a_token(tmp_path):
    with pytest.raises(SecurityError, match="without an origin"):
        _serve_in_process(tmp_path, None, cors_origin="*")
    with pytest.raises(SecurityError, match="expected an origin"):
        _serve_in_process(tmp_path, None, cors_origin="app.example")

    async def body(c):
        r = await c.post("/prompt", json={"prompt": diamond()}, headers={"Origin": "https://x.example"})
        assert r.status == 401 and r.headers["Access-Control-Allow-Origin"] == "*"
        r = await c.post("/prompt", json={"prompt": diamond()},
                         headers={"Origin": "https://x.example", "Authorization": "Bearer s3cret"})
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    _serve_in_process(tmp_path, body, cors_origin="*", token="s3cret")


# --- a real `mixgraph serve` started the way a ComfyUI launcher starts ComfyUI ---------------------

def _spawn(tmp: Path, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "mixgraph", "serve", *argv], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_comfy_flags_listen_everywhere_without_token_is_refused(tmp_path):
    proc = _spawn(tmp_path, "--listen", "--port", str(free_port()))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "refusing to listen on '0.0.0.0,::' without a token" in err


def test_comfy_flags_serve_with_comfyui_arguments_end_to_end(tmp_path):
    x, y, u, models = tmp_path / "X", tmp_path / "Y", tmp_path / "U", tmp_path / "models"
    u.mkdir()
    models.mkdir()
    port = free_port()
    proc = _spawn(tmp_path, "--listen", "127.0.0.1", "--port", str(port), "--output-directory", str(x),
                  "--input-directory", str(y), "--user-directory", str(u), "--models-directory",
                  str(models), "--disable-xformers", "--lowvram", "--max-upload-size", "0.01")
    url = f"http://127.0.0.1:{port}"

    async def drive():
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, proc.communicate()[1]
                try:
                    async with s.get(url + "/api/system_stats") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "server did not answer"
                await asyncio.sleep(0.2)
            form = FormData()
            form.add_field("image", png_bytes(), filename="a.png", content_type="image/png")
            async with s.post(url + "/api/upload/image", data=form) as r:
                assert r.status == 200
            big = FormData()
            big.add_field("image", png_bytes() + b"\0" * 20000, filename="big.png",
                          content_type="image/png")
            async with s.post(url + "/api/upload/image", data=big) as r:
                assert r.status == 413                      # 0.01 MB = 10,486 bytes
            async with s.post(url + "/api/settings", json={"Comfy.Test": 1}) as r:
                assert r.status == 200
            prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
                      "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                                                                  "filename_prefix": "flags"}}}
            async with s.post(url + "/api/prompt", json={"prompt": prompt}) as r:
                assert r.status == 200, await r.text()
                pid = (await r.json())["prompt_id"]
            while True:
                async with s.get(f"{url}/api/history/{pid}") as r:
                    h = await r.json()
                if h.get(pid, {}).get("status", {}).get("completed"):
                    break
                assert time.monotonic() < deadline, h
                await asyncio.sleep(0.2)
            async with s.post(url + "/api/prompt", json={"prompt": prompt},
                              headers={"Origin": "https://evil.example"}) as r:
                assert r.status == 403

    try:
        asyncio.run(drive())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert (y / "a.png").is_file() and not (y / "big.png").exists()
    assert (x / "flags_00001_.png").is_file()
    assert json.loads((u / "default" / "comfy.settings.json").read_text()) == {"Comfy.Test": 1}
    assert (u / "mixgraph" / "jobs.sqlite3").is_file()
    assert not (tmp_path / "user").exists() and not (tmp_path / "output").exists()
    assert "note: --disable-xformers has no effect on this build" in err
    assert "note: --lowvram: memory mode 'low'" in err
    assert "memory budget: " in err


def test_comfy_memory_flags_set_the_budget_mode_reserve_and_release(tmp_path):
    """--lowvram / --novram / --highvram / --gpu-only set the memory budget's mode (on a CPU too),
    --reserve-vram the reserve, --disable-smart-memory releases models after each prompt; two
    VRAM modes at once are refused, as ComfyUI's exclusive group does."""
    from mixgraph.nodes.models import memory_budget
    from mixgraph.ui.comfy.comfy_flags import apply_memory, memory_from_args

    def memory(*argv):
        return memory_from_args(build_parser().parse_args(["serve", *argv]))

    for flag, mode in (("--lowvram", "low"), ("--novram", "none"), ("--highvram", "high"),
                       ("--gpu-only", "gpu_only"), ("--normalvram", "normal")):
        flags, notes = memory(flag)
        assert flags.mode == mode and notes[0].startswith(f"note: {flag}: memory mode {mode!r}")
        assert not any("has no effect" in n for n in notes)
    with pytest.raises(FlagError, match="--lowvram and --novram disagree"):
        memory("--lowvram", "--novram")
    flags, notes = memory("--reserve-vram", "3", "--novram", "--disable-smart-memory")
    assert (flags.reserve_gib, flags.mode, flags.release_models) == (3.0, "none", True)
    assert "note: --disable-smart-memory: models are released after each prompt" in notes
    assert _options("--disable-smart-memory")[0]["settings"] == {"release_models": True}
    try:
        b = apply_memory(memory("--memory-budget", "2.5", "--lowvram")[0], "cpu")
        assert (b.nbytes, b.mode, b.origin) == (int(2.5 * 2**30), "low", "--memory-budget 2.5")
        assert memory_budget.budget("cpu") == b
    finally:
        memory_budget.reset()


def test_output_cache_default_bound_is_a_share_of_the_memory_budget(monkeypatch):
    """The in-memory output cache counts against the memory budget: its default byte bound is
    `BUDGET_SHARE` of the CPU budget; `MIXGRAPH_CACHE_BYTES`, an explicit
    `max_bytes` and the other cache modes keep their own bounds."""
    from mixgraph.graph.cache import BUDGET_SHARE, LruCountCache, make_cache
    from mixgraph.nodes.models import memory_budget
    from mixgraph.ui.comfy.comfy_flags import apply_memory, cache_from_args, memory_from_args

    monkeypatch.delenv("MIXGRAPH_CACHE_BYTES", raising=False)
    try:
        for argv, gib in ((["run", "--memory-budget", "2", "x.json"], 2),
                          (["serve", "--memory-budget", "6", "--cpu"], 6)):
            args = build_parser().parse_args(argv)
            apply_memory(memory_from_args(args)[0], "cpu")
            cache = cache_from_args(args)
            assert type(cache) is OutputCache and cache.max_bytes == int(gib * 2**30 * BUDGET_SHARE)
        memory_budget.set_budget("cpu", 0.5)
        assert cache_from_args(build_parser().parse_args(["run", "x.json"])).max_bytes == 2**27
        lru = cache_from_args(build_parser().parse_args(["run", "--cache-lru", "3", "x.json"]))
        assert isinstance(lru, LruCountCache) and lru.max_bytes == 2**62     # counts, as ComfyUI
        assert make_cache(max_bytes=1234, memory_bytes=2**30).max_bytes == 1234
        monkeypatch.setenv("MIXGRAPH_CACHE_BYTES", "4096")
        assert cache_from_args(build_parser().parse_args(["run", "x.json"])).max_bytes == 4096
    finally:
        memory_budget.reset()
