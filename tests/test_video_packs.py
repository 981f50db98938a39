"""VIDEO and AUDIO at the custom-pack boundary: a V1 pack gets a ComfyUI `VideoInput` from
LoadVideo / CreateVideo (isinstance holds, get_components gives frames and an AUDIO dict), builds
its own with `InputImpl.VideoFromComponents` / `VideoFromFile`, and mixgraph's SaveVideo and
GetVideoComponents take what it returns."""

from __future__ import annotations

import math
import textwrap

import av
import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor
from mixgraph.nodes.helpers.video import files as video_files
from mixgraph.nodes.payloads.video import Audio, VideoFromComponents, VideoFromFile
from mixgraph.ui.comfy import custom_nodes
from tests.test_custom_nodes import fresh_registry

PACK = '''
import os
from fractions import Fraction

import torch
from comfy_api.latest import Input, InputImpl, Types


class MgVideoInfo:
    """Reads a VIDEO as ComfyUI packs do; returns it darkened, with its sound halved."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO",)}}

    RETURN_TYPES = ("STRING", "VIDEO", "AUDIO")
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, video):
        assert isinstance(video, Input.Video), type(video)
        parts = video.get_components()
        w, h = video.get_dimensions()
        audio = parts.audio
        text = f"{w}x{h} {video.get_frame_count()} {float(video.get_frame_rate()):g} {audio is not None}"
        if audio is not None:
            audio = {"waveform": audio["waveform"] * 0.5, "sample_rate": audio["sample_rate"]}
        out = InputImpl.VideoFromComponents(Types.VideoComponents(images=parts.images * 0.5,
                                                                  frame_rate=Fraction(parts.frame_rate),
                                                                  audio=audio))
        return (text, out, audio)


class MgVideoFromPath:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"path": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, path):
        return (InputImpl.VideoFromFile(path),)


NODE_CLASS_MAPPINGS = {"MgVideoInfo": MgVideoInfo, "MgVideoFromPath": MgVideoFromPath}
'''


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("videopacks")
    for d in ("in", "out", "temp", "models"):
        (root / d).mkdir()
    folder = root / "nodes" / "mg_video_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(PACK))
    env = Env(models=(root / "models",), input=root / "in", output=root / "out", temp=root / "temp")
    reg = fresh_registry()
    report = custom_nodes.load_packs([root / "nodes"], reg, env)
    assert not report.failed, report.failed
    return reg, env


def run(reg, env, prompt):
    report = Executor(reg, env, OutputCache(2**24)).run(prompt)
    assert report.status == "success", report
    return report


def test_video_pack_reads_and_returns_video_and_audio(pack):
    reg, env = pack
    rate = 8000
    wave = torch.sin(2 * math.pi * 300 * torch.arange(rate) / rate).view(1, 1, -1)  # [1, 1, S]
    images = torch.full((6, 16, 24, 3), 0.8)
    video_files.create_video(images, 12.0, Audio(wave, rate)).save_to(env.input / "clip.mp4")
    prompt = {"1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
              "2": {"class_type": "MgVideoInfo", "inputs": {"video": ["1", 0]}},
              "3": {"class_type": "GetVideoComponents", "inputs": {"video": ["2", 1]}},
              "4": {"class_type": "SaveVideo", "inputs": {"video": ["2", 1], "filename_prefix": "p",
                                                          "format": "auto", "codec": "auto"}},
              "5": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
    report = run(reg, env, prompt)
    text, video, audio = report.values["2"]
    assert text == "24x16 6 12 True"
    assert isinstance(video, VideoFromComponents) and isinstance(audio, Audio) and audio.sample_rate == rate
    got_images, got_audio, fps = report.values["3"]
    assert fps == 12.0 and got_images.shape == (6, 16, 24, 3)
    assert abs(float(got_images.mean()) - 0.4) < 0.02  # the pack's darkening came through
    with av.open(str(env.output / "p_00001_.mp4")) as c:
        assert sorted(s.type for s in c.streams) == ["audio", "video"]
        assert sum(1 for _ in c.decode(video=0)) == 6


def test_video_pack_video_from_file_stays_a_file(pack):
    reg, env = pack
    path = env.input / "f.mp4"
    video_files.create_video(torch.rand(3, 8, 8, 3), 6.0, None).save_to(path)
    report = run(reg, env, {"1": {"class_type": "MgVideoFromPath", "inputs": {"path": str(path)}},
                            "2": {"class_type": "SaveVideo", "inputs": {"video": ["1", 0], "filename_prefix": "f",
                                                                        "format": "auto", "codec": "auto"}}})
    (video,) = report.values["1"]
    assert isinstance(video, VideoFromFile) and video.path == path and video.frame_count() == 3
    assert (env.output / "f_00001_.mp4").read_bytes() != b""
