"""Stability's SD3.5 ControlNets (blur, canny, depth for SD3.5 Large; ComfyUI
``comfy/cldm/dit_embedder.py: ControlNetEmbedder``, loaded by ``load_controlnet_sd35``).

The net is a few image-only MMDiT blocks (``transformer_blocks.N``: the x stream of a joint block
run as a self-attention block, ComfyUI's ``DismantledBlock.forward``), each followed by a Linear
(``controlnet_blocks.N``) whose output is one residual for the main model's joint blocks. Its
input is the sampler's latent patched by ``x_embedder`` plus the VAE-encoded hint patched by
``pos_embed_input``; its conditioning vector is t_embedder(t) + y_embedder(pooled).

Two kinds, told by ``y_embedder.mlp.0.weight``'s shape (ComfyUI's ``double_y_emb``):
- square (SD3.5 Large's nets): the pooled vector first passes the *main model's* ``y_embedder``
  (ComfyUI copies it into ``orig_y_embedder`` before sampling), then the net's; the latent is
  patched by the net's own ``x_embedder`` without a position table; every block reads the same
  tokens (the block outputs do not feed the next block).
- otherwise: the latent is patched by the *main model's* ``x_embedder`` (copied before sampling)
  plus a 2-D sin-cos table (``sincos_2d``), and the blocks run in sequence.
Each block's residual is repeated ceil(main depth / blocks) times, main depth = width / 64; the
main model adds residual i after joint block i (``Control.output``; ``mmdit.MMDiT.forward``).
The hint latent is in SD3's latent format; canny nets take ``hint·255·0.5 + 0.5`` and depth nets
``1 − hint`` (ComfyUI's preprocessing, chosen by the file's ``control_type`` scalar).

File keys: the blocks in ComfyUI's names, the embedders either in them or in diffusers' names
(``pos_embed.proj``, ``time_text_embed.*``), which ``sd35_rename`` maps (ComfyUI's
``MMDIT_MAP_BASIC``); the weight store reads the file through the ``sd35_controlnet`` layout.
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
from mixgraph.nodes.families.sd3.mmdit import (HEAD_WIDTH, DismantledBlock, PatchEmbed, TimestepEmbedder,
                                               VectorEmbedder)
from mixgraph.nodes.models.attention import attention
from mixgraph.nodes.payloads.conditioning import Control
from mixgraph.nodes.vae.flow_latent_formats import SD3_LATENT
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["SD35ControlNetConfig", "SD35ControlNet", "SD35ControlNetHandle", "is_sd35_controlnet",
           "sd35_rename", "sd35_config_from_shapes", "sincos_2d", "LAYOUT", "CONTROL_TYPES"]

LAYOUT = "sd35_controlnet"
SIGNATURE = "transformer_blocks.0.adaLN_modulation.1.bias"
CONTROL_TYPES = {0: "blur", 1: "canny", 2: "depth"}  # the file's ``control_type`` scalar

# diffusers-named embedders -> ComfyUI's names (ComfyUI ``utils.MMDIT_MAP_BASIC``, the parts such a net has)
_BASIC = {
    "pos_embed.proj.": "x_embedder.proj.",
    "time_text_embed.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
    "time_text_embed.timestep_embedder.linear_2.": "t_embedder.mlp.2.",
    "time_text_embed.text_embedder.linear_1.": "y_embedder.mlp.0.",
    "time_text_embed.text_embedder.linear_2.": "y_embedder.mlp.2.",
}


def is_sd35_controlnet(keys: Collection[str]) -> bool:
    """ComfyUI's test for Stability's SD3.5 format (``load_controlnet_state_dict``)."""
    return "controlnet_blocks.0.weight" in keys and "pos_embed_input.proj.weight" in keys and SIGNATURE in keys


def sd35_rename(key: str) -> str | None:
    """A stored key -> the module's key; None drops the ``control_type`` scalar."""
    if key == "control_type":
        return None
    for old, new in _BASIC.items():
        if key.startswith(old):
            return new + key[len(old):]
    return key


def _layout_rename(keys: Iterable[str]):
    return sd35_rename


def _header(info: Mapping[str, Any]) -> dict:
    return {new: v for k, v in info.items() if (new := sd35_rename(k)) is not None}


# matches nothing: the loaders' family-layout lookup must not take a ControlNet for a model file
register_layout(FamilyLayout(LAYOUT, lambda keys: False, _header, _layout_rename))


@dataclass(frozen=True)
class SD35ControlNetConfig:
    """hidden: token width (64 per head). blocks: transformer blocks. double_y_emb: the Large
    kind (see the module docstring). y_in: the pooled width the net's ``y_embedder`` takes (the
    width when double_y_emb). in_channels / hint_channels / patch: of ``x_embedder`` and
    ``pos_embed_input``. control_type: the file's scalar (-1: none)."""

    hidden: int
    blocks: int
    double_y_emb: bool
    y_in: int
    in_channels: int = 16
    hint_channels: int = 16
    patch: int = 2
    control_type: int = -1

    @property
    def heads(self) -> int:
        return self.hidden // HEAD_WIDTH

    @property
    def repeat(self) -> int:
        """Residuals per block: ceil(main depth / blocks), main depth = width / 64 (ComfyUI)."""
        return math.ceil((self.hidden // HEAD_WIDTH) / self.blocks)


def _shape(v) -> tuple[int, ...]:
    return tuple(getattr(v, "shape", v))


def sd35_config_from_shapes(info: Mapping[str, Any], control_type: int = -1) -> SD35ControlNetConfig:
    """The config from the (renamed) keys and shapes of an SD3.5 ControlNet."""
    y0 = _shape(info["y_embedder.mlp.0.weight"])  # [hidden, y_in]
    hint = _shape(info["pos_embed_input.proj.weight"])  # [hidden, C, p, p]
    blocks = len({k.split(".")[1] for k in info if k.startswith("transformer_blocks.")})
    if y0[0] % HEAD_WIDTH:
        raise ValueError(f"SD3.5 ControlNet: width {y0[0]} is not a multiple of {HEAD_WIDTH}")
    double = y0[0] == y0[1]
    in_ch = _shape(info["x_embedder.proj.weight"])[1] if "x_embedder.proj.weight" in info else 16
    if double and "x_embedder.proj.weight" not in info:
        raise ValueError("SD3.5 ControlNet (Large kind): x_embedder.proj.weight missing from the file")
    return SD35ControlNetConfig(hidden=y0[0], blocks=blocks, double_y_emb=double, y_in=y0[1], in_channels=in_ch,
                                hint_channels=hint[1], patch=hint[2], control_type=control_type)


def sincos_2d(dim: int, w: int, h: int) -> Tensor:
    """ComfyUI's ``get_2d_sincos_pos_embed_torch`` (centre 7.5, magnitude 7.5 along the shorter
    side): [h·w, dim], the w half first. f32."""
    small = min(h, w)
    val_h, val_w = h / small * 7.5, w / small * 7.5
    gh, gw = torch.meshgrid(torch.linspace(-val_h + 7.5, val_h + 7.5, h), torch.linspace(-val_w + 7.5, val_w + 7.5, w),
                            indexing="ij")  # [h, w] each

    def one_d(d: int, pos: Tensor) -> Tensor:
        omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float32) / (d / 2.0))
        out = pos.reshape(-1)[:, None] * omega[None]  # [h·w, d/2]
        return torch.cat([torch.sin(out), torch.cos(out)], dim=1)

    return torch.cat([one_d(dim // 2, gw), one_d(dim // 2, gh)], dim=1)


class SD35ControlNet(nn.Module):
    """x [B, C, H, W] (or its tokens ``img`` from the main model's ``x_embedder``), hint latent
    [B, C_hint, H, W], timesteps [B], y [B, y_in] (the main model's y_embedder output for the
    Large kind) -> a list of blocks · repeat residuals [B, N, hidden]."""

    keep_f32: tuple[str, ...] = ("t_embedder", "y_embedder")
    keep_f32_inputs: tuple[str, ...] = ("timesteps", "y")

    def __init__(self, cfg: SD35ControlNetConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        if cfg.double_y_emb:
            self.x_embedder = PatchEmbed(cfg.in_channels, d, cfg.patch)
        self.t_embedder = TimestepEmbedder(d)
        self.y_embedder = VectorEmbedder(cfg.y_in, d)
        self.transformer_blocks = nn.ModuleList(DismantledBlock(d, cfg.heads) for _ in range(cfg.blocks))
        self.controlnet_blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(cfg.blocks))
        self.pos_embed_input = PatchEmbed(cfg.hint_channels, d, cfg.patch)

    def block(self, i: int, x: Tensor, c: Tensor) -> Tensor:
        """Block i as a self-attention block over the image tokens."""
        blk = self.transformer_blocks[i]
        qkv, _, mods = blk.pre_attention(x, c)
        return blk.post_attention(x, attention(*qkv, self.cfg.heads), None, mods)

    def forward(self, x: Tensor, hint: Tensor, timesteps: Tensor, y: Tensor, img: Tensor | None = None) -> list[Tensor]:
        cfg = self.cfg
        if cfg.double_y_emb:
            img = self.x_embedder(x)  # [B, N, D]
        else:
            if img is None:
                raise ValueError("SD3.5 ControlNet: the main model's patched latent is needed (not bound to a model)")
            h, w = ((s + 1) // cfg.patch for s in x.shape[-2:])
            img = img + sincos_2d(cfg.hidden, w, h).to(img.dtype)[None]
        c = self.t_embedder(timesteps) + self.y_embedder(y)  # [B, D]
        img = img + self.pos_embed_input(hint)
        outs: list[Tensor] = []
        for i in range(cfg.blocks):
            out = self.block(i, img, c)
            if not cfg.double_y_emb:
                img = out
            outs += [self.controlnet_blocks[i](out)] * cfg.repeat
        return outs


_PREPROCESS = {1: lambda a: a * 255 * 0.5 + 0.5, 2: lambda a: 1.0 - a}  # canny, depth (ComfyUI)


@dataclass(frozen=True)
class SD35ControlNetHandle:
    """CONTROL_NET for an SD3.5 ControlNet file. ``runner(policy)`` is unbound: the sampler binds
    it to the sampled SD3 model (``bind_model``), whose y_embedder / x_embedder the net borrows."""

    source: WeightSource
    config: SD35ControlNetConfig
    precision: object = None
    patches: tuple = ()
    control_type: tuple[int, ...] = ()  # SetUnionControlNetType's argument: unused, as in ComfyUI

    chain_type = DitControlChain
    module_class = SD35ControlNet  # what the weights build (the memory estimate)
    family = "sd3"

    @property
    def latent_format(self):
        return SD3_LATENT

    @property
    def preprocess(self):
        return _PREPROCESS.get(self.config.control_type)

    def with_precision(self, policy) -> "SD35ControlNetHandle":
        return dataclasses.replace(self, precision=policy)

    def chain_args(self, vae, vae_policy, extra_concat: tuple = ()) -> dict:
        return dit_chain_args(self, vae, vae_policy, extra_concat)

    def module(self, policy) -> nn.Module:
        m = store.materialize("controlnet", self.source, self.config, policy.storage, self.patches, SD35ControlNet)
        return apply_precision(m, policy)

    def runner(self, policy) -> "SD35Runner":
        return SD35Runner(self, policy)


class SD35Runner:
    """An SD3.5 ControlNet link's runner before the sampled model is known."""

    def __init__(self, handle: SD35ControlNetHandle, policy):
        self.handle, self.policy = handle, policy

    def __call__(self, *args, **kwargs):
        raise RuntimeError("SD3.5 ControlNet: not bound to a model; it borrows the sampled SD3 model's embedders "
                           "when sampling starts (KSampler / SamplerCustom)")

    def bind_model(self, model) -> "BoundSD35Runner":
        handle = getattr(model, "handle", None)
        family = getattr(handle, "family", None)
        if family != self.handle.family:  # the family the net was trained for (its handle says)
            raise ValueError(f"SD3.5 ControlNet applied to a {family or type(model).__name__} model: it runs with "
                             f"SD3 / SD3.5 models only")
        main = model.model
        cfg = self.handle.config
        if main.cfg.hidden != cfg.hidden:
            raise ValueError(f"SD3.5 ControlNet is {cfg.hidden} wide; the SD3 model {main.cfg.hidden} "
                             f"(a ControlNet for another SD3 size)")
        return BoundSD35Runner(self.handle.module(self.policy), main)


class BoundSD35Runner:
    """The runnable link: the net plus the main model's embedders it borrows (ComfyUI
    ``ControlNetSD35.pre_run``). Returns the unscaled residuals as ``Control.output``."""

    def __init__(self, net: nn.Module, main: nn.Module):
        self.net, self.main = net, main

    def __call__(self, x: Tensor, hint: Tensor, timesteps: Tensor, context: Tensor | None,
                 y: Tensor | None) -> Control:
        cfg = self.net.cfg
        if y is None:
            raise ValueError("SD3.5 ControlNet: the model gives no pooled vector y")
        img = None
        if cfg.double_y_emb:
            y = self.main.y_embedder(y).float()
        else:
            img = self.main.x_embedder(x).float()
        return Control(input=[], output=list(self.net(x, hint, timesteps, y, img)))
