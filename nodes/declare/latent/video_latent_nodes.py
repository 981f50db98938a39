"""ComfyUI's video latent nodes (``comfy_extras/nodes_hunyuan.py`` EmptyHunyuanLatentVideo,
``nodes_wan.py`` TrimVideoLatent): names, inputs, defaults and categories as ComfyUI's. Video
latents are [B, C, T, H, W] (``nodes/helpers/video/latent_ops.py``)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Int, Socket, node
from mixgraph.nodes.helpers.video import latent_ops as video_latent_ops


@node(category="latent/video", outputs=("LATENT",))
def EmptyHunyuanLatentVideo(width=Int(848, min=16, max=MAX_RESOLUTION, step=16),
                            height=Int(480, min=16, max=MAX_RESOLUTION, step=16),
                            length=Int(25, min=1, max=MAX_RESOLUTION, step=4),
                            batch_size=Int(1, min=1, max=4096)):
    # zeros [B, 16, (length - 1) / 4 + 1, H/8, W/8]: the Wan 2.1 (and Hunyuan Video) VAE's latent
    return (video_latent_ops.empty_video_latent(width, height, length, batch_size),)


@node(category="latent/video", outputs=("LATENT",))
def TrimVideoLatent(samples=Socket("LATENT"), trim_amount=Int(0, min=0, max=99999)):
    return (video_latent_ops.trim_video_latent(samples, trim_amount),)
