"""Where a run finds its files: model folders, input, output and temp directories; and the one
check that a folder a run writes into can be written (`writable_folder`, `folder_problem`), so a
file standing where the output folder should be is an error naming the folder, not a raw
FileExistsError."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Env:
    models: tuple[Path, ...] = (Path("models"),)
    input: Path = Path("input")
    output: Path = Path("output")
    temp: Path = Path("temp")
    device: str = "cpu"
    # Extra folder roots per model kind (from extra_model_paths.yaml): {"checkpoints": (Path,...)}.
    extra_model_paths: tuple[tuple[str, tuple[Path, ...]], ...] = ()
    settings: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def from_args(cls, models: str | os.PathLike | None = None, input: str | os.PathLike | None = None,
                  output: str | os.PathLike | None = None, temp: str | os.PathLike | None = None,
                  device: str | None = None) -> "Env":
        models = models or os.environ.get("MIXGRAPH_MODELS") or "models"
        return cls(models=(Path(models),), input=Path(input or "input"),
                   output=Path(output or "output"), temp=Path(temp or "temp"), device=device or "cpu")


def models_problem(models: str | os.PathLike | None, flag: str = "--models") -> str | None:
    """Why a models folder a person named (`flag`, else the env setting MIXGRAPH_MODELS) cannot
    be used: it does not exist or is not a folder. None when none was named (the default
    ./models may be missing: the embedded models still load) or it is a folder."""
    if models:
        named = f"{flag} {models}"
    elif os.environ.get("MIXGRAPH_MODELS"):
        models = os.environ["MIXGRAPH_MODELS"]
        named = f"MIXGRAPH_MODELS={models}"
    else:
        return None
    path = Path(models)
    if path.is_dir():
        return None
    why = "is a file, not a folder" if path.exists() else "no such folder"
    return (f"{named}: {why} ({os.path.abspath(path)}); give an existing models folder (one "
            f"holding checkpoints/, loras/, ...), or leave it out to use ./models")


def check_device(device: str | None) -> str | None:
    """None if `device` is usable here, else why not."""
    if not device:
        return None
    import torch
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError) as e:
        return f"--device {device!r}: {e}"
    if d.type == "cuda":
        if not torch.cuda.is_available():
            return f"--device {device}: CUDA is not available on this machine"
        if d.index is not None and d.index >= torch.cuda.device_count():
            return f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)"
    elif d.type == "mps" and not torch.backends.mps.is_available():
        return f"--device {device}: MPS is not available on this machine"
    elif d.type not in ("cpu", "cuda", "mps"):
        return f"--device {device}: unsupported device type {d.type!r} (cpu, cuda, cuda:N, mps)"
    return None


class OutputFolderError(OSError):
    """A folder a run must write into that cannot be written; the message names it and why."""


def folder_problem(folder: str | os.PathLike, what: str = "output folder") -> str | None:
    """Why `folder` could not be used to write files (None: it can, or can be created), without
    creating anything: a file in its place or in place of a parent, or no write permission."""
    folder = Path(folder)
    for p in (folder, *folder.parents):
        if p.is_dir():
            if not os.access(p, os.W_OK | os.X_OK):
                return (f"the {what} {folder} is not writable (no write permission on {p})"
                        if p == folder else
                        f"the {what} {folder} cannot be created (no write permission on {p})")
            return None
        if p.exists() or p.is_symlink():
            kind = "a broken link" if not p.exists() else "a file"
            return f"the {what} {folder} cannot be used: {p} is {kind}, not a folder"
    return None


def writable_folder(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """`folder`, created if missing; OutputFolderError naming the folder and the cause when it
    cannot hold new files (the folder was replaced by a file, a parent is a file, permissions)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputFolderError(folder_problem(folder, what)
                                or f"the {what} {folder} cannot be created: {e.strerror or e}"
                                ) from None
    problem = folder_problem(folder, what)
    if problem:
        raise OutputFolderError(problem)
    return folder
