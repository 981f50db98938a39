"""Video files for the video nodes: LoadVideo's options, path, check and fingerprint; where
SaveVideo / SaveWEBM write (``<prefix>_<counter:05>_.<ext>`` like SaveImage) and the ui entries
ComfyUI's editor shows as a video (`{"images": [...], "animated": (True,)}`, ComfyUI's
`ui.PreviewVideo`)."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from mixgraph.graph.env import writable_folder
from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.helpers.imaging import expand_prefix, next_counter
from mixgraph.nodes.media import video_codec
from mixgraph.nodes.payloads.video import Audio, Video, VideoComponents, VideoFromComponents, VideoFromFile, \
    format_extension

__all__ = ["list_videos", "video_path", "missing_video", "video_fingerprint", "load_video", "create_video",
           "video_outputs", "slice_video", "save_video", "preview_video", "save_webm", "preview_ui"]

#: Half a microsecond: frame times compared with a window's edges are exact fractions, the
#: window's edges are floats from the editor.
_EPS = 5e-7


def list_videos(env: Any) -> list[str]:
    """The video files directly in the input folder, sorted (ComfyUI lists the folder's top level)."""
    if env is None:
        return []
    root = Path(getattr(env, "input", "input"))
    if not root.is_dir():
        return []
    return sorted(f.name for f in root.iterdir() if f.is_file() and video_codec.is_video_name(f.name))


def video_path(env: Any, file: str) -> Path:
    """LoadVideo's `file`: a name in the input folder, or annotated `name [output]` / `[temp]`."""
    return folders.annotated_path(env, file)


def missing_video(env: Any, file: str | None) -> list[str]:
    """LoadVideo's validation: ComfyUI's "Invalid video file: NAME", saying where it looked."""
    if file is None or env is None:
        return []
    try:
        path = video_path(env, file)
    except folders.FolderError as e:
        return [f"Invalid video file: {e}"]
    if path.is_file():
        return []
    where = os.path.abspath(path)
    if path.is_dir():
        return [f"Invalid video file: {file} is a folder ({where}), not a video"]
    return [f"Invalid video file: {file} is missing: no file {where}; put it in the input folder "
            f"{os.path.abspath(env.input)} (--input DIR) or upload it in the editor"]


def video_fingerprint(env: Any, file: str = "", **_: Any):
    """The file's content is LoadVideo's external state (ComfyUI uses its modification time)."""
    try:
        return fingerprint_file(video_path(env, file))
    except (folders.FolderError, OSError):
        return None


def load_video(env: Any, file: str) -> VideoFromFile:
    """The file as a VIDEO, probed now (a non-video fails here, naming LoadVideo's input)."""
    path = video_path(env, file)
    if not path.is_file():
        raise FileNotFoundError(missing_video(env, file)[0])
    return VideoFromFile.open(path, f"LoadVideo file {file!r}")


def create_video(images: torch.Tensor, fps: float, audio: Audio | None) -> VideoFromComponents:
    """CreateVideo: frames + rate (+ sound)."""
    if not fps > 0:
        raise ValueError(f"CreateVideo fps {fps}: must be positive")
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"CreateVideo images: expected an IMAGE batch [N, H, W, 3], got {tuple(images.shape)}")
    return VideoFromComponents(VideoComponents(images=images[..., :3], frame_rate=Fraction(fps), audio=audio))


def video_outputs(video: Video) -> tuple[torch.Tensor, Audio | None, float]:
    """GetVideoComponents: (images, audio or None, fps)."""
    parts = video.components()
    return parts.images, parts.audio, float(parts.frame_rate)


def slice_video(video: Video, start_time: float, duration: float, strict_duration: bool) -> VideoFromComponents:
    """ComfyUI's "Video Slice": the frames shown from `start_time` (seconds; negative counts from the
    end) for `duration` seconds (0: to the end), and the sound of that window.

    Frame i is shown at i / fps; it is kept when that time lies in [start, start + duration). With
    `strict_duration` a window reaching past the end is an error, as is a window with no frame.
    The result is frames in memory (a file is decoded whole first)."""
    if duration < 0:
        raise ValueError(f"Video Slice duration {duration}: must be >= 0 (0 keeps everything from start_time)")
    parts = video.components()
    rate, count = parts.frame_rate, int(parts.images.shape[0])
    total = float(count / rate)
    start = start_time if start_time >= 0 else max(total + start_time, 0.0)
    if strict_duration and duration > 0 and total - start < duration - _EPS:
        raise ValueError(f"Video Slice: the video lasts {total:g} s, so from start_time {start:g} s it has "
                         f"{max(total - start, 0.0):g} s, less than the duration {duration:g} s (strict_duration)")
    times = torch.arange(count, dtype=torch.float64) / float(rate)  # [N] seconds
    keep = times >= start - _EPS
    if duration > 0:
        keep &= times < start + duration - _EPS
    if not bool(keep.any()):
        raise ValueError(f"Video Slice: no frame lies in the window (the video lasts {total:g} s, start_time "
                         f"{start_time:g} s, duration {duration:g} s)")
    audio = parts.audio
    if audio is not None:
        first = int(round(start * audio.sample_rate))
        end = first + int(duration * audio.sample_rate) if duration > 0 else audio.waveform.shape[-1]
        audio = Audio(audio.waveform[..., first:end], audio.sample_rate) if first < audio.waveform.shape[-1] \
            else None
    return VideoFromComponents(VideoComponents(parts.images[keep], rate, audio))


def _target(root: Path, prefix: str, width: int, height: int, kind: str) -> tuple[Path, str, str, int]:
    target = folders.safe_join(Path(root), expand_prefix(prefix, width, height))
    folder, stem = target.parent, target.name
    writable_folder(folder, f"{kind} folder")
    subfolder = folder.relative_to(root).as_posix() if folder != Path(root) else ""
    return folder, stem, "" if subfolder == "." else subfolder, next_counter(folder, stem)


def _metadata(prompt: Any, extra_pnginfo: dict | None) -> dict | None:
    """ComfyUI's SaveVideo metadata: extra_pnginfo's keys, then `prompt`; None when empty."""
    metadata = dict(extra_pnginfo or {})
    if prompt is not None:
        metadata["prompt"] = prompt
    return metadata or None


def preview_ui(saved: list[dict[str, str]]) -> dict:
    """What the editor shows as a video (ComfyUI's `ui.PreviewVideo`)."""
    return {"images": saved, "animated": (True,)}


def save_video(video: Video, root: Path, prefix: str, format: str, codec: str, *, prompt: Any = None,
               extra_pnginfo: dict | None = None, kind: str = "output") -> list[dict[str, str]]:
    """SaveVideo: `<prefix>_<counter:05>_.mp4` under root."""
    width, height = video.dimensions()
    folder, stem, subfolder, counter = _target(root, prefix, width, height, kind)
    name = f"{stem}_{counter:05}_.{format_extension(format)}"
    video.save_to(folder / name, format=format, codec=codec, metadata=_metadata(prompt, extra_pnginfo),
                  what="SaveVideo video")
    return [{"filename": name, "subfolder": subfolder, "type": kind}]


def preview_video(video: Video, temp: Path) -> list[dict[str, str]]:
    """PreviewVideo: `preview_video_<counter:05>_.mp4` in the temp folder."""
    return save_video(video, temp, "preview_video", "auto", "auto", kind="temp")


def save_webm(images: torch.Tensor, root: Path, prefix: str, codec: str, fps: float, crf: float, *,
              prompt: Any = None, extra_pnginfo: dict | None = None, kind: str = "output") -> list[dict[str, str]]:
    """SaveWEBM: `<prefix>_<counter:05>_.webm` under root; metadata as separate JSON keys."""
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"SaveWEBM images: expected an IMAGE batch [N, H, W, 3], got {tuple(images.shape)}")
    folder, stem, subfolder, counter = _target(root, prefix, int(images.shape[2]), int(images.shape[1]), kind)
    name = f"{stem}_{counter:05}_.webm"
    video_codec.encode_webm(folder / name, images, codec, fps, crf, _metadata(prompt, extra_pnginfo))
    return [{"filename": name, "subfolder": subfolder, "type": kind}]
