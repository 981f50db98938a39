"""The value types `comfy_api.latest.Input`, `InputImpl` and `Types` name: what an IMAGE, MASK,
AUDIO, LATENT and VIDEO value is at the pack boundary. Images, masks, audio and latents are the
plain tensors and dicts ComfyUI passes; a video is mixgraph's (``ui/comfy/comfy_video.py``: frames
in memory or a file, read and written with PyAV)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any, Optional, TypedDict

import torch

from mixgraph.ui.comfy.comfy_video import PackVideo, components_video, file_video

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


VideoInput.register(PackVideo)  # mixgraph's VIDEO values, as packs receive them


class VideoFromComponents(PackVideo, VideoInput):
    """A video made from frames in memory (what a node that builds a video returns)."""

    def __init__(self, components: VideoComponents):
        super().__init__(components_video(components).video)


class VideoFromFile(PackVideo, VideoInput):
    """A video file (a path, or a BytesIO decoded at once), read with PyAV."""

    def __init__(self, file: Any):
        super().__init__(file_video(file).video)


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
