"""ComfyUI-GGUF's loader nodes (city96/ComfyUI-GGUF ``nodes.py``, 795e451) as mixgraph's own:
``UnetLoaderGGUF``, ``UnetLoaderGGUFAdvanced``, ``CLIPLoaderGGUF``, ``DualCLIPLoaderGGUF``,
``TripleCLIPLoaderGGUF``, with the pack's class names, inputs, category ("bootleg") and titles, so
workflows made with the pack run without it.

A ``.gguf`` file is an ordinary weight file to the runtime (``nodes/weights/gguf_file.py``:
``inspect_file`` and the weight store read it), so it loads through the same loaders as UNETLoader
/ CLIPLoader (``loader.load_unet`` / ``loader.load_clip``: the registered families detect it from
its keys and shapes); its quantised weights stay quantised in memory and are dequantised per layer
when the model runs (``nodes/weights/gguf_tensor.py``); a LoRA patches the dequantised weight, as
ComfyUI-GGUF does. What is GGUF-specific is checked here first: the file's
``general.architecture`` (ComfyUI-GGUF's image-architecture list for UnetLoaderGGUF, and the
family it names against the family its keys give) and text encoders converted by llama.cpp that
are not renamed ("llama" files), refused by name.

UnetLoaderGGUFAdvanced's options: mixgraph dequantises in float32 and casts to the region's
compute dtype, and merges patches in float32 (at load, on the CPU), so ``dequant_dtype`` /
``patch_dtype`` "default", "target" and "float32" all mean that and ``patch_on_device`` (where
ComfyUI-GGUF keeps the patches) changes nothing; float16 / bfloat16 dequantisation or patching
(a rounding step ComfyUI-GGUF adds) is refused as not supported yet.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mixgraph.graph.node import Boolean, Combo, node
from mixgraph.nodes.declare.loaders.loading import CLIP_TYPE_FAMILIES, CLIP_TYPES, DUAL_CLIP_TYPES
from mixgraph.nodes.families import refused as families
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.helpers.model_files import ModelFile, other_family
from mixgraph.nodes.models import loader
from mixgraph.nodes.models.handles import ClipHandle, ModelHandle
from mixgraph.nodes.weights import gguf_file
from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file

log = logging.getLogger(__name__)

#: GGUF ``general.architecture`` -> the mixgraph family that runs it (a file whose keys give
#: another family is refused: the file is mislabelled or of another model)
ARCH_FAMILIES = {"sd1": "sd", "sdxl": "sd", "flux": "flux", "sd3": "sd3", "lumina2": ("lumina2", "z_image")}


@dataclass(frozen=True)
class GGUFModelFile(ModelFile):
    """A models-folder file input listing the files with ``extensions`` (ComfyUI-GGUF's
    ``unet_gguf`` lists ``.gguf`` files only; its CLIP loaders list the folder's files and ``.gguf``)."""

    extensions: tuple[str, ...] = (gguf_file.GGUF_SUFFIX,)

    def options(self, env: Any) -> list[str]:
        return folders.list_files(env, self.folder, self.extensions) if env is not None else []


def _contents(path: Path) -> gguf_file.GGUFContents:
    try:
        return gguf_file.contents(path)
    except gguf_file.GGUFFileError as e:
        raise WeightFileError(str(e)) from e


def _gguf_problem(path: Path, where: str, image: bool) -> str | None:
    """Validation of a ``.gguf`` file: unreadable, of the wrong kind, or of a refused family."""
    try:
        c = _contents(path)
        problem = (gguf_file.image_arch_problem(c) if image else None) or gguf_file.llm_refusal(c)
        family = families.detect_family(inspect_file(path)) if problem is None else None
    except WeightFileError as e:
        return f"{where}: {e}"
    if problem is not None:
        return f"{where}: {problem}"
    return families.refusal(family, where) if family is not None else None


def unet_problem(path: Path, where: str) -> str | None:
    """UnetLoaderGGUF's check of its file (header only)."""
    return _gguf_problem(path, where, image=True)


def clip_problem(path: Path, where: str) -> str | None:
    """The GGUF CLIP loaders' check: a ``.gguf`` file as above, any other as CLIPLoader's."""
    if gguf_file.is_gguf(path):
        return _gguf_problem(path, where, image=False)
    return other_family(path, where)


UNET_GGUF = GGUFModelFile("diffusion_models", refuse=unet_problem)
CLIP_GGUF = GGUFModelFile("text_encoders", refuse=clip_problem,
                          extensions=(*folders.MODEL_EXTENSIONS, gguf_file.GGUF_SUFFIX))


def load_unet_gguf(path: str | os.PathLike) -> ModelHandle:
    """UnetLoaderGGUF: the diffusion model of a GGUF file, detected from its keys as UNETLoader
    detects a safetensors file (``loader.load_unet``); refused when its ``general.architecture``
    is no image model or names another family than its keys give."""
    p = Path(path)
    c = _contents(p)
    problem = gguf_file.image_arch_problem(c) or gguf_file.llm_refusal(c)
    if problem is not None:
        raise ValueError(problem)
    log.info("%s: GGUF %s, tensor types %s", p.name, c.architecture, c.type_counts())
    handle = loader.load_unet(p)
    expected = ARCH_FAMILIES.get(c.architecture or "")
    if expected is not None and handle.family not in ((expected,) if isinstance(expected, str) else expected):
        raise ValueError(f"{p.name}: the GGUF file says architecture {c.architecture!r}, but its tensors are a "
                         f"{handle.family} model ({handle.kind}); the file is mislabelled or damaged")
    return handle


def load_clip_gguf(paths: Sequence[str | os.PathLike], type: str) -> ClipHandle:
    """CLIPLoaderGGUF / DualCLIPLoaderGGUF / TripleCLIPLoaderGGUF: text encoders from GGUF or
    other weight files, as ``loader.load_clip`` loads them; a llama.cpp-named GGUF is refused."""
    for path in paths:
        if gguf_file.is_gguf(path):
            problem = gguf_file.llm_refusal(_contents(Path(path)))
            if problem is not None:
                raise NotImplementedError(problem)
    return loader.load_clip(list(paths), type)


# --------------------------------------------------------------------------------------------
# the nodes

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
