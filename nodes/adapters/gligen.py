"""GLIGEN (Li et al. 2023, "GLIGEN: Open-Set Grounded Text-to-Image Generation",
arXiv:2301.07093): text boxes ground objects through gated self-attention layers ("fusers")
inserted in the UNet's transformer blocks between self- and cross-attention.

File layout (``models/gligen/*``, ComfyUI's ``load_gligen``): one fuser per UNet transformer,
``{input_blocks.N | middle_block | output_blocks.N}.1.transformer_blocks.0.fuser.*`` (``linear``
from the grounding width to the block width, ``attn`` (self-attention over visual + grounding
tokens), ``ff`` (GEGLU), ``norm1``/``norm2``, gates ``alpha_attn``/``alpha_dense``), in UNet
order, and ``position_net.*`` (``linears``: 3 Linear layers with SiLU between,
``null_positive_feature``, ``null_position_feature``). Heads: 8 when the grounding width is 768
(SD1.x), else 64-wide heads (ComfyUI's rule).

At sampling (``CondDenoiser``), a cond's boxes (pooled text [1, K], then h, w, y, x in latent px)
become up to 30 grounding tokens for the latent (or area) it is evaluated on: the box corners
divided by that latent's width/height, Fourier-embedded (8 frequencies, temperature 100, sin and
cos of each of x1, y1, x2, y2), concatenated with the pooled text, through ``position_net``;
padding slots use the null features. ``GligenPatch.middle(x, index)`` runs fuser ``index`` (the
n-th transformer of the UNet call) on the tokens after self-attention.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.families.sd.unet import CrossAttention, FeedForward

__all__ = ["GligenConfig", "GligenModel", "GligenHandle", "GligenBoxes", "GligenPatch", "load_gligen",
           "fourier_embed", "grounding_patch", "add_box", "MAX_OBJS"]

MAX_OBJS = 30
FOURIER_FREQS = 8
_F32 = SimpleNamespace(storage=torch.float32, compute=torch.float32, upcast_attention=False, f32_norms=False,
                       int8=False)
_FUSER = re.compile(r"^(input_blocks|middle_block|output_blocks)\.(\d+)\..*?\.fuser\.(.+)$")


@dataclass(frozen=True)
class GligenConfig:
    query_dims: tuple[int, ...]  # one fuser per UNet transformer, in UNet order
    key_dim: int                 # grounding (pooled text) width
    position_in: int
    position_out: int

    def heads(self, query_dim: int) -> tuple[int, int]:
        """(heads, dim_head), ComfyUI's rule."""
        if self.key_dim == 768:
            return 8, query_dim // 8
        return max(1, query_dim // 64), 64 if query_dim >= 64 else query_dim


class GatedSelfAttentionDense(nn.Module):
    def __init__(self, query_dim: int, key_dim: int, heads: int, dim_head: int):
        super().__init__()
        self.linear = nn.Linear(key_dim, query_dim)
        self.attn = CrossAttention(query_dim, query_dim, heads, dim_head)
        self.ff = FeedForward(query_dim)
        self.norm1 = nn.LayerNorm(query_dim)
        self.norm2 = nn.LayerNorm(query_dim)
        self.alpha_attn = nn.Parameter(torch.empty(()))
        self.alpha_dense = nn.Parameter(torch.empty(()))

    def forward(self, x: Tensor, objs: Tensor) -> Tensor:
        n_visual = x.shape[1]
        objs = self.linear(objs)  # [B, 30, K] -> [B, 30, C]
        both = self.norm1(torch.cat([x, objs], dim=1))  # [B, N + 30, C]
        x = x + torch.tanh(self.alpha_attn).to(x.dtype) * self.attn(both)[:, :n_visual]
        return x + torch.tanh(self.alpha_dense).to(x.dtype) * self.ff(self.norm2(x))


def fourier_embed(boxes: Tensor, freqs: int = FOURIER_FREQS, temperature: float = 100.0) -> Tensor:
    """[..., 4] -> [..., 8·freqs]: sin(f·b), cos(f·b) per frequency f = T^(k/freqs), in that order."""
    bands = temperature ** (torch.arange(freqs, dtype=torch.float32) / freqs)
    parts = []
    for f in bands:
        parts += [torch.sin(f * boxes), torch.cos(f * boxes)]
    return torch.cat(parts, dim=-1)


class PositionNet(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        pos_dim = FOURIER_FREQS * 2 * 4
        self.linears = nn.Sequential(nn.Linear(in_dim + pos_dim, 512), nn.SiLU(), nn.Linear(512, 512), nn.SiLU(),
                                     nn.Linear(512, out_dim))
        self.null_positive_feature = nn.Parameter(torch.empty(in_dim))
        self.null_position_feature = nn.Parameter(torch.empty(pos_dim))

    def forward(self, boxes: Tensor, masks: Tensor, embeds: Tensor) -> Tensor:
        """boxes [B, 30, 4], masks [B, 30], embeds [B, 30, K] -> grounding tokens [B, 30, out]."""
        m = masks.unsqueeze(-1).to(embeds.dtype)  # [B, 30, 1]
        xyxy = fourier_embed(boxes.float()).to(embeds.dtype)
        embeds = embeds * m + (1 - m) * self.null_positive_feature.to(embeds.dtype).view(1, 1, -1)
        xyxy = xyxy * m + (1 - m) * self.null_position_feature.to(embeds.dtype).view(1, 1, -1)
        return self.linears(torch.cat([embeds, xyxy], dim=-1))


class GligenModel(nn.Module):
    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: GligenConfig):
        super().__init__()
        self.config = config
        self.module_list = nn.ModuleList(
            GatedSelfAttentionDense(q, config.key_dim, *config.heads(q)) for q in config.query_dims)
        self.position_net = PositionNet(config.position_in, config.position_out)


@dataclass(frozen=True, eq=False)
class GligenBoxes:
    """What GLIGENTextBoxApply puts on a cond: the GLIGEN model and its boxes, each
    (pooled text [1, K], height, width, y, x) in latent pixels."""

    model: "GligenHandle"
    boxes: tuple


@dataclass(frozen=True, eq=False)
class GligenPatch:
    """A per-evaluation UNet patch (``unet_patches.py``): ``middle(x, index)`` after self-attention."""

    module: GligenModel
    objs: Tensor  # [B, 30, C]

    def middle(self, x: Tensor, index: int) -> Tensor:
        if index >= len(self.module.module_list):
            raise ValueError(f"GLIGEN: the UNet has more transformers than the GLIGEN model's "
                             f"{len(self.module.module_list)} fusers (a GLIGEN model for another UNet)")
        objs = self.objs.to(x.device, x.dtype)
        if objs.shape[0] != x.shape[0]:
            objs = objs.repeat(x.shape[0] // objs.shape[0], 1, 1)
        return self.module.module_list[index](x, objs)


def grounding_patch(gligen: GligenBoxes, module: GligenModel, batch: int, h: int, w: int) -> GligenPatch:
    """The patch for a cond evaluated on a [batch, C, h, w] latent (ComfyUI ``set_position``)."""
    key = module.config.key_dim
    boxes = torch.zeros(MAX_OBJS, 4)
    masks = torch.zeros(MAX_OBJS)
    embeds = torch.zeros(MAX_OBJS, key)
    if len(gligen.boxes) > MAX_OBJS:
        raise ValueError(f"GLIGEN takes at most {MAX_OBJS} boxes per cond, got {len(gligen.boxes)}")
    for i, (pooled, bh, bw, by, bx) in enumerate(gligen.boxes):
        if pooled.shape[-1] != key:
            raise ValueError(f"GLIGEN: the model grounds {key}-wide text embeddings, the CLIP gives "
                             f"{pooled.shape[-1]} (use the text encoder of an SD1.x model)")
        boxes[i] = torch.tensor((bx / w, by / h, (bx + bw) / w, (by + bh) / h))
        masks[i] = 1.0
        embeds[i] = pooled.reshape(-1).float()
    p = next(module.parameters())
    with torch.inference_mode():
        objs = module.position_net(boxes[None].to(p.device), masks[None].to(p.device),
                                   embeds[None].to(p.device, torch.float32))  # [1, 30, C]
    return GligenPatch(module, objs.expand(batch, -1, -1))


@dataclass(frozen=True)
class GligenHandle:
    """GLIGEN: a grounding-model recipe."""

    source: WeightSource
    config: GligenConfig
    precision: PolicyLike | None = None

    def runner(self, policy: PolicyLike | None = None) -> GligenModel:
        policy = policy or _F32
        keys = _stored_keys(self.source)
        m = store.materialize("gligen", self.source, self.config, policy.storage, (), GligenModel,
                              _renamer(keys))
        return apply_precision(m, policy)

    def with_precision(self, policy: PolicyLike | None) -> "GligenHandle":
        return dataclasses.replace(self, precision=policy)


def _stored_keys(source: WeightSource) -> list[str]:
    names = inspect_file(source.path) if source.path is not None else (source.tensors or {})
    return [k for k in names if k.startswith(source.prefix)]


def _fuser_order(keys) -> list[tuple[str, int]]:
    order = {"input_blocks": 0, "middle_block": 1, "output_blocks": 2}
    blocks = {(m.group(1), int(m.group(2))) for k in keys if (m := _FUSER.match(k))}
    return sorted(blocks, key=lambda b: (order[b[0]], b[1]))


def _renamer(keys):
    index = {b: i for i, b in enumerate(_fuser_order(keys))}

    def rename(key: str) -> str | None:
        if key.startswith("position_net."):
            return key
        m = _FUSER.match(key)
        if m is None:
            return None
        return f"module_list.{index[(m.group(1), int(m.group(2)))]}.{m.group(3)}"

    return rename


def load_gligen(path: str | os.PathLike) -> GligenHandle:
    """GLIGENLoader: sizes from the header (fuser widths, grounding width, position net)."""
    info = inspect_file(path)
    name = os.path.basename(path)
    order = _fuser_order(info)
    if not order or "position_net.null_positive_feature" not in info:
        raise ValueError(f"{name}: not a GLIGEN model (no '*.fuser.*' / 'position_net.*' keys)")
    rename = _renamer(info)
    shapes = {rename(k): tuple(v.shape) for k, v in info.items() if rename(k) is not None}
    n = len(order)
    query = tuple(shapes[f"module_list.{i}.linear.weight"][0] for i in range(n))
    key_dim = shapes[f"module_list.{n - 1}.linear.weight"][1]
    cfg = GligenConfig(query_dims=query, key_dim=key_dim,
                       position_in=shapes["position_net.null_positive_feature"][0],
                       position_out=shapes["position_net.linears.4.weight"][0])
    return GligenHandle(WeightSource.from_file(path), cfg)


def add_box(conds, model: GligenHandle, pooled: Tensor | None, width: int, height: int, x: int, y: int) -> tuple:
    """GLIGENTextBoxApply: each cond gets the box (pixels ÷ 8, floor: latent pixels) with the
    pooled text, after the boxes it already has for the same model (ComfyUI keeps the earlier
    boxes of a cond's GLIGEN entry and sets its model to this one)."""
    if pooled is None:
        raise ValueError("GLIGENTextBoxApply: the CLIP gives no pooled text embedding")
    box = (pooled.float(), int(height) // 8, int(width) // 8, int(y) // 8, int(x) // 8)
    out = []
    for c in conds:
        prev = c.gligen.boxes if c.gligen is not None else ()
        out.append(dataclasses.replace(c, gligen=GligenBoxes(model, prev + (box,))))
    return tuple(out)
