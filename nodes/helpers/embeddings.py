"""Textual-inversion embeddings from models/embeddings, for `embedding:name` in prompts."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable

import torch

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.weights.safetensors_io import WeightFileError, read_tensors


def _read_a1111_pt(path: str) -> dict[str, torch.Tensor]:
    """A1111 .pt embeddings nest the vectors: {"string_to_param": {"*": T}}. weights_only."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise WeightFileError(f"{path}: cannot load embedding with weights_only=True: {e}") from e
    params = obj.get("string_to_param") if isinstance(obj, dict) else None
    if isinstance(params, dict) and params:
        return {"emb_params": next(iter(params.values()))}
    return {k: v for k, v in (obj or {}).items() if isinstance(v, torch.Tensor)}


@lru_cache(maxsize=64)
def _read(path: str, size: int, mtime_ns: int) -> dict[str, torch.Tensor]:
    """An embedding file as {key: [n_vectors, dim] float32}. Formats: A1111 .pt
    (`string_to_param: {"*": T}`), safetensors `emb_params`, SDXL `clip_l` / `clip_g`."""
    if path.endswith((".pt", ".bin", ".ckpt")):
        sd = _read_a1111_pt(path)
    else:
        sd = read_tensors(path)
    return {k: v.float().reshape(-1, v.shape[-1]) for k, v in sd.items()}


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


_EMBEDDING = re.compile(r"embedding:([^\s,()]+)")


def embeddings_fingerprint(env: Any, text: str = "", **_: Any):
    """Textual-inversion files named in the prompt are external state of the encode."""
    prints = []
    for name in sorted(set(_EMBEDDING.findall(text or ""))):
        try:
            prints.append((name, fingerprint_file(folders.resolve(env, "embeddings", name))))
        except folders.FolderError:
            found = [f for f in folders.list_files(env, "embeddings") if f.rsplit(".", 1)[0] == name]
            prints.append((name, fingerprint_file(folders.resolve(env, "embeddings", found[0]))
                           if found else None))
    return tuple(prints) or None
