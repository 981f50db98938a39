"""Recognise weight files of model families mixgraph does not run, from key names alone.

mixgraph runs the families registered in ``nodes/families/registry.py``. A loader given a file of
another family (Flux, SD3, video or audio models, ...) refuses with "model family X is not
supported (mixgraph runs SD 1.x, SD 2.x and SDXL)", at validation when the file's header can be read
cheaply (safetensors, diffusers folders) and again at load time. A registered family that names
a row of ``_DIFFUSION`` in its ``refusals`` (``base.Family``) takes those files over when its
``detect`` recognises them, so a new family needs no edit of these tables. A text-encoder file
(``_TEXT_ENCODERS``) stops being refused when its architecture is registered with the text
encoders (``encoders/encoder_arch.py``) and a registered family's ``clip_types`` variant has a slot
of that architecture.

The characteristic keys are the ones ComfyUI's ``comfy/model_detection.py`` tests to tell its
model classes apart (diffusion models), plus the text-encoder and VAE layouts of those families.
Keys are matched after stripping a checkpoint prefix (``model.diffusion_model.``, ...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mixgraph.nodes.encoders.encoder_arch import recognise
from mixgraph.nodes.families import registry
from mixgraph.nodes.vae import arch_registry as vae_archs
from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file

__all__ = ["detect_family", "family_of_file", "refusal", "UnsupportedFamilyError", "supported",
           "CONTROLNET_MARKERS"]

_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.model.", "model.", "net.", "")

#: keys of DiT ControlNets (Flux XLabs / InstantX, SD3), whose blocks carry their family's model keys
CONTROLNET_MARKERS = frozenset({"controlnet_blocks.0.weight", "controlnet_blocks.0.linear.weight"})

# (family, keys that must all be present after a prefix); first match wins, so the more specific
# signature of two families sharing a layout (Hunyuan Video / Chroma vs Flux) comes first.
_DIFFUSION = (
    ("Hunyuan Video", ("double_blocks.0.img_attn.qkv.weight", "txt_in.individual_token_refiner.blocks.0.norm1.weight")),
    ("Chroma Radiance", ("double_blocks.0.img_attn.qkv.weight", "nerf_blocks.0.norm.scale")),
    ("Flux.2", ("double_blocks.0.img_attn.qkv.weight", "double_stream_modulation_img.lin.weight")),
    ("Chroma", ("double_blocks.0.img_attn.qkv.weight", "distilled_guidance_layer.in_proj.weight")),
    ("Flux", ("double_blocks.0.img_attn.qkv.weight",)),
    ("SD3 / SD3.5", ("joint_blocks.0.context_block.attn.qkv.weight",)),
    ("AuraFlow", ("double_layers.0.attn.w1q.weight",)),
    ("HunyuanDiT", ("mlp_t5.0.weight",)),
    ("Stable Cascade", ("clf.1.weight",)),
    ("Stable Cascade", ("clip_txt_mapper.weight",)),
    ("Stable Audio", ("transformer.rotary_pos_emb.inv_freq",)),
    ("LTX-Video", ("adaln_single.emb.timestep_embedder.linear_1.bias", "caption_projection.linear_1.weight")),
    ("PixArt", ("t_block.1.weight",)),
    ("Mochi", ("t5_yproj.weight",)),
    ("Cosmos", ("blocks.block0.blocks.0.block.attn.to_q.0.weight",)),
    ("Cosmos", ("x_embedder.proj.1.weight",)),
    # Wan variants with parts the Wan family does not build (ComfyUI's camera, s2v, humo, animate, ref_conv)
    ("Wan camera control", ("head.modulation", "control_adapter.conv.weight")),
    ("Wan 2.2 S2V (sound to video)", ("head.modulation", "casual_audio_encoder.encoder.final_linear.weight")),
    ("Wan HuMo", ("head.modulation", "audio_proj.audio_proj_glob_1.layer.bias")),
    ("Wan 2.2 Animate", ("head.modulation", "face_adapter.fuser_blocks.0.k_norm.weight")),
    ("Wan with a reference-image conv (ref_conv)", ("head.modulation", "ref_conv.weight")),
    ("Wan", ("head.modulation", "patch_embedding.weight")),
    # NextDiT variants beyond Lumina 2 / Z-Image (ComfyUI's NextDiT options siglip_feat_dim, clip_text_dim)
    ("Z-Image Omni", ("cap_embedder.1.weight", "siglip_embedder.1.weight")),
    ("NextDiT with pooled CLIP text (NewBie)", ("cap_embedder.1.weight", "clip_text_pooled_proj.1.weight")),
    ("Lumina 2", ("cap_embedder.1.weight",)),
    ("HiDream", ("caption_projection.0.linear.weight",)),
    ("ACE-Step (audio)", ("genre_embedder.weight",)),
    ("Qwen-Image-Layered", ("txt_norm.weight", "time_text_embed.addition_t_embedding.weight")),
    ("Qwen-Image (Nunchaku quantized)", ("txt_norm.weight", "transformer_blocks.0.attn.to_qkv.qweight")),
    ("Qwen-Image", ("txt_norm.weight", "img_in.weight")),
    # temporal ResBlocks: SVD img2vid, SV3D (ComfyUI's use_temporal_resblock); Stable Zero123 runs
    ("Stable Video Diffusion (SVD img2vid / SV3D)", ("input_blocks.1.0.time_stack.in_layers.0.weight",)),
)

_TEXT_ENCODERS = (
    ("T5 text encoder (SD3 / Flux / PixArt / video models)", ("encoder.block.0.layer.0.SelfAttention.q.weight",)),
    ("T5 text encoder (SD3 / Flux / PixArt / video models)", ("encoder.blocks.0.attn.q.weight",)),  # umT5 (Wan)
    ("LLM text encoder (Hunyuan Video / Lumina 2 / HiDream / Qwen-Image / ...)",
     ("model.layers.0.self_attn.q_proj.weight",)),
)

_VIDEO_VAE = (
    ("Wan", ("decoder.head.0.gamma",)),
    ("Stable Audio", ("encoder.layers.0.weight_g",)),
    ("Stable Audio", ("encoder.layers.0.weight_v",)),
)


class UnsupportedFamilyError(NotImplementedError):
    pass


def supported() -> str:
    """The registered families, as messages name them ("SD 1.x / 2.x / SDXL, ...")."""
    return ", ".join(f.display for f in registry.FAMILIES.values())


def refusal(family: str, where: str = "") -> str:
    head = f"{where}: " if where else ""
    return f"{head}model family {family} is not supported (mixgraph runs {supported()})"


def _match(keys: set[str], table) -> tuple[str, str] | None:
    """(family, checkpoint prefix) of the first row whose keys are all present, or None."""
    for family, needed in table:
        for prefix in _PREFIXES:
            if all(prefix + k in keys for k in needed):
                return family, prefix
    return None


def _claimed(family: str, info, prefix: str) -> bool:
    """Whether a registered family runs the files of the refused ``family`` (it names that row
    in its ``refusals``) and recognises the diffusion model under ``prefix``. A family must name
    the row: SD's detection alone would take an SVD UNet (an SD UNet plus temporal layers)."""
    takers = [f for f in registry.FAMILIES.values() if family in getattr(f, "refusals", ())]
    if not takers:
        return False
    sub = {k[len(prefix):]: v for k, v in info.items() if k.startswith(prefix)}
    return any(f.detect(sub) is not None for f in takers)


def _encoder_claimed(info) -> bool:
    """Whether a registered family runs this text-encoder file: its architecture (from its keys,
    ``encoder_arch.recognise``) is that of a slot of a variant the family's ``clip_types`` name
    (a T5 file loads once a Flux / SD3 / Chroma family is registered)."""
    found = recognise(info)
    if found is None:
        return False
    for family in registry.FAMILIES.values():
        for variant in set((getattr(family, "clip_types", None) or {}).values()):
            if any(slot.arch == found.arch for slot in family.text_encoders(variant)):
                return True
    return False


def detect_family(info) -> str | None:
    """The unsupported family a file's tensors belong to, or None (an SD file, or unknown).
    ``info``: key → TensorInfo (``safetensors_io.inspect_file``) or key → shape sequence."""
    keys = set(info)
    if keys & CONTROLNET_MARKERS:  # a DiT ControlNet: ControlNetLoader loads it or names its format
        return None
    diffusion = _match(keys, _DIFFUSION)
    if diffusion is not None:
        # a file whose diffusion model a registered family runs is that family's, text encoders
        # and autoencoder included (an SD3 checkpoint's T5 and 16-channel VAE)
        return None if _claimed(diffusion[0], info, diffusion[1]) else diffusion[0]
    encoder = _match(keys, _TEXT_ENCODERS)
    if encoder is not None and not _encoder_claimed(info):
        return encoder[0]
    if vae_archs.runs(info):  # a VAE architecture mixgraph runs (the Wan VAEs)
        return None
    found = _match(keys, _VIDEO_VAE)
    if found:
        return found[0]
    for prefix in ("first_stage_model.", "vae.", ""):
        entry = info.get(prefix + "decoder.conv_in.weight")
        if entry is None:
            continue
        shape = tuple(getattr(entry, "shape", entry))
        if len(shape) == 5:
            return "video model (3-D VAE)"
    return None  # a 2-D KL VAE of any latent width (Flux's / SD3's 16 channels too): vae/vae.py runs it


def _named(row: str) -> bool:
    """Whether a registered family runs the files of the refused ``row`` (names it in its
    ``refusals``), for rows recognised without a diffusion model to detect (a VAE, a pipeline
    folder: the loader then checks the model itself)."""
    return any(row in getattr(f, "refusals", ()) for f in registry.FAMILIES.values())


_PIPELINES = {  # diffusers model_index.json _class_name prefix -> family
    "Flux": "Flux", "StableDiffusion3": "SD3 / SD3.5", "AuraFlow": "AuraFlow", "HunyuanDiT": "HunyuanDiT",
    "HunyuanVideo": "Hunyuan Video", "LTX": "LTX-Video", "Mochi": "Mochi", "Cosmos": "Cosmos", "Wan": "Wan",
    "StableAudio": "Stable Audio", "StableCascade": "Stable Cascade", "Wuerstchen": "Stable Cascade",
    "PixArt": "PixArt", "Lumina": "Lumina 2", "HiDream": "HiDream", "QwenImage": "Qwen-Image",
    "StableVideoDiffusion": "Stable Video Diffusion", "Kandinsky": "Kandinsky", "IF": "DeepFloyd IF",
}


def _folder_family(folder: Path) -> str | None:
    index = folder / "model_index.json"
    if not index.is_file():
        return None
    try:
        name = str(json.loads(index.read_text()).get("_class_name", ""))
    except (OSError, ValueError, AttributeError):
        return None
    for prefix, family in _PIPELINES.items():
        if name.startswith(prefix):
            # a registered family naming the row loads the folder (or says by name what it lacks)
            return None if _named(family) else family
    return None


def family_of_file(path: str | os.PathLike) -> str | None:
    """Cheap check for validation: a safetensors header (no tensor data) or a diffusers folder's
    model_index.json; None for anything else (pickles are not opened here) or unreadable files
    (the loader reports those)."""
    p = Path(path)
    if p.is_dir():
        return _folder_family(p)
    if p.suffix.lower() not in (".safetensors", ".sft"):
        return None
    try:
        info = inspect_file(p)
    except (WeightFileError, OSError):
        return None
    return detect_family(info)

