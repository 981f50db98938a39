"""Loader nodes: checkpoints, diffusion models, text encoders, VAEs, LoRAs, ControlNets.

Loaders return handles (recipes); weights are read when a consuming node materializes them in the
storage dtype its policy asks for (nodes/weights/store.py). Each file input is a `ModelFile`
(nodes/helpers/model_files.py): its combo, its fingerprint in the cache key (replacing a file under the
same name re-runs what depends on it), its family check and its path come from that one declaration.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.node import Combo, Float, Socket, node
from mixgraph.nodes.helpers.model_files import (CHECKPOINT, CONTROLNET, DIFFUSION_MODEL, LORA, TEXT_ENCODER,
                                                ModelFile, other_family)
from mixgraph.nodes.families import refused as families
from mixgraph.nodes.models import loader
from mixgraph.nodes.adapters.lora import load_lora_patches


@node(category="loaders", outputs=("MODEL", "CLIP", "VAE"), display_name="Load Checkpoint")
def CheckpointLoaderSimple(ctx, ckpt_name=CHECKPOINT.input()):
    """Loads a diffusion model checkpoint (UNet, text encoders, VAE) from one file or folder."""
    return loader.load_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name))


CONFIG_NAMES = ("v1-inference.yaml", "v1-inference_fp16.yaml", "v1-inpainting-inference.yaml",
                "v2-inference.yaml", "v2-inference-v.yaml", "v2-inpainting-inference.yaml",
                "sd_xl_base.yaml", "sd_xl_refiner.yaml")


@node(category="advanced/loaders", outputs=("MODEL", "CLIP", "VAE"),
      display_name="Load Checkpoint With Config (DEPRECATED)")
def CheckpointLoader(ctx, config_name=Combo(CONFIG_NAMES), ckpt_name=CHECKPOINT.input()):
    """ComfyUI's deprecated loader: the config only selects v-prediction for *-v.yaml files."""
    prediction = "v_prediction" if config_name.endswith("-v.yaml") else None
    return loader.load_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name), prediction=prediction)


WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")


@node(category="advanced/loaders", outputs=("MODEL",), display_name="Load Diffusion Model")
def UNETLoader(ctx, unet_name=DIFFUSION_MODEL.input(), weight_dtype=Combo(WEIGHT_DTYPES)):
    return (loader.load_unet(DIFFUSION_MODEL.path(ctx.env, unet_name), weight_dtype=weight_dtype),)


CLIP_TYPES = ("stable_diffusion", "stable_cascade", "sd3", "stable_audio", "mochi", "ltxv",
              "pixart", "cosmos", "lumina2", "wan", "hidream", "chroma", "ace", "omnigen2",
              "qwen_image", "hunyuan_image")
DUAL_CLIP_TYPES = ("sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image")


CLIP_TYPE_FAMILIES = {
    "stable_cascade": "Stable Cascade", "sd3": "SD3 / SD3.5", "stable_audio": "Stable Audio", "mochi": "Mochi",
    "ltxv": "LTX-Video", "pixart": "PixArt", "cosmos": "Cosmos", "lumina2": "Lumina 2", "wan": "Wan",
    "hidream": "HiDream", "chroma": "Chroma", "ace": "ACE-Step (audio)", "omnigen2": "OmniGen2",
    "qwen_image": "Qwen-Image", "hunyuan_image": "HunyuanImage", "flux": "Flux", "hunyuan_video": "Hunyuan Video",
}


def _clip_type_supported(env: Any, type: str | None = None) -> list[str]:
    """The CLIP type's family: SD's types, or a registered family whose ``clip_types`` names it
    (the files' own families are their inputs' checks)."""
    if type is not None and type not in ("stable_diffusion", "sdxl") and loader.clip_type_family(type) is None:
        family = CLIP_TYPE_FAMILIES.get(type, type)
        return [f"CLIP type {type!r}: " + families.refusal(family)]
    return []


@node(category="advanced/loaders", outputs=("CLIP",), display_name="Load CLIP",
      validate=_clip_type_supported)
def CLIPLoader(ctx, clip_name=TEXT_ENCODER.input(), type=Combo(CLIP_TYPES),
               device=Combo(("default", "cpu"), optional=True)):
    return (loader.load_clip([TEXT_ENCODER.path(ctx.env, clip_name)], type),)


@node(category="advanced/loaders", outputs=("CLIP",), display_name="DualCLIPLoader",
      validate=_clip_type_supported)
def DualCLIPLoader(ctx, clip_name1=TEXT_ENCODER.input(), clip_name2=TEXT_ENCODER.input(),
                   type=Combo(DUAL_CLIP_TYPES), device=Combo(("default", "cpu"), optional=True)):
    paths = [TEXT_ENCODER.path(ctx.env, n) for n in (clip_name1, clip_name2)]
    return (loader.load_clip(paths, type),)


def _sd3_supported(env: Any) -> list[str]:
    return _clip_type_supported(env, "sd3")


@node(category="advanced/loaders", outputs=("CLIP",), display_name="TripleCLIPLoader",
      validate=_sd3_supported, description="[Recipes]\n\nsd3: clip-l, clip-g, t5")
def TripleCLIPLoader(ctx, clip_name1=TEXT_ENCODER.input(), clip_name2=TEXT_ENCODER.input(),
                     clip_name3=TEXT_ENCODER.input()):
    """SD3 / SD3.5's three text encoders (CLIP-L, CLIP-G, T5-XXL, in any order: each file's
    architecture and width say which it is)."""
    paths = [TEXT_ENCODER.path(ctx.env, n) for n in (clip_name1, clip_name2, clip_name3)]
    return (loader.load_clip(paths, "sd3"),)


TAESD_VAE_NAMES = ("taesd", "taesdxl")
APPROX = ModelFile("vae_approx")


def _taesd_halves(env: Any, name: str) -> tuple[str | None, str | None]:
    """The first ``vae_approx`` files named ``<name>_encoder.*`` / ``<name>_decoder.*`` (ComfyUI's
    ``load_taesd`` takes the first match of ``startswith``)."""
    files = APPROX.options(env)
    enc = next((f for f in files if f.startswith(f"{name}_encoder.")), None)
    dec = next((f for f in files if f.startswith(f"{name}_decoder.")), None)
    return enc, dec


class VaeFile(ModelFile):
    """VAELoader's input: a vae folder file, or "taesd" / "taesdxl" (a pair of halves in
    vae_approx, fingerprinted both), or "pixel_space"."""

    def options(self, env: Any) -> list[str]:
        """ComfyUI nodes.py ``VAELoader.vae_list``: the vae folder's files, then "taesd" /
        "taesdxl" where ``vae_approx`` holds both halves, then "pixel_space" (ComfyUI also lists
        taesd3 / taef1 and video TAEs: out of scope)."""
        names = super().options(env)
        names += [n for n in TAESD_VAE_NAMES if all(_taesd_halves(env, n))]
        return names + ["pixel_space"]

    def fingerprint(self, env: Any, name: Any) -> Any:
        if name in TAESD_VAE_NAMES:
            return tuple(APPROX.fingerprint(env, half) for half in _taesd_halves(env, name))
        return super().fingerprint(env, name)


VAE = VaeFile("vae", refuse=other_family)


@node(category="loaders", outputs=("VAE",), display_name="Load VAE")
def VAELoader(ctx, vae_name=VAE.input()):
    """Loads a VAE file, or TAESD ("taesd" / "taesdxl": the encoder/decoder pair in vae_approx)."""
    if vae_name in TAESD_VAE_NAMES:
        enc, dec = _taesd_halves(ctx.env, vae_name)
        if enc is None or dec is None:
            raise ValueError(f"VAE {vae_name!r} needs both {vae_name}_encoder.* and {vae_name}_decoder.* "
                             f"in models/vae_approx")
        return (loader.load_taesd_vae(vae_name, APPROX.path(ctx.env, enc), APPROX.path(ctx.env, dec)),)
    if vae_name == "pixel_space":
        raise NotImplementedError("VAE 'pixel_space' (ComfyUI's pixel-space VAE): not supported yet")
    return (loader.load_vae(VAE.path(ctx.env, vae_name)),)


@node(category="loaders", outputs=("MODEL", "CLIP"), display_name="Load LoRA")
def LoraLoader(ctx, model=Socket("MODEL"), clip=Socket("CLIP"), lora_name=LORA.input(),
               strength_model=Float(1.0, min=-100.0, max=100.0, step=0.01),
               strength_clip=Float(1.0, min=-100.0, max=100.0, step=0.01)):
    """Adds a LoRA's patches to new MODEL and CLIP handles (nothing is mutated)."""
    if strength_model == 0 and strength_clip == 0:
        return model, clip
    path = LORA.path(ctx.env, lora_name)
    return load_lora_patches(path, model, clip, strength_model, strength_clip, warn=ctx.warn)


@node(category="loaders", outputs=("MODEL",), display_name="LoraLoaderModelOnly")
def LoraLoaderModelOnly(ctx, model=Socket("MODEL"), lora_name=LORA.input(),
                        strength_model=Float(1.0, min=-100.0, max=100.0, step=0.01)):
    if strength_model == 0:
        return (model,)
    path = LORA.path(ctx.env, lora_name)
    return (load_lora_patches(path, model, None, strength_model, 0.0, warn=ctx.warn)[0],)


@node(category="loaders", outputs=("CONTROL_NET",), display_name="Load ControlNet Model")
def ControlNetLoader(ctx, control_net_name=CONTROLNET.input()):
    return (loader.load_controlnet(CONTROLNET.path(ctx.env, control_net_name)),)
