"""Textual-inversion embeddings from models/embeddings, for `embedding:name` in prompts."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch

from nodes import folders
from nodes.models.safetensors_io import load_file


@lru_cache(maxsize=64)
def _read(path: str, size: int, mtime_ns: int) -> dict[str, torch.Tensor]:
    """An embedding file as {key: [n_vectors, dim] float32}. Formats: A1111 .pt
    (`string_to_param: {"*": T}`), safetensors `emb_params`, SDXL `clip_l` / `clip_g`."""
    sd = load_file(Path(path))
    if "string_to_param" in sd:  # flattened by load_file for .pt: string_to_param.*
        sd = {"emb_params": sd["string_to_param"]}
    out = {}
    for key, value in sd.items():
        if isinstance(value, torch.Tensor):
            out[key.replace("string_to_param.*", "emb_params")] = value.float().reshape(-1, value.shape[-1])
    return out


def embedding_lookup(env: Any, warn: Callable[[str], None] | None = None
                     ) -> Callable[[str], dict[str, torch.Tensor] | None]:
    """name → {"emb_params"|"clip_l"|"clip_g": [n, D]} or None (with a warning) if missing."""

    def lookup(name: str) -> dict[str, torch.Tensor] | None:
        candidates = [name] + [f for f in folders.list_files(env, "embeddings")
                               if f.rsplit(".", 1)[0] == name]
        for candidate in candidates:
            try:
                path = folders.resolve(env, "embeddings", candidate)
            except folders.FolderError:
                continue
            if path.is_file():
                st = path.stat()
                return _read(str(path), st.st_size, st.st_mtime_ns)
        if warn:
            warn(f"embedding {name!r} not found in the embeddings folder; the text is kept as words")
        return None

    return lookup
