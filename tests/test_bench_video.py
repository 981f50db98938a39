"""`mixgraph bench precision` on a video workflow: ComfyUI's Wan 2.1 text-to-video template (its
SaveVideo takes a VIDEO made by CreateVideo from VAEDecode's frames) on the tiny stand-ins of
tests/test_video_templates.py, shrunk to 32x32, 5 frames, 2 steps. Each run reports the decoded
frame count and the time per frame; PSNR / SSIM compare all frames against the f32 run."""

import json
import math

import pytest
import torch

from mixgraph.graph.formats.workflow import dump_api, load_workflow
from mixgraph.ui import api
from mixgraph.ui.bench.bench_precision import COLUMNS, format_table, frame_count, ssim
from mixgraph.ui.cli import main
from tests.fixtures import tiny_video_templates

pytest.importorskip("av")

from tests.test_video_templates import ALL, LENGTH, LOADERS, MODELS, WAN_T2V, small_sets  # noqa: E402


@pytest.fixture(scope="module")
def wan_t2v(tmp_path_factory):
    """(workflow file in API format, models folder) for the shrunk Wan 2.1 t2v template."""
    root = tmp_path_factory.mktemp("bench_video")
    prompt = load_workflow(ALL[WAN_T2V], api.default_registry()).prompt
    files = {f"{LOADERS[(c.class_type, k)]}/{v}" for c in prompt.values() for k, v in c.inputs.items()
             if (c.class_type, k) in LOADERS and isinstance(v, str)}
    for rel in sorted(files):
        tiny_video_templates.write_standin(root / "models" / rel, MODELS[rel])
    wf = api.set_inputs(load_workflow(ALL[WAN_T2V], api.default_registry()), small_sets(prompt))
    path = root / "wan_t2v.json"
    path.write_text(json.dumps(dump_api(wf)))
    return path, root / "models"


def test_bench_precision_on_a_wan_video_workflow_reports_frames_and_s_per_frame(wan_t2v, tmp_path, capsys):
    path, models = wan_t2v
    code = main(["bench", "precision", str(path), "--precisions", "f32,bf16", "--json",
                 "--models", str(models), "--output", str(tmp_path / "out")])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["precision"] for r in data["runs"]] == ["f32", "bf16"]
    for run in data["runs"]:
        assert run["status"] == "ok", run
        assert run["frames"] == LENGTH                       # the decoded frames SaveVideo got
        assert run["s_per_frame"] == pytest.approx(run["seconds"] / LENGTH)
        assert run["steps"] == 2 and run["s_per_step"] > 0
        assert run["peak_rss_bytes"] > 50 * 2**20
    f32, bf16 = data["runs"]
    assert math.isinf(f32["psnr_db"]) and f32["ssim"] == 1.0
    assert math.isfinite(bf16["psnr_db"]) and 0 < bf16["ssim"] < 1
    table = format_table(data["runs"], COLUMNS)            # the text form has the columns too
    assert "s/frame" in table.splitlines()[0] and "frames" in table.splitlines()[0]


def test_frame_count_and_ssim_cover_every_frame():
    """A video's frames count one each; SSIM over a frame batch sees a change in any one frame."""
    a = torch.rand(5, 16, 16, 3, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b[4] = 1 - b[4]
    assert frame_count([a, a[:1]]) == 6
    assert ssim(a, a) == pytest.approx(1.0) and ssim(a, b) < 0.9


def test_bench_video_builds_the_full_size_shapes():
    """benchmarks/bench_video.py's models are the real architectures (meta device, no memory):
    Wan 2.1 1.3B's 1.42 B parameters, Qwen-Image's 20.4 B at 60 blocks (its txt_in 64 wide, as
    the script says) and 0.34 B per block, the unit of its extrapolation."""
    import importlib.util
    import math
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_video.py"
    spec = importlib.util.spec_from_file_location("bench_video", path)
    bench_video = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_video)
    count = lambda shapes: sum(math.prod(s) for s in shapes.values())  # noqa: E731
    assert count(bench_video.wan_shapes()) == pytest.approx(1.419e9, rel=1e-3)
    assert count(bench_video.qwen_shapes(60)) == pytest.approx(20.42e9, rel=1e-3)
    assert sum(v.numel() for v in bench_video.qwen_block_shapes().values()) == pytest.approx(0.3398e9, rel=1e-3)
    assert bench_video.store_bytes("fp8_e4m3fn:bf16") == 1 and bench_video.store_bytes("bf16") == 2
