"""What ComfyUI's DiT text-encode nodes do with a CLIP's tokens before encoding them
(``comfy_extras/nodes_flux.py`` CLIPTextEncodeFlux, ``nodes_sd3.py`` CLIPTextEncodeSD3): one
prompt per encoder, SD3's "none" padding (an empty prompt gives its encoder no tokens) and its
CLIP-L / CLIP-G chunk counts made equal with empty-prompt chunks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["require_encoders", "sd3_tokens"]


def require_encoders(clip: Any, node: str, *names: str) -> None:
    """A clear error when ``clip`` lacks an encoder the node writes a prompt for."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    missing = [n for n in names if n not in clip.names]
    if missing:
        raise ValueError(f"{node} needs a CLIP with {', '.join(names)}; this {clip.kind} CLIP has "
                         f"{', '.join(clip.names) or 'no encoder'} (no {', '.join(missing)})")


def sd3_tokens(clip: Any, texts: Mapping[str, str], empty_padding: str, *, embedding_lookup: Any = None,
               warn: Callable[[str], None] | None = None) -> dict[str, list]:
    """encoder name -> chunks for CLIPTextEncodeSD3: each encoder of ``clip`` reads its own text
    (``texts``: clip_l, clip_g, t5xxl); with ``empty_padding`` "none" an empty text gives no
    chunks; CLIP-L and CLIP-G are padded to the same chunk count with the empty prompt."""
    if empty_padding not in ("none", "empty_prompt"):
        raise ValueError(f"empty_padding must be 'none' or 'empty_prompt', got {empty_padding!r}")
    no_padding = empty_padding == "none"
    tokens: dict[str, list] = {}
    for name in clip.names:
        text = texts.get(name, "")
        if len(text) == 0 and no_padding:
            tokens[name] = []
        else:
            tokens[name] = clip.tokenize(text, embedding_lookup=embedding_lookup, warn=warn)[name]
    if "clip_l" in tokens and "clip_g" in tokens and len(tokens["clip_l"]) != len(tokens["clip_g"]):
        empty = clip.tokenize("", warn=warn)
        while len(tokens["clip_l"]) < len(tokens["clip_g"]):
            tokens["clip_l"] = tokens["clip_l"] + empty["clip_l"]
        while len(tokens["clip_l"]) > len(tokens["clip_g"]):
            tokens["clip_g"] = tokens["clip_g"] + empty["clip_g"]
    return tokens
