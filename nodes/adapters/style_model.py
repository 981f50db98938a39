"""T2I-Adapter style model (Mou et al. 2023, "T2I-Adapter", arXiv:2302.08453): a small
transformer that turns a CLIP vision tower's tokens into extra cross-attention tokens, which
``StyleModelApply`` appends to the text conditioning.

Key layout (``models/style_models/*``, e.g. ``t2iadapter_style_sd14v1``): ``style_embedding``
[1, T, W] (the learned style queries), ``ln_pre``, ``transformer_layes.N.*`` (sic; OpenAI CLIP's
residual attention blocks: ``attn.in_proj_weight`` with q, k, v stacked, ``attn.out_proj``,
``ln_1``, ``mlp.c_fc``, ``mlp.c_proj`` with QuickGELU, ``ln_2``), ``ln_post``, ``proj`` [W, D].
Width, token count, layer count and output width D come from shapes; the head count (8) is
ComfyUI's fixed value (not stored in the file).

Forward (ComfyUI ``StyleAdapter``): x = cat(vision last_hidden_state [B, N, W], style queries) ->
ln_pre -> blocks -> ln_post of the last T tokens -> @ proj -> [B, T, D].

``load_style_model`` also loads Flux Redux projectors (``adapters/redux.py``); ``append_style_tokens``
is ``StyleModelApply`` for both, with ComfyUI's attention-bias mask (``extend_attention_bias``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.adapters.redux import ReduxConfig, ReduxHandle, is_redux
from mixgraph.nodes.models.attention import ResidualAttentionBlock
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.payloads.vision import ClipVisionOutput

__all__ = ["StyleConfig", "StyleAdapter", "StyleModelHandle", "load_style_model", "StyleModelError",
           "append_style_tokens", "extend_attention_bias"]

HEADS = 8


class StyleModelError(ValueError):
    pass


@dataclass(frozen=True)
class StyleConfig:
    width: int
    context_dim: int
    layers: int
    num_tokens: int
    heads: int = HEADS

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "") -> "StyleConfig":
        if "style_embedding" not in shapes or "proj" not in shapes:
            raise StyleModelError(f"{where}: not a T2I-Adapter style model (no 'style_embedding' / 'proj')")
        _, tokens, width = shapes["style_embedding"]
        layers = 0
        while f"transformer_layes.{layers}.attn.in_proj_weight" in shapes:
            layers += 1
        heads = HEADS if width % HEADS == 0 else 1
        return cls(width=int(width), context_dim=int(shapes["proj"][1]), layers=layers, num_tokens=int(tokens),
                   heads=heads)


class StyleAdapter(nn.Module):
    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: StyleConfig):
        super().__init__()
        c = config
        self.config = c
        self.style_embedding = nn.Parameter(torch.empty(1, c.num_tokens, c.width))
        self.ln_pre = nn.LayerNorm(c.width)
        self.transformer_layes = nn.Sequential(*[ResidualAttentionBlock(c.width, c.heads) for _ in range(c.layers)])
        self.ln_post = nn.LayerNorm(c.width)
        self.proj = nn.Parameter(torch.empty(c.width, c.context_dim))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, N, W] (a CLIP vision last_hidden_state) -> [B, T, D]."""
        style = self.style_embedding.to(tokens.dtype).expand(tokens.shape[0], -1, -1)  # [B, T, W]
        x = self.ln_pre(torch.cat([tokens, style], dim=1))  # [B, N + T, W]
        x = self.transformer_layes(x)
        x = self.ln_post(x[:, -self.config.num_tokens:])  # [B, T, W]
        return x @ self.proj.to(x.dtype)  # [B, T, D]


@dataclass(frozen=True)
class StyleModelHandle:
    """STYLE_MODEL: a style-adapter recipe."""

    source: WeightSource
    config: StyleConfig
    precision: PolicyLike | None = None

    def get_cond(self, vision: ClipVisionOutput, policy: PolicyLike) -> Tensor:
        """The style tokens for every image of ``vision``, flattened into one [1, B·T, D]
        conditioning sequence (ComfyUI's ``StyleModelApply``)."""
        tokens = vision.last_hidden_state
        if tokens.shape[-1] != self.config.width:
            raise StyleModelError(
                f"the style model takes {self.config.width}-wide CLIP vision tokens, the CLIP vision "
                f"output has {tokens.shape[-1]} (use the CLIP vision model it was trained with)")
        m = apply_precision(store.materialize("style_model", self.source, self.config, policy.storage, (),
                                              StyleAdapter), policy)
        device = next(m.parameters()).device
        with torch.inference_mode():
            out = m(tokens.to(device)).float().cpu()  # [B, T, D]
        return out.flatten(0, 1).unsqueeze(0)  # [1, B*T, D]

    def with_precision(self, policy: PolicyLike | None) -> "StyleModelHandle":
        return dataclasses.replace(self, precision=policy)


def load_style_model(path: str | os.PathLike) -> StyleModelHandle | ReduxHandle:
    """StyleModelLoader: a T2I-Adapter style model (``style_embedding``) or a Flux Redux projector
    (``redux_down.weight``), tested in ComfyUI's order."""
    info = inspect_file(path)
    name = os.path.basename(path)
    shapes = {k: tuple(v.shape) for k, v in info.items()}
    if "style_embedding" in shapes:
        return StyleModelHandle(WeightSource.from_file(path), StyleConfig.from_shapes(shapes, name))
    if is_redux(shapes):
        return ReduxHandle(WeightSource.from_file(path), ReduxConfig.from_shapes(shapes, name))
    raise StyleModelError(f"{name}: not a style model: no 'style_embedding' (T2I-Adapter) or 'redux_down.weight' "
                          f"(Flux Redux) ({len(shapes)} tensors, e.g. {sorted(shapes)[:4]})")


def append_style_tokens(conds, tokens: Tensor, strength: float, strength_type: str) -> tuple:
    """StyleModelApply (ComfyUI ``nodes.py``): each cond's text tokens [B, T, D] followed by the
    style tokens [1, n, D]. "multiply" scales them by ``strength``. "attn_bias" leaves them as they
    are and, unless strength is 1, records an additive attention bias log(strength) on every
    query's attention to them in ``model_inputs["attention_mask"]`` (``extend_attention_bias``);
    a mask already there is extended either way (bias 0 for the new tokens under "multiply").

    Who reads the mask: ComfyUI's Flux / Chroma models (``model_base.Flux.extra_conds``); an SD
    1.x / 2.x / SDXL UNet never does, in ComfyUI as here, so there "attn_bias" equals ComfyUI's
    result (the tokens unscaled)."""
    if strength_type not in ("multiply", "attn_bias"):
        raise ValueError(f"strength_type must be 'multiply' or 'attn_bias', got {strength_type!r}")
    if strength_type == "multiply":
        tokens = tokens * float(strength)
    bias = float(strength) if strength_type == "attn_bias" else 1.0
    out = []
    for c in conds:
        text = c.cross_attn
        if text is None:
            raise StyleModelError("StyleModelApply: a text-free conditioning has no text tokens to append the "
                                  "style tokens to (encode a prompt, even an empty one)")
        if text.shape[-1] != tokens.shape[-1]:
            raise StyleModelError(f"the style model gives {tokens.shape[-1]}-wide tokens, the conditioning is "
                                  f"{text.shape[-1]} wide (a style model made for another model family)")
        inputs = c.model_inputs
        if "attention_mask" in inputs or (strength_type == "attn_bias" and bias != 1.0):
            inputs = {**inputs, **extend_attention_bias(inputs, text.shape[0], text.shape[1], tokens.shape[1], bias)}
        extra = tokens.to(text.dtype).expand(text.shape[0], -1, -1)  # [B, n, D]
        out.append(dataclasses.replace(c, cross_attn=torch.cat([text, extra], dim=1),  # [B, T + n, D]
                                       model_inputs=inputs))
    return tuple(out)


def extend_attention_bias(inputs: Mapping, batch: int, n_txt: int, n_new: int, strength: float) -> dict:
    """ComfyUI's StyleModelApply mask, for ``n_new`` tokens appended after ``n_txt`` text tokens.

    The mask is an additive bias over the joint sequence a Flux block attends over, text first,
    then the image: [B, T + R, T + R] float16 (queries × keys), where the image part is
    ``attention_mask_img_shape`` = (h, w) reference tokens (R = h·w; (1, 1) unless a node set
    another) that the model stretches bilinearly to its real token grid
    (``comfy.utils.upscale_dit_mask``). A boolean mask is read as log(mask) (True -> 0, False
    -> -inf). The new mask is [B, T + n + R, T + n + R]: the old one's four quadrants around the
    new rows and columns, log(strength) in the new key columns for the text and image queries,
    0 elsewhere (the new tokens' own queries attend freely). Returns the two ``model_inputs``
    entries, under ComfyUI's names."""
    ref = tuple(int(v) for v in inputs.get("attention_mask_img_shape", (1, 1)))
    n_ref = ref[0] * ref[1]
    old = inputs.get("attention_mask")
    size = n_txt + n_ref
    if old is None:
        old = torch.zeros(batch, size, size, dtype=torch.float16)
    if old.dtype == torch.bool:
        old = torch.log(old.to(torch.float16))
    if old.ndim != 3 or tuple(old.shape[-2:]) != (size, size) or old.shape[0] not in (1, batch):
        raise StyleModelError(
            f"StyleModelApply: the conditioning's attention_mask is {list(old.shape)}; appending tokens needs "
            f"ComfyUI's Flux form [{batch}, {size}, {size}] ({n_txt} text + {n_ref} image tokens, "
            f"attention_mask_img_shape {ref})")
    t, n = n_txt, n_new
    mask = torch.zeros(batch, t + n + n_ref, t + n + n_ref, dtype=torch.float16)
    mask[:, :t, :t] = old[:, :t, :t]
    mask[:, :t, t + n:] = old[:, :t, t:]
    mask[:, t + n:, :t] = old[:, t:, :t]
    mask[:, t + n:, t + n:] = old[:, t:, t:]
    bias = torch.log(torch.tensor([float(strength)]))  # -inf for strength 0, as ComfyUI (float16 in the mask)
    mask[:, :t, t:t + n] = bias
    mask[:, t + n:, t:t + n] = bias
    return {"attention_mask": mask, "attention_mask_img_shape": ref}
