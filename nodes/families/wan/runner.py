"""The Wan sampler seam (``base.FamilyRunner``): what a cond gives the Wan DiT beside its text
tokens, the extra input channels of image-to-video models, and the model call.

* Text: ``Cond.cross_attn`` [1, T, 4096], umT5-XXL's hidden states.
* CLIP image tokens (i2v / flf2v): ``Cond.model_inputs["clip_vision_output"]`` (ComfyUI's cond
  key, set by WanImageToVideo / WanFirstLastFrameToVideo), its ``penultimate_hidden_states``
  [1, 257 (or 514), 1280] as the model's ``clip_fea``; without one the image cross-attention
  reads the text tokens, as ComfyUI's does.
* Extra channels (ComfyUI's ``WAN21.concat_cond``): a model with more input channels than the
  latent gets ``cat([mask (4), image latent])`` per frame: ``Cond.concat_latent`` (ComfyUI's
  ``concat_latent_image``, the VAE latent of the start image followed by grey frames, scaled by
  the latent format per 16 channels) and ``Cond.concat_mask`` (1 = generate; the model gets
  1 − mask, 4 channels per latent frame) or the noise mask; zeros where the cond has none.
* Wan 2.2 5B (``ti2v_5b``): with a noise mask (Wan22ImageToVideoLatent's first frame), each
  latent frame's timestep is the step's timestep times the frame's mean mask (ComfyUI's
  ``WAN22.process_timestep``), and the kept frame is the clean latent, not re-noised
  (``inpaint_keeps_clean``).
* VACE: ``model_inputs["vace_frames"]`` / ``"vace_mask"`` / ``"vace_strength"`` lists (ComfyUI's
  WanVaceToVideo keys): the hint is cat([frames, mask]) per input.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from mixgraph.nodes.families.wan.detect import IMAGE_TO_VIDEO
from mixgraph.nodes.models.concat_cond import repeat_to_batch
from mixgraph.nodes.models.resize import upscale

__all__ = ["WanRunner", "resize_frames", "wan_concat", "frame_timesteps"]

MASK_CHANNELS = 4  # the mask's channels in the i2v concat: one per pixel frame of a latent frame


def resize_frames(t: Tensor, height: int, width: int) -> Tensor:
    """[B, C, T, h, w] -> [B, C, T, height, width], each frame bilinear with a centre crop
    (ComfyUI's ``common_upscale`` on a 5-D tensor); unchanged at that size already."""
    if tuple(t.shape[-2:]) == (height, width):
        return t
    b, c, f = t.shape[:3]
    frames = t.movedim(2, 1).reshape(b * f, c, t.shape[-2], t.shape[-1])  # [B*T, C, h, w]
    out = upscale(frames, width, height, "bilinear", "center")
    return out.reshape(b, f, c, height, width).movedim(1, 2)


def wan_concat(noise_like: Tensor, in_dim: int, image_to_video: bool, latent_format, concat_latent: Tensor | None,
               concat_mask: Tensor | None, denoise_mask: Tensor | None) -> Tensor | None:
    """The extra input channels [B, in_dim − C, T, H, W] for a latent like ``noise_like``
    [B, C, T, H, W] (ComfyUI ``WAN21.concat_cond``, see the module docstring), or None when the
    model takes none."""
    b, c, t, h, w = noise_like.shape
    extra = in_dim - c
    if extra <= 0:
        return None
    dev = noise_like.device
    if concat_latent is None:
        image = noise_like.new_zeros(b, extra, t, h, w)
    else:
        image = resize_frames(concat_latent.to(dev, torch.float32), h, w)
        step = latent_format.channels
        image = torch.cat([latent_format.process_in(image[:, i:i + step]) for i in range(0, image.shape[1], step)],
                          dim=1)
        image = repeat_to_batch(image, b)
    if extra != image.shape[1] + MASK_CHANNELS:
        if not image_to_video or extra == image.shape[1]:
            return image
    if image.shape[1] > extra - MASK_CHANNELS:
        image = image[:, :extra - MASK_CHANNELS]
    mask = concat_mask if concat_mask is not None else denoise_mask
    if mask is None:
        mask = noise_like.new_zeros(b, MASK_CHANNELS, t, h, w)
    else:
        mask = mask.to(dev, torch.float32)
        if mask.ndim == 4:
            mask = mask.unsqueeze(1)  # [B, 1, T, H, W]
        if mask.shape[1] != MASK_CHANNELS:
            mask = mask.mean(dim=1, keepdim=True)
        mask = resize_frames(1.0 - mask, h, w)
        if mask.shape[2] < t:  # frames past the mask: 0 (generated)
            mask = torch.nn.functional.pad(mask, (0, 0, 0, 0, 0, t - mask.shape[2]))
        if mask.shape[1] == 1:
            mask = mask.repeat(1, MASK_CHANNELS, 1, 1, 1)
        mask = repeat_to_batch(mask, b)
    return torch.cat([mask, image], dim=1)


def frame_timesteps(denoise_mask: Tensor) -> Tensor:
    """[B, C, T, H, W] noise mask -> [B, T]: each latent frame's share of the step's timestep
    (its mean mask; 0 for a given frame)."""
    return denoise_mask.float().mean(dim=(1, 3, 4))


class WanRunner:
    """``base.FamilyRunner`` for ``model.WanModel``."""

    video_latent = True  # an image latent [B, C, H, W] is sampled as one frame

    def __init__(self, handle, module: nn.Module, policy):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.config = handle.config
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.in_dim
        self.sampler_patches = handle.sampler_patches
        self.sampling = handle.sampling
        self.per_frame = handle.kind == "ti2v_5b"
        self.wants_denoise_mask = self.per_frame
        self.inpaint_keeps_clean = self.per_frame
        if handle.unet_patches:
            names = ", ".join(sorted({type(p).__name__ for p in handle.unet_patches}))
            raise NotImplementedError(f"Wan model with model patches ({names}): not supported yet")

    def context_free_refusal(self) -> str | None:
        return "The Wan model's cross-attention reads the umT5 text tokens in every pass"

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False, seed: int = 0,
                    denoise_mask: Tensor | None = None) -> dict[str, Tensor]:
        c = self.config
        if cond.cross_attn is not None and cond.cross_attn.shape[-1] != c.text_dim:
            raise ValueError(f"Wan model: text features {cond.cross_attn.shape[-1]} wide; the model takes "
                             f"{c.text_dim} (umT5-XXL: load it with CLIPLoader type \"wan\")")
        if len(latent_shape) != 5:
            raise ValueError(f"Wan model: a {len(latent_shape)}-D latent; it samples video latents "
                             f"[B, C, T, H, W] (EmptyHunyuanLatentVideo, WanImageToVideo)")
        out: dict[str, Tensor] = {}
        vision = cond.model_inputs.get("clip_vision_output")
        if c.image and vision is not None:
            states = vision["penultimate_hidden_states"] if isinstance(vision, Mapping) else \
                vision.penultimate_hidden_states
            out["clip_fea"] = torch.as_tensor(states).float()[:1]  # [1, N, 1280]
        if self.per_frame and denoise_mask is not None:
            out["frame_scale"] = frame_timesteps(denoise_mask)  # [B, T]
        for key in ("vace_frames", "vace_mask", "vace_strength"):
            if key in cond.model_inputs and not c.vace_layers:
                raise ValueError("Wan model: the cond carries VACE inputs (WanVaceToVideo); this model has no "
                                 "VACE blocks (load a Wan VACE model)")
        if c.vace_layers:  # a VACE model always gets hints: zeros and an all-ones mask without WanVaceToVideo
            frames = cond.model_inputs.get("vace_frames") or [torch.zeros(1, 32, *latent_shape[2:])]
            masks = cond.model_inputs.get("vace_mask") or [None] * len(frames)
            strengths = cond.model_inputs.get("vace_strength") or [1.0] * len(frames)
            for i, (f, m, s) in enumerate(zip(frames, masks, strengths)):
                out[f"vace_{i}"] = self.vace_hint(f, m)
                out[f"vace_strength_{i}"] = torch.tensor([float(s)])
        return out

    def vace_hint(self, frames: Tensor, mask: Tensor | None) -> Tensor:
        """One VACE hint [1, vace_in_dim, T, H, W]: the inactive / reactive latents (16 channels
        each, process_in-scaled) and the 64-channel mask (ComfyUI's ``WAN21_Vace.extra_conds``;
        all ones without one)."""
        frames = torch.as_tensor(frames).float()[:1]
        step = self.latent_format.channels
        frames = torch.cat([self.latent_format.process_in(frames[:, i:i + step])
                            for i in range(0, frames.shape[1], step)], dim=1)
        if mask is None:
            mask = frames.new_ones(1, self.config.vace_in_dim - frames.shape[1], *frames.shape[2:])
        return torch.cat([frames, torch.as_tensor(mask).float()[:1]], dim=1)

    def concat(self, cond, latent_image: Tensor, denoise_mask: Tensor | None, seed: int) -> Tensor | None:
        if latent_image.ndim != 5:
            return None
        return wan_concat(latent_image, self.in_channels, self.kind in IMAGE_TO_VIDEO, self.latent_format,
                          cond.concat_latent, cond.concat_mask, denoise_mask)

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        if control is not None or patches:
            raise NotImplementedError("Wan model: ControlNets and model patches: not supported yet")
        if context is None:
            raise ValueError("Wan model: a cond without text tokens. " + self.context_free_refusal())
        if x.ndim != 5:
            raise ValueError(f"Wan model: input {tuple(x.shape)}; it takes video latents [B, C, T, H, W]")
        t = timestep
        scale = inputs.get("frame_scale")
        if scale is not None:
            t = scale[:, :x.shape[2]] * timestep.reshape(-1, 1)  # [B, T] per latent frame
        vace = [(inputs[f"vace_{i}"], inputs[f"vace_strength_{i}"][0]) for i in range(len(inputs))
                if f"vace_{i}" in inputs]
        return self.model(x, t, context, inputs.get("clip_fea"), vace=vace or None)
