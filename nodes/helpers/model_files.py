"""Inputs that name a file of a models folder, declared once: `ModelFile`.

A loader's file input follows from one fact, "a file of models folder X": the combo lists the
folder's files, the node's cache key carries the file's content fingerprint (replacing a file under
the same name re-runs what depends on it), validation may refuse the file from its header (a model
family mixgraph does not run), and the body loads the file the name resolves to. So a loader
declares the input with a `ModelFile` and resolves the name through the same object:

    @node(category="loaders", outputs=("MODEL", "CLIP", "VAE"), display_name="Load Checkpoint")
    def CheckpointLoaderSimple(ctx, ckpt_name=CHECKPOINT.input()):
        return loader.load_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name))

The engine knows none of this: `input()` hangs the fingerprint and the check on the combo as the
generic `Input.fingerprint` / `Input.check` hooks, which `graph.node` folds into the node's spec.
The body still receives the name (ComfyUI's contract, which custom packs calling core nodes rely
on) and resolves it with `path`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Combo
from mixgraph.graph.spec import Input
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.families import refused as families


def other_family(path: Path, where: str) -> str | None:
    """The refusal of a file of a model family mixgraph does not run, from its safetensors header
    or diffusers model_index.json only (`families/refused.py`); None when it may be loaded."""
    family = families.family_of_file(path)
    return families.refusal(family, where) if family is not None else None


@dataclass(frozen=True)
class ModelFile:
    """A combo input naming a file of models folder `folder` (a `folders.FOLDERS` key).

    `refuse(path, where) -> problem | None`: the validation of the file the name resolves to
    (`where` is "<input> '<name>'"); None: the combo's own check (the file exists) is all. A
    folder whose listing or fingerprint is more than "its files" subclasses this and overrides
    `options` / `fingerprint` (VAELoader's TAESD pairs, DiffusersLoader's folders)."""

    folder: str
    refuse: Callable[[Path, str], str | None] | None = None

    def input(self, *, tooltip: str | None = None, optional: bool = False) -> Input:
        """The combo input, with the fingerprint (and the check, where there is one) attached."""
        combo = Combo(self.options, tooltip=tooltip, optional=optional)
        return dataclasses.replace(combo, fingerprint=self.fingerprint,
                                   check=self.check if self.refuse is not None else None,
                                   not_listed=self.searched)

    def options(self, env: Any) -> list[str]:
        """The combo's options: the folder's files for the env (none without one)."""
        return folders.list_files(env, self.folder) if env is not None else []

    def path(self, env: Any, name: str) -> Path:
        """The file `name` resolves to in the folder's roots (`folders.FolderError` if none)."""
        return folders.resolve(env, self.folder, name)

    def searched(self, env: Any, name: Any) -> str:
        """For a name not among the options: the folders searched, where to put the file and how
        to add a models folder."""
        return folders.searched(env, self.folder, name)

    def fingerprint(self, env: Any, name: Any) -> Any:
        """The file's fingerprint for the cache key; None when the name resolves to no file
        (validation reports that, or the body's load does)."""
        try:
            return fingerprint_file(self.path(env, name))
        except (folders.FolderError, OSError, TypeError, AttributeError):
            return None

    def check(self, env: Any, input_name: str, name: Any) -> list[str]:
        """`refuse`'s verdict on the file, for the node's validation."""
        if self.refuse is None or not isinstance(name, str):
            return []
        try:
            path = self.path(env, name)
        except (folders.FolderError, OSError):
            return []  # the combo check reports a missing file
        problem = self.refuse(path, f"{input_name} {name!r}")
        return [problem] if problem else []


# The model files the node library's loaders name. A loader that refuses other families'
# files uses the refusing declaration; where a loader never checked, it has its own.
CHECKPOINT = ModelFile("checkpoints", refuse=other_family)
DIFFUSION_MODEL = ModelFile("diffusion_models", refuse=other_family)
TEXT_ENCODER = ModelFile("text_encoders", refuse=other_family)
CONTROLNET = ModelFile("controlnet", refuse=other_family)
LORA = ModelFile("loras")
CLIP_VISION = ModelFile("clip_vision")
STYLE_MODEL = ModelFile("style_models")
UPSCALE_MODEL = ModelFile("upscale_models")
GLIGEN = ModelFile("gligen")
HYPERNETWORK = ModelFile("hypernetworks")
PHOTOMAKER = ModelFile("photomaker")
MODEL_PATCH = ModelFile("model_patches")
BACKGROUND_REMOVAL = ModelFile("background_removal")
CONDITIONING_FILE = ModelFile("embeddings")   # ConditioningLoader's saved conditionings
FONT = ModelFile("fonts")
