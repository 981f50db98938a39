"""CLIP text transformer (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision"), with HF transformers' ``CLIPTextModel`` key layout.

Attribute names equal the HF keys (``text_model.encoder.layers.N.self_attn.q_proj.weight``, ...,
optional ``text_projection.weight``), so the clip_l weights of SD1/SDXL checkpoints load with no
mapping. OpenCLIP towers (SD2's ViT-H, SDXL's bigG) are converted once by `open_clip_to_hf`.

Layer selection follows ComfyUI (``comfy/clip_model.py``, ``comfy/sd1_clip.py``):

* ``layer_idx=None``: the last layer's output after ``final_layer_norm``;
* ``layer_idx<0``: the output of that layer counted from the end (-1 last, -2 penultimate);
  ``layer_idx>=0``: the output of layer ``layer_idx`` (0-based). ``final_layer_norm`` is applied to
  this intermediate output only when ``norm_hidden=True``. ComfyUI sets that flag per model:
  True for SD1 clip_l (so clip skip -2 is the normed penultimate layer) and SD2 clip_h; False for
  SDXL clip_l and clip_g (raw penultimate layer). `nodes/encoders/text_encode.py` holds the table.
* ``pooled``: ``final_layer_norm`` of the last layer at the first end-of-text token (49407; for
  CLIP ids this equals ``argmax(ids)``, OpenAI's rule), then ``text_projection`` when present.

The causal mask is additive (-inf above the diagonal) as in CLIP; no padding mask (ComfyUI passes
none for these models). Text tensors at the module boundary are float32 (token ids are int64);
callers may wrap the module with ``nodes.weights.cast.apply_precision``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = ["CLIPTextConfig", "CLIPTextModel", "open_clip_to_hf", "to_hf_layout", "is_open_clip"]

_ACTIVATIONS = ("quick_gelu", "gelu")


def _heads_for_width(width: int) -> int:
    """CLIP, OpenCLIP ViT-H and bigG text towers all use 64-wide heads (768/12, 1024/16, 1280/20).
    Widths of 64 and under only occur in test fixtures, which use 16-wide heads."""
    return width // 64 if width > 64 else max(1, width // 16)


@dataclass(frozen=True)
class CLIPTextConfig:
    vocab_size: int
    width: int
    layers: int
    heads: int
    max_positions: int
    intermediate: int
    projection_dim: int | None
    activation: str  # "quick_gelu" (OpenAI CLIP-L) | "gelu" (OpenCLIP ViT-H / bigG)
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407

    def __post_init__(self) -> None:
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"CLIP activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.width % self.heads:
            raise ValueError(f"CLIP width {self.width} is not divisible by heads={self.heads}")

    @classmethod
    def from_state_dict(
        cls,
        sd: Mapping[str, Tensor],
        *,
        prefix: str = "",
        activation: str | None = None,
        heads: int | None = None,
    ) -> CLIPTextConfig:
        """Derive the config from tensor shapes; either layout (HF or OpenCLIP) under `prefix`.

        Activation, unless given: OpenCLIP layout -> "gelu"; HF layout -> "quick_gelu" for width
        768 (OpenAI CLIP-L, the only OpenAI tower SD uses) else "gelu" (ViT-H / bigG re-saved in
        HF layout, e.g. diffusers' text_encoder_2).
        """
        if is_open_clip(sd, prefix):
            tok = sd[prefix + "token_embedding.weight"]
            pos = sd[prefix + "positional_embedding"]
            fc1 = sd[prefix + "transformer.resblocks.0.mlp.c_fc.weight"]
            proj = sd.get(prefix + "text_projection")
            proj_dim = None if proj is None else int(proj.shape[1])
            layers = _count(sd, prefix + "transformer.resblocks.")
            default_act = "gelu"
        else:
            p = prefix + ("text_model." if prefix + "text_model.embeddings.token_embedding.weight" in sd else "")
            tok = sd[p + "embeddings.token_embedding.weight"]
            pos = sd[p + "embeddings.position_embedding.weight"]
            fc1 = sd[p + "encoder.layers.0.mlp.fc1.weight"]
            proj = sd.get(prefix + "text_projection.weight")
            proj_dim = None if proj is None else int(proj.shape[0])
            layers = _count(sd, p + "encoder.layers.")
            default_act = "quick_gelu" if tok.shape[1] == 768 else "gelu"
        width = int(tok.shape[1])
        return cls(
            vocab_size=int(tok.shape[0]),
            width=width,
            layers=layers,
            heads=heads or _heads_for_width(width),
            max_positions=int(pos.shape[0]),
            intermediate=int(fc1.shape[0]),
            projection_dim=proj_dim,
            activation=activation or default_act,
        )


def _count(sd: Mapping[str, Tensor], stem: str) -> int:
    pat = re.compile(re.escape(stem) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in sd if (m := pat.match(k))}
    if not idx:
        raise KeyError(f"no CLIP layers found under {stem!r}")
    return max(idx) + 1


# --- blocks -------------------------------------------------------------------------------------


class CLIPAttention(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.upcast_attention = False
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = attention(
            self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads, mask=mask, upcast=self.upcast_attention
        )
        return self.out_proj(out)


class CLIPMLP(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.quick = cfg.activation == "quick_gelu"
        self.fc1 = nn.Linear(cfg.width, cfg.intermediate)
        self.fc2 = nn.Linear(cfg.intermediate, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        h = h * torch.sigmoid(1.702 * h) if self.quick else F.gelu(h)
        return self.fc2(h)


class CLIPEncoderLayer(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = CLIPMLP(cfg)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(cfg) for _ in range(cfg.layers))


class CLIPEmbeddings(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.width)
        self.position_embedding = nn.Embedding(cfg.max_positions, cfg.width)


class CLIPTextTransformer(nn.Module):
    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.embeddings = CLIPEmbeddings(cfg)
        self.encoder = CLIPEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)


# --- model --------------------------------------------------------------------------------------


class CLIPTextModel(nn.Module):
    """CLIP text encoder. ``forward(tokens, layer_idx) -> (hidden [B,T,D], pooled [B,P])``."""

    keep_f32: tuple[str, ...] = ()
    # The 49408-row token table is only ever read a few rows at a time: leave it in the file's
    # dtype (an f32 file's table then stays a lazily paged view; about 76 MB of RSS for SD1's
    # CLIP-L under bf16 storage, 150 MB for bigG).
    keep_stored: tuple[str, ...] = ("text_model.embeddings.token_embedding",)

    def __init__(self, config: CLIPTextConfig) -> None:
        super().__init__()
        self.config = config
        self.text_model = CLIPTextTransformer(config)
        self.text_projection = (
            nn.Linear(config.width, config.projection_dim, bias=False) if config.projection_dim else None
        )

    @classmethod
    def from_state_dict(
        cls, sd: Mapping[str, Tensor], *, prefix: str = "", activation: str | None = None
    ) -> CLIPTextModel:
        """Build from a checkpoint's text-encoder keys under `prefix` (HF or OpenCLIP layout).

        Weights are assigned without copying where no conversion is needed (the model aliases the
        given tensors; treat them as read-only).
        """
        hf = to_hf_layout(sd, prefix)
        cfg = CLIPTextConfig.from_state_dict(hf, activation=activation or _default_activation(sd, prefix))
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(hf, strict=True, assign=True)
        return model.eval()

    def token_embeddings(self, tokens: Tensor) -> Tensor:
        """[B, T] ids -> [B, T, D] token embeddings (no positions): where embeddings get injected."""
        return self.text_model.embeddings.token_embedding(tokens)

    def forward(
        self,
        tokens: Tensor,
        layer_idx: int | None = None,
        *,
        norm_hidden: bool = False,
        embeds: Tensor | None = None,
        project_pooled: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """tokens: [B, T] int64. `embeds` [B, T, D] replaces the token-embedding lookup (for
        textual inversion); `tokens` then only locates the end token for pooling.

        Returns (hidden [B, T, D], pooled [B, P]); P = projection_dim when the model has a
        projection and `project_pooled`, else D.
        """
        tm = self.text_model
        n_layers = len(tm.encoder.layers)
        if layer_idx is not None and not -n_layers <= layer_idx < n_layers:
            raise ValueError(f"layer_idx {layer_idx} out of range for a {n_layers}-layer CLIP")
        stop = None if layer_idx is None else layer_idx % n_layers

        x = self.token_embeddings(tokens) if embeds is None else embeds
        t = x.shape[1]
        x = x + tm.embeddings.position_embedding.weight[:t].to(x.dtype)  # [B,T,D] + [T,D]
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device).triu_(1)  # causal

        hidden = None
        for i, layer in enumerate(tm.encoder.layers):
            x = layer(x, mask)
            if i == stop:
                hidden = x
        x = tm.final_layer_norm(x)
        if hidden is None:
            hidden = x
        elif norm_hidden:
            hidden = tm.final_layer_norm(hidden)

        eos = (tokens == self.config.eos_token_id).int().argmax(dim=-1)  # [B] first end token
        pooled = x[torch.arange(x.shape[0], device=x.device), eos]  # [B, D]
        if self.text_projection is not None and project_pooled:
            pooled = self.text_projection(pooled)
        return hidden, pooled


# --- checkpoint layouts ------------------------------------------------------------------------


def is_open_clip(sd: Mapping[str, Tensor], prefix: str = "") -> bool:
    return prefix + "transformer.resblocks.0.attn.in_proj_weight" in sd


def _default_activation(sd: Mapping[str, Tensor], prefix: str) -> str | None:
    return "gelu" if is_open_clip(sd, prefix) else None


_OPEN_CLIP_TOP = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
}
_OPEN_CLIP_BLOCK = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
}
_OPEN_CLIP_IGNORED = ("logit_scale", "attn_mask", "visual.")
_BLOCK_RE = re.compile(r"transformer\.resblocks\.(\d+)\.(.+)\.(weight|bias)$")
_IN_PROJ_RE = re.compile(r"transformer\.resblocks\.(\d+)\.attn\.in_proj_(weight|bias)$")


def open_clip_to_hf(sd: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """OpenCLIP text tower (SD2 ``cond_stage_model.model.``, SDXL ``conditioner.embedders.1.model.``,
    refiner ``conditioner.embedders.0.model.``) -> HF ``CLIPTextModel(WithProjection)`` keys.

    ``attn.in_proj_weight/bias`` stack q, k, v along dim 0; ``text_projection`` is a [width, proj]
    matrix used as ``x @ P``, so the HF Linear weight is its transpose.
    """
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in sd.items():
        if not key.startswith(prefix):
            continue
        k = key[len(prefix) :]
        if k in _OPEN_CLIP_TOP:
            out[_OPEN_CLIP_TOP[k]] = value
        elif k == "text_projection":
            out["text_projection.weight"] = value.t().contiguous()  # [W, P] -> [P, W]
        elif k.startswith(_OPEN_CLIP_IGNORED):
            continue
        elif m := _BLOCK_RE.match(k):
            n, name, kind = m.groups()
            if name in _OPEN_CLIP_BLOCK:
                out[f"text_model.encoder.layers.{n}.{_OPEN_CLIP_BLOCK[name]}.{kind}"] = value
            else:
                unknown.append(key)
        elif m := _IN_PROJ_RE.match(k):
            n, kind = m.groups()
            q, kk, v = value.chunk(3, dim=0)  # [3W, ...] -> 3 x [W, ...]
            dst = f"text_model.encoder.layers.{n}.self_attn."
            out[dst + f"q_proj.{kind}"] = q.contiguous()
            out[dst + f"k_proj.{kind}"] = kk.contiguous()
            out[dst + f"v_proj.{kind}"] = v.contiguous()
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"unrecognised OpenCLIP text keys: {unknown[:8]}")
    return out


def to_hf_layout(sd: Mapping[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The text encoder under `prefix`, in HF layout rooted at ``text_model.``.

    Accepts OpenCLIP layout, HF layout with or without the ``text_model.`` level (older
    transformers saved SD1's clip_l without it), and drops the ``position_ids`` buffer that some
    checkpoints carry.
    """
    if is_open_clip(sd, prefix):
        return open_clip_to_hf(sd, prefix)
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if not key.startswith(prefix):
            continue
        k = key[len(prefix) :]
        if k.endswith("position_ids"):
            continue
        if not k.startswith(("text_model.", "text_projection")):
            k = "text_model." + k
        out[k] = value
    return out
