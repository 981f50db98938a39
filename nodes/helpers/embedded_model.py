"""What mixgraph says about a prompt given to its embedded model, which knows few words.

The embedded model (`nodes/models/shapes.py`) draws one coloured shape on a plain background
and keeps token embeddings only for the words of its training captions: any other prompt still
gives a picture, silently unrelated to it. So a text encode on its CLIP warns, once per prompt,
which words it does not know. The model is recognised by the marker its trainer writes into the
safetensors metadata (`shapes.MODEL_METADATA`), not by a file name: a copy under another name
is the same model, and a user's checkpoint called mixgraph-shapes.safetensors is not.
"""

from __future__ import annotations

import functools
from typing import Any

from mixgraph.nodes.models import shapes
from mixgraph.nodes.weights.safetensors_io import WeightFileError, file_metadata


@functools.lru_cache(maxsize=64)
def _marked(path: str, size: int, mtime_ns: int) -> bool:
    """Whether the file carries the embedded model's marker (keyed by its identity: a file
    rewritten under the same name is read again)."""
    try:
        meta = file_metadata(path)
    except (WeightFileError, OSError):
        return False
    key, value = shapes.MODEL_METADATA
    return meta.get(key) == value


def is_embedded(clip: Any) -> bool:
    """Whether a CLIP handle's text encoders come from the embedded model's checkpoint."""
    sources = [getattr(e, "source", None) for e in getattr(clip, "encoders", ())]
    return bool(sources) and all(
        s is not None and s.path is not None and _marked(str(s.path), s.size, s.mtime_ns)
        for s in sources)


def prompt_warning(clip: Any, text: str) -> str | None:
    """The warning for a prompt with words the embedded model does not know; None for any
    other model, or a prompt in its vocabulary."""
    if not isinstance(text, str) or not text.strip() or not is_embedded(clip):
        return None
    unknown = shapes.unknown_words(text)
    if not unknown:
        return None
    shown = ", ".join(repr(w) for w in unknown[:12]) + (f" and {len(unknown) - 12} more"
                                                        if len(unknown) > 12 else "")
    return (f"the embedded model ({shapes.MODEL_METADATA[1]}) does not know the word(s) {shown}, "
            f"so the picture will not follow them: it draws one shape on a plain background from "
            f"prompts like 'a small red circle at the top left on a blue background' "
            f"(`mixgraph demo --help` lists its words)")
