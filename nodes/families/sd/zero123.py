"""Stable Zero123: novel views of an object from one image (Liu et al. 2023, "Zero-1-to-3: Zero-shot
One Image to 3D Object"; Stability AI's Stable Zero123 weights).

The model is an SD 1.x UNet with 8 input channels (the noisy latent, then the VAE latent of the
input view) whose cross-attention context is one token: the CLIP image embedding of the input
view followed by the camera change, ``[polar, sin(azimuth), cos(azimuth), radius]``, projected
back to the UNet's width by ``cc_projection`` (a Linear stored at the checkpoint's top level, next
to ``model.diffusion_model.*``). ComfyUI facts followed here (``comfy/model_base.Stable_Zero123``,
``comfy_extras/nodes_stable3d.py``):

- camera numbers, angles in radians: polar = -elevation (Zero123's polar angle is
  90 - elevation, measured as a change from 90), sin and cos of the azimuth, radius = 90 degrees
  (a constant: the camera distance never changes);
- the projection is applied to a cond whose width differs from the UNet's context width
  (ComfyUI: ``!= 768``, the width of the real model; here the projection's output width, read
  from its weight's shape), in the UNet's precision, once per sampling run;
- the input view's latent is concatenated unscaled (ComfyUI's ``c_concat``), zeros without one:
  the same path as instruct-pix2pix (``UNetRunner.concat``: ``models/concat_cond.ip2p_concat``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.latent import Latent

__all__ = [
    "CC_PROJECTION", "CameraProjectionConfig", "CameraProjection", "CameraProjectionWeights",
    "is_zero123", "camera_embeddings", "batch_cameras", "zero123_conds", "conditioning",
]

CC_PROJECTION = "cc_projection."  # checkpoint prefix of the camera projection (weight [D, P+4], bias [D])
CAMERA_NUMBERS = 4


def is_zero123(info: Mapping) -> bool:
    """A file whose keys (or header) hold Stable Zero123's camera projection."""
    return f"{CC_PROJECTION}weight" in info and f"{CC_PROJECTION}bias" in info


@dataclass(frozen=True)
class CameraProjectionConfig:
    in_features: int  # CLIP image embedding width + 4 camera numbers (772 for the real model)
    out_features: int  # the UNet's context width (768)


class CameraProjection(nn.Module):
    """The checkpoint's ``cc_projection`` Linear; the attribute name is its key prefix."""

    def __init__(self, config: CameraProjectionConfig):
        super().__init__()
        self.cc_projection = nn.Linear(config.in_features, config.out_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.cc_projection(x)


@dataclass(frozen=True)
class CameraProjectionWeights:
    """Where the projection's weights are (a file, read whole-file-prefix ``""`` with the
    ``zero123_cc`` layout that keeps only ``cc_projection.*``) and its sizes."""

    source: WeightSource
    config: CameraProjectionConfig

    @classmethod
    def from_info(cls, source: WeightSource, info: Mapping, where: str) -> "CameraProjectionWeights":
        weight = tuple(getattr(info[f"{CC_PROJECTION}weight"], "shape", info[f"{CC_PROJECTION}weight"]))
        bias = tuple(getattr(info[f"{CC_PROJECTION}bias"], "shape", info[f"{CC_PROJECTION}bias"]))
        if len(weight) != 2 or bias != weight[:1] or weight[1] <= CAMERA_NUMBERS:
            raise ValueError(f"{where}: cc_projection.weight {list(weight)} / bias {list(bias)} is not a Linear "
                             f"from image embedding + {CAMERA_NUMBERS} camera numbers to the context width")
        return cls(source, CameraProjectionConfig(in_features=weight[1], out_features=weight[0]))

    def module(self, policy: PolicyLike) -> nn.Module:
        m = store.materialize("cc_projection", self.source, self.config, policy.storage, (), CameraProjection)
        return apply_precision(m, policy)

    def project(self, module: nn.Module, cross_attn: Tensor) -> Tensor:
        """[B, T, P+4] -> [B, T, D]; a cond already D wide passes unchanged (ComfyUI)."""
        width = cross_attn.shape[-1]
        if width == self.config.out_features:
            return cross_attn
        if width != self.config.in_features:
            raise ValueError(
                f"Stable Zero123: a conditioning {width} wide; this model takes CLIP image embeddings with "
                f"the camera ({self.config.in_features} wide, from StableZero123_Conditioning) or "
                f"{self.config.out_features}-wide conds")
        with torch.inference_mode():
            return module(cross_attn).float()


def camera_embeddings(elevations: Sequence[float], azimuths: Sequence[float]) -> Tensor:
    """[N, 1, 4] camera numbers for N views, angles given in degrees: [-elevation, sin(azimuth),
    cos(azimuth), 90°] in radians. Computed in float32 in ComfyUI's order of operations (the polar
    change as (90 - elevation) - 90, then ``deg2rad``), so the numbers match its bit for bit."""
    elevation = torch.tensor([float(e) for e in elevations], dtype=torch.float32)  # [N]
    azimuth = torch.tensor([float(a) for a in azimuths], dtype=torch.float32)  # [N]
    if elevation.shape != azimuth.shape:
        raise ValueError(f"camera_embeddings: {elevation.numel()} elevations, {azimuth.numel()} azimuths")
    polar = torch.deg2rad((90 - elevation) - 90)  # Zero123's polar angle is 90 - elevation
    radius = torch.deg2rad(90 - torch.zeros_like(elevation))
    az = torch.deg2rad(azimuth)
    return torch.stack([polar, torch.sin(az), torch.cos(az), radius], dim=-1).unsqueeze(1)  # [N, 1, 4]


def batch_cameras(elevation: float, azimuth: float, batch_size: int, elevation_increment: float = 0.0,
                  azimuth_increment: float = 0.0) -> tuple[list[float], list[float]]:
    """The batched node's per-image angles: image i gets the angles plus i increments, summed one
    increment at a time in double precision (as ComfyUI's loop does)."""
    elevations, azimuths = [], []
    for _ in range(batch_size):
        elevations.append(elevation)
        azimuths.append(azimuth)
        elevation += elevation_increment
        azimuth += azimuth_increment
    return elevations, azimuths


def zero123_conds(image_embeds: Tensor, concat_latent: Tensor, elevations: Sequence[float],
                  azimuths: Sequence[float]) -> tuple[tuple[Cond, ...], tuple[Cond, ...]]:
    """(positive, negative) for one input view.

    image_embeds: [1, P] the view's CLIP image embedding; concat_latent: [1, 4, h, w] its VAE
    latent (unscaled). One camera: the positive is [1, 1, P+4]; N cameras (the batched node):
    [N, 1, P+4], one token per image of the batch. The negative is a zero embedding [1, 1, P] and
    a zero latent (ComfyUI's).
    """
    if image_embeds.ndim != 2 or image_embeds.shape[0] != 1:
        raise ValueError(f"Stable Zero123 conditions on one image; got image embeddings of shape "
                         f"{list(image_embeds.shape)}")
    pooled = image_embeds.float().unsqueeze(0)  # [1, 1, P]
    cams = camera_embeddings(elevations, azimuths)  # [N, 1, 4]
    cond = torch.cat([pooled.expand(cams.shape[0], -1, -1), cams], dim=-1)  # [N, 1, P+4]
    positive = (Cond(cross_attn=cond, concat_latent=concat_latent),)
    negative = (Cond(cross_attn=torch.zeros_like(pooled), concat_latent=torch.zeros_like(concat_latent)),)
    return positive, negative


def conditioning(clip_vision, vae, init_image: Tensor, width: int, height: int, batch_size: int,
                 elevations: Sequence[float], azimuths: Sequence[float], vision_policy: PolicyLike,
                 vae_policy: PolicyLike, batch_index: bool = False):
    """StableZero123_Conditioning(_Batched): (positive, negative, Latent).

    init_image [1, H, W, C] is encoded by the CLIP vision tower (centre crop to its input size)
    and, scaled to width x height (centre crop to that aspect, bilinear; ComfyUI's
    ``common_upscale``), by the VAE; the latent to sample is zeros [batch_size, 4, height // 8,
    width // 8]. One camera (one token for every image) or one per image. ``batch_index``: the batched node's latent says every image is
    image 0 of its batch, so all of them start from the same noise.
    """
    if init_image.ndim != 4 or init_image.shape[0] != 1:
        raise ValueError(f"input 'init_image': Stable Zero123 conditions on one image; got a batch of "
                         f"{init_image.shape[0] if init_image.ndim == 4 else list(init_image.shape)}")
    if init_image.shape[1] < 1 or init_image.shape[2] < 1:
        raise ValueError("input 'init_image': an empty image")
    embeds = clip_vision.encode(init_image, vision_policy, crop=True).image_embeds  # [1, P]
    pixels = upscale(init_image.movedim(-1, 1).float(), width, height, "bilinear", "center").movedim(1, -1)
    concat_latent = vae.encode(pixels[..., :3], vae_policy)  # [1, 4, height/8, width/8], unscaled
    positive, negative = zero123_conds(embeds, concat_latent, elevations, azimuths)
    samples = torch.zeros(batch_size, 4, height // 8, width // 8)
    return positive, negative, Latent(samples, batch_index=(0,) * batch_size if batch_index else None)
