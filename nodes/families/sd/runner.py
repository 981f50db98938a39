"""The SD 1.x / 2.x / SDXL sampler seam: one precision-applied UNet with its conditioning
(``base.FamilyRunner``).

What a CONDITIONING entry becomes besides its text tokens (``cond_inputs``): the vector input
``y`` (``adm``): SDXL's pooled text + size numbers, the refiner's aesthetic score, SD2.1 unCLIP's
noised image embedding, Lotus' task switcher, the x4 upscaler's noise-level label. Stable
Zero123 projects the context (``project_context``). Extra input channels (``concat``, ComfyUI's
``concat_cond``): an inpaint UNet's mask + masked latent (C + 1 more channels than the latent),
instruct-pix2pix's (and Stable Zero123's) image latent (C more), the x4 upscaler's
low-resolution image (3 more).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.families.sd.parts import parts_of
from mixgraph.nodes.families.sd.x4_upscaler import IMAGE_CHANNELS
from mixgraph.nodes.models.concat_cond import inpaint_concat, ip2p_concat
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

    def context_free_refusal(self) -> str | None:
        """``base.FamilyRunner.context_free_refusal``: why this UNet cannot run a text-free cond,
        or None when it can."""
        mismatch = self.context_free_mismatch
        if mismatch is None:
            return None
        text_w, block_w = mismatch
        return (f"Each cross-attention would attend to the image tokens instead, but this UNet's "
                f"cross-attention takes {text_w}-wide text tokens, not its {block_w}-wide image "
                f"tokens, so it needs a text context (every SD 1.x/2.x/SDXL UNet does; ComfyUI stops "
                f"here too, with a matrix-shape error)")

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

    def concat(self, cond: Cond, latent_image: Tensor, denoise_mask: Tensor | None, seed: int) -> Tensor | None:
        """``base.FamilyRunner.concat``: the UNet's extra input channels for ``cond`` [B, E, H, W]
        beside the latent [B, C, H, W], decided by the UNet's input width (ComfyUI's
        ``concat_cond`` of each model class):

        * the x4 upscaler (E = 3): the cond's low-resolution image, noise-augmented with
          seed − 10 (``x4_upscaler.py``);
        * E = C (instruct-pix2pix, Stable Zero123): the cond's image latent, zeros without
          (``concat_cond.ip2p_concat``);
        * E = C + 1 (inpaint): mask + masked latent from the cond's InpaintModelConditioning or
          the noise mask and sampled latent (``concat_cond.inpaint_concat``);
        * E = 0: None."""
        B, C, H, W = latent_image.shape
        extra = self.in_channels - C
        x4 = parts_of(self.handle).x4
        if x4 is not None:
            if extra != IMAGE_CHANNELS:
                raise ValueError(f"an image-conditioned (x4 upscaler) model with {C + extra} input channels "
                                 f"and a {C}-channel latent: it takes {C} + {IMAGE_CHANNELS} channels")
            return x4.concat(cond.concat_image, cond.noise_augmentation, tuple(latent_image.shape),
                             seed).to(latent_image.device)
        if extra <= 0:
            return None
        if extra == C:
            return ip2p_concat(latent_image, cond.concat_latent)
        if extra != C + 1:
            raise NotImplementedError(
                f"a {C + extra}-channel model with a {C}-channel latent: only inpaint "
                f"concat (mask + masked latent, {2 * C + 1} channels) and instruct-pix2pix "
                f"concat (image latent, {2 * C} channels) are supported yet")
        return inpaint_concat(latent_image, denoise_mask, cond.concat_latent, cond.concat_mask, self.latent_format)

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
