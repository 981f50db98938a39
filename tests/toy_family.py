"""A toy model family, registered by tests only: what adding a family takes (docs/ARCHITECTURE.md,
"Add a model family"), and a check that shared code holds no SD assumption.

``ToyDiT`` is a tiny flow-matching transformer in the Flux / SD3 mould: the latent cut into
2 x 2 patches (a Linear on each), text tokens and image tokens attending jointly in two blocks
(``models.attention.attention``), a conditioning vector (timestep + pooled text + guidance
embeddings) modulating every block. Its conditioning is its own (``ToyRunner.cond_inputs``): the
pooled text vector and a ``guidance`` number read from the cond's ``model_inputs`` (default
``DEFAULT_GUIDANCE``). It predicts a flow velocity (``Sampling("flow", shift=3)``) on 16 latent
channels.
Its latent format is its own: per-channel shift and a scale (``TOY_SHIFT``, ``TOY_SCALE``). It is
recognised by its own keys (``toy_patch_in.weight``), never by the file name, and pairs with one
CLIP-L text encoder stored beside it in a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.encoders.encoder_set import OutputRule
from mixgraph.nodes.encoders.tokenizer import END_TOKEN
from mixgraph.nodes.families.base import Detection, Sampling, TextEncoderSlot
from mixgraph.nodes.models.attention import attention
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.families.sd.unet import timestep_embedding

PATCH = 2
HEAD_WIDTH = 16
TOY_SCALE, TOY_SHIFT = 0.6, 0.1
DEFAULT_GUIDANCE = 3.5
SIGNATURE = "toy_patch_in.weight"
TEXT_PREFIX = "cond_stage_model.transformer."  # its CLIP-L, where SD 1.x checkpoints keep theirs
PREDICTION = "flow"  # rectified flow: the model predicts the velocity ε − x0


@dataclass(frozen=True)
class ToyConfig:
    channels: int = 16  # latent channels
    width: int = 32
    depth: int = 2
    context_dim: int = 32  # text token width
    pooled_dim: int = 32  # pooled text vector width

    @property
    def heads(self) -> int:
        return self.width // HEAD_WIDTH


class ToyBlock(nn.Module):
    """Joint attention over [text; image] tokens and an MLP, each modulated (shift, scale) by
    the conditioning vector (adaLN)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(approximate="tanh"), nn.Linear(2 * width, width))
        self.modulation = nn.Linear(width, 4 * width)

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        shift1, scale1, shift2, scale2 = self.modulation(F.silu(vec))[:, None].chunk(4, dim=-1)  # [B, 1, D] each
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).chunk(3, dim=-1)  # [B, T, D] each
        x = x + self.proj(attention(q, k, v, self.heads))
        return x + self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class ToyDiT(nn.Module):
    """x [B, C, H, W], timestep [B], context [B, T, Dc] or None, pooled [B, P], guidance [B]
    -> velocity [B, C, H, W]."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        self.toy_patch_in = nn.Linear(cfg.channels * PATCH * PATCH, d)
        self.context_in = nn.Linear(cfg.context_dim, d)
        self.time_in = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.vector_in = nn.Linear(cfg.pooled_dim, d)
        self.guidance_in = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(ToyBlock(d, cfg.heads) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.proj_out = nn.Linear(d, cfg.channels * PATCH * PATCH)

    def forward(self, x: Tensor, timestep: Tensor, context: Tensor | None, pooled: Tensor,
                guidance: Tensor) -> Tensor:
        b, c, h, w = x.shape
        gh, gw = h // PATCH, w // PATCH
        patches = x.reshape(b, c, gh, PATCH, gw, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, -1)  # [B, N, C·p·p]
        img = self.toy_patch_in(patches)
        vec = (self.time_in(timestep_embedding(timestep, 256)) + self.vector_in(pooled)
               + self.guidance_in(timestep_embedding(guidance * 1000.0, 256)))  # [B, D]
        txt = self.context_in(context) if context is not None else img[:, :0]
        tokens = torch.cat([txt, img], dim=1)  # [B, T + N, D]
        for block in self.blocks:
            tokens = block(tokens, vec)
        out = self.proj_out(self.norm_out(tokens[:, txt.shape[1]:]))  # [B, N, C·p·p]
        return out.reshape(b, gh, gw, c, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


class ToyRunner:
    """``base.FamilyRunner`` for ``ToyDiT``."""

    def __init__(self, handle, module: nn.Module, policy):
        self.handle, self.model, self.policy = handle, module, policy
        self.kind = handle.kind
        self.latent_format = handle.latent_format
        self.in_channels = handle.config.channels
        self.sampler_patches = handle.sampler_patches
        self.sampling = handle.sampling  # the family's Sampling with the handle's pins

    def cond_inputs(self, cond, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> dict[str, Tensor]:
        width = self.handle.config.pooled_dim
        pooled = cond.pooled if cond.pooled is not None else torch.zeros(1, width)
        if pooled.shape[-1] != width:
            raise ValueError(f"toy model: a {pooled.shape[-1]}-wide pooled text vector; it takes {width}")
        guidance = cond.model_inputs.get("guidance")  # ComfyUI's key (FluxGuidance sets it)
        return {"pooled": pooled.float(),
                "guidance": torch.tensor([DEFAULT_GUIDANCE if guidance is None else float(guidance)])}

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None, inputs: Mapping[str, Tensor],
                 control=None, patches: tuple = (), sigma: float | None = None) -> Tensor:
        if control is not None or patches:
            raise NotImplementedError("toy model: ControlNets and model patches: not supported yet")
        return self.model(x, timestep, context, inputs["pooled"], inputs["guidance"])


class ToyFamily:
    """``base.Family`` of the toy model; ``policies`` records the policy of every runner made
    (what the precision tests read)."""

    name = "toy"
    display = "Toy flow transformer (tests)"
    precision_roles: Mapping[str, str] = {"diffusion": "unet", "text": "text", "vae": "vae"}
    shift_settings: Mapping[str, float] = {"shift": 3.0, "multiplier": 1000.0}  # SD3-like

    def __init__(self):
        self.policies: list = []

    def detect(self, info: Mapping[str, Any], read=None, source=None) -> Detection | None:
        if SIGNATURE not in info:
            return None
        shape = lambda k: tuple(getattr(info[k], "shape", info[k]))  # noqa: E731
        width, patch_in = shape(SIGNATURE)
        depth = len({k.split(".")[1] for k in info if k.startswith("blocks.") and k.endswith(".qkv.weight")})
        cfg = ToyConfig(channels=patch_in // (PATCH * PATCH), width=width, depth=depth,
                        context_dim=shape("context_in.weight")[1], pooled_dim=shape("vector_in.weight")[1])
        fields = {"prediction": self.sampling("toy").prediction,
                  "latent_format": self.latent_format("toy", cfg.channels)}
        return Detection("toy", "toy", cfg, fields)

    def build(self, config: ToyConfig) -> ToyDiT:
        return ToyDiT(config)

    def runner(self, handle, module: nn.Module, policy) -> ToyRunner:
        self.policies.append(policy)
        return ToyRunner(handle, module, policy)

    def sampling(self, variant: str) -> Sampling:
        return Sampling(prediction=PREDICTION, **self.shift_settings)

    def latent_format(self, variant: str, channels: int = 16) -> LatentFormat:
        return LatentFormat(scale_factor=TOY_SCALE, channels=channels, mean=(TOY_SHIFT,) * channels,
                            std=(1.0,) * channels, name="toy")

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]:
        # its own set: one CLIP-L whose last normed layer and pooled output it reads
        rule = OutputRule(END_TOKEN, None, True, False, pooled=True)
        return (TextEncoderSlot("clip_l", "clip", "text", prefix=TEXT_PREFIX, layout="hf_clip", encoding="toy",
                                rule=rule),)

    def trace_inputs(self, config: ToyConfig, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        h, w = latent_shape[-2:]
        return (torch.empty(batch, config.channels, h, w), torch.empty(batch),
                torch.empty(batch, 77, config.context_dim), torch.empty(batch, config.pooled_dim),
                torch.empty(batch)), {}


TOY = ToyFamily()


def toy_state_dict(cfg: ToyConfig = ToyConfig(), seed: int = 0) -> dict[str, Tensor]:
    """Random weights (a seeded default init, outputs scaled to stay small)."""
    torch.manual_seed(seed)
    model = ToyDiT(cfg)
    with torch.no_grad():
        model.proj_out.weight.mul_(0.1)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
