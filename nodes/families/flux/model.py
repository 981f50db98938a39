"""The Flux.1 transformer (Black Forest Labs), readable top to bottom; attribute names are the
checkpoint keys of BFL's / ComfyUI's layout (``img_in``, ``double_blocks.N.img_attn.qkv``, ...).

The latent [B, 16, H, W] is cut into 2 x 2 patches (64 values per token) and embedded; text
tokens (T5) and image tokens are processed by ``depth`` double-stream blocks (separate weights
per stream, joint attention) then ``depth_single_blocks`` single-stream blocks (one stream,
attention and MLP in parallel). Every block is modulated (shift, scale, gate) by one vector: the
timestep embedding + the pooled CLIP-L vector (+ the distilled guidance embedding on dev). The
position of each token enters as rotary embeddings (RoPE) over three axes (index, row, column):
text tokens sit at (0, 0, 0), image tokens at (0, row, col), Kontext reference images at
(1, row + offset, col + offset).

Chroma (``chroma.py``) reuses the blocks without their modulation layers: it computes every
block's modulation from one approximator network instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.latent_tokens import PATCH, patchify, unpatchify
from mixgraph.nodes.models.attention import attention as sdpa

__all__ = ["FluxConfig", "Flux", "DoubleStreamBlock", "SingleStreamBlock", "LastLayer", "MLPEmbedder",
           "timestep_embedding", "rope", "image_ids", "patchify", "unpatchify", "default_axes_dim", "PATCH",
           "joint_mask", "key_mask", "run_blocks"]

TIME_DIM = 256  # width of the sinusoidal timestep / guidance embedding


@dataclass(frozen=True)
class FluxConfig:
    """A Flux.1 model's shape (ComfyUI's ``FluxParams``), all read from tensor shapes.

    in_channels: latent channels the model takes per pixel (16; Fill 96 = 16 + 16 masked image +
    64 folded mask; Canny / Depth 32 = 16 + 16 control image); out_channels: 16; vec_in_dim:
    pooled text width (CLIP-L: 768); context_in_dim: text token width (T5-XXL: 4096);
    axes_dim: the RoPE widths of (index, row, column), summing to the head width."""

    in_channels: int = 16
    out_channels: int = 16
    vec_in_dim: int = 768
    context_in_dim: int = 4096
    hidden_size: int = 3072
    mlp_ratio: float = 4.0
    num_heads: int = 24
    depth: int = 19
    depth_single_blocks: int = 38
    axes_dim: tuple[int, ...] = (16, 56, 56)
    theta: int = 10000
    qkv_bias: bool = True
    guidance_embed: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)


def default_axes_dim(head_dim: int) -> tuple[int, int, int]:
    """Flux.1's RoPE split of a head: (16, 56, 56) for 128-wide heads (no tensor stores it); other
    head widths keep the proportions 1/8, 7/16, 7/16 with even parts."""
    if head_dim == 128:
        return (16, 56, 56)
    first = max(2, (head_dim // 8) // 2 * 2)
    rest = head_dim - first
    second = rest // 2 // 2 * 2
    return (first, second, rest - second)


# ---------------------------------------------------------------------------------------------
# embeddings


def timestep_embedding(t: Tensor, dim: int = TIME_DIM, max_period: float = 10000.0,
                       time_factor: float = 1000.0) -> Tensor:
    """Sinusoidal [cos, sin] embedding of ``time_factor``·t (Flux's timesteps and guidance are
    fractions; BFL scales them by 1000); float32 [N, dim]."""
    t = time_factor * t.float()
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None] * freqs[None]  # [N, half]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [N, dim]


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim)
        self.silu = nn.SiLU()
        self.out_layer = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(self.silu(self.in_layer(x)))


def rope(pos: Tensor, dim: int, theta: int) -> Tensor:
    """Rotation matrices for positions ``pos`` [B, N] on ``dim`` / 2 frequency pairs:
    [B, N, dim / 2, 2, 2] float32 (rows (cos, −sin), (sin, cos))."""
    scale = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    omega = 1.0 / (theta ** scale)  # [dim / 2]
    angles = pos.to(torch.float64)[..., None] * omega  # [B, N, dim / 2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    out = torch.stack([cos, -sin, sin, cos], dim=-1)  # [B, N, dim / 2, 4]
    return out.reshape(*out.shape[:-1], 2, 2).float()


def positional_embedding(ids: Tensor, axes_dim: Sequence[int], theta: int) -> Tensor:
    """ids [B, N, 3] -> the RoPE matrices of all axes [B, 1, N, head_dim / 2, 2, 2]."""
    return torch.cat([rope(ids[..., i], axes_dim[i], theta) for i in range(ids.shape[-1])], dim=-3)[:, None]


def apply_rope(x: Tensor, pe: Tensor) -> Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of x [B, H, N, D] by pe [B, 1, N, D / 2, 2, 2];
    computed in float32, returned in x's dtype."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 1, 2)  # [B, H, N, D / 2, 1, 2]
    out = pe[..., 0] * pairs[..., 0] + pe[..., 1] * pairs[..., 1]  # [B, H, N, D / 2, 2]
    return out.reshape(x.shape).to(x.dtype)


def image_ids(h_len: int, w_len: int, batch: int, *, index: float = 0.0, h_offset: int = 0, w_offset: int = 0,
              device=None) -> Tensor:
    """The (index, row, column) position of each image token, rows first: [B, h_len·w_len, 3]."""
    ids = torch.zeros(h_len, w_len, 3, device=device)
    ids[..., 0] = index
    ids[..., 1] = torch.arange(h_len, device=device, dtype=torch.float32)[:, None] + h_offset
    ids[..., 2] = torch.arange(w_len, device=device, dtype=torch.float32)[None, :] + w_offset
    return ids.reshape(1, h_len * w_len, 3).expand(batch, -1, -1)


# ---------------------------------------------------------------------------------------------
# blocks


class RMSNorm(nn.Module):
    """RMS norm with a learned ``scale`` (BFL's QK norm), computed in float32."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale.float()
        return out.to(x.dtype)


class QKNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)


class SelfAttention(nn.Module):
    """The q/k/v projection (fused), per-head QK norm and output projection of one stream."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.norm = QKNorm(dim // heads)
        self.proj = nn.Linear(dim, dim)

    def qkv_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, D] -> normed q, k and v, each [B, H, N, D / H]."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return self.norm.query_norm(q).to(v.dtype), self.norm.key_norm(k).to(v.dtype), v


class Modulation(nn.Module):
    """(shift, scale, gate) x 1 or 2 from the conditioning vector: SiLU then one Linear."""

    def __init__(self, dim: int, double: bool):
        super().__init__()
        self.parts = 6 if double else 3
        self.lin = nn.Linear(dim, self.parts * dim)

    def forward(self, vec: Tensor) -> tuple[Tensor, ...]:
        return self.lin(F.silu(vec))[:, None].chunk(self.parts, dim=-1)  # each [B, 1, D]


def joint_attention(q: Tensor, k: Tensor, v: Tensor, pe: Tensor | None, mask: Tensor | None) -> Tensor:
    """Attention over heads [B, H, N, d] after RoPE -> [B, N, H·d]."""
    if pe is not None:
        q, k = apply_rope(q, pe), apply_rope(k, pe)
    b, h, n, d = q.shape
    flat = lambda t: t.transpose(1, 2).reshape(b, t.shape[2], h * d)  # noqa: E731  [B, H, N, d] -> [B, N, H·d]
    return sdpa(flat(q), flat(k), flat(v), h, mask=mask)


def _mlp(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))


class DoubleStreamBlock(nn.Module):
    """Image and text streams with their own weights, attending jointly over [text; image].
    ``modulated=False`` (Chroma): no ``img_mod`` / ``txt_mod``; the caller gives the modulations."""

    def __init__(self, dim: int, heads: int, mlp_hidden: int, qkv_bias: bool, modulated: bool = True):
        super().__init__()
        if modulated:
            self.img_mod = Modulation(dim, double=True)
        self.img_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.img_attn = SelfAttention(dim, heads, qkv_bias)
        self.img_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.img_mlp = _mlp(dim, mlp_hidden)
        if modulated:
            self.txt_mod = Modulation(dim, double=True)
        self.txt_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.txt_attn = SelfAttention(dim, heads, qkv_bias)
        self.txt_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.txt_mlp = _mlp(dim, mlp_hidden)

    def forward(self, img: Tensor, txt: Tensor, pe: Tensor | None, vec: Tensor | None = None,
                mods: tuple[Sequence[Tensor], Sequence[Tensor]] | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        img_mod, txt_mod = mods if mods is not None else (self.img_mod(vec), self.txt_mod(vec))
        i_shift1, i_scale1, i_gate1, i_shift2, i_scale2, i_gate2 = img_mod
        t_shift1, t_scale1, t_gate1, t_shift2, t_scale2, t_gate2 = txt_mod
        iq, ik, iv = self.img_attn.qkv_heads(self.img_norm1(img) * (1 + i_scale1) + i_shift1)
        tq, tk, tv = self.txt_attn.qkv_heads(self.txt_norm1(txt) * (1 + t_scale1) + t_shift1)
        out = joint_attention(torch.cat([tq, iq], 2), torch.cat([tk, ik], 2), torch.cat([tv, iv], 2), pe, mask)
        t_out, i_out = out[:, :txt.shape[1]], out[:, txt.shape[1]:]
        img = img + i_gate1 * self.img_attn.proj(i_out)
        img = img + i_gate2 * self.img_mlp(self.img_norm2(img) * (1 + i_scale2) + i_shift2)
        txt = txt + t_gate1 * self.txt_attn.proj(t_out)
        txt = txt + t_gate2 * self.txt_mlp(self.txt_norm2(txt) * (1 + t_scale2) + t_shift2)
        if txt.dtype == torch.float16:
            txt = torch.nan_to_num(txt, nan=0.0, posinf=65504, neginf=-65504)
        return img, txt


class SingleStreamBlock(nn.Module):
    """One stream of [text; image] tokens: attention and MLP computed in parallel from one
    fused input projection (``linear1``: q, k, v, MLP in) and merged by ``linear2``."""

    def __init__(self, dim: int, heads: int, mlp_hidden: int, modulated: bool = True):
        super().__init__()
        self.heads, self.dim, self.mlp_width = heads, dim, mlp_hidden
        self.linear1 = nn.Linear(dim, 3 * dim + mlp_hidden)
        self.linear2 = nn.Linear(dim + mlp_hidden, dim)
        self.norm = QKNorm(dim // heads)
        self.pre_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp_act = nn.GELU(approximate="tanh")
        if modulated:
            self.modulation = Modulation(dim, double=False)

    def forward(self, x: Tensor, pe: Tensor | None, vec: Tensor | None = None,
                mods: Sequence[Tensor] | None = None, mask: Tensor | None = None) -> Tensor:
        shift, scale, gate = mods if mods is not None else self.modulation(vec)
        b, n, _ = x.shape
        qkv, mlp = self.linear1(self.pre_norm(x) * (1 + scale) + shift).split([3 * self.dim, self.mlp_width], -1)
        q, k, v = qkv.reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # each [B, H, N, d]
        q, k = self.norm.query_norm(q).to(v.dtype), self.norm.key_norm(k).to(v.dtype)
        out = self.linear2(torch.cat([joint_attention(q, k, v, pe, mask), self.mlp_act(mlp)], -1))
        x = x + gate * out
        if x.dtype == torch.float16:
            x = torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504)
        return x


class LastLayer(nn.Module):
    """Norm, (shift, scale) modulation, projection back to patch values."""

    def __init__(self, dim: int, out_dim: int, modulated: bool = True):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, out_dim)
        if modulated:
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, vec: Tensor | None = None, mods: Sequence[Tensor] | None = None) -> Tensor:
        shift, scale = mods if mods is not None else self.adaLN_modulation(vec)[:, None].chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


# ---------------------------------------------------------------------------------------------
# the model


class Flux(nn.Module):
    """x [B, in_channels, H, W], timestep [B] (σ in [0, 1]), context [B, T, context_in_dim],
    y [B, vec_in_dim] (pooled text), guidance [B] or None, ref_latents: Kontext reference
    latents, each [B, 16, h, w] -> velocity [B, out_channels, H, W]."""

    # the conditioning vector's embedders and the output layer run once per step on one vector
    # per sample: f32 costs nothing and keeps the timestep signal exact under half storage. The
    # per-block modulation Linears are ~27% of the weights (f32 would double the model) and stay
    # in the policy's dtypes, as in ComfyUI. The QK norms' scales (one head-width vector each)
    # stay f32 too: under fp8 storage 3 mantissa bits would distort every attention logit.
    # Timestep, guidance and pooled vector enter f32 (bf16 cannot hold σ·1000 exactly) and meet
    # only f32 layers.
    keep_f32: tuple[str, ...] = ("time_in", "vector_in", "guidance_in", "final_layer", "*.norm")
    keep_f32_inputs: tuple[str, ...] = ("timestep", "guidance", "y")

    def __init__(self, config: FluxConfig):
        super().__init__()
        c = self.config = config
        if sum(c.axes_dim) != c.head_dim:
            raise ValueError(f"Flux: axes_dim {c.axes_dim} must sum to the head width {c.head_dim}")
        d = c.hidden_size
        self.img_in = nn.Linear(c.in_channels * PATCH * PATCH, d)
        self.time_in = MLPEmbedder(TIME_DIM, d)
        self.vector_in = MLPEmbedder(c.vec_in_dim, d)
        if c.guidance_embed:
            self.guidance_in = MLPEmbedder(TIME_DIM, d)
        self.txt_in = nn.Linear(c.context_in_dim, d)
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(d, c.num_heads, c.mlp_hidden, c.qkv_bias) for _ in range(c.depth))
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(d, c.num_heads, c.mlp_hidden) for _ in range(c.depth_single_blocks))
        self.final_layer = LastLayer(d, c.out_channels * PATCH * PATCH)

    def conditioning_vector(self, timestep: Tensor, y: Tensor | None, guidance: Tensor | None, dtype) -> Tensor:
        """time_in(t) [+ guidance_in(g) on dev] + vector_in(y): [B, D]."""
        vec = self.time_in(timestep_embedding(timestep).to(dtype))
        if self.config.guidance_embed and guidance is not None:
            vec = vec + self.guidance_in(timestep_embedding(guidance).to(dtype))
        if y is None:
            y = torch.zeros(timestep.shape[0], self.config.vec_in_dim, device=timestep.device, dtype=dtype)
        return vec + self.vector_in(y[:, :self.config.vec_in_dim])

    def forward(self, x: Tensor, timestep: Tensor, context: Tensor, y: Tensor | None = None,
                guidance: Tensor | None = None, ref_latents: Sequence[Tensor] = (), ref_method: str = "offset",
                txt_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                control: tuple[Sequence, Sequence] = ((), ())) -> Tensor:
        img, ids = embed_image_tokens(self.img_in, x, ref_latents, ref_method)
        vec = self.conditioning_vector(timestep, y, guidance, img.dtype)
        return run_blocks(self, x, img, ids, self.txt_in(context), context.shape[1],
                          lambda block: dict(vec=vec), dict(vec=vec),
                          joint_mask(txt_mask, attn_mask, context.shape[1], img.shape[1]), control)


def embed_image_tokens(img_in: nn.Module, x: Tensor, ref_latents: Sequence[Tensor],
                       method: str = "offset") -> tuple[Tensor, Tensor]:
    """Patch tokens of x then of each Kontext reference latent, embedded, with their positions
    [B, N, 3]. Where references sit (ComfyUI's ``reference_latents_method``): "offset" (index 1,
    each placed right of or below the previous ones, whichever keeps the canvas squarer),
    "index" (index 1, 2, ..., no offset), "uxo" (index 0, placed diagonally past the image)."""
    b, _, h, w = x.shape
    h_len, w_len = -(-h // PATCH), -(-w // PATCH)
    tokens, ids = [patchify(x)], [image_ids(h_len, w_len, b, device=x.device)]
    placed_h = placed_w = 0
    index = 0
    for ref in ref_latents:
        rh, rw = ref.shape[-2:]
        h_off = w_off = 0
        if method == "index":
            index += 1
        elif method == "uxo":
            index, h_off, w_off = 0, h_len * PATCH + placed_h, w_len * PATCH + placed_w
            placed_h, placed_w = placed_h + rh, placed_w + rw
        else:
            index = 1
            if rh + placed_h > rw + placed_w:
                w_off = placed_w
            else:
                h_off = placed_h
            placed_h, placed_w = max(placed_h, rh + h_off), max(placed_w, rw + w_off)
        ref = ref.to(x.dtype)
        tokens.append(patchify(ref.expand(b, -1, -1, -1) if ref.shape[0] == 1 else ref))
        # offsets are in latent pixels; positions count patches (rounded as ComfyUI's process_img)
        ids.append(image_ids(-(-rh // PATCH), -(-rw // PATCH), b, index=float(index),
                             h_offset=(h_off + PATCH // 2) // PATCH, w_offset=(w_off + PATCH // 2) // PATCH,
                             device=x.device))
    return img_in(torch.cat(tokens, 1)), torch.cat(ids, 1)


def joint_mask(txt_mask: Tensor | None, attn_mask: Tensor | None, n_txt: int, n_img: int) -> Tensor | None:
    """The mask every block's attention gets: ``attn_mask``, an additive bias [B, T + N, T + N]
    over [text; image] (queries x keys; StyleModelApply's attn_bias, stretched by the runner), or
    else the key mask of a text-token mask (``key_mask``), or None. Both at once are refused (a
    cond holds one ``attention_mask``), and so is a bias over another number of tokens than the
    T + N the model attends over (a cond restricted to an area, reference latents)."""
    if attn_mask is None:
        return key_mask(txt_mask, n_img)
    if txt_mask is not None:
        raise ValueError("Flux / Chroma: a text-token mask and a joint attention mask at once; a cond holds one")
    if tuple(attn_mask.shape[-2:]) != (n_txt + n_img, n_txt + n_img):
        raise NotImplementedError(
            f"Flux / Chroma: a joint attention mask {list(attn_mask.shape)} over a sequence of {n_txt} text + {n_img} "
            f"image tokens: only a mask over the whole latent's tokens is supported yet (not an area-restricted cond "
            f"or reference latents)")
    return attn_mask


def key_mask(txt_mask: Tensor | None, n_img: int) -> Tensor | None:
    """A text-token mask [B, T] (1 = attend) -> a boolean key mask [B, 1, 1, T + N] over
    [text; image] tokens (every image token attended), or None."""
    if txt_mask is None:
        return None
    keep = torch.cat([txt_mask > 0.5, txt_mask.new_ones(txt_mask.shape[0], n_img, dtype=torch.bool)], 1)
    return keep[:, None, None, :]


def run_blocks(model: nn.Module, x: Tensor, img: Tensor, img_ids: Tensor, txt: Tensor, n_txt: int,
               block_args, last_args: dict, mask: Tensor | None,
               control: tuple[Sequence, Sequence] = ((), ())) -> Tensor:
    """The double- then single-stream blocks and the last layer over embedded tokens (shared by
    Flux and Chroma, which differ in where each block's modulation comes from); ``block_args(
    block_kind_index)`` gives each block's keyword arguments. Returns the velocity [B, C, H, W]
    of the first ``x``-sized tokens (Kontext reference tokens are dropped). ``control``:
    ControlNet residuals (per double block, per single block), entry i [B, N, D] added to the
    first N image tokens after block i (ComfyUI's control["input"] / ["output"])."""
    b, _, h, w = x.shape
    n_img = (-(-h // PATCH)) * (-(-w // PATCH))
    txt_ids = torch.zeros(b, n_txt, 3, device=x.device)
    pe = positional_embedding(torch.cat([txt_ids, img_ids], 1), model.config.axes_dim, model.config.theta)
    double, single = control
    for i, block in enumerate(model.double_blocks):
        img, txt = block(img, txt, pe, mask=mask, **block_args(("double", i)))
        if i < len(double) and double[i] is not None:
            img = _add_front(img, double[i], 0)
    tokens = torch.cat([txt, img], 1)  # [B, T + N, D]
    for i, block in enumerate(model.single_blocks):
        tokens = block(tokens, pe, mask=mask, **block_args(("single", i)))
        if i < len(single) and single[i] is not None:
            tokens = _add_front(tokens, single[i], n_txt)
    out = model.final_layer(tokens[:, n_txt:n_txt + n_img], **last_args)  # [B, N, C·2·2]
    return unpatchify(out, h, w)


def _add_front(tokens: Tensor, add: Tensor, start: int) -> Tensor:
    """tokens with ``add`` [B, N, D] added to tokens[:, start:start + N] (a ControlNet residual)."""
    end = start + add.shape[1]
    return torch.cat([tokens[:, :start], tokens[:, start:end] + add.to(tokens.dtype), tokens[:, end:]], 1)
