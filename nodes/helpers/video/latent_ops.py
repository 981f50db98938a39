"""Video latents and the Wan conditioning nodes' tensors (ComfyUI ``comfy_extras/nodes_wan.py``,
``nodes_hunyuan.py``'s EmptyHunyuanLatentVideo).

A video latent is ``Latent(samples=[B, C, T, H, W])`` with T = (frames − 1) // 4 + 1 latent frames
(the Wan VAEs' 4x temporal compression, ``TIME_DOWNSCALE``). The image-to-video nodes encode a
video of ``length`` frames (the given frames, grey elsewhere) with the workflow's VAE through the
VAE handle's ``encode`` (``encode(pixels [N, H, W, 3]) -> latent``): a video VAE gives
[1, C, T, h, w]; an image VAE's per-frame latents [N, C, h, w] are read as N latent frames
(``as_video``), so only a video VAE gives the frame count the sampled latent has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.media import memory_guards
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.payloads.conditioning import Conditioning
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.payloads.vision import ClipVisionOutput
from mixgraph.nodes.vae.video_latent_formats import TIME_DOWNSCALE, WAN21_LATENT, WAN22_LATENT

__all__ = ["latent_frames", "empty_video_latent", "as_video", "fit_frames", "image_to_video",
           "first_last_frame_to_video", "wan22_image_to_video_latent", "trim_video_latent", "vace_to_video",
           "fun_control_to_video", "GREY"]

GREY = 0.5  # the frames the VAE encodes where no image is given
Encode = Callable[[Tensor], Tensor]


def latent_frames(length: int) -> int:
    """Latent frames of a ``length``-frame video: 1 + (length − 1) // 4."""
    return (length - 1) // TIME_DOWNSCALE + 1


def empty_video_latent(width: int, height: int, length: int, batch_size: int, channels: int = 16,
                       downscale: int = 8) -> Latent:
    """Zeros [B, channels, T, height / downscale, width / downscale] (EmptyHunyuanLatentVideo:
    16 channels, 8x). Refused before allocating when the tensor alone is over the memory budget."""
    shape = (batch_size, channels, latent_frames(length), height // downscale, width // downscale)
    memory_guards.check_tensor(shape, f"a {width}x{height} video latent of {length} frames, batch {batch_size}",
                               fix="lower width, height, length or batch_size")
    return Latent(torch.zeros(shape))


def as_video(latent: Tensor) -> Tensor:
    """A VAE's latent as a video latent: [1, C, T, h, w] as it is; an image VAE's [N, C, h, w]
    as N latent frames [1, C, N, h, w]."""
    if latent.ndim == 5:
        return latent
    if latent.ndim == 4:
        return latent.movedim(0, 1).unsqueeze(0)  # [1, C, N, h, w]
    raise ValueError(f"a VAE latent of shape {tuple(latent.shape)}: expected [N, C, h, w] or [B, C, T, h, w]")


def fit_frames(images: Tensor, width: int, height: int) -> Tensor:
    """IMAGE [N, H, W, C] resized to width x height, bilinear with a centre crop (ComfyUI's
    ``common_upscale(..., "bilinear", "center")``)."""
    return upscale(images.movedim(-1, 1), width, height, "bilinear", "center").movedim(1, -1)


def _set_both(positive: Conditioning, negative: Conditioning, latent: Tensor | None, mask: Tensor | None,
              vision: Any) -> tuple[Conditioning, Conditioning]:
    if latent is not None:
        positive, negative = (cond_ops.set_concat(c, latent, mask) for c in (positive, negative))
    if vision is not None:
        positive, negative = (cond_ops.set_model_inputs(c, {"clip_vision_output": vision})
                              for c in (positive, negative))
    return positive, negative


def image_to_video(positive: Conditioning, negative: Conditioning, encode: Encode, width: int, height: int,
                   length: int, batch_size: int, start_image: Tensor | None = None,
                   clip_vision_output: ClipVisionOutput | None = None) -> tuple[Conditioning, Conditioning, Latent]:
    """WanImageToVideo: the start frames (the first ``length`` of ``start_image``) then grey,
    encoded as the conds' ``concat_latent_image``; ``concat_mask`` [1, 1, T, h, w] is 0 on the
    latent frames the start frames cover, 1 elsewhere; the CLIP vision output goes to both conds.
    The latent to sample: zeros [B, 16, T, H/8, W/8]."""
    latent = torch.zeros(batch_size, 16, latent_frames(length), height // 8, width // 8)
    if start_image is not None:
        start = fit_frames(start_image[:length], width, height)
        video = torch.full((length, height, width, start.shape[-1]), GREY)
        video[:start.shape[0]] = start
        concat = as_video(encode(video[..., :3]))
        mask = torch.ones(1, 1, latent.shape[2], concat.shape[-2], concat.shape[-1])
        mask[:, :, :latent_frames(start.shape[0])] = 0.0
        positive, negative = _set_both(positive, negative, concat, mask, None)
    positive, negative = _set_both(positive, negative, None, None, clip_vision_output)
    return positive, negative, Latent(latent)


def _joined_vision(start: ClipVisionOutput | None, end: ClipVisionOutput | None) -> ClipVisionOutput | None:
    """Both images' CLIP tokens one after the other (a first-last-frame model's 2 x 257 tokens);
    ComfyUI's joined output carries only ``penultimate_hidden_states``."""
    if start is None or end is None:
        return start if end is None else end
    states = torch.cat([start.penultimate_hidden_states, end.penultimate_hidden_states], dim=-2)
    return ClipVisionOutput(image_embeds=start.image_embeds, last_hidden_state=start.last_hidden_state,
                            penultimate_hidden_states=states)


def first_last_frame_to_video(positive: Conditioning, negative: Conditioning, encode: Encode, latent_channels: int,
                              downscale: int, width: int, height: int, length: int, batch_size: int,
                              start_image: Tensor | None = None, end_image: Tensor | None = None,
                              clip_vision_start_image: ClipVisionOutput | None = None,
                              clip_vision_end_image: ClipVisionOutput | None = None,
                              ) -> tuple[Conditioning, Conditioning, Latent]:
    """WanFirstLastFrameToVideo: start frames first, end frames last, grey between, encoded as
    the conds' ``concat_latent_image``; ``concat_mask`` [1, 4, T, h, w] is the per-frame mask (0 on
    given frames; the start frames' mask covers 3 more frames, the first latent frame's
    remainder) folded 4 frames per latent frame; the CLIP tokens of both images joined."""
    t = latent_frames(length)
    h, w = height // downscale, width // downscale
    latent = torch.zeros(batch_size, latent_channels, t, h, w)
    video = torch.full((length, height, width, 3), GREY)
    mask = torch.ones(1, 1, t * TIME_DOWNSCALE, h, w)
    if start_image is not None:
        start = fit_frames(start_image[:length], width, height)
        video[:start.shape[0]] = start[..., :3]
        mask[:, :, :start.shape[0] + 3] = 0.0
    if end_image is not None:
        end = fit_frames(end_image[-length:], width, height)
        video[-end.shape[0]:] = end[..., :3]
        mask[:, :, -end.shape[0]:] = 0.0
    concat = as_video(encode(video))
    mask = mask.view(1, t, TIME_DOWNSCALE, h, w).transpose(1, 2)  # [1, 4, T, h, w]
    positive, negative = _set_both(positive, negative, concat, mask,
                                   _joined_vision(clip_vision_start_image, clip_vision_end_image))
    return positive, negative, Latent(latent)


def fun_control_to_video(positive: Conditioning, negative: Conditioning, encode: Encode, width: int, height: int,
                         length: int, batch_size: int, start_image: Tensor | None = None,
                         clip_vision_output: ClipVisionOutput | None = None, control_video: Tensor | None = None,
                         ) -> tuple[Conditioning, Conditioning, Latent]:
    """WanFunControlToVideo (Wan 2.1 Fun Control, 48 input channels): the conds'
    ``concat_latent_image`` is [B, 32, T, h, w]: the control video's latent, then the start
    image's, each Wan 2.1's process_out of zeros where not given (no mask channels)."""
    t = latent_frames(length)
    latent = torch.zeros(batch_size, 16, t, height // 8, width // 8)
    concat = WAN21_LATENT.process_out(torch.zeros_like(latent)).repeat(1, 2, 1, 1, 1)  # [B, 32, T, h, w]
    for images, channels in ((start_image, slice(16, 32)), (control_video, slice(0, 16))):
        if images is None:
            continue
        encoded = as_video(encode(fit_frames(images[:length], width, height)[..., :3]))
        n = min(encoded.shape[2], t)
        concat[:, channels, :n] = encoded[:, :, :n]
    positive, negative = _set_both(positive, negative, concat, None, clip_vision_output)
    return positive, negative, Latent(latent)


def wan22_image_to_video_latent(encode: Encode, width: int, height: int, length: int, batch_size: int,
                                start_image: Tensor | None = None) -> Latent:
    """Wan22ImageToVideoLatent: zeros [B, 48, T, H/16, W/16]; with a start image, its latent
    frames written first and a noise mask [B, 1, T, h, w] that keeps them (0) and samples the
    rest (1). The given frames are stored unscaled and the rest as the Wan 2.2 format's
    process_out of zeros (ComfyUI's ``process_out(latent)·mask + latent·(1 − mask)``), so the
    sampler's process_in gives zeros where it samples."""
    t = latent_frames(length)
    latent = torch.zeros(1, WAN22_LATENT.channels, t, height // 16, width // 16)
    if start_image is None:
        return Latent(latent.repeat(batch_size, 1, 1, 1, 1))
    mask = torch.ones(1, 1, t, latent.shape[-2], latent.shape[-1])
    encoded = as_video(encode(fit_frames(start_image[:length], width, height)))
    n = min(encoded.shape[2], t)
    latent[:, :, :n] = encoded[:, :, :n]
    mask[:, :, :n] = 0.0
    latent = WAN22_LATENT.process_out(latent) * mask + latent * (1.0 - mask)
    return Latent(latent.repeat(batch_size, 1, 1, 1, 1), noise_mask=mask.repeat(batch_size, 1, 1, 1, 1))


def trim_video_latent(latent: Latent, trim_amount: int) -> Latent:
    """TrimVideoLatent: the latent without its first ``trim_amount`` latent frames (a VACE
    reference frame); the rest of the LATENT as it was."""
    s = latent.samples
    if s.ndim != 5:
        raise ValueError(f"TrimVideoLatent: a {s.ndim}-D latent; it trims the frames of a video latent [B, C, T, H, W]")
    return dataclasses.replace(latent, samples=s[:, :, trim_amount:])


VACE_STRIDE = 8  # ComfyUI's WanVaceToVideo folds each 8 x 8 pixel block of the mask into 64 channels


def _pad_frames(frames: Tensor, length: int, value: float) -> Tensor:
    """[N, H, W, C] padded with frames of ``value`` to ``length``."""
    if frames.shape[0] >= length:
        return frames
    return torch.cat([frames, frames.new_full((length - frames.shape[0], *frames.shape[1:]), value)])


def vace_to_video(positive: Conditioning, negative: Conditioning, encode: Encode, width: int, height: int,
                  length: int, batch_size: int, strength: float, control_video: Tensor | None = None,
                  control_masks: Tensor | None = None, reference_image: Tensor | None = None,
                  ) -> tuple[Conditioning, Conditioning, Latent, int]:
    """WanVaceToVideo: the control video (grey where none) split by the control mask into the
    frames to keep (``inactive``) and to regenerate (``reactive``), both encoded and joined
    (32 channels), a reference image's latent in front (plus 16 channels of Wan 2.1's
    process_out of zeros); the mask folded to [1, 64, T, h, w] (each 8 x 8 pixel block, nearest
    over frames, zeros for the reference frame); appended to both conds' ``vace_frames`` /
    ``vace_mask`` / ``vace_strength``. Returns the conds, zeros [B, 16, T (+1), H/8, W/8] and how
    many latent frames to trim after sampling (1 with a reference image)."""
    t = latent_frames(length)
    if control_video is not None:
        control_video = _pad_frames(fit_frames(control_video[:length], width, height), length, GREY)
    else:
        control_video = torch.full((length, height, width, 3), GREY)
    reference = None
    if reference_image is not None:
        reference = as_video(encode(fit_frames(reference_image[:1], width, height)[..., :3]))
        reference = torch.cat([reference, WAN21_LATENT.process_out(torch.zeros_like(reference))], dim=1)
    if control_masks is None:
        mask = torch.ones(length, height, width, 1)
    else:
        m = control_masks if control_masks.ndim == 4 else control_masks.unsqueeze(1)  # [N, 1, H, W]
        mask = _pad_frames(upscale(m[:length].float(), width, height, "bilinear", "center").movedim(1, -1), length, 1.0)
    centred = control_video - GREY
    inactive = as_video(encode((centred * (1 - mask) + GREY)[..., :3]))
    reactive = as_video(encode((centred * mask + GREY)[..., :3]))
    frames = torch.cat([inactive, reactive], dim=1)  # [1, 32, T, h, w]
    if reference is not None:
        frames = torch.cat([reference, frames], dim=2)
    hm, wm = height // VACE_STRIDE, width // VACE_STRIDE
    folded = mask.reshape(length, hm, VACE_STRIDE, wm, VACE_STRIDE).permute(2, 4, 0, 1, 3)
    folded = folded.reshape(VACE_STRIDE * VACE_STRIDE, length, hm, wm)  # [64, N, h, w]
    folded = F.interpolate(folded.unsqueeze(0), size=(t, hm, wm), mode="nearest-exact").squeeze(0)
    trim = 0
    if reference is not None:
        trim = reference.shape[2]
        folded = torch.cat([torch.zeros_like(folded[:, :trim]), folded], dim=1)
        t += trim
    values = {"vace_frames": [frames], "vace_mask": [folded.unsqueeze(0)], "vace_strength": [float(strength)]}
    positive, negative = (cond_ops.set_model_inputs(c, values, append=True) for c in (positive, negative))
    return positive, negative, Latent(torch.zeros(batch_size, 16, t, height // 8, width // 8)), trim
