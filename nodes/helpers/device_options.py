"""The device options of ComfyUI's device-choosing loaders (``model_management``'s
``get_gpu_device_options`` / ``resolve_gpu_device_option``), against mixgraph's placement: every
model of a run sits on the run's device (``--device``, ``Env.device``); one model on a device of
its own is not supported yet.

ComfyUI offers "default" and "cpu", plus "gpu:N" per GPU when it was started on several; an
option it cannot resolve ("gpu:9" on a one-GPU machine) falls back to "default", and its loaders
accept any value at validation so workflows stay portable. Both rules are kept here.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["device_options", "resolve_device_option", "check_placement"]


def device_options(env: Any = None) -> list[str]:
    """The combo's options: "default", "cpu", and "gpu:N" per CUDA device when there are several."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["default", "cpu"] + ([f"gpu:{i}" for i in range(count)] if count > 1 else [])


def resolve_device_option(option: str | None) -> torch.device | None:
    """The device an option names; None for "default", an unknown option or a missing GPU."""
    if option is None or option == "default":
        return None
    if option == "cpu":
        return torch.device("cpu")
    if option.startswith("gpu:") and option[4:].isdigit():
        index = int(option[4:])
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return torch.device("cuda", index)
    return None


def _normal(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def check_placement(node: str, name: str, option: str | None, run_device: str | None) -> None:
    """Raise a clear error when ``option`` asks for a device other than the run's."""
    wanted = resolve_device_option(option)
    if wanted is None:
        return
    run = torch.device(run_device or "cpu")
    if _normal(wanted) != _normal(run):
        raise ValueError(f"{node}: {name} {option!r}: placing one model on a device of its own is "
                         f"not supported yet; mixgraph runs every model of a run on the run's "
                         f"device ({run}); choose 'default', or run with --device {wanted}")
