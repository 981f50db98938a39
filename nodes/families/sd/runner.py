"""The SD 1.x / 2.x / SDXL sampler seam: one precision-applied UNet with its conditioning
(``base.FamilyRunner``).

What a CONDITIONING entry becomes besides its text tokens (``cond_inputs``): the vector input
``y`` (``adm``): SDXL's pooled text + size numbers, the refiner's aesthetic score, SD2.1 unCLIP's
noised image embedding, Lotus' task switcher, the x4 upscaler's noise-level label. Stable
Zero123 projects the context (``project_context``); the x4 upscaler adds the low-resolution
image as input channels (``image_concat``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.families.sd.parts import parts_of
from mixgraph.nodes.families.sd import unet as unet_module
from mixgraph.nodes.weights.cast import PolicyLike
from mixgraph.nodes.models.seamless import unet_wrappers
from mixgraph.nodes.families.sd.unclip import NoiseAugmentor, unclip_adm
from mixgraph.nodes.families.sd.unet import sdxl_adm, sdxl_refiner_adm
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["UNetRunner"]


class UNetRunner:
    """The sampler seam (``SamplerModel``, ``base.FamilyRunner``): one precision-applied UNet
    plus its metadata. ``kind`` is the handle's variant name."""

    def __init__(self, handle, model: torch.nn.Module, policy: PolicyLike | None = None):
        self.handle = handle
        self.model = model
        self.policy = policy  # what add-on models patched into the UNet (GLIGEN) run under
        self.run_state: dict = {}  # per sampling run (a runner is made per run): patch counters
        self.prediction = handle.prediction
        self.zsnr = handle.zsnr
        self.latent_format = handle.latent_format  # process_in / process_out (``latent_format.py``)
        self.latent_scale = handle.latent_format.scale_factor  # its scale alone (scalar formats)
        self.in_channels = handle.config.in_channels
        self.kind = handle.kind
        self.sampler_patches = handle.sampler_patches
        self.continuous_sampling = handle.continuous_sampling
        self._cc_module = None
        self.beta_range = getattr(handle, "beta_range", None)
        self.image_augmentor = parts_of(handle).x4
        self.sampling: Sampling = handle.sampling

    def project_context(self, cross_attn: Tensor) -> Tensor:
        """A cond's cross-attention tokens as the UNet takes them: Stable Zero123 projects its
        camera-conditioned image embeddings to the context width (under this runner's policy);
        every other model takes them as they are. Called once per cond and sampling run."""
        proj = parts_of(self.handle).cc_projection
        if proj is None:
            return cross_attn
        if self._cc_module is None:
            self._cc_module = proj.module(self.policy)
        return proj.project(self._cc_module, cross_attn)

    @functools.cached_property
    def context_free_mismatch(self) -> tuple[int, int] | None:
        """(text width, block width) where this UNet cannot run a text-free cond (no context),
        or None when it can (``unet.context_free_mismatch``)."""
        return unet_module.context_free_mismatch(self.model)

    @property
    def wants_sigma(self) -> bool:
        """Whether a UNet patch of the handle depends on the noise level (``at_sigma``)."""
        return any(hasattr(p, "at_sigma") for p in self.handle.unet_patches)

    def cond_inputs(self, cond: Cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        """``base.FamilyRunner.cond_inputs``: the vector input ``y`` [1, adm] (``adm``) when the
        UNet takes one."""
        y = self.adm(cond, tuple(latent_shape[-2:]), negative=negative, seed=seed)
        return {"y": y} if y is not None else {}

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs, control=None,
                 patches: tuple = (), sigma: float | None = None) -> Tensor:
        """``base.FamilyRunner.__call__``: ``unet`` with the batched ``y`` of ``inputs``."""
        return self.unet(x, timestep, context, y=inputs.get("y"), control=control, patches=patches, sigma=sigma)

    def unet(self, x: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None = None, control=None,
             patches: tuple = (), sigma: float | None = None) -> Tensor:
        """``patches``: forward-time patches for this call, after the handle's own. ``sigma``: the
        evaluated noise level, bound into patches that depend on it (``at_sigma``). A patch with
        ``wrap_unet(call, x, control=)`` runs around the whole call (``seamless.py``)."""
        every = self.handle.unet_patches + tuple(patches)
        if sigma is not None:
            every = tuple(p.at_sigma(sigma) if hasattr(p, "at_sigma") else p for p in every)
        if any(hasattr(p, "for_call") for p in every):  # token patches: input shape + run state
            every = tuple(p.for_call(tuple(x.shape), self.run_state) if hasattr(p, "for_call") else p
                          for p in every)
        wraps, every = unet_wrappers(every)

        def call(x_in: Tensor) -> Tensor:
            if every:
                return self.model(x_in, timesteps, context, y, control, every)
            return self.model(x_in, timesteps, context, y, control)

        for wrap in wraps:  # call wrappers (seamless tiling): a later patch wraps the earlier ones
            call = functools.partial(wrap.wrap_unet, call, control=control)
        return call(x)

    def image_concat(self, cond: Cond, latent_shape: tuple[int, ...], seed: int) -> Tensor:
        """The x4 upscaler's extra input channels [B, 3, H, W] for ``cond`` (``x4_upscaler.py``)."""
        x4 = parts_of(self.handle).x4
        if x4 is None:
            raise ValueError("image_concat: this model takes no image input")
        return x4.concat(cond.concat_image, cond.noise_augmentation, latent_shape, seed)

    def adm(self, cond: Cond, latent_hw: tuple[int, int], negative: bool = False, seed: int = 0) -> Tensor | None:
        """SDXL vector conditioning, with ComfyUI's defaults (``samplers.encode_model_conds``):
        width/height = latent size × 8, crops 0, target = width/height; refiner aesthetic score
        from the cond, else 6.0 (2.5 when ``negative``, ComfyUI's default for the uncond).
        SD2.1 unCLIP: the cond's unCLIP entries (zeros without); SDXL with unCLIP entries
        (Revision): their embedding replaces the pooled text; Lotus: its fixed task embedding
        [1, 4]. ``seed``: the sampling seed."""
        adm_ch = self.handle.config.adm_in_channels
        parts = parts_of(self.handle)
        task = parts.task_embedding
        if task is not None:  # Lotus: the same task switcher for every cond
            return torch.tensor([task], dtype=torch.float32)
        x4 = parts.x4
        if x4 is not None:  # the x4 upscaler: the image's noise level as a label
            return x4.label(cond.noise_augmentation)
        if adm_ch is None:  # unCLIP entries on an SD1/SD2 model are ignored, as in ComfyUI
            return None
        augmentor = parts.unclip
        if augmentor is not None:
            if not cond.unclip:
                return torch.zeros(1, adm_ch)
            return unclip_adm(cond.unclip, augmentor, seed)
        size = cond.size
        h, w = latent_hw
        width = float(size.width) if size and size.width is not None else w * 8.0
        height = float(size.height) if size and size.height is not None else h * 8.0
        crop_w = float(size.crop_w) if size else 0.0
        crop_h = float(size.crop_h) if size else 0.0
        refiner = self.kind == "sdxl_refiner"
        n_numbers = 5 if refiner else 6
        pooled = cond.pooled
        pooled_w = adm_ch - n_numbers * 256
        if cond.unclip:  # ComfyUI's sdxl_pooled: merge level 0, the first `pooled_w` values
            pooled = unclip_adm(cond.unclip, NoiseAugmentor(pooled_w, 0.0), seed)[:, :pooled_w]
        if pooled is None:
            pooled = torch.zeros(1, pooled_w)
        if refiner:
            score = size.aesthetic_score if size is not None else None
            if score is None:
                score = 2.5 if negative else 6.0
            return sdxl_refiner_adm(pooled, width, height, crop_w, crop_h, score)
        tw = float(size.target_width) if size and size.target_width is not None else width
        th = float(size.target_height) if size and size.target_height is not None else height
        return sdxl_adm(pooled, width, height, crop_w, crop_h, tw, th)
