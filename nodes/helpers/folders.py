"""Model folders: which files a combo lists, and where a combo value points on disk.

Folder keys and aliases are ComfyUI's (DESIGN §6). Combo values are paths relative to a folder
root, with "/" separators. An `extra_model_paths.yaml` (next to the models folder, or named by the
env setting `extra_model_paths`) adds roots from an existing ComfyUI or A1111 install. Every
folder ends with its namesake under `nodes/models/data/models` (the embedded model and what was
made for it), so those are listed, and load, everywhere (a user file of the same name wins).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from mixgraph.nodes.models.shapes import EMBEDDED_MODELS

FOLDERS: dict[str, tuple[str, ...]] = {
    # key: (subfolder names searched, first is canonical)
    "checkpoints": ("checkpoints", "Stable-diffusion"),
    "vae": ("vae", "VAE"),
    "loras": ("loras", "Lora", "LyCORIS"),
    "controlnet": ("controlnet", "ControlNet", "t2i_adapter"),
    "embeddings": ("embeddings",),
    "diffusion_models": ("diffusion_models", "unet"),
    "text_encoders": ("text_encoders", "clip"),
    "upscale_models": ("upscale_models", "ESRGAN", "RealESRGAN"),
    "diffusers": ("diffusers",),
    "vae_approx": ("vae_approx",),
    "clip_vision": ("clip_vision",),
    "style_models": ("style_models",),
    "gligen": ("gligen",),
    "hypernetworks": ("hypernetworks",),
    "photomaker": ("photomaker",),
    "fonts": ("fonts",),
    "background_removal": ("background_removal",),
    "model_patches": ("model_patches",),
}
ALIASES = {"unet": "diffusion_models", "clip": "text_encoders"}

MODEL_EXTENSIONS = (".safetensors", ".sft", ".ckpt", ".pt", ".pt2", ".pth", ".bin")
# folders that list other files than model weights (ComfyUI's folder_paths: fonts are .ttf / .otf)
FOLDER_EXTENSIONS = {"fonts": (".ttf", ".otf")}
# folders ComfyUI keeps next to `models/` (in its base folder), not inside it: searched in both
BESIDE_MODELS = ("fonts",)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


class FolderError(ValueError):
    pass


def extra_model_paths_files(env: Any) -> list[Path]:
    """The extra_model_paths.yaml files read for `env`: one next to each models folder (or in it)."""
    found = []
    for base in getattr(env, "models", ()):
        yaml_path = Path(base).parent / "extra_model_paths.yaml"
        if not yaml_path.is_file():
            yaml_path = Path(base) / "extra_model_paths.yaml"
        if yaml_path.is_file():
            found.append(yaml_path)
    return found


def _extra_roots(env: Any) -> dict[str, list[Path]]:
    roots: dict[str, list[Path]] = {k: list(v) for k, v in getattr(env, "extra_model_paths", ())}
    for yaml_path in extra_model_paths_files(env):
        for key, paths in read_extra_model_paths(yaml_path).items():
            roots.setdefault(key, []).extend(paths)
    return roots


def read_extra_model_paths(path: Path) -> dict[str, list[Path]]:
    """Parse ComfyUI's extra_model_paths.yaml: sections with `base_path` and folder: subpath(s).
    A relative `base_path`, or a relative subpath in a section without one, is relative to the
    yaml file's folder (ComfyUI's rule); `custom_nodes` entries are pack folders."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise FolderError(f"{path}: not valid YAML: {e}") from e
    out: dict[str, list[Path]] = {}
    here = Path(path).resolve().parent
    for section in (data.values() if isinstance(data, dict) else ()):
        if not isinstance(section, dict):
            continue
        base = here / os.path.expandvars(os.path.expanduser(str(section.get("base_path", ""))))
        for key, value in section.items():
            if key in ("base_path", "is_default"):
                continue
            key = ALIASES.get(key, key)
            for sub in str(value).splitlines():
                if sub.strip():
                    out.setdefault(key, []).append(base / sub.strip())
    return out


def roots(env: Any, folder: str) -> list[Path]:
    folder = ALIASES.get(folder, folder)
    if folder not in FOLDERS:
        raise FolderError(f"unknown model folder {folder!r}; known: {', '.join(FOLDERS)}")
    found: list[Path] = []
    for base in getattr(env, "models", (Path("models"),)):
        for name in FOLDERS[folder]:
            found.append(Path(base) / name)
            if folder in BESIDE_MODELS:
                found.append(Path(base).parent / name)
    found.extend(_extra_roots(env).get(folder, []))
    found.append(EMBEDDED_MODELS / FOLDERS[folder][0])  # models that ship with mixgraph, last
    return found


def _walk(root: Path, extensions: Iterable[str]) -> list[str]:
    if not root.is_dir():
        return []
    out = []
    for dirpath, _dirs, files in os.walk(root, followlinks=True):
        for f in files:
            if f.lower().endswith(tuple(extensions)):
                out.append((Path(dirpath) / f).relative_to(root).as_posix())
    return out


def list_files(env: Any, folder: str, extensions: tuple[str, ...] | None = None) -> list[str]:
    """Combo options for a model folder: relative paths, sorted, without duplicates; files with
    ``extensions`` when given (ComfyUI-GGUF's loaders list ``.gguf``), else the folder's kinds."""
    names: set[str] = set()
    for root in roots(env, folder):
        names.update(_walk(root, extensions or FOLDER_EXTENSIONS.get(folder, MODEL_EXTENSIONS)))
        if extensions is None and folder in ("checkpoints", "diffusion_models", "unet"):
            names.update(_diffusers_dirs(root))
    return sorted(names)


def _diffusers_dirs(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/model_index.json"))


def safe_join(root: Path, relative: str) -> Path:
    """root/relative, refusing absolute paths, `..` and symlinks that leave the root."""
    rel = relative.replace("\\", "/")
    if not rel or rel.startswith("/") or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise FolderError(f"path {relative!r} is not a plain relative path inside {root}")
    path = root / rel
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise FolderError(f"path {relative!r} resolves outside {root}")
    return path


def resolve(env: Any, folder: str, name: str) -> Path:
    """The file a combo value names, searched in every root of the folder."""
    for root in roots(env, folder):
        try:
            path = safe_join(root, name)
        except FolderError:
            continue
        if path.exists():
            return path
    raise FolderError(f"{folder}: file {name!r} not found in {', '.join(map(str, roots(env, folder)))}")


ADD_A_FOLDER = ("add a models folder with --models DIR or MIXGRAPH_MODELS=DIR, or name an existing "
                "ComfyUI/A1111 install in extra_model_paths.yaml next to the models folder")


def searched(env: Any, folder: str, name: str | None = None) -> str:
    """The folders a file of `folder` is looked for in, as absolute paths (a missing one says
    so), where to put the file `name` (the first models folder's subfolder for `folder`, e.g.
    models/text_encoders), and how to add a models folder: what a "file not found" tells a new
    user."""
    embedded = EMBEDDED_MODELS / FOLDERS[ALIASES.get(folder, folder)][0]
    found = roots(env, folder)
    shown = []
    for root in found:
        if root == embedded:
            shown.append(f"{root} (mixgraph's embedded models)")
        else:
            shown.append(f"{root.resolve()}" + ("" if root.is_dir() else " (no such folder)"))
    put = ""
    if isinstance(name, str) and name:
        target = next((r for r in found if r != embedded), None)
        where = f"{target.resolve()}{os.sep}" if target is not None else f"a models folder's {embedded.name}/"
        put = f"put {name} in {where}; "
    return f"looked in {', '.join(shown)}; {put}{ADD_A_FOLDER}"


def missing_image(value: str, path: Path, hint: str = "") -> str:
    """ComfyUI's "Invalid image file: NAME", saying why: the file is missing (at which absolute
    path), or the name is a folder. `hint`: how to provide it."""
    where = os.path.abspath(path)
    if path.is_dir():
        return f"Invalid image file: {value} is a folder ({where}), not an image"
    return f"Invalid image file: {value} is missing: no file {where}" + (f"; {hint}" if hint else "")


def list_images(env: Any) -> list[str]:
    root = Path(getattr(env, "input", "input"))
    return sorted(_walk(root, IMAGE_EXTENSIONS)) if env is not None else []


ANNOTATIONS = {"[input]": "input", "[output]": "output", "[temp]": "temp"}


def annotated_path(env: Any, value: str) -> Path:
    """ComfyUI's annotated file name (``get_annotated_filepath``): ``name [temp]``,
    ``name [output]`` or ``name [input]`` names a file in that folder, a bare name one in the
    input folder; the name stays inside the folder (``safe_join``)."""
    folder, name = "input", value
    for suffix, which in ANNOTATIONS.items():
        if value.endswith(" " + suffix):
            folder, name = which, value[: -len(suffix) - 1]
            break
    return safe_join(Path(getattr(env, folder, folder)), name)
