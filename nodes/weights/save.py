"""Write models back to disk in ComfyUI's layouts (comfy/sd.py ``save_checkpoint``, CLIPSave, VAESave).

What is saved is each handle's weights **after** its patches (LoRA, merges, attention scales),
materialized through the weight store in the storage dtype the caller asks for. Layouts:

- single-file checkpoint (CheckpointSave): where each part goes is the model family's
  ``checkpoint_layout(variant)`` (``families/base.py: CheckpointLayout``). SD: UNet
  ``model.diffusion_model.*``, VAE ``first_stage_model.*``, text encoders SD1
  ``cond_stage_model.transformer.text_model.*`` (HF layout), SD2 ``cond_stage_model.model.*``
  (OpenCLIP layout), SDXL ``conditioner.embedders.0.transformer.*`` +
  ``conditioner.embedders.1.model.*``, refiner ``conditioner.embedders.0.model.*``. A
  v-prediction model gets the ``v_pred`` marker key (and ``ztsnr`` with a zero-terminal-SNR
  schedule); a layout with an ``architecture`` (SDXL) gets ComfyUI's ``modelspec.*`` metadata;
  what the family keeps beside the model (``checkpoint_extras``: Stable Zero123's
  ``cc_projection.*``) goes at the top level. A family without ``checkpoint_layout`` is refused
  by name ("not supported yet").
- ModelSave / diff saves: the diffusion model's own keys (``unet_state_dict``, built by its family).
- CLIPSave: one file per encoder, HF layout without prefix (``text_model.*``).
- VAESave: LDM VAE keys without prefix.

OpenCLIP's layout is rebuilt from our HF layout by ``hf_to_open_clip`` (the inverse of
``clip.open_clip_to_hf``: q/k/v stacked into ``in_proj``, ``text_projection`` transposed back).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.base import CheckpointLayout
from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.quantized import module_state_dict
from mixgraph.nodes.vae.vae import AutoencoderKL

__all__ = ["unet_state_dict", "clip_state_dicts", "vae_state_dict", "hf_to_open_clip", "checkpoint_state_dict",
           "checkpoint_layout", "checkpoint_metadata", "prompt_metadata", "write_safetensors"]


def _plain(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # safetensors refuses shared storage and non-contiguous views; give each tensor its own copy
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


@torch.inference_mode()
def unet_state_dict(model, dtype: torch.dtype) -> dict[str, Tensor]:
    """The MODEL handle's diffusion model weights (patches merged), the family model's own keys
    (SD: our LDM keys) without prefix.

    (Materialization runs in inference mode, as every consumer's does: cached entries built
    there are inference tensors, which a module outside it may not take.)"""
    build = families.get(model.family).build
    m = store.materialize("unet", model.source, model.config, dtype, model.patches, build, stream=False)
    return _plain(module_state_dict(m))


def checkpoint_layout(model, variant: str | None = None) -> CheckpointLayout:
    """The single-file checkpoint layout of a MODEL handle's family, for ``variant`` (default the
    handle's own, ``Family.checkpoint_layout``); a family that has none is refused by name."""
    family = families.get(model.family)
    layout = getattr(family, "checkpoint_layout", None)
    if layout is None:
        raise NotImplementedError(f"saving a {family.display} ({family.name!r}) model as a checkpoint is "
                                  f"not supported yet")
    return layout(model.kind if variant is None else variant)


@torch.inference_mode()
def clip_state_dicts(clip, dtype: torch.dtype) -> dict[str, dict[str, Tensor]]:
    """encoder name → its weights (patches merged) in HF layout (``text_model.*``)."""
    out = {}
    for e in clip.encoders:
        patches = tuple(p for p in clip.patches if getattr(p, "target", e.name) == e.name)
        m = store.materialize(e.name, e.source, e.config, dtype, patches, e.build, stream=False)
        out[e.name] = _plain({k: v for k, v in module_state_dict(m).items() if not k.endswith("position_ids")})
    return out


@torch.inference_mode()
def vae_state_dict(vae, dtype: torch.dtype) -> dict[str, Tensor]:
    m = store.materialize("vae", vae.source, vae.config, dtype, (), getattr(vae, "build", AutoencoderKL),
                          stream=False)
    return _plain(module_state_dict(m))


_TOP = {
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
}
_BLOCK = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "self_attn.out_proj": "attn.out_proj",
          "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}
_LAYER = re.compile(r"text_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def hf_to_open_clip(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """HF CLIP text keys → OpenCLIP text-tower keys (no prefix)."""
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}
    for key, value in sd.items():
        if key in _TOP:
            out[_TOP[key]] = value
        elif key == "text_projection.weight":
            out["text_projection"] = value.t().contiguous()  # [P, W] -> [W, P]
        elif m := _LAYER.match(key):
            n, name, kind = m.groups()
            if name in _BLOCK:
                out[f"transformer.resblocks.{n}.{_BLOCK[name]}.{kind}"] = value
            elif name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                qkv.setdefault((n, kind), {})[name[10]] = value
            else:
                raise KeyError(f"no OpenCLIP name for CLIP key {key}")
        else:
            raise KeyError(f"no OpenCLIP name for CLIP key {key}")
    for (n, kind), parts in qkv.items():
        out[f"transformer.resblocks.{n}.attn.in_proj_{kind}"] = torch.cat(
            [parts["q"], parts["k"], parts["v"]], dim=0).contiguous()  # 3 x [W, ...] -> [3W, ...]
    return out


def checkpoint_state_dict(model=None, clip=None, vae=None, dtypes: Mapping[str, torch.dtype] | None = None
                          ) -> dict[str, Tensor]:
    """One single-file checkpoint in the layout of ``model``'s family variant (SD: LDM/SGM); the
    text encoders go where a checkpoint of the CLIP's variant keeps them. ``dtypes`` maps
    "MODEL" / "CLIP" / "VAE" to the storage dtype each part is written in (default float32)."""
    if model is None:
        raise ValueError("a checkpoint needs its MODEL: the family's layout says where each part goes")
    dtypes = dict(dtypes or {})
    out: dict[str, Tensor] = {}
    layout = checkpoint_layout(model)
    family = families.get(model.family)
    out.update({layout.diffusion + k: v for k, v in unet_state_dict(model, dtypes.get("MODEL", torch.float32)).items()})
    extras = getattr(family, "checkpoint_extras", None)  # what the variant keeps beside the model
    if extras is not None:
        out.update(_plain(extras(model, dtypes.get("MODEL", torch.float32))))
    if model.prediction == "v_prediction":
        out["v_pred"] = torch.tensor([])
        if model.zsnr:
            out["ztsnr"] = torch.tensor([])
    if clip is not None:
        clip_layout = layout if clip.kind == model.kind else checkpoint_layout(model, clip.kind)
        for name, sd in clip_state_dicts(clip, dtypes.get("CLIP", torch.float32)).items():
            where = clip_layout.text_encoder(name)
            if where is None:
                raise ValueError(f"a {clip.kind} checkpoint has no place for a {name} text encoder")
            prefix, key_layout = where
            if key_layout == "open_clip":
                sd = hf_to_open_clip(sd)
            out.update({prefix + k: v for k, v in sd.items()})
    if vae is not None:
        out.update({layout.vae + k: v for k, v in vae_state_dict(vae, dtypes.get("VAE", torch.float32)).items()})
    return out


def prompt_metadata(prompt: Any = None, extra_pnginfo: Mapping[str, Any] | None = None) -> dict[str, str]:
    """ComfyUI's workflow metadata: ``prompt`` (JSON, "" without one) and one JSON entry per
    extra_pnginfo key (``workflow``)."""
    meta = {"prompt": json.dumps(prompt) if prompt is not None else ""}
    for key, value in (extra_pnginfo or {}).items():
        meta[str(key)] = json.dumps(value)
    return meta


def checkpoint_metadata(model, title: str) -> dict[str, str]:
    """ComfyUI's ``modelspec.*`` entries (a layout with an ``architecture``: SDXL) and the
    prediction key."""
    meta: dict[str, str] = {}
    arch = checkpoint_layout(model).architecture
    if arch is not None:
        meta.update({"modelspec.architecture": arch, "modelspec.sai_model_spec": "1.0.0",
                     "modelspec.implementation": "sgm", "modelspec.title": title})
    if model.prediction == "eps":
        meta["modelspec.predict_key"] = "epsilon"
    elif model.prediction == "v_prediction":
        meta["modelspec.predict_key"] = "v"
    return meta


def write_safetensors(path: str | os.PathLike, sd: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None
                      ) -> None:
    """Write atomically (a temporary name, then rename), so a failed save leaves no partial file."""
    path = os.fspath(path)
    tmp = path + ".partial"
    try:
        save_file(dict(sd), tmp, metadata=dict(metadata) if metadata else None)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
