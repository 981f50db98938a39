"""CLIP_VISION_OUTPUT: what ``CLIPVisionEncode`` gives (ComfyUI's ``clip_vision.Output``), with
named fields. Float32 on the CPU, never modified in place."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ClipVisionOutput"]


@dataclass(frozen=True, eq=False)
class ClipVisionOutput:
    """image_embeds:              CLIP ViT: [B, P] projected class token (what unCLIP and Revision
                               use); SigLIP: [B, N, W], the same tensor as last_hidden_state
                               (ComfyUI's SigLIP has no projection and no pooling).
    last_hidden_state:         [B, N, W] the last layer's tokens: CLIP ViT: class token first, no
                               final norm; SigLIP: patch tokens after its post_layernorm (style
                               models, Redux).
    penultimate_hidden_states: [B, N, W] the second-to-last layer's tokens.
    all_hidden_states:         [B, L, N, W] every layer's output (SigLIP only, as ComfyUI), else None.
    ``out["image_embeds"]`` works too, as on ComfyUI's object."""

    image_embeds: torch.Tensor
    last_hidden_state: torch.Tensor
    penultimate_hidden_states: torch.Tensor
    all_hidden_states: torch.Tensor | None = None

    def __getitem__(self, key: str) -> torch.Tensor:
        return getattr(self, key)
