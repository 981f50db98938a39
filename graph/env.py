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
