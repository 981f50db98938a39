"""VIDEO and AUDIO at the custom-pack boundary: mixgraph's payloads (nodes/payloads/video.py) <->
ComfyUI's `VideoInput` objects and `{"waveform", "sample_rate"}` dicts.

A pack node gets a `PackVideo`: ComfyUI's VideoInput methods (`get_components`, `get_dimensions`,
`get_frame_count`, `get_frame_rate`, `get_duration`, `get_stream_source`, `get_container_format`,
`save_to`) over a mixgraph video. The host's `comfy_api` registers it as a virtual subclass of its
`VideoInput`, so `isinstance` checks in packs hold, and its own `VideoFromFile` /
`VideoFromComponents` are `PackVideo`s too. A pack's video output comes back as a mixgraph video:
a file stays a file (packets copied when saved unchanged), anything else becomes its frames.
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional

import torch

from mixgraph.nodes.media import video_codec
from mixgraph.nodes.payloads.video import (Audio, VideoComponents, VideoFromComponents, VideoFromFile,
                                           VIDEO_CODECS, VIDEO_FORMATS)

__all__ = ["ComfyVideoComponents", "PackVideo", "audio_to_comfy", "audio_from_comfy", "video_to_comfy",
           "video_from_comfy", "is_video", "file_video", "components_video"]


@dataclass
class ComfyVideoComponents:
    """ComfyUI's `VideoComponents` (comfy_api.util): frames, rate, audio dict, metadata."""

    images: torch.Tensor  # [N, H, W, 3]
    frame_rate: Fraction
    audio: Optional[dict] = None
    metadata: Optional[dict] = None


def audio_to_comfy(audio: Audio | None) -> dict | None:
    return None if audio is None else {"waveform": audio.waveform, "sample_rate": audio.sample_rate}


def audio_from_comfy(value: Any) -> Any:
    """A pack's AUDIO dict as `Audio`; anything else unchanged."""
    if isinstance(value, dict) and isinstance(value.get("waveform"), torch.Tensor) and "sample_rate" in value:
        waveform = value["waveform"]
        if waveform.ndim == 2:  # [C, S] from a pack that forgot the batch
            waveform = waveform.unsqueeze(0)  # [1, C, S]
        return Audio(waveform.float(), int(value["sample_rate"]))
    return value


def _text(value: Any) -> str:
    return value.value if hasattr(value, "value") else str(value)


class PackVideo:
    """ComfyUI's VideoInput API over a mixgraph video."""

    def __init__(self, video: VideoFromFile | VideoFromComponents):
        self.video = video

    def get_components(self) -> ComfyVideoComponents:
        parts = self.video.components()
        return ComfyVideoComponents(parts.images, parts.frame_rate, audio_to_comfy(parts.audio),
                                    dict(parts.metadata) or None)

    def get_dimensions(self) -> tuple[int, int]:
        return self.video.dimensions()

    def get_frame_count(self) -> int:
        return self.video.frame_count()

    def get_frame_rate(self) -> Fraction:
        return Fraction(self.video.frame_rate())

    def get_duration(self) -> float:
        return float(self.get_frame_count() / self.get_frame_rate())

    def get_stream_source(self) -> str | io.BytesIO:
        """The file's path; frames in memory are written to a temporary MP4 first."""
        if isinstance(self.video, VideoFromFile):
            return str(self.video.path)
        buf = io.BytesIO()
        self.save_to(buf)
        buf.seek(0)
        return buf

    def get_container_format(self) -> str:
        return self.video.info.container if isinstance(self.video, VideoFromFile) else "mov,mp4,m4a,3gp,3g2,mj2"

    def save_to(self, path: Any, format: Any = "auto", codec: Any = "auto", metadata: Optional[dict] = None) -> None:
        format, codec = _text(format), _text(codec)
        if format not in VIDEO_FORMATS or codec not in VIDEO_CODECS:
            raise ValueError(f"video format {format!r} / codec {codec!r}: supported are {VIDEO_FORMATS} / "
                             f"{VIDEO_CODECS}")
        if not isinstance(path, io.IOBase):
            self.video.save_to(Path(path), format, codec, metadata)
            return
        with tempfile.TemporaryDirectory() as tmp:  # FFmpeg's MP4 muxer seeks: write a file, then copy
            target = Path(tmp) / "video.mp4"
            self.video.save_to(target, format, codec, metadata)
            path.write(target.read_bytes())


def video_to_comfy(video: VideoFromFile | VideoFromComponents) -> PackVideo:
    return PackVideo(video)


def is_video(value: Any) -> bool:
    return isinstance(value, (VideoFromFile, VideoFromComponents))


def video_from_comfy(value: Any) -> Any:
    """A pack's VIDEO output as a mixgraph video; anything that is no video unchanged."""
    if isinstance(value, PackVideo):
        return value.video
    if is_video(value) or not callable(getattr(value, "get_components", None)):
        return value
    source = getattr(value, "get_stream_source", None)
    path = source() if callable(source) else None
    if isinstance(path, (str, os.PathLike)) and Path(path).is_file():
        return VideoFromFile.open(Path(path), "a custom node's video")
    parts = value.get_components()
    audio = audio_from_comfy(parts.audio) if parts.audio is not None else None
    return VideoFromComponents(VideoComponents(parts.images, Fraction(parts.frame_rate), audio))


def file_video(file: Any) -> PackVideo:
    """ComfyUI's `VideoFromFile(path or BytesIO)`: a path stays a file; a BytesIO is decoded now."""
    if isinstance(file, io.IOBase):
        decoded = video_codec.decode(file, "VideoFromFile(BytesIO)")
        audio = Audio(decoded.waveform, decoded.sample_rate) if decoded.waveform is not None else None
        return PackVideo(VideoFromComponents(VideoComponents(decoded.images, decoded.frame_rate, audio,
                                                             decoded.metadata)))
    return PackVideo(VideoFromFile.open(Path(file), f"VideoFromFile({os.fspath(file)!r})"))


def components_video(components: Any) -> PackVideo:
    """ComfyUI's `VideoFromComponents(VideoComponents(...))`."""
    audio = audio_from_comfy(components.audio) if components.audio is not None else None
    return PackVideo(VideoFromComponents(VideoComponents(components.images, Fraction(components.frame_rate),
                                                         audio)))

