"""The latent-diffusion UNet ("openaimodel" layout) for SD1.x, SD2.x, SDXL and the SDXL refiner.

Architecture: Rombach et al., "High-Resolution Image Synthesis with Latent Diffusion Models"
(arXiv:2112.10752); SDXL additions (label embedding of pooled text + size conditioning,
transformer depth per level): Podell et al., "SDXL" (arXiv:2307.01952).

Attribute names equal the checkpoint keys under `model.diffusion_model.`, so
`UNetModel(cfg).load_state_dict(sd)` needs no mapping table. Model families differ only in
`UNetConfig` values, which `unet_config_from_state_dict` derives from tensor shapes.

Heads: LDM configures SD1 checkpoints with a fixed head *count* (8) and SD2/SDXL with a fixed head
*width* (64 channels). Detection follows that rule via `use_linear_in_transformer` (False = SD1
style, `num_heads=8`; True = SD2/SDXL style, `num_head_channels=64`). With a head width the count is
`max(1, channels // num_head_channels)` and dim_head = channels // count, so tiny test models with
fewer than 64 channels still get one full-width head (LDM itself would compute zero heads).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention
from mixgraph.nodes.families.sd.unet_patches import block_patches
from mixgraph.nodes.payloads.conditioning import Control

GROUPS = 32  # GroupNorm groups everywhere in the LDM UNet


@dataclass(frozen=True)
class UNetConfig:  # the defaults are SD1.5
    in_channels: int = 4  # 4; 9 inpaint (latent + mask + masked latent); 8 instruct-pix2pix
    out_channels: int = 4
    model_channels: int = 320
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: tuple[int, ...] = (2, 2, 2, 2)  # per level
    # transformer blocks after each input ResBlock (one entry per ResBlock, 0 = no transformer)
    transformer_depth: tuple[int, ...] = (1, 1, 1, 1, 1, 1, 0, 0)
    # ... and after each output ResBlock (num_res_blocks[level] + 1 per level, deepest level first)
    transformer_depth_output: tuple[int, ...] = (0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1)
    transformer_depth_middle: int = 1  # -1: the middle block is a single ResBlock
    context_dim: int | None = 768
    use_linear_in_transformer: bool = False  # SD2/SDXL: Linear proj_in/out instead of 1x1 conv
    adm_in_channels: int | None = None  # SDXL: 2816 (pooled 1280 + 6*256); refiner: 2560
    num_heads: int = 8  # used when num_head_channels <= 0
    num_head_channels: int = -1
    # class-label embedding ``label_emb.weight`` [num_classes, time_embed_dim]: the SD x4
    # upscaler's noise level (y = integer labels [B]); None = no label input
    num_classes: int | None = None
    # per level (input and output blocks): attn1 attends to the text context instead of the
    # image tokens (LDM ``disable_self_attentions``; x4 upscaler: True, True, True, False);
    # () = self-attention everywhere
    disable_self_attentions: tuple[bool, ...] = ()
    disable_middle_self_attn: bool = False

    @property
    def time_embed_dim(self) -> int:
        return self.model_channels * 4

    def self_attn_disabled(self, level: int) -> bool:
        return bool(self.disable_self_attentions) and self.disable_self_attentions[level]

    def heads(self, channels: int) -> int:
        if self.num_head_channels > 0:
            return max(1, channels // self.num_head_channels)
        return self.num_heads


def timestep_embedding(timesteps: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding [cos, sin] of LDM / "Attention Is All You Need"; float32 [N, dim]."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    )
    args = timesteps.float()[:, None] * freqs[None]  # [N, half]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [N, 2*half]
    if dim % 2:
        emb = F.pad(emb, (0, 1))  # [N, dim]
    return emb


def sdxl_adm(
    pooled: Tensor, width: float, height: float, crop_w: float = 0, crop_h: float = 0,
    target_width: float | None = None, target_height: float | None = None,
) -> Tensor:
    """SDXL base vector conditioning y = [pooled, emb(h, w, crop_h, crop_w, target_h, target_w)].

    Each number is embedded with a 256-wide sinusoid, in ComfyUI's `model_base.SDXL.encode_adm`
    order (height before width). pooled: [B, P] -> [B, P + 1536] float32.
    """
    target_width = width if target_width is None else target_width
    target_height = height if target_height is None else target_height
    return _size_adm(pooled, (height, width, crop_h, crop_w, target_height, target_width))


def sdxl_refiner_adm(
    pooled: Tensor, width: float, height: float, crop_w: float = 0, crop_h: float = 0,
    aesthetic_score: float = 6.0,
) -> Tensor:
    """SDXL refiner y = [pooled, emb(h, w, crop_h, crop_w, aesthetic)] ([B, P + 1280]).
    ComfyUI uses aesthetic 6.0 for positive and 2.5 for negative prompts."""
    return _size_adm(pooled, (height, width, crop_h, crop_w, aesthetic_score))


def _size_adm(pooled: Tensor, numbers: tuple[float, ...]) -> Tensor:
    emb = timestep_embedding(torch.tensor(numbers, dtype=torch.float32, device=pooled.device), 256)
    flat = emb.reshape(1, -1).expand(pooled.shape[0], -1)  # [len(numbers), 256] -> [B, len*256]
    return torch.cat([pooled.float(), flat], dim=1)  # [B, P + len*256]


# ---------------------------------------------------------------------------------------------
# blocks


class ResBlock(nn.Module):
    def __init__(self, channels: int, emb_dim: int, out_channels: int):
        super().__init__()
        self.in_layers = nn.Sequential(
            nn.GroupNorm(GROUPS, channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1)
        )
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, out_channels))
        self.out_layers = nn.Sequential(
            nn.GroupNorm(GROUPS, out_channels), nn.SiLU(), nn.Dropout(0.0),
            nn.Conv2d(out_channels, out_channels, 3, padding=1),
        )
        self.skip_connection = (
            nn.Identity() if channels == out_channels else nn.Conv2d(channels, out_channels, 1)
        )

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.in_layers(x)
        e = self.emb_layers(emb)
        h = h + e[:, :, None, None].to(h.dtype)  # [B, C] -> [B, C, 1, 1]
        return self.skip_connection(x) + self.out_layers(h)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        # `size` (the next skip's H, W) keeps odd latent sizes aligned with their skip connection
        if size is None:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        else:
            x = F.interpolate(x, size=size, mode="nearest")
        return self.conv(x)


class CrossAttention(nn.Module):
    def __init__(self, query_dim: int, context_dim: int | None, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        context_dim = query_dim if context_dim is None else context_dim
        self.heads = heads
        self.upcast_attention = False  # set by cast.apply_precision
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x: Tensor, context: Tensor | None = None, replace=None, value: Tensor | None = None) -> Tensor:
        """``replace(q, k, v, heads)``: a forward-time patch's attention (unet_patches.py);
        ``value``: the tokens values are projected from (default: ``context``)."""
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context if value is None else value)
        if replace is not None:
            return self.to_out(replace(q, k, v, self.heads))
        return self.to_out(attention(q, k, v, self.heads, upcast=self.upcast_attention))


class GEGLU(nn.Module):
    """GELU-gated linear unit (Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202)."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x: Tensor) -> Tensor:
        x, gate = self.proj(x).chunk(2, dim=-1)  # [B, T, 2*D] -> 2 x [B, T, D]
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int | None,
                 disable_self_attn: bool = False):
        super().__init__()
        # attn1 is self-attention, or a second cross-attention when disabled (x4 upscaler)
        self.disable_self_attn = disable_self_attn
        self.attn1 = CrossAttention(dim, context_dim if disable_self_attn else None, heads, dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads, dim_head)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x: Tensor, context: Tensor | None, attn: dict | None = None) -> Tensor:
        attn = attn or {}
        wrap = attn.get("attn1_wrap")
        context1 = context if self.disable_self_attn else None
        if wrap is None:
            x = x + self.attn1(self.norm1(x), context1, replace=attn.get("attn1"))
        else:  # token patches (HyperTile, ToMe): reshape/merge the tokens around self-attention
            n = self.norm1(x)
            kv = n if context1 is None else context1
            q_in, k_in, v_in, undo = wrap(n, kv, kv)
            x = x + undo(self.attn1(q_in, k_in, replace=attn.get("attn1"), value=v_in))
        if "middle" in attn:  # between self- and cross-attention (GLIGEN's gated self-attention)
            x = attn["middle"](x)
        wrap2 = attn.get("attn2_wrap")
        if wrap2 is None:
            x = x + self.attn2(self.norm2(x), context, replace=attn.get("attn2"))
        else:  # hypernetworks: change what the cross-attention keys and values come from
            n = self.norm2(x)
            q_in, k_in, v_in, undo = wrap2(n, context, context)
            x = x + undo(self.attn2(q_in, k_in, replace=attn.get("attn2"), value=v_in))
        return x + self.ff(self.norm3(x))


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, heads: int, depth: int, context_dim: int | None, linear: bool,
                 disable_self_attn: bool = False):
        super().__init__()
        dim_head = channels // heads
        inner = heads * dim_head
        self.linear = linear
        self.norm = nn.GroupNorm(GROUPS, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, inner) if linear else nn.Conv2d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(inner, heads, dim_head, context_dim, disable_self_attn) for _ in range(depth)
        )
        self.proj_out = nn.Linear(inner, channels) if linear else nn.Conv2d(inner, channels, 1)

    def forward(self, x: Tensor, context: Tensor | None, attn: dict | None = None) -> Tensor:
        b, _, h, w = x.shape
        x_in = x
        x = self.norm(x)
        if not self.linear:
            x = self.proj_in(x)
        x = x.flatten(2).transpose(1, 2)  # [B, C, H, W] -> [B, H*W, C]
        if self.linear:
            x = self.proj_in(x)
        for block in self.transformer_blocks:
            x = block(x, context, attn)
        if self.linear:
            x = self.proj_out(x)
        x = x.transpose(1, 2).reshape(b, -1, h, w)  # [B, H*W, C] -> [B, C, H, W]
        if not self.linear:
            x = self.proj_out(x)
        return x + x_in


class EmbedSequential(nn.ModuleList):
    """One LDM block: layers run in order, each fed what it needs (emb, context, target size)."""

    def forward(self, x: Tensor, emb: Tensor, context: Tensor | None,
                size: tuple[int, int] | None = None, attn: dict | None = None,
                before_upsample=None) -> Tensor:
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context, attn)
            elif isinstance(layer, Upsample):
                if before_upsample is not None:
                    x = before_upsample(x)
                x = layer(x, size)
            else:
                x = layer(x)
        return x


def context_free_mismatch(model: nn.Module) -> tuple[int, int] | None:
    """(text width, block width) of the first cross-attention of ``model`` that cannot run
    without a text context, or None when every one can. With no context a cross-attention
    attends to its own (normed) image tokens, as ComfyUI's ``default(context, x)``; its key and
    value projections then take the block width, so that only works where the context width
    equals it (never in SD 1.x/2.x/SDXL UNets, whose text is 768-2048 wide)."""
    for m in model.modules():
        if isinstance(m, BasicTransformerBlock):
            ctx, width = m.attn2.to_k.in_features, m.attn2.to_q.in_features
            if ctx != width:
                return ctx, width
    return None


def _transformer(c: UNetConfig, ch: int, depth: int, disable_self_attn: bool = False) -> SpatialTransformer:
    if c.context_dim is None:
        raise ValueError("UNetConfig: transformer blocks need context_dim")
    return SpatialTransformer(ch, c.heads(ch), depth, c.context_dim, c.use_linear_in_transformer,
                              disable_self_attn)


def build_input_blocks(c: UNetConfig) -> tuple[nn.ModuleList, list[int]]:
    """The encoder half's `input_blocks` and the channel count of each block's output (the skip
    connections, in order). Shared by UNetModel and ControlNetModel (a trainable copy of it).

    LDM numbering: block 0 is the first conv; then per level its ResBlocks (each followed by a
    transformer where `transformer_depth` > 0) and, except on the deepest level, a Downsample.
    """
    if len(c.num_res_blocks) != len(c.channel_mult):
        raise ValueError("UNetConfig: num_res_blocks needs one entry per channel_mult level")
    if len(c.transformer_depth) != sum(c.num_res_blocks):
        raise ValueError("UNetConfig: transformer_depth needs one entry per input ResBlock")
    mc, ted = c.model_channels, c.time_embed_dim
    blocks = nn.ModuleList([EmbedSequential([nn.Conv2d(c.in_channels, mc, 3, padding=1)])])
    channels = [mc]
    ch = mc
    depths = iter(c.transformer_depth)
    for level, mult in enumerate(c.channel_mult):
        for _ in range(c.num_res_blocks[level]):
            layers: list[nn.Module] = [ResBlock(ch, ted, mult * mc)]
            ch = mult * mc
            depth = next(depths)
            if depth > 0:
                layers.append(_transformer(c, ch, depth, c.self_attn_disabled(level)))
            blocks.append(EmbedSequential(layers))
            channels.append(ch)
        if level != len(c.channel_mult) - 1:
            blocks.append(EmbedSequential([Downsample(ch)]))
            channels.append(ch)
    return blocks, channels


def build_middle_block(c: UNetConfig, ch: int) -> EmbedSequential:
    """ResBlock, transformer, ResBlock at `ch` channels (a single ResBlock when
    `transformer_depth_middle` is -1)."""
    ted = c.time_embed_dim
    middle: list[nn.Module] = [ResBlock(ch, ted, ch)]
    if c.transformer_depth_middle >= 0:
        middle += [_transformer(c, ch, c.transformer_depth_middle, c.disable_middle_self_attn),
                   ResBlock(ch, ted, ch)]
    return EmbedSequential(middle)


# ---------------------------------------------------------------------------------------------
# model


class UNetModel(nn.Module):
    # Time/label embeddings are <0.5% of the weights and run on one [B, C] vector per step, so f32
    # costs nothing; it keeps the timestep and SDXL size signals exact under fp8/half storage.
    keep_f32: tuple[str, ...] = ("time_embed", "label_emb")
    #: Linears `int8` leaves f32 (`nodes.weights.cast`): the attention query/key projections,
    #: whose errors go through the softmax's exponent. With them int8, one picture of twelve on
    #: the embedded model fell to 33-37 dB against f32 (mean 48 dB); kept f32: worst 41 dB, mean
    #: 49 dB (benchmarks/README.md). They are ~15% of a transformer block's Linear FLOPs.
    int8_skip: tuple[str, ...] = ("*.attn1.to_q", "*.attn1.to_k", "*.attn2.to_q", "*.attn2.to_k")
    # forward inputs that apply_precision must not cast (bf16 cannot even represent t=999)
    keep_f32_inputs: tuple[str, ...] = ("timesteps", "y")

    def __init__(self, config: UNetConfig):
        super().__init__()
        c = config
        self.config = c
        mc, ted = c.model_channels, c.time_embed_dim
        if len(c.transformer_depth_output) != sum(n + 1 for n in c.num_res_blocks):
            raise ValueError("UNetConfig: transformer_depth_output needs one entry per output block")

        self.time_embed = nn.Sequential(nn.Linear(mc, ted), nn.SiLU(), nn.Linear(ted, ted))
        if c.adm_in_channels is not None and c.num_classes is not None:
            raise ValueError("UNetConfig: a vector input (adm_in_channels) and class labels (num_classes) "
                             "are exclusive")
        if c.adm_in_channels is not None:
            # nested Sequential gives the checkpoint's label_emb.0.{0,2} keys
            self.label_emb = nn.Sequential(
                nn.Sequential(nn.Linear(c.adm_in_channels, ted), nn.SiLU(), nn.Linear(ted, ted))
            )
        elif c.num_classes is not None:
            self.label_emb = nn.Embedding(c.num_classes, ted)  # key label_emb.weight
        self.input_blocks, skip_channels = build_input_blocks(c)
        ch = skip_channels[-1]
        self.middle_block = build_middle_block(c, ch)

        self.output_blocks = nn.ModuleList()
        depths = iter(c.transformer_depth_output)
        for level, mult in reversed(list(enumerate(c.channel_mult))):
            for i in range(c.num_res_blocks[level] + 1):
                layers = [ResBlock(ch + skip_channels.pop(), ted, mc * mult)]
                ch = mc * mult
                depth = next(depths)
                if depth > 0:
                    layers.append(_transformer(c, ch, depth, c.self_attn_disabled(level)))
                if level and i == c.num_res_blocks[level]:
                    layers.append(Upsample(ch))
                self.output_blocks.append(EmbedSequential(layers))

        self.out = nn.Sequential(nn.GroupNorm(GROUPS, ch), nn.SiLU(), nn.Conv2d(ch, c.out_channels, 3, padding=1))
        # ComfyUI's transformer_index: the n-th block holding a SpatialTransformer, in call order
        order = [(("input", i), b) for i, b in enumerate(self.input_blocks)] + [(("middle", 0), self.middle_block)]
        order += [(("output", i), b) for i, b in enumerate(self.output_blocks)]
        with_attn = [name for name, b in order if any(isinstance(m, SpatialTransformer) for m in b)]
        self.transformer_index = {name: n for n, name in enumerate(with_attn)}

    def forward(self, x: Tensor, timesteps: Tensor, context: Tensor | None, y: Tensor | None = None,
                control: Control | None = None, patches: tuple = ()) -> Tensor:
        """x: [B, in_channels, H, W]; timesteps: [B] (0..999); context: [B, T, context_dim];
        y: [B, adm_in_channels] for SDXL-style models; class labels [B] or [B, 1] (whole numbers,
        any dtype) for a ``num_classes`` model (the x4 upscaler's noise level).
        Returns [B, out_channels, H, W].
        ``patches``: forward-time patches for this call only (``unet_patches.py``)."""
        c = self.config
        if any(hasattr(p, "begin") for p in patches):  # per-call patches (SUPIR): None = inactive
            patches = tuple(q for q in (p.begin(x, timesteps, context, y) if hasattr(p, "begin") else p
                                        for p in patches) if q is not None)
        needs_y = c.adm_in_channels is not None or c.num_classes is not None
        if (y is not None) != needs_y:
            raise ValueError(
                f"UNet: adm_in_channels={c.adm_in_channels}, num_classes={c.num_classes} but y is "
                f"{'missing' if y is None else 'given'}"
            )
        if control is not None and control.input and len(control.input) != len(self.input_blocks):
            raise ValueError(
                f"UNet: Control has {len(control.input)} input residuals, model has "
                f"{len(self.input_blocks)} input blocks"
            )
        emb = self.time_embed(timestep_embedding(timesteps, self.config.model_channels))
        if y is not None and c.num_classes is not None:
            labels = y.reshape(y.shape[0]).round().long()  # [B] (f32 holds 0..999 exactly)
            emb = emb + self.label_emb(labels).to(emb.dtype)
        elif y is not None:
            emb = emb + self.label_emb(y)

        hs: list[Tensor] = []
        h = x
        in_patches = [p for p in patches if hasattr(p, "input_block")]
        for i, block in enumerate(self.input_blocks):
            h = block(h, emb, context, attn=self._attn(patches, ("input", i)))
            if control is not None and i < len(control.input_path) and control.input_path[i] is not None:
                h = h + control.input_path[i].to(h.dtype)  # T2I-Adapter features: main path and skip
            for p in in_patches:
                if not p.after_skip:
                    h = p.input_block(h, i)
            hs.append(h)
            for p in in_patches:
                if p.after_skip:
                    h = p.input_block(h, i)
        h = self.middle_block(h, emb, context, attn=self._attn(patches, ("middle", 0)))
        if control is not None and control.input:
            # residuals go to the skips only; the main path into the middle block is unchanged
            hs = [s if r is None else s + r.to(s.dtype) for s, r in zip(hs, control.input)]
        if control is not None:
            if control.middle is not None:
                h = h + control.middle.to(h.dtype)
        for p in patches:
            if hasattr(p, "middle_after"):
                h = p.middle_after(h)
        out_patches = [p for p in patches if hasattr(p, "output_block")]
        ups = [p.before_upsample for p in patches if hasattr(p, "before_upsample")]
        before_upsample = None
        if ups:
            def before_upsample(t: Tensor, _fns=tuple(ups)) -> Tensor:
                for fn in _fns:
                    t = fn(t)
                return t
        for i, block in enumerate(self.output_blocks):
            skip = hs.pop()
            for p in out_patches:
                h, skip = p.output_block(h, skip, i)
            if skip is not None:  # a patch that returns no skip has merged it into h itself (SUPIR)
                # [B, C, H, W] + skip [B, C_skip, H, W] -> [B, C + C_skip, H, W]
                h = torch.cat([h, skip], dim=1)
            h = block(h, emb, context, hs[-1].shape[-2:] if hs else None,
                      attn=self._attn(patches, ("output", i)), before_upsample=before_upsample)
        return self.out(h)

    def _attn(self, patches: tuple, block: tuple[str, int]) -> dict | None:
        if not patches:
            return None
        return block_patches(patches, block, self.transformer_index.get(block))


# ---------------------------------------------------------------------------------------------
# detection


def unet_config_from_state_dict(sd: Mapping[str, Tensor], prefix: str = "") -> UNetConfig:
    """Derive a UNetConfig from tensor shapes (as ComfyUI's `detect_unet_config` does).

    `prefix` is stripped from keys (e.g. "model.diffusion_model."). Raises ValueError naming what
    was found when the dict holds no LDM UNet.
    """
    shapes = {k[len(prefix):]: tuple(v.shape) for k, v in sd.items() if k.startswith(prefix)}
    if "input_blocks.0.0.weight" not in shapes or "out.2.weight" not in shapes:
        sample = sorted(shapes)[:5]
        raise ValueError(
            f"not an LDM UNet state dict: no 'input_blocks.0.0.weight'/'out.2.weight' under prefix "
            f"{prefix!r} ({len(shapes)} keys there, e.g. {sample}; {len(sd)} keys in all)"
        )
    if "middle_block.1.proj_in.weight" not in shapes and "middle_block.0.in_layers.0.weight" not in shapes:
        raise NotImplementedError("UNet without a middle block: not supported yet")
    encoder = _ShapeReader(shapes)
    config = encoder.encoder_config()
    n_out = encoder.count("output_blocks")
    return dataclasses.replace(
        config, out_channels=shapes["out.2.weight"][0],
        transformer_depth_output=tuple(encoder.depth_at(f"output_blocks.{i}.1") for i in range(n_out)),
        context_dim=encoder.context_dim, use_linear_in_transformer=encoder.use_linear)


def encoder_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> UNetConfig:
    """The encoder half (input blocks, middle, embeddings) of a UNetConfig from LDM-named shapes;
    output-block fields are left empty. What a ControlNet shares with its UNet."""
    return _ShapeReader(shapes).encoder_config()


class _ShapeReader:
    """Reads block structure off LDM key shapes; records context dim and projection kind as it
    meets transformer blocks."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]):
        self.shapes = shapes
        self.prefixes: set[str] = set()
        for k in shapes:
            parts = k.split(".")
            self.prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
        self.context_dim: int | None = None
        self.use_linear = False
        self.cross_attn1: set[str] = set()  # blocks whose attn1 reads the context (x4 upscaler)

    def count(self, base: str) -> int:
        n = 0
        while f"{base}.{n}" in self.prefixes:
            n += 1
        return n

    def depth_at(self, block: str) -> int:
        proj_in = self.shapes.get(f"{block}.proj_in.weight")
        if proj_in is None:
            return 0
        self.use_linear = len(proj_in) == 2
        to_k = self.shapes.get(f"{block}.transformer_blocks.0.attn2.to_k.weight")
        if to_k is not None:
            self.context_dim = to_k[1]
        # attn1 keys projected from a width other than the queries': it attends to the context.
        # (When context and block widths are equal the shapes cannot tell; no released model
        # disables self-attention there.)
        k1 = self.shapes.get(f"{block}.transformer_blocks.0.attn1.to_k.weight")
        q1 = self.shapes.get(f"{block}.transformer_blocks.0.attn1.to_q.weight")
        if k1 is not None and q1 is not None and k1[1] != q1[1]:
            self.cross_attn1.add(block)
        return self.count(f"{block}.transformer_blocks")

    def encoder_config(self) -> UNetConfig:
        shapes = self.shapes
        mc, in_channels = shapes["input_blocks.0.0.weight"][:2]
        adm = shapes["label_emb.0.0.weight"][1] if "label_emb.0.0.weight" in shapes else None
        labels = shapes.get("label_emb.weight")
        num_classes = labels[0] if labels is not None and len(labels) == 2 else None
        disabled: list[bool] = []
        channel_mult: list[int] = []
        num_res_blocks: list[int] = []
        transformer_depth: list[int] = []
        res_in_level = 0
        n_in = self.count("input_blocks")
        for i in range(1, n_in):
            if f"input_blocks.{i}.0.op.weight" in shapes:  # Downsample ends a level
                num_res_blocks.append(res_in_level)
                res_in_level = 0
                continue
            out_key = f"input_blocks.{i}.0.out_layers.3.weight"
            if out_key not in shapes:
                raise ValueError(f"UNet input block {i} is neither a ResBlock nor a Downsample")
            if res_in_level == 0:
                channel_mult.append(shapes[out_key][0] // mc)
                disabled.append(False)
            res_in_level += 1
            transformer_depth.append(self.depth_at(f"input_blocks.{i}.1"))
            if f"input_blocks.{i}.1" in self.cross_attn1:
                disabled[-1] = True
        num_res_blocks.append(res_in_level)
        if not channel_mult or len(num_res_blocks) != len(channel_mult):
            raise ValueError(f"UNet input blocks do not form levels (found {n_in} input blocks)")
        depth_middle = self.depth_at("middle_block.1") if "middle_block.1.proj_in.weight" in shapes else -1
        return UNetConfig(
            in_channels=in_channels,
            out_channels=in_channels,
            model_channels=mc,
            channel_mult=tuple(channel_mult),
            num_res_blocks=tuple(num_res_blocks),
            transformer_depth=tuple(transformer_depth),
            transformer_depth_output=(),
            transformer_depth_middle=depth_middle,
            context_dim=self.context_dim,
            use_linear_in_transformer=self.use_linear,
            adm_in_channels=adm,
            num_heads=-1 if self.use_linear else 8,
            num_head_channels=64 if self.use_linear else -1,
            num_classes=num_classes,
            disable_self_attentions=tuple(disabled) if any(disabled) else (),
            disable_middle_self_attn="middle_block.1" in self.cross_attn1,
        )
