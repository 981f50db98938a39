"""Latent files and tiled encoding (nodes.py SaveLatent, LoadLatent, VAEEncodeTiled)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mixgraph.graph.env import writable_folder
from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo, Hidden, Int, Result, Socket, String, node
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers import folders, latent_ops
from mixgraph.nodes.helpers.imaging import next_counter
from mixgraph.nodes.weights import latent_file, save
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.helpers.precision import effective


def list_latents(env: Any) -> list[str]:
    """LoadLatent's options: the ``.latent`` files directly in the input folder, sorted."""
    root = Path(getattr(env, "input", "input")) if env is not None else None
    if root is None or not root.is_dir():
        return []
    return sorted(f for f in os.listdir(root) if f.endswith(".latent") and (root / f).is_file())


def _latent_path(env: Any, latent: str) -> Path:
    return folders.safe_join(Path(env.input), latent)


def _latent_fingerprint(env: Any, latent: str = "", **_: Any):
    try:
        return fingerprint_file(_latent_path(env, latent))
    except (folders.FolderError, OSError):
        return None


def _latent_exists(env: Any, latent: str | None = None, **_: Any) -> list[str]:
    if latent is None or env is None:
        return []
    try:
        ok = _latent_path(env, latent).is_file()
    except folders.FolderError as e:
        return [str(e)]
    return [] if ok else [f"Invalid latent file: {latent}"]


@node(category="_for_testing", outputs=(Output("LATENT", "samples"),), output_node=True)
def SaveLatent(ctx, samples=Socket("LATENT"), filename_prefix=String("latents/ComfyUI"),
               prompt=Hidden("PROMPT"), extra_pnginfo=Hidden("EXTRA_PNGINFO")):
    """Writes ``<prefix>_<counter:05>_.latent`` (format version 0) under the output folder."""
    root = Path(ctx.env.output)
    target = folders.safe_join(root, filename_prefix)
    folder, stem = target.parent, target.name
    writable_folder(folder, "output folder")
    name = f"{stem}_{next_counter(folder, stem):05}_.latent"
    latent_file.save_latent(folder / name, samples.samples, save.prompt_metadata(prompt, extra_pnginfo))
    sub = folder.relative_to(root).as_posix()
    return Result((samples,), ui={"latents": [{"filename": name, "subfolder": "" if sub == "." else sub,
                                              "type": "output"}]})


@node(category="_for_testing", outputs=("LATENT",), fingerprint=_latent_fingerprint, validate=_latent_exists)
def LoadLatent(ctx, latent=Combo(list_latents)):
    """A ``.latent`` file from the input folder (files without the version marker are divided by
    0.18215, ComfyUI's rule for the old format)."""
    return (Latent(latent_file.load_latent(_latent_path(ctx.env, latent))),)


@node(category="_for_testing", outputs=("LATENT",), display_name="VAE Encode (Tiled)")
def VAEEncodeTiled(ctx, pixels=Socket("IMAGE"), vae=Socket("VAE"),
                   tile_size=Int(512, min=64, max=4096, step=64),
                   overlap=Int(64, min=0, max=4096, step=32),
                   temporal_size=Int(64, min=8, max=4096, step=4),
                   temporal_overlap=Int(8, min=4, max=4096, step=4)):
    """Encodes in overlapping tiles (pixel units) to bound memory; the temporal inputs are for
    video VAEs and unused by image VAEs. The encode averages passes with tiles of tile_size and
    tile_size/2 on a side, so the overlap must stay below tile_size/2."""
    if overlap >= tile_size // 2:
        raise ValueError(f"VAEEncodeTiled: overlap {overlap} must be smaller than half the tile_size "
                         f"{tile_size} (tiles of tile_size/2 are encoded too)")
    pixels = latent_ops.crop_to_multiple(pixels[..., :3])
    return (Latent(vae.encode_tiled(pixels, effective(ctx, vae, "VAE"), tile_size, overlap,
                                    temporal_size=temporal_size, temporal_overlap=temporal_overlap)),)
