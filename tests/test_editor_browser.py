"""The ComfyUI web editor (comfyui-frontend-package) against `mixgraph serve`, in real headless
Chromium driven by Playwright (DESIGN §8): it starts without page errors, shows our node catalogue
and our extension, and a workflow loaded into it and queued from it runs to a PNG.

Needs the Debian `chromium` package (/usr/bin/chromium), the `playwright` Python package (no
browser download) and comfyui-frontend-package; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mixgraph.graph.formats.workflow import load_workflow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[1]


def txt2img(ckpt: str = "sd15.safetensors") -> dict:
    """A 64x64, 2-step txt2img API prompt; SaveImage is node 9."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
                                                           "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "seed": 7, "steps": 2, "cfg": 5.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
            "latent_image": ["5", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "editor",
                                                    "images": ["8", 0]}},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _start_server(tmp: Path, deadline: float, returning: bool = True) -> tuple[subprocess.Popen, str]:
    from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
    write_sd15_checkpoint(tmp / "models" / "checkpoints" / "sd15.safetensors", "tiny")
    user = tmp / "user" / "default"          # `mixgraph serve`'s user folder, under its cwd
    user.mkdir(parents=True)
    if returning:                            # a returning user (else: a first start)
        (user / "comfy.settings.json").write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mixgraph", "serve", "--port", str(port), "--models",
         str(tmp / "models"), "--input", str(tmp / "input"), "--output", str(tmp / "output")],
        cwd=tmp, env=env, stdout=open(tmp / "server.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            get_json(url + "/api/system_stats", timeout=1)
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("server did not answer within the time limit") from None
            time.sleep(0.1)


def _browser_or_skip():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not installed (Debian package 'chromium'; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the 'playwright' Python package is not installed (pip install playwright)")
    from mixgraph.ui.server.frontend import frontend_root
    if frontend_root() is None:
        pytest.skip("comfyui-frontend-package is not installed")
    return sync_playwright


def test_editor_browser_loads_editor_and_runs_workflow(tmp_path):
    sync_playwright = _browser_or_skip()
    deadline = time.monotonic() + 55
    proc, url = _start_server(tmp_path, time.monotonic() + 30)
    problems: list[str] = []
    watching = [True]        # errors while the page is being torn down are not the editor's
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(30_000)
                page.on("pageerror", lambda e: watching[0] and problems.append(f"page error: {e}"))

                def on_console(m) -> None:
                    # Resource errors from other hosts (the editor's default graph checks model
                    # URLs on huggingface.co; CI has no network) are not our server's doing.
                    where = m.location.get("url", "")
                    external = where.startswith("http") and not where.startswith(url)
                    if watching[0] and m.type == "error" \
                            and not (external and "Failed to load" in m.text):
                        problems.append(f"console error: {m.text[:300]} at {where}")
                page.on("console", on_console)
                page.goto(url + "/", wait_until="domcontentloaded")

                # Ready: the graph app exists, the catalogue from /object_info is registered and
                # our extension (ui/server/web/mixgraph.js, listed by /extensions) has run.
                page.wait_for_function(
                    "() => !!(window.app?.graph && window.app?.canvas"
                    " && window.LiteGraph?.registered_node_types?.KSampler"
                    " && window.mixgraph?.loaded)")
                types = page.evaluate("() => Object.keys(LiteGraph.registered_node_types)")
                assert {"KSampler", "CheckpointLoaderSimple", "SaveImage",
                        "SetModelPrecision"} <= set(types)
                assert "/extensions/mixgraph/mixgraph.js" in get_json(url + "/api/extensions")

                # Load the API prompt into the editor, queue it from there, wait for the result.
                page.evaluate("""async (prompt) => {
                    const api = window.comfyAPI.api.api;
                    const finish = (e) => { window.__mixgraphDone ??= e.detail; };
                    api.addEventListener('execution_success', finish);
                    api.addEventListener('execution_error', finish);
                    await window.app.loadApiJson(prompt, 'txt2img.json');
                }""", txt2img())
                loaded = page.evaluate(
                    "() => window.app.graph.nodes.map(n => [String(n.id), n.type]).sort()")
                assert loaded == sorted([k, v["class_type"]] for k, v in txt2img().items())

                # Our extension: a group around the KSampler, tagged through the group's context
                # menu entry; the graph the editor queues then carries the region to the server.
                menu = page.evaluate("""() => {
                    const app = window.app, ks = app.graph.getNodeById(3);
                    const group = new LiteGraph.LGraphGroup('Sampling');
                    group.pos = [ks.pos[0] - 20, ks.pos[1] - 60];
                    group.size = [ks.size[0] + 40, ks.size[1] + 100];
                    app.graph.add(group);
                    app.canvas.graph_mouse[0] = ks.pos[0]; app.canvas.graph_mouse[1] = ks.pos[1];
                    const entry = app.collectCanvasMenuItems(app.canvas)
                        .find((item) => item?.content?.startsWith('Precision (mixgraph)'));
                    entry.submenu.options.find((o) => o?.content === 'bf16').callback();
                    const tagged = group.title;
                    window.mixgraph.setGroupPrecision(group, 'f32');
                    const again = app.collectCanvasMenuItems(app.canvas)
                        .find((item) => item?.content?.startsWith('Precision (mixgraph)'));
                    return [entry.content, tagged, group.title, again.content,
                            again.submenu.options.filter((o) => o).map((o) => o.content)];
                }""")
                assert menu[:4] == ["Precision (mixgraph)", "Sampling [bf16]", "Sampling [f32]",
                                    "Precision (mixgraph): f32"]
                assert "✓ f32" in menu[4] and "bf16" in menu[4]
                sent = page.evaluate("() => window.app.graphToPrompt()")
                from mixgraph.ui.api import default_registry
                from mixgraph.graph.prompt import Region
                from mixgraph.ui.server.server import editor_regions
                wf = editor_regions(load_workflow(sent["output"], default_registry()),
                                    {"extra_pnginfo": {"workflow": sent["workflow"]}},
                                    default_registry())
                assert wf.precision.regions == (Region("Sampling", frozenset({"3"}), "f32"),)

                page.evaluate("() => window.app.queuePrompt(0)")
                left = max(1.0, deadline - time.monotonic()) * 1000
                detail = page.wait_for_function("() => window.__mixgraphDone",
                                                timeout=left).json_value()
                assert "exception_message" not in detail, detail
                # As in ComfyUI, execution_success comes before the history entry is written
                # (`executing` null follows it): poll history, bounded.
                pid, until = detail["prompt_id"], time.monotonic() + 15
                while (found := get_json(url + f"/api/history/{pid}")).get(pid) is None:
                    assert time.monotonic() < until, f"prompt {pid} never reached /history"
                    time.sleep(0.1)
                entry = found[pid]
                assert entry["status"]["status_str"] == "success"
                image = entry["outputs"]["9"]["images"][0]
                png = tmp_path / "output" / image["subfolder"] / image["filename"]
                assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
                from PIL import Image
                with Image.open(png) as im:
                    assert im.size == (64, 64)
                # The jobs API the queue panel reads knows it too.
                jobs = get_json(url + "/api/jobs?status=completed&limit=5")["jobs"]
                assert jobs[0]["id"] == detail["prompt_id"] and jobs[0]["outputs_count"] == 1
                # A NaN-fallback message (graph/events.py NanFallback) marks the node, toasts.
                page.evaluate("""() => window.comfyAPI.api.api.dispatchCustomEvent(
                    'mixgraph.nan_fallback', {prompt_id: 'p', node_id: '3', node_type: 'KSampler',
                    precision: 'f16', fallback: 'f16:f32', message: 'non-finite output'})""")
                page.get_by_test_id("toast").get_by_text("NaN fallback: KSampler #3").wait_for()
                assert page.evaluate("() => window.mixgraph.nanFallbacks.get('3').fallback") \
                    == "f16:f32"
                page.wait_for_function("() => !document.getElementById('splash-loader')")
                page.evaluate("""async () => {       // whole graph in view for the screenshot
                    const c = window.app.canvas, frame = () => new Promise(requestAnimationFrame);
                    c.deselectAll?.();
                    c.fitViewToSelectionAnimated({duration: 1});
                    for (let i = 0; i < 3; i++) await frame();
                    c.setDirty(true, true);
                    await frame();
                }""")
                page.screenshot(path=str(tmp_path / "editor.png"))
                watching[0] = False
            finally:
                browser.close()
    finally:
        _stop(proc)
    assert not problems, "\n".join(problems)


def test_editor_browser_first_start_opens_default_workflow_and_run_draws_it(tmp_path):
    """A new user's first screen: mixgraph's default workflow (txt2img on the embedded model), no
    template browser over it, no missing nodes, no console errors (no requests to other hosts);
    the template browser lists workflows/; pressing Run draws the prompt's picture."""
    sync_playwright = _browser_or_skip()
    deadline = time.monotonic() + 90
    proc, url = _start_server(tmp_path, time.monotonic() + 30, returning=False)
    problems: list[str] = []
    watching = [True]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(45_000)
                page.on("pageerror", lambda e: watching[0] and problems.append(f"page error: {e}"))
                page.on("console", lambda m: watching[0] and m.type == "error"
                        and problems.append(f"console error: {m.text[:300]}"))
                page.on("request", lambda r: watching[0] and not r.url.startswith((url, "data:", "blob:"))
                        and problems.append(f"request to another host: {r.url}"))
                page.goto(url + "/", wait_until="domcontentloaded")
                page.wait_for_function("() => !!(window.app?.graph && window.mixgraph?.loaded"
                                       " && window.LiteGraph?.registered_node_types?.KSampler)")
                page.wait_for_function("() => !document.getElementById('splash-loader')")
                page.wait_for_function("() => window.app.graph.nodes.length > 0")
                nodes = page.evaluate("""() => window.app.graph.nodes.map(n => [String(n.id), n.type,
                    !!(n.has_errors || !LiteGraph.registered_node_types[n.type])])""")
                from mixgraph.ui.demo import DEFAULT_PROMPT, demo_workflow
                default = demo_workflow()
                assert sorted(nodes) == sorted([k, v["class_type"], False] for k, v in default.items())
                assert page.evaluate("() => window.app.graph.getNodeById(6).widgets[0].value") \
                    == DEFAULT_PROMPT
                assert page.locator(".p-dialog").count() == 0, "a dialog covers the first screen"
                # fitted and readable: the editor draws titles from 60 % zoom; every node on screen
                view = page.evaluate("""() => {
                    const c = window.app.canvas, ds = c.ds, el = c.canvas;
                    const w = el.clientWidth, h = el.clientHeight;
                    const off = window.app.graph.nodes.filter(n => {
                        const [x, y] = ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - 30]);
                        const [x1, y1] = ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
                        return x < 0 || y < 0 || x1 > w || y1 > h; }).map(n => n.type);
                    return {scale: ds.scale, off};
                }""")
                assert view["scale"] >= 0.6 and not view["off"], view

                # The template browser lists the workflows of workflows/ by their README titles.
                page.evaluate("() => window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
                page.get_by_text("Text to image (embedded model)").first.wait_for()
                page.get_by_text("ControlNet on the embedded model").first.wait_for()
                page.keyboard.press("Escape")
                page.get_by_text("ControlNet on the embedded model").first.wait_for(state="hidden")

                # Run, as a user would: the button in the queue bar.
                page.evaluate("""() => {
                    const api = window.comfyAPI.api.api;
                    const finish = (e) => { window.__mixgraphDone ??= e.detail; };
                    api.addEventListener('execution_success', finish);
                    api.addEventListener('execution_error', finish);
                }""")
                page.get_by_role("button", name="Run", exact=True).first.click()
                left = max(1.0, deadline - time.monotonic()) * 1000
                detail = page.wait_for_function("() => window.__mixgraphDone", timeout=left).json_value()
                assert "exception_message" not in detail, detail
                entry = get_json(url + f"/api/history/{detail['prompt_id']}")[detail["prompt_id"]]
                image = entry["outputs"]["9"]["images"][0]
                # the picture appears in the Save Image node
                page.wait_for_function("() => (window.app.graph.getNodeById(9).imgs || []).length > 0")
                from PIL import Image
                import numpy as np
                from mixgraph.nodes.models.shapes import check_image, parse_caption
                with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as im:
                    verdict = check_image(np.asarray(im.convert("RGB")))
                want = parse_caption(DEFAULT_PROMPT)
                assert (verdict.color, verdict.background, verdict.shape) == \
                    (want["color"], want["background"], want["shape"]), verdict
                page.screenshot(path=str(tmp_path / "first_screen.png"))
                watching[0] = False
            finally:
                browser.close()
    finally:
        _stop(proc)
    assert not problems, "\n".join(problems)


# --- the editor's startup endpoints, without a browser -------------------------------------------

def test_editor_startup_endpoints_jobs_and_stubs(tmp_path):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from mixgraph.graph.cache import OutputCache
    from mixgraph.graph.env import Env
    from mixgraph.graph.executor import Executor
    from tests import toy_nodes as toy
    from mixgraph.nodes.models.shapes import EMBEDDED_CHECKPOINT
    from mixgraph.ui.server.server import SERVER_KEY, create_app

    for d in ("in", "out", "temp", "models/checkpoints/sub"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "models/checkpoints/sub/a.safetensors").write_bytes(b"x" * 3)
    (tmp_path / "out/old.png").write_bytes(b"1")
    os.utime(tmp_path / "out/old.png", (1, 1))
    (tmp_path / "out/new.png").write_bytes(b"2")
    env = Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    reg = toy.registry()
    prompt = {"1": toy.call("Const", value=2), "2": toy.call("Show", value=toy.link(1))}

    async def main():
        app = create_app(env, registry=reg, executor=Executor(reg, env, OutputCache(2**20)),
                         user_dir=tmp_path / "user")
        async with TestServer(app) as server, TestClient(server) as c:
            r = await c.post("/api/prompt", json={"prompt": prompt, "client_id": "me",
                                                  "extra_data": {"extra_pnginfo": {
                                                      "workflow": {"id": "wf-1"}}}})
            pid = (await r.json())["prompt_id"]
            assert await asyncio.get_running_loop().run_in_executor(
                None, app[SERVER_KEY].queue.wait_idle, 10.0)
            body = await (await c.get("/api/jobs?status=completed,failed&limit=1")).json()
            job = body["jobs"][0]
            assert body["pagination"] == {"offset": 0, "limit": 1, "total": 1, "has_more": False}
            assert (job["id"], job["status"], job["workflow_id"], job["outputs_count"]) == \
                (pid, "completed", "wf-1", 0)
            assert job["create_time"] > 0 and job["execution_end_time"] >= job["create_time"]
            assert (await (await c.get("/api/jobs?status=pending")).json())["jobs"] == []
            assert (await c.get("/api/jobs?status=nonsense")).status == 400
            detail = await (await c.get(f"/api/jobs/{pid}")).json()
            assert detail["workflow"]["prompt"] == prompt and "execution_status" in detail
            assert (await c.get("/api/jobs/unknown")).status == 404

            index = await (await c.get("/templates/index.json")).json()
            names = [t["name"] for t in index[0]["templates"]]
            assert names[0] == "txt2img_shapes" and "txt2img_sd15" in names  # workflows/, default first
            assert await (await c.get("/templates/index.fr.json")).json() == index
            assert await (await c.get("/templates/index_logo.json")).json() == {}
            assert (await c.get("/templates/other.json")).status == 404
            assert await (await c.get("/api/global_subgraphs")).json() == {}
            folders = await (await c.get("/api/experiment/models")).json()
            assert {"name": "checkpoints", "folders": [str(tmp_path / "models/checkpoints"),
                                                       str(tmp_path / "models/Stable-diffusion"),
                                                       str(EMBEDDED_CHECKPOINT.parent)]
                    } in folders
            files = await (await c.get("/api/experiment/models/checkpoints")).json()
            assert [(f["name"], f["pathIndex"], f["size"]) for f in files] == \
                [("mixgraph-shapes.safetensors", 2, EMBEDDED_CHECKPOINT.stat().st_size),
                 ("sub/a.safetensors", 0, 3)]
            assert (await c.get("/api/experiment/models/nope")).status == 404
            assert await (await c.get("/internal/files/output")).json() == ["new.png", "old.png"]
            assert (await c.get("/internal/files/models")).status == 400
            assert "checkpoints" in await (await c.get("/internal/folder_paths")).json()
            raw = await (await c.get("/internal/logs/raw")).json()
            assert set(raw) == {"entries", "size"}
            foreign = {"Origin": "http://evil.example"}
            r = await c.patch("/internal/logs/subscribe", json={"enabled": True,
                                                                "clientId": "me"}, headers=foreign)
            assert r.status == 403
            r = await c.patch("/internal/logs/subscribe", json={"enabled": True, "clientId": "me"})
            assert r.status == 200 and app[SERVER_KEY].logs.subscribers == {"me"}

            r = await c.get("/user.css")
            assert r.status == 200 and r.content_type == "text/css" and await r.text() == ""
            assert await (await c.get("/api/userdata/comfy.templates.json")).json() == []
            assert await (await c.get("/api/userdata?dir=workflows")).json() == []
            assert await (await c.get("/api/userdata?dir=subgraphs")).json() == []
            stats = await (await c.get("/api/system_stats")).json()
            assert "--disable-api-nodes" in stats["system"]["argv"]

    asyncio.run(main())


def test_editor_templates_serve_workflows_graphs_and_thumbnails(tmp_path):
    """/templates/*: the index of workflows/ (README titles), each as an editor graph that the
    server's own UI-format reader turns back into the file's prompt, and a PNG thumbnail."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from mixgraph.graph.env import Env
    from mixgraph.graph.formats.ui_format import convert_ui
    from mixgraph.ui.api import default_registry, load
    from mixgraph.ui.server.server import create_app

    env = Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
              temp=tmp_path / "temp")
    registry = default_registry()
    workflows = ROOT / "workflows"

    async def main():
        app = create_app(env, registry=registry, user_dir=tmp_path / "user")
        async with TestServer(app) as server, TestClient(server) as c:
            index = await (await c.get("/templates/index.json")).json()
            templates = index[0]["templates"]
            assert templates[0]["name"] == "txt2img_shapes"
            assert {t["name"] for t in templates} == {p.stem for p in workflows.glob("*.json")}
            for t in templates:
                assert t["title"] and t["description"] and t["mediaSubtype"] == "png"
                r = await c.get(f"/templates/{t['name']}-1.png")
                assert r.status == 200 and (await r.read())[:8] == b"\x89PNG\r\n\x1a\n", t["name"]
                graph = await (await c.get(f"/templates/{t['name']}.json")).json()
                assert graph["nodes"] and graph["version"] == 0.4
                back = convert_ui(graph, registry)
                want = load(workflows / f"{t['name']}.json", registry)
                assert {k: (v.class_type, v.inputs) for k, v in back.prompt.items()} == \
                    {k: (v.class_type, v.inputs) for k, v in want.prompt.items()}, t["name"]
            assert (await c.get("/templates/nothing.json")).status == 404
            assert (await c.get("/templates/nothing-1.png")).status == 404
            assert (await c.get("/templates/..%2Fsecret.json")).status == 404

    asyncio.run(main())


def test_editor_runs_the_z_image_turbo_default_graph(tmp_path):
    """The frontend's own default graph (Z-Image Turbo: UNETLoader, CLIPLoader type lumina2,
    VAELoader, EmptySD3LatentImage, ModelSamplingAuraFlow, KSampler res_multistep) loaded into the
    editor with its three files in place (tiny stand-ins under the real names), shrunk to 64x64 and
    2 steps in its widgets, and queued with the Run button: the prompt succeeds and its picture
    appears in the Save Image node."""
    from tests.fixtures.tiny_dit_templates import write_standin
    from tests.test_dit_templates import ALL, DEFAULT_GRAPH, MODELS

    sync_playwright = _browser_or_skip()
    deadline = time.monotonic() + 240
    graph = json.loads(json.dumps(ALL[DEFAULT_GRAPH]))
    for rel in ("diffusion_models/z_image_turbo_bf16.safetensors", "text_encoders/qwen_3_4b.safetensors",
                "vae/ae.safetensors"):
        write_standin(tmp_path / "models" / rel, MODELS[rel])
    for n in graph["nodes"]:
        if n["type"] == "EmptySD3LatentImage":
            n["widgets_values"][:3] = [64, 64, 1]
        elif n["type"] == "KSampler":
            n["widgets_values"][2] = 2  # steps
    proc, url = _start_server(tmp_path, time.monotonic() + 30)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(60_000)
                page.goto(url + "/", wait_until="domcontentloaded")
                page.wait_for_function("() => !!(window.app?.graph && window.mixgraph?.loaded"
                                       " && window.LiteGraph?.registered_node_types?.EmptySD3LatentImage)")
                page.evaluate("(g) => window.app.loadGraphData(g)", graph)
                page.wait_for_function("() => window.app.graph.nodes.some(n => n.type === 'ModelSamplingAuraFlow')")
                missing = page.evaluate("() => window.app.graph.nodes.filter(n => !LiteGraph.registered_node_types[n.type])"
                                        ".map(n => n.type)")
                assert missing == []
                page.evaluate("""() => {
                    const api = window.comfyAPI.api.api;
                    const finish = (e) => { window.__zimageDone ??= e.detail; };
                    api.addEventListener('execution_success', finish);
                    api.addEventListener('execution_error', finish);
                }""")
                page.get_by_role("button", name="Run", exact=True).first.click()
                left = max(1.0, deadline - time.monotonic()) * 1000
                detail = page.wait_for_function("() => window.__zimageDone", timeout=left).json_value()
                assert "exception_message" not in detail, detail
                save = page.evaluate("() => window.app.graph.nodes.find(n => n.type === 'SaveImage').id")
                page.wait_for_function(f"() => (window.app.graph.getNodeById({save}).imgs || []).length > 0")
            finally:
                browser.close()
    finally:
        _stop(proc)
    saved = sorted((tmp_path / "output").rglob("*.png"))
    assert len(saved) == 1


def test_editor_runs_the_wan_text_to_video_template(tmp_path):
    """ComfyUI's Wan 2.1 text-to-video template (UNETLoader, CLIPLoader type wan, VAELoader,
    EmptyHunyuanLatentVideo, ModelSamplingSD3, KSampler, VAEDecode, CreateVideo, SaveVideo) loaded
    into the editor with tiny stand-ins under its file names, shrunk in its widgets, and queued with
    the Run button: the prompt succeeds, SaveVideo's `executed` message carries the MP4 as the
    editor previews a video, and the file holds the frames the latent's length gives."""
    import av

    from tests.fixtures.tiny_video_templates import write_standin
    from tests.test_video_templates import ALL, LENGTH, MODELS, SIZE, WAN_T2V

    sync_playwright = _browser_or_skip()
    deadline = time.monotonic() + 240
    graph = json.loads(json.dumps(ALL[WAN_T2V]))
    for rel in ("diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors", "vae/wan_2.1_vae.safetensors"):
        write_standin(tmp_path / "models" / rel, MODELS[rel])
    for n in graph["nodes"]:
        if n["type"] == "EmptyHunyuanLatentVideo":
            n["widgets_values"][:4] = [SIZE, SIZE, LENGTH, 1]
        elif n["type"] == "KSampler":
            n["widgets_values"][2] = 2  # steps
    proc, url = _start_server(tmp_path, time.monotonic() + 30)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(60_000)
                page.goto(url + "/", wait_until="domcontentloaded")
                page.wait_for_function("() => !!(window.app?.graph && window.mixgraph?.loaded"
                                       " && window.LiteGraph?.registered_node_types?.SaveVideo)")
                page.evaluate("(g) => window.app.loadGraphData(g)", graph)
                page.wait_for_function("() => window.app.graph.nodes.some(n => n.type === 'SaveVideo')")
                missing = page.evaluate("() => window.app.graph.nodes.filter(n => !LiteGraph.registered_node_types[n.type])"
                                        ".map(n => n.type)")
                assert missing == []
                page.evaluate("""() => {
                    const api = window.comfyAPI.api.api;
                    window.__wanShown = [];
                    api.addEventListener('executed', (e) => window.__wanShown.push(e.detail));
                    const finish = (e) => { window.__wanDone ??= e.detail; };
                    api.addEventListener('execution_success', finish);
                    api.addEventListener('execution_error', finish);
                }""")
                page.get_by_role("button", name="Run", exact=True).first.click()
                left = max(1.0, deadline - time.monotonic()) * 1000
                detail = page.wait_for_function("() => window.__wanDone", timeout=left).json_value()
                assert "exception_message" not in detail, detail
                shown = page.evaluate("() => window.__wanShown")
            finally:
                browser.close()
    finally:
        _stop(proc)
    save = next(n["id"] for n in graph["nodes"] if n["type"] == "SaveVideo")
    (out,) = [s["output"] for s in shown if str(s["node"]) == str(save)]
    assert out["animated"] == [True] and out["images"][0]["filename"].endswith(".mp4")
    (video,) = sorted((tmp_path / "output").rglob("*.mp4"))
    with av.open(str(video)) as f:
        assert len(list(f.decode(video=0))) == LENGTH


def test_editor_runs_the_qwen_image_template(tmp_path):
    """ComfyUI's Qwen-Image text-to-image template (its graph inside a subgraph: UNETLoader, CLIPLoader
    type qwen_image, the Lightning LoRA, ModelSamplingAuraFlow, EmptySD3LatentImage, KSampler whose
    steps come from primitives through switches) loaded into the editor with tiny stand-ins under its
    file names, the latent shrunk in the subgraph's widgets, and queued with the Run button: the
    prompt succeeds and its picture appears in the Save Image node."""
    from tests.fixtures.tiny_video_templates import write_standin
    from tests.test_video_templates import ALL, MODELS

    sync_playwright = _browser_or_skip()
    deadline = time.monotonic() + 240
    graph = json.loads(json.dumps(ALL["templates_image_qwen_image.json"]))
    for rel in ("diffusion_models/qwen_image_fp8_e4m3fn.safetensors", "vae/qwen_image_vae.safetensors",
                "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
                "loras/Qwen-Image-Lightning-8steps-V1.0.safetensors"):
        write_standin(tmp_path / "models" / rel, MODELS[rel])
    for sub in graph["definitions"]["subgraphs"]:
        for n in sub["nodes"]:
            if n["type"] == "EmptySD3LatentImage":
                n["widgets_values"][:3] = [64, 64, 1]
    proc, url = _start_server(tmp_path, time.monotonic() + 30)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(60_000)
                page.goto(url + "/", wait_until="domcontentloaded")
                page.wait_for_function("() => !!(window.app?.graph && window.mixgraph?.loaded"
                                       " && window.LiteGraph?.registered_node_types?.ModelSamplingAuraFlow)")
                page.evaluate("(g) => window.app.loadGraphData(g)", graph)
                page.wait_for_function("() => window.app.graph.nodes.some(n => n.type === 'SaveImage')")
                page.evaluate("""() => {
                    const api = window.comfyAPI.api.api;
                    const finish = (e) => { window.__qwenDone ??= e.detail; };
                    api.addEventListener('execution_success', finish);
                    api.addEventListener('execution_error', finish);
                }""")
                page.get_by_role("button", name="Run", exact=True).first.click()
                left = max(1.0, deadline - time.monotonic()) * 1000
                detail = page.wait_for_function("() => window.__qwenDone", timeout=left).json_value()
                assert "exception_message" not in detail, detail
                save = page.evaluate("() => window.app.graph.nodes.find(n => n.type === 'SaveImage').id")
                page.wait_for_function(f"() => (window.app.graph.getNodeById({save}).imgs || []).length > 0")
            finally:
                browser.close()
    finally:
        _stop(proc)
    from PIL import Image

    (saved,) = sorted((tmp_path / "output").rglob("*.png"))
    assert Image.open(saved).size == (64, 64)
