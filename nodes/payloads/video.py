"""VIDEO and AUDIO edge values (ComfyUI's VideoInput / AudioInput).

A video is either frames in memory (`VideoFromComponents`, what CreateVideo makes) or a file
(`VideoFromFile`, what LoadVideo makes). The file is probed when the value is made (so a bad file
fails at LoadVideo, naming its input) and decoded only when its components are asked for; saving
it unchanged copies its packets, as ComfyUI's VideoFromFile does. Both answer the same questions
(`components()`, `dimensions()`, `frame_count()`, `frame_rate()`, `save_to()`), so nodes take
either.

AUDIO is ComfyUI's `{"waveform": [B, C, S], "sample_rate"}` as a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch

from mixgraph.nodes.media import video_codec

__all__ = ["Audio", "VideoComponents", "VideoFromComponents", "VideoFromFile", "Video", "VIDEO_FORMATS",
           "VIDEO_CODECS", "format_extension"]

#: SaveVideo's `format` and `codec` options (ComfyUI's VideoContainer / VideoCodec).
VIDEO_FORMATS = ("auto", "mp4")
VIDEO_CODECS = ("auto", "h264")


def format_extension(format: str) -> str:
    """The file ending a SaveVideo format writes (auto writes MP4)."""
    if format not in VIDEO_FORMATS:
        raise ValueError(f"video format {format!r}: expected one of {VIDEO_FORMATS}")
    return "mp4"


@dataclass(frozen=True)
class Audio:
    """Sound: ComfyUI's AUDIO dict as a value."""

    waveform: torch.Tensor  # [B, channels, samples] float
    sample_rate: int

    def __post_init__(self) -> None:
        if self.waveform.ndim != 3:
            raise ValueError(f"audio waveform must be [batch, channels, samples], got {tuple(self.waveform.shape)}")
        if self.sample_rate <= 0:
            raise ValueError(f"audio sample rate {self.sample_rate} must be positive")


@dataclass(frozen=True)
class VideoComponents:
    images: torch.Tensor  # [N, H, W, 3] float 0..1, N frames
    frame_rate: Fraction
    audio: Audio | None = None
    metadata: dict = field(default_factory=dict, compare=False)


def _check_rate(rate: Fraction | float) -> Fraction:
    rate = Fraction(rate)
    if rate <= 0:
        raise ValueError(f"video frame rate {float(rate)} must be positive")
    return rate


def _check_save(format: str, codec: str) -> None:
    if format not in VIDEO_FORMATS:
        raise ValueError(f"video format {format!r}: expected one of {VIDEO_FORMATS}")
    if codec not in VIDEO_CODECS:
        raise ValueError(f"video codec {codec!r}: expected one of {VIDEO_CODECS}")


@dataclass(frozen=True)
class VideoFromComponents:
    """A video made of frames in memory."""

    parts: VideoComponents

    def __post_init__(self) -> None:
        images = self.parts.images
        if images.ndim != 4 or images.shape[0] == 0 or images.shape[-1] != 3:
            raise ValueError(f"video frames must be an IMAGE [N, H, W, 3] with N >= 1, got {tuple(images.shape)}")
        _check_rate(self.parts.frame_rate)

    def components(self) -> VideoComponents:
        return self.parts

    def dimensions(self) -> tuple[int, int]:
        """(width, height)."""
        images = self.parts.images  # [N, H, W, 3]
        return int(images.shape[2]), int(images.shape[1])

    def frame_count(self) -> int:
        return int(self.parts.images.shape[0])

    def frame_rate(self) -> Fraction:
        return self.parts.frame_rate

    def save_to(self, path: Path, format: str = "auto", codec: str = "auto", metadata: dict | None = None,
                what: str = "video") -> None:
        """H.264 MP4 (ComfyUI supports no other format or codec for frames yet); errors name `what`."""
        _check_save(format, codec)
        c = self.parts
        audio = c.audio
        video_codec.encode_mp4(path, c.images, c.frame_rate, audio.waveform if audio else None,
                               audio.sample_rate if audio else 0, metadata, what)


@dataclass(frozen=True)
class VideoFromFile:
    """A video file, probed now, decoded when asked."""

    path: Path
    info: video_codec.VideoInfo

    @classmethod
    def open(cls, path: Path, what: str = "video") -> "VideoFromFile":
        """Probe `path`; VideoFileError naming `what` if it holds no readable video."""
        return cls(Path(path), video_codec.probe(Path(path), what))

    def components(self) -> VideoComponents:
        decoded = video_codec.decode(self.path, str(self.path))
        audio = Audio(decoded.waveform, decoded.sample_rate) if decoded.waveform is not None else None
        return VideoComponents(decoded.images, decoded.frame_rate, audio, decoded.metadata)

    def dimensions(self) -> tuple[int, int]:
        return self.info.width, self.info.height

    def frame_count(self) -> int:
        return int(self.components().images.shape[0])

    def frame_rate(self) -> Fraction:
        return self.info.frame_rate

    def save_to(self, path: Path, format: str = "auto", codec: str = "auto", metadata: dict | None = None,
                what: str = "video") -> None:
        """Copy the packets where the file already has the asked format and codec, else (or where
        the target container cannot hold a stream) re-encode the decoded frames (ComfyUI's rule)."""
        _check_save(format, codec)
        same_format = format == "auto" or format in self.info.container.split(",")
        same_codec = codec == "auto" or codec == self.info.codec
        if same_format and same_codec:
            try:
                video_codec.remux(self.path, path, metadata, str(self.path))
                return
            except video_codec.VideoFileError:  # a stream the target container cannot hold
                Path(path).unlink(missing_ok=True)
        VideoFromComponents(self.components()).save_to(path, format, codec, metadata, what)


Video = VideoFromComponents | VideoFromFile
