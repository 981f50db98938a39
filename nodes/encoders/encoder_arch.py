"""Text-encoder architectures by name: how a weight file shows one, its config and its module.

A family's ``TextEncoderSlot.arch`` names an architecture ("clip", "t5", "umt5", "qwen3",
"gemma2", "qwen2_5_vl"); the loaders find which architecture a text-encoder file holds and where
(``recognise``), derive its config from shapes (``EncoderArch.config``) and build entries whose
module is ``EncoderArch.build(config)``. A new encoder architecture is one ``register_arch``
line here.

Where an architecture's keys live (``EncoderArch.prefixes``, tried in order): a standalone file
(no prefix, or the prefix ComfyUI's own saved files use) and the single-file checkpoints of the
DiT families (ComfyUI: ``text_encoders.<name>.transformer.``, e.g. ``text_encoders.t5xxl.
transformer.``; SD's ``cond_stage_model`` / ``conditioner.embedders`` prefixes for CLIP).

Importing this module also registers the tokenizers ("t5") and the set joins ("flux", "sd3",
"chroma": ``dit_joins``) of the encoders it knows, so whatever builds entries from it can run
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from mixgraph.nodes.encoders import dit_joins  # noqa: F401  (registers the flux / sd3 / chroma joins)
from mixgraph.nodes.encoders import llm_sets  # (registers the z_image / lumina2 joins and LLM tokenizers)
from mixgraph.nodes.encoders import qwen_image_set  # (registers the qwen_image join and tokenizer)
from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel, is_open_clip
from mixgraph.nodes.encoders.encoder_set import register_tokenizer
from mixgraph.nodes.encoders.qwen25_vl import Qwen25VLTextModel
from mixgraph.nodes.encoders.t5 import T5Config, T5EncoderModel, is_t5
from mixgraph.nodes.encoders.t5_tokenizer import T5Tokenizer
from mixgraph.nodes.encoders import umt5  # (registers the "wan" join)
from mixgraph.nodes.encoders.umt5_tokenizer import umt5_tokenizer_name
from mixgraph.nodes.weights.layouts import hf_clip_rename
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["Found", "EncoderArch", "register_arch", "get_arch", "arch_names", "recognise", "sub_info",
           "CLIP_ACTIVATION"]

Info = Mapping[str, Any]  # key -> TensorInfo / tensor / shape

#: CLIP activation by encoder (slot) name: OpenAI's CLIP-L quick GELU, OpenCLIP's GELU
CLIP_ACTIVATION = {"clip_l": "quick_gelu", "clip_g": "gelu", "clip_h": "gelu"}


@dataclass(frozen=True)
class Found:
    """Where a file keeps one encoder: its key ``prefix``, the key ``layout`` the weight store
    reads it in ("ldm": keys as stored; "hf_clip", "open_clip"), and its hidden ``width`` (two
    encoders of one architecture are told apart by it: clip_l 768 < clip_g 1280)."""

    arch: str
    prefix: str
    layout: str
    width: int


@dataclass(frozen=True)
class EncoderArch:
    """One architecture: ``find(info, prefix)`` -> ``Found`` when its keys are under ``prefix``;
    ``config(info, found, slot_name)`` -> the config (``info`` with the file's keys as stored);
    ``build(config)`` -> the module; ``prefixes``: where files keep it, tried in order;
    ``tokenizer(source, slot_tokenizer)`` -> the tokenizer name an entry of these weights reads
    (None: the slot's; Gemma 2: the SentencePiece model stored in the file, registered on the way)."""

    name: str
    find: Callable[[Info, str], Found | None]
    config: Callable[[Info, Found, str], Any]
    build: Callable[[Any], nn.Module]
    prefixes: tuple[str, ...] = ("",)
    tokenizer: Callable[[WeightSource, str], str] | None = None

    def entry_tokenizer(self, source: WeightSource, slot_tokenizer: str) -> str:
        return slot_tokenizer if self.tokenizer is None else self.tokenizer(source, slot_tokenizer)


_ARCHS: dict[str, EncoderArch] = {}


def register_arch(arch: EncoderArch) -> EncoderArch:
    """Add ``arch``; a second architecture under one name raises ValueError."""
    known = _ARCHS.get(arch.name)
    if known is not None and known is not arch:
        raise ValueError(f"text-encoder architecture {arch.name!r} is registered already")
    _ARCHS[arch.name] = arch
    return arch


def get_arch(name: str) -> EncoderArch:
    try:
        return _ARCHS[name]
    except KeyError:
        raise ValueError(f"no text-encoder architecture {name!r}; registered: {', '.join(arch_names())}") from None


def arch_names() -> tuple[str, ...]:
    return tuple(_ARCHS)


def recognise(info: Info, prefixes: tuple[str, ...] | None = None) -> Found | None:
    """The first registered architecture found in ``info`` under one of its prefixes (or of
    ``prefixes`` when given), or None."""
    for arch in _ARCHS.values():
        for prefix in arch.prefixes if prefixes is None else prefixes:
            found = arch.find(info, prefix)
            if found is not None:
                return found
    return None


def sub_info(info: Info, prefix: str) -> dict[str, Any]:
    """``info``'s keys under ``prefix``, the prefix stripped."""
    return {k[len(prefix):]: v for k, v in info.items() if k.startswith(prefix)}


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v, "shape", v))


# --------------------------------------------------------------------------------------------
# CLIP (HF or OpenCLIP layout)


def _find_clip(info: Info, prefix: str) -> Found | None:
    if is_open_clip(info, prefix):
        return Found("clip", prefix, "open_clip", _shape(info[prefix + "token_embedding.weight"])[1])
    for stem in ("text_model.", ""):
        key = f"{prefix}{stem}embeddings.token_embedding.weight"
        if key in info:
            return Found("clip", prefix, "hf_clip", _shape(info[key])[1])
    return None


def _clip_config(info: Info, found: Found, slot: str) -> CLIPTextConfig:
    sub = sub_info(info, found.prefix)
    if found.layout == "hf_clip":
        sub = {new: v for k, v in sub.items() if (new := hf_clip_rename(k)) is not None}
    return CLIPTextConfig.from_state_dict(sub, activation=CLIP_ACTIVATION.get(slot))


# --------------------------------------------------------------------------------------------
# T5 v1.1


def _find_t5(info: Info, prefix: str) -> Found | None:
    if not is_t5(info, prefix):
        return None
    return Found("t5", prefix, "ldm", _shape(info[prefix + "shared.weight"])[1])


def _t5_config(info: Info, found: Found, slot: str) -> T5Config:
    return T5Config.from_state_dict(sub_info(info, found.prefix))


# --------------------------------------------------------------------------------------------
# umT5 (Wan): T5 v1.1 with a bias table per block, its tokenizer the file's SentencePiece model


def _find_umt5(info: Info, prefix: str) -> Found | None:
    if not umt5.is_umt5(info, prefix):
        return None
    return Found("umt5", prefix, "ldm", _shape(info[prefix + "shared.weight"])[1])


def _umt5_config(info: Info, found: Found, slot: str) -> T5Config:
    return umt5.umt5_config(sub_info(info, found.prefix))


# -- the registry: one line per architecture
register_arch(EncoderArch("clip", _find_clip, _clip_config, CLIPTextModel, prefixes=(
    "", "text_encoders.clip_l.transformer.", "text_encoders.clip_g.transformer.",
    "cond_stage_model.transformer.", "conditioner.embedders.0.transformer.", "cond_stage_model.model.",
    "conditioner.embedders.1.model.", "conditioner.embedders.0.model.")))
# umT5 before T5: a umT5 file holds every key T5 v1.1 is recognised by
register_arch(EncoderArch("umt5", _find_umt5, _umt5_config, T5EncoderModel, prefixes=umt5.UMT5_PREFIXES,
                          tokenizer=umt5_tokenizer_name))
register_arch(EncoderArch("t5", _find_t5, _t5_config, T5EncoderModel,
                          prefixes=("", "text_encoders.t5xxl.transformer.")))
for _name, _find, _config in (("qwen3", llm_sets.find_qwen3, llm_sets.qwen3_arch_config),
                              ("gemma2", llm_sets.find_gemma2, llm_sets.gemma2_arch_config)):
    _llm = llm_sets.LLM_ARCHS[_name]
    register_arch(EncoderArch(_name, _find, _config, _llm.build, prefixes=llm_sets.LLM_PREFIXES[_name],
                              tokenizer=_llm.tokenizer))

register_arch(EncoderArch("qwen2_5_vl", qwen_image_set.find_qwen25_vl, qwen_image_set.qwen25_vl_arch_config,
                          Qwen25VLTextModel, prefixes=qwen_image_set.QWEN25_VL_PREFIXES,
                          tokenizer=qwen_image_set.entry_tokenizer))

# -- tokenizers of these encoders
register_tokenizer("t5", T5Tokenizer)
