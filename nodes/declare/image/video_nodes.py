"""ComfyUI's video nodes (comfy_extras/nodes_video.py): LoadVideo, CreateVideo,
GetVideoComponents, SaveVideo, SaveWEBM and (a later release's) "Video Slice" and PreviewVideo, on ``helpers/video/files.py`` and the VIDEO / AUDIO
payloads (``payloads/video.py``)."""

from __future__ import annotations

from pathlib import Path

from mixgraph.graph.node import Boolean, Combo, Float, Result, Socket, String, node
from mixgraph.graph.spec import Hidden, Output
from mixgraph.nodes.helpers.video import files as video_files
from mixgraph.nodes.media.video_codec import WEBM_CODECS
from mixgraph.nodes.payloads.video import VIDEO_CODECS, VIDEO_FORMATS


def _file_exists(env, file=None, **_):
    return video_files.missing_video(env, file)


@node(category="image/video", outputs=("VIDEO",), display_name="Load Video",
      fingerprint=video_files.video_fingerprint, validate=_file_exists)
def LoadVideo(ctx, file=Combo(video_files.list_videos, video_upload=True)):
    return (video_files.load_video(ctx.env, file),)


@node(category="image/video", outputs=("VIDEO",), display_name="Create Video",
      description="Create a video from images.")
def CreateVideo(images=Socket("IMAGE", tooltip="The images to create a video from."),
                fps=Float(30.0, min=1.0, max=120.0, step=1.0),
                audio=Socket("AUDIO", optional=True, tooltip="The audio to add to the video.")):
    return (video_files.create_video(images, fps, audio),)


@node(category="image/video", outputs=(("IMAGE", "images"), ("AUDIO", "audio"), ("FLOAT", "fps")),
      display_name="Get Video Components",
      description="Extracts all components from a video: frames, audio, and framerate.")
def GetVideoComponents(video=Socket("VIDEO", tooltip="The video to extract components from.")):
    return video_files.video_outputs(video)


@node(category="image/video", outputs=(Output("VIDEO", "video"),), output_node=True, display_name="Save Video",
      description="Saves the input images to your ComfyUI output directory.")
def SaveVideo(ctx, video=Socket("VIDEO", tooltip="The video to save."),
              filename_prefix=String("video/ComfyUI", tooltip="The prefix for the file to save. This may include "
                                     "formatting information such as %date:yyyy-MM-dd% or %Empty Latent "
                                     "Image.width% to include values from nodes."),
              format=Combo(VIDEO_FORMATS, default="auto", tooltip="The format to save the video as."),
              codec=Combo(VIDEO_CODECS, default="auto", tooltip="The codec to use for the video."),
              prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    saved = video_files.save_video(video, Path(ctx.env.output), filename_prefix, format, codec,
                                   prompt=prompt, extra_pnginfo=extra_pnginfo)
    return Result((video,), ui=video_files.preview_ui(saved))


@node(category="image/video", outputs=(Output("IMAGE", "images"),), output_node=True)
def SaveWEBM(ctx, images=Socket("IMAGE"), filename_prefix=String("ComfyUI"), codec=Combo(tuple(WEBM_CODECS)),
             fps=Float(24.0, min=0.01, max=1000.0, step=0.01),
             crf=Float(32.0, min=0, max=63.0, step=1, tooltip="Higher crf means lower quality with a smaller file "
                       "size, lower crf means higher quality higher filesize."),
             prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    saved = video_files.save_webm(images, Path(ctx.env.output), filename_prefix, codec, fps, crf,
                                  prompt=prompt, extra_pnginfo=extra_pnginfo)
    return Result((images,), ui=video_files.preview_ui(saved))


@node(name="Video Slice", category="image/video", outputs=("VIDEO",), display_name="Video Slice")
def VideoSlice(video=Socket("VIDEO"),
               start_time=Float(0.0, min=-1e5, max=1e5, step=0.001, tooltip="Start time in seconds"),
               duration=Float(0.0, min=0.0, step=0.001, tooltip="Duration in seconds, or 0 for unlimited duration"),
               strict_duration=Boolean(False, tooltip="If True, when the specified duration is not possible, an "
                                       "error will be raised.")):
    return (video_files.slice_video(video, start_time, duration, strict_duration),)


@node(category="image/video", outputs=(("VIDEO", "video"),), output_node=True, display_name="Preview Video",
      description="Previews a video inside the node.", deterministic=False)
def PreviewVideo(ctx, video=Socket("VIDEO", tooltip="The video to preview.")):
    """Saves an MP4 to the temp folder for the editor and passes the video on."""
    return Result((video,), ui=video_files.preview_ui(video_files.preview_video(video, Path(ctx.env.temp))))
