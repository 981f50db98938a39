"""Memory guards (DESIGN §12, issue 24): images, videos and latents checked against the memory
budget before they are decoded or allocated, and refused fast with a message that names what is
wrong, through `mixgraph run`, `mixgraph validate` and POST /prompt.

Big images are made cheaply: a small PNG whose IHDR is rewritten to claim a huge size (PIL reads
only the header before the guard refuses it), or a small real image under a tiny budget. The
budget comes from `MIXGRAPH_MEMORY_BUDGET_GIB` (what a process without `--memory-budget` uses),
reset after each test. Each refusal is timed against a generous deadline: the point is no
minute-long estimate trace, not a benchmark."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import time
import zlib
from pathlib import Path

import pytest
import torch
from aiohttp import FormData
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from mixgraph.graph.env import Env
from mixgraph.nodes.helpers import imaging, latent_ops
from mixgraph.nodes.helpers.video import latent_ops as video_latent_ops
from mixgraph.nodes.media import memory_guards, video_codec
from mixgraph.nodes.models import memory_budget
from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
from mixgraph.ui import api
from mixgraph.ui.cli import EXIT_INVALID, main
from mixgraph.ui.estimate import memory_section, size_refusal

DEADLINE = 20.0     # seconds: generous; an estimate trace of these sizes takes minutes


@pytest.fixture
def budget(monkeypatch):
    """Set the CPU budget in GiB for this test (through the env default, as a process started
    without --memory-budget sees it); forgotten afterwards."""
    def set_gib(gib: float) -> None:
        monkeypatch.setenv(memory_budget.BUDGET_ENV, str(gib))
        memory_budget.reset()
    yield set_gib
    monkeypatch.delenv(memory_budget.BUDGET_ENV, raising=False)
    memory_budget.reset()


def huge_png(path: Path, width: int, height: int) -> Path:
    """A 1x1 PNG whose IHDR claims width x height (CRC fixed): PIL's header says the big size;
    decoding it would fail, but nothing may get that far."""
    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (10, 20, 30)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    at = data.index(b"IHDR")
    data[at + 4:at + 12] = struct.pack(">II", width, height)
    data[at + 17:at + 21] = struct.pack(">I", zlib.crc32(bytes(data[at:at + 17])) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    return path


def tiny_mp4(path: Path, frames: int = 16, side: int = 128) -> Path:
    images = torch.linspace(0, 1, frames).view(frames, 1, 1, 1).expand(frames, side, side, 3).contiguous()
    video_codec.encode_mp4(path, images, 8)
    return path


@pytest.fixture
def folders(tmp_path):
    for d in ("input", "output", "temp", "models/checkpoints"):
        (tmp_path / d).mkdir(parents=True)
    return tmp_path


def env_of(root: Path) -> Env:
    return Env(models=(root / "models",), input=root / "input", output=root / "output", temp=root / "temp")


def write_wf(root: Path, prompt: dict, name: str = "wf.json") -> Path:
    path = root / name
    path.write_text(json.dumps(prompt))
    return path


def empty_latent_wf(width=16384, height=16384, batch=4096) -> dict:
    return {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": width, "height": height,
                                                               "batch_size": batch}},
            "2": {"class_type": "SaveLatent", "inputs": {"samples": ["1", 0], "filename_prefix": "l"}}}


def load_image_wf(name="big.png") -> dict:
    return {"1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}


def cli(args: list[str], capsys) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    code = main(args)
    seconds = time.perf_counter() - t0
    out = capsys.readouterr()
    return code, out.out + out.err, seconds


# ------------------------------------------------------------------------------------------
# the guards themselves


def test_image_header_read_without_decoding_and_refused_by_budget(tmp_path, budget):
    budget(8)
    path = huge_png(tmp_path / "big.png", 30000, 30000)       # 900 MP
    h = memory_guards.image_header(path)
    assert (h.width, h.height, h.frames) == (30000, 30000, 1)
    t0 = time.perf_counter()
    with pytest.raises(memory_guards.OverBudget) as e:
        imaging.load_image(path, "LoadImage image 'big.png'")
    assert time.perf_counter() - t0 < DEADLINE
    msg = str(e.value)
    for part in ("'big.png'", "30000x30000", "900 MP", "GiB", "memory budget of 8.00 GiB", "--memory-budget"):
        assert part in msg, msg


def test_decompression_bomb_limit_is_replaced_by_the_budget(tmp_path, budget, monkeypatch):
    """An image over PIL's bomb limit but within the budget loads (no DecompressionBombError);
    PIL's limit is what it was afterwards."""
    budget(8)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)        # 64x64 is a "bomb" to PIL now
    path = tmp_path / "ok.png"
    Image.new("RGBA", (64, 48), (200, 100, 50, 128)).save(path)
    image, mask = imaging.load_image(path)
    assert image.shape == (1, 48, 64, 3) and mask.shape == (1, 48, 64)
    assert imaging.load_image_mask(path, "alpha").shape == (1, 48, 64)
    assert Image.MAX_IMAGE_PIXELS == 100
    with pytest.raises(Image.DecompressionBombError):          # others' opens still see PIL's limit
        Image.open(path)


def test_small_budget_refuses_a_real_image_and_the_message_names_it(tmp_path, budget):
    path = tmp_path / "real.png"
    Image.new("RGB", (256, 256)).save(path)
    budget(0.001)                                              # 1 MiB
    with pytest.raises(memory_guards.OverBudget, match=r"real\.png.*256x256 px.*over the memory budget"):
        imaging.load_image(path, "real.png")
    budget(1)
    assert imaging.load_image(path)[0].shape == (1, 256, 256, 3)


def test_latent_and_image_allocations_refused_before_allocating(budget):
    budget(8)
    for make, words in ((lambda: latent_ops.empty_latent(16384, 16384, 4096), "[4096, 4, 2048, 2048]"),
                        (lambda: latent_ops.empty_latent(16384, 16384, 4096, 16), "[4096, 16, 2048, 2048]"),
                        (lambda: video_latent_ops.empty_video_latent(16384, 16384, 1025, 64), "257"),
                        (lambda: latent_ops.repeat_batch(latent_ops.empty_latent(64, 64, 1), 10**9), "RepeatLatentBatch"),
                        (lambda: latent_ops.scale_image_by(torch.zeros(1, 8, 8, 3), "bilinear", 8000.0), "resizing")):
        t0 = time.perf_counter()
        with pytest.raises(memory_guards.OverBudget) as e:
            make()
        assert time.perf_counter() - t0 < DEADLINE
        assert words in str(e.value) and "memory budget of 8.00 GiB" in str(e.value), str(e.value)
    assert latent_ops.empty_latent(64, 64, 1).samples.shape == (1, 4, 8, 8)


def test_video_header_frames_and_decode_refused_before_decoding(tmp_path, budget):
    path = tiny_mp4(tmp_path / "v.mp4")
    info = video_codec.probe(path)
    assert (info.width, info.height, info.frames) == (128, 128, 16)
    video_codec.encode_webm(tmp_path / "v.webm", torch.rand(12, 32, 48, 3), "vp9", 8.0, 32, None)
    assert video_codec.probe(tmp_path / "v.webm").frames == 12     # WebM: duration x rate
    budget(1)
    assert video_codec.decode(path).images.shape == (16, 128, 128, 3)
    budget(0.005)                                              # 5 MiB < 16 x 128 x 128 x 30 bytes
    with pytest.raises(memory_guards.OverBudget, match=r"v\.mp4.*128x128 px x 16 frames.*memory budget"):
        video_codec.decode(path, "LoadVideo file 'v.mp4'")


# ------------------------------------------------------------------------------------------
# through mixgraph run / validate / the estimate


def test_cli_run_and_validate_refuse_a_huge_empty_latent_fast(folders, budget, capsys):
    """The txt2img workflow with an EmptyLatentImage of 16384x16384, batch 4096: refused before
    the estimate traces anything."""
    budget(8)
    write_sd15_checkpoint(folders / "models" / "checkpoints" / "sd15.safetensors", "tiny")
    wf = json.loads(Path("workflows/txt2img_sd15.json").read_text())
    wf["5"]["inputs"].update(width=16384, height=16384, batch_size=4096)
    path = write_wf(folders, wf)
    common = ["--models", str(folders / "models"), "--input", str(folders / "input")]
    code, text, seconds = cli(["run", str(path), *common, "--output", str(folders / "output"), "--quiet"], capsys)
    assert code == EXIT_INVALID and seconds < DEADLINE, text
    assert "not enough memory" in text and "EmptyLatentImage" in text and "[4096, 4, 2048, 2048]" in text, text
    assert "8.00 GiB" in text and "--memory-budget" in text, text
    code, text, seconds = cli(["validate", str(path), *common], capsys)
    assert code == EXIT_INVALID and seconds < DEADLINE and "EmptyLatentImage" in text, text
    code, text, _ = cli(["validate", str(path), *common, "--json"], capsys)
    body = json.loads(text)
    assert code == EXIT_INVALID and body["error"]["type"] == "insufficient_memory", body


def test_cli_refuses_a_900_megapixel_input_image_at_validation(folders, budget, capsys):
    budget(8)
    huge_png(folders / "input" / "big.png", 30000, 30000)
    path = write_wf(folders, load_image_wf())
    common = ["--models", str(folders / "models"), "--input", str(folders / "input")]
    for cmd in (["run", str(path), *common, "--output", str(folders / "output"), "--quiet"],
                ["validate", str(path), *common]):
        code, text, seconds = cli(cmd, capsys)
        assert code == EXIT_INVALID and seconds < DEADLINE, text
        assert "'big.png'" in text and "30000x30000" in text and "memory budget" in text, text
    code, text, _ = cli(["validate", str(path), *common, "--json"], capsys)
    errors = json.loads(text)["node_errors"]["1"]["errors"]
    assert errors[0]["type"] == "custom_validation_failed" and "30000x30000" in errors[0]["details"]


def test_size_refusal_follows_links_and_the_estimate_answers_without_tracing(folders, budget):
    """Sizes that grow along links (ImageScaleBy, RepeatImageBatch) and a video a node decodes;
    the estimate (`memory_section`, POST /mixgraph/estimate) says the same instead of tracing."""
    budget(1)
    Image.new("RGB", (512, 512)).save(folders / "input" / "a.png")
    tiny_mp4(folders / "input" / "v.mp4", frames=16, side=128)
    reg, env = api.default_registry(), env_of(folders)
    grow = {"1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
            "2": {"class_type": "ImageScaleBy", "inputs": {"image": ["1", 0], "upscale_method": "bilinear",
                                                           "scale_by": 8.0}},
            "3": {"class_type": "RepeatImageBatch", "inputs": {"image": ["2", 0], "amount": 64}},
            "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
    wf = api.load(write_wf(folders, grow))
    t0 = time.perf_counter()
    msg = size_refusal(wf, reg, env)
    assert time.perf_counter() - t0 < DEADLINE
    assert msg and "node 3 (RepeatImageBatch)" in msg and "[64, 4096, 4096, 3]" in msg, msg
    assert memory_section(wf, reg, env)["error"] == msg
    grow["3"]["inputs"]["amount"] = 1
    assert size_refusal(api.load(write_wf(folders, grow)), reg, env) is None
    video = {"1": {"class_type": "LoadVideo", "inputs": {"file": "v.mp4"}},
             "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
             "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}
    budget(0.005)
    msg = size_refusal(api.load(write_wf(folders, video)), reg, env)
    assert msg and "GetVideoComponents" in msg and "'v.mp4'" in msg and "16 frames" in msg, msg
    copy = {"1": video["1"], "2": {"class_type": "SaveVideo", "inputs": {"video": ["1", 0], "filename_prefix": "v",
                                                                          "format": "auto", "codec": "auto"}}}
    assert size_refusal(api.load(write_wf(folders, copy)), reg, env) is None   # copied, not decoded


# ------------------------------------------------------------------------------------------
# the server


def test_server_refuses_huge_latent_and_image_with_400_fast(folders, budget):
    from mixgraph.ui.server.limits import Limits
    from mixgraph.ui.server.server import create_app

    budget(8)
    huge_png(folders / "input" / "big.png", 30000, 30000)
    Image.new("RGB", (256, 256)).save(folders / "input" / "small.png")
    env = env_of(folders)

    async def body():
        app = create_app(env, user_dir=folders / "user", limits=Limits(max_batch_pixels=1 << 50),
                         unload_hooks=())
        async with TestServer(app) as server, TestClient(server) as c:
            t0 = time.perf_counter()
            r = await c.post("/prompt", json={"prompt": empty_latent_wf()})
            got = await r.json()
            assert time.perf_counter() - t0 < DEADLINE
            assert r.status == 400 and got["error"]["type"] == "insufficient_memory", got
            assert "EmptyLatentImage" in got["error"]["message"] and "8.00 GiB" in got["error"]["message"], got
            t0 = time.perf_counter()
            r = await c.post("/prompt", json={"prompt": load_image_wf()})
            got = await r.json()
            assert time.perf_counter() - t0 < DEADLINE
            assert r.status == 400 and "1" in got["node_errors"], got
            details = got["node_errors"]["1"]["errors"][0]["details"]
            assert "'big.png'" in details and "30000x30000" in details and "--memory-budget" in details, got
            r = await c.post("/mixgraph/estimate", json={"prompt": empty_latent_wf()})
            assert r.status == 400 and "EmptyLatentImage" in (await r.json())["error"]["message"]
            # an upload over the budget is refused by the same rule; /view of a big file is the file
            budget(0.001)
            form = FormData()
            buf = io.BytesIO()
            Image.new("RGB", (256, 256)).save(buf, format="PNG")
            form.add_field("image", buf.getvalue(), filename="up.png", content_type="image/png")
            r = await c.post("/upload/image", data=form)
            assert r.status == 400 and "memory budget" in await r.text()
            r = await c.get("/view", params={"filename": "small.png", "type": "input", "preview": "webp;90"})
            assert r.status == 200 and (await r.read())[:8] == b"\x89PNG\r\n\x1a\n"
    asyncio.run(body())
