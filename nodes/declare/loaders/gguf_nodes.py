"""ComfyUI-GGUF's loader nodes (city96/ComfyUI-GGUF ``nodes.py``, 795e451) as mixgraph's own:
``UnetLoaderGGUF``, ``UnetLoaderGGUFAdvanced``, ``CLIPLoaderGGUF``, ``DualCLIPLoaderGGUF``,
``TripleCLIPLoaderGGUF``, with the pack's class names, inputs, category ("bootleg") and titles, so
workflows made with the pack run without it.

A ``.gguf`` file loads through the same loaders as UNETLoader / CLIPLoader
(``nodes/helpers/gguf_files.py``); its quantised weights stay quantised in memory and are
dequantised per layer when the model runs (``nodes/weights/gguf_tensor.py``); a LoRA patches the
dequantised weight, as ComfyUI-GGUF does.

UnetLoaderGGUFAdvanced's options: mixgraph dequantises in float32 and casts to the region's
compute dtype, and merges patches in float32 (at load, on the CPU), so ``dequant_dtype`` /
``patch_dtype`` "default", "target" and "float32" all mean that and ``patch_on_device`` (where
ComfyUI-GGUF keeps the patches) changes nothing; float16 / bfloat16 dequantisation or patching
(a rounding step ComfyUI-GGUF adds) is refused as not supported yet.
"""

from __future__ import annotations

from typing import Any

from mixgraph.graph.node import Boolean, Combo, node
from mixgraph.nodes.declare.loaders.loading import CLIP_TYPE_FAMILIES, CLIP_TYPES, DUAL_CLIP_TYPES
from mixgraph.nodes.families import refused as families
from mixgraph.nodes.helpers.gguf_files import CLIP_GGUF, UNET_GGUF, load_clip_gguf, load_unet_gguf
from mixgraph.nodes.models import loader

CATEGORY = "bootleg"  # ComfyUI-GGUF's
DTYPE_OPTIONS = ("default", "target", "float32", "float16", "bfloat16")
SAME_AS_DEFAULT = ("default", "target", "float32")


@node(category=CATEGORY, outputs=("MODEL",), display_name="Unet Loader (GGUF)")
def UnetLoaderGGUF(ctx, unet_name=UNET_GGUF.input()):
    """A diffusion model from a GGUF file (models/diffusion_models or models/unet, *.gguf)."""
    return (load_unet_gguf(UNET_GGUF.path(ctx.env, unet_name)),)


def _dtypes_supported(env: Any, dequant_dtype: str | None = None, patch_dtype: str | None = None) -> list[str]:
    return [f"{name} {value!r}: not supported yet (mixgraph dequantises GGUF weights and merges patches in "
            f"float32, then casts to the compute dtype; choose one of {', '.join(SAME_AS_DEFAULT)}, and a "
            f"precision region for half-precision compute)"
            for name, value in (("dequant_dtype", dequant_dtype), ("patch_dtype", patch_dtype))
            if value is not None and value not in SAME_AS_DEFAULT]


@node(category=CATEGORY, outputs=("MODEL",), display_name="Unet Loader (GGUF/Advanced)",
      validate=_dtypes_supported)
def UnetLoaderGGUFAdvanced(ctx, unet_name=UNET_GGUF.input(), dequant_dtype=Combo(DTYPE_OPTIONS, "default"),
                           patch_dtype=Combo(DTYPE_OPTIONS, "default"), patch_on_device=Boolean(False)):
    """UnetLoaderGGUF with ComfyUI-GGUF's numeric options (see the module docstring)."""
    problems = _dtypes_supported(None, dequant_dtype, patch_dtype)
    if problems:
        raise NotImplementedError("; ".join(problems))
    return (load_unet_gguf(UNET_GGUF.path(ctx.env, unet_name)),)


def _clip_type_supported(env: Any, type: str | None = None) -> list[str]:
    """As CLIPLoader's: the CLIP type's family runs here."""
    if type is not None and type not in ("stable_diffusion", "sdxl") and loader.clip_type_family(type) is None:
        return [f"CLIP type {type!r}: " + families.refusal(CLIP_TYPE_FAMILIES.get(type, type))]
    return []


def _sd3_supported(env: Any) -> list[str]:
    return _clip_type_supported(env, "sd3")


@node(category=CATEGORY, outputs=("CLIP",), display_name="CLIPLoader (GGUF)", validate=_clip_type_supported)
def CLIPLoaderGGUF(ctx, clip_name=CLIP_GGUF.input(), type=Combo(CLIP_TYPES)):
    """A text encoder from a GGUF or other weight file (models/text_encoders or models/clip)."""
    return (load_clip_gguf([CLIP_GGUF.path(ctx.env, clip_name)], type),)


@node(category=CATEGORY, outputs=("CLIP",), display_name="DualCLIPLoader (GGUF)", validate=_clip_type_supported)
def DualCLIPLoaderGGUF(ctx, clip_name1=CLIP_GGUF.input(), clip_name2=CLIP_GGUF.input(),
                       type=Combo(DUAL_CLIP_TYPES)):
    paths = [CLIP_GGUF.path(ctx.env, n) for n in (clip_name1, clip_name2)]
    return (load_clip_gguf(paths, type),)


@node(category=CATEGORY, outputs=("CLIP",), display_name="TripleCLIPLoader (GGUF)", validate=_sd3_supported)
def TripleCLIPLoaderGGUF(ctx, clip_name1=CLIP_GGUF.input(), clip_name2=CLIP_GGUF.input(),
                         clip_name3=CLIP_GGUF.input()):
    """SD3's three text encoders (ComfyUI-GGUF's type "sd3")."""
    paths = [CLIP_GGUF.path(ctx.env, n) for n in (clip_name1, clip_name2, clip_name3)]
    return (load_clip_gguf(paths, "sd3"),)
