"""Loader nodes: checkpoints, diffusion models, text encoders, VAEs, LoRAs, ControlNets.

Loaders return handles (recipes); weights are read when a consuming node materializes them in the
storage dtype its policy asks for (nodes/models/store.py). Each loader's cache key carries the
file's fingerprint, so replacing a file under the same name re-runs what depends on it.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo, Float, Socket, node
from mixgraph.nodes import folders
from mixgraph.nodes.models import families, loader
from mixgraph.nodes.models.lora import load_lora_patches


def _fingerprint(folder: str, *inputs: str):
    def fingerprint(env: Any, **literals: Any):
        prints = []
        for name in inputs:
            try:
                prints.append(fingerprint_file(folders.resolve(env, folder, literals[name])))
            except (folders.FolderError, KeyError, OSError):
                prints.append(None)
        return tuple(prints)

    return fingerprint


def _family_check(folder: str, *inputs: str):
    """Validation: refuse files of model families mixgraph does not run (``models/families.py``),
    from their safetensors header or diffusers model_index.json only."""
    def validate(env: Any, **literals: Any) -> list[str]:
        found = []
        for name in inputs:
            value = literals.get(name)
            if not isinstance(value, str):
                continue
            try:
                path = folders.resolve(env, folder, value)
            except (folders.FolderError, OSError):
                continue  # the combo check reports a missing file
            family = families.family_of_file(path)
            if family is not None:
                found.append(families.refusal(family, f"{name} {value!r}"))
        return found

    return validate


@node(category="loaders", outputs=("MODEL", "CLIP", "VAE"), display_name="Load Checkpoint",
      fingerprint=_fingerprint("checkpoints", "ckpt_name"), validate=_family_check("checkpoints", "ckpt_name"))
def CheckpointLoaderSimple(ctx, ckpt_name=Combo(folders.options("checkpoints"))):
    """Loads a diffusion model checkpoint (UNet, text encoders, VAE) from one file or folder."""
    return loader.load_checkpoint(folders.resolve(ctx.env, "checkpoints", ckpt_name))


CONFIG_NAMES = ("v1-inference.yaml", "v1-inference_fp16.yaml", "v1-inpainting-inference.yaml",
                "v2-inference.yaml", "v2-inference-v.yaml", "v2-inpainting-inference.yaml",
                "sd_xl_base.yaml", "sd_xl_refiner.yaml")


@node(category="advanced/loaders", outputs=("MODEL", "CLIP", "VAE"),
      display_name="Load Checkpoint With Config (DEPRECATED)",
      fingerprint=_fingerprint("checkpoints", "ckpt_name"), validate=_family_check("checkpoints", "ckpt_name"))
def CheckpointLoader(ctx, config_name=Combo(CONFIG_NAMES),
                     ckpt_name=Combo(folders.options("checkpoints"))):
    """ComfyUI's deprecated loader: the config only selects v-prediction for *-v.yaml files."""
    prediction = "v_prediction" if config_name.endswith("-v.yaml") else None
    return loader.load_checkpoint(folders.resolve(ctx.env, "checkpoints", ckpt_name),
                                  prediction=prediction)


WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")


@node(category="advanced/loaders", outputs=("MODEL",), display_name="Load Diffusion Model",
      fingerprint=_fingerprint("diffusion_models", "unet_name"),
      validate=_family_check("diffusion_models", "unet_name"))
def UNETLoader(ctx, unet_name=Combo(folders.options("diffusion_models")),
               weight_dtype=Combo(WEIGHT_DTYPES)):
    return (loader.load_unet(folders.resolve(ctx.env, "diffusion_models", unet_name),
                             weight_dtype=weight_dtype),)


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
_clip_files = _family_check("text_encoders", "clip_name", "clip_name1", "clip_name2")


def _clip_type_supported(env: Any, type: str | None = None, **literals: Any) -> list[str]:
    if type is not None and type not in ("stable_diffusion", "sdxl"):
        family = CLIP_TYPE_FAMILIES.get(type, type)
        return [f"CLIP type {type!r}: " + families.refusal(family)]
    return _clip_files(env, **literals)


@node(category="advanced/loaders", outputs=("CLIP",), display_name="Load CLIP",
      fingerprint=_fingerprint("text_encoders", "clip_name"), validate=_clip_type_supported)
def CLIPLoader(ctx, clip_name=Combo(folders.options("text_encoders")), type=Combo(CLIP_TYPES),
               device=Combo(("default", "cpu"), optional=True)):
    return (loader.load_clip([folders.resolve(ctx.env, "text_encoders", clip_name)], type),)


@node(category="advanced/loaders", outputs=("CLIP",), display_name="DualCLIPLoader",
      fingerprint=_fingerprint("text_encoders", "clip_name1", "clip_name2"),
      validate=_clip_type_supported)
def DualCLIPLoader(ctx, clip_name1=Combo(folders.options("text_encoders")),
                   clip_name2=Combo(folders.options("text_encoders")), type=Combo(DUAL_CLIP_TYPES),
                   device=Combo(("default", "cpu"), optional=True)):
    paths = [folders.resolve(ctx.env, "text_encoders", n) for n in (clip_name1, clip_name2)]
    return (loader.load_clip(paths, type),)


TAESD_VAE_NAMES = ("taesd", "taesdxl")


def _taesd_halves(env: Any, name: str) -> tuple[str | None, str | None]:
    """The first ``vae_approx`` files named ``<name>_encoder.*`` / ``<name>_decoder.*`` (ComfyUI's
    ``load_taesd`` takes the first match of ``startswith``)."""
    files = folders.list_files(env, "vae_approx") if env is not None else []
    enc = next((f for f in files if f.startswith(f"{name}_encoder.")), None)
    dec = next((f for f in files if f.startswith(f"{name}_decoder.")), None)
    return enc, dec


def vae_options(env: Any) -> list[str]:
    """ComfyUI nodes.py ``VAELoader.vae_list``: the vae folder's files, then "taesd" / "taesdxl"
    where ``vae_approx`` holds both halves, then "pixel_space" (ComfyUI also lists taesd3 / taef1
    and video TAEs: out of scope)."""
    names = folders.list_files(env, "vae") if env is not None else []
    names += [n for n in TAESD_VAE_NAMES if all(_taesd_halves(env, n))]
    return names + ["pixel_space"]


def _vae_fingerprint(env: Any, **literals: Any):
    name = literals.get("vae_name")
    if name in TAESD_VAE_NAMES:
        prints = []
        for half in _taesd_halves(env, name):
            try:
                prints.append(fingerprint_file(folders.resolve(env, "vae_approx", half)))
            except (folders.FolderError, OSError, TypeError):
                prints.append(None)
        return tuple(prints)
    return _fingerprint("vae", "vae_name")(env, **literals)


@node(category="loaders", outputs=("VAE",), display_name="Load VAE",
      fingerprint=_vae_fingerprint, validate=_family_check("vae", "vae_name"))
def VAELoader(ctx, vae_name=Combo(vae_options)):
    """Loads a VAE file, or TAESD ("taesd" / "taesdxl": the encoder/decoder pair in vae_approx)."""
    if vae_name in TAESD_VAE_NAMES:
        enc, dec = _taesd_halves(ctx.env, vae_name)
        if enc is None or dec is None:
            raise ValueError(f"VAE {vae_name!r} needs both {vae_name}_encoder.* and {vae_name}_decoder.* "
                             f"in models/vae_approx")
        return (loader.load_taesd_vae(vae_name, folders.resolve(ctx.env, "vae_approx", enc),
                                      folders.resolve(ctx.env, "vae_approx", dec)),)
    if vae_name == "pixel_space":
        raise NotImplementedError("VAE 'pixel_space' (ComfyUI's pixel-space VAE): not supported yet")
    return (loader.load_vae(folders.resolve(ctx.env, "vae", vae_name)),)


@node(category="loaders", outputs=("MODEL", "CLIP"), display_name="Load LoRA",
      fingerprint=_fingerprint("loras", "lora_name"))
def LoraLoader(ctx, model=Socket("MODEL"), clip=Socket("CLIP"),
               lora_name=Combo(folders.options("loras")),
               strength_model=Float(1.0, min=-100.0, max=100.0, step=0.01),
               strength_clip=Float(1.0, min=-100.0, max=100.0, step=0.01)):
    """Adds a LoRA's patches to new MODEL and CLIP handles (nothing is mutated)."""
    if strength_model == 0 and strength_clip == 0:
        return model, clip
    path = folders.resolve(ctx.env, "loras", lora_name)
    return load_lora_patches(path, model, clip, strength_model, strength_clip, warn=ctx.warn)


@node(category="loaders", outputs=("MODEL",), display_name="LoraLoaderModelOnly",
      fingerprint=_fingerprint("loras", "lora_name"))
def LoraLoaderModelOnly(ctx, model=Socket("MODEL"), lora_name=Combo(folders.options("loras")),
                        strength_model=Float(1.0, min=-100.0, max=100.0, step=0.01)):
    if strength_model == 0:
        return (model,)
    path = folders.resolve(ctx.env, "loras", lora_name)
    return (load_lora_patches(path, model, None, strength_model, 0.0, warn=ctx.warn)[0],)


@node(category="loaders", outputs=("CONTROL_NET",), display_name="Load ControlNet Model",
      fingerprint=_fingerprint("controlnet", "control_net_name"),
      validate=_family_check("controlnet", "control_net_name"))
def ControlNetLoader(ctx, control_net_name=Combo(folders.options("controlnet"))):
    return (loader.load_controlnet(folders.resolve(ctx.env, "controlnet", control_net_name)),)
