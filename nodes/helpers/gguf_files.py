"""GGUF files for ComfyUI-GGUF's loader nodes: which files they list, what validation refuses,
and how a file loads (through the same loaders as UNETLoader / CLIPLoader).

A ``.gguf`` file is an ordinary weight file to the runtime (``nodes/weights/gguf_file.py``:
``inspect_file`` and the weight store read it, quantised weights stay quantised), so loading one
is ``loader.load_unet`` / ``loader.load_clip`` on its path: the registered families detect it from
its keys and shapes. What is GGUF-specific is checked here first: the file's
``general.architecture`` (ComfyUI-GGUF's image-architecture list for UnetLoaderGGUF, and the
family it names against the family its keys give), and text encoders converted by llama.cpp
(tensors named ``blk.N.*``), which are refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mixgraph.nodes.families import refused
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.helpers.model_files import ModelFile, other_family
from mixgraph.nodes.models import loader
from mixgraph.nodes.models.handles import ClipHandle, ModelHandle
from mixgraph.nodes.weights import gguf_file
from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file

__all__ = ["GGUFModelFile", "UNET_GGUF", "CLIP_GGUF", "unet_problem", "clip_problem", "load_unet_gguf",
           "load_clip_gguf", "ARCH_FAMILIES"]

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
        family = refused.detect_family(inspect_file(path)) if problem is None else None
    except WeightFileError as e:
        return f"{where}: {e}"
    if problem is not None:
        return f"{where}: {problem}"
    return refused.refusal(family, where) if family is not None else None


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
