"""CLIP vision tower (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision"; ViT: Dosovitskiy et al. 2020, arXiv:2010.11929) with Hugging Face's
``CLIPVisionModelWithProjection`` key layout, and ComfyUI's ``CLIPVisionEncode`` preprocessing.

Attribute names equal the HF keys (``vision_model.embeddings.patch_embedding.weight``,
``vision_model.pre_layrnorm.*`` (sic), ``vision_model.encoder.layers.N.*``,
``vision_model.post_layernorm.*``, ``visual_projection.weight``), the layout of the files in
``models/clip_vision`` (OpenAI ViT-L/14, OpenCLIP ViT-H/14 and ViT-bigG/14 re-saved by HF).
OpenCLIP's own layout (``visual.*`` in a clip_vision file, ``embedder.model.visual.*`` in an SD2.1
unCLIP checkpoint) is converted by ``open_clip_vision_to_hf``.

Sizes come from tensor shapes: width, layers, MLP width, patch size, image size (from the number
of positions: (size / patch)² + 1), projection width. Two numbers are not in the file; ComfyUI
fixes them per model (its ``clip_vision_config_*.json``) and so do we, by width: heads are 16 for
the real towers (ViT-L 1024, ViT-H 1280, bigG 1664; tiny test towers get 16-wide heads), and the
activation is QuickGELU for OpenAI's ViT-L (width 1024) and GELU for the OpenCLIP towers.

Outputs follow ComfyUI's ``ClipVisionModel.encode_image``: ``last_hidden_state`` is the last
layer's output (no final norm), ``penultimate_hidden_states`` the second-to-last layer's output,
``image_embeds`` = visual_projection(post_layernorm(class token of the last layer)).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.clip import CLIPEncoderLayer

__all__ = ["CLIPVisionConfig", "CLIPVisionModel", "clip_preprocess", "open_clip_vision_to_hf", "hf_vision_rename",
           "open_clip_vision_shapes", "CLIP_MEAN", "CLIP_STD", "ClipVisionError"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ClipVisionError(ValueError):
    """A file that holds no CLIP vision tower we can read."""


@dataclass(frozen=True)
class CLIPVisionConfig:
    width: int
    layers: int
    heads: int
    intermediate: int
    patch_size: int
    image_size: int
    projection_dim: int | None
    activation: str  # "quick_gelu" | "gelu"
    layer_norm_eps: float = 1e-5
    num_channels: int = 3

    @property
    def num_positions(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "") -> "CLIPVisionConfig":
        """From HF-layout key shapes (``vision_model.*``)."""
        p = "vision_model."
        try:
            patch = shapes[p + "embeddings.patch_embedding.weight"]  # [W, 3, P, P]
            positions = shapes[p + "embeddings.position_embedding.weight"][0]
            fc1 = shapes[p + "encoder.layers.0.mlp.fc1.weight"]
        except KeyError as e:
            raise ClipVisionError(f"{where or 'state dict'}: not a CLIP vision model (no {e.args[0]!r})") from None
        width = int(patch[0])
        grid = math.isqrt(int(positions) - 1)
        if grid * grid != positions - 1:
            raise ClipVisionError(f"{where}: {positions} positions is not a square patch grid plus the class token")
        layers = 0
        while f"{p}encoder.layers.{layers}.layer_norm1.weight" in shapes:
            layers += 1
        proj = shapes.get("visual_projection.weight")
        return cls(width=width, layers=layers, heads=16 if width >= 1024 else max(1, width // 16),
                   intermediate=int(fc1[0]), patch_size=int(patch[-1]), image_size=grid * int(patch[-1]),
                   projection_dim=None if proj is None else int(proj[0]),
                   activation="quick_gelu" if width == 1024 else "gelu", num_channels=int(patch[1]))


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, cfg: CLIPVisionConfig):
        super().__init__()
        self.class_embedding = nn.Parameter(torch.empty(cfg.width))
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.width, cfg.patch_size, stride=cfg.patch_size, bias=False)
        self.position_embedding = nn.Embedding(cfg.num_positions, cfg.width)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [B, W, g, g] -> [B, g*g, W]
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)  # [B, 1, W]
        x = torch.cat([cls, x], dim=1)  # [B, 1 + g*g, W]
        return x + self.position_embedding.weight.to(x.dtype)


class CLIPVisionEncoder(nn.Module):
    def __init__(self, cfg: CLIPVisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(cfg) for _ in range(cfg.layers))


class CLIPVisionTransformer(nn.Module):
    def __init__(self, cfg: CLIPVisionConfig):
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.encoder = CLIPVisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)


class CLIPVisionModel(nn.Module):
    """``forward(pixels [B, 3, S, S] normalised) -> (last [B, N, W], penultimate [B, N, W],
    image_embeds [B, P])``."""

    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: CLIPVisionConfig):
        super().__init__()
        self.config = config
        self.vision_model = CLIPVisionTransformer(config)
        self.visual_projection = (nn.Linear(config.width, config.projection_dim, bias=False)
                                  if config.projection_dim else None)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        vm = self.vision_model
        x = vm.pre_layrnorm(vm.embeddings(pixels))
        penultimate = x
        n = len(vm.encoder.layers)
        for i, layer in enumerate(vm.encoder.layers):
            x = layer(x, None)
            if i == n - 2:
                penultimate = x
        pooled = vm.post_layernorm(x[:, 0])  # [B, W] the class token
        embeds = self.visual_projection(pooled) if self.visual_projection is not None else pooled
        return x, penultimate, embeds


def clip_preprocess(image: Tensor, size: int, crop: bool = True, mean: tuple[float, ...] = CLIP_MEAN,
                    std: tuple[float, ...] = CLIP_STD) -> Tensor:
    """IMAGE [B, H, W, C] in 0..1 -> normalised pixels [B, 3, size, size] (ComfyUI
    ``clip_preprocess``): crop=True scales the short side to ``size`` (bicubic, antialiased) and
    cuts the centre; crop=False stretches to size × size. Values are quantised to 8 bits, then
    normalised with the tower's mean and std (CLIP's by default; SigLIP's are 0.5)."""
    x = image[..., :3].movedim(-1, 1).float()  # [B, 3, H, W]
    h, w = x.shape[-2:]
    if (h, w) != (size, size):
        if crop:
            scale = size / min(h, w)
            target = (round(scale * h), round(scale * w))
        else:
            target = (size, size)
        x = F.interpolate(x, size=target, mode="bicubic", antialias=True)
        top, left = (x.shape[2] - size) // 2, (x.shape[3] - size) // 2
        x = x[:, :, top:top + size, left:left + size]
    x = torch.clamp(255.0 * x, 0, 255).round() / 255.0
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - m) / s


# --- layouts ------------------------------------------------------------------------------------

_OC_TOP = {
    "class_embedding": "vision_model.embeddings.class_embedding",
    "conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "ln_post.weight": "vision_model.post_layernorm.weight",
    "ln_post.bias": "vision_model.post_layernorm.bias",
}
_OC_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
             "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
_OC_RE = re.compile(r"transformer\.resblocks\.(\d+)\.(.+)\.(weight|bias)$")
_OC_IN_RE = re.compile(r"transformer\.resblocks\.(\d+)\.attn\.in_proj_(weight|bias)$")


def open_clip_vision_to_hf(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """OpenCLIP ``visual.*`` keys (prefix stripped) -> HF keys. ``attn.in_proj_*`` stacks q, k, v
    on dim 0; ``proj`` is [W, P] used as x @ proj, so the HF Linear weight is its transpose."""
    out: dict[str, Tensor] = {}
    unknown = []
    for k, v in sd.items():
        if k in _OC_TOP:
            out[_OC_TOP[k]] = v
        elif k == "proj":
            out["visual_projection.weight"] = v.t().contiguous()  # [W, P] -> [P, W]
        elif m := _OC_IN_RE.match(k):
            n, kind = m.groups()
            q, kk, vv = v.chunk(3, dim=0)  # [3W, ...] -> 3 x [W, ...]
            dst = f"vision_model.encoder.layers.{n}.self_attn."
            out[dst + f"q_proj.{kind}"], out[dst + f"k_proj.{kind}"] = q.contiguous(), kk.contiguous()
            out[dst + f"v_proj.{kind}"] = vv.contiguous()
        elif (m := _OC_RE.match(k)) and m.group(2) in _OC_BLOCK:
            n, name, kind = m.groups()
            out[f"vision_model.encoder.layers.{n}.{_OC_BLOCK[name]}.{kind}"] = v
        else:
            unknown.append(k)
    if unknown:
        raise ClipVisionError(f"unrecognised OpenCLIP vision keys: {unknown[:8]}")
    return out


def hf_vision_rename(key: str) -> str | None:
    """HF layout: keep the vision tower and projection, skip buffers and anything else."""
    if key.startswith("vision_model.") and not key.endswith("position_ids"):
        return key
    return key if key == "visual_projection.weight" else None


def open_clip_vision_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    fake = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    return {k: tuple(v.shape) for k, v in open_clip_vision_to_hf(fake).items()}
