"""ComfyUI's 3-D view nodes (``comfy_extras/nodes_stable3d.py``): StableZero123_Conditioning and
its batched variant, for Stable Zero123 checkpoints loaded by ImageOnlyCheckpointLoader. The
camera embedding and the conds are ``families/sd/zero123.py``'s; the UNet side (camera projection,
concat of the input view's latent) is the sampler's (``UNetRunner.project_context``,
``UNetRunner.concat``: ``models/concat_cond.ip2p_concat``). SV3D_Conditioning is declared so that ComfyUI workflows using it
get a clear refusal: SV3D is a video model."""

from __future__ import annotations

import dataclasses
from typing import Any

from mixgraph.graph.node import MAX_RESOLUTION, Float, Int, Socket, node
from mixgraph.nodes.families import refused as families
from mixgraph.nodes.families.sd import zero123
from mixgraph.nodes.helpers.precision import effective

_OUTPUTS = dict(outputs=("CONDITIONING", "CONDITIONING", "LATENT"), output_names=("positive", "negative", "latent"))
_ANGLE = dict(min=-180.0, max=180.0, step=0.1, round=False)


def _advanced(inp):
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


def _conditioning(ctx, clip_vision, init_image, vae, width, height, batch_size, elevations, azimuths,
                  batch_index=False):
    return zero123.conditioning(clip_vision, vae, init_image, width, height, batch_size, elevations, azimuths,
                                effective(ctx, clip_vision, "CLIP_VISION"), effective(ctx, vae, "VAE"),
                                batch_index=batch_index)


@node(category="conditioning/3d_models", **_OUTPUTS)
def StableZero123_Conditioning(ctx, clip_vision=Socket("CLIP_VISION"), init_image=Socket("IMAGE"),
                               vae=Socket("VAE"), width=Int(256, min=16, max=MAX_RESOLUTION, step=8),
                               height=Int(256, min=16, max=MAX_RESOLUTION, step=8),
                               batch_size=Int(1, min=1, max=4096), elevation=Float(0.0, **_ANGLE),
                               azimuth=Float(0.0, **_ANGLE)):
    """One new view of the object in init_image, seen from elevation / azimuth (degrees) relative
    to the input view; every image of the batch gets the same camera."""
    return _conditioning(ctx, clip_vision, init_image, vae, width, height, batch_size, [elevation], [azimuth])


@node(category="conditioning/3d_models", **_OUTPUTS)
def StableZero123_Conditioning_Batched(ctx, clip_vision=Socket("CLIP_VISION"), init_image=Socket("IMAGE"),
                                       vae=Socket("VAE"), width=Int(256, min=16, max=MAX_RESOLUTION, step=8),
                                       height=Int(256, min=16, max=MAX_RESOLUTION, step=8),
                                       batch_size=Int(1, min=1, max=4096), elevation=Float(0.0, **_ANGLE),
                                       azimuth=Float(0.0, **_ANGLE),
                                       elevation_batch_increment=_advanced(Float(0.0, **_ANGLE)),
                                       azimuth_batch_increment=_advanced(Float(0.0, **_ANGLE))):
    """A batch of views: image i is seen from the angles plus i increments; every image starts
    from the same noise (the latent's batch index is 0 for all)."""
    elevations, azimuths = zero123.batch_cameras(elevation, azimuth, batch_size, elevation_batch_increment,
                                                 azimuth_batch_increment)
    return _conditioning(ctx, clip_vision, init_image, vae, width, height, batch_size, elevations, azimuths,
                         batch_index=True)


def _sv3d_refusal(env: Any, **_: Any) -> list[str]:
    return [families.refusal("SV3D (Stable Video 3D, a video model)", "SV3D_Conditioning")]


@node(category="conditioning/3d_models", validate=_sv3d_refusal, **_OUTPUTS)
def SV3D_Conditioning(ctx, clip_vision=Socket("CLIP_VISION"), init_image=Socket("IMAGE"), vae=Socket("VAE"),
                      width=Int(576, min=16, max=MAX_RESOLUTION, step=8),
                      height=Int(576, min=16, max=MAX_RESOLUTION, step=8),
                      video_frames=Int(21, min=1, max=4096), elevation=Float(0.0, min=-90.0, max=90.0, step=0.1,
                                                                               round=False)):
    """Declared for ComfyUI workflows; SV3D is a video model, refused at validation."""
    raise NotImplementedError(_sv3d_refusal(None)[0])
