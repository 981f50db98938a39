"""Which sampler previews a run wants: `--preview-method` / `--preview-size` (carried in
`Env.settings` as "preview_method" / "preview_size") and the TAESD decoders in
`models/vae_approx/`, turned into a previewer from `sampling/preview.py` (None: no previews)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mixgraph.nodes.helpers import folders
from mixgraph.nodes.sampling.preview import make_previewer, preview_format

__all__ = ["previewer_for"]

DEFAULT_PREVIEW_SIZE = 512


def _find_decoder(env: Any) -> Callable[[str], Path | None]:
    def find(name: str) -> Path | None:
        for root in folders.roots(env, "vae_approx"):
            for ext in folders.MODEL_EXTENSIONS:
                path = root / f"{name}{ext}"
                if path.is_file():
                    return path
        return None

    return find


def previewer_for(ctx: Any, model: Any) -> Callable | None:
    """The step previewer for a sampler node running `model` (anything with a `latent_format`: the
    preview factors and TAESD decoder are its format's), or None when previews are off (the
    default, as in ComfyUI) or the model's latent format has none."""
    settings = dict(getattr(ctx.env, "settings", ()) or ())
    method = settings.get("preview_method") or "none"
    size = int(settings.get("preview_size") or DEFAULT_PREVIEW_SIZE)
    fmt = preview_format(model)
    if method == "none" or fmt is None:
        return None
    return make_previewer(method, fmt, _find_decoder(ctx.env), size)
