"""ComfyUI's Wan conditioning nodes (``comfy_extras/nodes_wan.py``): WanImageToVideo,
WanFirstLastFrameToVideo, Wan22ImageToVideoLatent; names, inputs, defaults, categories and
outputs as ComfyUI's. They encode frames with the workflow's VAE (``VaeHandle.encode``) and put
the image latent, its mask and the CLIP vision output on both conds (``Cond.concat_latent`` /
``concat_mask``, ComfyUI's ``concat_latent_image`` / ``concat_mask``; ``model_inputs
["clip_vision_output"]``), which the Wan runner reads (``families/wan/runner.py``)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Float, Int, Socket, node
from mixgraph.nodes.helpers.video import latent_ops as video_latent_ops
from mixgraph.nodes.helpers.precision import effective


# the frame-size inputs most Wan nodes share (ComfyUI's defaults: 832x480, 81 frames)
WIDTH = Int(832, min=16, max=MAX_RESOLUTION, step=16)
HEIGHT = Int(480, min=16, max=MAX_RESOLUTION, step=16)
LENGTH = Int(81, min=1, max=MAX_RESOLUTION, step=4)
BATCH = Int(1, min=1, max=4096)


def _encoder(ctx, vae):
    policy = effective(ctx, vae, "VAE")
    return lambda pixels: vae.encode(pixels, policy)


@node(category="conditioning/video_models", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def WanImageToVideo(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"), vae=Socket("VAE"),
                    width=WIDTH,
                    height=HEIGHT,
                    length=LENGTH,
                    batch_size=BATCH,
                    clip_vision_output=Socket("CLIP_VISION_OUTPUT", optional=True),
                    start_image=Socket("IMAGE", optional=True)):
    return video_latent_ops.image_to_video(positive, negative, _encoder(ctx, vae), width, height, length, batch_size,
                                           start_image, clip_vision_output)


@node(category="conditioning/video_models", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def WanFirstLastFrameToVideo(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                             vae=Socket("VAE"),
                             width=WIDTH,
                             height=HEIGHT,
                             length=LENGTH,
                             batch_size=BATCH,
                             clip_vision_start_image=Socket("CLIP_VISION_OUTPUT", optional=True),
                             clip_vision_end_image=Socket("CLIP_VISION_OUTPUT", optional=True),
                             start_image=Socket("IMAGE", optional=True),
                             end_image=Socket("IMAGE", optional=True)):
    return video_latent_ops.first_last_frame_to_video(
        positive, negative, _encoder(ctx, vae), vae.latent_channels, vae.downscale, width, height, length,
        batch_size, start_image, end_image, clip_vision_start_image, clip_vision_end_image)


@node(category="conditioning/video_models", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def WanFunInpaintToVideo(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"), vae=Socket("VAE"),
                         width=WIDTH,
                         height=HEIGHT,
                         length=LENGTH,
                         batch_size=BATCH,
                         clip_vision_output=Socket("CLIP_VISION_OUTPUT", optional=True),
                         start_image=Socket("IMAGE", optional=True),
                         end_image=Socket("IMAGE", optional=True)):
    # ComfyUI runs WanFirstLastFrameToVideo with the one CLIP vision output as the start image's
    return video_latent_ops.first_last_frame_to_video(
        positive, negative, _encoder(ctx, vae), vae.latent_channels, vae.downscale, width, height, length,
        batch_size, start_image, end_image, clip_vision_output, None)


@node(category="conditioning/video_models", outputs=("CONDITIONING", "CONDITIONING", "LATENT"),
      output_names=("positive", "negative", "latent"))
def WanFunControlToVideo(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"), vae=Socket("VAE"),
                         width=WIDTH,
                         height=HEIGHT,
                         length=LENGTH,
                         batch_size=BATCH,
                         clip_vision_output=Socket("CLIP_VISION_OUTPUT", optional=True),
                         start_image=Socket("IMAGE", optional=True),
                         control_video=Socket("IMAGE", optional=True)):
    return video_latent_ops.fun_control_to_video(positive, negative, _encoder(ctx, vae), width, height, length,
                                                 batch_size, start_image, clip_vision_output, control_video)


@node(category="conditioning/video_models", outputs=("CONDITIONING", "CONDITIONING", "LATENT", "INT"),
      output_names=("positive", "negative", "latent", "trim_latent"))
def WanVaceToVideo(ctx, positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"), vae=Socket("VAE"),
                   width=WIDTH,
                   height=HEIGHT,
                   length=LENGTH,
                   batch_size=BATCH,
                   strength=Float(1.0, min=0.0, max=1000.0, step=0.01),
                   control_video=Socket("IMAGE", optional=True),
                   control_masks=Socket("MASK", optional=True),
                   reference_image=Socket("IMAGE", optional=True)):
    return video_latent_ops.vace_to_video(positive, negative, _encoder(ctx, vae), width, height, length, batch_size,
                                          strength, control_video, control_masks, reference_image)


@node(category="conditioning/inpaint", outputs=("LATENT",))
def Wan22ImageToVideoLatent(ctx, vae=Socket("VAE"),
                            width=Int(1280, min=32, max=MAX_RESOLUTION, step=32),
                            height=Int(704, min=32, max=MAX_RESOLUTION, step=32),
                            length=Int(49, min=1, max=MAX_RESOLUTION, step=4),
                            batch_size=BATCH,
                            start_image=Socket("IMAGE", optional=True)):
    return (video_latent_ops.wan22_image_to_video_latent(_encoder(ctx, vae), width, height, length, batch_size,
                                                         start_image),)
