"""Key layouts of weight sources: how a source's stored tensor names become our modules' names.

A ``WeightSource`` names its layout (``ldm``, ``hf_clip``, ``open_clip``, ``controlnet``, ``controlnet_diff``,
``diffusers_unet``, ``diffusers_vae``, ``hf_clip_vision``, ``open_clip_vision``, ``hf_siglip_vision``,
``zero123_cc``); ``reader_for_source`` turns that into the renaming the
loader applies to headers (to derive configs), the handles apply to shapes, and the weight store
applies when it reads tensors. Its own module, so those three need not import one another for it.
A model family with a layout of its own (diffusers' SD3 / NextDiT transformers) registers it here
(``register_layout``), so the loaders find it by the file's keys (``layout_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mixgraph.nodes.encoders.clip import open_clip_to_hf
from mixgraph.nodes.encoders.clip_vision import hf_vision_rename, open_clip_vision_to_hf
from mixgraph.nodes.encoders.siglip_vision import siglip_vision_rename
from mixgraph.nodes.adapters.controlnet import convert_controlnet_state_dict
from mixgraph.nodes.weights.diffusers_names import diffusers_unet_rename, diffusers_vae_rename
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file

__all__ = ["hf_clip_rename", "reader_for_source", "convert_diff_controlnet", "DIFF_MARKERS", "FamilyLayout",
           "register_layout", "layout_of"]


@dataclass(frozen=True)
class FamilyLayout:
    """A model family's foreign key layout of its diffusion model (e.g. diffusers' layout of a
    DiT), registered by the family (``register_layout``) so the loaders and the weight store
    read such files without naming the family.

    name: the ``WeightSource.layout``. matches(keys): whether a file's keys are in this layout.
    header(info): the file's keys and shapes in the family's own layout (what ``detect`` sees).
    rename(stored keys) -> (key -> module key or None); post(renamed state dict) -> the module's
    state dict (None: the renaming is all), for layouts that are not a renaming (fused q/k/v)."""

    name: str
    matches: Callable[[Collection[str]], bool]
    header: Callable[[Mapping[str, Any]], dict]
    rename: Callable[[Iterable[str]], Callable[[str], str | None]]
    post: Callable[[dict], dict] | None = None


_FAMILY_LAYOUTS: dict[str, FamilyLayout] = {}


def register_layout(layout: FamilyLayout) -> FamilyLayout:
    known = _FAMILY_LAYOUTS.get(layout.name)
    if known is not None and known != layout:
        raise ValueError(f"weight layout {layout.name!r} is registered already")
    _FAMILY_LAYOUTS[layout.name] = layout
    return layout


def layout_of(keys: Collection[str]) -> FamilyLayout | None:
    """The registered family layout a file's keys are in, or None."""
    return next((fl for fl in _FAMILY_LAYOUTS.values() if fl.matches(keys)), None)


def hf_clip_rename(key: str) -> str | None:
    """A Hugging Face CLIP text-model key (with or without ``text_model.``) → ours; None skips
    the ``position_ids`` buffer."""
    if key.endswith("position_ids"):
        return None
    if not key.startswith(("text_model.", "text_projection")):
        return "text_model." + key
    return key


def reader_for_source(source: WeightSource):
    """(rename, post) turning ``source``'s stored keys into our module's keys.

    ``rename`` maps one key (prefix stripped) or returns None to skip it; ``post`` converts the
    whole renamed dict (only for layouts that are not a renaming, i.e. OpenCLIP's fused q/k/v).
    """
    layout = source.layout
    if layout == "ldm":
        return None, None
    if layout == "hf_clip":
        return hf_clip_rename, None
    if layout == "open_clip":
        return None, lambda sd: open_clip_to_hf(sd, "")
    if layout == "hf_clip_vision":
        return hf_vision_rename, None
    if layout == "open_clip_vision":
        return None, open_clip_vision_to_hf
    if layout == "hf_siglip_vision":
        return siglip_vision_rename, None
    if layout == "controlnet":
        return None, convert_controlnet_state_dict
    if layout == "zero123_cc":  # Stable Zero123's top-level cc_projection.* only (families/sd/zero123.py)
        return _zero123_cc_rename, None
    if layout == "controlnet_diff":
        return None, convert_diff_controlnet
    keys = _source_keys(source)
    family_layout = _FAMILY_LAYOUTS.get(layout)
    if family_layout is not None:
        return family_layout.rename(keys), family_layout.post
    if layout == "diffusers_unet":
        return diffusers_unet_rename(keys), None
    if layout == "diffusers_vae":
        return diffusers_vae_rename(keys), None
    if layout in _FAMILY_LAYOUTS:
        return _FAMILY_LAYOUTS[layout](keys)
    raise ValueError(f"unknown weight layout {layout!r}")


_BUILTIN = ("ldm", "hf_clip", "open_clip", "hf_clip_vision", "open_clip_vision", "controlnet", "zero123_cc",
            "controlnet_diff", "diffusers_unet", "diffusers_vae")


def _zero123_cc_rename(key: str) -> str | None:
    return key if key.startswith("cc_projection.") else None


def convert_diff_controlnet(sd):
    """A diff ControlNet (its ``difference`` marker key dropped) -> our keys; the base model's
    weights are added by a merge patch (``loader.load_diff_controlnet``)."""
    return convert_controlnet_state_dict({k: v for k, v in sd.items() if k not in DIFF_MARKERS})


DIFF_MARKERS = ("difference", "control_model.difference")


def _source_keys(source: WeightSource) -> list[str]:
    if source.path is None:
        names = list(source.tensors or ())
    else:
        names = list(inspect_file(source.path))
    return [k[len(source.prefix):] for k in names if k.startswith(source.prefix)]
