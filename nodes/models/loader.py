"""Detect what a weight file or folder holds and return handles for it (no tensor data is read).

Detection reads only safetensors headers (key names, shapes, dtypes); sizes come from shapes, so a
tiny test file and a full-size checkpoint take the same path. Weights are read later, by the
weight store, when a node materializes a handle in a storage dtype.

Layouts understood (comfy-conventions §8):
- single-file LDM/SGM checkpoints: UNet ``model.diffusion_model.``, VAE ``first_stage_model.``;
  text encoders SD1 ``cond_stage_model.transformer.`` (HF clip_l), SD2 ``cond_stage_model.model.``
  (OpenCLIP clip_h), SDXL ``conditioner.embedders.0.transformer.`` (clip_l) +
  ``conditioner.embedders.1.model.`` (OpenCLIP clip_g), refiner ``conditioner.embedders.0.model.``
  (clip_g). Other keys (``model_ema.*``, ``cond_stage_model`` extras, optimizer state) are ignored.
- diffusers folders: ``unet/``, ``vae/``, ``text_encoder/``, ``text_encoder_2/`` holding
  ``diffusion_pytorch_model[.fp16].safetensors`` / ``model[.fp16].safetensors``.
- standalone VAE (LDM keys with or without ``first_stage_model.``; diffusers keys), UNet (LDM
  with or without ``model.diffusion_model.``; diffusers keys), text encoders (HF or OpenCLIP).
- the DiT families' text encoders (CLIP, T5 v1.1, ...): standalone or in a checkpoint under
  ComfyUI's ``text_encoders.<name>.transformer.``; which architecture a file holds, its config and
  module are ``nodes/encoders/encoder_arch.py``'s, which slot it fills the family's
  (``TextEncoderSlot.arch``).

The diffusers → LDM key renaming (``diffusers_unet_rename``, ``diffusers_vae_rename``) lives in
``nodes.weights.diffusers_names``, shared with the LoRA and ControlNet loaders; diffusers' VAE
attention projections are [C, C] Linear weights where LDM has [C, C, 1, 1] 1×1 convs, which the
weight store reshapes on assignment.

Which model a diffusion model is (family, variant, config, prediction type and the variant's
extra fields) is its family's to say: the loaders ask the registered families
(``nodes/families``, ``families.detect``) and build a ``ModelHandle`` from the ``Detection``; a
CLIP is built from the text encoders the family pairs the variant with (``text_encoders``).
SD 1.x / 2.x / SDXL detection is ``nodes/families/sd/detect.py``. ``prediction=`` overrides the
detected prediction type.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.base import Detection, TextEncoderSlot
from mixgraph.nodes.encoders.clip import CLIPTextConfig, is_open_clip
from mixgraph.nodes.encoders.clip_vision_handle import clip_vision_handle
from mixgraph.nodes.encoders.encoder_arch import Found, get_arch, recognise
from mixgraph.nodes.encoders.encoder_set import EncoderEntry
from mixgraph.nodes.adapters.control_lora import ControlLoraHandle, is_control_lora
from mixgraph.nodes.adapters.controlnet import (controlnet_config_from_state_dict,
                                                convert_controlnet_state_dict)
from mixgraph.nodes.adapters.flux_controlnet import LAYOUT as FLUX_CN_LAYOUT
from mixgraph.nodes.adapters.flux_controlnet import MISTOLINE_LAYOUT
from mixgraph.nodes.adapters.flux_controlnet import (FluxControlNetHandle, flux_controlnet_config,
                                                     is_flux_instantx_controlnet, is_flux_mistoline_controlnet,
                                                     is_flux_xlabs_controlnet, mistoline_controlnet_config,
                                                     xlabs_controlnet_config)
from mixgraph.nodes.adapters.sd35_controlnet import LAYOUT as SD35_LAYOUT
from mixgraph.nodes.adapters.sd3_mmdit_controlnet import LAYOUT as MMDIT_CN_LAYOUT
from mixgraph.nodes.adapters.sd3_mmdit_controlnet import (MMDiTControlNetHandle, is_mmdit_controlnet,
                                                          mmdit_controlnet_config)
from mixgraph.nodes.adapters.sd35_controlnet import (SD35ControlNetHandle, is_sd35_controlnet, sd35_config_from_shapes,
                                                     sd35_rename)
from mixgraph.nodes.weights.diffusers_names import diffusers_unet_rename
from mixgraph.nodes.families.refused import (UnsupportedFamilyError, detect_family, family_of_file, refusal,
                                             supported)
from mixgraph.nodes.models.handles import ClipHandle, ControlNetHandle, ModelHandle, TaesdVaeHandle, VaeHandle
from mixgraph.nodes.vae import arch_registry as vae_archs
from mixgraph.nodes.vae.taesd import load_taesd_autoencoder
from mixgraph.nodes.weights.layouts import (DIFF_MARKERS, convert_diff_controlnet, hf_clip_rename,
                                            layout_of, reader_for_source)
from mixgraph.nodes.weights.merge import MergePatch
from mixgraph.nodes.weights.safetensors_io import (TensorInfo, WeightSource, inspect_file, quantization,
                                                   read_tensors)
from mixgraph.nodes.adapters.t2i_adapter import is_t2i_adapter, load_t2i_adapter
from mixgraph.nodes.vae.vae import VAEConfig
from mixgraph.nodes.families.sd.family import UNET_PREFIX, VAE_PREFIX  # the single-file (LDM) layout
from mixgraph.nodes.families.sd.zero123 import is_zero123

__all__ = [
    "load_checkpoint",
    "load_unclip_checkpoint",
    "load_image_only_checkpoint",
    "image_only_problem",
    "load_unet",
    "load_vae",
    "load_clip",
    "clip_type_family",
    "clip_type_families",
    "load_controlnet",
    "load_diff_controlnet",
]

CLIP_ACTIVATION = {"clip_l": "quick_gelu", "clip_g": "gelu", "clip_h": "gelu"}
WEIGHT_DTYPES = {
    "default": None,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e4m3fn_fast": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

Info = Mapping[str, TensorInfo]
#: marker keys a checkpoint keeps beside the diffusion model (prediction type, Playground v2.5)
MARKERS = ("v_pred", "ztsnr", "edm_mean", "edm_std", "edm_vpred.sigma_max")
UNCLIP_VISION_PREFIX = "embedder.model.visual."
ZERO123_VISION_PREFIX = "cond_stage_model.model.visual."  # ComfyUI's Stable_Zero123.clip_vision_prefix


# --------------------------------------------------------------------------------------------
# key layouts


def _sub(prefix: str, info: Info) -> dict[str, TensorInfo]:
    return {k[len(prefix):]: v for k, v in info.items() if k.startswith(prefix)}


def _renamed_info(info: Info, rename) -> dict[str, TensorInfo]:
    if rename is None:
        return dict(info)
    out = {}
    for k, v in info.items():
        new = rename(k)
        if new is not None:
            out[new] = v
    return out


# --------------------------------------------------------------------------------------------
# detection


def _refuse_family(name: str, info: Info) -> None:
    """Model families other than SD 1.x / 2.x / SDXL stop here (``families.py``)."""
    family = detect_family(info)
    if family is not None:
        raise UnsupportedFamilyError(refusal(family, name))


def _refuse_folder(p: Path) -> None:
    family = family_of_file(p) if p.is_dir() else None
    if family is not None:
        raise UnsupportedFamilyError(refusal(family, p.name))


def _describe(info: Info) -> str:
    tops: dict[str, int] = {}
    for k in info:
        top = ".".join(k.split(".")[:2])
        tops[top] = tops.get(top, 0) + 1
    common = sorted(tops.items(), key=lambda kv: -kv[1])[:8]
    return f"{len(info)} tensors; top key prefixes: " + ", ".join(f"{p}.* ({n})" for p, n in common)


def _detect(name: str, info: Info, read: Callable[[str], torch.Tensor] | None,
            source: WeightSource) -> Detection:
    """The registered family's Detection of a diffusion model (``families.detect``); ``info``
    as ``base.Family.detect`` takes it."""
    found = families.detect(info, read, source)
    if found is None:
        raise ValueError(f"{name}: no model family recognises this diffusion model ({_describe(info)})")
    return found


def _model_handle(found: Detection, source: WeightSource, override: str | None, **extra) -> ModelHandle:
    """A MODEL handle from a family's Detection: the family's sampling defaults for the variant,
    then what detection found, then the loader's ``extra`` fields, then ``override`` (the
    loader's ``prediction=`` argument)."""
    family = families.get(found.family)
    sampling = family.sampling(found.variant)
    fields = {"prediction": sampling.prediction, "zsnr": sampling.zsnr, "beta_range": sampling.beta_range,
              "continuous_sampling": sampling.continuous, **found.fields, **extra}
    layout = fields.pop("source_layout", None)  # a family's own stored layout (``layouts.register_layout``)
    if layout is not None:
        source = dataclasses.replace(source, layout=layout)
    if "latent_format" not in fields:
        fields["latent_format"] = family.latent_format(found.variant, getattr(found.config, "out_channels", 4))
    if override:
        fields["prediction"] = override
    return ModelHandle(source=source, config=found.config, kind=found.variant, family=found.family, **fields)


def _without_quant_keys(view: Info, source: WeightSource) -> Info:
    """``view`` without the scale and marker keys of a ComfyUI quantised file
    (``quantized.py``): they are no model weights, so families detect from the weights alone."""
    scheme = quantization(source)
    return view if scheme is None else {k: v for k, v in view.items() if k not in scheme.aux}


def _markers(info: Info) -> dict[str, TensorInfo]:
    return {k: v for k, v in info.items() if k in MARKERS}


def _clip_handle(slots: Sequence[TextEncoderSlot], sources: Mapping[str, WeightSource],
                 configs: Mapping[str, Any]) -> ClipHandle:
    """The CLIP of a family variant's text-encoder ``slots`` (``Family.text_encoders``), in set
    order, from each encoder's weights and config; an optional slot without weights is left
    out. Each entry's module is its slot architecture's (``encoder_arch``)."""
    missing = [s.name for s in slots if not s.optional and (sources.get(s.name) is None or configs.get(s.name) is None)]
    if missing:
        raise ValueError(f"{slots[0].encoding} text encoding needs {', '.join(missing)}, which is not loaded")
    return ClipHandle(kind=slots[0].encoding, encoders=tuple(
        EncoderEntry(s.name, sources[s.name], configs[s.name], s.rule,
                     get_arch(s.arch).entry_tokenizer(sources[s.name], s.tokenizer), s.role, get_arch(s.arch).build)
        for s in slots if s.name in sources and s.name in configs))


def _complete(slots: Sequence[TextEncoderSlot], sources: Mapping[str, WeightSource]) -> bool:
    """Whether ``sources`` fill every slot a set needs (all but the optional ones, at least one)."""
    return bool(sources) and all(s.optional or s.name in sources for s in slots)


def _checkpoint_encoder(p: Path, info: Info, slot: TextEncoderSlot) -> tuple[WeightSource, Any] | None:
    """(source, config) of the text encoder ``slot`` stored in the single-file checkpoint ``p``
    under its ``prefix``, or None when the file has none there. CLIP slots keep the SD layouts
    (``slot.layout``); any other architecture is found by the encoder registry."""
    if not slot.prefix or not any(k.startswith(slot.prefix) for k in info):
        return None
    if slot.arch == "clip":
        source = WeightSource.from_file(p, slot.prefix, slot.layout)
        return source, _clip_config(info, source, slot.name)
    arch = get_arch(slot.arch)
    found = arch.find(info, slot.prefix)
    if found is None:
        raise ValueError(f"{p.name}: the keys under {slot.prefix!r} are not a {slot.arch} text encoder "
                         f"({slot.name})")
    return WeightSource.from_file(p, slot.prefix, found.layout), arch.config(info, found, slot.name)


def _clip_config(info: Info, source: WeightSource, role: str) -> CLIPTextConfig:
    sub = _sub(source.prefix, info)
    if source.layout == "hf_clip":
        sub = _renamed_info(sub, hf_clip_rename)
    return CLIPTextConfig.from_state_dict(sub, activation=CLIP_ACTIVATION[role])


def _vae_handle(source: WeightSource, info: Info, kind: str | None = None, family: str = "sd") -> VaeHandle:
    """``kind``: the variant of ``family`` the VAE pairs with, for its latent format (a
    standalone VAE file does not say: SD 1.x's, as ComfyUI's VAELoader)."""
    rename, _ = reader_for_source(source)
    sub = _renamed_info(_sub(source.prefix, info), rename)
    cfg = VAEConfig.from_state_dict(sub)
    fmt = families.get(family).latent_format(kind or "sd1", cfg.latent_channels)
    return VaeHandle(source=source, config=cfg, latent_format=fmt)


def _is_diffusers_folder(path: Path) -> bool:
    return path.is_dir() and ((path / "unet").is_dir() or (path / "transformer").is_dir())


def _diffusers_model_file(root: Path) -> Path:
    """The diffusion model's weights in a diffusers pipeline folder: ``unet/`` (SD) or
    ``transformer/`` (DiT families)."""
    sub = root / "unet" if (root / "unet").is_dir() else root / "transformer"
    return _find_weights(sub, "diffusion_pytorch_model")


def _diffusers_model(path: Path, info: Info) -> tuple[WeightSource, dict[str, TensorInfo]]:
    """(source, keys in the family's own layout) of a diffusers-layout diffusion model: a
    family's registered layout (``layouts.register_layout``) when the keys are in one, the keys as
    they are when a family's own names are diffusers' (Qwen-Image), else the diffusers UNet renamed
    to the LDM layout."""
    family_layout = layout_of(info)
    if family_layout is not None:
        return WeightSource.from_file(path, "", family_layout.name), family_layout.header(info)
    if families.detect(info) is not None:  # a family whose own key names are diffusers' (Qwen-Image)
        return WeightSource.from_file(path, ""), dict(info)
    return WeightSource.from_file(path, "", "diffusers_unet"), _renamed_info(info, diffusers_unet_rename(info))


def _find_weights(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.safetensors", f"{stem}.fp16.safetensors", f"{stem}.bin", f"{stem}.fp16.bin"):
        if (folder / name).is_file():
            return folder / name
    if (folder / f"{stem}.safetensors.index.json").is_file():
        raise NotImplementedError(f"{folder}: sharded diffusers weights: not supported yet")
    raise ValueError(f"{folder}: no {stem}.safetensors (found: {sorted(p.name for p in folder.iterdir())})")


def load_checkpoint(path: str | os.PathLike, prediction: str | None = None) -> tuple[ModelHandle, ClipHandle | None, VaeHandle | None]:
    """CheckpointLoaderSimple: (MODEL, CLIP, VAE) handles for a single file or diffusers folder.

    ``prediction`` overrides the detected prediction type ("eps", "v_prediction", ...). The
    model family, variant and config are the registered families' (``families.detect``); the
    text encoders are the ones the family pairs the variant with (``text_encoders``), where the
    checkpoint holds them.
    """
    p = Path(path)
    if p.is_dir():
        _refuse_folder(p)
        if not _is_diffusers_folder(p):
            raise ValueError(f"{p}: a folder that is not a diffusers model (no unet/ subfolder)")
        return _load_diffusers_folder(p, prediction)
    info = inspect_file(p)
    _refuse_family(p.name, info)
    n_unet = sum(k.startswith(UNET_PREFIX) for k in info)
    if n_unet <= 5:
        raise ValueError(
            f"{p.name}: not a Stable Diffusion checkpoint: no UNet under '{UNET_PREFIX}' ({_describe(info)}). "
            f"Standalone UNet, VAE or text-encoder files go in diffusion_models/, vae/ or text_encoders/."
        )
    model, found = _checkpoint_model(p, info, prediction)
    family = families.get(found.family)
    slots = family.text_encoders(found.variant)
    sources, configs = {}, {}
    for slot in slots:
        stored = _checkpoint_encoder(p, info, slot)
        if stored is not None:
            sources[slot.name], configs[slot.name] = stored
    clip = None
    if slots and _complete(slots, sources):
        clip = _clip_handle(slots, sources, configs)
    return model, clip, _checkpoint_vae(p, info, found)


def _checkpoint_model(p: Path, info: Info, prediction: str | None) -> tuple[ModelHandle, Detection]:
    """The MODEL of a single-file checkpoint: its diffusion model's keys without ``UNET_PREFIX``,
    the other keys as they are (``base.Family.detect``)."""
    view = {k[len(UNET_PREFIX):] if k.startswith(UNET_PREFIX) else k: v for k, v in info.items()}

    def read(key: str) -> torch.Tensor:
        stored = UNET_PREFIX + key if UNET_PREFIX + key in info else key
        return read_tensors(p, [stored])[stored]

    source = WeightSource.from_file(p, UNET_PREFIX)
    found = _detect(p.name, _without_quant_keys(view, source), read, source)
    return _model_handle(found, source, prediction), found


def _checkpoint_vae(p: Path, info: Info, found: Detection) -> VaeHandle | None:
    """The VAE where the family's checkpoints keep it (``checkpoint_layout(variant).vae``: Flux's
    ``vae.``), else under SD's ``first_stage_model.``."""
    prefixes = [VAE_PREFIX]
    layout = getattr(families.get(found.family), "checkpoint_layout", None)
    if layout is not None:
        try:
            prefixes.insert(0, layout(found.variant).vae)
        except ValueError:  # a variant it does not save (SD's x4 upscaler)
            pass
    for prefix in prefixes:
        if f"{prefix}decoder.conv_in.weight" in info:
            return _vae_handle(WeightSource.from_file(p, prefix), info, found.variant, found.family)
    return None


def _load_diffusers_folder(root: Path, prediction: str | None):
    """A diffusers pipeline folder: the ``unet/`` weights renamed to the LDM layout, seen by the
    families beside the text encoders' keys under their folder names (``text_encoder.*``,
    ``text_encoder_2.*``); the prediction type from ``scheduler/scheduler_config.json``."""
    index = root / "model_index.json"
    if index.is_file() and "StableDiffusionUpscale" in index.read_text(errors="replace"):
        raise NotImplementedError(f"{root.name}: the x4 upscaler as a diffusers folder is not supported yet "
                                  f"(use the single-file x4-upscaler-ema.safetensors)")
    unet_file = _diffusers_model_file(root)
    info = inspect_file(unet_file)
    source, view = _diffusers_model(unet_file, info)
    for folder in ("text_encoder", "text_encoder_2"):
        if (root / folder).is_dir():
            view.update({f"{folder}.{k}": v for k, v in inspect_file(_find_weights(root / folder, "model")).items()})
    found = _detect(unet_file.name, view, None, source)
    extra = {}
    sched = root / "scheduler" / "scheduler_config.json"
    if sched.is_file():
        sc = json.loads(sched.read_text())
        if not str(sc.get("_class_name", "")).startswith("FlowMatch"):  # a flow scheduler names neither
            extra["prediction"] = {"v_prediction": "v_prediction", "epsilon": "eps", "sample": "x0"}.get(
                sc.get("prediction_type", "epsilon"), "eps")
            extra["zsnr"] = bool(sc.get("rescale_betas_zero_snr", False))
    model = _model_handle(found, source, prediction, **extra)
    slots = families.get(found.family).text_encoders(found.variant)
    sources, configs = {}, {}
    for slot in slots:
        if slot.folder and (root / slot.folder).is_dir():
            f = _find_weights(root / slot.folder, "model")
            sources[slot.name], configs[slot.name] = _standalone_clip_source(f, slot.name)
    clip = _clip_handle(slots, sources, configs) if slots and len(sources) == len(slots) else None
    vae = None
    if (root / "vae").is_dir():
        vae = load_vae(_find_weights(root / "vae", "diffusion_pytorch_model"), kind=found.variant)
    return model, clip, vae


# --------------------------------------------------------------------------------------------
# standalone files


def load_unclip_checkpoint(path: str | os.PathLike, prediction: str | None = None):
    """unCLIPCheckpointLoader: (MODEL, CLIP, VAE, CLIP_VISION) of an SD2.1 unCLIP checkpoint; the
    vision tower is OpenCLIP's under ``embedder.model.visual.`` (ComfyUI's ``clip_vision_prefix``).
    CLIP_VISION is None for a checkpoint without one (ComfyUI returns None there too)."""
    model, clip, vae = load_checkpoint(path, prediction)
    p = Path(path)
    vision = None if p.is_dir() else clip_vision_handle(p, inspect_file(p), UNCLIP_VISION_PREFIX)
    return model, clip, vae, vision


def image_only_problem(name: str, info: Info) -> str | None:
    """Why ImageOnlyCheckpointLoader cannot load a file (header only), or None when it can."""
    family = detect_family(info)
    if family is not None:
        return refusal(family, name)
    if not is_zero123(info):
        return (f"{name}: no Stable Zero123 camera projection (cc_projection.*) in this file; image-only "
                f"checkpoints of other kinds (SVD img2vid, SV3D) are not supported yet. Plain SD "
                f"checkpoints load with CheckpointLoaderSimple, SD2.1 unCLIP with unCLIPCheckpointLoader")
    if not any(k.startswith(ZERO123_VISION_PREFIX) for k in info):
        return f"{name}: a Stable Zero123 checkpoint without its CLIP vision tower ({ZERO123_VISION_PREFIX}*)"
    if f"{VAE_PREFIX}decoder.conv_in.weight" not in info:
        return f"{name}: a Stable Zero123 checkpoint without its VAE ({VAE_PREFIX}*)"
    return None


def load_image_only_checkpoint(path: str | os.PathLike):
    """ImageOnlyCheckpointLoader: (MODEL, CLIP_VISION, VAE) of a Stable Zero123 checkpoint. Its
    CLIP image tower is OpenAI CLIP's ViT-L/14 in OpenCLIP layout under
    ``cond_stage_model.model.visual.`` (the text tower beside it is not used, as in ComfyUI).
    SVD img2vid and SV3D files are refused ("model family ... is not supported")."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p.name}: ImageOnlyCheckpointLoader takes a single checkpoint file, not a folder")
    info = inspect_file(p)
    problem = image_only_problem(p.name, info)
    if problem is not None:
        error = UnsupportedFamilyError if detect_family(info) or not is_zero123(info) else ValueError
        raise error(problem)
    vision = clip_vision_handle(p, info, ZERO123_VISION_PREFIX)
    if vision is None:
        raise ValueError(f"{p.name}: the keys under {ZERO123_VISION_PREFIX} are not a CLIP vision tower")
    model, found = _checkpoint_model(p, info, None)
    return model, vision, _checkpoint_vae(p, info, found)


def load_unet(path: str | os.PathLike, weight_dtype: str = "default", prediction: str | None = None) -> ModelHandle:
    """UNETLoader: an LDM UNet (with or without ``model.diffusion_model.``) or a diffusers UNet.

    ``weight_dtype`` ("fp8_e4m3fn", ...) pins the storage dtype of this model, as ComfyUI's
    ``model_options["dtype"]``; the compute dtype still comes from the policy.
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {tuple(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    p = Path(path)
    _refuse_folder(p)
    if _is_diffusers_folder(p):
        p = _diffusers_model_file(p)
    elif p.is_dir() and any(p.glob("diffusion_pytorch_model*")):  # a diffusers model folder itself
        p = _find_weights(p, "diffusion_pytorch_model")
    info = inspect_file(p)
    _refuse_family(p.name, info)
    if sum(k.startswith(UNET_PREFIX) for k in info) > 5:
        source, sub = WeightSource.from_file(p, UNET_PREFIX), _sub(UNET_PREFIX, info)
    elif "conv_in.weight" in info and any(k.startswith("down_blocks.0.resnets.0.") for k in info):
        if "class_embedding.linear_1.weight" in info:  # diffusers' Lotus keeps its task input there
            raise NotImplementedError(f"{p.name}: a diffusers-layout UNet with a class embedding (Lotus in "
                                      f"diffusers format): not supported yet; use the LDM-layout file")
        source, sub = _diffusers_model(p, info)
    elif layout_of(info) is not None:  # a family's own diffusers layout (SD3's, NextDiT's transformer)
        source, sub = _diffusers_model(p, info)
    else:
        source, sub = WeightSource.from_file(p), dict(info)
    view = {**_without_quant_keys(sub, source), **_markers(info)}
    rename, _ = reader_for_source(source)

    def read(key: str) -> torch.Tensor:
        if rename is None:
            return read_tensors(p, [source.prefix + key])[source.prefix + key]
        stored = next(k for k in info if rename(k) == key)
        return read_tensors(p, [stored])[stored]

    found = families.detect(view, read, source)
    if found is None:
        raise ValueError(f"{p.name}: not a diffusion model file that a model family recognises ({_describe(info)})")
    return _model_handle(found, source, prediction, weight_dtype=WEIGHT_DTYPES[weight_dtype])


def load_vae(path: str | os.PathLike, kind: str | None = None) -> VaeHandle:
    """VAELoader: LDM keys with or without ``first_stage_model.``, or diffusers keys; a file of
    another registered VAE architecture (``vae/arch_registry.py``: the Wan video VAEs) is that
    architecture's."""
    p = Path(path)
    if p.is_dir() and (p / "vae").is_dir():
        p = p / "vae"
    if p.is_dir():
        p = _find_weights(p, "diffusion_pytorch_model")
    info = inspect_file(p)
    other = vae_archs.recognise(info)  # an architecture other than the KL VAE (the Wan video VAEs)
    if other is not None:
        return VaeHandle(source=WeightSource.from_file(p, other.prefix, other.layout or "ldm"), config=other.config,
                         latent_format=other.latent_format, arch=other.arch)
    _refuse_family(p.name, info)
    if f"{VAE_PREFIX}decoder.conv_in.weight" in info:
        source = WeightSource.from_file(p, VAE_PREFIX)
    elif "decoder.conv_in.weight" in info and "encoder.down.0.block.0.conv1.weight" in info:
        source = WeightSource.from_file(p)
    elif "decoder.conv_in.weight" in info and "encoder.down_blocks.0.resnets.0.conv1.weight" in info:
        source = WeightSource.from_file(p, "", "diffusers_vae")
    elif "taesd_decoder.1.weight" in info or "decoder.layers.1.weight" in info:
        raise NotImplementedError(
            f"{p.name}: a single TAESD encoder or decoder file as a VAE: not supported yet; put both "
            f"taesd_encoder.* and taesd_decoder.* (or taesdxl_*) in models/vae_approx and pick the "
            f"VAE name 'taesd' (or 'taesdxl')")
    else:
        raise ValueError(f"{p.name}: not a KL VAE file ({_describe(info)})")
    return _vae_handle(source, info, kind)


TAESD_VAE_KINDS = {"taesd": "sd1", "taesdxl": "sdxl"}


def load_taesd_vae(name: str, encoder_path: str | os.PathLike, decoder_path: str | os.PathLike) -> TaesdVaeHandle:
    """VAELoader "taesd" / "taesdxl": the encoder/decoder pair from ``vae_approx`` as a VAE (ComfyUI
    nodes.py ``VAELoader.load_taesd``: scale 0.18215 resp. 0.13025, shift 0). The files are
    checked here; the weights are read when a node first runs the VAE."""
    if name not in TAESD_VAE_KINDS:
        raise NotImplementedError(f"VAE {name!r}: not supported yet (TAESD VAEs: taesd, taesdxl)")
    module = load_taesd_autoencoder(encoder_path, decoder_path, name)  # validates both layouts
    return TaesdVaeHandle(name=name, encoder_path=os.fspath(encoder_path), decoder_path=os.fspath(decoder_path),
                          latent_format=families.get("sd").latent_format(TAESD_VAE_KINDS[name],
                                                                          module.latent_channels))


_STANDALONE_CLIP_PREFIXES = (
    ("", None),
    ("cond_stage_model.transformer.", None),
    ("conditioner.embedders.0.transformer.", None),
    ("cond_stage_model.model.", None),
    ("conditioner.embedders.1.model.", None),
    ("conditioner.embedders.0.model.", None),
)


def _standalone_clip_source(path: Path, role: str | None = None):
    """(source, config) for a text-encoder file; role None = guess from the width."""
    info = inspect_file(path)
    _refuse_family(path.name, info)
    for prefix, _ in _STANDALONE_CLIP_PREFIXES:
        if is_open_clip(info, prefix):
            layout = "open_clip"
        elif any(k.startswith(prefix) and k.endswith("embeddings.token_embedding.weight") for k in info):
            layout = "hf_clip"
        else:
            continue
        source = WeightSource.from_file(path, prefix, layout)
        guess = role or _guess_clip_role(_clip_config(info, source, "clip_g"), layout)
        return source, _clip_config(info, source, guess)
    raise ValueError(f"{path.name}: not a CLIP text encoder ({_describe(info)})")


def _guess_clip_role(cfg: CLIPTextConfig, layout: str) -> str:
    if cfg.width == 1280:
        return "clip_g"
    if cfg.width == 1024 or layout == "open_clip":
        return "clip_h"
    return "clip_l"


def load_clip(paths: Sequence[str | os.PathLike], type: str = "stable_diffusion") -> ClipHandle:
    """CLIPLoader (one path, type "stable_diffusion": SD1 clip_l or SD2 clip_h),
    DualCLIPLoader (two paths, type "sdxl": clip_l + clip_g, matched by width, else by order) and,
    for any other type a registered family lists in its ``clip_types`` ("flux", "sd3", "chroma",
    ...; TripleCLIPLoader is "sd3"), that family variant's text-encoder slots filled from the
    files by architecture (``_dit_clip``). Other types: not supported yet."""
    paths = [Path(x) for x in paths]
    if type == "stable_diffusion":
        if len(paths) != 1:
            raise ValueError("CLIP type stable_diffusion takes one text encoder file")
        source, cfg = _standalone_clip_source(paths[0])
        role = _guess_clip_role(cfg, source.layout)
        if role == "clip_g":
            raise ValueError(f"{paths[0].name}: a 1280-wide (clip_g) encoder needs type 'sdxl' with a clip_l")
        source, cfg = _standalone_clip_source(paths[0], role)
        kind = "sd1" if role == "clip_l" else "sd2"
        return _clip_handle(families.get("sd").text_encoders(kind), {role: source}, {role: cfg})
    if type == "sdxl":
        if len(paths) != 2:
            raise ValueError("CLIP type sdxl takes two text encoder files (clip_l and clip_g)")
        found = [_standalone_clip_source(x) for x in paths]
        a, b = found
        if a[1].width > b[1].width:
            a, b = b, a
        la, lb = _standalone_clip_source(Path(a[0].path), "clip_l"), _standalone_clip_source(Path(b[0].path), "clip_g")
        return _clip_handle(families.get("sd").text_encoders("sdxl"), {"clip_l": la[0], "clip_g": lb[0]},
                            {"clip_l": la[1], "clip_g": lb[1]})
    candidates = clip_type_families(type)
    if not candidates:
        raise NotImplementedError(f"CLIP type {type!r}: not supported yet (mixgraph runs {supported()})")
    family = candidates[0] if len(candidates) == 1 else _family_by_files(type, candidates, paths)
    return _dit_clip(paths, type, family.text_encoders(family.clip_types[type]))


def clip_type_families(type: str) -> list[Any]:
    """The registered families whose ``clip_types`` name the CLIP loaders' ``type`` (ComfyUI's
    "lumina2" loads Gemma 2 for Lumina 2 and Qwen3 for Z-Image)."""
    return [f for f in families.FAMILIES.values() if type in (getattr(f, "clip_types", None) or {})]


def clip_type_family(type: str) -> Any:
    """The first registered family whose ``clip_types`` names ``type``, or None."""
    return next(iter(clip_type_families(type)), None)


def _family_by_files(type: str, candidates: Sequence[Any], paths: Sequence[Path]) -> Any:
    """Of several families that take CLIP ``type``, the first registered whose slots'
    architectures hold every file's (the files' architectures from their keys); when none
    does, the first (whose loading then names the file that fits no slot)."""
    archs = set()
    for path in paths:
        found = recognise(inspect_file(path))
        if found is not None:
            archs.add(found.arch)
    fitting = [f for f in candidates if archs <= {s.arch for s in f.text_encoders(f.clip_types[type])}]
    # none fits: the first names what it takes and which file fits no slot (``_dit_clip``)
    return fitting[0] if fitting else candidates[0]


def _expects(type: str, slots: Sequence[TextEncoderSlot]) -> str:
    names = [f"{s.name} ({s.arch}{', optional' if s.optional else ''})" for s in slots]
    return f"CLIP type {type!r} takes {', '.join(names)}"


def _dit_clip(paths: Sequence[Path], type: str, slots: Sequence[TextEncoderSlot]) -> ClipHandle:
    """The CLIP of a family's ``slots`` from text-encoder files: each file's architecture (from
    its keys, ``encoder_arch.recognise``) picks the slots it may fill; files of one architecture
    fill its slots narrowest first in slot order (clip_l 768 before clip_g 1280), and a single
    file among several slots of its architecture takes the widest slot only when it is 1280 or
    wider (CLIP-G), else the first."""
    by_arch: dict[str, list[tuple[Path, Info, Found]]] = {}
    for path in paths:
        info = inspect_file(path)
        _refuse_family(path.name, info)
        found = recognise(info)
        if found is None:
            raise ValueError(f"{path.name}: not a text encoder of a known architecture ({_describe(info)}); "
                             f"{_expects(type, slots)}")
        by_arch.setdefault(found.arch, []).append((path, info, found))
    sources: dict[str, WeightSource] = {}
    configs: dict[str, Any] = {}
    for arch_name, files in by_arch.items():
        fitting = [s for s in slots if s.arch == arch_name]
        if len(files) > len(fitting):
            extra = files[len(fitting):] if fitting else files
            raise ValueError(f"{', '.join(f[0].name for f in extra)}: a {arch_name} text encoder that fits no "
                             f"slot; {_expects(type, slots)}")
        files = sorted(files, key=lambda f: f[2].width)
        if len(files) < len(fitting):
            fitting = [fitting[-1]] if files[0][2].width >= 1280 else fitting[: len(files)]
        for slot, (path, info, found) in zip(fitting, files):
            arch = get_arch(arch_name)
            sources[slot.name] = WeightSource.from_file(path, found.prefix, found.layout)
            configs[slot.name] = arch.config(info, found, slot.name)
    missing = [s for s in slots if not s.optional and s.name not in sources]
    if missing:
        raise ValueError(f"CLIP type {type!r} needs {', '.join(f'{s.name} ({s.arch})' for s in missing)}, "
                         f"which the files given ({', '.join(p.name for p in paths)}) do not hold; "
                         f"{_expects(type, slots)}")
    return _clip_handle(slots, sources, configs)


def load_controlnet(path: str | os.PathLike) -> ControlNetHandle:
    """ControlNetLoader: LDM (``control_model.`` or bare) or diffusers ControlNet files; the key
    conversion and config derivation are ``nodes.adapters.controlnet``'s, run on the header here.
    T2I-Adapter files give a ``t2i_adapter.T2IAdapterHandle``."""
    p = Path(path)
    if p.is_dir():
        p = _find_weights(p, "diffusion_pytorch_model")
    info = inspect_file(p)
    # DiT ControlNets first: their blocks carry model-family keys (double_blocks.*) the refusal would read
    if is_sd35_controlnet(info):  # Stability's SD3.5 nets (sd35_controlnet.py)
        return _load_sd35_controlnet(p, info)
    if is_mmdit_controlnet(info):  # diffusers-layout SD3 nets (InstantX; sd3_mmdit_controlnet.py)
        return MMDiTControlNetHandle(source=WeightSource.from_file(p, "", MMDIT_CN_LAYOUT),
                                     config=mmdit_controlnet_config(info))
    if is_flux_mistoline_controlnet(info):  # MistoLine's Flux nets (flux_controlnet.py)
        return FluxControlNetHandle(source=WeightSource.from_file(p, "", MISTOLINE_LAYOUT),
                                    config=mistoline_controlnet_config(info))
    if is_flux_xlabs_controlnet(info):  # XLabs' Flux nets: BFL names as stored (flux_controlnet.py)
        return FluxControlNetHandle(source=WeightSource.from_file(p, "", "ldm"), config=xlabs_controlnet_config(info))
    if is_flux_instantx_controlnet(info):  # diffusers-layout Flux nets (InstantX, union; flux_controlnet.py)
        return FluxControlNetHandle(source=WeightSource.from_file(p, "", FLUX_CN_LAYOUT),
                                    config=flux_controlnet_config(info))
    _refuse_family(p.name, info)
    if is_t2i_adapter(info):  # ComfyUI's ControlNetLoader loads T2I-Adapters too
        return load_t2i_adapter(p, info)
    if is_control_lora(info):  # built on the sampled model's UNet (control_lora.py)
        return ControlLoraHandle(path=p)
    cfg = controlnet_config_from_state_dict(convert_controlnet_state_dict(info))
    return ControlNetHandle(source=WeightSource.from_file(p, "", "controlnet"), config=cfg)


def _load_sd35_controlnet(p: Path, info) -> SD35ControlNetHandle:
    """The config from the header, the ``control_type`` scalar (canny / depth preprocessing) read."""
    control_type = -1
    if "control_type" in info:
        control_type = round(float(read_tensors(p, ["control_type"])["control_type"].reshape(-1)[0]))
    cfg = sd35_config_from_shapes({k2: v for k, v in info.items() if (k2 := sd35_rename(k)) is not None},
                                  control_type)
    return SD35ControlNetHandle(source=WeightSource.from_file(p, "", SD35_LAYOUT), config=cfg)


def load_diff_controlnet(path: str | os.PathLike, model: ModelHandle) -> ControlNetHandle:
    """DiffControlNetLoader: a file with the ``difference`` marker stores ControlNet − UNet for the
    weights they share; ComfyUI adds the model's UNet weights to every ``control_model.*`` key whose
    ``diffusion_model.*`` counterpart exists. Here that addition is a merge patch (strengths 1, 1)
    on the handle, so the model's shared weights are never touched. Other files load as
    ControlNetLoader does (the model is unused)."""
    p = Path(path)
    if p.is_dir():
        p = _find_weights(p, "diffusion_pytorch_model")
    info = inspect_file(p)
    if not any(k in info for k in DIFF_MARKERS):
        return load_controlnet(p)
    if not any(k.startswith("control_model.") for k in info):
        raise ValueError(f"{p}: a diff ControlNet without control_model.* keys is not supported yet")
    cfg = controlnet_config_from_state_dict(convert_diff_controlnet(info))
    add_model = MergePatch("controlnet", model.source, model.config, tuple(model.patches), (1.0, 1.0),
                           kind="unet", build=families.get(model.family).build)
    return ControlNetHandle(source=WeightSource.from_file(p, "", "controlnet_diff"), config=cfg,
                            patches=(add_model,))
