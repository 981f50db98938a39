"""PhotoMaker v1 ID encoder (Li et al. 2023, "PhotoMaker: Customizing Realistic Human Photos via
Stacked ID Embedding", arXiv:2312.04461) for SDXL, as ComfyUI's ``comfy_extras/nodes_photomaker.py``
(read at comfyanonymous/ComfyUI 86a04ac6d9aa7396d07a58512f603e9a36a5e1bf) runs it.

Key layout (``models/photomaker/*``, e.g. ``photomaker-v1.bin``: a pickle holding
``{"id_encoder": {...}, "lora_weights": {...}}``; the loader reads ``id_encoder`` only, as
ComfyUI): a CLIP ViT-L/14 vision tower in Hugging Face layout (``vision_model.*``,
``visual_projection.weight`` [768, 1024]), ``visual_projection_2.weight`` [1280, 1024] (no bias)
and ``fuse_module.*``: ``mlp1`` and ``mlp2`` (each ``layernorm``, ``fc1``, ``fc2``) and
``layer_norm``. A safetensors file with ``id_encoder.``-prefixed keys, or the id encoder's keys
at the top level, loads too. Every size comes from the shapes; the vision tower uses QuickGELU and
16 heads (ComfyUI's fixed ``VISION_CONFIG_DICT``; tiny test towers get 16-wide heads).

Forward (ComfyUI ``PhotoMakerIDEncoder`` / ``FuseModule``), for one image and one class token:
    pooled = post_layernorm(class token of the vision tower's last layer)      [W]
    id     = cat(visual_projection(pooled), visual_projection_2(pooled))       [D] (768 + 1280)
    MLP(x) = fc2(GELU(fc1(LayerNorm(x)))) (+ x for mlp2, which has a residual)
    fused  = layer_norm(mlp2(mlp1(cat(prompt, id)) + prompt))                   [D]
where ``prompt`` is the class word's text embedding (the cond token it replaces).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.encoders.clip_vision import CLIPVisionConfig, CLIPVisionModel, clip_preprocess
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file

__all__ = ["PhotoMakerConfig", "PhotoMakerIDEncoder", "PhotoMakerHandle", "PhotoMakerError", "load_photomaker",
           "TRIGGER_WORD", "trigger_word_index", "drop_word"]

TRIGGER_WORD = "photomaker"
PREFIX = "id_encoder."

_REQUIRED = ("vision_model.embeddings.patch_embedding.weight", "visual_projection.weight",
             "visual_projection_2.weight", "fuse_module.mlp1.fc1.weight", "fuse_module.mlp1.fc2.weight",
             "fuse_module.mlp2.fc1.weight", "fuse_module.mlp2.fc2.weight", "fuse_module.layer_norm.weight")


class PhotoMakerError(ValueError):
    """A file that holds no PhotoMaker ID encoder, or an input PhotoMakerEncode cannot use."""


@dataclass(frozen=True)
class PhotoMakerConfig:
    vision: CLIPVisionConfig
    proj2: int  # visual_projection_2 width (1280)
    embed_dim: int  # the fuse width: the SDXL cond width (2048)
    mlp1_hidden: int
    mlp2_hidden: int

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str) -> "PhotoMakerConfig":
        missing = [k for k in _REQUIRED if k not in shapes]
        if missing:
            raise PhotoMakerError(f"{where}: not a PhotoMaker ID encoder: no {missing[0]!r} (a PhotoMaker v1 file "
                                  f"holds id_encoder.vision_model.*, visual_projection_2 and fuse_module.*; "
                                  f"{len(shapes)} tensors, e.g. {sorted(shapes)[:4]})")
        vision = dataclasses.replace(CLIPVisionConfig.from_shapes(shapes, where), activation="quick_gelu")
        embed = int(shapes["fuse_module.layer_norm.weight"][0])
        proj1, proj2 = int(shapes["visual_projection.weight"][0]), int(shapes["visual_projection_2.weight"][0])
        if proj1 + proj2 != embed or shapes["fuse_module.mlp1.fc1.weight"][1] != 2 * embed:
            raise PhotoMakerError(f"{where}: inconsistent PhotoMaker sizes: projections {proj1} + {proj2}, fuse width "
                                  f"{embed}, mlp1 input {shapes['fuse_module.mlp1.fc1.weight'][1]} (expected "
                                  f"{proj1} + {proj2} = {embed} and 2 x {embed})")
        return cls(vision=vision, proj2=proj2, embed_dim=embed,
                   mlp1_hidden=int(shapes["fuse_module.mlp1.fc1.weight"][0]),
                   mlp2_hidden=int(shapes["fuse_module.mlp2.fc1.weight"][0]))


class MLP(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, hidden: int, residual: bool):
        super().__init__()
        self.residual = residual
        self.layernorm = nn.LayerNorm(dim_in)
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc2(nn.functional.gelu(self.fc1(self.layernorm(x))))
        return y + x if self.residual else y


class FuseModule(nn.Module):
    def __init__(self, c: PhotoMakerConfig):
        super().__init__()
        d = c.embed_dim
        self.mlp1 = MLP(2 * d, d, c.mlp1_hidden, residual=False)
        self.mlp2 = MLP(d, d, c.mlp2_hidden, residual=True)
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, prompt: Tensor, ids: Tensor) -> Tensor:
        """prompt [N, D], ids [N, D] -> fused [N, D]."""
        x = self.mlp1(torch.cat([prompt, ids], dim=-1)) + prompt
        return self.layer_norm(self.mlp2(x))


class PhotoMakerIDEncoder(CLIPVisionModel):
    """``forward(pixels [B, 3, S, S], prompt [B, D]) -> fused [B, D]``: image b fused into prompt b."""

    def __init__(self, config: PhotoMakerConfig):
        super().__init__(config.vision)
        self.photomaker = config
        self.visual_projection_2 = nn.Linear(config.vision.width, config.proj2, bias=False)
        self.fuse_module = FuseModule(config)

    def id_embeds(self, pixels: Tensor) -> Tensor:
        last, _penultimate, proj1 = super().forward(pixels)
        pooled = self.vision_model.post_layernorm(last[:, 0])  # [B, W]
        return torch.cat([proj1, self.visual_projection_2(pooled)], dim=-1)  # [B, D]

    def forward(self, pixels: Tensor, prompt: Tensor) -> Tensor:  # type: ignore[override]
        ids = self.id_embeds(pixels)
        return self.fuse_module(prompt.to(ids.dtype), ids)


def _rename(key: str) -> str | None:
    if key.endswith("position_ids"):
        return None
    if key.startswith(("vision_model.", "visual_projection.", "visual_projection_2.", "fuse_module.")):
        return key
    return None


@dataclass(frozen=True)
class PhotoMakerHandle:
    """PHOTOMAKER: an ID-encoder recipe (weights are read on use, in the policy's dtype)."""

    source: WeightSource
    config: PhotoMakerConfig
    precision: PolicyLike | None = None

    def module(self, policy: PolicyLike) -> PhotoMakerIDEncoder:
        m = store.materialize("photomaker", self.source, self.config, policy.storage, (), PhotoMakerIDEncoder,
                              rename=_rename)
        return apply_precision(m, policy)

    def fuse(self, image: Tensor, prompt: Tensor, policy: PolicyLike) -> Tensor:
        """IMAGE [B, H, W, C] (ComfyUI's clip_preprocess: short side to the tower's size, centre
        crop) and the class token's embedding prompt [D] -> the fused token [D] (float32, CPU).
        Only the first image counts: ComfyUI fuses one ID image per class token (its
        ``num_id_images = 1``; the other images of the batch are masked out)."""
        if prompt.shape[-1] != self.config.embed_dim:
            raise PhotoMakerError(f"the PhotoMaker model fuses {self.config.embed_dim}-wide text tokens, the CLIP "
                                  f"gives {prompt.shape[-1]} (PhotoMaker v1 is made for SDXL's 2048-wide "
                                  f"conditioning)")
        m = self.module(policy)
        device = next(m.parameters()).device
        pixels = clip_preprocess(image[:1], self.config.vision.image_size, crop=True).to(device)  # [1, 3, S, S]
        with torch.inference_mode():
            out = m(pixels, prompt.reshape(1, -1).float().to(device))
        return out[0].float().cpu()

    def with_precision(self, policy: PolicyLike | None) -> "PhotoMakerHandle":
        return dataclasses.replace(self, precision=policy)


def load_photomaker(path: str | os.PathLike) -> PhotoMakerHandle:
    """PhotoMakerLoader: the ``id_encoder`` of a PhotoMaker v1 file (pickle or safetensors)."""
    info = inspect_file(path)
    name = os.path.basename(path)
    prefix = PREFIX if any(k.startswith(PREFIX) for k in info) else ""
    shapes = {k[len(prefix):]: tuple(v.shape) for k, v in info.items() if k.startswith(prefix)}
    if any(k.startswith("qformer_perceiver.") for k in shapes):
        raise NotImplementedError(f"{name}: PhotoMaker v2 (with the Q-Former ID encoder and InsightFace "
                                  f"embeddings): not supported yet (ComfyUI's PhotoMakerLoader reads v1 only)")
    return PhotoMakerHandle(WeightSource.from_file(path, prefix), PhotoMakerConfig.from_shapes(shapes, name))


# --- the text side of PhotoMakerEncode -------------------------------------------------------

def trigger_word_index(text: str) -> int:
    """ComfyUI's word index of the trigger: its position among ``text.split(" ")`` plus 1, or -1
    when no space-separated word equals "photomaker" exactly ("photomaker," does not count)."""
    words = text.split(" ")
    return words.index(TRIGGER_WORD) + 1 if TRIGGER_WORD in words else -1


def drop_word(tokenized: Mapping[str, list[list[tuple]]], word_id: int) -> dict[str, list[list[tuple]]]:
    """Remove every token whose tokenizer word id is ``word_id`` from each chunk, refilling the
    chunk to its length with copies of its last entry (ComfyUI's PhotoMakerEncode). Note the
    ids are the tokenizer's words (pieces between ``embedding:`` markers within a weight
    segment), not the space-split words of ``trigger_word_index``: as in ComfyUI, they agree only
    for particular prompts, so the trigger word's tokens often stay in the prompt."""
    out: dict[str, list[list[tuple]]] = {}
    for name, chunks in tokenized.items():
        out[name] = []
        for chunk in chunks:
            kept = [t for t in chunk if t[2] != word_id]
            kept += [chunk[-1]] * (len(chunk) - len(kept))
            out[name].append(kept)
    return out

