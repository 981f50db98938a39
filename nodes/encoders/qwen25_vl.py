"""Qwen2.5-VL as a text encoder (Bai et al. 2025, "Qwen2.5-VL Technical Report", arXiv:2502.13923):
Qwen-Image's ``qwen_2.5_vl_7b(_fp8_scaled).safetensors`` (ComfyUI's ``Qwen25_7BVLI``,
``comfy/text_encoders/llama.py``, ``qwen_vl.py``).

Attribute names equal the file's keys: the language model under ``model.`` (``embed_tokens``,
``layers.N.self_attn.{q,k,v,o}_proj``, ``norm``) and the vision tower under ``visual.``
(``patch_embed.proj``, ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.*}``, ``merger.ln_q``,
``merger.mlp.{0,2}``). A ``lm_head.weight`` is not used.

The language model is a Qwen2 decoder: pre-norm attention with biased q/k/v, no q/k norms,
grouped-query heads, SiLU-gated MLP, RMS norms (eps 1e-6). Sizes come from shapes; head_dim is the
family's constant 128 (shapes give only heads * head_dim), RoPE theta 1e6. Positions are M-RoPE
(``mrope_section`` (16, 24, 24) of head_dim / 2 frequency pairs take the temporal, height and
width position): a text token has one position on all three axes, which is plain RoPE; the
tokens of an image take (start, start + row, start + column) and the text after it resumes at
``start + max(rows, columns)`` (ComfyUI's ``Qwen25_7BVLI.forward``, transformers'
``get_rope_index``).

The vision tower is ``qwen25_vl_vision.VisionTower``; an image's tokens replace its one
``<|image_pad|>`` token in the prompt (``ImageEmbed`` items of a token row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.encoders.decoder_llm import (DecoderShape, DecoderTextEncoder, PreNormBlock, PreNormDecoder,
                                                 causal_padding_mask, padding_mask, resolve_layer, shape_from)
from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule
from mixgraph.nodes.encoders.qwen25_vl_vision import VisionConfig, VisionTower, preprocess_image, vision_config

__all__ = ["Qwen25VLConfig", "Qwen25VLTextModel", "ImageEmbed", "is_qwen25", "qwen25_vl_config",
           "mrope_positions", "mrope_cos_sin", "HEAD_DIM"]

HEAD_DIM = 128  # every Qwen2.5 language model


@dataclass(frozen=True)
class Qwen25VLConfig:
    shape: DecoderShape
    vision: VisionConfig | None = None
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6
    mrope_section: tuple[int, int, int] = (16, 24, 24)


def is_qwen25(keys, prefix: str = "") -> bool:
    """A Qwen2 / Qwen2.5 decoder: biased q/k/v projections and no q/k norms (Qwen3 has them) nor
    Gemma's feed-forward norms (ComfyUI's ``detect_te_model``: the ``k_proj.bias``)."""
    p = prefix + "model.layers.0."
    return (p + "self_attn.k_proj.bias" in keys and p + "self_attn.q_norm.weight" not in keys
            and p + "post_feedforward_layernorm.weight" not in keys and prefix + "model.embed_tokens.weight" in keys)


def qwen25_vl_config(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> Qwen25VLConfig:
    """The config from key -> shape (language model under ``model.``, vision tower under ``visual.``)."""
    shape = shape_from(shapes, prefix, HEAD_DIM)
    return Qwen25VLConfig(shape, vision_config(shapes, prefix + "visual."))


# --------------------------------------------------------------------------------------------
# the language model


def mrope_cos_sin(positions: Tensor, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """positions [N, 3, T] (temporal, height, width) -> cos, sin [N, 1, T, head_dim] (float32):
    frequency pair i takes the axis its ``section`` slice names, in both halves of head_dim."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [N, 3, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, 3, T, hd]
    pieces = emb.split(list(section) * 2, dim=-1)
    picked = torch.cat([piece[:, i % 3] for i, piece in enumerate(pieces)], dim=-1)  # [N, T, hd]
    return picked.cos()[:, None], picked.sin()[:, None]


def mrope_positions(length: int, images: Sequence[tuple[int, int, int]]) -> Tensor:
    """[3, length] M-RoPE positions of a row whose images sit at (start index, merged rows,
    merged columns), in order (ComfyUI's ``Qwen25_7BVLI.forward``)."""
    pos = torch.arange(length).expand(3, length).clone()  # [3, T]
    offset = 0  # position minus index, after the images so far
    for start, rows, cols in images:
        end = start + rows * cols
        base = start + offset
        pos[0, start:end] = base
        pos[1, start:end] = base + torch.arange(rows).repeat_interleave(cols)
        pos[2, start:end] = base + torch.arange(cols).repeat(rows)
        offset += max(rows, cols) - (end - start)
        pos[:, end:] = torch.arange(end, length) + offset
    return pos


def Qwen25Inner(cfg: Qwen25VLConfig) -> PreNormDecoder:
    """The file's ``model.`` part."""
    return PreNormDecoder(cfg.shape, cfg.eps, lambda i: PreNormBlock(cfg.shape, cfg.eps, cfg.rope_theta, qkv_bias=True))


@dataclass(frozen=True, eq=False)
class ImageEmbed:
    """An image in a token row (it replaces one ``<|image_pad|>``): pixels [N, H, W, 3] in 0..1;
    the vision tower reads the first (ComfyUI's ``process_qwen2vl_images``)."""

    pixels: Tensor


class Qwen25VLTextModel(DecoderTextEncoder):
    """``forward(embeds [N, T, D], mask [N, T], layer, positions [N, 3, T] | None) -> hidden``:
    decoder layer ``layer``'s output (0-based, unnormed) or the normed last layer for None;
    ``encode_chunks`` also takes ``ImageEmbed`` items, each becoming the vision tower's tokens."""

    keep_f32: tuple[str, ...] = ("model.norm", "model.layers.*.input_layernorm",
                                 "model.layers.*.post_attention_layernorm", "visual.blocks.*.norm1",
                                 "visual.blocks.*.norm2", "visual.merger.ln_q")
    keep_stored: tuple[str, ...] = ("model.embed_tokens",)

    def __init__(self, config: Qwen25VLConfig) -> None:
        super().__init__(config, Qwen25Inner)
        self.visual = None if config.vision is None else VisionTower(config.vision)

    def forward(self, embeds: Tensor, mask: Tensor, layer: int | None = None,
                positions: Tensor | None = None) -> Tensor:
        x = embeds
        n, t = x.shape[:2]
        if positions is None:
            positions = torch.arange(t, device=x.device).expand(n, 3, t)
        cos, sin = mrope_cos_sin(positions.to(x.device), self.config.shape.head_dim, self.config.rope_theta,
                                 self.config.mrope_section)
        attn_mask = causal_padding_mask(mask, x.dtype)
        for i, block in enumerate(self.model.layers):
            x = block(x, attn_mask, cos, sin)
            if i == layer:
                return x
        return self.model.norm(x)

    def image_tokens(self, image: ImageEmbed) -> tuple[Tensor, int, int]:
        """The image's tokens [n, D] (float32) and its merged (rows, columns)."""
        if self.visual is None:
            raise ValueError("this Qwen2.5-VL text-encoder file has no vision tower (no 'visual.*' weights); "
                             "an image prompt needs the full qwen_2.5_vl_7b file")
        v = self.config.vision
        patches, grid = preprocess_image(image.pixels, v)
        tokens = self.visual(patches.to(self.visual.patch_embed.proj.weight.device), grid)
        return tokens.float(), grid[1] // v.merge, grid[2] // v.merge

    def encode_chunks(self, chunks: list, rule: OutputRule, layer_idx: int | None,
                      warn: Callable[[str], None]) -> EncodedText:
        """chunks of (token | embedding vector [D] | ImageEmbed, weight) -> ``EncodedText``; a row
        with images runs alone in M-RoPE positions (ComfyUI's ``process_tokens`` with the
        ``preprocess_embed`` of its images)."""
        if not any(isinstance(t, ImageEmbed) for c in chunks for t, _ in c):
            out = super().encode_chunks(chunks, rule, layer_idx, warn)
            return EncodedText(out.hidden, out.pooled, out.mask, tokens=_ids(chunks))
        if len(chunks) != 1 or any(w != 1.0 for _, w in chunks[0]):
            raise NotImplementedError("a Qwen2.5-VL prompt with images in more than one chunk or with token "
                                      "weights: not supported yet")
        row = self._fit_row([t for t, _ in chunks[0]], rule.pad_token, warn)
        ids = torch.tensor([[t if isinstance(t, int) else rule.pad_token for t in row]])  # [1, T]
        mask = padding_mask([t if isinstance(t, int) else -1 for t in row], rule.pad_token)
        with torch.no_grad():
            embeds = self.embed(ids).float()[0]  # [T, D]
            pieces, keep, images, at = [], [], [], 0
            for j, t in enumerate(row):
                if isinstance(t, ImageEmbed):
                    tokens, rows, cols = self.image_tokens(t)
                    images.append((at, rows, cols))
                    pieces.append(tokens)
                    keep += [1] * tokens.shape[0]
                    at += tokens.shape[0]
                else:
                    pieces.append((t.float() if isinstance(t, Tensor) else embeds[j])[None])
                    keep.append(mask[j])
                    at += 1
            x = torch.cat(pieces)[None]  # [1, T', D]
            m = torch.tensor([keep])  # [1, T']
            layer = resolve_layer(layer_idx, rule, self.n_layers)
            pos = mrope_positions(x.shape[1], images)[None]  # [1, 3, T']
            hidden = self(x.to(embeds.dtype), m, layer, pos).float()
        return EncodedText(hidden=hidden.clone(), pooled=None, mask=m.clone(), tokens=_ids(chunks))


def _ids(chunks: list) -> tuple:
    """The first chunk's items as given (token ids; an image or a vector as itself), for a join
    that cuts by token (Qwen-Image drops its template's tokens)."""
    return tuple(t for t, _ in chunks[0]) if chunks else ()
