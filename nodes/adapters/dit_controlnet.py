"""The ControlNet chain of DiT ControlNets: nets whose hint is a VAE latent (ComfyUI's ``ControlNet``
with a ``latent_format``: SD3 / SD3.5, Flux InstantX) and whose residuals are token tensors added
after the diffusion model's blocks (``Control.output``; ComfyUI's ``control["output"]``).

ComfyUI (``comfy/controlnet.py``, ``ControlNet.get_control``) resizes the hint image to the latent
size times the VAE's downscale ("nearest-exact", centre crop), applies the net's own image
preprocessing (Stability's canny / depth nets), encodes it with the VAE given to the apply node
(``ControlNetApplyAdvanced``'s optional ``vae``), brings the latent into the net's latent format
(``process_in``), and runs the net on the sampler's input, timestep and pooled vector ``y``. The
encoded hint is kept per latent size (ComfyUI keeps one until the size changes). Strength scales
every residual; start / end percent as for SD ControlNets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mixgraph.nodes.adapters.controlnet import resize_hint
from mixgraph.nodes.models.concat_cond import repeat_to_batch
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.payloads.conditioning import Control
from mixgraph.nodes.vae.latent_format import LatentFormat

__all__ = ["DitControlChain", "NEEDS_VAE_MESSAGE", "broadcast_batch", "dit_chain_args", "inpaint_hint"]

# ComfyUI's message when such a net is applied without a VAE
NEEDS_VAE_MESSAGE = ("This ControlNet needs a VAE but none was provided: use a ControlNet apply node with a VAE input "
                     "(Apply ControlNet's optional vae, or ControlNetApplySD3) and connect it")


def broadcast_batch(t: Tensor, batch: int) -> Tensor:
    """Repeat ``t`` [N, ...] cyclically along the batch up to ``batch`` (one item is shared)."""
    if t.shape[0] == batch:
        return t
    if t.shape[0] == 1:
        return t.expand(batch, *t.shape[1:])
    return t[torch.arange(batch) % t.shape[0]]


def inpaint_hint(image: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """ControlNetInpaintingAliMamaApply for a net with ``concat_mask``: the kept-area mask
    (1 − mask, [B, 1, h, w]) and the image with the masked area blacked out (the kept-area mask
    resized to the image, bilinear, rounded), as ComfyUI."""
    keep = 1.0 - mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    apply = upscale(keep, image.shape[2], image.shape[1], "bilinear", "center").round()  # [B, 1, H, W]
    return image * apply.movedim(1, -1).repeat(1, 1, 1, image.shape[3]), keep


def dit_chain_args(handle, vae, vae_policy, extra_concat: tuple = ()) -> dict:
    """The ``DitControlChain`` arguments of a DiT net's handle (``latent_format``, ``preprocess``,
    ``takes_inputs``, ``concat_mask``) and the apply node's VAE: the encoder when the net takes a
    latent (ComfyUI's message when none is connected), nothing when it takes pixels (ComfyUI
    ignores the VAE then). ``extra_concat``: masks for a ``concat_mask`` net (none: all ones)."""
    args = {"latent_format": handle.latent_format, "preprocess": handle.preprocess,
            "takes_inputs": bool(getattr(handle, "takes_inputs", False))}
    if getattr(handle, "concat_mask", False):
        args["extra_concat"] = tuple(extra_concat) or (torch.ones(1, 1, 1, 1),)
    if handle.latent_format is None:
        return args
    if vae is None:
        raise ValueError(NEEDS_VAE_MESSAGE)
    return args | {"encode": lambda pixels: vae.encode(pixels, vae_policy), "vae_scale": vae.downscale}


@dataclass(frozen=True, eq=False)
class DitControlChain:
    """One applied DiT ControlNet and, through ``previous``, the nets applied before it.

    runner: callable ``(x, hint_latent, timesteps, context, y) -> Control`` (unscaled residuals in
            ``Control.output`` / ``Control.input``); a runner that needs the sampled model has
            ``bind_model`` (the sampler binds it before the first step, ``control_lora.bind_chain``).
    hint: IMAGE [B, H, W, C] in 0..1. encode: IMAGE [B, H, W, 3] -> VAE latent [B, C, H/f, W/f]
    (the apply node's VAE); vae_scale: f. latent_format: the net's (``process_in`` on the latent).
    preprocess: the net's hint preprocessing on [B, C, H, W] pixels (identity for most nets).
    takes_inputs: the runner takes the cond's model inputs. extra_concat: masks [B, 1, h, w]
    concatenated to the hint latent, resized to it (ComfyUI's ``extra_concat``: inpainting nets).
    """

    runner: Callable[..., Control]
    hint: Tensor
    strength: float = 1.0
    start_percent: float = 0.0
    end_percent: float = 1.0
    previous: object | None = None
    encode: Callable[[Tensor], Tensor] | None = None
    vae_scale: int = 8
    latent_format: LatentFormat | None = None  # None: the net takes the resized pixels (no VAE)
    preprocess: Callable[[Tensor], Tensor] | None = None
    takes_inputs: bool = False
    extra_concat: tuple = ()
    _hints: dict = field(default_factory=dict, repr=False, compare=False)

    accepts_inputs = True  # the denoiser gives ``residuals`` the cond's model inputs (``inputs=``)

    def hint_latent(self, h: int, w: int) -> Tensor:
        """The hint encoded for an h x w latent, [B_hint, C, h, w] (cached per size)."""
        got = self._hints.get((h, w))
        if got is not None:
            return got
        if self.encode is None and self.latent_format is not None:
            raise ValueError(NEEDS_VAE_MESSAGE)
        pixels = resize_hint(self.hint.float(), h * self.vae_scale, w * self.vae_scale)  # [B, C, H, W]
        if self.preprocess is not None:
            pixels = self.preprocess(pixels)
        if self.encode is None:  # a net taking the pixels itself (Flux XLabs)
            latent = pixels
        else:
            latent = self.encode(pixels.movedim(1, -1)).float()  # IMAGE [B, H, W, C] -> [B, C, h, w]
            latent = self.latent_format.process_in(latent)
        if self.extra_concat:  # inpainting nets: the kept-area mask on the latent grid after the latent
            lh, lw = latent.shape[-2:]
            masks = [repeat_to_batch(upscale(m.float(), lw, lh, "nearest-exact", "center"), latent.shape[0])
                     for m in self.extra_concat]
            latent = torch.cat([latent] + masks, dim=1)  # [B, C + 1, h, w]
        self._hints[(h, w)] = latent
        return latent

    def residuals(self, x_in: Tensor, timesteps: Tensor, context: Tensor | None, y: Tensor | None,
                  sigma: Tensor, percent: float, inputs: Mapping[str, Tensor] | None = None) -> Control | None:
        """The summed residuals of the chain's active nets for this batch, or None. ``inputs``: the
        cond's model inputs, batched (Flux nets read ``guidance``: ComfyUI's ``extra_conds``)."""
        prev = None
        if self.previous is not None:
            more = {"inputs": inputs} if getattr(self.previous, "accepts_inputs", False) else {}
            prev = self.previous.residuals(x_in, timesteps, context, y, sigma, percent, **more)
        if not (self.start_percent <= percent <= self.end_percent) or self.strength == 0.0:
            return prev
        hint = broadcast_batch(self.hint_latent(*x_in.shape[-2:]), x_in.shape[0]).to(x_in.device)
        extra = {"inputs": inputs or {}} if self.takes_inputs else {}
        out = self.runner(x_in, hint, timesteps, context, y, **extra)
        s = self.strength
        own = Control(input=[None if o is None else o * s for o in out.input],
                      output=[None if o is None else o * s for o in out.output])
        return own if prev is None else prev + own
