"""T2I-Adapter style model (Mou et al. 2023, "T2I-Adapter", arXiv:2302.08453): a small
transformer that turns a CLIP vision tower's tokens into extra cross-attention tokens, which
``StyleModelApply`` appends to the text conditioning.

Key layout (``models/style_models/*``, e.g. ``t2iadapter_style_sd14v1``): ``style_embedding``
[1, T, W] (the learned style queries), ``ln_pre``, ``transformer_layes.N.*`` (sic; OpenAI CLIP's
residual attention blocks: ``attn.in_proj_weight`` with q, k, v stacked, ``attn.out_proj``,
``ln_1``, ``mlp.c_fc``, ``mlp.c_proj`` with QuickGELU, ``ln_2``), ``ln_post``, ``proj`` [W, D].
Width, token count, layer count and output width D come from shapes; the head count (8) is
ComfyUI's fixed value (not stored in the file).

Forward (ComfyUI ``StyleAdapter``): x = cat(vision last_hidden_state [B, N, W], style queries) ->
ln_pre -> blocks -> ln_post of the last T tokens -> @ proj -> [B, T, D].
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.models.attention import ResidualAttentionBlock
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.payloads.vision import ClipVisionOutput

__all__ = ["StyleConfig", "StyleAdapter", "StyleModelHandle", "load_style_model", "StyleModelError",
           "append_style_tokens"]

HEADS = 8


class StyleModelError(ValueError):
    pass


@dataclass(frozen=True)
class StyleConfig:
    width: int
    context_dim: int
    layers: int
    num_tokens: int
    heads: int = HEADS

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "") -> "StyleConfig":
        if "style_embedding" not in shapes or "proj" not in shapes:
            raise StyleModelError(f"{where}: not a T2I-Adapter style model (no 'style_embedding' / 'proj')")
        _, tokens, width = shapes["style_embedding"]
        layers = 0
        while f"transformer_layes.{layers}.attn.in_proj_weight" in shapes:
            layers += 1
        heads = HEADS if width % HEADS == 0 else 1
        return cls(width=int(width), context_dim=int(shapes["proj"][1]), layers=layers, num_tokens=int(tokens),
                   heads=heads)


class StyleAdapter(nn.Module):
    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: StyleConfig):
        super().__init__()
        c = config
        self.config = c
        self.style_embedding = nn.Parameter(torch.empty(1, c.num_tokens, c.width))
        self.ln_pre = nn.LayerNorm(c.width)
        self.transformer_layes = nn.Sequential(*[ResidualAttentionBlock(c.width, c.heads) for _ in range(c.layers)])
        self.ln_post = nn.LayerNorm(c.width)
        self.proj = nn.Parameter(torch.empty(c.width, c.context_dim))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, N, W] (a CLIP vision last_hidden_state) -> [B, T, D]."""
        style = self.style_embedding.to(tokens.dtype).expand(tokens.shape[0], -1, -1)  # [B, T, W]
        x = self.ln_pre(torch.cat([tokens, style], dim=1))  # [B, N + T, W]
        x = self.transformer_layes(x)
        x = self.ln_post(x[:, -self.config.num_tokens:])  # [B, T, W]
        return x @ self.proj.to(x.dtype)  # [B, T, D]


@dataclass(frozen=True)
class StyleModelHandle:
    """STYLE_MODEL: a style-adapter recipe."""

    source: WeightSource
    config: StyleConfig
    precision: PolicyLike | None = None

    def get_cond(self, vision: ClipVisionOutput, policy: PolicyLike) -> Tensor:
        """The style tokens for every image of ``vision``, flattened into one [1, B·T, D]
        conditioning sequence (ComfyUI's ``StyleModelApply``)."""
        tokens = vision.last_hidden_state
        if tokens.shape[-1] != self.config.width:
            raise StyleModelError(
                f"the style model takes {self.config.width}-wide CLIP vision tokens, the CLIP vision "
                f"output has {tokens.shape[-1]} (use the CLIP vision model it was trained with)")
        m = apply_precision(store.materialize("style_model", self.source, self.config, policy.storage, (),
                                              StyleAdapter), policy)
        device = next(m.parameters()).device
        with torch.inference_mode():
            out = m(tokens.to(device)).float().cpu()  # [B, T, D]
        return out.flatten(0, 1).unsqueeze(0)  # [1, B*T, D]

    def with_precision(self, policy: PolicyLike | None) -> "StyleModelHandle":
        return dataclasses.replace(self, precision=policy)


def load_style_model(path: str | os.PathLike) -> StyleModelHandle:
    """StyleModelLoader: T2I-Adapter style models; other style models (Flux Redux) are refused."""
    info = inspect_file(path)
    name = os.path.basename(path)
    if "redux_up.weight" in info:
        raise NotImplementedError(f"{name}: Flux Redux style models: not supported yet (mixgraph runs SD 1.x, "
                                  f"SD 2.x and SDXL)")
    shapes = {k: tuple(v.shape) for k, v in info.items()}
    return StyleModelHandle(WeightSource.from_file(path), StyleConfig.from_shapes(shapes, name))


def append_style_tokens(conds, tokens: Tensor, strength: float, strength_type: str) -> tuple:
    """StyleModelApply: each cond's text tokens [B, N, D] followed by the style tokens [1, T, D]
    (times ``strength`` for "multiply"; "attn_bias" leaves them as they are: ComfyUI's
    log(strength) attention mask is read by Flux only, never by an SD-family UNet)."""
    if strength_type not in ("multiply", "attn_bias"):
        raise ValueError(f"strength_type must be 'multiply' or 'attn_bias', got {strength_type!r}")
    if strength_type == "multiply":
        tokens = tokens * float(strength)
    out = []
    for c in conds:
        text = c.cross_attn
        if text.shape[-1] != tokens.shape[-1]:
            raise StyleModelError(f"the style model gives {tokens.shape[-1]}-wide tokens, the conditioning is "
                                  f"{text.shape[-1]} wide (a style model made for another model family)")
        extra = tokens.to(text.dtype).expand(text.shape[0], -1, -1)  # [B, T, D]
        out.append(dataclasses.replace(c, cross_attn=torch.cat([text, extra], dim=1)))  # [B, N + T, D]
    return tuple(out)
