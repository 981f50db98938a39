"""Flux.1 ControlNets in diffusers' ``FluxControlNetModel`` layout: InstantX's nets and the
InstantX / Shakker union nets (ComfyUI ``load_controlnet_flux_instantx`` and
``comfy/ldm/flux/controlnet.py`` with ``latent_input=True``).

The net is a Flux without its last layer: a few double- and single-stream blocks over the
sampler's latent tokens plus the VAE-encoded hint patched like the latent (2 x 2) and projected
by ``pos_embed_input`` (diffusers: ``controlnet_x_embedder``), conditioned like the main model
(timestep, guidance, pooled vector: ComfyUI's ``extra_conds`` ``y`` and ``guidance``). After
each double block a Linear (``controlnet_blocks.N``) of the image tokens gives one residual for
the main model's double blocks, after each single block one (``controlnet_single_blocks.N``) of
the image part for its single blocks. As ComfyUI, block i's residual is used ceil(19 / blocks)
times in a row, the list cut at 19 (single: 38): the sizes of Flux.1, whatever the sampled
model's depth (``Control.input`` / ``Control.output``; ``families/flux/model.py: run_blocks``
adds entry i to the first image tokens after block i). A union net's control type
(SetUnionControlNetType) is one more text token in front of the prompt (its
``controlnet_mode_embedder`` row); "auto" adds none. The hint latent is in Flux's latent format.

XLabs' nets (BFL key names, ComfyUI ``load_controlnet_flux_xlabs_mistoline``) take the image
itself, no VAE: resized to the latent x 8, mapped to [-1, 1] and taken to the latent grid by
``input_hint_block`` (3 -> 16 channels, 8x down), then patched and projected like the latent
hint; their residual lists are the block outputs cycled (d0, d1, d0, d1, ...), as ComfyUI.

Inpainting nets (AliMama's: 17 hint channels, ComfyUI's ``concat_mask``) take the kept-area mask
after the hint latent (ControlNetInpaintingAliMamaApply; ``dit_controlnet.DitControlChain``).
MistoLine's nets (TheMistoAI) are XLabs-like with their own conv stack (``input_cond_block``) and
a SiLU after each head (ComfyUI ``mistoline=True``). Not supported yet, refused by name: Chroma
models.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mixgraph.nodes.adapters.dit_controlnet import DitControlChain, dit_chain_args
from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.detect import flux_config
from mixgraph.nodes.families.flux.model import (PATCH, Flux, FluxConfig, image_ids, patchify,
                                                positional_embedding)
from mixgraph.nodes.payloads.conditioning import Control
from mixgraph.nodes.vae.flow_latent_formats import FLUX_LATENT
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["FluxControlNetConfig", "FluxControlNet", "FluxControlNetHandle", "is_flux_instantx_controlnet",
           "is_flux_xlabs_controlnet", "is_flux_mistoline_controlnet", "flux_controlnet_config",
           "xlabs_controlnet_config", "mistoline_controlnet_config", "LAYOUT", "MISTOLINE_LAYOUT", "MAIN_DOUBLE",
           "MAIN_SINGLE"]

LAYOUT = "flux_controlnet_diffusers"
MAIN_DOUBLE, MAIN_SINGLE = 19, 38  # ComfyUI's ``main_model_double`` / ``main_model_single``
HINT_WIDTH = 16  # XLabs' hint conv stack width (ComfyUI's)
_OWN = ("controlnet_blocks.", "controlnet_single_blocks.", "controlnet_mode_embedder.")


def is_flux_instantx_controlnet(keys: Collection[str]) -> bool:
    return "controlnet_blocks.0.weight" in keys and "controlnet_x_embedder.weight" in keys


def _extra(keys: Iterable[str]) -> dict:
    """The net's own keys beside the transformer's (``diffusers_keys.key_plan``'s extra rows)."""
    plan = {}
    for k in keys:
        if k.startswith(_OWN):
            plan[k] = diffusers_keys.Part((k,))
        elif k.startswith("controlnet_x_embedder."):
            plan["pos_embed_input." + k.rsplit(".", 1)[1]] = diffusers_keys.Part((k,))
    return plan


def _header(info: Mapping[str, Any]) -> dict:
    return diffusers_keys.shapes_to_bfl(info, _extra)


# matches nothing: the loaders' family-layout lookup must not take a ControlNet for a model file
register_layout(FamilyLayout(LAYOUT, lambda keys: False, _header,
                             lambda keys: diffusers_keys.stored_rename(keys, _extra), diffusers_keys.fuse))


@dataclass(frozen=True)
class FluxControlNetConfig:
    """flux: the blocks' sizes (depths = the net's own); hint_channels: channels of the hint
    features the 2 x 2 patches are made of (16); union_modes: rows of ``controlnet_mode_embedder``
    (0: a plain net); pixel_hint: XLabs / MistoLine nets (the image through a conv stack, no VAE);
    mistoline: TheMistoAI's MistoLine (its own stack ``input_cond_block``, SiLU after each head)."""

    flux: FluxConfig
    hint_channels: int = 16
    union_modes: int = 0
    pixel_hint: bool = False
    mistoline: bool = False


def flux_controlnet_config(info: Mapping[str, Any]) -> FluxControlNetConfig:
    """The config from a diffusers-layout header (keys -> TensorInfo or shape)."""
    shapes = _header(info)
    need = ("img_in.weight", "txt_in.weight", "pos_embed_input.weight", "double_blocks.0.img_attn.norm.key_norm.scale",
            "double_blocks.0.img_mlp.0.weight")
    if any(k not in shapes for k in need):
        raise ValueError(f"Flux ControlNet (diffusers layout): incomplete file, {[k for k in need if k not in shapes]} "
                         f"missing")
    hidden = shapes["img_in.weight"][0]
    flux = flux_config(shapes | {"final_layer.linear.weight": (shapes["img_in.weight"][1], hidden)})
    hint = shapes["pos_embed_input.weight"][1] // (PATCH * PATCH)
    modes = shapes["controlnet_mode_embedder.weight"][0] if "controlnet_mode_embedder.weight" in shapes else 0
    return FluxControlNetConfig(flux=flux, hint_channels=hint, union_modes=modes)


def is_flux_mistoline_controlnet(keys: Collection[str]) -> bool:
    """MistoLine's Flux nets (ComfyUI's test): heads with a ``linear`` inside."""
    return "controlnet_blocks.0.linear.weight" in keys


def mistoline_rename(key: str) -> str:
    """ComfyUI's ``convert_mistoline``: ``single_controlnet_blocks.`` -> ``controlnet_single_blocks.``."""
    old = "single_controlnet_blocks."
    return "controlnet_single_blocks." + key[len(old):] if key.startswith(old) else key


MISTOLINE_LAYOUT = "flux_controlnet_mistoline"
register_layout(FamilyLayout(MISTOLINE_LAYOUT, lambda keys: False,
                             lambda info: {mistoline_rename(k): v for k, v in info.items()},
                             lambda keys: mistoline_rename))


def mistoline_controlnet_config(info: Mapping[str, Any]) -> FluxControlNetConfig:
    """The config of a MistoLine net from its keys and shapes (``single_controlnet_blocks`` renamed)."""
    shapes = {mistoline_rename(k): tuple(getattr(v, "shape", v)) for k, v in info.items()}
    need = ("img_in.weight", "txt_in.weight", "pos_embed_input.weight", "input_cond_block.encoder.0.weight",
            "double_blocks.0.img_mlp.0.weight", "double_blocks.0.img_attn.norm.key_norm.scale")
    if any(k not in shapes for k in need):
        raise ValueError(f"Flux MistoLine ControlNet: incomplete file, {[k for k in need if k not in shapes]} missing")
    hidden = shapes["img_in.weight"][0]
    flux = flux_config(shapes | {"final_layer.linear.weight": (shapes["img_in.weight"][1], hidden)})
    return FluxControlNetConfig(flux=flux, hint_channels=HINT_WIDTH, pixel_hint=True, mistoline=True)


def is_flux_xlabs_controlnet(keys: Collection[str]) -> bool:
    """XLabs' nets (ComfyUI's test): BFL-named double blocks beside ``controlnet_blocks``."""
    return "controlnet_blocks.0.weight" in keys and "double_blocks.0.img_attn.norm.key_norm.scale" in keys


def xlabs_controlnet_config(info: Mapping[str, Any]) -> FluxControlNetConfig:
    """The config of an XLabs net from its (BFL-named) keys and shapes."""
    shapes = {k: tuple(getattr(v, "shape", v)) for k, v in info.items()}
    need = ("img_in.weight", "txt_in.weight", "pos_embed_input.weight", "input_hint_block.0.weight",
            "double_blocks.0.img_mlp.0.weight")
    if any(k not in shapes for k in need):
        raise ValueError(f"Flux XLabs ControlNet: incomplete file, {[k for k in need if k not in shapes]} missing")
    if shapes["input_hint_block.0.weight"][:2] != (HINT_WIDTH, 3) or shapes["pos_embed_input.weight"][1] != HINT_WIDTH * 4:
        raise ValueError(f"Flux XLabs ControlNet: a hint stack of {shapes['input_hint_block.0.weight']} / "
                         f"{shapes['pos_embed_input.weight']}; ComfyUI's is 3 -> {HINT_WIDTH} channels")
    hidden = shapes["img_in.weight"][0]
    flux = flux_config(shapes | {"final_layer.linear.weight": (shapes["img_in.weight"][1], hidden)})
    return FluxControlNetConfig(flux=flux, hint_channels=HINT_WIDTH, pixel_hint=True)


def _repeat_each(outs: list[Tensor], total: int) -> list[Tensor]:
    """Each entry ceil(total / n) times in a row, cut at ``total`` (ComfyUI, latent-input nets)."""
    if not outs:
        return []
    n = math.ceil(total / len(outs))
    return [o for o in outs for _ in range(n)][:total]


def _cycle(outs: list[Tensor], total: int) -> list[Tensor]:
    """The whole list repeated ceil(total / n) times, cut at ``total`` (ComfyUI, XLabs nets)."""
    return (outs * math.ceil(total / len(outs)))[:total] if outs else []


class _MistolineHead(nn.Module):
    """A MistoLine head: Linear then SiLU (keys ``controlnet_blocks.N.linear``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.silu(self.linear(x))


class _MistolineCond(nn.Module):
    """MistoLine's hint stack (``input_cond_block.encoder``): 3 -> 16 channels, 8x down, 1x1 convs
    second and second to last; SiLU between (ComfyUI ``MistolineCondDownsamplBlock``)."""

    def __init__(self):
        super().__init__()
        w = HINT_WIDTH
        convs = [nn.Conv2d(3, w, 3, padding=1), nn.Conv2d(w, w, 1)]
        for stride in (1, 2, 1, 2, 1, 2):
            convs.append(nn.Conv2d(w, w, 3, padding=1, stride=stride))
        convs += [nn.Conv2d(w, w, 1), nn.Conv2d(w, w, 3, padding=1)]
        layers: list[nn.Module] = [convs[0]]
        for conv in convs[1:]:
            layers += [nn.SiLU(), conv]
        self.encoder = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.encoder(x)


def _hint_block() -> nn.Sequential:
    """XLabs' conv stack: 3 -> 16 channels, 8x down (stride-2 convs at 4, 8, 12); SiLU between."""
    layers: list[nn.Module] = [nn.Conv2d(3, HINT_WIDTH, 3, padding=1)]
    for stride in (1, 2, 1, 2, 1, 2, 1):
        layers += [nn.SiLU(), nn.Conv2d(HINT_WIDTH, HINT_WIDTH, 3, padding=1, stride=stride)]
    return nn.Sequential(*layers)


class FluxControlNet(Flux):
    """x [B, C, H, W], hint latent [B, C_hint, H, W], timestep [B] (σ), context [B, T, D], y, guidance,
    control_type () or (index,) -> (double residuals, single residuals), each a list of [B, N, D]."""

    keep_f32: tuple[str, ...] = ("time_in", "vector_in", "guidance_in", "*.norm")
    keep_f32_inputs: tuple[str, ...] = ("timestep", "guidance", "y")

    def __init__(self, cfg: FluxControlNetConfig):
        super().__init__(cfg.flux)
        del self.final_layer  # the net has none (ComfyUI ``final_layer=False``)
        self.cn_config = cfg
        d = cfg.flux.hidden_size
        head = (lambda: _MistolineHead(d)) if cfg.mistoline else (lambda: nn.Linear(d, d))
        self.controlnet_blocks = nn.ModuleList(head() for _ in range(cfg.flux.depth))
        self.controlnet_single_blocks = nn.ModuleList(head() for _ in range(cfg.flux.depth_single_blocks))
        self.pos_embed_input = nn.Linear(cfg.hint_channels * PATCH * PATCH, d)
        if cfg.union_modes:
            self.controlnet_mode_embedder = nn.Embedding(cfg.union_modes, d)
        if cfg.mistoline:
            self.input_cond_block = _MistolineCond()
        elif cfg.pixel_hint:
            self.input_hint_block = _hint_block()

    def forward(self, x: Tensor, hint: Tensor, timestep: Tensor, context: Tensor, y: Tensor | None = None,
                guidance: Tensor | None = None, control_type: tuple[int, ...] = ()) -> tuple[list, list]:
        b, _, h, w = x.shape
        if self.cn_config.pixel_hint:  # XLabs / MistoLine: pixels [B, 3, 8h, 8w] -> features [B, 16, h, w]
            stack = self.input_cond_block if self.cn_config.mistoline else self.input_hint_block
            hint = stack(hint * 2.0 - 1.0)
        img = self.img_in(patchify(x)) + self.pos_embed_input(patchify(hint))  # [B, N, D]
        vec = self.conditioning_vector(timestep, y, guidance, img.dtype)
        txt = self.txt_in(context)
        if control_type and self.cn_config.union_modes:  # the type's row as a first text token
            mode = self.controlnet_mode_embedder(torch.tensor(list(control_type), device=x.device))  # [k, D]
            txt = torch.cat([mode[None].expand(b, -1, -1).to(txt.dtype), txt], 1)
        n_txt = txt.shape[1]
        ids = torch.cat([torch.zeros(b, n_txt, 3, device=x.device), image_ids(-(-h // PATCH), -(-w // PATCH), b,
                                                                             device=x.device)], 1)
        pe = positional_embedding(ids, self.config.axes_dim, self.config.theta)
        double: list[Tensor] = []
        for block, head in zip(self.double_blocks, self.controlnet_blocks):
            img, txt = block(img, txt, pe, vec=vec)
            double.append(head(img))
        tokens = torch.cat([txt, img], 1)
        single: list[Tensor] = []
        for block, head in zip(self.single_blocks, self.controlnet_single_blocks):
            tokens = block(tokens, pe, vec=vec)
            single.append(head(tokens[:, n_txt:]))
        spread = _cycle if self.cn_config.pixel_hint else _repeat_each
        return spread(double, MAIN_DOUBLE), spread(single, MAIN_SINGLE)


@dataclass(frozen=True)
class FluxControlNetHandle:
    """CONTROL_NET for a Flux ControlNet in diffusers' layout; bound to the sampled model when
    sampling starts (to check it is a Flux.1 model of the net's width)."""

    source: WeightSource
    config: FluxControlNetConfig
    precision: object = None
    patches: tuple = ()
    control_type: tuple[int, ...] = ()

    chain_type = DitControlChain
    module_class = FluxControlNet  # what the weights build (the memory estimate)
    takes_inputs = True
    family = "flux"
    preprocess = None

    @property
    def concat_mask(self) -> bool:
        """An inpainting net (AliMama's): 16 latent + 1 mask hint channels (ComfyUI's test: 17)."""
        return self.config.hint_channels == 17

    @property
    def latent_format(self):
        """Flux's format for the hint latent; None: an XLabs net takes the image itself."""
        return None if self.config.pixel_hint else FLUX_LATENT

    def with_precision(self, policy) -> "FluxControlNetHandle":
        return dataclasses.replace(self, precision=policy)

    def chain_args(self, vae, vae_policy, extra_concat: tuple = ()) -> dict:
        return dit_chain_args(self, vae, vae_policy, extra_concat)

    def with_control_type(self, control_type: tuple[int, ...]) -> "FluxControlNetHandle":
        """SetUnionControlNetType; a plain net ignores the type, as in ComfyUI."""
        n = self.config.union_modes
        if n and any(not 0 <= t < n for t in control_type):
            raise ValueError(f"union ControlNet: control type {list(control_type)} out of range (it has {n} types)")
        return dataclasses.replace(self, control_type=tuple(control_type))

    def runner(self, policy) -> "_Unbound":
        return _Unbound(self, policy)


class _Unbound:
    def __init__(self, handle: FluxControlNetHandle, policy):
        self.handle, self.policy = handle, policy

    def __call__(self, *args, **kwargs):
        raise RuntimeError("Flux ControlNet: not bound to a model (KSampler / SamplerCustom bind it)")

    def bind_model(self, model) -> "_Bound":
        handle = getattr(model, "handle", None)
        family = getattr(handle, "family", None)
        if family != self.handle.family:  # the family the net was trained for (its handle says)
            raise ValueError(f"Flux ControlNet applied to a {family or type(model).__name__} model: it runs with "
                             f"Flux.1 models only")
        if handle.config.hidden_size != self.handle.config.flux.hidden_size:
            raise ValueError(f"Flux ControlNet is {self.handle.config.flux.hidden_size} wide; the Flux model "
                             f"{handle.config.hidden_size}")
        h = self.handle
        net = store.materialize("controlnet", h.source, h.config, self.policy.storage, h.patches, FluxControlNet)
        return _Bound(apply_precision(net, self.policy), h.control_type)


class _Bound:
    """Runs the net with the cond's model inputs (``y``, ``guidance``): the chain gives them as
    ``inputs`` (``DitControlChain.takes_inputs``)."""

    def __init__(self, net: nn.Module, control_type: tuple[int, ...]):
        self.net, self.control_type = net, control_type

    def __call__(self, x: Tensor, hint: Tensor, timesteps: Tensor, context: Tensor | None, y: Tensor | None,
                 inputs: Mapping[str, Tensor] | None = None) -> Control:
        if context is None:
            raise ValueError("Flux ControlNet: a cond without text tokens")
        guidance = (inputs or {}).get("guidance")
        double, single = self.net(x, hint, timesteps, context, y, guidance, self.control_type)
        return Control(input=list(double), output=list(single))
