"""Lotus dense prediction (He et al. 2024, "Lotus: Diffusion-based Visual Foundation Model for
High-quality Dense Prediction", arXiv:2409.18124): an SD 2.x UNet fine-tuned to turn an image's
latent into its depth (or normal) map's latent in one step.

What tells a Lotus UNet from SD2, and how it runs (ComfyUI's ``supported_models.LotusD`` and
``model_base.Lotus``, facts carried over):

* structure: an SD2 UNet (linear transformer projections, 64-wide heads, 1024-wide context) with
  a 4-wide vector input (``label_emb.0.0.weight`` [time_embed_dim, 4]) and 4 input channels;
  SD2 has no vector input, SD2.1 unCLIP's is 1536/2048 wide;
* that vector is a fixed *task switcher* y = [sin t, cos t] of the task vector t = (1, 0)
  ("annotation" branch: depth/normal, not the image-reconstruction branch), [1, 4];
* prediction: x0 with the UNet given x itself, no c_in scaling (ComfyUI's ``IMG_TO_IMG``);
  the public workflow samples one Euler step from σ = 999 with the noise disabled, so the
  result is the UNet's output for the image latent at timestep 999;
* conditioning: the frozen text encoder's output for the empty prompt, [1, 2, 1024], which
  ComfyUI ships as a constant (``LotusConditioning``) and mixgraph as data
  (``data/lotus_null_prompt.safetensors``, see its NOTICE).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
from torch import Tensor

from mixgraph.nodes.families.sd.unet import UNetConfig
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["NULL_PROMPT_FILE", "TASK_ANNOTATION", "is_lotus", "lotus_conditioning", "null_prompt_embedding",
           "task_embedding", "PREDICTION"]

NULL_PROMPT_FILE = Path(__file__).resolve().parent / "data" / "lotus_null_prompt.safetensors"
NULL_PROMPT_SHAPE = (1, 2, 1024)
TASK_ANNOTATION = (1.0, 0.0)  # Lotus' task vector for the annotation (depth / normal) branch
TASK_WIDTH = 2 * len(TASK_ANNOTATION)
PREDICTION = "img_to_img"


def is_lotus(cfg: UNetConfig) -> bool:
    """A Lotus-D UNet: SD2-style transformers, a 4-wide vector input, 4 input channels."""
    return (cfg.use_linear_in_transformer and cfg.adm_in_channels == TASK_WIDTH and cfg.in_channels == 4
            and cfg.num_classes is None)


def task_embedding(task: tuple[float, ...] = TASK_ANNOTATION) -> tuple[float, ...]:
    """[sin t₀, sin t₁, …, cos t₀, cos t₁, …]: the constant vector input y of a Lotus UNet."""
    return tuple(math.sin(t) for t in task) + tuple(math.cos(t) for t in task)


@functools.lru_cache(maxsize=1)
def _null_prompt() -> Tensor:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(NULL_PROMPT_FILE))
    except (OSError, RuntimeError) as e:
        raise RuntimeError(f"Lotus null-prompt embedding: cannot read {NULL_PROMPT_FILE}: {e}") from e
    embeds = tensors.get("prompt_embeds")
    if embeds is None or tuple(embeds.shape) != NULL_PROMPT_SHAPE:
        raise RuntimeError(f"{NULL_PROMPT_FILE}: expected a 'prompt_embeds' tensor of shape {NULL_PROMPT_SHAPE}")
    return embeds.to(torch.float32)


def null_prompt_embedding() -> Tensor:
    """Lotus' empty-prompt text embedding, [1, 2, 1024] float32 (a fresh copy each call)."""
    return _null_prompt().clone()


def lotus_conditioning() -> tuple[Cond, ...]:
    """LotusConditioning's CONDITIONING: one cond holding the null-prompt embedding and nothing
    else (no pooled output, as ComfyUI's ``[[prompt_embeds, {}]]``)."""
    return (Cond(cross_attn=null_prompt_embedding()),)
