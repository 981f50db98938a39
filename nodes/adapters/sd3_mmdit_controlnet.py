"""SD3 ControlNets in diffusers' ``SD3ControlNetModel`` layout with joint blocks (InstantX's SD3
canny / pose / tile nets; ComfyUI ``load_controlnet_mmdit`` and ``comfy/cldm/mmdit.py``).

The net is the first ``blocks`` joint blocks of an MMDiT of the main model's width (no final
layer, so no pre-only block), with ``pos_embed_input`` patching the VAE-encoded hint onto the
image tokens and a Linear per block (``controlnet_blocks.N``). As ComfyUI: the pooled vector is
replaced by zeros (``y = zeros_like(y)``), the hint latent is in SD3's format without its shift
(scale 1.5305 only), and block i's residual is repeated depth // blocks times (the last block's
once fewer), depth = width / 64, so the main model's last joint block gets none.

Keys: diffusers' names, converted by the SD3 family's diffusers map (``sd3/diffusers_keys.py``);
ComfyUI swaps the (scale, shift) halves of block depth − 1's ``norm1_context`` only (the main
model's last block), which a net with fewer blocks does not have. Inpainting nets (AliMama's: 17
hint channels, ComfyUI's ``concat_mask``) take the kept-area mask after the hint latent
(``dit_controlnet.DitControlChain.extra_concat``; ControlNetInpaintingAliMamaApply).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mixgraph.nodes.adapters.dit_controlnet import DitControlChain, dit_chain_args
from mixgraph.nodes.families.sd3.diffusers_keys import diffusers_rename, fuse
from mixgraph.nodes.families.sd3.mmdit import (HEAD_WIDTH, JointBlock, MMDiTConfig, PatchEmbed, TimestepEmbedder,
                                               VectorEmbedder)
from mixgraph.nodes.payloads.conditioning import Control
from mixgraph.nodes.vae.flow_latent_formats import shifted_format
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.layouts import FamilyLayout, register_layout
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["MMDiTControlNetConfig", "MMDiTControlNet", "MMDiTControlNetHandle", "is_mmdit_controlnet",
           "mmdit_controlnet_config", "LAYOUT", "LATENT_FORMAT"]

LAYOUT = "sd3_controlnet_diffusers"
LATENT_FORMAT = shifted_format(1.5305, 0.0, "sd3")  # ComfyUI: SD3's format with shift_factor = 0
_OWN = ("controlnet_blocks.", "pos_embed_input.")
_NORM1_CONTEXT = re.compile(r"joint_blocks\.(\d+)\.context_block\.adaLN_modulation\.1\.")


def is_mmdit_controlnet(keys: Collection[str]) -> bool:
    """ComfyUI's test: ``controlnet_blocks`` + ``pos_embed_input.proj``, not Stability's SD3.5 format."""
    return ("controlnet_blocks.0.weight" in keys and "pos_embed_input.proj.weight" in keys
            and "transformer_blocks.0.adaLN_modulation.1.bias" not in keys
            and "double_blocks.0.img_attn.norm.key_norm.scale" not in keys)


def _rename(keys: Iterable[str]):
    """Stored key -> the module's key (with the SD3 map's part tags); no ``norm1_context`` swap here
    (``_post`` swaps block depth − 1's, which needs the width)."""
    base = diffusers_rename(keys)

    def rename(key: str) -> str | None:
        if key.startswith(_OWN):
            return key
        new = base(key)
        if new is not None and new.endswith("@swap") and _NORM1_CONTEXT.match(new):
            return new[:-len("@swap")]
        return new

    return rename


def _post(sd: dict) -> dict:
    """q, k, v fused; block depth − 1's ``norm1_context`` (scale, shift) -> (shift, scale) when the
    net has that block (ComfyUI's ``mmdit_to_diffusers`` for depth = width / 64)."""
    out = fuse(sd)
    depth = out["x_embedder.proj.weight"].shape[0] // HEAD_WIDTH
    for end in ("weight", "bias"):
        key = f"joint_blocks.{depth - 1}.context_block.adaLN_modulation.1.{end}"
        if key in out:
            scale, shift = out[key].chunk(2, dim=0)
            out[key] = torch.cat([shift, scale], dim=0)
    return out


def _header(info: Mapping[str, Any]) -> dict:
    rename = _rename(info)
    shapes: dict[str, tuple[int, ...]] = {}
    for k, v in info.items():
        new = rename(k)
        if new is None:
            continue
        base, _, tag = new.partition("@")
        shape = tuple(getattr(v, "shape", v))
        if tag in ("q", "k", "v") and base in shapes:
            shape = (shapes[base][0] + shape[0],) + shape[1:]
        shapes[base] = shape
    return shapes


# matches nothing: the loaders' family-layout lookup must not take a ControlNet for a model file
register_layout(FamilyLayout(LAYOUT, lambda keys: False, _header, _rename, _post))


@dataclass(frozen=True)
class MMDiTControlNetConfig:
    """mmdit: the sizes (depth = the main model's joint blocks, width / 64); blocks: the net's joint
    blocks; hint_channels: ``pos_embed_input``'s input (16; 17 for inpainting nets)."""

    mmdit: MMDiTConfig
    blocks: int
    hint_channels: int = 16

    @property
    def counts(self) -> tuple[int, ...]:
        """How many times each block's residual is used (ComfyUI ``cldm/mmdit.py``)."""
        each = self.mmdit.depth // self.blocks
        return tuple(each - (i == self.blocks - 1) for i in range(self.blocks))


def mmdit_controlnet_config(info: Mapping[str, Any]) -> MMDiTControlNetConfig:
    """The config from a diffusers-layout header (keys -> TensorInfo or shape)."""
    shapes = _header(info)
    need = ("x_embedder.proj.weight", "pos_embed", "t_embedder.mlp.0.weight", "pos_embed_input.proj.weight")
    if any(k not in shapes for k in need):
        raise ValueError(f"SD3 ControlNet (diffusers layout): {[k for k in need if k not in shapes]} missing")
    proj, pos = shapes["x_embedder.proj.weight"], shapes["pos_embed"]  # [D, C, p, p], [1, N², D]
    blocks = len({k.split(".")[1] for k in shapes if k.startswith("joint_blocks.")})
    suffix = ".x_block.attn2.qkv.weight"
    mm = MMDiTConfig(in_channels=proj[1], out_channels=proj[1], patch_size=proj[2], depth=proj[0] // HEAD_WIDTH,
                     pos_embed_max_size=round(pos[1] ** 0.5),
                     context_in=shapes["context_embedder.weight"][1] if "context_embedder.weight" in shapes else None,
                     adm_in_channels=shapes["y_embedder.mlp.0.weight"][1] if "y_embedder.mlp.0.weight" in shapes else None,
                     qk_norm="joint_blocks.0.context_block.attn.ln_q.weight" in shapes,
                     x_block_self_attn_layers=tuple(sorted(int(k.split(".")[1]) for k in shapes if k.endswith(suffix))))
    hint = shapes["pos_embed_input.proj.weight"][1]
    return MMDiTControlNetConfig(mmdit=mm, blocks=blocks, hint_channels=hint)


class MMDiTControlNet(nn.Module):
    """x [B, C, H, W], hint latent [B, C_hint, H, W], timesteps [B], context [B, T, ctx], y (only its
    shape matters: ComfyUI zeroes it) -> one residual [B, N, D] per main-model block it reaches."""

    keep_f32: tuple[str, ...] = ("t_embedder", "y_embedder", "pos_embed", "*.ln_q", "*.ln_k")
    keep_f32_inputs: tuple[str, ...] = ("timesteps", "y")

    def __init__(self, cfg: MMDiTControlNetConfig):
        super().__init__()
        self.cfg = cfg
        m = cfg.mmdit
        d = m.hidden
        self.x_embedder = PatchEmbed(m.in_channels, d, m.patch_size)
        self.t_embedder = TimestepEmbedder(d)
        if m.adm_in_channels is not None:
            self.y_embedder = VectorEmbedder(m.adm_in_channels, d)
        self.context_embedder = nn.Linear(m.context_in, d) if m.context_in is not None else nn.Identity()
        self.register_buffer("pos_embed", torch.zeros(1, m.pos_embed_max_size ** 2, d))
        layers = set(m.x_block_self_attn_layers)
        self.joint_blocks = nn.ModuleList(JointBlock(d, m.heads, pre_only=False, qk_norm=m.qk_norm,
                                                     self_attn=i in layers) for i in range(cfg.blocks))
        self.controlnet_blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(cfg.blocks))
        self.pos_embed_input = PatchEmbed(cfg.hint_channels, d, m.patch_size)

    def cropped_pos_embed(self, gh: int, gw: int) -> Tensor:
        """The centre gh x gw of the stored position grid, [1, gh·gw, D] (as the MMDiT's)."""
        n = self.cfg.mmdit.pos_embed_max_size
        if gh > n or gw > n:
            raise ValueError(f"SD3 ControlNet: a {gh}x{gw} patch grid is larger than its {n}x{n} position table")
        top, left = (n - gh) // 2, (n - gw) // 2
        return self.pos_embed.reshape(1, n, n, -1)[:, top:top + gh, left:left + gw].reshape(1, gh * gw, -1)

    def forward(self, x: Tensor, hint: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None) -> list[Tensor]:
        p = self.cfg.mmdit.patch_size
        gh, gw = -(-x.shape[-2] // p), -(-x.shape[-1] // p)
        img = self.x_embedder(x)
        img = img + self.cropped_pos_embed(gh, gw).to(img.dtype)
        img = img + self.pos_embed_input(hint)
        c = self.t_embedder(timesteps)  # [B, D]
        if hasattr(self, "y_embedder"):  # ComfyUI: y = zeros_like(y)
            c = c + self.y_embedder(torch.zeros(x.shape[0], self.cfg.mmdit.adm_in_channels, device=x.device,
                                                dtype=c.dtype))
        txt = self.context_embedder(context)
        outs: list[Tensor] = []
        for block, head, count in zip(self.joint_blocks, self.controlnet_blocks, self.cfg.counts):
            txt, img = block(txt, img, c)
            outs += [head(img)] * count
        return outs


@dataclass(frozen=True)
class MMDiTControlNetHandle:
    """CONTROL_NET for an SD3 ControlNet in diffusers' layout; ``runner(policy)`` is bound to the
    sampled model when sampling starts (only to check it is an SD3 model of the net's width)."""

    source: WeightSource
    config: MMDiTControlNetConfig
    precision: object = None
    patches: tuple = ()
    control_type: tuple[int, ...] = ()

    chain_type = DitControlChain
    module_class = MMDiTControlNet  # what the weights build (the memory estimate)
    family = "sd3"
    latent_format = LATENT_FORMAT
    preprocess = None

    @property
    def concat_mask(self) -> bool:
        """An inpainting net (AliMama's): 16 latent + 1 mask hint channels (ComfyUI's test: 17)."""
        return self.config.hint_channels == 17

    def with_precision(self, policy) -> "MMDiTControlNetHandle":
        return dataclasses.replace(self, precision=policy)

    def chain_args(self, vae, vae_policy, extra_concat: tuple = ()) -> dict:
        return dit_chain_args(self, vae, vae_policy, extra_concat)

    def runner(self, policy) -> "_Unbound":
        return _Unbound(self, policy)


class _Unbound:
    def __init__(self, handle: MMDiTControlNetHandle, policy):
        self.handle, self.policy = handle, policy

    def __call__(self, *args, **kwargs):
        raise RuntimeError("SD3 ControlNet: not bound to a model (KSampler / SamplerCustom bind it)")

    def bind_model(self, model) -> "_Bound":
        family = getattr(getattr(model, "handle", None), "family", None)
        if family != self.handle.family:  # the family the net was trained for (its handle says)
            raise ValueError(f"SD3 ControlNet applied to a {family or type(model).__name__} model: it runs with "
                             f"SD3 / SD3.5 models only")
        width = model.model.cfg.hidden
        if width != self.handle.config.mmdit.hidden:
            raise ValueError(f"SD3 ControlNet is {self.handle.config.mmdit.hidden} wide; the SD3 model {width}")
        h = self.handle
        net = store.materialize("controlnet", h.source, h.config, self.policy.storage, h.patches, MMDiTControlNet)
        return _Bound(apply_precision(net, self.policy))


class _Bound:
    def __init__(self, net: nn.Module):
        self.net = net

    def __call__(self, x: Tensor, hint: Tensor, timesteps: Tensor, context: Tensor | None,
                 y: Tensor | None) -> Control:
        if context is None:
            raise ValueError("SD3 ControlNet: a cond without text tokens")
        return Control(input=[], output=list(self.net(x, hint, timesteps, context, y)))
