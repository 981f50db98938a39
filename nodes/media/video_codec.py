"""Video files read and written with PyAV (FFmpeg's libraries), as ComfyUI's video types do.

Why PyAV: encoding H.264 / VP9 / AV1 and muxing MP4 / WebM is FFmpeg's work; PyAV is its
maintained binding (ComfyUI uses the same), so nothing here is a codec, only the choices ComfyUI
makes (comfy_api/latest/_input_impl/video_types.py, comfy_extras/nodes_video.py):

- frames are RGB24 from an IMAGE [N, H, W, 3] float 0..1 (`clamp(x * 255)` then truncation to
  uint8), H.264 in yuv420p at the frame rate rounded to 1/1000 s;
- audio in an MP4 is AAC at the waveform's sample rate, cut to `ceil(sample_rate / fps * frames)`
  samples so it ends with the pictures;
- metadata values are JSON text in the container (`movflags=use_metadata_tags` keeps them in MP4);
- SaveWEBM: libvpx-vp9 (yuv420p) or libsvtav1 (yuv420p10le, preset 6) at constant quality `crf`;
- a file saved without a new format or codec has its packets copied, not re-encoded.

Decoding gives frames as float32 [N, H, W, 3] in 0..1, the average frame rate as a Fraction and
the first audio stream's samples as float32 [1, channels, samples] (resampled to float from
whatever sample format the file stores).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

import av
import numpy as np
import torch

from mixgraph.nodes.media import memory_guards

__all__ = ["VIDEO_EXTENSIONS", "WEBM_CODECS", "VideoFileError", "VideoInfo", "DecodedVideo", "probe",
           "decode", "encode_mp4", "encode_webm", "remux", "is_video_name"]

#: File name endings LoadVideo lists and `/upload/image` checks as video (ComfyUI lists what
#: `mimetypes` calls video/*; a fixed list gives every system the same options).
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi", ".m4v", ".mpeg", ".mpg", ".ogv", ".flv",
                    ".wmv", ".3gp")
#: SaveWEBM's codec names -> FFmpeg encoders.
WEBM_CODECS = {"vp9": "libvpx-vp9", "av1": "libsvtav1"}
#: The longest side a video may have (frames are decoded whole into memory).
MAX_SIDE = 16384


class VideoFileError(ValueError):
    """A file that is not a readable video, or a video that cannot be written as asked."""


@dataclass(frozen=True)
class VideoInfo:
    """What a video file's header says: read without decoding a frame."""

    width: int
    height: int
    frame_rate: Fraction  # average frames per second; 1 where the file states none (ComfyUI)
    codec: str  # the video stream's codec ("h264", "vp9", ...)
    container: str  # FFmpeg's format names, comma-separated ("mov,mp4,m4a,3gp,3g2,mj2")
    has_audio: bool
    #: frames of the video stream as the container states them (its frame count, else duration x
    #: rate); 0 when it states neither. What the memory guard judges before a decode.
    frames: int = 0


def _header_frames(container: Any, stream: Any, rate: Fraction) -> int:
    """The stream's frame count from the container, decoding nothing: the count it stores (MP4,
    MOV), else the stream's or the container's duration x the frame rate (WebM, MKV)."""
    if stream.frames:
        return int(stream.frames)
    if stream.duration and stream.time_base:
        return max(1, math.ceil(stream.duration * stream.time_base * rate))
    if container.duration:
        return max(1, math.ceil(Fraction(container.duration, av.time_base) * rate))
    return 0


@dataclass(frozen=True)
class DecodedVideo:
    images: torch.Tensor  # [N, H, W, 3] float32 in 0..1
    frame_rate: Fraction
    waveform: torch.Tensor | None  # [1, channels, samples] float32
    sample_rate: int
    metadata: dict[str, str]


Source = str | Path | BinaryIO


def is_video_name(name: str) -> bool:
    return name.lower().endswith(VIDEO_EXTENSIONS)


def _open(source: Source, what: str) -> Any:
    if isinstance(source, io.IOBase):
        source.seek(0)
    try:
        return av.open(source if isinstance(source, io.IOBase) else str(source), mode="r")
    except (av.FFmpegError, OSError, ValueError) as e:
        raise VideoFileError(f"{what}: not a readable video ({type(e).__name__}: {e})") from None


def _video_stream(container: Any, what: str) -> Any:
    if not container.streams.video:
        raise VideoFileError(f"{what}: the file has no video stream (streams: "
                             f"{[s.type for s in container.streams] or 'none'})")
    return container.streams.video[0]


def probe(source: Source, what: str = "video") -> VideoInfo:
    """The header facts of a video; VideoFileError naming `what` if it is none."""
    with _open(source, what) as container:
        stream = _video_stream(container, what)
        width, height = int(stream.codec_context.width), int(stream.codec_context.height)
        if width <= 0 or height <= 0:
            raise VideoFileError(f"{what}: not a readable video (its video stream states no frame size)")
        if width > MAX_SIDE or height > MAX_SIDE:
            raise VideoFileError(f"{what}: frames of {width}x{height} px refused (sides must be 1..{MAX_SIDE})")
        rate = Fraction(stream.average_rate) if stream.average_rate else Fraction(1)
        return VideoInfo(width, height, rate, stream.codec_context.name, container.format.name,
                         bool(container.streams.audio), _header_frames(container, stream, rate))


def decode(source: Source, what: str = "video") -> DecodedVideo:
    """Every frame, the frame rate, the first audio stream and the container's metadata. The
    frames' bytes are checked against the memory budget from the header first
    (`memory_guards.OverBudget`, before a frame is decoded)."""
    with _open(source, what) as container:
        stream = _video_stream(container, what)
        rate = Fraction(stream.average_rate) if stream.average_rate else Fraction(1)
        width, height = int(stream.codec_context.width), int(stream.codec_context.height)
        problem = memory_guards.video_problem(width, height, _header_frames(container, stream, rate), what)
        if problem:
            raise memory_guards.OverBudget(problem)
        try:
            frames = [torch.from_numpy(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
        except av.FFmpegError as e:
            raise VideoFileError(f"{what}: the video stream does not decode ({e})") from None
        if not frames:
            raise VideoFileError(f"{what}: the video stream holds no frames")
        images = torch.stack(frames).float() / 255.0  # [N, H, W, 3]
        waveform, sample_rate = None, 1
        if container.streams.audio:
            audio = container.streams.audio[0]
            container.seek(0)
            # float planar whatever the file stores (s16, s32, ...), as ComfyUI's later releases do
            resampler = av.audio.resampler.AudioResampler(format="fltp")
            chunks = [r.to_ndarray() for p in container.demux(audio) for f in p.decode()
                      for r in resampler.resample(f)]  # [C, S] each
            if chunks:
                data = np.concatenate(chunks, axis=1).astype(np.float32)  # [C, S]
                waveform = torch.from_numpy(data).unsqueeze(0)  # [1, C, S]
                sample_rate = int(audio.sample_rate or 1)
        return DecodedVideo(images, rate, waveform, sample_rate, dict(container.metadata))


def _rgb24(frame: torch.Tensor) -> np.ndarray:
    """[H, W, C] float 0..1 -> [H, W, 3] uint8 as ComfyUI (clamp, then truncate)."""
    return torch.clamp(frame[..., :3].float() * 255, 0, 255).to(torch.uint8).cpu().numpy()


def _write_metadata(container: Any, metadata: dict | None) -> None:
    for key, value in (metadata or {}).items():
        container.metadata[key] = value if isinstance(value, str) else json.dumps(value)


def _check_frames(images: torch.Tensor, what: str, even: bool) -> None:
    if images.ndim != 4 or images.shape[0] == 0 or images.shape[-1] < 3:
        raise VideoFileError(f"{what}: expected frames [N, H, W, 3] with N >= 1, got {tuple(images.shape)}")
    if even and (images.shape[1] % 2 or images.shape[2] % 2):
        raise VideoFileError(f"{what}: {images.shape[2]}x{images.shape[1]} px frames cannot be stored in "
                             f"yuv420p, whose sides must be even; crop or scale the images first")


def encode_mp4(path: Path, images: torch.Tensor, frame_rate: Fraction | float,
               waveform: torch.Tensor | None = None, sample_rate: int = 0, metadata: dict | None = None,
               what: str = "video") -> None:
    """H.264 in an MP4, with the audio as AAC (ComfyUI's VideoFromComponents.save_to)."""
    _check_frames(images, what, even=True)
    rate = Fraction(round(Fraction(frame_rate) * 1000), 1000)
    if rate <= 0:
        raise VideoFileError(f"{what}: frame rate {float(frame_rate)} must be positive")
    if waveform is not None and (waveform.ndim != 3 or waveform.shape[1] not in (1, 2)):
        raise VideoFileError(f"{what}: audio waveform {tuple(waveform.shape)} must be [batch, 1 or 2 "
                             f"channels, samples]")
    with av.open(str(path), mode="w", options={"movflags": "use_metadata_tags"}) as out:
        _write_metadata(out, metadata)
        video = out.add_stream("h264", rate=rate)
        video.width, video.height = int(images.shape[2]), int(images.shape[1])
        video.pix_fmt = "yuv420p"
        audio = out.add_stream("aac", rate=int(sample_rate)) if waveform is not None else None
        for frame in images:
            picture = av.VideoFrame.from_ndarray(_rgb24(frame), format="rgb24").reformat(format="yuv420p")
            out.mux(video.encode(picture))
        out.mux(video.encode(None))
        if audio is not None:
            samples = math.ceil(sample_rate / rate * images.shape[0])
            wave = waveform[:1, :, :samples].float()  # [1, C, S]
            packed = wave.movedim(2, 1).reshape(1, -1).cpu().numpy()  # [1, S * C], interleaved
            sound = av.AudioFrame.from_ndarray(packed, format="flt",
                                               layout="mono" if wave.shape[1] == 1 else "stereo")
            sound.sample_rate, sound.pts = int(sample_rate), 0
            out.mux(audio.encode(sound))
            out.mux(audio.encode(None))


def encode_webm(path: Path, images: torch.Tensor, codec: str, fps: float, crf: float,
                metadata: dict | None = None, what: str = "SaveWEBM") -> None:
    """VP9 or AV1 at constant quality in a WebM (ComfyUI's SaveWEBM)."""
    if codec not in WEBM_CODECS:
        raise VideoFileError(f"{what} codec {codec!r}: expected one of {tuple(WEBM_CODECS)}")
    if not fps > 0:
        raise VideoFileError(f"{what} fps {fps}: must be positive")
    _check_frames(images, what, even=True)
    with av.open(str(path), mode="w") as out:
        _write_metadata(out, metadata)
        stream = out.add_stream(WEBM_CODECS[codec], rate=Fraction(round(fps * 1000), 1000))
        stream.width, stream.height = int(images.shape[-2]), int(images.shape[-3])
        stream.pix_fmt = "yuv420p10le" if codec == "av1" else "yuv420p"
        stream.bit_rate = 0
        stream.options = {"crf": str(crf), **({"preset": "6"} if codec == "av1" else {})}
        for frame in images:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(_rgb24(frame), format="rgb24")))
        out.mux(stream.encode(None))


def remux(source: Source, path: Path, metadata: dict | None = None, what: str = "video") -> None:
    """Copy a file's video, audio and subtitle packets into a new container at `path` (its format
    from the name), keeping its metadata and adding `metadata` (ComfyUI's VideoFromFile.save_to).
    VideoFileError if a stream cannot go into that container (the caller re-encodes then)."""
    with _open(source, what) as src:
        try:
            with av.open(str(path), mode="w", options={"movflags": "use_metadata_tags"}) as out:
                for key, value in src.metadata.items():
                    if metadata is None or key not in metadata:
                        out.metadata[key] = value
                _write_metadata(out, metadata)
                streams = {s: out.add_stream_from_template(template=s, opaque=True) for s in src.streams
                           if s.type in ("video", "audio", "subtitle")}
                for packet in src.demux():
                    # skip only the demuxer's empty flush packets: a Matroska B-frame stream's
                    # first packets carry no dts (ComfyUI skips those and loses the keyframe)
                    if packet.stream in streams and packet.size:
                        packet.stream = streams[packet.stream]
                        out.mux(packet)
        except (ValueError, av.FFmpegError) as e:
            raise VideoFileError(f"{what}: its streams cannot be copied into {Path(path).name} ({e})") from None
