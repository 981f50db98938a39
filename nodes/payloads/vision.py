"""CLIP_VISION_OUTPUT: what ``CLIPVisionEncode`` gives (ComfyUI's ``clip_vision.Output``), with
named fields. Float32 on the CPU, never modified in place."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ClipVisionOutput"]


@dataclass(frozen=True, eq=False)
class ClipVisionOutput:
    """image_embeds:              [B, P] projected class token (what unCLIP and Revision use).
    last_hidden_state:         [B, N, W] the last layer's tokens, class token first (style models).
    penultimate_hidden_states: [B, N, W] the second-to-last layer's tokens.
    ``out["image_embeds"]`` works too, as on ComfyUI's object."""

    image_embeds: torch.Tensor
    last_hidden_state: torch.Tensor
    penultimate_hidden_states: torch.Tensor

    def __getitem__(self, key: str) -> torch.Tensor:
        return getattr(self, key)
