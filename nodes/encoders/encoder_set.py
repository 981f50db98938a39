"""Text encoders as a set: what one named encoder of a CLIP handle is, and the tokenizers by name.

A CLIP handle (``handles.ClipHandle``) holds any number of named encoders (``EncoderEntry``):
SD 1.x has clip_l, SD 2.x clip_h, SDXL clip_l + clip_g; later families add T5-XXL, Qwen, Gemma.
An entry says everything that differs between encoders, so that nothing that runs them needs to
know which encoders it has:

* where its weights are and its sizes (``source``, ``config``) and the module that holds them
  (``build``; the weight store materializes ``build(config)``);
* the tokenizer it reads, by name (``tokenizer``: "clip" for every CLIP encoder; a later family
  registers "t5", "qwen2.5", ... with ``register_tokenizer``, without touching the handle);
* its precision role (``role``), so that each encoder of a set can run under its own policy
  (``ClipHandle.encode(..., policies={role: policy})``);
* its output rule (``OutputRule``): the pad token, which hidden layer it gives, whether that
  layer is normed, whether its pooled output is projected and whether it is the cond's pooled
  vector. The encoders' hidden states join along features in set order, each cut to the
  shortest token count (SDXL: clip_l 768 + clip_g 1280 = 2048; ``text_encode.encode_tokens``).

Encoders that are no CLIP (T5, decoder LLMs) run through their module's own
``encode_chunks(chunks, rule, layer_idx, warn) -> EncodedText``; how a set's outputs become one
cond (Flux: T5's tokens with CLIP-L's pooled vector; SD3: CLIP-L+G along features, padded, then
T5 along tokens) is the set's *join*, registered by the set's name (``register_join``; the
name is ``ClipHandle.kind``). A set without a registered join joins along features as above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collections.abc import Mapping

from torch import Tensor, nn

from mixgraph.nodes.encoders.clip import CLIPTextModel
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.encoders.tokenizer import CLIPTokenizer
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["OutputRule", "EncoderEntry", "EncodedText", "Join", "register_tokenizer", "get_tokenizer",
           "tokenizer_names", "register_join", "get_join"]


@dataclass(frozen=True)
class OutputRule:
    """What one encoder contributes to a cond (ComfyUI's per-encoder ``SDClipModel`` settings).

    pad_token: the id that fills a chunk after the end token (49407 for OpenAI's clip_l, 0 for
        the OpenCLIP encoders).
    default_layer: the hidden layer given without CLIPSetLastLayer (-2 penultimate); None = the
        last layer after ``final_layer_norm``.
    norm_hidden: ``final_layer_norm`` is applied to an intermediate layer (SD1 clip skip, SD2).
    project_pooled: the pooled output goes through ``text_projection``.
    pooled: this encoder's pooled output is the cond's pooled vector (SDXL: clip_g's); None of
        them: the cond has no pooled vector.
    min_length: the tokenizer pads a prompt to at least this many tokens (ComfyUI's per-set
        ``min_length``: T5 256 for Flux, 77 for SD3, 1 for Chroma); None: the tokenizer's own.
    min_padding: the tokenizer adds this many pad tokens after a prompt's end token (ComfyUI's
        ``min_padding``, set on T5 by T5TokenizerOptions); None: none.
    """

    pad_token: int
    default_layer: int | None
    norm_hidden: bool
    project_pooled: bool
    pooled: bool = False
    min_length: int | None = None
    min_padding: int | None = None


@dataclass(frozen=True)
class EncoderEntry:
    """One named text encoder of a CLIP handle (hashable: a weight-store and cache key).

    name: "clip_l", "clip_g", "clip_h", later "t5xxl", ...; LoRA patches name it as their
        ``target``, and textual-inversion files key their vectors by it.
    source, config: its weights and sizes; ``build(config)`` is the module (meta-built for
        shapes, materialized by the weight store).
    rule: its ``OutputRule``. tokenizer: the registered tokenizer it reads. role: the precision
        role it runs under ("text" for every SD encoder).
    """

    name: str
    source: WeightSource
    config: Any
    rule: OutputRule
    tokenizer: str = "clip"
    role: str = "text"
    build: Callable[[Any], nn.Module] = CLIPTextModel


@dataclass(frozen=True)
class EncodedText:
    """One encoder's output for one prompt: ``hidden`` [1, T, D] (the chunks along tokens, weights
    applied), ``pooled`` [1, P] or None, ``mask`` [1, T] (1 = a real token, 0 = padding) or None
    when every token counts. Float32. ``empty``: the encoder was given no chunks (ComfyUI's empty
    token list, CLIPTextEncodeSD3's "none" padding); its output is then that of ComfyUI's
    zero-length empty prompt, and a join may leave it out as ComfyUI does. ``tokens``: the first
    chunk's items as the encoder was given them, for a join that cuts by token (Qwen-Image drops
    its template's), or () where the encoder does not report them."""

    hidden: Tensor
    pooled: Tensor | None = None
    mask: Tensor | None = None
    empty: bool = False
    tokens: tuple = ()


#: A set's join: encoder name -> its output, in set order -> the cond's tensors.
Join = Callable[[Mapping[str, EncodedText]], Cond]


# --------------------------------------------------------------------------------------------
# joins by set name

_JOINS: dict[str, Join] = {}


def register_join(name: str, join: Join) -> None:
    """Make ``join`` how the encoder set named ``name`` (``ClipHandle.kind``) makes one cond.
    Registering a name twice with another function raises ValueError."""
    known = _JOINS.get(name)
    if known is not None and known is not join:
        raise ValueError(f"text-encoder set {name!r} has a join already ({known!r})")
    _JOINS[name] = join


def get_join(name: str) -> Join | None:
    """The join registered for the set ``name``, or None (join along features)."""
    return _JOINS.get(name)


# --------------------------------------------------------------------------------------------
# tokenizers by name

_TOKENIZERS: dict[str, Callable[[], Any]] = {"clip": CLIPTokenizer}


def register_tokenizer(name: str, factory: Callable[[], Any]) -> None:
    """Make ``factory()`` the tokenizer an entry names ``name``. The instance is built once, on
    first use. Registering a name twice with another factory raises ValueError."""
    known = _TOKENIZERS.get(name)
    if known is not None and known is not factory:
        raise ValueError(f"tokenizer {name!r} is already registered ({known!r})")
    _TOKENIZERS[name] = factory


@functools.cache
def get_tokenizer(name: str) -> Any:
    """The one cached tokenizer instance registered as ``name``."""
    factory = _TOKENIZERS.get(name)
    if factory is None:
        raise ValueError(f"no tokenizer named {name!r}; registered: {', '.join(tokenizer_names())}")
    return factory()


def tokenizer_names() -> tuple[str, ...]:
    return tuple(sorted(_TOKENIZERS))
