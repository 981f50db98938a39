"""Saving nodes (comfy_extras nodes_model_merging.py: CheckpointSave, CLIPSave, VAESave, ModelSave;
nodes_lora_extract.py: LoraSave).

Files go under the output folder as ``<prefix>_<counter:05>_.safetensors`` (ComfyUI's counter
rule, shared with SaveImage), in ComfyUI's key layouts, holding the weights after every patch
(``nodes/weights/save.py``). Each part is written in the storage dtype of its resolved precision.
As in ComfyUI they return no UI payload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mixgraph.graph.env import writable_folder
from mixgraph.graph.node import Boolean, Combo, Hidden, Int, Result, Socket, String, node
from mixgraph.nodes.helpers.folders import safe_join
from mixgraph.nodes.helpers.imaging import next_counter
from mixgraph.nodes.adapters import lora_extract
from mixgraph.nodes.weights import save
from mixgraph.nodes.helpers.precision import effective

_CATEGORY = "advanced/model_merging"


def _target(ctx: Any, prefix: str) -> tuple[Path, str, int]:
    """(folder, file stem, counter) for ``prefix`` under the output folder."""
    root = Path(ctx.env.output)
    target = safe_join(root, prefix)
    folder, stem = target.parent, target.name
    writable_folder(folder, "output folder")
    return folder, stem, next_counter(folder, stem)


def _save_checkpoint(ctx, model, clip, vae, filename_prefix, prompt, extra_pnginfo) -> Result:
    folder, stem, counter = _target(ctx, filename_prefix)
    dtypes = {"MODEL": effective(ctx, model, "MODEL").storage}
    if clip is not None:
        dtypes["CLIP"] = effective(ctx, clip, "CLIP").storage
    if vae is not None:
        dtypes["VAE"] = effective(ctx, vae, "VAE").storage
    sd = save.checkpoint_state_dict(model, clip, vae, dtypes)
    meta = save.checkpoint_metadata(model, f"{stem} {counter}")
    meta.update(save.prompt_metadata(prompt, extra_pnginfo))
    path = folder / f"{stem}_{counter:05}_.safetensors"
    save.write_safetensors(path, sd, meta)
    return Result()


@node(category=_CATEGORY, outputs=(), output_node=True, display_name="Save Checkpoint")
def CheckpointSave(ctx, model=Socket("MODEL"), clip=Socket("CLIP"), vae=Socket("VAE"),
                   filename_prefix=String("checkpoints/ComfyUI"), prompt=Hidden("PROMPT"),
                   extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes MODEL, CLIP and VAE as one single-file checkpoint in the LDM/SGM layout."""
    return _save_checkpoint(ctx, model, clip, vae, filename_prefix, prompt, extra_pnginfo)


@node(category=_CATEGORY, outputs=(), output_node=True)
def ModelSave(ctx, model=Socket("MODEL"), filename_prefix=String("diffusion_models/ComfyUI"),
              prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes the diffusion model alone (``model.diffusion_model.*`` keys)."""
    return _save_checkpoint(ctx, model, None, None, filename_prefix, prompt, extra_pnginfo)


@node(category=_CATEGORY, outputs=(), output_node=True)
def CLIPSave(ctx, clip=Socket("CLIP"), filename_prefix=String("clip/ComfyUI"), prompt=Hidden("PROMPT"),
             extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes each text encoder to its own file ``<prefix>_<encoder>_<counter>_`` in HF layout."""
    meta = {"format": "pt", **save.prompt_metadata(prompt, extra_pnginfo)}
    for name, sd in save.clip_state_dicts(clip, effective(ctx, clip, "CLIP").storage).items():
        folder, stem, counter = _target(ctx, f"{filename_prefix}_{name}")
        path = folder / f"{stem}_{counter:05}_.safetensors"
        save.write_safetensors(path, sd, meta)
    return Result()


@node(category=_CATEGORY, outputs=(), output_node=True)
def VAESave(ctx, vae=Socket("VAE"), filename_prefix=String("vae/ComfyUI_vae"), prompt=Hidden("PROMPT"),
            extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes the VAE in the LDM layout without prefix."""
    folder, stem, counter = _target(ctx, filename_prefix)
    path = folder / f"{stem}_{counter:05}_.safetensors"
    save.write_safetensors(path, save.vae_state_dict(vae, effective(ctx, vae, "VAE").storage),
                           save.prompt_metadata(prompt, extra_pnginfo))
    return Result()


@node(category="_for_testing", outputs=(), output_node=True)
def LoraSave(ctx, filename_prefix=String("loras/ComfyUI_extracted_lora"),
             rank=Int(8, min=1, max=4096, step=1), lora_type=Combo(lora_extract.LORA_TYPES),
             bias_diff=Boolean(True), model_diff=Socket("MODEL", optional=True),
             text_encoder_diff=Socket("CLIP", optional=True)):
    """Extracts a LoRA from a weight difference (ModelMergeSubtract / CLIPMergeSubtract output)
    and writes it as ``<prefix>_<counter:05>_.safetensors``; with neither input it does nothing."""
    if model_diff is None and text_encoder_diff is None:
        return Result()
    lora: dict = {}
    if model_diff is not None:
        sd = save.unet_state_dict(model_diff, effective(ctx, model_diff, "MODEL").storage)
        lora.update(lora_extract.lora_from_diff(sd, rank, lora_type, bias_diff, "diffusion_model."))
    if text_encoder_diff is not None:
        storage = effective(ctx, text_encoder_diff, "CLIP").storage
        for name, sd in save.clip_state_dicts(text_encoder_diff, storage).items():
            lora.update(lora_extract.lora_from_diff(sd, rank, lora_type, bias_diff,
                                                    f"text_encoders.{name}.transformer."))
    folder, stem, counter = _target(ctx, filename_prefix)
    save.write_safetensors(folder / f"{stem}_{counter:05}_.safetensors", lora)
    return Result()
