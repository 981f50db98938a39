"""Where a run finds its files: model folders, input, output and temp directories."""

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
