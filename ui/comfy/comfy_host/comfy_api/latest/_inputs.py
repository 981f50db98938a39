"""The value types `comfy_api.latest.Input`, `InputImpl` and `Types` name: what an IMAGE, MASK,
AUDIO, LATENT and VIDEO value is at the pack boundary. Images, masks, audio and latents are the
plain tensors and dicts ComfyUI passes; a video from frames works in memory, while reading or
writing a video file needs a video codec library mixgraph does not ship, so those refuse by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any, Optional, TypedDict

import torch

ImageInput = torch.Tensor  # [B, H, W, C], float 0..1
MaskInput = torch.Tensor  # [B, H, W]


class AudioInput(TypedDict):
    waveform: torch.Tensor  # [B, channels, samples]
    sample_rate: int


class LatentInput(TypedDict):
    samples: torch.Tensor  # [B, C, H, W]
    noise_mask: Optional[MaskInput]
    batch_index: Optional[list[int]]


class VideoCodec(str, Enum):
    AUTO = "auto"
    H264 = "h264"

    @classmethod
    def as_input(cls) -> list[str]:
        """The codec names as a combo's options."""
        return [member.value for member in cls]


class VideoContainer(str, Enum):
    AUTO = "auto"
    MP4 = "mp4"

    @classmethod
    def as_input(cls) -> list[str]:
        """The container names as a combo's options."""
        return [member.value for member in cls]

    @classmethod
    def get_extension(cls, value: "VideoContainer | str") -> str:
        """The file extension a container writes (AUTO writes MP4)."""
        return "mp4" if cls(value) in (cls.AUTO, cls.MP4) else ""


@dataclass
class VideoComponents:
    """A video held in memory: its frames, frame rate and optional audio and metadata."""

    images: ImageInput
    frame_rate: Fraction
    audio: Optional[AudioInput] = None
    metadata: Optional[dict] = None


def _no_video_codec(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what}: video files are not supported yet (mixgraph ships no "
                               "video codec library)")


class VideoInput(ABC):
    """A VIDEO value. Subclasses give the frames; the sizes and duration follow from them."""

    @abstractmethod
    def get_components(self) -> VideoComponents:
        """The frames, frame rate and audio."""

    @abstractmethod
    def save_to(self, path: Any, format: VideoContainer = VideoContainer.AUTO,
                codec: VideoCodec = VideoCodec.AUTO, metadata: Optional[dict] = None) -> None:
        """Write the video to a file or binary stream."""

    def get_dimensions(self) -> tuple[int, int]:
        """(width, height) of the frames."""
        images = self.get_components().images  # [frames, H, W, C]
        return int(images.shape[2]), int(images.shape[1])

    def get_frame_count(self) -> int:
        return int(self.get_components().images.shape[0])

    def get_frame_rate(self) -> Fraction:
        return self.get_components().frame_rate

    def get_duration(self) -> float:
        """Length in seconds: frames / frame rate."""
        components = self.get_components()
        return float(components.images.shape[0] / components.frame_rate)


class VideoFromComponents(VideoInput):
    """A video made from frames in memory (what a node that builds a video returns)."""

    def __init__(self, components: VideoComponents):
        self._components = components

    def get_components(self) -> VideoComponents:
        return self._components

    def save_to(self, path: Any, format: VideoContainer = VideoContainer.AUTO,
                codec: VideoCodec = VideoCodec.AUTO, metadata: Optional[dict] = None) -> None:
        raise _no_video_codec("VideoFromComponents.save_to")


class VideoFromFile(VideoInput):
    """A video read from a file: needs a video decoder, so it refuses by name."""

    def __init__(self, file: Any):
        raise _no_video_codec(f"VideoFromFile({file!r})")

    def get_components(self) -> VideoComponents:
        raise _no_video_codec("VideoFromFile.get_components")

    def save_to(self, path: Any, format: VideoContainer = VideoContainer.AUTO,
                codec: VideoCodec = VideoCodec.AUTO, metadata: Optional[dict] = None) -> None:
        raise _no_video_codec("VideoFromFile.save_to")


class Input:
    """`comfy_api.latest.Input`: the value type of each input kind."""

    Image = ImageInput
    Audio = AudioInput
    Mask = MaskInput
    Latent = LatentInput
    Video = VideoInput


class InputImpl:
    """`comfy_api.latest.InputImpl`: the concrete VIDEO values."""

    VideoFromFile = VideoFromFile
    VideoFromComponents = VideoFromComponents


class Types:
    """`comfy_api.latest.Types`: the video option enums and the in-memory video."""

    VideoCodec = VideoCodec
    VideoContainer = VideoContainer
    VideoComponents = VideoComponents
