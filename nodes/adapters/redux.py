"""Flux Redux (Black Forest Labs, "FLUX.1 Redux", Nov 2024): a two-layer projector that turns a
SigLIP vision tower's tokens into extra text tokens for Flux, which ``StyleModelApply`` appends to
the T5 conditioning.

Key layout (``models/style_models/flux1-redux-dev.safetensors``): ``redux_up.{weight,bias}``
[3·D, W] and ``redux_down.{weight,bias}`` [D, 3·D]; the real file has W = 1152 (SigLIP
so400m) and D = 4096 (T5-XXL, Flux's context width). Sizes come from shapes.

Forward (ComfyUI ``ReduxImageEncoder``, fed the SigLIP ``last_hidden_state``, i.e. every patch
token after the tower's post_layernorm): redux_down(silu(redux_up(x))), [B, N, W] -> [B, N, D]
(729 tokens per image for the 384-px tower).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource
from mixgraph.nodes.payloads.vision import ClipVisionOutput

__all__ = ["ReduxConfig", "ReduxImageEncoder", "ReduxHandle", "ReduxError", "is_redux"]


class ReduxError(ValueError):
    """A Redux file or input we cannot use."""


def is_redux(keys) -> bool:
    """ComfyUI's test (``comfy.sd.load_style_model``): a ``redux_down.weight`` key."""
    return "redux_down.weight" in keys


@dataclass(frozen=True)
class ReduxConfig:
    vision_width: int  # W: the SigLIP tower's width (1152)
    hidden: int  # the projector's inner width, 3 · D
    context_dim: int  # D: the text tokens' width (Flux's T5: 4096)

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "") -> "ReduxConfig":
        try:
            up, down = shapes["redux_up.weight"], shapes["redux_down.weight"]  # [H, W], [D, H]
        except KeyError as e:
            raise ReduxError(f"{where or 'state dict'}: not a Flux Redux model (no {e.args[0]!r})") from None
        if len(up) != 2 or len(down) != 2 or up[0] != down[1]:
            raise ReduxError(f"{where}: redux_up {list(up)} does not feed redux_down {list(down)}")
        return cls(vision_width=int(up[1]), hidden=int(up[0]), context_dim=int(down[0]))


class ReduxImageEncoder(nn.Module):
    """``forward(tokens [B, N, W]) -> [B, N, D]``."""

    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: ReduxConfig):
        super().__init__()
        self.config = config
        self.redux_up = nn.Linear(config.vision_width, config.hidden)
        self.redux_down = nn.Linear(config.hidden, config.context_dim)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.redux_down(F.silu(self.redux_up(tokens)))


@dataclass(frozen=True)
class ReduxHandle:
    """STYLE_MODEL holding a Redux projector (weights are read on use, in the policy's dtype)."""

    source: WeightSource
    config: ReduxConfig
    precision: PolicyLike | None = None

    def get_cond(self, vision: ClipVisionOutput, policy: PolicyLike) -> Tensor:
        """The Redux tokens of every image of ``vision``, flattened into one [1, B·N, D]
        conditioning sequence (ComfyUI's ``StyleModelApply``)."""
        tokens = vision.last_hidden_state  # [B, N, W]
        if tokens.shape[-1] != self.config.vision_width:
            raise ReduxError(
                f"the Redux model takes {self.config.vision_width}-wide SigLIP tokens, the CLIP vision output "
                f"has {tokens.shape[-1]} (load the SigLIP vision model it was trained with, "
                f"sigclip_vision_patch14_384)")
        m = apply_precision(store.materialize("style_model", self.source, self.config, policy.storage, (),
                                              ReduxImageEncoder), policy)
        device = next(m.parameters()).device
        with torch.inference_mode():
            out = m(tokens.to(device)).float().cpu()  # [B, N, D]
        return out.flatten(0, 1).unsqueeze(0)  # [1, B*N, D]

    def with_precision(self, policy: PolicyLike | None) -> "ReduxHandle":
        return dataclasses.replace(self, precision=policy)
