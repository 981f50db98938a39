"""SigLIP vision tower (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training",
arXiv:2303.15343) in Hugging Face's ``SiglipVisionModel`` key layout, as ComfyUI loads it for
Flux Redux (``sigclip_vision_patch14_384``: SigLIP so400m-patch14-384).

Keys (attribute names equal them): ``vision_model.embeddings.patch_embedding.{weight,bias}``,
``vision_model.embeddings.position_embedding.weight``, ``vision_model.encoder.layers.N.
{self_attn.{q,k,v,out}_proj, layer_norm1, layer_norm2, mlp.fc1, mlp.fc2}``,
``vision_model.post_layernorm``. What tells SigLIP from a CLIP ViT in the same layout: no class
token (``class_embedding``), no ``pre_layrnorm``, a patch conv with a bias. The attention-pooling
head (``vision_model.head.*``) is not used, as in ComfyUI.

Sizes come from shapes: width, layers, MLP width, patch size, the patch grid (positions = grid²).
Not in the file, fixed as ComfyUI's ``clip_vision_siglip_384.json`` / ``_512.json`` do: 16 heads
for the real width 1152 (tiny test towers get 16-wide heads), tanh-approximated GELU, image mean
and std 0.5, and the input size: so400m-patch14-384 has 27 × 27 patches of 14 px (378 px) yet is
fed 384-px images (the stride-14 conv leaves the last 6 rows and columns unread); other grids
take grid × patch pixels (the 512 tower: 32 × 16). Layer-norm eps is ComfyUI's 1e-5 (the model
was trained with 1e-6, what transformers uses; the difference is far below bf16 resolution).

Outputs follow ComfyUI's ``ClipVisionModel.encode_image`` for ``siglip_vision_model``:
``last_hidden_state`` = post_layernorm(last layer) over all patch tokens, ``image_embeds`` the same
tensor (no projection, no pooling), ``penultimate_hidden_states`` the second-to-last layer's
output (no norm), ``all_hidden_states`` every layer's output stacked [B, L, N, W].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.clip import CLIPAttention

__all__ = ["SiglipVisionConfig", "SiglipVisionModel", "SiglipVisionError", "siglip_vision_rename",
           "is_siglip_vision", "SIGLIP_MEAN", "SIGLIP_STD"]

SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)

_P = "vision_model."
# (patch size, grid) -> input size where it is not grid × patch (ComfyUI's clip_vision_siglip_384.json)
_IMAGE_SIZE = {(14, 27): 384}


class SiglipVisionError(ValueError):
    """A file that holds no SigLIP vision tower we can read."""


def is_siglip_vision(shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """HF vision layout without a class token or pre-norm: SigLIP, not a CLIP ViT."""
    return (_P + "embeddings.patch_embedding.weight" in shapes
            and _P + "embeddings.class_embedding" not in shapes
            and _P + "pre_layrnorm.weight" not in shapes)


@dataclass(frozen=True)
class SiglipVisionConfig:
    width: int
    layers: int
    heads: int
    intermediate: int
    patch_size: int
    grid: int  # patches per side; positions = grid²
    image_size: int  # what CLIPVisionEncode resizes to
    layer_norm_eps: float = 1e-5
    num_channels: int = 3

    @property
    def num_positions(self) -> int:
        return self.grid * self.grid

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "") -> "SiglipVisionConfig":
        """From HF-layout key shapes (``vision_model.*``)."""
        try:
            patch = shapes[_P + "embeddings.patch_embedding.weight"]  # [W, C, P, P]
            positions = int(shapes[_P + "embeddings.position_embedding.weight"][0])
            fc1 = shapes[_P + "encoder.layers.0.mlp.fc1.weight"]  # [I, W]
        except KeyError as e:
            raise SiglipVisionError(f"{where or 'state dict'}: not a SigLIP vision model (no {e.args[0]!r})") from None
        width, size = int(patch[0]), int(patch[-1])
        grid = math.isqrt(positions)
        if grid * grid != positions:
            raise SiglipVisionError(f"{where}: {positions} positions is not a square patch grid (SigLIP has no "
                                    f"class token)")
        layers = 0
        while f"{_P}encoder.layers.{layers}.layer_norm1.weight" in shapes:
            layers += 1
        return cls(width=width, layers=layers, heads=16 if width >= 1024 else max(1, width // 16),
                   intermediate=int(fc1[0]), patch_size=size, grid=grid,
                   image_size=_IMAGE_SIZE.get((size, grid), grid * size), num_channels=int(patch[1]))


def siglip_vision_rename(key: str) -> str | None:
    """Keep the tower; skip the attention-pooling head (unused, as in ComfyUI), buffers and any
    text tower or logit scale a full SigLIP file holds."""
    if not key.startswith(_P) or key.startswith(_P + "head.") or key.endswith("position_ids"):
        return None
    return key


class SiglipMLP(nn.Module):
    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.intermediate)
        self.fc2 = nn.Linear(cfg.intermediate, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    """Pre-norm transformer block (CLIP's attention, SigLIP's GELU-tanh MLP)."""

    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = SiglipMLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x), None)
        return x + self.mlp(self.layer_norm2(x))


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.width, cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.num_positions, cfg.width)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [B, W, g, g] -> [B, g*g, W]
        return x + self.position_embedding.weight.to(x.dtype)


class SiglipVisionEncoder(nn.Module):
    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(cfg) for _ in range(cfg.layers))


class SiglipVisionTransformer(nn.Module):
    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(cfg)
        self.encoder = SiglipVisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)


class SiglipVisionModel(nn.Module):
    """``forward(pixels [B, 3, S, S] normalised) -> (last [B, N, W] normed, penultimate [B, N, W],
    image_embeds [B, N, W] (= last), all_hidden [B, L, N, W])``."""

    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.config = config
        self.vision_model = SiglipVisionTransformer(config)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        vm = self.vision_model
        x = embedded = vm.embeddings(pixels)
        hidden = []
        for layer in vm.encoder.layers:
            x = layer(x)
            hidden.append(x)
        last = vm.post_layernorm(x)
        stacked = torch.stack(hidden, dim=1)  # L x [B, N, W] -> [B, L, N, W]
        penultimate = hidden[-2] if len(hidden) > 1 else embedded  # transformers' hidden_states[-2]
        return last, penultimate, last, stacked
