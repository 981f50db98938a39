"""What ComfyUI's Qwen-Image Edit nodes do (``comfy_extras/nodes_qwen.py``): scale an image to a
pixel area, tokenize a prompt with images for the text encoders that see them (the "qwen_image"
tokenizer: ``<|image_pad|>`` items that the Qwen2.5-VL vision tower turns into tokens) and encode.

Sizes as ComfyUI's: ``scale_by = sqrt(total / (W * H))``; TextEncodeQwenImageEdit rounds
``W * scale_by`` (about 1M pixels, 1024 x 1024) and gives that image to both the text encoder and
the VAE; TextEncodeQwenImageEditPlus gives the text encoder a 384 x 384-area image and the VAE one of
about 1M pixels rounded to multiples of 8. All resizes are ComfyUI's ``common_upscale`` "area"
without a crop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from mixgraph.nodes.encoders.encoder_set import get_tokenizer
from mixgraph.nodes.models.resize import upscale

__all__ = ["EDIT_AREA", "VISION_AREA", "scale_to_area", "encode_with_images"]

EDIT_AREA = 1024 * 1024  # the reference latent's pixel area
VISION_AREA = 384 * 384  # TextEncodeQwenImageEditPlus's vision-tower input area


def scale_to_area(image: Tensor, total: int, multiple: int | None = None) -> Tensor:
    """IMAGE [N, H, W, C] scaled ("area") to about `total` pixels at its aspect ratio; with
    `multiple`, each side rounded to a multiple of it (ComfyUI: ``round(W * s / 8.0) * 8``)."""
    h, w = image.shape[1], image.shape[2]
    s = math.sqrt(total / (w * h))
    if multiple is None:
        width, height = round(w * s), round(h * s)
    else:
        width, height = round(w * s / multiple) * multiple, round(h * s / multiple) * multiple
    return upscale(image.movedim(-1, 1), width, height, "area", "disabled").movedim(1, -1)


def _length_options(rule: Any) -> dict[str, int]:
    return {k: v for k, v in (("min_length", getattr(rule, "min_length", None)),
                              ("min_padding", getattr(rule, "min_padding", None))) if v is not None}


def encode_with_images(clip: Any, text: str, images: Sequence[Tensor], policy: Any, *,
                       policies: Mapping[str, Any] | None = None, embedding_lookup=None,
                       warn: Callable[[str], None] | None = None, llama_template: str | None = None) -> tuple:
    """ComfyUI's ``clip.tokenize(text, images=..., llama_template=...)`` then
    ``encode_from_tokens_scheduled``: each encoder whose tokenizer takes images (``accepts_images``)
    gets them and the template; the others tokenize the text alone (ComfyUI's other tokenizers
    ignore both). Without images or a template this is CLIPTextEncode's ``clip.encode``."""
    if not images and llama_template is None:
        return clip.encode(text, policy, policies=policies, embedding_lookup=embedding_lookup, warn=warn)
    if clip.hooks is not None:
        raise NotImplementedError("Qwen-Image Edit encoding with a CLIP that has hooks (SetClipHooks): "
                                  "not supported yet")
    tokenized, seen = {}, False
    for e in clip.encoders:
        tok = get_tokenizer(e.tokenizer)
        extra = {}
        if getattr(tok, "accepts_images", False):
            extra, seen = {"images": list(images), "llama_template": llama_template}, True
        tokenized[e.name] = tok.tokenize_with_weights(text, pad_token=e.rule.pad_token,
                                                      embedding_lookup=embedding_lookup, embedding_key=e.name,
                                                      warn=warn, **_length_options(e.rule), **extra)
    if images and not seen and warn is not None:
        warn(f"this {clip.kind} CLIP's text encoders take no images; the text encoder does not see them")
    return clip.encode_tokens(tokenized, policy, warn=warn, policies=policies)
