"""What an SD 1.x / 2.x / SDXL diffusion model is, from its keys and shapes (ComfyUI's
``model_detection.py`` + ``supported_models.py`` for the UNet families).

The UNet config comes from tensor shapes (``unet.unet_config_from_state_dict``); the variant
("sd1", "sd2", "sdxl", "sdxl_refiner", "sd2_x4") from the text encoders stored beside it when the
file is a checkpoint (their checkpoint prefixes, or a diffusers folder's ``text_encoder_2``), else
from the UNet's structure (``variant_of_config``). What shapes cannot tell is set per variant:

* Prediction type: SD2 is v-prediction when the std of the last output block's first
  ``transformer_blocks.0.norm1.bias`` exceeds 0.09 (ComfyUI tests ``output_blocks.11``, the last
  block of a real SD2 UNet; needs ``read``); SDXL-family files carry ``v_pred`` / ``ztsnr`` marker
  keys; an SDXL file with ``edm_mean`` and ``edm_std`` is Playground v2.5 (EDM, σ 0.002..80, its
  latent format; Comfy-Org/ComfyUI 01f03bbd).
* SD2.1 unCLIP (an SD2 UNet with a 1536/2048-wide vector input): the image-embedding noise
  augmentor, v-prediction unless a ``v_pred`` marker says otherwise.
* Lotus (an SD2 UNet with a 4-wide vector input, ``lotus.py``): its task embedding, x0 on the
  unscaled input.
* The x4 upscaler (ComfyUI ``SD_X4Upscaler``): 8 heads at every width, the low-resolution image
  input, the 0.0001..0.02 schedule, always v-prediction.
* Stable Zero123 (``cc_projection.*`` beside an SD1 UNet of 8 input channels): the camera
  projection applied to the context.
* SDPose: the keypoint heatmap head stored next to the UNet.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from mixgraph.nodes.families.base import Detection
from mixgraph.nodes.families.sd.parts import SDParts
from mixgraph.nodes.vae.latent_format import PLAYGROUND_V2_5
from mixgraph.nodes.families.sd.lotus import PREDICTION as LOTUS_PREDICTION
from mixgraph.nodes.families.sd.lotus import is_lotus
from mixgraph.nodes.families.sd.lotus import task_embedding as lotus_task_embedding
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.families.sd.sdpose import HeatmapHeadWeights
from mixgraph.nodes.families.sd.unclip import NoiseAugmentor
from mixgraph.nodes.families.sd.unet import UNetConfig, unet_config_from_state_dict
from mixgraph.nodes.families.sd.x4_upscaler import BETA_RANGE, ImageAugmentor, is_x4_upscaler, x4_unet_config
from mixgraph.nodes.families.sd.zero123 import CameraProjectionWeights, is_zero123

__all__ = ["detect_sd", "variant_of_config", "unclip_augmentor", "CHECKPOINT_ENCODERS", "UNCLIP_ADM"]

UNCLIP_ADM = (1536, 2048)  # SD2.1 unCLIP: 2 × the CLIP vision projection (ViT-L 768, ViT-H 1024)

#: variant -> {encoder: (checkpoint prefix, layout)} (comfy-conventions §8), in the order a
#: checkpoint's text encoders decide its variant (SDXL's clip_g before the refiner's, before SD2's
#: OpenCLIP, before SD1's clip_l).
CHECKPOINT_ENCODERS: dict[str, dict[str, tuple[str, str]]] = {
    "sdxl": {
        "clip_l": ("conditioner.embedders.0.transformer.", "hf_clip"),
        "clip_g": ("conditioner.embedders.1.model.", "open_clip"),
    },
    "sdxl_refiner": {"clip_g": ("conditioner.embedders.0.model.", "open_clip")},
    "sd2": {"clip_h": ("cond_stage_model.model.", "open_clip")},
    "sd1": {"clip_l": ("cond_stage_model.transformer.", "hf_clip")},
}
_DECIDING = {"sdxl": "clip_g", "sdxl_refiner": "clip_g", "sd2": "clip_h", "sd1": "clip_l"}


def variant_of_config(cfg: UNetConfig) -> str:
    """The variant from a UNet config alone (ComfyUI's supported_models matching, by structure)."""
    if is_x4_upscaler(cfg):
        return "sd2_x4"  # SD 2.x x4 upscaler: 7 input channels, noise-level class labels
    if is_lotus(cfg):
        return "sd2"  # Lotus: an SD2 UNet with a 4-wide task-switcher input (``lotus.py``)
    if cfg.adm_in_channels in UNCLIP_ADM and cfg.context_dim == 1024:
        return "sd2"  # SD2.1 unCLIP L / H (``unclip_augmentor``)
    if cfg.adm_in_channels is not None:
        if cfg.adm_in_channels == 2560 or cfg.model_channels == 384 or cfg.context_dim == 1280:
            return "sdxl_refiner"
        return "sdxl"
    return "sd2" if cfg.use_linear_in_transformer else "sd1"


def _variant_of_encoders(info: Mapping[str, Any]) -> str | None:
    """The variant the text encoders stored beside the UNet say: a checkpoint's prefixes, or a
    diffusers folder's ``text_encoder`` / ``text_encoder_2`` keys (the loader adds those)."""
    keys = tuple(info)
    if any(k.startswith("text_encoder_2.") for k in keys):
        return "sdxl" if any(k.startswith("text_encoder.") for k in keys) else "sdxl_refiner"
    for variant, encoder in _DECIDING.items():
        prefix = CHECKPOINT_ENCODERS[variant][encoder][0]
        if any(k.startswith(prefix) for k in keys):
            return variant
    return None


def _sd2_is_v(info: Mapping[str, Any], cfg: UNetConfig, read: Callable[[str], torch.Tensor] | None) -> bool:
    n_out = sum(n + 1 for n in cfg.num_res_blocks)
    key = f"output_blocks.{n_out - 1}.1.transformer_blocks.0.norm1.bias"
    if read is None or cfg.in_channels != 4 or key not in info:
        return False
    return float(read(key).float().std()) > 0.09


def unclip_augmentor(variant: str, cfg: UNetConfig) -> NoiseAugmentor | None:
    """An SD2-family UNet with a vector input is SD2.1 unCLIP: y = [noised image embedding,
    its noise level's embedding], each half of ``adm_in_channels`` (ComfyUI ``SD21UNCLIP``)."""
    if variant != "sd2" or cfg.adm_in_channels is None or is_lotus(cfg):
        return None
    if cfg.adm_in_channels % 2:
        raise ValueError(f"an SD2 UNet with a {cfg.adm_in_channels}-wide vector input is not an unCLIP model")
    return NoiseAugmentor(cfg.adm_in_channels // 2)


def _is_playground(variant: str, info: Mapping[str, Any]) -> bool:
    return variant == "sdxl" and "edm_mean" in info and "edm_std" in info


def _prediction(variant: str, info: Mapping[str, Any], cfg: UNetConfig, read) -> tuple[str, bool]:
    if "edm_vpred.sigma_max" in info:
        raise NotImplementedError("EDM v-prediction checkpoints (edm_vpred marker keys): not supported yet")
    if "edm_mean" in info:
        if _is_playground(variant, info):
            return "edm", False
        raise NotImplementedError(f"an {variant} checkpoint with EDM marker keys (edm_mean) that is not Playground "
                                  f"v2.5 (an SDXL model with edm_mean and edm_std): not supported yet")
    if "v_pred" in info:
        return "v_prediction", "ztsnr" in info
    if variant == "sd2" and _sd2_is_v(info, cfg, read):
        return "v_prediction", False
    return "eps", False


def _zero123(cfg: UNetConfig, info: Mapping[str, Any], source: WeightSource | None,
             where: str) -> CameraProjectionWeights:
    """Stable Zero123: an SD 1.x UNet taking 8 channels (latent + input view's latent), eps,
    SD1 latent format, with the checkpoint's ``cc_projection`` (ComfyUI's ``Stable_Zero123``)."""
    if source is None:
        raise ValueError(f"{where}: a Stable Zero123 camera projection needs the file it is read from")
    cc = CameraProjectionWeights.from_info(dataclasses.replace(source, prefix="", layout="zero123_cc"), info, where)
    if cfg.in_channels != 2 * cfg.out_channels or cfg.adm_in_channels is not None:
        raise ValueError(f"{where}: a cc_projection (Stable Zero123) with a UNet of {cfg.in_channels} input "
                         f"channels{' and a vector input' if cfg.adm_in_channels else ''}; Stable Zero123's "
                         f"takes {2 * cfg.out_channels} (latent + the input view's latent) and no vector")
    if cc.config.out_features != cfg.context_dim:
        raise ValueError(f"{where}: cc_projection gives {cc.config.out_features}-wide context; the UNet "
                         f"attends to {cfg.context_dim}")
    return cc


def _where(source: WeightSource | None) -> str:
    return os.path.basename(source.path) if source is not None and source.path else "state dict"


def detect_sd(info: Mapping[str, Any], read: Callable[[str], torch.Tensor] | None = None,
              source: WeightSource | None = None, latent_format=None) -> Detection | None:
    """The SD Detection for ``info`` (see ``base.Family.detect``), or None when it holds no LDM
    UNet. ``latent_format(variant, channels)`` gives a variant's own latent format."""
    if "input_blocks.0.0.weight" not in info or "out.2.weight" not in info:
        return None
    where = _where(source)
    cfg = unet_config_from_state_dict(info)
    fields: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    if is_zero123(info):  # its cond_stage_model.model.* is a CLIP image tower, not SD2's text encoder
        cc = _zero123(cfg, info, source, where)
        return Detection("sd", "sd1", cfg, {"prediction": "eps", "parts": SDParts(cc_projection=cc),
                                            "latent_format": latent_format("sd1", cfg.out_channels)})
    variant = _variant_of_encoders(info) or variant_of_config(cfg)
    pred, zsnr = _prediction(variant, info, cfg, read)
    unclip = unclip_augmentor(variant, cfg)
    if unclip is not None:
        parts["unclip"] = unclip
        if "v_pred" not in info:
            pred = "v_prediction"  # ComfyUI's SD21UNCLIP is a v-prediction model
    if is_x4_upscaler(cfg):
        if source is not None and source.layout == "diffusers_unet":
            raise NotImplementedError(f"{where}: the x4 upscaler as a diffusers folder is not supported yet "
                                      f"(use the single-file x4-upscaler-ema.safetensors)")
        variant = "sd2_x4"
        cfg = x4_unet_config(cfg)
        parts["x4"] = ImageAugmentor()
        fields["beta_range"] = BETA_RANGE
        pred = "v_prediction"
    elif variant == "sd2" and is_lotus(cfg):
        parts["task_embedding"] = lotus_task_embedding()
        pred = LOTUS_PREDICTION
    fields.update(prediction=pred, zsnr=zsnr, latent_format=latent_format(variant, cfg.out_channels))
    if _is_playground(variant, info):
        fields.update(continuous_sampling=("edm", 0.002, 80.0), latent_format=PLAYGROUND_V2_5)
    if source is not None and source.layout == "ldm":
        head = HeatmapHeadWeights.from_unet(source, info, where)
        if head is not None:
            parts["heatmap_head"] = head
    if parts:
        fields["parts"] = SDParts(**parts)
    return Detection("sd", variant, cfg, fields)
