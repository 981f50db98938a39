"""Chroma (Lodestone Rock): Flux.1 schnell's transformer with its per-block modulation layers
pruned. One approximator network (``distilled_guidance_layer``) maps (timestep, guidance, block
slot) to every block's (shift, scale, gate) at once; there is no CLIP-L pooled vector, no
``time_in`` / ``vector_in`` / ``guidance_in``. The blocks are ``model.py``'s, built without their
modulation layers and given the approximator's vectors.

The approximator's input for slot i (ComfyUI ``comfy/ldm/chroma/model.py``; diffusers'
``ChromaCombinedTimestepTextProjEmbeddings``): [emb16(t), emb16(guidance), emb32(i)], the
sinusoidal embeddings of 1000·t, 1000·guidance and 1000·i. Slots: the single blocks' 3 each,
then the double blocks' image 6 each, their text 6 each, and the last layer's (shift, scale).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.families.flux.model import (PATCH, DoubleStreamBlock, LastLayer, MLPEmbedder, RMSNorm,
                                                SingleStreamBlock, default_axes_dim, embed_image_tokens,
                                                joint_mask, run_blocks, timestep_embedding)

__all__ = ["ChromaConfig", "Chroma", "Approximator", "chroma_config", "APPROXIMATOR_IN"]

APPROXIMATOR_IN = 64  # 16 (timestep) + 16 (guidance) + 32 (slot index)


@dataclass(frozen=True)
class ChromaConfig:
    """Chroma's shape, from tensor shapes (ComfyUI's ``ChromaParams``; channels per latent pixel)."""

    in_channels: int = 16
    out_channels: int = 16
    context_in_dim: int = 4096
    hidden_size: int = 3072
    mlp_ratio: float = 4.0
    num_heads: int = 24
    depth: int = 19
    depth_single_blocks: int = 38
    axes_dim: tuple[int, ...] = (16, 56, 56)
    theta: int = 10000
    qkv_bias: bool = True
    approximator_hidden: int = 5120
    approximator_layers: int = 5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def slots(self) -> int:
        """Modulation vectors per step: 3 per single block, 12 per double block, 2 for the end."""
        return 3 * self.depth_single_blocks + 12 * self.depth + 2


def chroma_config(shapes: Mapping[str, tuple[int, ...]]) -> ChromaConfig:
    hidden, patch_in = shapes["img_in.weight"]
    head = shapes["double_blocks.0.img_attn.norm.key_norm.scale"][0]
    count = lambda prefix: len({m.group(1) for k in shapes  # noqa: E731
                                if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))})
    return ChromaConfig(in_channels=patch_in // (PATCH * PATCH),
                        out_channels=shapes["final_layer.linear.weight"][0] // (PATCH * PATCH),
                        context_in_dim=shapes["txt_in.weight"][1], hidden_size=hidden,
                        mlp_ratio=shapes["double_blocks.0.img_mlp.0.weight"][0] / hidden, num_heads=hidden // head,
                        depth=count("double_blocks."), depth_single_blocks=count("single_blocks."),
                        axes_dim=default_axes_dim(head), qkv_bias="double_blocks.0.img_attn.qkv.bias" in shapes,
                        approximator_hidden=shapes["distilled_guidance_layer.in_proj.weight"][0],
                        approximator_layers=count("distilled_guidance_layer.layers."))


class Approximator(nn.Module):
    """in_proj, residual (RMS norm -> MLP) layers, out_proj: [B, slots, 64] -> [B, slots, D]."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int):
        super().__init__()
        self.in_proj = nn.Linear(in_dim, hidden)
        self.layers = nn.ModuleList(MLPEmbedder(hidden, hidden) for _ in range(layers))
        self.norms = nn.ModuleList(RMSNorm(hidden) for _ in range(layers))
        self.out_proj = nn.Linear(hidden, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = self.in_proj(x)
        for layer, norm in zip(self.layers, self.norms):
            x = x + layer(norm(x))
        return self.out_proj(x)


class Chroma(nn.Module):
    """x [B, C, H, W], timestep [B], context [B, T, D], guidance [B] or None (0) -> velocity."""

    # the approximator runs once per step on (slots x 64) inputs; f32 keeps the timestep signal
    # exact. The QK norms' scales stay f32 as in ``Flux``.
    keep_f32: tuple[str, ...] = ("distilled_guidance_layer", "*.norm")
    keep_f32_inputs: tuple[str, ...] = ("timestep", "guidance")

    def __init__(self, config: ChromaConfig):
        super().__init__()
        c = self.config = config
        if sum(c.axes_dim) != c.head_dim:
            raise ValueError(f"Chroma: axes_dim {c.axes_dim} must sum to the head width {c.head_dim}")
        d = c.hidden_size
        self.img_in = nn.Linear(c.in_channels * PATCH * PATCH, d)
        self.txt_in = nn.Linear(c.context_in_dim, d)
        self.distilled_guidance_layer = Approximator(APPROXIMATOR_IN, c.approximator_hidden, d, c.approximator_layers)
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(d, c.num_heads, c.mlp_hidden, c.qkv_bias, modulated=False) for _ in range(c.depth))
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(d, c.num_heads, c.mlp_hidden, modulated=False) for _ in range(c.depth_single_blocks))
        self.final_layer = LastLayer(d, c.out_channels * PATCH * PATCH, modulated=False)

    def modulations(self, timestep: Tensor, guidance: Tensor | None, dtype) -> Tensor:
        """Every slot's modulation vector: [B, slots, D]."""
        b, n = timestep.shape[0], self.config.slots
        if guidance is None:
            guidance = torch.zeros_like(timestep)
        tg = torch.cat([timestep_embedding(timestep, 16), timestep_embedding(guidance, 16)], -1)  # [B, 32]
        index = timestep_embedding(torch.arange(n, device=timestep.device, dtype=torch.float32), 32)  # [n, 32]
        vec = torch.cat([tg[:, None].expand(b, n, -1), index[None].expand(b, n, -1)], -1)  # [B, n, 64]
        return self.distilled_guidance_layer(vec.to(dtype))

    def forward(self, x: Tensor, timestep: Tensor, context: Tensor, y: Tensor | None = None,
                guidance: Tensor | None = None, ref_latents: Sequence[Tensor] = (), ref_method: str = "offset",
                txt_mask: Tensor | None = None, attn_mask: Tensor | None = None) -> Tensor:
        img, ids = embed_image_tokens(self.img_in, x, ref_latents, ref_method)
        mods = self.modulations(timestep, guidance, img.dtype)  # [B, slots, D]
        c = self.config
        single, double_img = 3 * c.depth_single_blocks, 3 * c.depth_single_blocks + 6 * c.depth

        def slot(start: int, count: int) -> tuple[Tensor, ...]:
            return tuple(mods[:, start + j:start + j + 1] for j in range(count))  # each [B, 1, D]

        def block_args(where: tuple[str, int]) -> dict:
            kind, i = where
            if kind == "single":
                return {"mods": slot(3 * i, 3)}
            return {"mods": (slot(single + 6 * i, 6), slot(double_img + 6 * i, 6))}

        last = {"mods": slot(mods.shape[1] - 2, 2)}
        return run_blocks(self, x, img, ids, self.txt_in(context), context.shape[1], block_args, last,
                          joint_mask(txt_mask, attn_mask, context.shape[1], img.shape[1]))
