"""ComfyUI's video nodes (LoadVideo, CreateVideo, GetVideoComponents, SaveVideo, SaveWEBM) and the
animated image savers, through the engine; files read back with PyAV and Pillow."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import av
import pytest
import torch
from PIL import Image

from mixgraph.graph.executor import ValidationFailed
from mixgraph.graph.report import NodeError
from mixgraph.nodes.helpers.video import files as video_files
from mixgraph.nodes.media import video_codec
from mixgraph.nodes.payloads.video import Audio, VideoComponents, VideoFromComponents, VideoFromFile
from mixgraph.ui import api

INFO = api.default_registry().object_info()


def frames(n=6, h=32, w=48) -> torch.Tensor:
    """A moving gradient: frame i is brighter than frame i - 1 (lossy codecs keep the order)."""
    ramp = torch.linspace(0, 0.5, w).view(1, 1, w, 1).expand(n, h, w, 3)
    return (ramp + torch.arange(n).view(n, 1, 1, 1) * 0.08).clamp(0, 1).contiguous()  # [N, H, W, 3]


def read_back(path):
    """(codec, frame count, (width, height), average rate, stream types, metadata) of a file."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        count = sum(1 for _ in c.decode(video=0))
        return (s.codec_context.name, count, (s.width, s.height), s.average_rate,
                sorted(x.type for x in c.streams), dict(c.metadata))


def test_video_nodes_specs_match_comfyui():
    load = INFO["LoadVideo"]
    options, extra = load["input"]["required"]["file"]
    assert extra.get("video_upload") is True and load["output"] == ["VIDEO"]
    assert load["category"] == "image/video" and load["display_name"] == "Load Video"
    create = INFO["CreateVideo"]
    assert create["input"]["required"]["fps"][1] == {"default": 30.0, "min": 1.0, "max": 120.0, "step": 1.0}
    assert create["input"]["optional"]["audio"][0] == "AUDIO" and create["output"] == ["VIDEO"]
    comps = INFO["GetVideoComponents"]
    assert comps["output"] == ["IMAGE", "AUDIO", "FLOAT"] and comps["output_name"] == ["images", "audio", "fps"]
    save = INFO["SaveVideo"]["input"]["required"]
    assert save["filename_prefix"][1]["default"] == "video/ComfyUI"
    assert save["format"][0] == ["auto", "mp4"] and save["codec"][0] == ["auto", "h264"]
    # today's ComfyUI passes the saved video on ("The input video, unchanged.")
    assert INFO["SaveVideo"]["output_node"] is True and INFO["SaveVideo"]["output"] == ["VIDEO"]
    assert INFO["SaveVideo"]["output_name"] == ["video"] and INFO["SaveWEBM"]["output"] == ["IMAGE"]
    webm = INFO["SaveWEBM"]["input"]["required"]
    assert webm["codec"][0] == ["vp9", "av1"] and webm["filename_prefix"][1]["default"] == "ComfyUI"
    assert webm["fps"][1]["default"] == 24.0 and webm["crf"][1]["default"] == 32.0
    assert webm["crf"][1]["max"] == 63.0


def test_video_save_video_writes_h264_mp4_read_back_by_pyav(tmp_path):
    g = api.Graph()
    img = g.add("EmptyImage", width=48, height=32, batch_size=7, color=0x336699)
    vid = g.add("CreateVideo", images=img, fps=12.0)
    save = g.add("SaveVideo", video=vid, filename_prefix="video/clip", format="auto", codec="auto")
    res = api.run(g, output=tmp_path)
    ui = res.ui[save.node_id]
    assert ui["images"] == [{"filename": "clip_00001_.mp4", "subfolder": "video", "type": "output"}]
    assert list(ui["animated"]) == [True]
    codec, count, size, rate, streams, meta = read_back(tmp_path / "video" / "clip_00001_.mp4")
    assert (codec, count, size, rate, streams) == ("h264", 7, (48, 32), 12, ["video"])
    assert "prompt" in meta and json.loads(meta["prompt"])[vid.node_id]["class_type"] == "CreateVideo"


def test_video_save_webm_vp9_and_av1_read_back(tmp_path):
    images = frames(5)
    for codec, decoder in (("vp9", "vp9"), ("av1", "libdav1d")):
        (entry,) = video_files.save_webm(images, tmp_path, "webm/w", codec, 8.0, 30.0, prompt={"1": {}})
        got = read_back(tmp_path / "webm" / entry["filename"])
        assert got[:5] == (decoder, 5, (48, 32), 8, ["video"])
        assert json.loads(got[5]["PROMPT"]) == {"1": {}}  # Matroska writes tag names in capitals
    assert sorted(p.name for p in (tmp_path / "webm").iterdir()) == ["w_00001_.webm", "w_00002_.webm"]


def test_video_save_webm_node_and_executed_ui(tmp_path):
    g = api.Graph()
    img = g.add("EmptyImage", width=32, height=16, batch_size=3, color=0xFF0000)
    save = g.add("SaveWEBM", images=img, filename_prefix="x", codec="vp9", fps=24.0, crf=20.0)
    res = api.run(g, output=tmp_path)
    ui = res.ui[save.node_id]
    assert ui["images"] == [{"filename": "x_00001_.webm", "subfolder": "", "type": "output"}]
    assert list(ui["animated"]) == [True]
    assert read_back(tmp_path / "x_00001_.webm")[:4] == ("vp9", 3, (32, 16), 24)


def test_video_load_then_components_round_trip(tmp_path):
    src = frames(8)
    (tmp_path / "in").mkdir()
    video_files.create_video(src, 10.0, None).save_to(tmp_path / "in" / "clip.mp4")
    (tmp_path / "in" / "notes.txt").write_text("not a video")
    assert video_files.list_videos(type("E", (), {"input": tmp_path / "in"})) == ["clip.mp4"]
    g = api.Graph()
    load = g.add("LoadVideo", file="clip.mp4")
    parts = g.add("GetVideoComponents", video=load)
    g.add("PreviewImage", images=parts[0])
    res = api.run(g, input=tmp_path / "in", output=tmp_path / "out")
    images, audio, fps = res[parts.node_id]
    assert images.shape == (8, 32, 48, 3) and images.dtype == torch.float32 and audio is None and fps == 10.0
    assert (images - src).abs().mean() < 0.02  # H.264 at its default quality on a smooth ramp
    brightness = images.mean(dim=(1, 2, 3))
    assert bool((brightness[1:] > brightness[:-1]).all())  # frame order kept
    video = res[load.node_id][0]
    assert isinstance(video, VideoFromFile) and video.dimensions() == (48, 32)
    assert video.frame_rate() == 10 and video.info.codec == "h264"


def test_video_create_with_audio_keeps_audio_in_mp4(tmp_path):
    rate, n, fps = 16000, 12, 24.0
    t = torch.arange(rate) / rate
    wave = torch.stack([torch.sin(2 * math.pi * 440 * t), 0.5 * torch.sin(2 * math.pi * 220 * t)])[None]  # [1,2,S]
    video = video_files.create_video(frames(n), fps, Audio(wave, rate))
    (entry,) = video_files.save_video(video, tmp_path, "a", "mp4", "h264")
    path = tmp_path / entry["filename"]
    assert read_back(path)[4] == ["audio", "video"]
    with av.open(str(path)) as c:
        a = c.streams.audio[0]
        assert a.codec_context.name == "aac" and a.sample_rate == rate and a.channels == 2
    loaded = VideoFromFile.open(path).components()
    assert loaded.audio is not None and loaded.audio.sample_rate == rate
    got = loaded.audio.waveform
    expected = math.ceil(rate / fps * n)  # ComfyUI cuts the sound to the pictures' length
    assert got.shape[:2] == (1, 2) and expected <= got.shape[2] < expected + 2048  # AAC pads a frame
    rms = got[0, :, 2000:6000].pow(2).mean(dim=1).sqrt()  # sines of amplitude 1 and 0.5: 0.707, 0.354
    assert torch.allclose(rms, torch.tensor([0.5 ** 0.5, 0.5 ** 1.5]), atol=0.02)  # channels kept apart
    # A file saved again unchanged has its packets copied: same audio, same pictures.
    (again,) = video_files.save_video(VideoFromFile.open(path), tmp_path, "b", "auto", "auto")
    assert read_back(tmp_path / again["filename"])[:5] == read_back(path)[:5]


def test_video_components_payload_checks_its_shape():
    with pytest.raises(ValueError, match="frame rate 0.0 must be positive"):
        VideoFromComponents(VideoComponents(frames(2), Fraction(0)))
    with pytest.raises(ValueError, match=r"IMAGE \[N, H, W, 3\] with N >= 1"):
        VideoFromComponents(VideoComponents(torch.zeros(0, 4, 4, 3), Fraction(1)))
    with pytest.raises(ValueError, match="CreateVideo fps -1.0: must be positive"):
        video_files.create_video(frames(2), -1.0, None)
    with pytest.raises(ValueError, match=r"\[batch, channels, samples\]"):
        Audio(torch.zeros(10), 8000)
    with pytest.raises(ValueError, match="video format 'mkv'"):
        video_files.create_video(frames(2), 1.0, None).save_to("x", format="mkv")


def test_video_odd_sides_are_refused_by_name(tmp_path):
    with pytest.raises(video_codec.VideoFileError, match="SaveWEBM: 16x15 px frames .* sides must be even"):
        video_files.save_webm(torch.rand(2, 15, 16, 3), tmp_path, "odd", "vp9", 8.0, 32)
    g = api.Graph()
    img = g.add("EmptyImage", width=7, height=8, batch_size=2, color=0)
    g.add("SaveVideo", video=g.add("CreateVideo", images=img, fps=3.0), filename_prefix="x", format="auto",
          codec="auto")
    with pytest.raises(NodeError, match=r"SaveVideo.*SaveVideo video: 7x8 px frames cannot be stored"):
        api.run(g, output=tmp_path)


def test_video_bad_inputs_name_the_node_input(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "fake.mp4").write_text("this is text, not a video")
    for name, words in (("fake.mp4", "LoadVideo file 'fake.mp4': not a readable video"),):
        g = api.Graph()
        g.add("SaveVideo", video=g.add("LoadVideo", file=name), filename_prefix="x", format="auto", codec="auto")
        with pytest.raises(NodeError, match=words):
            api.run(g, input=inp, output=tmp_path / "out")
    g = api.Graph()
    g.add("SaveVideo", video=g.add("LoadVideo", file="missing.mp4"), filename_prefix="x", format="auto",
          codec="auto")
    with pytest.raises(ValidationFailed, match="Invalid video file: missing.mp4 is missing"):
        api.run(g, input=inp, output=tmp_path / "out")
    g = api.Graph()
    img = g.add("EmptyImage", width=8, height=8, batch_size=2, color=0)
    g.add("SaveVideo", video=g.add("CreateVideo", images=img, fps=0.0), filename_prefix="x", format="auto",
          codec="auto")
    with pytest.raises(ValidationFailed, match="fps"):
        api.run(g, input=inp, output=tmp_path / "out")
    g = api.Graph()
    g.add("SaveWEBM", images=img, filename_prefix="x", codec="vp9", fps=0.0, crf=32.0)
    with pytest.raises(ValidationFailed, match="fps"):
        api.run(g, input=inp, output=tmp_path / "out")


def test_video_animated_webp_and_png_read_back_with_pillow(tmp_path):
    g = api.Graph()
    img = g.add("EmptyImage", width=20, height=10, batch_size=4, color=0x808080)
    img = g.add("ImageAddNoise", image=img, seed=1, strength=0.5)  # distinct frames: WEBP merges equal ones
    webp = g.add("SaveAnimatedWEBP", images=img, filename_prefix="anim/w", fps=5.0, lossless=True, quality=80,
                 method="default")
    png = g.add("SaveAnimatedPNG", images=img, filename_prefix="anim/p", fps=4.0, compress_level=4)
    res = api.run(g, output=tmp_path)
    assert res.ui[webp.node_id]["images"] == [{"filename": "w_00001_.webp", "subfolder": "anim", "type": "output"}]
    assert res.ui[png.node_id]["images"] == [{"filename": "p_00001_.png", "subfolder": "anim", "type": "output"}]
    with Image.open(tmp_path / "anim" / "w_00001_.webp") as im:
        im.seek(3)
        im.load()  # Pillow states a WEBP frame's duration and start once it is decoded
        assert im.n_frames == 4 and im.size == (20, 10) and im.info["duration"] == 200
        assert im.info["timestamp"] == 600
    with Image.open(tmp_path / "anim" / "p_00001_.png") as im:
        assert im.n_frames == 4 and im.size == (20, 10) and im.info["duration"] == 250


def test_video_slice_keeps_the_window_and_its_sound(tmp_path):
    spec = INFO["Video Slice"]
    assert spec["display_name"] == "Video Slice" and spec["output"] == ["VIDEO"]
    assert spec["input"]["required"]["start_time"][1]["min"] == -1e5
    assert spec["input"]["required"]["strict_duration"][1]["default"] is False
    images = frames(10)  # 10 frames at 5 fps: 2 s, frame i at i / 5 s
    wave = torch.arange(2 * 8000, dtype=torch.float32).view(1, 1, -1)  # 2 s at 8 kHz, value = sample index
    video = video_files.create_video(images, 5.0, Audio(wave, 8000))
    cut = video_files.slice_video(video, 0.4, 1.0, strict_duration=True)
    assert torch.equal(cut.parts.images, images[2:7]) and cut.frame_rate() == 5
    assert cut.parts.audio.waveform.shape == (1, 1, 8000) and float(cut.parts.audio.waveform[0, 0, 0]) == 3200
    tail = video_files.slice_video(video, -0.6, 0.0, strict_duration=False)  # the last 0.6 s
    assert torch.equal(tail.parts.images, images[7:])
    with pytest.raises(ValueError, match="less than the duration 3 s"):
        video_files.slice_video(video, 0.0, 3.0, strict_duration=True)
    assert video_files.slice_video(video, 1.0, 3.0, strict_duration=False).frame_count() == 5
    with pytest.raises(ValueError, match="no frame lies in the window"):
        video_files.slice_video(video, 5.0, 0.0, strict_duration=False)
    # Through the engine, from a file.
    (tmp_path / "in").mkdir()
    video_files.create_video(images, 5.0, None).save_to(tmp_path / "in" / "c.mp4")
    g = api.Graph()
    s = g.add("Video Slice", video=g.add("LoadVideo", file="c.mp4"), start_time=1.0, duration=0.4,
              strict_duration=False)
    parts = g.add("GetVideoComponents", video=s)
    g.add("PreviewImage", images=parts[0])
    res = api.run(g, input=tmp_path / "in", output=tmp_path / "out")
    assert res[parts.node_id][0].shape == (2, 32, 48, 3) and res[parts.node_id][2] == 5.0


def test_image_compare_previews_both_batches(tmp_path):
    spec = INFO["ImageCompare"]
    assert spec["output_node"] is True and spec["display_name"] == "Image Compare"
    assert spec["input"]["optional"]["compare_view"][0] == "IMAGECOMPARE"
    assert spec["input"]["optional"]["image_a"][0] == "IMAGE"
    g = api.Graph()
    a = g.add("EmptyImage", width=8, height=4, batch_size=2, color=0)
    cmp_ = g.add("ImageCompare", image_a=a)
    res = api.run(g, output=tmp_path / "out")
    ui = res.ui[cmp_.node_id]
    assert ui["b_images"] == [] and len(ui["a_images"]) == 2
    first = ui["a_images"][0]
    assert first["type"] == "temp" and first["filename"].startswith("comfy.compare.a_temp_")


def test_video_nodes_from_an_editor_workflow(tmp_path):
    """The widget values the video templates save (LoadVideo's upload widget value, CreateVideo's
    fps, SaveVideo's three) read as ComfyUI's editor writes them."""
    (tmp_path / "in").mkdir()
    video_files.create_video(frames(4), 8.0, None).save_to(tmp_path / "in" / "driving.mp4")
    wf = {"last_node_id": 4, "last_link_id": 3, "version": 0.4, "nodes": [
        {"id": 1, "type": "LoadVideo", "inputs": [], "widgets_values": ["driving.mp4", "image"],
         "outputs": [{"name": "VIDEO", "type": "VIDEO", "links": [1]}]},
        {"id": 2, "type": "GetVideoComponents", "widgets_values": [],
         "inputs": [{"name": "video", "type": "VIDEO", "link": 1}],
         "outputs": [{"name": "images", "type": "IMAGE", "links": [2]},
                     {"name": "audio", "type": "AUDIO", "links": []},
                     {"name": "fps", "type": "FLOAT", "links": []}]},
        {"id": 3, "type": "CreateVideo", "widgets_values": [16],
         "inputs": [{"name": "images", "type": "IMAGE", "link": 2},
                    {"name": "audio", "shape": 7, "type": "AUDIO", "link": None}],
         "outputs": [{"name": "VIDEO", "type": "VIDEO", "links": [3]}]},
        {"id": 4, "type": "SaveVideo", "widgets_values": ["video/ComfyUI", "auto", "auto"],
         "inputs": [{"name": "video", "type": "VIDEO", "link": 3}], "outputs": []}],
        "links": [[1, 1, 0, 2, 0, "VIDEO"], [2, 2, 0, 3, 0, "IMAGE"], [3, 3, 0, 4, 0, "VIDEO"]]}
    res = api.run(wf, input=tmp_path / "in", output=tmp_path / "out")
    (entry,) = res.ui["4"]["images"]
    assert entry == {"filename": "ComfyUI_00001_.mp4", "subfolder": "video", "type": "output"}
    assert read_back(tmp_path / "out" / "video" / entry["filename"])[:4] == ("h264", 4, (48, 32), 16)


def test_preview_video_writes_temp_mp4_and_passes_the_video_on(tmp_path):
    spec = INFO["PreviewVideo"]
    assert spec["output"] == ["VIDEO"] and spec["output_name"] == ["video"] and spec["output_node"] is True
    g = api.Graph()
    vid = g.add("CreateVideo", images=g.add("EmptyImage", width=16, height=8, batch_size=3, color=0), fps=6.0)
    prev = g.add("PreviewVideo", video=vid)
    g.add("SaveVideo", video=prev, filename_prefix="x", format="auto", codec="auto")
    res = api.run(g, output=tmp_path / "out")
    (entry,) = res.ui[prev.node_id]["images"]
    assert entry["type"] == "temp" and entry["filename"].startswith("preview_video_")
    assert list(res.ui[prev.node_id]["animated"]) == [True]
    assert res[prev.node_id][0] is res[vid.node_id][0]


def test_video_integer_audio_decodes_to_float_and_saves(tmp_path):
    """A file whose sound is 16-bit PCM gives a float waveform in -1..1 (resampled, as ComfyUI's
    later releases), and saves again."""
    import numpy as np
    path = tmp_path / "pcm.mkv"
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=10)
        v.width, v.height, v.pix_fmt = 16, 16, "yuv420p"
        a = c.add_stream("pcm_s16le", rate=8000, layout="mono")
        for _ in range(5):
            c.mux(v.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")))
        c.mux(v.encode(None))
        pcm = (np.sin(np.arange(4000) / 10) * 16384).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate, frame.pts = 8000, 0
        c.mux(a.encode(frame))
        c.mux(a.encode(None))
    video = VideoFromFile.open(path)
    assert video.info.has_audio and video.info.container.startswith("matroska")
    audio = video.components().audio
    assert audio.waveform.shape == (1, 1, 4000) and audio.waveform.dtype == torch.float32
    assert abs(float(audio.waveform.abs().max()) - 0.5) < 0.01
    (entry,) = video_files.save_video(video, tmp_path, "pcm", "auto", "auto")
    assert read_back(tmp_path / entry["filename"])[1:5] == (5, (16, 16), 10, ["audio", "video"])
