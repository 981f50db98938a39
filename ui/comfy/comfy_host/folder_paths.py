"""ComfyUI's `folder_paths` for custom node packs, backed by mixgraph's model folders
(mixgraph.nodes.helpers.folders: the models roots, ComfyUI's folder names and aliases, extra_model_paths
.yaml) and the running environment's input, output and temp folders.

`folder_names_and_paths` is a real dict a pack may extend (`folder_names_and_paths["ipadapter"] =
([path], {".bin"})`, `add_model_folder_path`); mixgraph's own folder keys are refreshed from the
environment and keep what packs added. Paths a pack adds to a core folder are seen by packs, not
by mixgraph's core loaders.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import mixgraph.nodes.helpers.folders as _folders
import mixgraph.ui.comfy.comfy_runtime as _rt

supported_pt_extensions = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}
_EXTRA_FOLDERS = ("configs", "clip_vision", "style_models", "gligen", "hypernetworks",
                  "photomaker", "classifiers", "vae_approx", "diffusers", "model_patches",
                  "audio_encoders", "latent_upscale_models")

folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {}
filename_list_cache: dict = {}
_added: dict[str, list[str]] = {}
_seen_env = None


def _env():
    return _rt.current_env()


def _refresh() -> None:
    """Fill mixgraph's folder keys for the current environment, keeping what packs added."""
    global _seen_env
    env = _env()
    if env is _seen_env and folder_names_and_paths:
        return
    _seen_env = env
    keys = {k: k for k in _folders.FOLDERS} | dict(_folders.ALIASES)
    for key, canonical in keys.items():
        paths = [str(p.resolve()) for p in _folders.roots(env, canonical)]
        old = folder_names_and_paths.get(key)
        exts = old[1] if old else set(_folders.FOLDER_EXTENSIONS.get(canonical, supported_pt_extensions))
        folder_names_and_paths[key] = (paths + [p for p in _added.get(key, []) if p not in paths],
                                       exts)
    base = Path(env.models[0]).resolve()
    for key in _EXTRA_FOLDERS:
        if key not in folder_names_and_paths:
            folder_names_and_paths[key] = ([str(base / key)], set(supported_pt_extensions))
    folder_names_and_paths.setdefault(
        "custom_nodes", ([str(p) for p in _rt.STATE.custom_node_dirs], set()))


def __getattr__(name: str):
    """Module attributes ComfyUI sets at start-up, read from the running environment."""
    env = _env()
    if name == "models_dir":
        return str(Path(env.models[0]).resolve())
    if name == "base_path":
        return str(_rt.STATE.base_directory.resolve())
    if name == "output_directory":
        return get_output_directory()
    if name == "input_directory":
        return get_input_directory()
    if name == "temp_directory":
        return get_temp_directory()
    if name == "user_directory":
        return get_user_directory()
    raise AttributeError(f"module 'folder_paths' has no attribute {name!r}")


def get_output_directory() -> str:
    return str(Path(_env().output).resolve())


def get_input_directory() -> str:
    return str(Path(_env().input).resolve())


def get_temp_directory() -> str:
    return str(Path(_env().temp).resolve())


def get_user_directory() -> str:
    return str(_rt.STATE.user_directory.resolve())


def get_directory_by_type(type_name: str) -> str | None:
    return {"output": get_output_directory, "input": get_input_directory,
            "temp": get_temp_directory}.get(type_name, lambda: None)()


def map_legacy(folder_name: str) -> str:
    return {"unet": "diffusion_models", "clip": "text_encoders"}.get(folder_name, folder_name)


def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    _refresh()
    folder_name = map_legacy(folder_name)
    path = str(full_folder_path)
    added = _added.setdefault(folder_name, [])
    if path not in added:
        added.insert(0, path) if is_default else added.append(path)
    paths, exts = folder_names_and_paths.get(folder_name, ([], set(supported_pt_extensions)))
    if path in paths:
        paths.remove(path)
    paths.insert(0, path) if is_default else paths.append(path)
    folder_names_and_paths[folder_name] = (paths, exts)


def get_folder_paths(folder_name: str) -> list[str]:
    _refresh()
    return list(folder_names_and_paths[map_legacy(folder_name)][0])


def filter_files_extensions(files, extensions) -> list[str]:
    exts = {e.lower() for e in extensions}
    return sorted(f for f in files if not exts or os.path.splitext(f)[1].lower() in exts)


def recursive_search(directory: str, excluded_dir_names: list[str] | None = None
                     ) -> tuple[list[str], dict[str, float]]:
    if not os.path.isdir(directory):
        return [], {}
    excluded = set(excluded_dir_names or [".git"])
    found, dirs = [], {directory: os.path.getmtime(directory)}
    for root, subdirs, files in os.walk(directory, followlinks=True, topdown=True):
        subdirs[:] = [d for d in subdirs if d not in excluded]
        found += [os.path.relpath(os.path.join(root, f), directory) for f in files]
        for d in subdirs:
            path = os.path.join(root, d)
            dirs[path] = os.path.getmtime(path)
    return found, dirs


def get_filename_list(folder_name: str) -> list[str]:
    _refresh()
    folder_name = map_legacy(folder_name)
    paths, exts = folder_names_and_paths[folder_name]
    names: set[str] = set()
    for p in paths:
        names.update(filter_files_extensions(recursive_search(p)[0], exts))
    return sorted(names)


def get_full_path(folder_name: str, filename: str) -> str | None:
    _refresh()
    folder_name = map_legacy(folder_name)
    if folder_name not in folder_names_and_paths:
        return None
    for p in folder_names_and_paths[folder_name][0]:
        try:
            path = _folders.safe_join(Path(p), filename)
        except _folders.FolderError:
            continue
        if path.is_file():
            return str(path)
    return None


def get_full_path_or_raise(folder_name: str, filename: str) -> str:
    path = get_full_path(folder_name, filename)
    if path is None:
        raise FileNotFoundError(f"Model in folder '{folder_name}' with filename '{filename}' not found.")
    return path


def annotated_filepath(name: str) -> tuple[str, str | None]:
    for tag, getter in (("[output]", get_output_directory), ("[input]", get_input_directory),
                        ("[temp]", get_temp_directory)):
        if name.endswith(tag):
            return name[: -len(tag)].strip(), getter()
    return name, None


def get_annotated_filepath(name: str, default_dir: str | None = None) -> str:
    name, base = annotated_filepath(name)
    if base is None:
        base = default_dir if default_dir is not None else get_input_directory()
    return str(_folders.safe_join(Path(base), name))


def exists_annotated_filepath(name: str) -> bool:
    try:
        return os.path.exists(get_annotated_filepath(name))
    except _folders.FolderError:
        return False


def get_save_image_path(filename_prefix: str, output_dir: str, image_width: int = 0,
                        image_height: int = 0) -> tuple[str, str, int, str, str]:
    """(full_output_folder, filename, counter, subfolder, filename_prefix), ComfyUI's rule: the
    next counter after the highest `<filename>_<digits>_` in the folder; %width%, %height% and
    the %year%... date tokens expanded; nothing outside output_dir."""
    if "%" in filename_prefix:
        now = time.localtime()
        for token, value in (("%width%", image_width), ("%height%", image_height),
                             ("%year%", now.tm_year), ("%month%", f"{now.tm_mon:02}"),
                             ("%day%", f"{now.tm_mday:02}"), ("%hour%", f"{now.tm_hour:02}"),
                             ("%minute%", f"{now.tm_min:02}"), ("%second%", f"{now.tm_sec:02}")):
            filename_prefix = filename_prefix.replace(token, str(value))
    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    filename = os.path.basename(os.path.normpath(filename_prefix))
    full = os.path.join(output_dir, subfolder)
    if os.path.commonpath((os.path.abspath(output_dir), os.path.abspath(full))) != \
            os.path.abspath(output_dir):
        raise ValueError(f"Saving image outside the output folder is not allowed. "
                         f"full_output_folder: {os.path.abspath(full)}, output_dir: {output_dir}")
    counter = 0
    try:
        for name in os.listdir(full):
            head, sep, rest = name.partition(filename + "_") if name.startswith(filename + "_") \
                else ("", "", "")
            digits = rest.split("_")[0] if sep else ""
            if digits.isdigit() and rest[len(digits):].startswith("_"):
                counter = max(counter, int(digits))
    except FileNotFoundError:
        os.makedirs(full, exist_ok=True)
    return full, filename, counter + 1, subfolder, filename_prefix
